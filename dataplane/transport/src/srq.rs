//! Shared receive queue: a ring of receive WQEs several QPs draw from, with the limit event
//! (`ibv_modify_srq` with IBV_SRQ_LIMIT arms it; it fires once when the count drops below).

use std::collections::VecDeque;

use crate::qp::PostError;
use crate::wqe::{RecvWqe, MAX_SGE};

/// SRQ attributes (`ibv_srq_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Capacity.
    pub max_wr: u32,
    /// Scatter entries per WQE.
    pub max_sge: u32,
    /// Limit: armed when non-zero; the event fires when fewer WQEs remain.
    pub srq_limit: u32,
}

/// A shared receive queue.
#[derive(Debug)]
pub struct Srq {
    srqn: u32,
    attr: SrqAttr,
    q: VecDeque<RecvWqe>,
    armed: bool,
}

impl Srq {
    /// Create (allocates the ring).
    pub fn new(srqn: u32, attr: SrqAttr) -> Result<Srq, PostError> {
        if attr.max_sge as usize > MAX_SGE {
            return Err(PostError::TooManySge);
        }
        Ok(Srq { srqn, attr: SrqAttr { srq_limit: 0, ..attr }, q: VecDeque::with_capacity(attr.max_wr as usize), armed: false })
    }
    /// SRQ number.
    pub fn srqn(&self) -> u32 {
        self.srqn
    }
    /// `ibv_post_srq_recv`.
    pub fn post_recv(&mut self, w: RecvWqe) -> Result<(), PostError> {
        if self.q.len() >= self.attr.max_wr as usize {
            return Err(PostError::QueueFull);
        }
        if w.num_sge > self.attr.max_sge as usize {
            return Err(PostError::TooManySge);
        }
        self.q.push_back(w);
        Ok(())
    }
    /// `ibv_modify_srq` with IBV_SRQ_LIMIT: arm the limit event (0 disarms).
    pub fn arm_limit(&mut self, limit: u32) {
        self.attr.srq_limit = limit;
        self.armed = limit != 0;
    }
    /// `ibv_modify_srq`: only the limit can change (IBV_SRQ_MAX_WR resize is not supported).
    pub fn modify(&mut self, attr: &SrqAttr) {
        self.arm_limit(attr.srq_limit);
    }
    /// `ibv_query_srq`.
    pub fn query(&self) -> SrqAttr {
        self.attr
    }
    /// WQEs queued.
    pub fn len(&self) -> usize {
        self.q.len()
    }
    /// Empty?
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
    /// Take the next WQE; the flag says the limit event fired (and is now disarmed).
    pub(crate) fn take(&mut self) -> Option<(RecvWqe, bool)> {
        let w = self.q.pop_front()?;
        let fire = self.armed && (self.q.len() as u32) < self.attr.srq_limit;
        if fire {
            self.armed = false;
            self.attr.srq_limit = 0;
        }
        Some((w, fire))
    }
}
