//! Multicast on a RoCEv2 port: which GIDs are multicast groups, the Ethernet address a group's
//! datagrams go to (RFC 1112 §6.4 for IPv4, RFC 2464 §7 for IPv6), and the IGMPv2 messages
//! (RFC 2236) a port sends so that snooping switches forward a group's frames to it.
//!
//! A group's GID is its IP address as RoCEv2 carries it: IPv4-mapped (`::ffff:224.0.0.0/100`)
//! or IPv6 (`ff00::/8`), the destination address of the datagram's IP header.

use std::net::Ipv4Addr;

use crate::eth::{self, EtherType, MacAddr};
use crate::ipv4::ones_sum;
use crate::{Error, Result};

/// IP protocol number of IGMP.
pub const PROTO_IGMP: u8 = 2;
/// IGMP message types (RFC 2236 §2.1, RFC 3376 §4).
pub const MEMBERSHIP_QUERY: u8 = 0x11;
/// IGMPv2 Membership Report.
pub const V2_MEMBERSHIP_REPORT: u8 = 0x16;
/// IGMPv2 Leave Group.
pub const LEAVE_GROUP: u8 = 0x17;
/// All routers on this subnet: where a Leave Group goes.
pub const ALL_ROUTERS: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 2);

/// The IPv4 group of an IPv4-mapped multicast GID.
pub fn gid_ipv4_group(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    let mapped = gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    let a = Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]);
    (mapped && a.is_multicast()).then_some(a)
}

/// Is `gid` a multicast group (IPv4-mapped 224.0.0.0/4, or IPv6 ff00::/8)?
pub fn is_multicast_gid(gid: &[u8; 16]) -> bool {
    gid[0] == 0xff || gid_ipv4_group(gid).is_some()
}

/// The Ethernet destination of a group's datagrams: 01:00:5e + the low 23 bits of an IPv4
/// group, 33:33 + the low 32 bits of an IPv6 one. `None` for a unicast GID.
pub fn group_mac(gid: &[u8; 16]) -> Option<MacAddr> {
    if let Some(a) = gid_ipv4_group(gid) {
        let o = a.octets();
        return Some(MacAddr([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]));
    }
    (gid[0] == 0xff).then(|| MacAddr([0x33, 0x33, gid[12], gid[13], gid[14], gid[15]]))
}

/// Length of an IGMPv2 frame: Ethernet, IPv4 with the Router Alert option (24 bytes), IGMP (8).
pub const IGMP_FRAME_LEN: usize = eth::HEADER_LEN + 24 + 8;

/// Write an IGMPv2 Membership Report (`join`) or Leave Group for `group` from `src_mac`/`src_ip`
/// into `buf`: IP TTL 1 and the Router Alert option, as RFC 2236 §2 requires; the report goes
/// to the group, the leave to all routers. Returns the frame length.
pub fn emit_igmp_frame(buf: &mut [u8], src_mac: MacAddr, src_ip: Ipv4Addr, group: Ipv4Addr, join: bool) -> Result<usize> {
    if buf.len() < IGMP_FRAME_LEN {
        return Err(Error::Truncated);
    }
    if !group.is_multicast() {
        return Err(Error::BadIpHeader);
    }
    let dst_ip = if join { group } else { ALL_ROUTERS };
    let go = dst_ip.octets();
    let dst_mac = MacAddr([0x01, 0x00, 0x5e, go[1] & 0x7f, go[2], go[3]]);
    eth::Repr { src: src_mac, dst: dst_mac, ethertype: EtherType::IPV4 }.emit(&mut eth::Packet::new_unchecked(&mut buf[..eth::HEADER_LEN]));
    let ip = &mut buf[eth::HEADER_LEN..IGMP_FRAME_LEN];
    ip.fill(0);
    ip[0] = 0x46; // version 4, IHL 6 (the Router Alert option)
    ip[1] = 0xc0; // DSCP CS6 (network control), as Linux sends IGMP
    ip[2..4].copy_from_slice(&32u16.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
    ip[8] = 1; // TTL
    ip[9] = PROTO_IGMP;
    ip[12..16].copy_from_slice(&src_ip.octets());
    ip[16..20].copy_from_slice(&go);
    ip[20..24].copy_from_slice(&[0x94, 0x04, 0x00, 0x00]); // Router Alert (RFC 2113)
    let sum = !(ones_sum(0, &ip[..24]) as u16);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let igmp = &mut ip[24..32];
    igmp[0] = if join { V2_MEMBERSHIP_REPORT } else { LEAVE_GROUP };
    igmp[4..8].copy_from_slice(&group.octets());
    let sum = !(ones_sum(0, igmp) as u16);
    igmp[2..4].copy_from_slice(&sum.to_be_bytes());
    Ok(IGMP_FRAME_LEN)
}

/// If `frame` is an IGMP Membership Query (v1, v2 or v3, untagged IPv4, checksums valid):
/// `Some(None)` for a general query, `Some(Some(group))` for a group-specific one.
pub fn parse_igmp_query(frame: &[u8]) -> Option<Option<Ipv4Addr>> {
    let e = eth::Packet::new_checked(frame).ok()?;
    if e.ethertype() != EtherType::IPV4 {
        return None;
    }
    let ip = &frame[eth::HEADER_LEN..];
    if ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != PROTO_IGMP {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if ihl < 20 || total < ihl + 8 || total > ip.len() || ones_sum(0, &ip[..ihl]) != 0xffff {
        return None;
    }
    let igmp = &ip[ihl..total];
    if igmp[0] != MEMBERSHIP_QUERY || ones_sum(0, igmp) != 0xffff {
        return None;
    }
    let group = Ipv4Addr::new(igmp[4], igmp[5], igmp[6], igmp[7]);
    Some((!group.is_unspecified()).then_some(group))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(a: [u8; 4]) -> [u8; 16] {
        Ipv4Addr::from(a).to_ipv6_mapped().octets()
    }

    #[test]
    fn groups_and_their_macs() {
        assert!(is_multicast_gid(&mapped([239, 1, 2, 3])));
        assert!(is_multicast_gid(&mapped([224, 0, 0, 1])));
        assert!(!is_multicast_gid(&mapped([198, 18, 0, 1])));
        assert!(!is_multicast_gid(&[0; 16]));
        let mut v6 = [0u8; 16];
        v6[0] = 0xff;
        v6[1] = 0x0e;
        v6[12..].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        assert!(is_multicast_gid(&v6));
        // RFC 1112: only the low 23 bits survive (239.129.2.3 and 239.1.2.3 share a MAC).
        assert_eq!(group_mac(&mapped([239, 129, 2, 3])), Some(MacAddr([1, 0, 0x5e, 1, 2, 3])));
        assert_eq!(group_mac(&mapped([239, 1, 2, 3])), Some(MacAddr([1, 0, 0x5e, 1, 2, 3])));
        assert_eq!(group_mac(&v6), Some(MacAddr([0x33, 0x33, 0xde, 0xad, 0xbe, 0xef])));
        assert_eq!(group_mac(&mapped([10, 0, 0, 1])), None);
        // An IPv4-compatible (not mapped) address is not a group.
        let mut compat = [0u8; 16];
        compat[12..].copy_from_slice(&[239, 1, 2, 3]);
        assert!(!is_multicast_gid(&compat));
    }

    #[test]
    fn an_igmp_report_and_leave_are_well_formed() {
        let mut b = [0u8; 64];
        let src = MacAddr([2, 0, 0, 0, 0, 1]);
        let n = emit_igmp_frame(&mut b, src, Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(239, 1, 2, 3), true).unwrap();
        assert_eq!(n, IGMP_FRAME_LEN);
        assert_eq!(&b[..6], &[1, 0, 0x5e, 1, 2, 3]);
        let ip = &b[14..n];
        assert_eq!(ones_sum(0, &ip[..24]), 0xffff, "IP header checksum");
        assert_eq!(ones_sum(0, &ip[24..32]), 0xffff, "IGMP checksum");
        assert_eq!((ip[8], ip[9], ip[24]), (1, PROTO_IGMP, V2_MEMBERSHIP_REPORT));
        assert_eq!(&ip[16..20], &[239, 1, 2, 3]);
        let n = emit_igmp_frame(&mut b, src, Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(239, 1, 2, 3), false).unwrap();
        let ip = &b[14..n];
        assert_eq!(&b[..6], &[1, 0, 0x5e, 0, 0, 2]);
        assert_eq!((&ip[16..20], ip[24], &ip[28..32]), (&[224, 0, 0, 2][..], LEAVE_GROUP, &[239, 1, 2, 3][..]));
        assert!(emit_igmp_frame(&mut b, src, Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(10, 0, 0, 1), true).is_err());
        assert!(emit_igmp_frame(&mut b[..40], src, Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(239, 1, 2, 3), true).is_err());
    }

    /// A query built by hand (as a router sends it): general, group-specific, corrupted.
    #[test]
    fn queries_are_recognised() {
        let mut b = [0u8; 64];
        let n = emit_igmp_frame(&mut b, MacAddr([2, 0, 0, 0, 0, 9]), Ipv4Addr::new(198, 18, 0, 9), Ipv4Addr::new(239, 1, 2, 3), true).unwrap();
        assert_eq!(parse_igmp_query(&b[..n]), None, "a report is not a query");
        let query = |group: [u8; 4]| {
            let mut q = b;
            let ip = &mut q[14..n];
            ip[24] = MEMBERSHIP_QUERY;
            ip[25] = 100;
            ip[28..32].copy_from_slice(&group);
            ip[26..28].fill(0);
            let sum = !(ones_sum(0, &ip[24..32]) as u16);
            ip[26..28].copy_from_slice(&sum.to_be_bytes());
            q
        };
        assert_eq!(parse_igmp_query(&query([0, 0, 0, 0])[..n]), Some(None));
        assert_eq!(parse_igmp_query(&query([239, 1, 2, 3])[..n]), Some(Some(Ipv4Addr::new(239, 1, 2, 3))));
        let mut bad = query([0, 0, 0, 0]);
        bad[14 + 30] ^= 1;
        assert_eq!(parse_igmp_query(&bad[..n]), None, "bad IGMP checksum");
        assert_eq!(parse_igmp_query(&query([0, 0, 0, 0])[..30]), None, "truncated");
    }
}
