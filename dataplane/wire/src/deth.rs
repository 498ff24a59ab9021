//! Datagram Extended Transport Header (IBA 9.3.2), 8 bytes: Q_Key(4) resv(1) SrcQP(3).

use crate::{fixed_packet, rd32, wr32, Qpn, Result};

/// DETH length.
pub const HEADER_LEN: usize = 8;

mod field {
    use crate::Field;
    pub const QKEY: Field = 0..4;
    pub const RESV: usize = 4;
    pub const SRC_QP: Field = 5..8;
}

fixed_packet!(HEADER_LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Q_Key.
    #[inline]
    pub fn qkey(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::QKEY)
    }
    /// Source QP.
    #[inline]
    pub fn src_qp(&self) -> Qpn {
        Qpn::from_be24(&self.buffer.as_ref()[field::SRC_QP])
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the Q_Key.
    #[inline]
    pub fn set_qkey(&mut self, v: u32) {
        wr32(self.buffer.as_mut(), field::QKEY, v)
    }
    /// Set the source QP (the reserved byte is cleared).
    #[inline]
    pub fn set_src_qp(&mut self, v: Qpn) {
        let b = self.buffer.as_mut();
        b[field::RESV] = 0;
        b[field::SRC_QP].copy_from_slice(&v.to_be24())
    }
}

/// Parsed DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Q_Key.
    pub qkey: u32,
    /// Source QP.
    pub src_qp: Qpn,
}

impl Repr {
    /// Parse.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { qkey: p.qkey(), src_qp: p.src_qp() })
    }
    /// 8.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_qkey(self.qkey);
        p.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn test_deconstruct_construct_truncated() {
        let bytes = [0x11, 0x11, 0x11, 0x11, 0, 0, 0, 1];
        let r = Repr { qkey: 0x11111111, src_qp: Qpn::GSI };
        assert_eq!(Repr::parse(&Packet::new_unchecked(&bytes[..])).unwrap(), r);
        let mut b = [0xFFu8; 8];
        r.emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, bytes);
        assert_eq!(Packet::new_checked(&bytes[..7]).unwrap_err(), crate::Error::Truncated);
    }
}
