//! ICMPv6 neighbour discovery, minimal (RFC 4861): Neighbor Solicitation (135) and
//! Neighbor Advertisement (136) with the source/target link-layer address option, and the
//! ICMPv6 checksum over the IPv6 pseudo-header. Enough for the runtime to resolve and
//! answer for its RoCEv2 IPv6 addresses.

use crate::eth::{self, EtherType, MacAddr};
use crate::ipv4::ones_sum;
use crate::{ipv6, rd16, wr16, Error, Result};
use std::net::Ipv6Addr;

/// IPv6 next-header value of ICMPv6.
pub const NEXT_HEADER: u8 = 58;
/// NS/NA length without options: type, code, checksum, flags/reserved, target.
pub const ND_LEN: usize = 24;
/// NS/NA length with one link-layer address option (8 bytes).
pub const ND_LEN_WITH_LLADDR: usize = ND_LEN + 8;

const TYPE_NS: u8 = 135;
const TYPE_NA: u8 = 136;
const OPT_SRC_LLADDR: u8 = 1;
const OPT_TGT_LLADDR: u8 = 2;

mod field {
    use crate::Field;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Field = 2..4;
    pub const FLAGS: usize = 4;
    pub const RESERVED: Field = 4..8;
    pub const TARGET: Field = 8..24;
    pub const OPTIONS: usize = 24;
    pub const R: u8 = 0x80;
    pub const S: u8 = 0x40;
    pub const O: u8 = 0x20;
}

/// A view of an ICMPv6 message (the whole message: checksum covers all of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap without checking.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }
    /// Wrap and check that the type/code/checksum header is there.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }
    /// At least 4 bytes.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < 4 {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }
    /// Type.
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }
    /// Code.
    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }
    /// Checksum.
    pub fn checksum(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::CHECKSUM)
    }
    /// Checksum verifies against the pseudo-header.
    pub fn verify_checksum(&self, src: &Ipv6Addr, dst: &Ipv6Addr) -> bool {
        checksum_sum(src, dst, self.buffer.as_ref()) == 0xFFFF
    }
}

fn checksum_sum(src: &Ipv6Addr, dst: &Ipv6Addr, msg: &[u8]) -> u32 {
    let mut acc = ones_sum(0, &src.octets());
    acc = ones_sum(acc, &dst.octets());
    acc = ones_sum(acc, &(msg.len() as u32).to_be_bytes());
    acc = ones_sum(acc, &[0, 0, 0, NEXT_HEADER]);
    ones_sum(acc, msg)
}

/// Neighbour discovery message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NdRepr {
    /// Neighbor Solicitation.
    Solicit {
        /// Address being resolved.
        target: Ipv6Addr,
        /// Sender's MAC (absent for DAD).
        src_lladdr: Option<MacAddr>,
    },
    /// Neighbor Advertisement.
    Advert {
        /// Router flag.
        router: bool,
        /// Solicited flag.
        solicited: bool,
        /// Override flag.
        override_: bool,
        /// Address advertised.
        target: Ipv6Addr,
        /// Its MAC.
        target_lladdr: Option<MacAddr>,
    },
}

impl NdRepr {
    /// Parse an ICMPv6 message (checksum verified against `src`/`dst`). Other ICMPv6 types
    /// give `Unsupported`. Options other than the link-layer address are skipped.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>, src: &Ipv6Addr, dst: &Ipv6Addr) -> Result<NdRepr> {
        p.check_len()?;
        let b = p.buffer.as_ref();
        if !matches!(p.msg_type(), TYPE_NS | TYPE_NA) || p.code() != 0 {
            return Err(Error::Unsupported);
        }
        if b.len() < ND_LEN {
            return Err(Error::Truncated);
        }
        if !p.verify_checksum(src, dst) {
            return Err(Error::BadChecksum);
        }
        let mut t = [0u8; 16];
        t.copy_from_slice(&b[field::TARGET]);
        let target = Ipv6Addr::from(t);
        let want = if p.msg_type() == TYPE_NS { OPT_SRC_LLADDR } else { OPT_TGT_LLADDR };
        let mut lladdr = None;
        let mut opts = &b[field::OPTIONS..];
        while !opts.is_empty() {
            if opts.len() < 2 {
                return Err(Error::Truncated);
            }
            let len = usize::from(opts[1]) * 8;
            if len == 0 {
                return Err(Error::BadLength); // RFC 4861 4.6: length 0 is invalid
            }
            if len > opts.len() {
                return Err(Error::Truncated);
            }
            if opts[0] == want && len >= 8 {
                lladdr = Some(MacAddr::from_bytes(&opts[2..8]));
            }
            opts = &opts[len..];
        }
        Ok(if p.msg_type() == TYPE_NS {
            NdRepr::Solicit { target, src_lladdr: lladdr }
        } else {
            let f = b[field::FLAGS];
            NdRepr::Advert {
                router: f & field::R != 0,
                solicited: f & field::S != 0,
                override_: f & field::O != 0,
                target,
                target_lladdr: lladdr,
            }
        })
    }

    /// Message length.
    pub fn buffer_len(&self) -> usize {
        let has = match self {
            NdRepr::Solicit { src_lladdr, .. } => src_lladdr.is_some(),
            NdRepr::Advert { target_lladdr, .. } => target_lladdr.is_some(),
        };
        if has {
            ND_LEN_WITH_LLADDR
        } else {
            ND_LEN
        }
    }

    /// Emit into `buf` (at least `buffer_len()` bytes) with the checksum for `src`/`dst`.
    pub fn emit(&self, buf: &mut [u8], src: &Ipv6Addr, dst: &Ipv6Addr) -> Result<usize> {
        let n = self.buffer_len();
        if buf.len() < n {
            return Err(Error::Truncated);
        }
        let b = &mut buf[..n];
        b.fill(0);
        let (ty, target, ll, opt) = match *self {
            NdRepr::Solicit { target, src_lladdr } => (TYPE_NS, target, src_lladdr, OPT_SRC_LLADDR),
            NdRepr::Advert { router, solicited, override_, target, target_lladdr } => {
                b[field::FLAGS] = (if router { field::R } else { 0 })
                    | (if solicited { field::S } else { 0 })
                    | (if override_ { field::O } else { 0 });
                (TYPE_NA, target, target_lladdr, OPT_TGT_LLADDR)
            }
        };
        debug_assert_eq!(field::RESERVED.start, field::FLAGS);
        b[field::TYPE] = ty;
        b[field::CODE] = 0;
        b[field::TARGET].copy_from_slice(&target.octets());
        if let Some(m) = ll {
            b[field::OPTIONS] = opt;
            b[field::OPTIONS + 1] = 1;
            b[field::OPTIONS + 2..field::OPTIONS + 8].copy_from_slice(&m.0);
        }
        let c = !(checksum_sum(src, dst, b) as u16);
        wr16(b, field::CHECKSUM, c);
        Ok(n)
    }
}

/// The solicited-node multicast address ff02::1:ffXX:XXXX of `addr`.
pub fn solicited_node(addr: &Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00 | u16::from(o[13]), u16::from_be_bytes([o[14], o[15]]))
}

/// The Ethernet multicast MAC 33:33:xx:xx:xx:xx of an IPv6 multicast address.
pub fn multicast_mac(addr: &Ipv6Addr) -> MacAddr {
    let o = addr.octets();
    MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
}

/// A parsed ND frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NdFrame {
    /// Source MAC.
    pub src_mac: MacAddr,
    /// Destination MAC.
    pub dst_mac: MacAddr,
    /// IPv6 source.
    pub src_ip: Ipv6Addr,
    /// IPv6 destination.
    pub dst_ip: Ipv6Addr,
    /// Hop limit (must be 255 for ND; the caller checks, RFC 4861 7.1.1).
    pub hop_limit: u8,
    /// The message.
    pub nd: NdRepr,
}

/// Parse an Ethernet/IPv6/ICMPv6 NS or NA frame (what `parse_frame` reported as
/// `Err(Icmpv6)`).
pub fn parse_nd_frame(frame: &[u8]) -> Result<NdFrame> {
    let e = eth::Repr::parse(&eth::Packet::new_checked(frame)?)?;
    if e.ethertype != EtherType::IPV6 {
        return Err(Error::NotIp);
    }
    let p = ipv6::Packet::new_checked(&frame[eth::HEADER_LEN..])?;
    let ip = ipv6::Repr::parse(&p)?;
    if ip.next_header != NEXT_HEADER {
        return Err(Error::Unsupported);
    }
    let nd = NdRepr::parse(&Packet::new_checked(p.payload())?, &ip.src, &ip.dst)?;
    Ok(NdFrame { src_mac: e.src, dst_mac: e.dst, src_ip: ip.src, dst_ip: ip.dst, hop_limit: ip.hop_limit, nd })
}

/// Build an Ethernet/IPv6 (hop limit 255)/ICMPv6 ND frame. Returns its length.
pub fn emit_nd_frame(
    buf: &mut [u8],
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src_ip: Ipv6Addr,
    dst_ip: Ipv6Addr,
    nd: &NdRepr,
) -> Result<usize> {
    let l = nd.buffer_len();
    let total = eth::HEADER_LEN + ipv6::HEADER_LEN + l;
    if buf.len() < total {
        return Err(Error::Truncated);
    }
    eth::Repr { src: src_mac, dst: dst_mac, ethertype: EtherType::IPV6 }
        .emit(&mut eth::Packet::new_unchecked(&mut buf[..eth::HEADER_LEN]));
    ipv6::Repr {
        src: src_ip,
        dst: dst_ip,
        next_header: NEXT_HEADER,
        payload_len: l,
        tclass: 0,
        flow_label: 0,
        hop_limit: 255,
    }
    .emit(&mut ipv6::Packet::new_unchecked(&mut buf[eth::HEADER_LEN..eth::HEADER_LEN + ipv6::HEADER_LEN]))?;
    nd.emit(&mut buf[eth::HEADER_LEN + ipv6::HEADER_LEN..total], &src_ip, &dst_ip)?;
    Ok(total)
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn ns_na_round_trip_and_checksum() {
        let a: Ipv6Addr = "fe80::1".parse().unwrap();
        let t: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let sn = solicited_node(&t);
        assert_eq!(sn, "ff02::1:ff00:2".parse::<Ipv6Addr>().unwrap());
        assert_eq!(multicast_mac(&sn), MacAddr([0x33, 0x33, 0xff, 0, 0, 2]));
        let ns = NdRepr::Solicit { target: t, src_lladdr: Some(MacAddr([2, 0, 0, 0, 0, 1])) };
        let mut f = [0u8; 128];
        let n = emit_nd_frame(&mut f, MacAddr([2, 0, 0, 0, 0, 1]), multicast_mac(&sn), a, sn, &ns).unwrap();
        assert_eq!(crate::parse_frame(&f[..n]).unwrap_err(), Error::Icmpv6);
        let p = parse_nd_frame(&f[..n]).unwrap();
        assert_eq!((p.nd, p.hop_limit, p.src_ip, p.dst_ip), (ns, 255, a, sn));
        let na = NdRepr::Advert {
            router: false,
            solicited: true,
            override_: true,
            target: t,
            target_lladdr: Some(MacAddr([2, 0, 0, 0, 0, 2])),
        };
        let n = emit_nd_frame(&mut f, MacAddr([2, 0, 0, 0, 0, 2]), MacAddr([2, 0, 0, 0, 0, 1]), t, a, &na).unwrap();
        assert_eq!(parse_nd_frame(&f[..n]).unwrap().nd, na);
        f[n - 1] ^= 1;
        assert_eq!(parse_nd_frame(&f[..n]).unwrap_err(), Error::BadChecksum);
        f[n - 1] ^= 1;
        assert_eq!(parse_nd_frame(&f[..n - 3]).unwrap_err(), Error::Truncated);
    }
}
