//! IPv4 header (RFC 791). RoCEv2 sends it with IHL 5, DF set, no fragmentation.

use crate::{rd16, wr16, Error, Result};
use std::net::Ipv4Addr;

/// Header length without options.
pub const HEADER_LEN: usize = 20;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

mod field {
    use crate::Field;
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1; // DSCP | ECN (masked in the ICRC)
    pub const LENGTH: Field = 2..4;
    pub const IDENT: Field = 4..6;
    pub const FLG_OFF: Field = 6..8;
    pub const TTL: usize = 8; // masked in the ICRC
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Field = 10..12; // masked in the ICRC
    pub const SRC: Field = 12..16;
    pub const DST: Field = 16..20;
    pub const DF: u16 = 0x4000;
    pub const MF: u16 = 0x2000;
    pub const OFF_MASK: u16 = 0x1FFF;
}

/// Offsets of the fields masked to all ones in the ICRC.
pub(crate) const ICRC_MASKED: [usize; 4] = [field::TOS, field::TTL, field::CHECKSUM.start, field::CHECKSUM.start + 1];

/// Internet checksum (one's complement sum) of `data`, folded, not complemented.
pub(crate) fn ones_sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        acc += u32::from(*b) << 8;
    }
    while acc > 0xFFFF {
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    acc
}

/// A view of an IPv4 header.
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
    /// Buffer holds the fixed header, the IHL is sane and the buffer holds
    /// `total_len` bytes (`Truncated`, `BadIpHeader`, `BadLength`).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(Error::BadIpHeader);
        }
        if hl > len {
            return Err(Error::Truncated);
        }
        let tl = usize::from(self.total_len());
        if tl < hl {
            return Err(Error::BadLength);
        }
        if tl > len {
            return Err(Error::Truncated);
        }
        Ok(())
    }
    /// Underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// Version nibble.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }
    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0F) * 4
    }
    /// TOS byte (DSCP << 2 | ECN).
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[field::TOS]
    }
    /// Total length.
    pub fn total_len(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::LENGTH)
    }
    /// Identification.
    pub fn ident(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::IDENT)
    }
    /// Don't fragment.
    pub fn dont_frag(&self) -> bool {
        rd16(self.buffer.as_ref(), field::FLG_OFF) & field::DF != 0
    }
    /// More fragments or a non-zero offset.
    pub fn is_fragment(&self) -> bool {
        rd16(self.buffer.as_ref(), field::FLG_OFF) & (field::MF | field::OFF_MASK) != 0
    }
    /// TTL.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }
    /// Protocol.
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }
    /// Header checksum.
    pub fn checksum(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::CHECKSUM)
    }
    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::SRC];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }
    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::DST];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }
    /// Header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        ones_sum(0, &self.buffer.as_ref()[..self.header_len()]) == 0xFFFF
    }
    /// Bytes after the header, up to `total_len`.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..usize::from(self.total_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set version 4 and IHL 5 (no options).
    pub fn set_version_ihl5(&mut self) {
        self.buffer.as_mut()[field::VER_IHL] = 0x45
    }
    /// Set the TOS byte.
    pub fn set_tos(&mut self, v: u8) {
        self.buffer.as_mut()[field::TOS] = v
    }
    /// Set the total length.
    pub fn set_total_len(&mut self, v: u16) {
        wr16(self.buffer.as_mut(), field::LENGTH, v)
    }
    /// Set the identification.
    pub fn set_ident(&mut self, v: u16) {
        wr16(self.buffer.as_mut(), field::IDENT, v)
    }
    /// Set flags to DF only, offset 0.
    pub fn set_df(&mut self) {
        wr16(self.buffer.as_mut(), field::FLG_OFF, field::DF)
    }
    /// Set the TTL.
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v
    }
    /// Set the protocol.
    pub fn set_protocol(&mut self, v: u8) {
        self.buffer.as_mut()[field::PROTOCOL] = v
    }
    /// Set the source address.
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a.octets())
    }
    /// Set the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a.octets())
    }
    /// Compute and store the header checksum.
    pub fn fill_checksum(&mut self) {
        let hl = self.header_len();
        let b = self.buffer.as_mut();
        wr16(b, field::CHECKSUM, 0);
        let c = !(ones_sum(0, &b[..hl]) as u16);
        wr16(b, field::CHECKSUM, c);
    }
}

/// Parsed IPv4 header (the parts RoCEv2 uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source.
    pub src: Ipv4Addr,
    /// Destination.
    pub dst: Ipv4Addr,
    /// Protocol.
    pub protocol: u8,
    /// Payload length (total length − header length).
    pub payload_len: usize,
    /// TOS byte.
    pub tos: u8,
    /// TTL.
    pub ttl: u8,
    /// Identification.
    pub ident: u16,
}

impl Repr {
    /// Parse: version 4, not a fragment (`Fragment`), lengths consistent. The header
    /// checksum is not verified (offloaded captures carry garbage; the ICRC masks it).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        if p.version() != 4 {
            return Err(Error::BadIpHeader);
        }
        if p.is_fragment() {
            return Err(Error::Fragment);
        }
        Ok(Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            protocol: p.protocol(),
            payload_len: usize::from(p.total_len()) - p.header_len(),
            tos: p.tos(),
            ttl: p.ttl(),
            ident: p.ident(),
        })
    }
    /// 20 (we never emit options).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit with IHL 5, DF, checksum filled. `payload_len + 20` must fit in 16 bits
    /// (`BadLength`).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let tl = u16::try_from(self.payload_len + HEADER_LEN).map_err(|_| Error::BadLength)?;
        p.set_version_ihl5();
        p.set_tos(self.tos);
        p.set_total_len(tl);
        p.set_ident(self.ident);
        p.set_df();
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        p.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    // 45 02 0024 1234 4000 40 11 csum c0000201 c0000202 + 16 bytes payload
    fn bytes() -> [u8; 36] {
        let mut b = [0u8; 36];
        b[..20].copy_from_slice(&[
            0x45, 0x02, 0x00, 0x24, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 192, 0, 2, 1,
            192, 0, 2, 2,
        ]);
        let c = !(ones_sum(0, &b[..20]) as u16);
        b[10..12].copy_from_slice(&c.to_be_bytes());
        b
    }
    fn repr() -> Repr {
        Repr {
            src: Ipv4Addr::new(192, 0, 2, 1),
            dst: Ipv4Addr::new(192, 0, 2, 2),
            protocol: 17,
            payload_len: 16,
            tos: 2,
            ttl: 64,
            ident: 0x1234,
        }
    }
    #[test]
    fn test_deconstruct_construct() {
        let b = bytes();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum() && p.dont_frag());
        assert_eq!(Repr::parse(&p).unwrap(), repr());
        let mut o = [0u8; 36];
        repr().emit(&mut Packet::new_unchecked(&mut o[..])).unwrap();
        assert_eq!(o, b);
    }
    #[test]
    fn test_truncated_and_impossible_len() {
        let b = bytes();
        assert_eq!(Packet::new_checked(&b[..19]).unwrap_err(), Error::Truncated);
        assert_eq!(Packet::new_checked(&b[..35]).unwrap_err(), Error::Truncated);
        let mut x = b;
        x[3] = 10; // total length < header length
        assert_eq!(Packet::new_checked(&x[..]).unwrap_err(), Error::BadLength);
        x = b;
        x[0] = 0x44;
        assert_eq!(Packet::new_checked(&x[..]).unwrap_err(), Error::BadIpHeader);
        x = b;
        x[6] = 0x20; // MF
        assert_eq!(Repr::parse(&Packet::new_unchecked(&x[..])), Err(Error::Fragment));
    }
}
