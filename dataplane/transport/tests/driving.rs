//! Seeded scenarios for decisions the engine's one driving surface makes for both the
//! simulator and the production lcore, under loss: a CQ that refuses completions (overflow:
//! CQ_ERR, the QP to ERROR, nothing lost).
mod common;
use common::*;
use pmrxe_transport::sim::{Impairments, PairParams};
use pmrxe_transport::{CqSide, QpState, WcStatus};

const WRS: u64 = 16;
const LEN: u32 = 256;

/// A consumer that stops polling: the send CQ holds 4 completions. Under 10 % loss the
/// requester retransmits; the fifth completion is refused, refused again at the end of the
/// pass, and that is an overflow: reported for the send CQ, the QP goes to ERROR and its
/// outstanding WRs flush behind the refused completion. Once the consumer polls, every WR has
/// exactly one completion, in order (a prefix of successes with their data placed, then
/// flushes): none lost, none duplicated.
#[test]
fn cq_overflow_under_loss_fails_the_qp_and_loses_no_completion() {
    let mut dropped = 0;
    for seed in 0..8 {
        let p = PairParams { timeout: 8, retry_cnt: 7, ..Default::default() };
        let mut sim = pair_with(&p, seed);
        sim.impair = Impairments { drop: 0.1, ..Default::default() };
        let src = reg(&sim, A, WRS as usize * LEN as usize, ALL);
        src.write(0, &pattern(WRS as usize * LEN as usize, seed as u8));
        let dst = reg(&sim, B, WRS as usize * LEN as usize, ALL);
        sim.nodes[A].cq_limit = Some(4);
        for i in 0..WRS {
            let off = i * u64::from(LEN);
            post(&mut sim, A, QA, write(i, &src, off, LEN, dst.addr + off, dst.rkey()));
        }
        drive(&mut sim);
        dropped += sim.trace.iter().filter(|p| p.fault == pmrxe_transport::sim::Fault::Drop).count();

        assert!(!sim.nodes[A].cq_overflows.is_empty(), "seed {seed}: the full CQ was never reported");
        assert!(sim.nodes[A].cq_overflows.iter().all(|&o| o == (QA, CqSide::Send)), "seed {seed}: {:?}", sim.nodes[A].cq_overflows);
        assert_eq!(sim.nodes[A].qp(QA).state(), QpState::Err, "seed {seed}: an overflowed CQ's QP goes on");
        assert_eq!(sim.nodes[A].cqes.len(), 4, "seed {seed}: the CQ took more than its room");

        // The consumer polls: the completions the QP kept arrive, in order.
        let mut all = send_cqes(&mut sim, A, QA);
        sim.nodes[A].cq_limit = None;
        sim.nodes[A].collect();
        all.extend(send_cqes(&mut sim, A, QA));
        assert_eq!(ids(&all), (0..WRS).collect::<Vec<_>>(), "seed {seed}: a completion lost or repeated");
        let ok = all.iter().take_while(|c| c.status == WcStatus::Success).count();
        assert!(ok >= 5, "seed {seed}: the refused completion was a success: {:?}", statuses(&all));
        assert!(all[ok..].iter().all(|c| c.status == WcStatus::WrFlushErr), "seed {seed}: {:?}", statuses(&all));
        // The successful WRITEs' data is in place.
        let n = ok * LEN as usize;
        assert!(dst.read(0, n) == src.read(0, n), "seed {seed}");
    }
    assert!(dropped > 0, "no seed lost a packet: not a scenario under loss");
}

/// The requester lost a packet and must retransmit, and just then its neighbour entry for the
/// peer goes (ARP/ND re-resolving). The engine holds the QP: nothing is built for the unknown
/// MAC (no packet lost to it, none counted sent), the QP stays in RTS; once the neighbour
/// resolves, within the hold, the retransmission goes out and every WRITE completes with its
/// data placed.
#[test]
fn neighbour_hold_during_retransmission_loses_nothing() {
    for seed in 0..4 {
        let p = PairParams { timeout: 8, retry_cnt: 7, ..Default::default() };
        let mut sim = pair_with(&p, seed);
        let len = 8 * 1024;
        let src = reg(&sim, A, len, ALL);
        src.write(0, &pattern(len, seed as u8));
        let dst = reg(&sim, B, len, ALL);
        // The third request packet is lost once: a retransmission is due.
        let mut once = true;
        sim.add_filter(move |p| (p.from == A && p.psn == 102 && std::mem::take(&mut once)).then_some(pmrxe_transport::sim::Fault::Drop));
        post(&mut sim, A, QA, write(1, &src, 0, len as u32, dst.addr, dst.rkey()));
        // Run until the loss has happened, then lose the neighbour.
        assert!(sim.drive_until(STEPS, |s| s.trace.iter().any(|p| p.fault == pmrxe_transport::sim::Fault::Drop)));
        let gid_b = sim.nodes[B].gid();
        sim.nodes[A].set_reachable(gid_b, false);
        let held_at = sim.nodes[A].tx_neigh_holds;
        let sent_before = sim.trace.iter().filter(|p| p.from == A).count();
        // 3 ms unresolved: the retransmission timer (~1 ms) fires, the QP is held (its retry
        // budget, 7 timeouts, outlasts the hold).
        let t = sim.now.add_ns(3 * MS);
        sim.run_until(t, STEPS);
        assert!(sim.nodes[A].tx_neigh_holds > held_at, "seed {seed}: the QP was never held");
        assert_eq!(sim.nodes[A].tx_no_neighbor, 0, "seed {seed}: a packet was built for an unknown MAC within the hold");
        assert_eq!(sim.trace.iter().filter(|p| p.from == A).count(), sent_before, "seed {seed}: sent while unresolved");
        assert_eq!(sim.nodes[A].qp(QA).state(), QpState::Rts, "seed {seed}");
        assert!(send_cqes(&mut sim, A, QA).is_empty(), "seed {seed}: completed while held");
        // The neighbour resolves: the retransmission goes out and the WRITE completes.
        sim.nodes[A].set_reachable(gid_b, true);
        drive(&mut sim);
        let c = send_cqes(&mut sim, A, QA);
        assert_eq!(statuses(&c), vec![WcStatus::Success], "seed {seed}");
        assert!(dst.read(0, len) == src.read(0, len), "seed {seed}");
    }
}

/// UC has no retransmission: a WRITE posted while the neighbour resolves must wait for it (a
/// packet built for the unknown MAC would be lost yet reported sent). Posted under 5 % loss of
/// the other traffic, resolved 1 ms later: the message arrives whole.
#[test]
fn uc_write_waits_for_the_neighbour_instead_of_vanishing() {
    let p = PairParams { qp_type: pmrxe_transport::QpType::Uc, ..Default::default() };
    let mut sim = pair_with(&p, 3);
    let len = 4096;
    let src = reg(&sim, A, len, ALL);
    src.write(0, &pattern(len, 9));
    let dst = reg(&sim, B, len, ALL);
    let gid_b = sim.nodes[B].gid();
    sim.nodes[A].set_reachable(gid_b, false);
    post(&mut sim, A, QA, write(1, &src, 0, len as u32, dst.addr, dst.rkey()));
    let t = sim.now.add_ns(MS);
    sim.run_until(t, STEPS);
    assert!(sim.trace.is_empty(), "sent before the neighbour resolved");
    assert!(send_cqes(&mut sim, A, QA).is_empty(), "a UC WRITE reported sent while held");
    sim.nodes[A].set_reachable(gid_b, true);
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success]);
    assert!(dst.read(0, len) == src.read(0, len), "the UC WRITE was lost");
    assert_eq!(sim.nodes[A].tx_no_neighbor, 0);
}

/// A neighbour that never resolves: the hold ends after `NEIGH_HOLD_NS`, the packets are built
/// and dropped by the port (counted), and the transport's own retry limit ends the WR: a peer
/// that never answers cannot hang it.
#[test]
fn neighbour_never_resolving_ends_in_retry_exceeded() {
    let p = PairParams { timeout: 8, retry_cnt: 2, ..Default::default() };
    let mut sim = pair_with(&p, 5);
    let src = reg(&sim, A, 64, ALL);
    let dst = reg(&sim, B, 64, ALL);
    let gid_b = sim.nodes[B].gid();
    sim.nodes[A].set_reachable(gid_b, false);
    post(&mut sim, A, QA, write(1, &src, 0, 64, dst.addr, dst.rkey()));
    drive(&mut sim);
    assert!(sim.now.0 >= pmrxe_transport::engine::NEIGH_HOLD_NS, "gave up before the hold ran out");
    assert!(sim.nodes[A].tx_no_neighbor > 0, "nothing built after the hold");
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::RetryExcErr]);
}

/// Header prediction across a lost and a corrupted MIDDLE: a 16-packet WRITE whose MIDDLE at
/// PSN 103 arrives corrupted (its ICRC check, which always goes with a predicted packet to
/// the QP, drops it) and whose MIDDLE at PSN 110 is lost, under random reordering and
/// duplication. The receiver predicts its MIDDLEs from the first one (the prediction ignores
/// the PSN, so out-of-sequence MIDDLEs are predicted too and the responder NAKs them); the
/// requester goes back; the data lands whole and exactly once.
#[test]
fn prediction_across_a_lost_and_a_corrupted_middle() {
    for seed in 0..6 {
        let p = PairParams { timeout: 8, retry_cnt: 7, ..Default::default() };
        let mut sim = pair_with(&p, seed);
        sim.impair = Impairments { duplicate: 0.05, reorder: 0.05, reorder_ns: 3000, ..Default::default() };
        let len = 16 * 1024;
        let src = reg(&sim, A, len, ALL);
        src.write(0, &pattern(len, seed as u8 + 1));
        let dst = reg(&sim, B, len, ALL);
        let (mut corrupt_once, mut drop_once) = (true, true);
        sim.add_filter(move |p| {
            if p.from != A {
                return None;
            }
            if p.psn == 103 && std::mem::take(&mut corrupt_once) {
                return Some(pmrxe_transport::sim::Fault::Corrupt);
            }
            (p.psn == 110 && std::mem::take(&mut drop_once)).then_some(pmrxe_transport::sim::Fault::Drop)
        });
        post(&mut sim, A, QA, write(1, &src, 0, len as u32, dst.addr, dst.rkey()));
        drive(&mut sim);
        assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success], "seed {seed}");
        assert!(dst.read(0, len) == src.read(0, len), "seed {seed}: data");
        assert!(sim.nodes[B].engine.rx_predicted >= 10, "seed {seed}: only {} MIDDLEs predicted", sim.nodes[B].engine.rx_predicted);
        assert!(sim.nodes[B].qp(QB).stats().icrc_errors >= 1, "seed {seed}: the corrupted MIDDLE was not caught");
        assert!(sim.nodes[A].qp(QA).stats().retries >= 1, "seed {seed}: nothing was lost");
    }
}
