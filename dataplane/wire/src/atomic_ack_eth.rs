//! Atomic ACK Extended Transport Header (IBA 9.3.6), 8 bytes: original remote data.

use crate::{fixed_packet, rd64, wr64, Result};

/// AtomicAckETH length.
pub const HEADER_LEN: usize = 8;

mod field {
    use crate::Field;
    pub const ORIG: Field = 0..8;
}

fixed_packet!(HEADER_LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Original remote data.
    #[inline]
    pub fn orig(&self) -> u64 {
        rd64(self.buffer.as_ref(), field::ORIG)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the original remote data.
    #[inline]
    pub fn set_orig(&mut self, v: u64) {
        wr64(self.buffer.as_mut(), field::ORIG, v)
    }
}

/// Parsed AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Original remote data.
    pub orig: u64,
}

impl Repr {
    /// Parse.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { orig: p.orig() })
    }
    /// 8.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_orig(self.orig)
    }
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn test_deconstruct_construct_truncated() {
        let bytes = [0, 0, 0, 0, 0, 0, 0, 42];
        assert_eq!(Repr::parse(&Packet::new_unchecked(&bytes[..])).unwrap(), Repr { orig: 42 });
        let mut b = [0xFFu8; 8];
        Repr { orig: 42 }.emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, bytes);
        assert_eq!(Packet::new_checked(&bytes[..7]).unwrap_err(), crate::Error::Truncated);
    }
}
