//! Atomic Extended Transport Header (IBA 9.3.4), 28 bytes:
//! VA(8) R_Key(4) Swap/Add data(8) Compare data(8).

use crate::{fixed_packet, rd32, rd64, wr32, wr64, Result};

/// AtomicETH length.
pub const HEADER_LEN: usize = 28;

mod field {
    use crate::Field;
    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const SWAP_ADD: Field = 12..20;
    pub const COMPARE: Field = 20..28;
}

fixed_packet!(HEADER_LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// VA.
    #[inline]
    pub fn va(&self) -> u64 {
        rd64(self.buffer.as_ref(), field::VA)
    }
    /// R_Key.
    #[inline]
    pub fn rkey(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::RKEY)
    }
    /// Swap (CMP_SWP) or add (FETCH_ADD) operand.
    #[inline]
    pub fn swap_add(&self) -> u64 {
        rd64(self.buffer.as_ref(), field::SWAP_ADD)
    }
    /// Compare operand.
    #[inline]
    pub fn compare(&self) -> u64 {
        rd64(self.buffer.as_ref(), field::COMPARE)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the VA.
    #[inline]
    pub fn set_va(&mut self, v: u64) {
        wr64(self.buffer.as_mut(), field::VA, v)
    }
    /// Set the R_Key.
    #[inline]
    pub fn set_rkey(&mut self, v: u32) {
        wr32(self.buffer.as_mut(), field::RKEY, v)
    }
    /// Set the swap/add operand.
    #[inline]
    pub fn set_swap_add(&mut self, v: u64) {
        wr64(self.buffer.as_mut(), field::SWAP_ADD, v)
    }
    /// Set the compare operand.
    #[inline]
    pub fn set_compare(&mut self, v: u64) {
        wr64(self.buffer.as_mut(), field::COMPARE, v)
    }
}

/// Parsed AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// VA (must be 8-byte aligned; checked by the responder, not here).
    pub va: u64,
    /// R_Key.
    pub rkey: u32,
    /// Swap or add operand.
    pub swap_add: u64,
    /// Compare operand (ignored by FETCH_ADD).
    pub compare: u64,
}

impl Repr {
    /// Parse.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { va: p.va(), rkey: p.rkey(), swap_add: p.swap_add(), compare: p.compare() })
    }
    /// 28.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_swap_add(self.swap_add);
        p.set_compare(self.compare);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn test_deconstruct_construct_truncated() {
        let mut bytes = [0u8; 28];
        bytes[7] = 8;
        bytes[11] = 0x77;
        bytes[19] = 1;
        bytes[27] = 2;
        let r = Repr { va: 8, rkey: 0x77, swap_add: 1, compare: 2 };
        assert_eq!(Repr::parse(&Packet::new_unchecked(&bytes[..])).unwrap(), r);
        let mut b = [0xFFu8; 28];
        r.emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, bytes);
        assert_eq!(Packet::new_checked(&bytes[..27]).unwrap_err(), crate::Error::Truncated);
    }
}
