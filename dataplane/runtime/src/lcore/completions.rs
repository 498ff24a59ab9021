//! Completions: engine CQEs and asynchronous events into the clients' shared CQ rings (one
//! fence per iteration for all CQs written), and completion events for armed CQs.
use super::*;

impl<L: Port> Lcore<L> {
    pub(super) fn deliver_completions(&mut self, _now: Instant) -> bool {
        let (cqs, dirty, clients, stats) = (&mut self.cqs, &mut self.dirty_cqs, &self.clients, &*self.stats);
        let mut any = self.engine.drain_pending(|qp, s| {
            loop {
                let next = s.stash.take().or_else(|| qp.poll_completion());
                let Some((side, c)) = next else { break };
                let ci = if side == CqSide::Send { s.send_cq } else { s.recv_cq };
                let Some(cq) = cqs[ci].as_mut() else { break };
                match cq.ring.stage(convert::cqe(&c)) {
                    Ok(()) => {
                        if side == CqSide::Recv {
                            s.retire_recv();
                        }
                        if !cq.fresh {
                            cq.fresh = true;
                            if dirty.len() < dirty.capacity() {
                                dirty.push(ci);
                            }
                        }
                        bump(&stats.cqes, 1);
                        if c.status == pmrxe_transport::WcStatus::WrFlushErr {
                            bump(&stats.cqes_flushed, 1);
                        }
                    }
                    Err(PushError::Full(_)) | Err(PushError::Corrupt(_)) => {
                        // CQ overflow (IBTA: the CQ is in error and its QPs go to ERROR). The
                        // completion is kept and delivered once the consumer makes room, so
                        // nothing is lost; the application hears IBV_EVENT_CQ_ERR once.
                        s.stash = Some((side, c));
                        bump(&stats.cq_full, 1);
                        if cq.notify().overflow.swap(1, Ordering::AcqRel) == 0 {
                            if let Some(cl) = clients.iter().find(|cl| cl.id == s.client) {
                                cl.post_event(pmrxe_abi::ctrl::AsyncEvent { event_type: 0, element: cq.handle });
                            }
                        }
                        if qp.state() != pmrxe_transport::QpState::Err {
                            fatal(qp);
                        }
                        break;
                    }
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
            // Keep a QP whose completion waits for CQ room on the pending list.
            s.stash.is_some()
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
