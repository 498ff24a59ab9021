//! Doorbells: swap each rung doorbell word to 0 and move exactly those QPs' (and SRQs') new
//! WQEs from their shared rings into the engine.
use super::*;

impl<L: Port> Lcore<L> {
    pub(super) fn doorbells(&mut self, now: Instant) -> bool {
        self.work.clear();
        let (clients, work, srqs) = (&self.clients, &mut self.work, &mut self.srqs);
        for c in clients {
            c.page().row(self.index).take(|slot| {
                let qpn = c.slots[slot];
                if qpn & SRQ_SLOT != 0 {
                    if let Some(x) = srqs.get_mut(&(qpn & !SRQ_SLOT)) {
                        x.backlog = true;
                    }
                } else if qpn != 0 && work.len() < work.capacity() {
                    work.push(qpn);
                }
            });
        }
        let mut any = false;
        for k in 0..self.work.len() {
            let qpn = self.work[k];
            any |= self.drain_rings(qpn, now);
        }
        any |= self.drain_srqs();
        any
    }

    /// SRQs whose doorbell rang or whose ring had more than fitted.
    pub(super) fn drain_srqs(&mut self) -> bool {
        let mut any = false;
        for (&n, x) in self.srqs.iter_mut() {
            if x.backlog {
                if let Some(srq) = self.engine.srq_mut(n) {
                    any |= drain_srq(x, srq, &self.stats, &mut self.scratch.shm_recv);
                }
            }
        }
        any
    }

    /// Move a QP's new WQEs from its rings into the engine; a QP whose ring holds more than
    /// the engine's queue takes goes on the backlog list, retried every iteration.
    pub(super) fn drain_rings(&mut self, qpn: u32, now: Instant) -> bool {
        let (ahs, stats, backlog, scratch) = (&self.ahs, &*self.stats, &mut self.backlog, &mut *self.scratch);
        let mut cq = CqWriter::new(&mut self.cqs, &mut self.dirty_cqs, stats);
        self.engine
            .with(qpn, |qp, s| {
                let any = drain_qp_rings(qp, s, ahs, stats, scratch, &mut cq, now);
                if s.backlog && !s.backlog_listed && backlog.len() < backlog.capacity() {
                    s.backlog_listed = true;
                    backlog.push(qpn);
                }
                any
            })
            .unwrap_or(false)
    }

    /// Retry the rings of QPs on the backlog list (completions may have made room).
    pub(super) fn drain_backlog(&mut self, now: Instant) -> bool {
        let mut any = false;
        let mut k = 0;
        while k < self.backlog.len() {
            let qpn = self.backlog[k];
            any |= self.drain_rings(qpn, now);
            let still = self.engine.with(qpn, |_, s| {
                s.backlog_listed = s.backlog;
                s.backlog
            });
            if still == Some(true) {
                k += 1;
            } else {
                self.backlog.swap_remove(k);
            }
        }
        any
    }

    // ---- timers, transmit, completions --------------------------------------------------
}

/// Move a QP's new WQEs from its rings into its engine queues (receive first, so a SEND
/// arriving in the same burst finds them).
fn drain_qp_rings(qp: &mut Qp, s: &mut QpSlot, ahs: &HashMap<(u32, u32), AddressVector>, stats: &LcoreStats, scratch: &mut Scratch, cq: &mut CqWriter<'_>, now: Instant) -> bool {
    s.backlog = false;
    // Receive WQEs first so a SEND arriving in the same burst finds them.
    let mut any = drain_rq(qp, s, stats, scratch, cq);
    loop {
        match s.sq.peek_into(&mut scratch.shm_send) {
            Ok(true) => {
                let w = &scratch.shm_send;
                let client = s.client;
                match convert::ShmSendWr::new(w, |h| ahs.get(&(client, h)).copied(), s.is_ud) {
                    Ok(wr) => {
                        if let Err(e) = qp.post_send(now, &wr, &mut cq.sink(&s.cq)) {
                            if e == pmrxe_transport::PostError::QueueFull {
                                s.backlog = true;
                                break; // retry when completions free space
                            }
                            bump(&stats.bad_wqes, 1);
                            fatal(qp, &mut cq.sink(&s.cq));
                        }
                    }
                    Err(_) => {
                        bump(&stats.bad_wqes, 1);
                        fatal(qp, &mut cq.sink(&s.cq));
                    }
                }
                // Work only when a WQE moved: a queue still full is not (an lcore that counted
                // its retries as work never slept, and held a shared CPU from the program whose
                // completions would make room).
                any = true;
                s.sq.advance();
                bump(&stats.sq_wqes, 1);
                if w.send_flags & pmrxe_abi::send_flags::INLINE != 0 {
                    bump(&stats.sq_inline_wqes, 1);
                }
            }
            Ok(false) => break,
            Err(_) => {
                bump(&stats.ring_corrupt, 1);
                fatal(qp, &mut cq.sink(&s.cq));
                break;
            }
        }
    }
    s.sq.release();
    any
}

/// Move a QP's new receive WQEs from its ring into its receive queue (a full queue sets the
/// slot's backlog flag). Also called when a request arrives that needs a receive WQE the queue
/// lacks ([`Lcore::pull_recv_wqes`]).
pub(super) fn drain_rq(qp: &mut Qp, s: &mut QpSlot, stats: &LcoreStats, scratch: &mut Scratch, cq: &mut CqWriter<'_>) -> bool {
    let mut any = false;
    if let Some(rq) = s.rq.as_mut() {
        loop {
            match rq.peek_into(&mut scratch.shm_recv) {
                Ok(true) => {
                    match convert::ShmRecvWr::new(&scratch.shm_recv) {
                        Ok(r) => {
                            if qp.post_recv(&r, &mut cq.sink(&s.cq)).is_err() {
                                s.backlog = true;
                                break; // full: leave it in the ring, retry next iteration
                            }
                        }
                        Err(_) => {
                            bump(&stats.bad_wqes, 1);
                            fatal(qp, &mut cq.sink(&s.cq));
                        }
                    }
                    any = true;
                    rq.advance();
                    bump(&stats.rq_wqes, 1);
                }
                Ok(false) => break,
                Err(_) => {
                    bump(&stats.ring_corrupt, 1);
                    fatal(qp, &mut cq.sink(&s.cq));
                    break;
                }
            }
        }
        rq.release();
    }
    any
}

pub(super) fn drain_srq(x: &mut SrqSlot, srq: &mut Srq, stats: &LcoreStats, scratch: &mut ShmRecvWqe) -> bool {
    x.backlog = false;
    let mut any = false;
    loop {
        match x.ring.peek_into(scratch) {
            Ok(true) => {
                match convert::recv_wqe(scratch) {
                    Ok(r) => {
                        if srq.post_recv(r).is_err() {
                            x.backlog = true;
                            break;
                        }
                    }
                    Err(_) => bump(&stats.bad_wqes, 1),
                }
                any = true;
                x.ring.advance();
                bump(&stats.rq_wqes, 1);
            }
            Ok(false) => break,
            Err(_) => {
                bump(&stats.ring_corrupt, 1);
                break;
            }
        }
    }
    x.ring.release();
    any
}
