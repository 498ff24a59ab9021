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
        assert_eq!(dst.read(0, n), src.read(0, n), "seed {seed}");
    }
    assert!(dropped > 0, "no seed lost a packet: not a scenario under loss");
}
