//! ARP for Ethernet/IPv4 (RFC 826), 28 bytes, for the runtime's neighbour handling.

use crate::eth::{self, EtherType, MacAddr};
use crate::{fixed_packet, rd16, wr16, Error, Result};
use std::net::Ipv4Addr;

/// ARP (Ethernet/IPv4) length.
pub const HEADER_LEN: usize = 28;

mod field {
    use crate::Field;
    pub const HTYPE: Field = 0..2;
    pub const PTYPE: Field = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Field = 6..8;
    pub const SHA: Field = 8..14;
    pub const SPA: Field = 14..18;
    pub const THA: Field = 18..24;
    pub const TPA: Field = 24..28;
}

/// ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOp {
    /// Request (1).
    Request,
    /// Reply (2).
    Reply,
    /// Anything else.
    Unknown(u16),
}
impl From<u16> for ArpOp {
    fn from(v: u16) -> ArpOp {
        match v {
            1 => ArpOp::Request,
            2 => ArpOp::Reply,
            x => ArpOp::Unknown(x),
        }
    }
}
impl From<ArpOp> for u16 {
    fn from(v: ArpOp) -> u16 {
        match v {
            ArpOp::Request => 1,
            ArpOp::Reply => 2,
            ArpOp::Unknown(x) => x,
        }
    }
}

fixed_packet!(HEADER_LEN);

fn ip4(b: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Hardware type (1 = Ethernet).
    pub fn htype(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::HTYPE)
    }
    /// Protocol type (0x0800).
    pub fn ptype(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::PTYPE)
    }
    /// Hardware address length.
    pub fn hlen(&self) -> u8 {
        self.buffer.as_ref()[field::HLEN]
    }
    /// Protocol address length.
    pub fn plen(&self) -> u8 {
        self.buffer.as_ref()[field::PLEN]
    }
    /// Operation.
    pub fn operation(&self) -> ArpOp {
        ArpOp::from(rd16(self.buffer.as_ref(), field::OPER))
    }
    /// Sender MAC.
    pub fn sha(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::SHA])
    }
    /// Sender IP.
    pub fn spa(&self) -> Ipv4Addr {
        ip4(&self.buffer.as_ref()[field::SPA])
    }
    /// Target MAC.
    pub fn tha(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::THA])
    }
    /// Target IP.
    pub fn tpa(&self) -> Ipv4Addr {
        ip4(&self.buffer.as_ref()[field::TPA])
    }
}

/// Parsed ARP (Ethernet/IPv4 only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Operation.
    pub operation: ArpOp,
    /// Sender MAC.
    pub source_mac: MacAddr,
    /// Sender IP.
    pub source_ip: Ipv4Addr,
    /// Target MAC (zero in requests).
    pub target_mac: MacAddr,
    /// Target IP.
    pub target_ip: Ipv4Addr,
}

impl Repr {
    /// Parse; `Unsupported` for anything but Ethernet/IPv4.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        if p.htype() != 1 || p.ptype() != EtherType::IPV4.0 || p.hlen() != 6 || p.plen() != 4 {
            return Err(Error::Unsupported);
        }
        Ok(Repr {
            operation: p.operation(),
            source_mac: p.sha(),
            source_ip: p.spa(),
            target_mac: p.tha(),
            target_ip: p.tpa(),
        })
    }
    /// 28.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        let b = p.buffer.as_mut();
        wr16(b, field::HTYPE, 1);
        wr16(b, field::PTYPE, EtherType::IPV4.0);
        b[field::HLEN] = 6;
        b[field::PLEN] = 4;
        wr16(b, field::OPER, self.operation.into());
        b[field::SHA].copy_from_slice(&self.source_mac.0);
        b[field::SPA].copy_from_slice(&self.source_ip.octets());
        b[field::THA].copy_from_slice(&self.target_mac.0);
        b[field::TPA].copy_from_slice(&self.target_ip.octets());
    }
}

/// Length of an ARP frame built by [`emit_arp_frame`] (before Ethernet minimum padding).
pub const FRAME_LEN: usize = eth::HEADER_LEN + HEADER_LEN;

/// Parse an Ethernet frame carrying ARP (what [`parse_frame`](crate::parse_frame)
/// reported as `Err(Arp)`). VLAN tags are not supported here.
pub fn parse_arp_frame(frame: &[u8]) -> Result<(eth::Repr, Repr)> {
    let e = eth::Repr::parse(&eth::Packet::new_checked(frame)?)?;
    if e.ethertype != EtherType::ARP {
        return Err(Error::NotIp);
    }
    let a = Repr::parse(&Packet::new_checked(&frame[eth::HEADER_LEN..])?)?;
    Ok((e, a))
}

/// Build an ARP frame into `buf` (Ethernet dst = `target_mac` of a reply, or broadcast for
/// a request). Returns the length; the NIC pads to 60 bytes.
pub fn emit_arp_frame(buf: &mut [u8], src_mac: MacAddr, arp: &Repr) -> Result<usize> {
    if buf.len() < FRAME_LEN {
        return Err(Error::Truncated);
    }
    let dst = match arp.operation {
        ArpOp::Request => MacAddr::BROADCAST,
        _ => arp.target_mac,
    };
    eth::Repr { src: src_mac, dst, ethertype: EtherType::ARP }
        .emit(&mut eth::Packet::new_unchecked(&mut buf[..eth::HEADER_LEN]));
    arp.emit(&mut Packet::new_unchecked(&mut buf[eth::HEADER_LEN..FRAME_LEN]));
    Ok(FRAME_LEN)
}

#[cfg(test)]
mod test {
    use super::*;
    static BYTES: [u8; 28] = [
        0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 1, 192, 0, 2, 1, 0, 0, 0, 0, 0, 0, 192, 0, 2, 2,
    ];
    fn repr() -> Repr {
        Repr {
            operation: ArpOp::Request,
            source_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            source_ip: Ipv4Addr::new(192, 0, 2, 1),
            target_mac: MacAddr::default(),
            target_ip: Ipv4Addr::new(192, 0, 2, 2),
        }
    }
    #[test]
    fn test_deconstruct_construct_truncated() {
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])).unwrap(), repr());
        let mut b = [0xFFu8; 28];
        repr().emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, BYTES);
        assert_eq!(Packet::new_checked(&BYTES[..27]).unwrap_err(), Error::Truncated);
    }
    #[test]
    fn arp_frame_is_reported_and_round_trips() {
        let mut f = [0u8; 60];
        let n = emit_arp_frame(&mut f, MacAddr([2, 0, 0, 0, 0, 1]), &repr()).unwrap();
        assert_eq!(crate::parse_frame(&f[..n]).unwrap_err(), Error::Arp);
        assert_eq!(crate::parse_frame(&f).unwrap_err(), Error::Arp);
        let (e, a) = parse_arp_frame(&f).unwrap();
        assert_eq!(e.dst, MacAddr::BROADCAST);
        assert_eq!(a, repr());
    }
}
