//! The ECN field (RFC 3168 §5): the low 2 bits of the IPv4 TOS byte / IPv6 traffic class.
//! RoCEv2 senders mark their frames ECN-capable (ECT(0)); a congested switch rewrites that to CE
//! instead of dropping, and the receiver answers CE with a CNP ([`crate::cnp`]).

/// Not ECN-capable transport.
pub const NOT_ECT: u8 = 0b00;
/// ECN-capable transport, codepoint 1.
pub const ECT1: u8 = 0b01;
/// ECN-capable transport, codepoint 0 (what RoCE NICs send).
pub const ECT0: u8 = 0b10;
/// Congestion experienced.
pub const CE: u8 = 0b11;
/// The ECN bits of a TOS / traffic class byte.
pub const MASK: u8 = 0b11;

/// `tclass` with its ECN bits replaced by `ecn` (DSCP kept).
pub const fn with_ecn(tclass: u8, ecn: u8) -> u8 {
    (tclass & !MASK) | (ecn & MASK)
}

/// The ECN codepoint of `tclass`.
pub const fn ecn_of(tclass: u8) -> u8 {
    tclass & MASK
}

/// Is `tclass` marked Congestion Experienced?
pub const fn is_ce(tclass: u8) -> bool {
    tclass & MASK == CE
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn codepoints() {
        // DSCP 26 (AF31, a common RoCE class) + ECT(0) = 0x6a; CE keeps the DSCP.
        assert_eq!(with_ecn(26 << 2, ECT0), 0x6a);
        assert_eq!(with_ecn(0x6a, CE), 0x6b);
        assert_eq!(with_ecn(0xff, NOT_ECT), 0xfc);
        assert!(is_ce(0x6b) && !is_ce(0x6a) && !is_ce(ECT1));
        assert_eq!(ecn_of(0xc2), ECT0); // the ConnectX CNP vector's TOS
    }
}
