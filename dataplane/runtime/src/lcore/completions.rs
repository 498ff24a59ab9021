//! Completions: the engine's CQEs staged in place into the clients' shared CQ rings as they
//! are produced (one publish per CQ and one fence per iteration for all CQs written), CQ
//! overflow, asynchronous events, and completion events for armed CQs.
use super::*;

/// Where one QP's completions go: the indices of its CQs in `Lcore::cqs`, and the retired
/// count of its own receive ring (none on an SRQ).
#[derive(Clone, Copy)]
pub(super) struct CqRoute<'a> {
    send: usize,
    recv: usize,
    rq_retired: Option<&'a AtomicU32>,
}

impl<'a> CqRoute<'a> {
    /// The route of the QP whose slot holds these fields (taken field by field, so the caller
    /// may hold the slot's rings mutably meanwhile).
    pub(super) fn new(seg: &'a Segment, send_cq: usize, recv_cq: usize, own_rq: bool) -> Self {
        CqRoute { send: send_cq, recv: recv_cq, rq_retired: own_rq.then(|| &qp_shared(seg).rq_retired) }
    }
    pub(super) fn of(s: &'a QpSlot) -> Self {
        CqRoute::new(&s._seg, s.send_cq, s.recv_cq, s.rq.is_some())
    }
}

/// The lcore's completion sink: each CQE the engine produces is staged straight into its CQ's
/// shared ring (the CQ is marked for the one publish of the iteration); a full CQ refuses it,
/// the QP keeps it, and [`Lcore::deliver_completions`] handles the overflow.
pub(super) struct CqWriter<'a> {
    cqs: &'a mut [Option<CqSlot>],
    dirty: &'a mut Vec<usize>,
    stats: &'a LcoreStats,
    /// The CQ that last refused a completion.
    full: Option<usize>,
}

impl<'a> CqWriter<'a> {
    pub(super) fn new(cqs: &'a mut [Option<CqSlot>], dirty: &'a mut Vec<usize>, stats: &'a LcoreStats) -> Self {
        CqWriter { cqs, dirty, stats, full: None }
    }

    /// The sink for calls into the QP routed by `to`.
    pub(super) fn sink<'w>(&'w mut self, to: CqRoute<'w>) -> QpSink<'w, 'a> {
        QpSink { w: self, to }
    }

    #[inline]
    fn stage(&mut self, to: &CqRoute<'_>, side: CqSide, c: &Cqe) -> bool {
        let ci = if side == CqSide::Send { to.send } else { to.recv };
        // A CQ outlives the QPs that use it (RemoveCq refuses while referenced).
        let Some(cq) = self.cqs.get_mut(ci).and_then(Option::as_mut) else { return true };
        if cq.ring.stage(convert::cqe(c)).is_err() {
            // Full, or a consumer index the client corrupted: either way no room.
            self.full = Some(ci);
            return false;
        }
        if side == CqSide::Recv {
            if let Some(r) = to.rq_retired {
                // The receive WQE's ring slot is free for the client again.
                r.store(r.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
            }
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

impl Completions<QpSlot> for CqWriter<'_> {
    #[inline]
    fn complete(&mut self, s: &QpSlot, side: CqSide, c: &Cqe) -> bool {
        self.stage(&CqRoute::of(s), side, c)
    }
}

/// [`CqWriter`] bound to one QP: the sink its calls take.
pub(super) struct QpSink<'w, 'a> {
    w: &'w mut CqWriter<'a>,
    to: CqRoute<'w>,
}

impl CompletionSink for QpSink<'_, '_> {
    #[inline]
    fn complete(&mut self, side: CqSide, c: &Cqe) -> bool {
        self.w.stage(&self.to, side, c)
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
            w.full = None;
            let kept = qp.drain_completions(&mut w.sink(CqRoute::of(s)));
            if let (true, Some(ci)) = (kept, w.full) {
                bump(&stats.cq_full, 1);
                if let Some(cq) = w.cqs[ci].as_ref() {
                    if cq.notify().overflow.swap(1, Ordering::AcqRel) == 0 {
                        if let Some(cl) = clients.iter().find(|cl| cl.id == s.client) {
                            cl.post_event(pmrxe_abi::ctrl::AsyncEvent { event_type: 0, element: cq.handle });
                        }
                    }
                }
                if qp.state() != pmrxe_transport::QpState::Err {
                    fatal(qp, &mut w.sink(CqRoute::of(s)));
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
