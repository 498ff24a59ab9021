//! The engine's pull of a QP's rung work requests ([`pmrxe_transport::Engine::pull`], the code
//! the production lcore runs on a client's shared rings) under the seeded simulator: WRs beyond
//! the queue depth wait in the ring and are pulled as completions make room, in order, none
//! lost, under loss, duplication and reordering; a malformed entry or a corrupt ring fails the
//! QP; RESET empties the rings.
mod common;
use common::*;
use pmrxe_transport::sim::{Impairments, PairParams};
use pmrxe_transport::{AttrMask, QpAttr, QpCaps, QpState, Queue, WcStatus};

const MSGS: u64 = 24;
const LEN: u32 = 300;

/// Send and receive queues four deep, 24 SENDs rung at A and 24 RECVs at B: both rings hold
/// more than the engine's queues take, so every pull finds a queue full and the rest waits in
/// the ring. Under loss, duplication and reordering every SEND completes, in ring order,
/// with its bytes in the RECV of the same index; nothing is left in the rings.
#[test]
fn wrs_beyond_the_queue_depth_wait_in_the_ring_and_complete_in_order_under_loss() {
    let mut dropped = 0;
    for seed in 0..6 {
        let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, ..PairParams::default().caps };
        let p = PairParams { timeout: 8, retry_cnt: 7, rnr_retry: 7, min_rnr_timer: 1, caps, ..Default::default() };
        let mut sim = pair_with(&p, seed);
        sim.impair = Impairments { drop: 0.05, duplicate: 0.03, reorder: 0.05, reorder_ns: 3000, ..Default::default() };
        let n = MSGS as usize * LEN as usize;
        let src = reg(&sim, A, n, ALL);
        src.write(0, &pattern(n, seed as u8));
        let dst = reg(&sim, B, n, ALL);
        for i in 0..MSGS {
            let off = i * u64::from(LEN);
            sim.nodes[B].ring_recv(QB, recv(100 + i, &dst, off, LEN));
            sim.nodes[A].ring_send(QA, send(i, &src, off, LEN));
        }
        drive(&mut sim);
        dropped += sim.trace.iter().filter(|p| p.fault == pmrxe_transport::sim::Fault::Drop).count();

        assert!(sim.nodes[A].pulled.full && sim.nodes[B].pulled.full, "seed {seed}: no queue was ever full");
        assert_eq!((sim.nodes[A].pulled.moved, sim.nodes[B].pulled.moved), (MSGS as u32, MSGS as u32), "seed {seed}");
        assert_eq!(sim.nodes[A].rings.waiting(QA), (0, 0), "seed {seed}");
        assert_eq!(sim.nodes[B].rings.waiting(QB), (0, 0), "seed {seed}");
        let sc = send_cqes(&mut sim, A, QA);
        assert_eq!(ids(&sc), (0..MSGS).collect::<Vec<_>>(), "seed {seed}: {:?}", statuses(&sc));
        assert!(sc.iter().all(|c| c.status == WcStatus::Success), "seed {seed}: {:?}", statuses(&sc));
        let rc = recv_cqes(&mut sim, B, QB);
        assert_eq!(ids(&rc), (100..100 + MSGS).collect::<Vec<_>>(), "seed {seed}");
        assert!(rc.iter().all(|c| c.status == WcStatus::Success && c.byte_len == LEN), "seed {seed}");
        assert!(dst.read(0, n) == src.read(0, n), "seed {seed}: bytes misplaced");
        assert_eq!(sim.nodes[A].qp(QA).state(), QpState::Rts);
    }
    assert!(dropped > 0, "no seed lost a packet: not a scenario under loss");
}

/// WRs before a malformed entry complete normally; the malformed entry is consumed without a
/// completion (a client that bypassed the shim's checks wrote it), the QP goes to ERROR and
/// the WRs rung after it flush.
#[test]
fn a_malformed_entry_fails_the_qp_and_the_wrs_after_it_flush() {
    let mut sim = pair_with(&PairParams::default(), 3);
    let src = reg(&sim, A, 4096, ALL);
    src.write(0, &pattern(4096, 9));
    let dst = reg(&sim, B, 4096, ALL);
    sim.nodes[A].ring_send(QA, write(0, &src, 0, 1024, dst.addr, dst.rkey()));
    sim.nodes[A].ring_send(QA, write(1, &src, 1024, 1024, dst.addr + 1024, dst.rkey()));
    drive(&mut sim);
    sim.nodes[A].ring_malformed(QA, Queue::Send);
    sim.nodes[A].ring_send(QA, write(3, &src, 2048, 1024, dst.addr + 2048, dst.rkey()));
    drive(&mut sim);

    assert_eq!(sim.nodes[A].pulled.malformed, 1);
    assert_eq!(sim.nodes[A].qp(QA).state(), QpState::Err);
    let sc = send_cqes(&mut sim, A, QA);
    assert_eq!(ids(&sc), [0, 1, 3]);
    assert_eq!(statuses(&sc), [WcStatus::Success, WcStatus::Success, WcStatus::WrFlushErr]);
    assert!(dst.read(0, 2048) == src.read(0, 2048));
    assert!(dst.read(2048, 1024).iter().all(|&b| b == 0), "the WRITE after the malformed entry ran");
    assert_eq!(sim.nodes[A].rings.waiting(QA), (0, 0));
}

/// A corrupt ring fails the QP and is read no further: the WR behind the corrupt entry is
/// never taken (it stays in the ring) and nothing reaches the wire.
#[test]
fn a_corrupt_ring_fails_the_qp_and_is_read_no_further() {
    let mut sim = pair_with(&PairParams::default(), 4);
    let src = reg(&sim, A, 1024, ALL);
    let dst = reg(&sim, B, 1024, ALL);
    sim.nodes[A].ring_corrupt(QA, Queue::Send);
    sim.nodes[A].ring_send(QA, write(0, &src, 0, 1024, dst.addr, dst.rkey()));
    sim.nodes[B].ring_corrupt(QB, Queue::Recv);
    drive(&mut sim);
    assert!(sim.nodes[A].pulled.corrupt >= 1 && sim.nodes[B].pulled.corrupt >= 1);
    assert_eq!(sim.nodes[A].pulled.moved, 0);
    assert_eq!(sim.nodes[A].qp(QA).state(), QpState::Err);
    assert_eq!(sim.nodes[B].qp(QB).state(), QpState::Err);
    assert_eq!(sim.nodes[A].rings.waiting(QA), (2, 0));
    assert!(sim.trace.is_empty(), "a packet left a QP whose ring is corrupt");
    assert!(send_cqes(&mut sim, A, QA).is_empty());
}

/// WRs waiting in a ring behind a full queue are dropped when the QP is reset through the
/// engine (IBTA: a reset QP's queues are empty), as the lcore discards a client's rings.
#[test]
fn reset_empties_the_rings() {
    let caps = QpCaps { max_send_wr: 2, ..PairParams::default().caps };
    let mut sim = pair_with(&PairParams { caps, ..Default::default() }, 5);
    let src = reg(&sim, A, 1024, ALL);
    let dst = reg(&sim, B, 1024, ALL);
    for i in 0..6 {
        sim.nodes[A].ring_send(QA, write(i, &src, 0, 64, dst.addr, dst.rkey()));
    }
    let now = sim.now;
    assert!(sim.nodes[A].pull_rings(now));
    assert!(sim.nodes[A].pulled.full);
    assert_eq!(sim.nodes[A].rings.waiting(QA), (4, 0));
    let to = |s| QpAttr { qp_state: s, ..QpAttr::default() };
    assert_eq!(sim.nodes[A].modify(QA, &to(QpState::Err), AttrMask::STATE), Some(Ok(())));
    assert_eq!(sim.nodes[A].rings.waiting(QA), (4, 0), "ERROR keeps the ring (its WRs flush as they are taken)");
    assert_eq!(sim.nodes[A].modify(QA, &to(QpState::Reset), AttrMask::STATE), Some(Ok(())));
    assert_eq!(sim.nodes[A].rings.waiting(QA), (0, 0));
    assert_eq!(sim.nodes[A].modify(0x999, &to(QpState::Reset), AttrMask::STATE), None);
}
