//! IPv6 fixed header (RFC 8200), 40 bytes. RoCEv2 sends no extension headers.

use crate::{rd16, rd32, wr16, wr32, Error, Result};
use std::net::Ipv6Addr;

/// Fixed header length.
pub const HEADER_LEN: usize = 40;

mod field {
    use crate::Field;
    pub const VER_TC_FLOW: Field = 0..4; // version(4) tclass(8) flow(20): tclass+flow masked
    pub const LENGTH: Field = 4..6;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LIMIT: usize = 7; // masked in the ICRC
    pub const SRC: Field = 8..24;
    pub const DST: Field = 24..40;
}

/// A view of an IPv6 header.
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
    /// The buffer holds the header and `payload_len` bytes after it.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN || len < HEADER_LEN + usize::from(self.payload_len()) {
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
        self.buffer.as_ref()[0] >> 4
    }
    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        (rd32(self.buffer.as_ref(), field::VER_TC_FLOW) >> 20) as u8
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::VER_TC_FLOW) & 0xF_FFFF
    }
    /// Payload length.
    pub fn payload_len(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::LENGTH)
    }
    /// Next header.
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NXT_HDR]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }
    /// Source.
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        Ipv6Addr::from(a)
    }
    /// Destination.
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        Ipv6Addr::from(a)
    }
    /// Bytes after the header, up to `payload_len`.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + usize::from(self.payload_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set version 6, traffic class and flow label.
    pub fn set_ver_tc_flow(&mut self, tclass: u8, flow: u32) {
        let v = (6 << 28) | (u32::from(tclass) << 20) | (flow & 0xF_FFFF);
        wr32(self.buffer.as_mut(), field::VER_TC_FLOW, v)
    }
    /// Set the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        wr16(self.buffer.as_mut(), field::LENGTH, v)
    }
    /// Set the next header.
    pub fn set_next_header(&mut self, v: u8) {
        self.buffer.as_mut()[field::NXT_HDR] = v
    }
    /// Set the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = v
    }
    /// Set the source.
    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a.octets())
    }
    /// Set the destination.
    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a.octets())
    }
}

/// Parsed IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source.
    pub src: Ipv6Addr,
    /// Destination.
    pub dst: Ipv6Addr,
    /// Next header.
    pub next_header: u8,
    /// Payload length.
    pub payload_len: usize,
    /// Traffic class.
    pub tclass: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
}

impl Repr {
    /// Parse (version must be 6).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        if p.version() != 6 {
            return Err(Error::BadIpHeader);
        }
        Ok(Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            next_header: p.next_header(),
            payload_len: usize::from(p.payload_len()),
            tclass: p.traffic_class(),
            flow_label: p.flow_label(),
            hop_limit: p.hop_limit(),
        })
    }
    /// 40.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit (`BadLength` if the payload length does not fit 16 bits).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let pl = u16::try_from(self.payload_len).map_err(|_| Error::BadLength)?;
        p.set_ver_tc_flow(self.tclass, self.flow_label);
        p.set_payload_len(pl);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn test_deconstruct_construct_truncated() {
        let mut b = [0u8; 48];
        b[..8].copy_from_slice(&[0x60, 0x21, 0x23, 0x45, 0x00, 0x08, 0x11, 0x40]);
        b[8..24].copy_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        b[24..40].copy_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
        let r = Repr {
            src: "2001:db8::1".parse().unwrap(),
            dst: "2001:db8::2".parse().unwrap(),
            next_header: 17,
            payload_len: 8,
            tclass: 0x02,
            flow_label: 0x12345,
            hop_limit: 64,
        };
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])).unwrap(), r);
        let mut o = [0u8; 48];
        r.emit(&mut Packet::new_unchecked(&mut o[..])).unwrap();
        assert_eq!(o, b);
        assert_eq!(Packet::new_checked(&b[..47]).unwrap_err(), Error::Truncated);
        assert_eq!(Packet::new_checked(&b[..39]).unwrap_err(), Error::Truncated);
    }
}
