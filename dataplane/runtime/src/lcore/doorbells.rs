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

    /// Move a QP's new WQEs from its rings into the engine ([`Engine::pull`]: receive
    /// first, a full queue leaves the rest in the ring); a QP whose ring holds more than the
    /// engine's queue takes goes on the backlog list, retried every iteration.
    pub(super) fn drain_rings(&mut self, qpn: u32, now: Instant) -> bool {
        let mut src = RingSource { ahs: &self.ahs, stats: &self.stats, scratch: &mut self.scratch };
        let mut cq = CqWriter::new(&mut self.cqs, &mut self.dirty_cqs, &self.stats);
        let p = self.engine.pull(qpn, now, &mut src, &mut cq);
        if p.full {
            list_backlog(&mut self.backlog, qpn);
        }
        note_pull(&self.stats, p)
    }

    /// Retry the rings of QPs on the backlog list (completions may have made room).
    pub(super) fn drain_backlog(&mut self, now: Instant) -> bool {
        let mut any = false;
        let mut k = 0;
        while k < self.backlog.len() {
            let qpn = self.backlog[k];
            let mut src = RingSource { ahs: &self.ahs, stats: &self.stats, scratch: &mut self.scratch };
            let mut cq = CqWriter::new(&mut self.cqs, &mut self.dirty_cqs, &self.stats);
            let p = self.engine.pull(qpn, now, &mut src, &mut cq);
            any |= note_pull(&self.stats, p);
            if p.full {
                k += 1;
            } else {
                self.backlog.swap_remove(k);
            }
        }
        any
    }

    // ---- timers, transmit, completions --------------------------------------------------
}

/// Count what a pull did; true if it was work: a WQE moved (a queue still full is not: an
/// lcore that counted its retries as work never slept, and held a shared CPU from the
/// program whose completions would make room).
pub(super) fn note_pull(stats: &LcoreStats, p: Pulled) -> bool {
    if p.malformed != 0 {
        bump(&stats.bad_wqes, u64::from(p.malformed));
    }
    if p.corrupt != 0 {
        bump(&stats.ring_corrupt, u64::from(p.corrupt));
    }
    p.moved != 0
}

/// Put a QP whose queue was full on the backlog list (once; the list never grows past its
/// reserved capacity).
pub(super) fn list_backlog(backlog: &mut Vec<u32>, qpn: u32) {
    if backlog.len() < backlog.capacity() && !backlog.contains(&qpn) {
        backlog.push(qpn);
    }
}

/// A QP's shared rings as the engine's [`WorkSource`]: each WQE is read once into the
/// lcore's scratch copy (a client can rewrite its ring at any time) and converted there;
/// `consume` advances the ring and counts it, `finish` publishes the consumer index.
pub(super) struct RingSource<'a> {
    pub(super) ahs: &'a HashMap<(u32, u32), AddressVector>,
    pub(super) stats: &'a LcoreStats,
    pub(super) scratch: &'a mut Scratch,
}

impl WorkSource<QpSlot> for RingSource<'_> {
    type Send<'b>
        = convert::ShmSendWr<'b>
    where
        Self: 'b;
    type Recv<'b>
        = convert::ShmRecvWr<'b>
    where
        Self: 'b;

    fn next_send(&mut self, _qpn: u32, s: &mut QpSlot) -> Offer<Self::Send<'_>> {
        match s.sq.peek_into(&mut self.scratch.shm_send) {
            Ok(true) => {
                let (ahs, client) = (self.ahs, s.client);
                match convert::ShmSendWr::new(&self.scratch.shm_send, |h| ahs.get(&(client, h)).copied(), s.is_ud) {
                    Ok(wr) => Offer::Wr(wr),
                    Err(_) => Offer::Malformed,
                }
            }
            Ok(false) => Offer::Empty,
            Err(_) => Offer::Corrupt,
        }
    }

    fn next_recv(&mut self, _qpn: u32, s: &mut QpSlot) -> Offer<Self::Recv<'_>> {
        let Some(rq) = s.rq.as_mut() else { return Offer::Empty };
        match rq.peek_into(&mut self.scratch.shm_recv) {
            Ok(true) => match convert::ShmRecvWr::new(&self.scratch.shm_recv) {
                Ok(wr) => Offer::Wr(wr),
                Err(_) => Offer::Malformed,
            },
            Ok(false) => Offer::Empty,
            Err(_) => Offer::Corrupt,
        }
    }

    fn consume(&mut self, _qpn: u32, s: &mut QpSlot, queue: Queue) {
        match queue {
            Queue::Send => {
                s.sq.advance();
                bump(&self.stats.sq_wqes, 1);
                if self.scratch.shm_send.send_flags & pmrxe_abi::send_flags::INLINE != 0 {
                    bump(&self.stats.sq_inline_wqes, 1);
                }
            }
            Queue::Recv => {
                if let Some(rq) = s.rq.as_mut() {
                    rq.advance();
                    bump(&self.stats.rq_wqes, 1);
                }
            }
        }
    }

    fn finish(&mut self, _qpn: u32, s: &mut QpSlot, queue: Queue) {
        match queue {
            Queue::Send => s.sq.release(),
            Queue::Recv => {
                if let Some(rq) = s.rq.as_mut() {
                    rq.release();
                }
            }
        }
    }

    fn reset(&mut self, _qpn: u32, s: &mut QpSlot) {
        s.reset_rings();
    }
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
