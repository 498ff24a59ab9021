//! A per-lcore container of QPs and SRQs: dispatch of parsed packets by destination QPN, a
//! ready list so `poll_transmit` visits only QPs with work (round-robin, one packet per
//! visit), the earliest timer across QPs, and aggregate statistics.

use std::collections::{BTreeMap, VecDeque};

use crate::cq::{CqSide, Cqe};
use crate::memops::MemOps;
use crate::packet::RxPacket;
use crate::qp::{AsyncEvent, PostError, Qp, Transmit};
use crate::srq::Srq;
use crate::stats::QpStats;
use crate::timers::Instant;
use crate::wqe::{RecvWqe, SendWqe};

/// QPs and SRQs owned by one lcore.
#[derive(Debug, Default)]
pub struct Engine {
    qps: BTreeMap<u32, Qp>,
    srqs: BTreeMap<u32, Srq>,
    ready: VecDeque<u32>,
    /// Packets for a QPN we do not own.
    pub unknown_qpn: u64,
}

impl Engine {
    /// An empty engine.
    pub fn new() -> Self {
        Self::default()
    }
    /// Take ownership of a QP (keyed by its QPN).
    pub fn add_qp(&mut self, qp: Qp) {
        self.qps.insert(qp.qpn(), qp);
    }
    /// Remove a QP.
    pub fn remove_qp(&mut self, qpn: u32) -> Option<Qp> {
        self.ready.retain(|&q| q != qpn);
        self.qps.remove(&qpn)
    }
    /// Take ownership of an SRQ.
    pub fn add_srq(&mut self, srq: Srq) {
        self.srqs.insert(srq.srqn(), srq);
    }
    /// A QP.
    pub fn qp(&self, qpn: u32) -> Option<&Qp> {
        self.qps.get(&qpn)
    }
    /// A QP, mutably (after changing it call [`Engine::kick`]).
    pub fn qp_mut(&mut self, qpn: u32) -> Option<&mut Qp> {
        self.qps.get_mut(&qpn)
    }
    /// An SRQ, mutably.
    pub fn srq_mut(&mut self, srqn: u32) -> Option<&mut Srq> {
        self.srqs.get_mut(&srqn)
    }
    /// All QPNs.
    pub fn qpns(&self) -> impl Iterator<Item = u32> + '_ {
        self.qps.keys().copied()
    }
    /// Put `qpn` on the ready list if it has something to send.
    pub fn kick(&mut self, qpn: u32) {
        if self.qps.get(&qpn).is_some_and(Qp::wants_transmit) && !self.ready.contains(&qpn) {
            self.ready.push_back(qpn);
        }
    }
    /// Post a send WR to `qpn`.
    pub fn post_send(&mut self, qpn: u32, now: Instant, wqe: SendWqe) -> Result<(), PostError> {
        self.qps.get_mut(&qpn).ok_or(PostError::InvalidState)?.post_send(now, wqe)?;
        self.kick(qpn);
        Ok(())
    }
    /// Post a receive WR to `qpn`.
    pub fn post_recv(&mut self, qpn: u32, wqe: RecvWqe) -> Result<(), PostError> {
        self.qps.get_mut(&qpn).ok_or(PostError::InvalidState)?.post_recv(wqe)
    }
    /// Dispatch a parsed packet by its destination QPN.
    pub fn handle_packet<M: MemOps + ?Sized>(&mut self, now: Instant, pkt: &RxPacket<'_>, mem: &M) {
        let qpn = pkt.hdr.bth.dest_qp.value();
        let Some(qp) = self.qps.get_mut(&qpn) else {
            self.unknown_qpn += 1;
            return;
        };
        let srq = qp.srq().and_then(|n| self.srqs.get_mut(&n));
        qp.handle_packet(now, pkt, mem, srq);
        self.kick(qpn);
    }
    /// A CNP for `qpn` arrived (reaction point; see [`Qp::handle_cnp`]).
    pub fn handle_cnp(&mut self, now: Instant, qpn: u32) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            self.unknown_qpn += 1;
            return;
        };
        qp.handle_cnp(now);
        self.kick(qpn);
    }
    /// Service expired timers of every QP.
    pub fn handle_timeout<M: MemOps + ?Sized>(&mut self, now: Instant, mem: &M) {
        let due: Vec<u32> = self.qps.iter().filter(|(_, q)| q.poll_timeout().is_some_and(|t| t <= now)).map(|(&n, _)| n).collect();
        for n in due {
            if let Some(q) = self.qps.get_mut(&n) {
                q.handle_timeout(now, mem);
            }
            self.kick(n);
        }
    }
    /// Next packet from any ready QP (round-robin).
    pub fn poll_transmit<M: MemOps + ?Sized>(&mut self, now: Instant, mem: &M, buf: &mut [u8]) -> Option<Transmit> {
        while let Some(qpn) = self.ready.pop_front() {
            let Some(qp) = self.qps.get_mut(&qpn) else { continue };
            if let Some(t) = qp.poll_transmit(now, mem, buf) {
                if qp.wants_transmit() {
                    self.ready.push_back(qpn);
                }
                return Some(t);
            }
        }
        None
    }
    /// Earliest timer across QPs.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.qps.values().filter_map(Qp::poll_timeout).min()
    }
    /// Next completion of any QP.
    pub fn poll_completion(&mut self) -> Option<(u32, CqSide, Cqe)> {
        self.qps.iter_mut().find_map(|(&n, q)| q.poll_completion().map(|(s, c)| (n, s, c)))
    }
    /// Next async event of any QP.
    pub fn poll_event(&mut self) -> Option<(u32, AsyncEvent)> {
        self.qps.iter_mut().find_map(|(&n, q)| q.poll_event().map(|e| (n, e)))
    }
    /// Is any QP ready to send?
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }
    /// Sum of all QP counters.
    pub fn stats(&self) -> QpStats {
        let mut s = QpStats::default();
        for q in self.qps.values() {
            s.add(q.stats());
        }
        s
    }
}
