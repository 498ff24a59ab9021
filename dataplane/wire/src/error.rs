//! The wire-layer error: one precise enum with a stable index for counters.

use core::fmt;

/// Result alias for this crate.
pub type Result<T> = core::result::Result<T, Error>;

macro_rules! wire_errors {
    ($( $(#[$m:meta])* $name:ident $( ( $t:ty ) )? = $idx:expr, $s:expr; )*) => {
        /// Why a frame or header could not be parsed or emitted.
        ///
        /// `index()` and `as_str()` are stable: the runtime uses them as counter slots/names.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Error {
            $( $(#[$m])* $name $( ($t) )?, )*
        }
        impl Error {
            /// Number of distinct error kinds (size of a counter array).
            pub const COUNT: usize = [$($idx),*].len();
            /// Stable counter index in `0..COUNT`.
            pub const fn index(&self) -> usize {
                #[allow(unused_variables)]
                match self { $( wire_errors!(@pat $name $( $t )?) => $idx, )* }
            }
            /// Stable counter name (snake_case).
            pub const fn as_str(&self) -> &'static str {
                #[allow(unused_variables)]
                match self { $( wire_errors!(@pat $name $( $t )?) => $s, )* }
            }
            /// Counter name for an index (inverse of `index()`).
            pub const fn name_of(index: usize) -> Option<&'static str> {
                match index { $( $idx => Some($s), )* _ => None }
            }
        }
    };
    (@pat $name:ident $t:ty) => { Error::$name(_) };
    (@pat $name:ident) => { Error::$name };
}

wire_errors! {
    /// The buffer is shorter than a header or a length field says.
    Truncated = 0, "truncated";
    /// A length field is inconsistent (IP vs UDP length, payload on an opcode without one...).
    BadLength = 1, "bad_length";
    /// Not IPv4/IPv6/ARP (other EtherType).
    NotIp = 2, "not_ip";
    /// IP, but not UDP.
    NotUdp = 3, "not_udp";
    /// UDP, but the destination port is not 4791.
    NotRoce = 4, "not_roce";
    /// An ARP frame (hand to the ARP code).
    Arp = 5, "arp";
    /// An ICMPv6 packet (neighbour discovery etc.; hand to the ND code).
    Icmpv6 = 6, "icmpv6";
    /// IPv4 fragment (RoCEv2 is never fragmented).
    Fragment = 7, "ip_fragment";
    /// Bad IP version nibble or header length.
    BadIpHeader = 8, "bad_ip_header";
    /// BTH transport version is not 0.
    BadTver = 9, "bad_tver";
    /// Opcode not in the table (RC/UC/UD as supported by rxe).
    UnknownOpcode(u8) = 10, "unknown_opcode";
    /// Pad count inconsistent with the payload or the opcode.
    BadPad = 11, "bad_pad";
    /// ICRC mismatch.
    BadIcrc = 12, "bad_icrc";
    /// The `TransportHeaders` extension headers do not match the opcode's set.
    HeaderMismatch = 13, "header_mismatch";
    /// Source and destination address families differ, or an address is unusable.
    BadAddress = 14, "bad_address";
    /// A checksum (ICMPv6) is wrong.
    BadChecksum = 15, "bad_checksum";
    /// Well-formed but unsupported (ARP for non-Ethernet/IPv4, unknown ND type, ...).
    Unsupported = 16, "unsupported";
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::UnknownOpcode(op) => write!(f, "unknown_opcode(0x{op:02x})"),
            e => f.write_str(e.as_str()),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn indices_are_dense_and_names_unique() {
        for i in 0..Error::COUNT {
            let n = Error::name_of(i).unwrap();
            for j in 0..i {
                assert_ne!(Error::name_of(j).unwrap(), n);
            }
        }
        assert_eq!(Error::UnknownOpcode(9).index(), 10);
        assert_eq!(Error::BadIcrc.as_str(), "bad_icrc");
    }
}
