//! Queue pair numbers ([`Qpn`], 24 bits) and partition keys ([`PKey`], 16 bits).

use crate::psn::{read_be24, Not24Bits, MASK24};
use core::fmt;

/// Queue pair number (24 bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Qpn(u32);

impl Qpn {
    /// QP1 (GSI).
    pub const GSI: Qpn = Qpn(1);
    /// Largest value.
    pub const MAX: Qpn = Qpn(MASK24);
    /// Construct, truncating to 24 bits.
    #[inline]
    pub const fn new(v: u32) -> Qpn {
        Qpn(v & MASK24)
    }
    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }
    /// Read 3 big-endian bytes.
    #[inline]
    pub fn from_be24(b: &[u8]) -> Qpn {
        Qpn(read_be24(b))
    }
    /// The 3 big-endian bytes.
    #[inline]
    pub const fn to_be24(self) -> [u8; 3] {
        [(self.0 >> 16) as u8, (self.0 >> 8) as u8, self.0 as u8]
    }
}

impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qpn({:#08x})", self.0)
    }
}
impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}
impl From<Qpn> for u32 {
    fn from(v: Qpn) -> u32 {
        v.0
    }
}
/// Checked construction (a QPN a client names): a value with any of bits 24..32 set is
/// refused, where [`Qpn::new`] would truncate it to another QP's number.
impl TryFrom<u32> for Qpn {
    type Error = Not24Bits;
    #[inline]
    fn try_from(v: u32) -> Result<Qpn, Not24Bits> {
        if v & !MASK24 == 0 {
            Ok(Qpn(v))
        } else {
            Err(Not24Bits(v))
        }
    }
}

/// Partition key (16 bits; bit 15 = full membership).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PKey(pub u16);

impl PKey {
    /// The default partition, full member (0xFFFF).
    pub const DEFAULT: PKey = PKey(0xFFFF);
    /// Full-membership bit.
    pub const fn is_full_member(self) -> bool {
        self.0 & 0x8000 != 0
    }
    /// The 15-bit partition, membership bit cleared.
    pub const fn base(self) -> u16 {
        self.0 & 0x7FFF
    }
}
impl Default for PKey {
    fn default() -> PKey {
        PKey::DEFAULT
    }
}
impl fmt::Debug for PKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PKey({:#06x})", self.0)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn checked_construction_refuses_high_bits() {
        assert_eq!(Qpn::try_from(0x12_3456), Ok(Qpn::new(0x12_3456)));
        assert_eq!(Qpn::try_from(0xFF_FFFF), Ok(Qpn::MAX));
        // Truncation would turn 0x0100_0011 into QP 0x11, someone else's.
        assert_eq!(Qpn::try_from(0x0100_0011), Err(Not24Bits(0x0100_0011)));
    }
}
