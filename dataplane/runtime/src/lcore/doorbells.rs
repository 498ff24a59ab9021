//! Doorbells: swap each rung doorbell word to 0 and move exactly those QPs' (and SRQs') new
//! WQEs from their shared rings into the engine.
use std::collections::HashMap;

use pmrxe_abi::{ShmRecvWqe, ShmSendWqe};
use pmrxe_port::Port;
use pmrxe_transport::{AddressVector, Engine, Instant, Offer, Pulled, Queue, Srq, WorkSource};

use super::completions::CqSet;
use super::{Lcore, QpSlot, Scratch, SrqSlot, SRQ_SLOT};
use crate::convert;
use crate::stats::{bump, LcoreStats};

/// The lcore's post stage: what turns rung ring entries into engine work. Address handles
/// (UD sends name them), the scratch copies ring entries are read into, the QPs whose
/// doorbell rang this iteration, and the QPs whose rings hold more than the engine's queues
/// took (retried every iteration).
pub(super) struct Posts {
    /// Address handles by (client, handle).
    pub(super) ahs: HashMap<(u32, u32), AddressVector>,
    /// Where ring entries are copied and converted (reused: no per-post clears or moves).
    pub(super) scratch: Box<Scratch>,
    /// Reserved scratch: QPNs whose doorbell rang this iteration.
    work: Vec<u32>,
    /// QPNs with WQEs left in their rings because the engine's queue was full.
    pub(super) backlog: Vec<u32>,
    /// `backlog` membership by engine slot, one bit each: listing a QP stays O(1) however
    /// many QPs a client keeps full.
    listed: Vec<u64>,
}

impl Posts {
    /// Room for `qps` QPs on the doorbell and backlog lists.
    pub(super) fn new(qps: usize) -> Self {
        Posts {
            ahs: HashMap::with_capacity(1024),
            scratch: Box::new(Scratch { shm_send: ShmSendWqe::default(), shm_recv: ShmRecvWqe::default() }),
            work: Vec::with_capacity(qps),
            backlog: Vec::with_capacity(qps),
            listed: vec![0; qps.div_ceil(64)],
        }
    }

    /// Set (`to`) or clear slot `s`'s bit in `listed`; whether it was set.
    fn bit(&mut self, s: usize, to: bool) -> bool {
        let (w, m) = (s / 64, 1u64 << (s % 64));
        let Some(word) = self.listed.get_mut(w) else { return false };
        let was = *word & m != 0;
        if to {
            *word |= m;
        } else {
            *word &= !m;
        }
        was
    }

    /// QP `qpn` (slot `slot`) is gone: off the backlog list.
    pub(super) fn forget(&mut self, qpn: u32, slot: usize) {
        if self.bit(slot, false) {
            self.backlog.retain(|&q| q != qpn);
        }
    }

    /// The rings as the engine's work source.
    pub(super) fn source<'a>(&'a mut self, stats: &'a LcoreStats) -> RingSource<'a> {
        RingSource { ahs: &self.ahs, stats, scratch: &mut self.scratch }
    }

    /// Let the engine pull QP `qpn`'s rings ([`Engine::pull`]; with `now` `None` only the
    /// receive ring, [`Engine::pull_recv`]); a QP whose queue was full goes on the backlog
    /// list (once). Work only when a WQE moved (`moved`): a queue still full is not (an
    /// lcore that counted its retries as work never slept, and held a shared CPU from the
    /// program whose completions would make room).
    pub(super) fn pull(&mut self, engine: &mut Engine<QpSlot>, cqs: &mut CqSet, stats: &LcoreStats, qpn: u32, now: Option<Instant>) -> Pulled {
        let mut src = self.source(stats);
        let mut cq = cqs.writer(stats);
        let p = match now {
            Some(now) => engine.pull(qpn, now, &mut src, &mut cq),
            None => engine.pull_recv(qpn, &mut src, &mut cq),
        };
        if p.full && self.backlog.len() < self.backlog.capacity() && !self.bit(engine.layout().slot(qpn), true) {
            self.backlog.push(qpn);
        }
        if p.malformed != 0 {
            bump(&stats.bad_wqes, u64::from(p.malformed));
        }
        if p.corrupt != 0 {
            bump(&stats.ring_corrupt, u64::from(p.corrupt));
        }
        p
    }

    /// Retry the rings of QPs on the backlog list (completions may have made room); a QP
    /// leaves the list once its rings fit.
    fn pull_backlog(&mut self, engine: &mut Engine<QpSlot>, cqs: &mut CqSet, stats: &LcoreStats, now: Instant) -> bool {
        let mut any = false;
        let mut k = 0;
        while k < self.backlog.len() {
            let qpn = self.backlog[k];
            let p = self.pull(engine, cqs, stats, qpn, Some(now));
            any |= p.moved != 0;
            if p.full {
                k += 1;
            } else {
                self.backlog.swap_remove(k);
                self.bit(engine.layout().slot(qpn), false);
            }
        }
        any
    }
}

impl<L: Port> Lcore<L> {
    pub(super) fn doorbells(&mut self, now: Instant) -> bool {
        self.posts.work.clear();
        let (clients, work, srqs) = (&self.clients, &mut self.posts.work, &mut self.srqs);
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
        for k in 0..self.posts.work.len() {
            let qpn = self.posts.work[k];
            any |= self.posts.pull(&mut self.engine, &mut self.cq, &self.stats, qpn, Some(now)).moved != 0;
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
                    any |= drain_srq(x, srq, &self.stats, &mut self.posts.scratch.shm_recv);
                }
            }
        }
        any
    }

    /// Retry the rings of QPs on the backlog list (completions may have made room).
    pub(super) fn drain_backlog(&mut self, now: Instant) -> bool {
        if self.posts.backlog.is_empty() {
            return false;
        }
        self.posts.pull_backlog(&mut self.engine, &mut self.cq, &self.stats, now)
    }

    // ---- timers, transmit, completions --------------------------------------------------
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

    #[inline]
    fn next_send(&mut self, _qpn: u32, s: &mut QpSlot) -> Offer<Self::Send<'_>> {
        let (ahs, client) = (self.ahs, s.client);
        convert::offer_send(&mut s.sq, &mut self.scratch.shm_send, |h| ahs.get(&(client, h)).copied(), s.is_ud)
    }

    #[inline]
    fn next_recv(&mut self, _qpn: u32, s: &mut QpSlot) -> Offer<Self::Recv<'_>> {
        match s.rq.as_mut() {
            Some(rq) => convert::offer_recv(rq, &mut self.scratch.shm_recv),
            None => Offer::Empty,
        }
    }

    #[inline]
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

    #[inline]
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
