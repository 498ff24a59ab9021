//! What the RDMA CM (the kernel's `cma.c`, librdmacm) adds on top of the IB CM for IP-addressed
//! connections: service IDs built from a port space and a port, and the 36-byte IP header
//! (`struct cma_hdr`) at the start of the REQ and SIDR_REQ private data.
//!
//! ```text
//! service ID = 0x0000_0000_01PP_PPPP: 0x01 prefix, 16-bit port space (low byte), 16-bit port
//!   RDMA_PS_TCP 0x0106 -> 0x0000000001060000 | port      RDMA_PS_UDP 0x0111 -> ...01110000 | port
//!   RDMA_PS_IB  0x013F -> 0x00000000013F0000 | port
//! cma_hdr:  0 cma_version (0x00)   1 ip_version << 4   2..4 source port (the active side's)
//!           4..20 source IP   20..36 destination IP (IPv4: 12 zero bytes, then the address)
//! ```
//! The passive CMA checks the version and the IP version and takes the connection's addresses
//! from this header; user private data follows it, so a librdmacm REQ carries at most
//! 92 − 36 = 56 bytes of user data (SIDR_REQ: 216 − 36 = 180).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::bits::{rd16, rd_gid, wr16, Field};
use crate::{Error, Result};

/// Length of the RDMA CM IP header.
pub const HEADER_LEN: usize = 36;
/// `CMA_VERSION`.
pub const CMA_VERSION: u8 = 0x00;
/// Q_Key of RDMA CM UD QPs in the UDP port space (`RDMA_UDP_QKEY`), returned in SIDR_REP.
pub const UDP_QKEY: u32 = 0x0123_4567;
/// Prefix of every IP-based RDMA CM service ID (`RDMA_IB_IP_PREFIX`).
pub const IP_PREFIX: u64 = 0x0000_0000_0100_0000;
/// Mask selecting prefix + port space (`RDMA_IB_IP_PS_MASK`).
pub const PS_MASK: u64 = 0xFFFF_FFFF_FFFF_0000;
/// Max user private data in a REQ sent through the RDMA CM.
pub const REQ_USER_DATA_LEN: usize = crate::msg::req::PRIVATE_DATA_LEN - HEADER_LEN;
/// Max user private data in a SIDR_REQ sent through the RDMA CM.
pub const SIDR_REQ_USER_DATA_LEN: usize = crate::msg::sidr_req::PRIVATE_DATA_LEN - HEADER_LEN;

/// An RDMA CM port space (`enum rdma_ucm_port_space`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct PortSpace(pub u16);

impl PortSpace {
    /// `RDMA_PS_IPOIB`.
    pub const IPOIB: PortSpace = PortSpace(0x0002);
    /// `RDMA_PS_IB` (any QP type).
    pub const IB: PortSpace = PortSpace(0x013F);
    /// `RDMA_PS_TCP` (RC).
    pub const TCP: PortSpace = PortSpace(0x0106);
    /// `RDMA_PS_UDP` (UD, resolved with SIDR).
    pub const UDP: PortSpace = PortSpace(0x0111);
    /// Every port space a client may create an id in.
    pub const ALL: [PortSpace; 4] = [PortSpace::TCP, PortSpace::UDP, PortSpace::IB, PortSpace::IPOIB];
}

/// A number that is no `enum rdma_ucm_port_space` (a client's `rdma_create_id` argument).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UnknownPortSpace(pub u16);

/// Checked construction: only [`PortSpace::ALL`].
impl TryFrom<u16> for PortSpace {
    type Error = UnknownPortSpace;
    fn try_from(v: u16) -> core::result::Result<PortSpace, UnknownPortSpace> {
        PortSpace::ALL.into_iter().find(|p| p.0 == v).ok_or(UnknownPortSpace(v))
    }
}

/// The service ID the kernel CMA uses for `port` in `ps` (`rdma_get_service_id`).
pub const fn service_id(ps: PortSpace, port: u16) -> u64 {
    ((ps.0 as u64) << 16) | port as u64
}

/// Split an RDMA CM IP service ID into port space and port; `None` for other service IDs
/// (those carry no `cma_hdr`).
pub fn parse_service_id(sid: u64) -> Option<(PortSpace, u16)> {
    let ps = sid & PS_MASK;
    [PortSpace::TCP, PortSpace::UDP, PortSpace::IB]
        .into_iter()
        .find(|p| service_id(*p, 0) == ps)
        .map(|p| (p, sid as u16))
}

mod field {
    use crate::bits::Field;
    pub const VERSION: usize = 0;
    pub const IP_VERSION: usize = 1;
    pub const PORT: Field = 2..4;
    pub const SRC: Field = 4..20;
    pub const DST: Field = 20..36;
}

/// A view of the RDMA CM IP header.
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
    /// `Err(Truncated)` below 36 bytes.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }
    /// `cma_version`.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }
    /// IP version (4 or 6; the top nibble of byte 1).
    pub fn ip_version(&self) -> u8 {
        self.buffer.as_ref()[field::IP_VERSION] >> 4
    }
    /// Source port.
    pub fn port(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::PORT)
    }
    fn addr(&self, f: Field) -> [u8; 16] {
        rd_gid(self.buffer.as_ref(), f)
    }
}

/// Parsed RDMA CM IP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source (active side) IP.
    pub src_ip: IpAddr,
    /// Source port.
    pub src_port: u16,
    /// Destination (passive side) IP.
    pub dst_ip: IpAddr,
}

impl Repr {
    /// Parse; `BadField` for a version other than 0, an IP version other than 4/6, or mixed
    /// families (impossible here: one nibble gives both).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        if p.version() != CMA_VERSION {
            return Err(Error::BadField);
        }
        let ip = |a: [u8; 16], v6: bool| {
            if v6 {
                IpAddr::V6(Ipv6Addr::from(a))
            } else {
                IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))
            }
        };
        let v6 = match p.ip_version() {
            4 => false,
            6 => true,
            _ => return Err(Error::BadField),
        };
        Ok(Repr { src_ip: ip(p.addr(field::SRC), v6), src_port: p.port(), dst_ip: ip(p.addr(field::DST), v6) })
    }
    /// 36.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit; `BadField` if the source and destination families differ.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let enc = |a: IpAddr| -> [u8; 16] {
            match a {
                IpAddr::V6(v) => v.octets(),
                IpAddr::V4(v) => {
                    let mut o = [0u8; 16];
                    o[12..].copy_from_slice(&v.octets());
                    o
                }
            }
        };
        let ver = match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4u8,
            (IpAddr::V6(_), IpAddr::V6(_)) => 6,
            _ => return Err(Error::BadField),
        };
        let b = p.buffer.as_mut();
        b[field::VERSION] = CMA_VERSION;
        b[field::IP_VERSION] = ver << 4;
        wr16(b, field::PORT, self.src_port);
        b[field::SRC].copy_from_slice(&enc(self.src_ip));
        b[field::DST].copy_from_slice(&enc(self.dst_ip));
        Ok(())
    }
    /// Private data for a REQ (or SIDR_REQ, with `max` = its field length) as the CMA builds
    /// it: this header followed by the user's bytes. `PrivateDataTooLong` if they do not fit.
    pub fn with_user_data(&self, user: &[u8], max: usize) -> Result<Vec<u8>> {
        if HEADER_LEN + user.len() > max {
            return Err(Error::PrivateDataTooLong);
        }
        let mut v = vec![0u8; HEADER_LEN + user.len()];
        self.emit(&mut Packet::new_unchecked(&mut v[..HEADER_LEN]))?;
        v[HEADER_LEN..].copy_from_slice(user);
        Ok(v)
    }
}

/// Split REQ/SIDR_REQ private data into the CMA header and the user's part, if `service_id`
/// is an RDMA CM IP service ID and the header is valid.
pub fn split_private_data(service_id: u64, pd: &[u8]) -> Option<(Repr, &[u8])> {
    parse_service_id(service_id)?;
    let r = Repr::parse(&Packet::new_checked(pd).ok()?).ok()?;
    Some((r, &pd[HEADER_LEN..]))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn service_ids_match_the_kernel() {
        assert_eq!(service_id(PortSpace::TCP, 7174), 0x0000_0000_0106_1C06);
        assert_eq!(service_id(PortSpace::UDP, 7174), 0x0000_0000_0111_1C06);
        assert_eq!(service_id(PortSpace::IB, 1), 0x0000_0000_013F_0001);
        assert_eq!(service_id(PortSpace::TCP, 0) & !PS_MASK, 0);
        assert_eq!(PortSpace::try_from(0x0106), Ok(PortSpace::TCP));
        assert_eq!(PortSpace::try_from(0x0002), Ok(PortSpace::IPOIB));
        for bad in [0, 0x0107, 0xFFFF] {
            assert_eq!(PortSpace::try_from(bad), Err(UnknownPortSpace(bad)));
        }
        assert_eq!(service_id(PortSpace::TCP, 0) & 0xFFFF_FFFF_FF00_0000, IP_PREFIX);
        assert_eq!(parse_service_id(0x0000_0000_0106_1C06), Some((PortSpace::TCP, 7174)));
        assert_eq!(parse_service_id(0x1000), None);
        assert_eq!(REQ_USER_DATA_LEN, 56);
        assert_eq!(SIDR_REQ_USER_DATA_LEN, 180);
    }

    #[test]
    fn header_layout_ipv4_and_ipv6() {
        let r = Repr { src_ip: "10.0.0.1".parse().unwrap(), src_port: 0xC001, dst_ip: "10.0.0.2".parse().unwrap() };
        let pd = r.with_user_data(b"hi", 92).unwrap();
        let mut want = vec![0u8; 38];
        want[1] = 0x40;
        want[2..4].copy_from_slice(&[0xC0, 0x01]);
        want[16..20].copy_from_slice(&[10, 0, 0, 1]);
        want[32..36].copy_from_slice(&[10, 0, 0, 2]);
        want[36..].copy_from_slice(b"hi");
        assert_eq!(pd, want);
        assert_eq!(split_private_data(service_id(PortSpace::TCP, 1), &pd), Some((r, &b"hi"[..])));
        let r6 = Repr { src_ip: "fd00::1".parse().unwrap(), src_port: 1, dst_ip: "fd00::2".parse().unwrap() };
        let pd6 = r6.with_user_data(&[], 92).unwrap();
        assert_eq!(pd6[1], 0x60);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&pd6[..])).unwrap(), r6);
        assert_eq!(r.with_user_data(&[0; 57], 92), Err(Error::PrivateDataTooLong));
        let mixed = Repr { dst_ip: "fd00::2".parse().unwrap(), ..r };
        assert_eq!(mixed.with_user_data(&[], 92), Err(Error::BadField));
        let mut bad = pd.clone();
        bad[1] = 0x50;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&bad[..])), Err(Error::BadField));
        assert_eq!(Packet::new_checked(&pd[..35]).unwrap_err(), Error::Truncated);
    }
}
