//! Two lcores, QPs spread across them: frames that arrive on the lcore that does not own
//! their QP are handed over (as owned buffers) to the owner's inbox. Each lcore polls its own
//! queue of both ports, like RSS/multi-queue on a real NIC: QP X (owned by lcore 0) sends RDMA
//! WRITEs to QP Y (owned by lcore 1); the requests arrive on lcore 0 and the ACKs on lcore 1,
//! so every packet crosses lcores, and the WRITEs must complete with the bytes placed.
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use crossbeam::channel::bounded;
use pmrxe_abi::ring::{init_ring, Consumer, Producer};
use pmrxe_abi::{send_flags, wr_opcode, ClientPage, CqSegmentLayout, Doorbell, QpSegmentLayout, ShmCqe, ShmRecvWqe, ShmSendWqe, ShmSge, CLIENT_PAGE_LEN};
use pmrxe_mem::{Access, MemLimits, MemTable, Region};
use pmrxe_runtime::lcore::{Cmd, DeviceConfig, Handoff, Lcore, LcoreHandle, QpSetup};
use pmrxe_port::SimPort;
use pmrxe_runtime::neigh::ip_to_gid;
use pmrxe_runtime::shm::Segment;
use pmrxe_transport::sim::{bring_up, PairParams};
use pmrxe_transport::{PathMtu, Qp, QpType};

fn add_cq(h: &LcoreHandle, client: u32, cq: u32) -> (Arc<Segment>, Consumer<ShmCqe>) {
    let layout = CqSegmentLayout::new(1024);
    let seg = Arc::new(Segment::create("cq", layout.total_len as usize).unwrap());
    // SAFETY: fresh segment laid out by `layout`; `seg` outlives the consumer (returned with it).
    let c = unsafe {
        init_ring::<ShmCqe>(seg.as_ptr().add(layout.ring_offset as usize), 1024).unwrap();
        Consumer::<ShmCqe>::attach(seg.as_ptr().add(layout.ring_offset as usize), seg.len() - 64, 1024).unwrap()
    };
    h.call(|tx| Cmd::AddCq { cq, client, seg: seg.clone(), layout, channel: None, done: tx }).unwrap().unwrap();
    (seg, c)
}

#[allow(clippy::too_many_arguments)]
fn add_qp(h: &LcoreHandle, client: u32, dev: u32, qpn: u32, peer: u32, peer_ip: IpAddr, cq: u32, p: &PairParams) -> (Arc<Segment>, Producer<ShmSendWqe>) {
    let mut qp = Qp::new(qpn, QpType::Rc, p.pd, p.caps, None).unwrap();
    bring_up(&mut qp, peer, ip_to_gid(peer_ip), p);
    let layout = QpSegmentLayout::new(256, 256);
    let seg = Arc::new(Segment::create("qp", layout.total_len as usize).unwrap());
    // SAFETY: fresh segment laid out by `layout`; `seg` is returned with the producer.
    let prod = unsafe {
        init_ring::<ShmSendWqe>(seg.as_ptr().add(layout.sq_offset as usize), 256).unwrap();
        init_ring::<ShmRecvWqe>(seg.as_ptr().add(layout.rq_offset as usize), 256).unwrap();
        Producer::<ShmSendWqe>::attach(seg.as_ptr().add(layout.sq_offset as usize), (layout.rq_offset - layout.sq_offset) as usize, 256).unwrap()
    };
    let setup = QpSetup { qp, client, device: dev, seg: seg.clone(), layout, send_cq: cq, recv_cq: cq, db_slot: 0 };
    h.call(|tx| Cmd::AddQp { setup: Box::new(setup), done: tx }).unwrap().unwrap();
    (seg, prod)
}

#[test]
fn frames_for_another_lcores_qp_are_handed_over_and_writes_complete() {
    let ip0: IpAddr = "198.18.0.1".parse().unwrap();
    let ip1: IpAddr = "198.18.0.2".parse().unwrap();
    let (mac0, mac1) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let dev = |i: u32| DeviceConfig { index: i, mac: if i == 0 { mac0 } else { mac1 }, gids: vec![ip_to_gid(if i == 0 { ip0 } else { ip1 })], mtu: 9000, ..Default::default() };
    // Queue q of device 0 is wired to queue q of device 1 (like a ring pair with 2 queues).
    let (a0, b0) = SimPort::pair(9000, 4096);
    let (a1, b1) = SimPort::pair(9000, 4096);
    let mem = Arc::new(MemTable::new(MemLimits::default()));
    let idle = pmrxe_config::IdleConfig { mode: pmrxe_config::IdleMode::Backoff, spin_iterations: 500, max_sleep_us: 50, ..Default::default() };
    let stop = Arc::new(AtomicBool::new(false));
    let neigh = [(ip0, mac0), (ip1, mac1)];
    let (mut l0, h0) = Lcore::new(0, vec![(a0, dev(0)), (b0, dev(1))], mem.clone(), &neigh, idle.clone(), stop.clone(), None);
    let (mut l1, h1) = Lcore::new(1, vec![(a1, dev(0)), (b1, dev(1))], mem.clone(), &neigh, idle, stop.clone(), None);
    let hand = Handoff::new(2, 1024);
    l0.set_handoff(hand.clone());
    l1.set_handoff(hand);
    let t0 = std::thread::spawn(move || l0.run());
    let t1 = std::thread::spawn(move || l1.run());

    // Client 1 (QP X, qpn even → lcore 0) and client 2 (QP Y, qpn odd → lcore 1).
    let pages: Vec<Arc<Segment>> = (0..2).map(|_| Arc::new(Segment::create("page", CLIENT_PAGE_LEN as usize).unwrap())).collect();
    let (e1, _r1) = bounded(16);
    let (e2, _r2) = bounded(16);
    h0.cmds.send(Cmd::AddClient { client: 1, page: pages[0].clone(), events: e1, events_fd: None }).unwrap();
    h1.cmds.send(Cmd::AddClient { client: 2, page: pages[1].clone(), events: e2, events_fd: None }).unwrap();
    let (_cs0, mut cq_x) = add_cq(&h0, 1, 10);
    let (_cs1, _cq_y) = add_cq(&h1, 2, 11);
    let p = PairParams { mtu: PathMtu::Mtu4096, access: 0x7, ..PairParams::default() };
    let (qx, qy) = (0x40u32, 0x41u32);
    let (_sx, mut sq_x) = add_qp(&h0, 1, 0, qx, qy, ip1, 10, &p);
    let (_sy, _sq_y) = add_qp(&h1, 2, 1, qy, qx, ip0, 11, &p);

    let src = Region::zeroed(1 << 20);
    for i in 0..16u8 {
        src.fill(i as usize * 65536, 65536, 0xa0 + i).unwrap();
    }
    let dst = Region::zeroed(1 << 20);
    let lkey = mem.reg_mr(p.pd, src, 0x10_0000, Access::LOCAL_WRITE).unwrap();
    let rkey = mem.reg_mr(p.pd, dst.clone(), 0x20_0000, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    // SAFETY: the page segment holds the ClientPage the lcore reads doorbells from.
    let page = unsafe { &*(pages[0].as_ptr() as *const ClientPage) };
    for i in 0..16u64 {
        let mut w = ShmSendWqe { wr_id: i, opcode: wr_opcode::RDMA_WRITE, send_flags: send_flags::SIGNALED, num_sge: 1, remote_addr: 0x20_0000 + i * 65536, rkey: rkey.0, ..Default::default() };
        w.set_sge(0, ShmSge { addr: 0x10_0000 + i * 65536, length: 65536, lkey: lkey.0 });
        sq_x.push(w).unwrap();
    }
    page.ring(Doorbell { lcore: 0, slot: 0 });
    let mut done = 0;
    let t = StdInstant::now();
    while done < 16 {
        if let Some(c) = cq_x.pop().unwrap() {
            assert_eq!(c.status, 0, "WRITE {} failed with status {}", c.wr_id, c.status);
            done += 1;
        } else {
            assert!(t.elapsed() < Duration::from_secs(20), "only {done}/16 WRITEs completed; lcore0 {:?}; lcore1 {:?}", h0.stats.snapshot(), h1.stats.snapshot());
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stop.store(true, Ordering::Release);
    t0.join().unwrap();
    t1.join().unwrap();
    for i in 0..16usize {
        let mut b = [0u8; 32];
        dst.read(i * 65536 + 65536 - 32, &mut b).unwrap();
        assert_eq!(b, [0xa0 + i as u8; 32], "bytes of WRITE {i} placed");
    }
    let (s0, s1) = (h0.stats.snapshot(), h1.stats.snapshot());
    assert!(s0.handoff_out > 0 && s1.handoff_in > 0, "requests crossed from lcore 0 to lcore 1: {s0:?} {s1:?}");
    assert!(s1.handoff_out > 0 && s0.handoff_in > 0, "ACKs crossed from lcore 1 to lcore 0: {s0:?} {s1:?}");
    assert_eq!(s0.handoff_drops + s1.handoff_drops, 0);
}
