//! Ethernet II header, 14 bytes.

use crate::{fixed_packet, rd16, wr16, Result};
use core::fmt;

/// Ethernet header length (no VLAN tag).
pub const HEADER_LEN: usize = 14;

mod field {
    use crate::Field;
    pub const DST: Field = 0..6;
    pub const SRC: Field = 6..12;
    pub const ETHERTYPE: Field = 12..14;
}

/// A MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xFF; 6]);
    /// Group bit set.
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }
    /// From a 6-byte slice (panics if shorter).
    #[inline]
    pub fn from_bytes(b: &[u8]) -> MacAddr {
        let mut m = [0; 6];
        m.copy_from_slice(&b[..6]);
        MacAddr(m)
    }
}
impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

/// EtherType values used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EtherType(pub u16);
impl EtherType {
    /// IPv4.
    pub const IPV4: EtherType = EtherType(0x0800);
    /// ARP.
    pub const ARP: EtherType = EtherType(0x0806);
    /// IPv6.
    pub const IPV6: EtherType = EtherType(0x86DD);
    /// 802.1Q VLAN tag.
    pub const VLAN: EtherType = EtherType(0x8100);
    /// 802.1ad QinQ tag.
    pub const QINQ: EtherType = EtherType(0x88A8);
}

fixed_packet!(HEADER_LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Destination MAC.
    #[inline]
    pub fn dst(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::DST])
    }
    /// Source MAC.
    #[inline]
    pub fn src(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::SRC])
    }
    /// EtherType.
    #[inline]
    pub fn ethertype(&self) -> EtherType {
        EtherType(rd16(self.buffer.as_ref(), field::ETHERTYPE))
    }
    /// Bytes after the header.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the destination MAC.
    #[inline]
    pub fn set_dst(&mut self, m: MacAddr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&m.0)
    }
    /// Set the source MAC.
    #[inline]
    pub fn set_src(&mut self, m: MacAddr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&m.0)
    }
    /// Set the EtherType.
    #[inline]
    pub fn set_ethertype(&mut self, t: EtherType) {
        wr16(self.buffer.as_mut(), field::ETHERTYPE, t.0)
    }
}

/// Parsed Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source MAC.
    pub src: MacAddr,
    /// Destination MAC.
    pub dst: MacAddr,
    /// EtherType.
    pub ethertype: EtherType,
}
impl Repr {
    /// Parse.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { src: p.src(), dst: p.dst(), ethertype: p.ethertype() })
    }
    /// 14.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_dst(self.dst);
        p.set_src(self.src);
        p.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    static BYTES: [u8; 14] = [2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    #[test]
    fn test_deconstruct_construct_truncated() {
        let r = Repr {
            dst: MacAddr([2, 0, 0, 0, 0, 2]),
            src: MacAddr([2, 0, 0, 0, 0, 1]),
            ethertype: EtherType::IPV4,
        };
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])).unwrap(), r);
        let mut b = [0u8; 14];
        r.emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, BYTES);
        assert_eq!(Packet::new_checked(&BYTES[..13]).unwrap_err(), crate::Error::Truncated);
        assert_eq!(r.src.to_string(), "02:00:00:00:00:01");
    }
}
