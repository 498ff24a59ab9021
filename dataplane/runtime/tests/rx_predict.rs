//! Receive header prediction on a real lcore (`wire::RxPrediction` in `Lcore::on_frame`, the
//! responder's WRITE MIDDLE fast path): the MIDDLE packets of a 64 KiB RDMA WRITE after the
//! first one its QP parsed in full are parsed by prediction, the next message's from its first
//! MIDDLE on; the bytes land, the WRITEs complete. A predicted frame whose payload was
//! corrupted on the wire is dropped for its ICRC, and the retransmission completes the WRITE.
//! On the sending side every MIDDLE packet is built by the requester's transmit fast path.
mod common;

use common::{lock, poll_completion, post_write_64k, rig, Rig};
use pmrxe_port::{PacketBuf, SimBuf};
use pmrxe_runtime::lcore::{Lcore, LcoreHandle};
use pmrxe_transport::sim::{bring_up, PairParams};
use pmrxe_transport::{Instant, PathMtu};
use pmrxe_wire::{build_frame_vec, parse_frame, BthRepr, L3Info, MacAddr, Opcode, Psn, Qpn, TransportHeaders};

/// Post WRITE `wr_id` (as [`post_write_64k`]) and poll until it completes successfully.
fn write_ok(lc: &mut Lcore<common::QueuePort>, h: &LcoreHandle, r: &mut Rig, wr_id: u64, src_off: u64, dst_off: u64, now: &mut u64) {
    post_write_64k(r, wr_id, src_off, dst_off);
    lc.poll_once(Instant(*now));
    let c = poll_completion(lc, h, &mut r.cq_rings[0].1, now);
    assert_eq!((c.wr_id, c.status), (wr_id, 0));
}

/// QP `qpn`'s counters, from the lcore.
fn qp_stats(lc: &mut Lcore<common::QueuePort>, h: &LcoreHandle, now: u64, qpn: u32) -> pmrxe_transport::QpStats {
    let (tx, rx) = crossbeam::channel::bounded(1);
    h.cmds.send(pmrxe_runtime::lcore::Cmd::QpStats { done: tx }).unwrap();
    lc.poll_once(Instant(now));
    rx.recv().unwrap().into_iter().find(|(q, _, _)| *q == qpn).expect("the QP").2
}

#[test]
fn write_middle_packets_are_predicted_and_placed() {
    let common::Pair { mut lc, h, mem, ips, .. } = common::lcore_pair(common::jumbo_buf);
    let p = PairParams { mtu: PathMtu::Mtu4096, access: 0x7, ..PairParams::default() };
    let mut r = rig(&mut lc, &h, &mem, ips, &p, bring_up, None);
    let mut now = 1_000u64;

    write_ok(&mut lc, &h, &mut r, 5, 0, 0, &mut now);
    // FIRST and the first MIDDLE parsed in full (that MIDDLE recorded), 13 MIDDLE predicted,
    // LAST in full.
    assert_eq!(h.stats.snapshot().rx_predicted, 13);
    // The sender built all 14 MIDDLEs by its fast path, the FIRST and LAST by the general one.
    let s = qp_stats(&mut lc, &h, now, 0x11);
    assert_eq!((s.tx_packets, s.tx_fast_path, s.retransmits), (16, 14, 0));

    write_ok(&mut lc, &h, &mut r, 6, 65536, 65536, &mut now);
    // The next message's MIDDLEs match the record from the first one: all 14 predicted.
    assert_eq!(h.stats.snapshot().rx_predicted, 27);
    assert_eq!(qp_stats(&mut lc, &h, now, 0x11).tx_fast_path, 28);
    let mut b = vec![0u8; 3 * 65536];
    r.dst.read(0, &mut b).unwrap();
    assert!(b[..131072].iter().all(|&x| x == 0xab), "both WRITEs' bytes placed");
    assert!(b[131072..].iter().all(|&x| x == 0), "and nothing past them");
    assert_eq!(h.stats.snapshot().rx_icrc_errors, 0);
}

#[test]
fn a_corrupted_predicted_middle_is_dropped_and_retransmitted() {
    let common::Pair { mut lc, h, mem, ips, to_dev1, .. } = common::lcore_pair(common::jumbo_buf);
    let p = PairParams { mtu: PathMtu::Mtu4096, access: 0x7, timeout: 8, ..PairParams::default() };
    let mut r = rig(&mut lc, &h, &mem, ips, &p, bring_up, None);
    let mut now = 1_000u64;
    write_ok(&mut lc, &h, &mut r, 5, 0, 0, &mut now);
    let before = h.stats.snapshot();

    // The second WRITE's 8th packet (a MIDDLE the record predicts) loses a payload bit.
    post_write_64k(&mut r, 6, 0, 65536);
    lc.poll_once(Instant(now));
    {
        let mut wire = lock(&to_dev1);
        assert_eq!(wire.len(), 16, "the WRITE's packets, sent in one pass");
        let f = wire[7].data_mut();
        assert_eq!(parse_frame(f).expect("valid before the flip").headers.bth.opcode, Opcode::RC_RDMA_WRITE_MIDDLE);
        let at = f.len() - 100;
        f[at] ^= 0x10;
    }
    let c = poll_completion(&mut lc, &h, &mut r.cq_rings[0].1, &mut now);
    assert_eq!((c.wr_id, c.status), (6, 0), "the retransmission completed the WRITE");
    let after = h.stats.snapshot();
    assert_eq!(after.rx_icrc_errors - before.rx_icrc_errors, 1, "the corrupted frame dropped for its ICRC");
    assert!(after.rx_predicted - before.rx_predicted >= 14, "the corrupted frame was predicted too");
    let mut b = vec![0u8; 65536];
    r.dst.read(65536, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0xab), "all 64 KiB placed, the corrupted bit not among them");
}

/// A MIDDLE packet too short for the 80 bytes a prediction compares (a few payload bytes over
/// IPv4: the parse accepts it, the responder takes it as a duplicate here) is not recorded,
/// and the lcore goes on: the next 64 KiB WRITE completes, its MIDDLEs predicted.
#[test]
fn a_short_middle_packet_is_not_recorded_and_the_lcore_goes_on() {
    let common::Pair { mut lc, h, mem, ips, to_dev1, .. } = common::lcore_pair(common::jumbo_buf);
    let p = PairParams { mtu: PathMtu::Mtu4096, access: 0x7, ..PairParams::default() };
    let mut r = rig(&mut lc, &h, &mem, ips, &p, bring_up, None);
    let l3 = L3Info {
        src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        src_ip: ips[0],
        dst_ip: ips[1],
        tclass: 0,
        ttl: 64,
        flow_label: 0,
        udp_sport: 0xC000,
        ip_id: 0,
    };
    // PSN behind QP 0x12's expected one (the rig's first PSN is 100): a duplicate.
    let hdr = TransportHeaders::new(BthRepr::new(Opcode::RC_RDMA_WRITE_MIDDLE, Qpn::new(0x12), Psn::new(90)));
    let f = build_frame_vec(&l3, &hdr, &[7; 4]).unwrap();
    assert!(f.len() < 80);
    lock(&to_dev1).push_back(SimBuf::from_slice(&f));
    let mut now = 1_000u64;
    lc.poll_once(Instant(now));
    assert_eq!(h.stats.snapshot().rx_packets, 1, "the frame was received");

    write_ok(&mut lc, &h, &mut r, 5, 0, 0, &mut now);
    assert_eq!(h.stats.snapshot().rx_predicted, 13);
}
