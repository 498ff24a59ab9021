//! RoCEv2 Congestion Notification Packet (IBA Annex A17 "RoCEv2", A17.9.3): the packet a
//! notification point (the receiver of CE-marked traffic) sends back to the reaction point
//! (the sender) so that it lowers the rate of one QP.
//!
//! ```text
//! BTH: OpCode 0x81 | SE M PadCnt TVer = 0 | P_Key 0xFFFF | FECN 0 BECN 1 resv6 |
//!      DestQP = the *sending* QP to slow down | A 0 | PSN 0
//! 16 reserved bytes (zero), then the ICRC
//! ```
//!
//! Byte for byte this is the ConnectX-4 Lx CNP vector in
//! `shared/acceptance/lib/icrc_check.py` (tests below rebuild it exactly, ICRC included).
//! The opcode is not in the RC/UC/UD [`opcode`](crate::opcode) table: CNPs are not part of a
//! transport service and carry no PSN semantics, so [`parse_frame`](crate::parse_frame) reports
//! them as `Err(UnknownOpcode(0x81))` and a receiver that cares calls [`parse_cnp_frame`].

use std::net::IpAddr;

use crate::frame::{emit_frame_headers, finish_frame, frame_header_len, outer, L3Info};
use crate::{bth, Error, MacAddr, Opcode, Psn, Qpn, Result, ICRC_LEN};

/// The CNP opcode (RoCEv2 "CNP" transport, function 0x01).
pub const OPCODE: Opcode = Opcode(0x81);
/// Reserved bytes after the BTH.
pub const RESERVED_LEN: usize = 16;
/// BTH + reserved bytes: the RoCE part of a CNP without its ICRC.
pub const LEN: usize = bth::HEADER_LEN + RESERVED_LEN;

/// A CNP: the QP it is addressed to (the sender QP that must slow down) and its P_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Destination QP: the reaction point's QP.
    pub dest_qp: Qpn,
    /// P_Key (0xFFFF on every NIC we know).
    pub pkey: u16,
}

impl Repr {
    /// A CNP for `dest_qp` with the default P_Key.
    pub const fn new(dest_qp: Qpn) -> Repr {
        Repr { dest_qp, pkey: 0xFFFF }
    }

    /// Write BTH + 16 reserved bytes at the start of `buf`; returns [`LEN`].
    /// `Err(Truncated)` if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if buf.len() < LEN {
            return Err(Error::Truncated);
        }
        let mut p = bth::Packet::new_unchecked(&mut buf[..bth::HEADER_LEN]);
        p.set_opcode(OPCODE);
        p.set_flags(false, false, 0, 0);
        p.set_pkey(self.pkey);
        p.set_ecn(false, true);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req(false);
        p.set_psn(Psn::new(0));
        buf[bth::HEADER_LEN..LEN].fill(0);
        Ok(LEN)
    }

    /// Parse the RoCE part (BTH onwards, ICRC removed) of a CNP: opcode 0x81, TVer 0, exactly
    /// 16 bytes after the BTH. The BECN bit and the reserved bytes are not judged (IBA: ignore
    /// reserved fields on receive; some senders leave BECN clear).
    pub fn parse(roce: &[u8]) -> Result<Repr> {
        let p = bth::Packet::new_checked(roce)?;
        if p.tver() != 0 {
            return Err(Error::BadTver);
        }
        if p.opcode() != OPCODE {
            return Err(Error::UnknownOpcode(p.opcode().0));
        }
        match roce.len() {
            LEN => Ok(Repr { dest_qp: p.dest_qp(), pkey: p.pkey() }),
            n if n < LEN => Err(Error::Truncated),
            _ => Err(Error::BadLength),
        }
    }
}

/// A validated CNP frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CnpFrame {
    /// Source MAC.
    pub src_mac: MacAddr,
    /// Source IP (the notification point).
    pub src_ip: IpAddr,
    /// Destination IP (us, the reaction point).
    pub dst_ip: IpAddr,
    /// IPv4 TOS / IPv6 traffic class.
    pub tclass: u8,
    /// UDP source port.
    pub udp_sport: u16,
    /// The CNP.
    pub cnp: Repr,
}

/// Parse and validate a whole CNP frame (Ethernet/IP/UDP 4791 as [`parse_frame`](crate::parse_frame)
/// checks them, then the CNP layout and the ICRC).
pub fn parse_cnp_frame(frame: &[u8]) -> Result<CnpFrame> {
    let o = outer(frame)?;
    let roce = &frame[o.bth_offset..o.ip_end];
    let cnp = Repr::parse(&roce[..roce.len() - ICRC_LEN])?;
    if !o.icrc_ok(frame) {
        return Err(Error::BadIcrc);
    }
    Ok(CnpFrame { src_mac: o.src_mac, src_ip: o.src_ip(), dst_ip: o.dst_ip(), tclass: o.tclass, udp_sport: o.udp_sport, cnp })
}

/// Build a complete CNP frame for `cnp` into `buf` (headers from `l3`, ICRC); returns its
/// length.
pub fn build_cnp_frame(buf: &mut [u8], l3: &L3Info, cnp: &Repr) -> Result<usize> {
    let hl = frame_header_len(l3.is_ipv6()?);
    let total = hl + LEN + ICRC_LEN;
    if buf.len() < total {
        return Err(Error::Truncated);
    }
    cnp.emit(&mut buf[hl..])?;
    emit_frame_headers(buf, l3, LEN)?;
    finish_frame(&mut buf[..total])?;
    Ok(total)
}

#[cfg(test)]
mod test {
    use super::*;
    use std::net::Ipv4Addr;

    /// The ConnectX-4 Lx CNP of icrc_check.py's self-test (scapy's RoCE tests), hardware ICRC.
    pub(crate) const CNP_HW: &str = concat!(
        "e41d2dab2bc2", "7cfe90643b32", "0800",
        "45c2003c718c400040119161", "0a001101", "0a001201",
        "000012b700280000",
        "8100ffff40000118", "00000000",
        "00000000000000000000000000000000", "82fd002a"
    );

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// The vector's Ethernet/IP/UDP parameters.
    pub(crate) fn hw_l3() -> L3Info {
        L3Info {
            src_mac: MacAddr([0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32]),
            dst_mac: MacAddr([0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2]),
            src_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 17, 1)),
            dst_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 18, 1)),
            tclass: 0xc2, // DSCP 48 (ConnectX cnp_dscp default), ECT(0)
            ttl: 64,
            flow_label: 0,
            udp_sport: 0, // the NIC sends its CNPs from UDP port 0
            ip_id: 0x718c,
        }
    }

    #[test]
    fn builds_the_connectx_vector_byte_for_byte() {
        let want = hex(CNP_HW);
        let mut buf = [0xAAu8; 128];
        let n = build_cnp_frame(&mut buf, &hw_l3(), &Repr::new(Qpn::new(0x118))).unwrap();
        assert_eq!(n, want.len());
        assert_eq!(&buf[..n], &want[..], "IP checksum, BTH, reserved bytes and ICRC 82fd002a");
    }

    #[test]
    fn parses_the_connectx_vector() {
        let f = hex(CNP_HW);
        let c = parse_cnp_frame(&f).unwrap();
        assert_eq!(c.cnp, Repr { dest_qp: Qpn::new(0x118), pkey: 0xFFFF });
        assert_eq!((c.tclass, c.udp_sport), (0xc2, 0));
        assert_eq!(c.src_ip, IpAddr::V4(Ipv4Addr::new(10, 0, 17, 1)));
        // The transport parser does not know the opcode: the runtime branches on this error.
        assert_eq!(crate::parse_frame(&f).unwrap_err(), Error::UnknownOpcode(0x81));
    }

    #[test]
    fn rejects_bad_cnps() {
        let f = hex(CNP_HW);
        let mut bad = f.clone();
        bad[14 + 20 + 8 + 20] ^= 1; // a reserved byte: covered by the ICRC
        assert_eq!(parse_cnp_frame(&bad).unwrap_err(), Error::BadIcrc);
        let mut bad = f.clone();
        bad[14 + 20 + 8] = 0x11; // an ACK opcode
        assert_eq!(parse_cnp_frame(&bad).unwrap_err(), Error::UnknownOpcode(0x11));
        assert_eq!(Repr::parse(&f[42..42 + LEN - 1]).unwrap_err(), Error::Truncated);
        assert_eq!(Repr::parse(&f[42..f.len()]).unwrap_err(), Error::BadLength);
        let mut tv = f[42..42 + LEN].to_vec();
        tv[1] = 1;
        assert_eq!(Repr::parse(&tv).unwrap_err(), Error::BadTver);
        // BECN / FECN / the reserved bits are masked in the ICRC: flipping them keeps it valid.
        let mut m = f.clone();
        m[42 + 4] = 0xC0;
        assert!(parse_cnp_frame(&m).is_ok());
    }

    #[test]
    fn ipv6_cnp_roundtrip() {
        let l3 = L3Info {
            src_ip: "fd00::1".parse().unwrap(),
            dst_ip: "fd00::2".parse().unwrap(),
            tclass: 0xc2,
            ..L3Info::default()
        };
        let mut buf = [0u8; 128];
        let n = build_cnp_frame(&mut buf, &l3, &Repr::new(Qpn::new(0xABCDEF))).unwrap();
        assert_eq!(n, 14 + 40 + 8 + LEN + ICRC_LEN);
        let c = parse_cnp_frame(&buf[..n]).unwrap();
        assert_eq!((c.cnp.dest_qp, c.tclass), (Qpn::new(0xABCDEF), 0xc2));
    }
}
