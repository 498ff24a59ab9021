//! ACK Extended Transport Header (IBA 9.3.5), 4 bytes: Syndrome(8) MSN(24).
//!
//! Syndrome bits 7:5 give the type: 000 ACK (low 5 bits = credit count, 0x1F = unlimited),
//! 001 RNR NAK (low 5 bits = RNR timer code), 011 NAK (low 5 bits = NAK code), 010 and
//! 1xx reserved.

use crate::{fixed_packet, Msn, Result};

/// AETH length.
pub const HEADER_LEN: usize = 4;

mod field {
    use crate::Field;
    pub const SYNDROME: usize = 0;
    pub const MSN: Field = 1..4;
}

/// NAK codes (IBA table 44).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error (0x60).
    PsnSeqErr,
    /// Invalid request (0x61).
    InvalidRequest,
    /// Remote access error (0x62).
    RemoteAccess,
    /// Remote operational error (0x63).
    RemoteOpErr,
    /// Invalid RD request (0x64).
    InvalidRdRequest,
    /// Reserved code (low 5 bits).
    Unknown(u8),
}

impl NakCode {
    const fn from_bits(b: u8) -> NakCode {
        match b & 0x1F {
            0 => NakCode::PsnSeqErr,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccess,
            3 => NakCode::RemoteOpErr,
            4 => NakCode::InvalidRdRequest,
            x => NakCode::Unknown(x),
        }
    }
    const fn bits(self) -> u8 {
        match self {
            NakCode::PsnSeqErr => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccess => 2,
            NakCode::RemoteOpErr => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Unknown(x) => x & 0x1F,
        }
    }
}

/// AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// ACK with a credit count (5 bits; 0x1F = unlimited / not used).
    Ack {
        /// Credit count code.
        credits: u8,
    },
    /// Receiver not ready, with the 5-bit RNR timer code.
    RnrNak {
        /// RNR timer code.
        timer: u8,
    },
    /// NAK.
    Nak(NakCode),
    /// A reserved syndrome type (010 or 1xx), kept as the raw byte.
    Reserved(u8),
}

impl Syndrome {
    /// ACK with unlimited credits (0x1F), what rxe sends.
    pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack { credits: 0x1F };

    /// Decode the raw byte (total: every byte maps to a syndrome and back).
    pub const fn from_u8(b: u8) -> Syndrome {
        match b >> 5 {
            0b000 => Syndrome::Ack { credits: b & 0x1F },
            0b001 => Syndrome::RnrNak { timer: b & 0x1F },
            0b011 => Syndrome::Nak(NakCode::from_bits(b)),
            _ => Syndrome::Reserved(b),
        }
    }
    /// Encode (fields wider than 5 bits are truncated).
    pub const fn to_u8(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1F,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1F),
            Syndrome::Nak(c) => 0x60 | c.bits(),
            Syndrome::Reserved(b) => b,
        }
    }
    /// An ACK (not RNR NAK or NAK).
    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

impl From<u8> for Syndrome {
    fn from(b: u8) -> Syndrome {
        Syndrome::from_u8(b)
    }
}
impl From<Syndrome> for u8 {
    fn from(s: Syndrome) -> u8 {
        s.to_u8()
    }
}

fixed_packet!(HEADER_LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Raw syndrome byte.
    #[inline]
    pub fn syndrome_raw(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    /// Syndrome.
    #[inline]
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_u8(self.syndrome_raw())
    }
    /// MSN.
    #[inline]
    pub fn msn(&self) -> Msn {
        Msn::from_be24(&self.buffer.as_ref()[field::MSN])
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the syndrome.
    #[inline]
    pub fn set_syndrome(&mut self, s: Syndrome) {
        self.buffer.as_mut()[field::SYNDROME] = s.to_u8()
    }
    /// Set the MSN.
    #[inline]
    pub fn set_msn(&mut self, m: Msn) {
        self.buffer.as_mut()[field::MSN].copy_from_slice(&m.to_be24())
    }
}

/// Parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// MSN.
    pub msn: Msn,
}

impl Repr {
    /// Parse.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { syndrome: p.syndrome(), msn: p.msn() })
    }
    /// 4.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_syndrome(self.syndrome);
        p.set_msn(self.msn);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn syndrome_round_trips_every_byte() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_u8(b).to_u8(), b);
        }
        assert_eq!(Syndrome::from_u8(0x1F), Syndrome::ACK_UNLIMITED);
        assert_eq!(Syndrome::from_u8(0x60), Syndrome::Nak(NakCode::PsnSeqErr));
        assert_eq!(Syndrome::from_u8(0x61), Syndrome::Nak(NakCode::InvalidRequest));
        assert_eq!(Syndrome::from_u8(0x62), Syndrome::Nak(NakCode::RemoteAccess));
        assert_eq!(Syndrome::from_u8(0x63), Syndrome::Nak(NakCode::RemoteOpErr));
        assert_eq!(Syndrome::from_u8(0x64), Syndrome::Nak(NakCode::InvalidRdRequest));
        assert_eq!(Syndrome::from_u8(0x3A), Syndrome::RnrNak { timer: 0x1A });
        assert_eq!(Syndrome::from_u8(0x45), Syndrome::Reserved(0x45));
    }
    static BYTES: [u8; 4] = [0x61, 0x00, 0x01, 0x02];
    #[test]
    fn test_deconstruct_construct_truncated() {
        let r = Repr { syndrome: Syndrome::Nak(NakCode::InvalidRequest), msn: Msn::new(0x102) };
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])).unwrap(), r);
        let mut b = [0u8; 4];
        r.emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, BYTES);
        assert_eq!(Packet::new_checked(&BYTES[..3]).unwrap_err(), crate::Error::Truncated);
    }
}
