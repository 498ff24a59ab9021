//! Completions: the engine's CQEs staged in place into the clients' shared CQ rings as they
//! are produced (one publish per CQ and one fence per iteration for all CQs written), CQ
//! overflow, asynchronous events, and completion events for armed CQs.
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pmrxe_port::Port;
use pmrxe_transport::{Completions, CqSide, Cqe, Delivery, Instant};

use super::{event_code, qp_shared, ClientSlot, CqSlot, Lcore, QpSlot};
use crate::convert;
use crate::shm::Segment;
use crate::stats::{bump, LcoreStats};

/// Where a QP's completions go: its CQs, and the retired count of its own receive ring. (A
/// part of the QP's slot of its own, so a sink can read it while the lcore holds the slot's
/// rings.)
pub(super) struct CqTarget {
    /// The QP's shared segment: its header holds the receive ring's retired count; the Arc
    /// keeps it mapped.
    pub(super) seg: Arc<Segment>,
    /// Index of the send CQ in `Lcore::cqs`.
    pub(super) send: usize,
    /// Index of the receive CQ in `Lcore::cqs`.
    pub(super) recv: usize,
    /// The QP has a receive ring of its own (not an SRQ).
    pub(super) own_rq: bool,
}

/// The lcore's completion sink: each CQE the engine produces is staged straight into its CQ's
/// shared ring (the CQ is marked for the one publish of the iteration); a full CQ refuses it,
/// the QP keeps it, and the engine's `deliver` (called by [`Lcore::deliver_completions`])
/// decides the overflow.
pub(super) struct CqWriter<'a> {
    cqs: &'a mut Vec<Option<CqSlot>>,
    dirty: &'a mut Vec<usize>,
    stats: &'a LcoreStats,
    /// The clients (CQ_ERR and QP events go to them); only the end-of-pass delivery has them.
    clients: &'a [ClientSlot],
}

/// The lcore's CQ stage: its CQs by index (QPs refer to theirs by index: no lookup per
/// completion), the handle → index map (control path only), and the CQs written this
/// iteration, published together at its end ([`Lcore::deliver_completions`]).
pub(super) struct CqSet {
    pub(super) slots: Vec<Option<CqSlot>>,
    pub(super) index: HashMap<u32, usize>,
    /// CQs with staged, unpublished completions (indices; each listed once: `CqSlot::fresh`).
    pub(super) dirty: Vec<usize>,
}

impl CqSet {
    /// Room for the CQs of `qps` QPs.
    pub(super) fn new(qps: usize) -> Self {
        // Every CQ written in one iteration is a send or receive CQ of one of this lcore's
        // QPs: at most two per QP, so the dirty list never refuses one (a CQ left off it would
        // not be published).
        CqSet { slots: Vec::with_capacity(qps), index: HashMap::with_capacity(qps), dirty: Vec::with_capacity(2 * qps) }
    }

    /// The completion sink over these CQs for one step of the pass.
    pub(super) fn writer<'a>(&'a mut self, stats: &'a LcoreStats) -> CqWriter<'a> {
        CqWriter { cqs: &mut self.slots, dirty: &mut self.dirty, stats, clients: &[] }
    }

    /// Publish every CQ written this iteration (one release store each), then one full fence
    /// for all of them, then take each CQ's arm and signal its channel. False if none was
    /// written.
    fn publish(&mut self, stats: &LcoreStats) -> bool {
        if self.dirty.is_empty() {
            return false;
        }
        for &k in &self.dirty {
            let Some(cq) = self.slots[k].as_mut() else { continue };
            if cq.fresh {
                cq.fresh = false;
                cq.ring.publish();
            }
        }
        // The Dekker pair with the shim's `CqNotify::arm`: either we see the arm and signal,
        // or the application's next poll sees these completions; `pmrxe_abi::CqNotify`.
        pmrxe_abi::CqNotify::fence_after_publish();
        for &k in &self.dirty {
            let Some(cq) = self.slots[k].as_ref() else { continue };
            if cq.notify().take_armed() {
                if let Some(ch) = &cq.channel {
                    ch.signal();
                    bump(&stats.cq_events, 1);
                }
            }
        }
        self.dirty.clear();
        true
    }
}

impl Completions<CqTarget> for CqWriter<'_> {
    #[inline]
    fn complete(&mut self, to: &CqTarget, side: CqSide, c: &Cqe) -> bool {
        let ci = if side == CqSide::Send { to.send } else { to.recv };
        // A CQ outlives the QPs that use it (RemoveCq refuses while referenced).
        let Some(cq) = self.cqs.get_mut(ci).and_then(Option::as_mut) else { return true };
        if cq.ring.stage_words(convert::cqe(c).to_words()).is_err() {
            // Full, or a consumer index the client corrupted: either way no room.
            return false;
        }
        if side == CqSide::Recv && to.own_rq {
            // The receive WQE's ring slot is free for the client again.
            let r = &qp_shared(&to.seg).rq_retired;
            r.store(r.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        }
        if !cq.fresh {
            cq.fresh = true;
            if self.dirty.len() < self.dirty.capacity() {
                self.dirty.push(ci);
            }
        }
        bump(&self.stats.cqes, 1);
        if c.status == pmrxe_transport::WcStatus::WrFlushErr {
            bump(&self.stats.cqes_flushed, 1);
        }
        true
    }
}

/// The engine's calls name the QP by its slot.
impl Completions<QpSlot> for CqWriter<'_> {
    #[inline]
    fn complete(&mut self, s: &QpSlot, side: CqSide, c: &Cqe) -> bool {
        Completions::<CqTarget>::complete(self, &s.cq, side, c)
    }
}

impl Delivery<QpSlot> for CqWriter<'_> {
    /// The CQ reports IBV_EVENT_CQ_ERR to its client once (the engine moves the QP to ERROR).
    fn overflow(&mut self, s: &QpSlot, _qpn: u32, side: CqSide) {
        bump(&self.stats.cq_full, 1);
        let ci = if side == CqSide::Send { s.cq.send } else { s.cq.recv };
        if let Some(cq) = self.cqs.get(ci).and_then(Option::as_ref) {
            if cq.notify().overflow.swap(1, Ordering::AcqRel) == 0 {
                if let Some(cl) = self.clients.iter().find(|cl| cl.id == s.client) {
                    cl.post_event(pmrxe_abi::ctrl::AsyncEvent { event_type: 0, element: cq.handle });
                }
            }
        }
    }
    fn event(&mut self, s: &QpSlot, qpn: u32, ev: pmrxe_transport::AsyncEvent) {
        if let Some(c) = self.clients.iter().find(|c| c.id == s.client) {
            let element = match ev {
                pmrxe_transport::AsyncEvent::SrqLimitReached { srqn } => srqn,
                _ => qpn,
            };
            c.post_event(pmrxe_abi::ctrl::AsyncEvent { event_type: event_code(ev), element });
        }
    }
}

impl<L: Port> Lcore<L> {
    /// The end of an iteration's completion work: the engine retries the completions QPs
    /// kept (their CQ was full) and decides overflows (`Engine::deliver`: the CQ reports
    /// IBV_EVENT_CQ_ERR once through [`CqWriter`], the QP goes to ERROR, its completions kept
    /// until the consumer makes room); asynchronous events go to their clients. Then every CQ
    /// written this iteration (here or, mostly, while the engine worked) is published
    /// ([`CqSet::publish`]).
    pub(super) fn deliver_completions(&mut self, _now: Instant) -> bool {
        let mut w = self.cq.writer(&self.stats);
        w.clients = &self.clients;
        let any = self.engine.deliver(&mut w);
        // Most passes wrote no CQ: that costs one load here, not a call.
        if self.cq.dirty.is_empty() {
            return any;
        }
        self.cq.publish(&self.stats) | any
    }
}
