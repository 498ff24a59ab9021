//! Invalidate Extended Transport Header (IBA 9.3.8), 4 bytes: the R_Key to invalidate.

use crate::{fixed_packet, rd32, wr32, Result};

/// IETH length.
pub const HEADER_LEN: usize = 4;

mod field {
    use crate::Field;
    pub const VALUE: Field = 0..4;
}

fixed_packet!(HEADER_LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The 32-bit value (read big-endian).
    #[inline]
    pub fn rkey(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::VALUE)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the 32-bit value (written big-endian).
    #[inline]
    pub fn set_rkey(&mut self, v: u32) {
        wr32(self.buffer.as_mut(), field::VALUE, v)
    }
}

/// Parse the value.
pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<u32> {
    p.check_len()?;
    Ok(p.rkey())
}

/// Emit the value.
pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(v: u32, p: &mut Packet<T>) {
    p.set_rkey(v)
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn test_deconstruct_construct_truncated() {
        let bytes = [0xC0, 0xDE, 0x00, 0x01];
        assert_eq!(parse(&Packet::new_unchecked(&bytes[..])).unwrap(), 0xC0DE0001);
        let mut b = [0u8; 4];
        emit(0xC0DE0001, &mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, bytes);
        assert_eq!(Packet::new_checked(&bytes[..3]).unwrap_err(), crate::Error::Truncated);
    }
}
