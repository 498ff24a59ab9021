//! UDP header (RFC 768), 8 bytes. RoCEv2: destination port 4791, checksum 0.

use crate::{rd16, wr16, Error, Result};

/// Header length.
pub const HEADER_LEN: usize = 8;
/// The RoCEv2 destination port.
pub const ROCE_PORT: u16 = 4791;

mod field {
    use crate::Field;
    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
    pub const LENGTH: Field = 4..6;
    pub const CHECKSUM: Field = 6..8; // masked in the ICRC
}

/// Offset of the checksum (masked in the ICRC).
pub(crate) const CHECKSUM_OFFSET: usize = field::CHECKSUM.start;

/// A view of a UDP header and datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap without checking.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }
    /// Wrap and `check_len`.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }
    /// The buffer holds the header; the length field is ≥ 8 (`BadLength`) and within the
    /// buffer (`Truncated`).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let l = usize::from(self.len());
        if l < HEADER_LEN {
            return Err(Error::BadLength);
        }
        if l > len {
            return Err(Error::Truncated);
        }
        Ok(())
    }
    /// Underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::SRC_PORT)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::DST_PORT)
    }
    /// Length (header + payload).
    #[allow(clippy::len_without_is_empty)] // a header field, not a container length
    pub fn len(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::LENGTH)
    }
    /// Checksum.
    pub fn checksum(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::CHECKSUM)
    }
    /// Bytes after the header, up to the length field.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..usize::from(self.len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the source port.
    pub fn set_src_port(&mut self, v: u16) {
        wr16(self.buffer.as_mut(), field::SRC_PORT, v)
    }
    /// Set the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        wr16(self.buffer.as_mut(), field::DST_PORT, v)
    }
    /// Set the length.
    pub fn set_len(&mut self, v: u16) {
        wr16(self.buffer.as_mut(), field::LENGTH, v)
    }
    /// Set the checksum.
    pub fn set_checksum(&mut self, v: u16) {
        wr16(self.buffer.as_mut(), field::CHECKSUM, v)
    }
}

/// Parsed UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload length (length field − 8).
    pub payload_len: usize,
}

impl Repr {
    /// Parse (the checksum is not verified: RoCEv2 sends 0 and protects with the ICRC).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            payload_len: usize::from(p.len()) - HEADER_LEN,
        })
    }
    /// 8.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit with checksum 0 (`BadLength` if the length does not fit 16 bits).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let l = u16::try_from(self.payload_len + HEADER_LEN).map_err(|_| Error::BadLength)?;
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(l);
        p.set_checksum(0);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    static BYTES: [u8; 12] = [0xC0, 0x00, 0x12, 0xB7, 0x00, 0x0C, 0x00, 0x00, 1, 2, 3, 4];
    #[test]
    fn test_deconstruct_construct_truncated() {
        let r = Repr { src_port: 0xC000, dst_port: ROCE_PORT, payload_len: 4 };
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), r);
        assert_eq!(p.payload(), &[1, 2, 3, 4]);
        let mut o = [0xFFu8; 8];
        r.emit(&mut Packet::new_unchecked(&mut o[..])).unwrap();
        assert_eq!(o, BYTES[..8]);
        assert_eq!(Packet::new_checked(&BYTES[..11]).unwrap_err(), Error::Truncated);
        let mut x = BYTES;
        x[5] = 4;
        assert_eq!(Packet::new_checked(&x[..]).unwrap_err(), Error::BadLength);
    }
}
