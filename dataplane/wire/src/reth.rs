//! RDMA Extended Transport Header (IBA 9.3.3), 16 bytes: VA(8) R_Key(4) DMA length(4).

use crate::{fixed_packet, rd32, rd64, wr32, wr64, Result};

/// RETH length.
pub const HEADER_LEN: usize = 16;

mod field {
    use crate::Field;
    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const LEN: Field = 12..16;
}

fixed_packet!(HEADER_LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Virtual address.
    #[inline]
    pub fn va(&self) -> u64 {
        rd64(self.buffer.as_ref(), field::VA)
    }
    /// R_Key.
    #[inline]
    pub fn rkey(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::RKEY)
    }
    /// DMA length (of the whole message).
    #[inline]
    #[allow(clippy::len_without_is_empty)] // a header field, not a container length
    pub fn len(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::LEN)
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
    /// Set the DMA length.
    #[inline]
    pub fn set_len(&mut self, v: u32) {
        wr32(self.buffer.as_mut(), field::LEN, v)
    }
}

/// Parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Virtual address.
    pub va: u64,
    /// R_Key.
    pub rkey: u32,
    /// DMA length.
    pub len: u32,
}

impl Repr {
    /// Parse.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { va: p.va(), rkey: p.rkey(), len: p.len() })
    }
    /// 16.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_len(self.len);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    static BYTES: [u8; 16] = [0, 0, 0x7f, 0, 0, 0, 0x10, 0, 0, 0, 0x12, 0x34, 0, 0, 0x0b, 0xb8];
    const REPR: Repr = Repr { va: 0x7f0000001000, rkey: 0x1234, len: 3000 };
    #[test]
    fn test_deconstruct_construct_truncated() {
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])).unwrap(), REPR);
        let mut b = [0u8; 16];
        REPR.emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, BYTES);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..15])), Err(crate::Error::Truncated));
    }
}
