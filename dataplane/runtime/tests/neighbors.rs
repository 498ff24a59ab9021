//! L2/L3: the lcore answers ARP and IPv6 neighbour solicitations for its addresses, ignores
//! ones for other addresses, and learns the senders.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use pmrxe_mem::{MemLimits, MemTable};
use pmrxe_runtime::lcore::{DeviceConfig, Lcore};
use pmrxe_port::{ArrayVec, PacketBuf, Port, SimPort};
use pmrxe_runtime::neigh::ip_to_gid;
use pmrxe_transport::Instant;
use pmrxe_wire::{self as wire, MacAddr};

const OUR_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];

fn setup() -> (Lcore<SimPort>, SimPort) {
    let (ours, peer) = SimPort::pair(1500, 64);
    let v4: IpAddr = "10.1.0.1".parse().unwrap();
    let v6: IpAddr = "fd00::1".parse().unwrap();
    let dev = DeviceConfig { index: 0, mac: OUR_MAC, gids: vec![ip_to_gid(v4), ip_to_gid(v6)], mtu: 1500, ..Default::default() };
    let idle = pmrxe_config::IdleConfig { mode: pmrxe_config::IdleMode::Busy, ..Default::default() };
    let (lc, _h) = Lcore::new(0, vec![(ours, dev)], Arc::new(MemTable::new(MemLimits::default())), &[], idle, Arc::new(AtomicBool::new(false)), None);
    (lc, peer)
}

fn send(peer: &mut SimPort, frame: &[u8]) {
    let mut b = peer.alloc().unwrap();
    b.resize(frame.len().max(60)).unwrap()[..frame.len()].copy_from_slice(frame);
    let mut burst: ArrayVec<_, 1> = ArrayVec::new();
    burst.push(b);
    assert_eq!(peer.tx_burst(&mut burst), 1);
}

fn recv_all(peer: &mut SimPort) -> Vec<Vec<u8>> {
    let mut v: ArrayVec<_, 64> = ArrayVec::new();
    peer.rx_burst(&mut v);
    v.iter().map(|b| b.data().to_vec()).collect()
}

#[test]
fn answers_arp_for_its_address_only() {
    let (mut lc, mut peer) = setup();
    for (target, expect_reply) in [("10.1.0.1", true), ("10.1.0.77", false)] {
        let req = wire::ArpRepr {
            operation: wire::ArpOp::Request,
            source_mac: MacAddr(PEER_MAC),
            source_ip: Ipv4Addr::new(10, 1, 0, 9),
            target_mac: MacAddr([0; 6]),
            target_ip: target.parse().unwrap(),
        };
        let mut f = [0u8; 60];
        wire::arp::emit_arp_frame(&mut f, MacAddr(PEER_MAC), &req).unwrap();
        send(&mut peer, &f);
        lc.poll_once(Instant(1));
        let out = recv_all(&mut peer);
        if !expect_reply {
            assert!(out.is_empty(), "no reply for someone else's address");
            continue;
        }
        assert_eq!(out.len(), 1);
        let (eth, a) = wire::arp::parse_arp_frame(&out[0]).unwrap();
        assert_eq!(a.operation, wire::ArpOp::Reply);
        assert_eq!(a.source_mac, MacAddr(OUR_MAC));
        assert_eq!(a.source_ip, Ipv4Addr::new(10, 1, 0, 1));
        assert_eq!(a.target_mac, MacAddr(PEER_MAC));
        assert_eq!(eth.dst, MacAddr(PEER_MAC));
    }
}

#[test]
fn answers_neighbour_solicitation_for_its_ipv6_address() {
    let (mut lc, mut peer) = setup();
    let ours: Ipv6Addr = "fd00::1".parse().unwrap();
    let theirs: Ipv6Addr = "fd00::9".parse().unwrap();
    let sn = wire::icmpv6::solicited_node(&ours);
    let ns = wire::NdRepr::Solicit { target: ours, src_lladdr: Some(MacAddr(PEER_MAC)) };
    let mut f = [0u8; 128];
    let n = wire::emit_nd_frame(&mut f, MacAddr(PEER_MAC), wire::icmpv6::multicast_mac(&sn), theirs, sn, &ns).unwrap();
    send(&mut peer, &f[..n]);
    lc.poll_once(Instant(1));
    let out = recv_all(&mut peer);
    assert_eq!(out.len(), 1, "one neighbour advertisement");
    let na = wire::parse_nd_frame(&out[0]).unwrap();
    assert_eq!(na.src_ip, ours);
    assert_eq!(na.dst_ip, theirs);
    match na.nd {
        wire::NdRepr::Advert { solicited, target, target_lladdr, .. } => {
            assert!(solicited);
            assert_eq!(target, ours);
            assert_eq!(target_lladdr, Some(MacAddr(OUR_MAC)));
        }
        other => panic!("expected an advertisement, got {other:?}"),
    }
}
