//! IGMPv2 on a port (RFC 2236): the lcore told to announce a group sends a Membership Report
//! when the group gets its first QP and a Leave Group when it loses its last; it answers a
//! router's general query, and a group-specific query for one of its groups, with a report;
//! an lcore that only holds the group's members (not announcing) sends nothing.
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use pmrxe_mem::{MemLimits, MemTable};
use pmrxe_port::{ArrayVec, PacketBuf, Port, SimPort};
use pmrxe_runtime::lcore::{Cmd, DeviceConfig, Lcore, LcoreHandle};
use pmrxe_runtime::neigh::ip_to_gid;
use pmrxe_transport::Instant;
use pmrxe_wire::{self as wire, MacAddr};

const OUR_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const ROUTER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];

fn setup() -> (Lcore<SimPort>, LcoreHandle, SimPort) {
    let (ours, peer) = SimPort::pair(1500, 64);
    let v4: IpAddr = "10.1.0.1".parse().unwrap();
    let dev = DeviceConfig { index: 0, mac: OUR_MAC, gids: vec![ip_to_gid(v4)], mtu: 1500, ..Default::default() };
    let idle = pmrxe_config::IdleConfig { mode: pmrxe_config::IdleMode::Busy, ..Default::default() };
    let (lc, h) = Lcore::new(0, vec![(ours, dev)], Arc::new(MemTable::new(MemLimits::default())), &[], idle, Arc::new(AtomicBool::new(false)), None);
    (lc, h, peer)
}

fn group(a: [u8; 4]) -> [u8; 16] {
    Ipv4Addr::from(a).to_ipv6_mapped().octets()
}

/// The IGMP messages the port sent: (type, IP destination, group).
fn igmp_out(peer: &mut SimPort) -> Vec<(u8, Ipv4Addr, Ipv4Addr)> {
    let mut v: ArrayVec<_, 64> = ArrayVec::new();
    peer.rx_burst(&mut v);
    v.iter()
        .map(|b| {
            let f = b.data();
            assert_eq!(&f[6..12], &OUR_MAC, "from the port's MAC");
            assert_eq!(&f[12..14], &[8, 0]);
            let ip = &f[14..];
            assert_eq!((ip[8], ip[9]), (1, wire::mcast::PROTO_IGMP), "TTL 1, IGMP");
            assert_eq!(&ip[12..16], &[10, 1, 0, 1], "from the port's address");
            let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            let o = dst.octets();
            assert_eq!(&f[..6], &[1, 0, 0x5e, o[1] & 0x7f, o[2], o[3]], "to the destination's group MAC");
            (ip[24], dst, Ipv4Addr::new(ip[28], ip[29], ip[30], ip[31]))
        })
        .collect()
}

/// A router's query (general when `asked` is 0.0.0.0), built by turning one of our own
/// reports into a query: IGMP type 0x11, max response time 10 s.
fn query(asked: [u8; 4]) -> Vec<u8> {
    let mut f = [0u8; 64];
    let n = wire::mcast::emit_igmp_frame(&mut f, MacAddr(ROUTER_MAC), Ipv4Addr::new(10, 1, 0, 254), Ipv4Addr::new(224, 0, 0, 1), true).unwrap();
    let igmp = &mut f[14 + 24..n];
    igmp[0] = wire::mcast::MEMBERSHIP_QUERY;
    igmp[1] = 100;
    igmp[4..8].copy_from_slice(&asked);
    igmp[2..4].fill(0);
    let mut sum: u32 = igmp.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    igmp[2..4].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f[..n].to_vec()
}

fn send(peer: &mut SimPort, frame: &[u8]) {
    let mut b = peer.alloc().unwrap();
    b.resize(frame.len().max(60)).unwrap()[..frame.len()].copy_from_slice(frame);
    let mut burst: ArrayVec<_, 1> = ArrayVec::new();
    burst.push(b);
    assert_eq!(peer.tx_burst(&mut burst), 1);
}

#[test]
fn reports_leaves_and_answers_queries() {
    let (mut lc, h, mut peer) = setup();
    let (g1, g2) = (Ipv4Addr::new(239, 1, 2, 3), Ipv4Addr::new(239, 9, 9, 9));
    let set = |h: &LcoreHandle, g: Ipv4Addr, members: Vec<u32>, announce: bool| {
        h.cmds.send(Cmd::McastGroup { device: 0, gid: group(g.octets()), members, announce }).unwrap();
    };
    set(&h, g1, vec![0x20], true);
    lc.poll_once(Instant(1));
    assert_eq!(igmp_out(&mut peer), vec![(wire::mcast::V2_MEMBERSHIP_REPORT, g1, g1)], "a report when the group appears");
    set(&h, g1, vec![0x20, 0x21], true);
    lc.poll_once(Instant(2));
    assert_eq!(igmp_out(&mut peer), vec![], "a second member changes nothing on the wire");
    set(&h, g2, vec![0x22], true);
    lc.poll_once(Instant(3));
    assert_eq!(igmp_out(&mut peer).len(), 1);
    // A general query: a report for each group.
    send(&mut peer, &query([0, 0, 0, 0]));
    lc.poll_once(Instant(4));
    let mut got = igmp_out(&mut peer);
    got.sort();
    assert_eq!(got, vec![(0x16, g1, g1), (0x16, g2, g2)]);
    // A group-specific query: that group's report only; none for a group we do not have.
    send(&mut peer, &query(g2.octets()));
    send(&mut peer, &query([239, 7, 7, 7]));
    lc.poll_once(Instant(5));
    assert_eq!(igmp_out(&mut peer), vec![(0x16, g2, g2)]);
    // A query with a bad checksum is not answered.
    let mut bad = query([0, 0, 0, 0]);
    bad[14 + 24 + 1] ^= 0x40;
    send(&mut peer, &bad);
    lc.poll_once(Instant(6));
    assert_eq!(igmp_out(&mut peer), vec![]);
    // The last member goes: a leave to all routers.
    set(&h, g1, vec![], true);
    lc.poll_once(Instant(7));
    assert_eq!(igmp_out(&mut peer), vec![(wire::mcast::LEAVE_GROUP, wire::mcast::ALL_ROUTERS, g1)]);
    let s = h.stats.snapshot();
    assert_eq!(s.igmp_sent, 6);
}

#[test]
fn an_lcore_that_does_not_announce_stays_silent_but_answers_queries() {
    let (mut lc, h, mut peer) = setup();
    let g = Ipv4Addr::new(239, 1, 2, 3);
    h.cmds.send(Cmd::McastGroup { device: 0, gid: group(g.octets()), members: vec![0x20], announce: false }).unwrap();
    lc.poll_once(Instant(1));
    assert_eq!(igmp_out(&mut peer), vec![]);
    // Whichever lcore receives a query answers it (every lcore holds every group of its ports).
    send(&mut peer, &query([0, 0, 0, 0]));
    lc.poll_once(Instant(2));
    assert_eq!(igmp_out(&mut peer), vec![(0x16, g, g)]);
    // An IPv6 group: delivered, but no IGMP (and no MLD: not implemented).
    let mut v6 = [0u8; 16];
    v6[0] = 0xff;
    v6[1] = 0x0e;
    v6[15] = 1;
    h.cmds.send(Cmd::McastGroup { device: 0, gid: v6, members: vec![0x21], announce: true }).unwrap();
    lc.poll_once(Instant(3));
    assert_eq!(igmp_out(&mut peer), vec![]);
    // A device this lcore does not serve: ignored.
    h.cmds.send(Cmd::McastGroup { device: 7, gid: group(g.octets()), members: vec![0x20], announce: true }).unwrap();
    lc.poll_once(Instant(4));
    assert_eq!(igmp_out(&mut peer), vec![]);
}
