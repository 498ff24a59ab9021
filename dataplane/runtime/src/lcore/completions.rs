//! Completions: the engine's CQEs staged in place into the clients' shared CQ rings as they
//! are produced (one publish per CQ and one fence per iteration for all CQs written), CQ
//! overflow, asynchronous events, and completion events for armed CQs.
use super::*;
use pmrxe_transport::Bound;

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
/// the QP keeps it, and [`Lcore::deliver_completions`] handles the overflow.
pub(super) struct CqWriter<'a> {
    cqs: &'a mut Vec<Option<CqSlot>>,
    dirty: &'a mut Vec<usize>,
    stats: &'a LcoreStats,
    /// The CQ that last refused a completion (`NONE`: none did).
    full: usize,
}

impl<'a> CqWriter<'a> {
    const NONE: usize = usize::MAX;

    pub(super) fn new(cqs: &'a mut Vec<Option<CqSlot>>, dirty: &'a mut Vec<usize>, stats: &'a LcoreStats) -> Self {
        CqWriter { cqs, dirty, stats, full: Self::NONE }
    }

    /// The sink for calls into the QP whose completions go to `to`.
    #[inline]
    pub(super) fn sink<'w>(&'w mut self, to: &'w CqTarget) -> Bound<'w, Self, CqTarget> {
        Bound { out: self, ext: to }
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
            self.full = ci;
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

impl<L: Port> Lcore<L> {
    /// The end of an iteration's completion work. QPs that kept completions (their CQ was
    /// full) retry them; a CQ still full is an overflow: the CQ reports IBV_EVENT_CQ_ERR once
    /// and the QP goes to ERROR (IBTA), its completions kept until the consumer makes room, so
    /// nothing is lost. Asynchronous events go to their clients. Then every CQ written this
    /// iteration (here or, mostly, while the engine worked) is published.
    pub(super) fn deliver_completions(&mut self, _now: Instant) -> bool {
        let (clients, stats) = (&self.clients, &*self.stats);
        let mut w = CqWriter::new(&mut self.cqs, &mut self.dirty_cqs, stats);
        let mut any = self.engine.drain_pending(|qp, s| {
            w.full = CqWriter::NONE;
            let kept = qp.drain_completions(&mut w.sink(&s.cq));
            let ci = w.full;
            if kept && ci != CqWriter::NONE {
                bump(&stats.cq_full, 1);
                if let Some(cq) = w.cqs.get(ci).and_then(Option::as_ref) {
                    if cq.notify().overflow.swap(1, Ordering::AcqRel) == 0 {
                        if let Some(cl) = clients.iter().find(|cl| cl.id == s.client) {
                            cl.post_event(pmrxe_abi::ctrl::AsyncEvent { event_type: 0, element: cq.handle });
                        }
                    }
                }
                if qp.state() != pmrxe_transport::QpState::Err {
                    fatal(qp, &mut w.sink(&s.cq));
                }
            }
            while let Some(ev) = qp.poll_event() {
                if let Some(c) = clients.iter().find(|c| c.id == s.client) {
                    let element = match ev {
                        pmrxe_transport::AsyncEvent::SrqLimitReached { srqn } => srqn,
                        _ => qp.qpn(),
                    };
                    c.post_event(pmrxe_abi::ctrl::AsyncEvent { event_type: event_code(ev), element });
                }
            }
            // Keep a QP whose completions wait for CQ room on the pending list.
            kept
        });
        if self.dirty_cqs.is_empty() {
            return any;
        }
        // Publish every CQ written this iteration (one release store each)...
        for k in 0..self.dirty_cqs.len() {
            let Some(cq) = self.cqs[self.dirty_cqs[k]].as_mut() else { continue };
            if cq.fresh {
                cq.fresh = false;
                cq.ring.publish();
            }
        }
        any = true;
        // ...then one full fence for all of them, then read each `armed`: pairs with the shim's
        // SeqCst store of `armed` before its next poll (Dekker): either we see the arm and
        // signal, or the application's poll sees these completions. Without the fence x86 may
        // let the load pass the store and both sides miss each other (a hang with -e).
        std::sync::atomic::fence(Ordering::SeqCst);
        for k in 0..self.dirty_cqs.len() {
            let Some(cq) = self.cqs[self.dirty_cqs[k]].as_ref() else { continue };
            if cq.notify().armed.load(Ordering::Relaxed) != 0 && cq.notify().armed.swap(0, Ordering::AcqRel) != 0 {
                cq.notify().events.fetch_add(1, Ordering::Release);
                if let Some(ch) = &cq.channel {
                    ch.signal();
                    bump(&self.stats.cq_events, 1);
                }
            }
            let _ = &cq.seg;
        }
        self.dirty_cqs.clear();
        any
    }
}
