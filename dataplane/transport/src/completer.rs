//! Completer: turns ACKs, NAKs, READ responses and atomic ACKs into WQE completions (in SQ
//! order, through `Qp::retire`) and decides retries.
//!
//! * ACKs are cumulative (IBA 9.7.5.1): an ACK for PSN p completes every SEND/WRITE whose last
//!   PSN ≤ p. An ACK covering an outstanding READ/ATOMIC means its response was lost: the
//!   "implicit NAK" → go-back-N from the READ's first missing PSN.
//! * A PSN sequence NAK (0x60) acknowledges everything before its PSN and starts go-back-N
//!   from it, once per retry (further NAKs are ignored until forward progress).
//! * RNR NAK: wait the delay of its 5-bit code (IBA RNR table), then go-back-N; `rnr_retry`
//!   7 is infinite. The retransmit timer is stopped while waiting (rxe problem 6).
//! * NAK 0x61/0x62/0x63 → REM_INV_REQ_ERR / REM_ACCESS_ERR / REM_OP_ERR for the WQE holding the
//!   PSN; the QP goes to ERR once it reaches the head (§4.2).
//! * Local ACK timeout 4.096 µs × 2^timeout (0 = off); `retry_cnt` 7 means 7 retries.
//!   Back-off: each consecutive timeout without forward progress doubles the period of the
//!   next one, up to 2^[`MAX_BACKOFF_SHIFT`] × (and never past the 5-bit encoding's largest
//!   period); forward progress resets it. The retry count is unchanged by it: RETRY_EXC_ERR
//!   still comes on the `retry_cnt + 1`-th timeout.
//!   While in back-off the requester keeps at most [`BACKOFF_WINDOW_PSNS`] PSNs outstanding
//!   (the probe's last packet asks for an ACK); the ACK ends the back-off and reopens the
//!   full window, so a timeout resends one probe, not the whole window, per period.
//! * Go-back-N restarts are bounded to one per round trip: after a restart from PSN p, further
//!   sequence NAKs, implicit NAKs and out-of-order READ responses do not restart again until
//!   p is acknowledged (that ACK is the restart's round trip); only the timer can.
//! * READ responses are placed in PSN order straight into the local SGEs; an out-of-order
//!   response starts a retry from the first missing PSN with a smaller request (D5).

use pmrxe_wire::{IcrcCheck, MsgPos, NakCode, OpKind, Psn, Syndrome, TransportHeaders};

use crate::cq::{CompletionSink, WcStatus};
use crate::memops::MemOps;
use crate::attr::{QpAttr, QpState};
use crate::qp::Qp;
use crate::requester::MAX_UNACKED_PSNS;
use crate::timers::{local_ack_timeout_ns, rnr_delay_ns, Instant, RetryLimit, Timer};
use crate::wqe::SendOp;

/// Completer state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CompState {
    /// Oldest unacknowledged PSN.
    psn: Psn,
    /// Transport retries left.
    retry: RetryLimit,
    /// RNR retries left.
    rnr: RetryLimit,
    /// A go-back-N is in progress; sequence NAKs don't start another until progress.
    started_retry: bool,
    /// PSN to resume from when the RNR timer fires.
    rnr_psn: Psn,
    /// Consecutive local ACK timeouts without forward progress (the back-off shift, capped
    /// at [`MAX_BACKOFF_SHIFT`]).
    backoff: u8,
    /// When the first of those timeouts fired (time in back-off is counted from here).
    backoff_since: Option<Instant>,
}

/// Largest back-off of the retransmission timer: 2^2 = 4 × the QP's local ACK timeout — the
/// top of the range IBA lets the actual timer take for a given Local ACK Timeout (computed
/// value to four times it), so a backed-off QP still times out as the spec allows.
pub const MAX_BACKOFF_SHIFT: u8 = 2;

/// Outstanding PSNs while in back-off (after a timeout, until forward progress): the
/// go-back-N resends one probe of this many packets, not the whole window, and the rest
/// follows the ACK.
pub const BACKOFF_WINDOW_PSNS: i32 = 16;

impl Default for CompState {
    fn default() -> Self {
        CompState {
            psn: Psn::new(0),
            retry: RetryLimit::transport(7),
            rnr: RetryLimit::rnr(7),
            started_retry: false,
            rnr_psn: Psn::new(0),
            backoff: 0,
            backoff_since: None,
        }
    }
}

/// What the other roles may ask of the completer's state; only this module writes its fields.
impl CompState {
    pub(crate) fn reset_psn(&mut self, p: Psn) {
        self.psn = p;
    }
    /// Oldest unacknowledged PSN.
    pub(crate) fn psn(&self) -> Psn {
        self.psn
    }
    /// Unreliable service (requester): everything before `p` is complete once handed to the
    /// wire.
    pub(crate) fn acknowledged_to(&mut self, p: Psn) {
        self.psn = p;
    }
    pub(crate) fn reset_retry(&mut self, a: &QpAttr) {
        self.retry = RetryLimit::transport(a.retry_cnt);
        self.rnr = RetryLimit::rnr(a.rnr_retry);
    }
}

enum AckOutcome {
    /// Completed WQEs / advanced.
    Progress(bool),
    /// An earlier READ/ATOMIC lost its response: retry from this PSN.
    ImplicitNak(Psn),
}

impl Qp {
    fn outstanding(&self) -> bool {
        self.comp.psn.distance(self.req.next_psn()) < 0
    }

    /// Restart (or stop) the retransmit timer after forward progress (which ends a back-off).
    fn on_progress(&mut self, now: Instant) {
        self.comp.reset_retry(&self.attr);
        self.comp.started_retry = false;
        self.end_backoff(now);
        self.rearm_retransmit(now);
    }

    /// Forward progress or failure: the timer is back at its nominal period.
    fn end_backoff(&mut self, now: Instant) {
        self.comp.backoff = 0;
        if let Some(since) = self.comp.backoff_since.take() {
            self.stats.backoff_ns += now.since(since);
        }
    }

    /// PSNs the requester may have outstanding: [`MAX_UNACKED_PSNS`], or
    /// [`BACKOFF_WINDOW_PSNS`] in back-off.
    pub(crate) fn unacked_window(&self) -> i32 {
        if self.comp.backoff > 0 {
            BACKOFF_WINDOW_PSNS
        } else {
            MAX_UNACKED_PSNS
        }
    }

    /// The current retransmission period: the local ACK timeout, doubled per consecutive
    /// timeout (capped; never past the 5-bit encoding's 4.096 µs × 2^31). `None`: timer off.
    pub(crate) fn retransmit_period_ns(&self) -> Option<u64> {
        let t = self.attr.timeout;
        local_ack_timeout_ns(t).and_then(|_| local_ack_timeout_ns(t.saturating_add(self.comp.backoff).min(31)))
    }

    fn rearm_retransmit(&mut self, now: Instant) {
        match self.retransmit_period_ns() {
            Some(t) if self.outstanding() && self.timers.get(Timer::RnrWait).is_none() => {
                self.timers.set(Timer::Retransmit, now.add_ns(t))
            }
            _ => self.timers.stop(Timer::Retransmit),
        }
    }

    /// Cumulative acknowledgement of every PSN ≤ `p`.
    fn ack_through(&mut self, p: Psn) -> AckOutcome {
        let mut progress = false;
        let mut idx = self.sq.head();
        while idx < self.sq_end() {
            // By reference: an ACK copies no SQ entries (about a hundred bytes each).
            let e = self.entry(idx);
            if e.done.is_some() {
                idx += 1;
                continue;
            }
            if !e.started {
                break;
            }
            if e.last_psn().distance(p) > 0 {
                // Not covered. Partial SEND/WRITE coverage still advances comp.psn below.
                break;
            }
            if e.op.is_rd_atomic() {
                return AckOutcome::ImplicitNak(e.first_psn.wrapping_add(e.rcvd));
            }
            self.finish_wqe(idx, WcStatus::Success);
            progress = true;
            idx += 1;
        }
        let next = p.wrapping_add(1);
        if next.distance(self.comp.psn) > 0 && next.distance(self.req.max_sent()) <= 0 {
            // Never move past a READ that still misses responses (none can when no READ or
            // atomic holds a credit: skip the walk).
            let limit = (self.sq.head()..self.sq_end())
                .take_while(|_| self.req.rd_atomic_outstanding())
                .map(|i| self.entry(i))
                .find(|e| e.started && e.done.is_none() && e.op.is_rd_atomic())
                .map(|e| e.first_psn.wrapping_add(e.rcvd));
            let target = match limit {
                Some(l) if next.distance(l) > 0 => l,
                _ => next,
            };
            if target.distance(self.comp.psn) > 0 {
                self.comp.psn = target;
                progress = true;
            }
        }
        AckOutcome::Progress(progress)
    }

    /// Index of the started, unfinished WQE holding PSN `p`.
    fn wqe_with_psn(&self, p: Psn) -> Option<u64> {
        (self.sq.head()..self.sq_end()).find(|&i| {
            let e = self.entry(i);
            e.done.is_none() && e.contains_psn(p)
        })
    }

    /// Go-back-N: rewind the network cursor to the WQE holding `p` (or the first unfinished
    /// started WQE after it). Local ops below the execution cursor are skipped on the way.
    pub(crate) fn retry_from(&mut self, now: Instant, p: Psn) {
        let Some(idx) = (self.sq.head()..self.sq_end()).find(|&i| {
            let e = self.entry(i);
            e.started && e.done.is_none() && e.last_psn().distance(p) >= 0
        }) else {
            return;
        };
        for j in idx..self.sq_end() {
            let e = self.entry_mut(j);
            if !e.started || e.done.is_some() {
                continue;
            }
            if j == idx {
                let k = p.distance(e.first_psn).max(0) as u32;
                match e.op {
                    SendOp::Read => {
                        e.tx_pkt = e.rcvd;
                        e.read_req_out = false;
                    }
                    _ => e.tx_pkt = k.min(e.npsn),
                }
            } else {
                e.tx_pkt = e.rcvd;
                e.read_req_out = false;
            }
        }
        self.req.rewind_to(idx);
        self.stats.retries += 1;
        self.comp.started_retry = true;
        self.rearm_retransmit(now);
    }

    fn fail_at<C: CompletionSink + ?Sized>(&mut self, p: Psn, st: WcStatus, cq: &mut C) {
        let idx = self.wqe_with_psn(p).or_else(|| {
            (self.sq.head()..self.sq_end()).find(|&i| {
                let e = self.entry(i);
                e.started && e.done.is_none()
            })
        });
        if let Some(i) = idx {
            self.finish_wqe(i, st);
        }
        self.timers.stop(Timer::Retransmit);
        self.retire(cq);
    }

    /// Sequence-error style retry (NAK 0x60, implicit NAK, out-of-order READ response).
    fn retry_or_fail<C: CompletionSink + ?Sized>(&mut self, now: Instant, p: Psn, cq: &mut C) {
        if self.comp.retry.take() {
            self.retry_from(now, p);
        } else {
            self.stats.retry_exceeded += 1;
            self.fail_at(p, WcStatus::RetryExcErr, cq);
        }
    }

    /// Local ACK timer fired.
    pub(crate) fn on_retransmit_timeout<C: CompletionSink + ?Sized>(&mut self, now: Instant, cq: &mut C) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || !self.outstanding() {
            return;
        }
        self.stats.timeouts += 1;
        let p = self.comp.psn;
        if self.comp.retry.take() {
            // Back off: the next timeout comes twice as late (up to the cap).
            self.comp.backoff = (self.comp.backoff + 1).min(MAX_BACKOFF_SHIFT);
            self.comp.backoff_since.get_or_insert(now);
            self.retry_from(now, p);
            if let Some(t) = self.retransmit_period_ns() {
                self.timers.set(Timer::Retransmit, now.add_ns(t));
            }
        } else {
            self.stats.retry_exceeded += 1;
            self.end_backoff(now);
            self.fail_at(p, WcStatus::RetryExcErr, cq);
        }
    }

    /// RNR wait is over: resend from the NAKed PSN.
    pub(crate) fn on_rnr_timer(&mut self, now: Instant) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        let p = self.comp.rnr_psn;
        self.retry_from(now, p);
    }

    /// A response packet (ACK/NAK, atomic ACK, READ response) for our requester. `deferred`:
    /// an ICRC check still to make (only for READ response MIDDLE, see
    /// `may_place_before_icrc`); returns false if it failed (the packet then had no effect).
    pub(crate) fn on_response<M: MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, now: Instant, hdr: &TransportHeaders, payload: &[u8], mem: &M, deferred: Option<IcrcCheck>, cq: &mut C) -> bool {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            self.stats.dropped += 1;
            return true;
        }
        let Some(info) = hdr.bth.opcode.info() else { return true };
        let p = hdr.bth.psn;
        // A response must be for a PSN we sent: [comp.psn - 2^23, max_sent).
        if p.distance(self.req.max_sent()) >= 0 {
            self.stats.dropped += 1;
            return true;
        }
        if let OpKind::ReadResponse = info.kind {
            return self.on_read_response(now, hdr, payload, mem, deferred, cq);
        }
        debug_assert!(deferred.is_none(), "only READ responses are checked while placed");
        match info.kind {
            OpKind::Ack => {
                let Some(aeth) = hdr.aeth else { return true };
                match aeth.syndrome {
                    Syndrome::Ack { .. } => {
                        self.stats.acks_received += 1;
                        self.process_ack(now, p, cq);
                    }
                    Syndrome::RnrNak { timer } => {
                        self.stats.rnr_naks_received += 1;
                        if p.distance(self.comp.psn) < 0 {
                            return true;
                        }
                        self.process_ack(now, p.wrapping_sub(1), cq);
                        if self.state == QpState::Err {
                            return true;
                        }
                        if self.comp.rnr.take() {
                            self.comp.rnr_psn = p;
                            self.timers.stop(Timer::Retransmit);
                            self.timers.set(Timer::RnrWait, now.add_ns(rnr_delay_ns(timer)));
                        } else {
                            self.stats.rnr_retry_exceeded += 1;
                            self.fail_at(p, WcStatus::RnrRetryExcErr, cq);
                        }
                    }
                    Syndrome::Nak(code) => {
                        if p.distance(self.comp.psn) < 0 {
                            self.stats.dropped += 1;
                            return true;
                        }
                        let progress = matches!(self.ack_through_and_apply(now, p.wrapping_sub(1), cq), Some(true));
                        if self.state == QpState::Err {
                            return true;
                        }
                        match code {
                            NakCode::PsnSeqErr => {
                                self.stats.seq_naks_received += 1;
                                if self.comp.started_retry && !progress {
                                    return true;
                                }
                                self.retry_or_fail(now, p, cq);
                            }
                            other => {
                                self.stats.err_naks_received += 1;
                                let st = match other {
                                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                                    NakCode::RemoteAccess => WcStatus::RemAccessErr,
                                    _ => WcStatus::RemOpErr,
                                };
                                self.fail_at(p, st, cq);
                            }
                        }
                    }
                    Syndrome::Reserved(_) => self.stats.dropped += 1,
                }
            }
            OpKind::AtomicAck => {
                let Some(ack) = hdr.atomic_ack else { return true };
                let Some(idx) = self.wqe_with_psn(p) else {
                    self.stats.dropped += 1;
                    return true;
                };
                let e = *self.entry(idx);
                if !e.op.is_atomic() {
                    self.stats.dropped += 1;
                    return true;
                }
                if self.ack_through_and_apply(now, p.wrapping_sub(1), cq).is_none() {
                    return true;
                }
                let bytes = ack.orig.to_le_bytes();
                match mem.scatter(self.pd, self.qpn, self.sq_side.sges(idx, e.num_sge), 0, &bytes) {
                    Ok(()) => self.finish_wqe(idx, WcStatus::Success),
                    Err(_) => self.finish_wqe(idx, WcStatus::LocProtErr),
                }
                self.stats.acks_received += 1;
                if p.wrapping_add(1).distance(self.comp.psn) > 0 {
                    self.comp.psn = p.wrapping_add(1);
                }
                self.on_progress(now);
                self.retire(cq);
            }
            _ => self.stats.dropped += 1,
        }
        true
    }

    /// ACK processing shared by ACK/NAK/atomic ACK. Returns `None` if an implicit NAK started
    /// a retry (the caller stops), else whether progress was made.
    fn ack_through_and_apply<C: CompletionSink + ?Sized>(&mut self, now: Instant, p: Psn, cq: &mut C) -> Option<bool> {
        match self.ack_through(p) {
            AckOutcome::Progress(progress) => {
                if progress {
                    self.on_progress(now);
                }
                self.retire(cq);
                Some(progress)
            }
            AckOutcome::ImplicitNak(from) => {
                self.retire(cq);
                if !self.comp.started_retry {
                    self.retry_or_fail(now, from, cq);
                }
                None
            }
        }
    }

    fn process_ack<C: CompletionSink + ?Sized>(&mut self, now: Instant, p: Psn, cq: &mut C) {
        let _ = self.ack_through_and_apply(now, p, cq);
    }

    fn on_read_response<M: MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, now: Instant, hdr: &TransportHeaders, payload: &[u8], mem: &M, deferred: Option<IcrcCheck>, cq: &mut C) -> bool {
        // (The caller looked the opcode up: a READ response.)
        let pos = hdr.bth.opcode.info().map_or(MsgPos::Only, |i| i.pos);
        // Under a deferred check, anything but placing the payload (or dropping) waits for it.
        let verified = |deferred: Option<IcrcCheck>| deferred.is_none_or(|c| c.verify(payload));
        let p = hdr.bth.psn;
        let Some(idx) = self.wqe_with_psn(p) else {
            self.stats.dropped += 1;
            return true;
        };
        let e = *self.entry(idx);
        if !matches!(e.op, SendOp::Read) {
            if !verified(deferred) {
                return false;
            }
            // READ response for a non-READ WQE (§4.2 FATAL_ERR).
            self.fail_at(p, WcStatus::FatalErr, cq);
            return true;
        }
        // The response implies every earlier request was executed. (No AETH under a deferred
        // check: MIDDLE only.)
        if hdr.aeth.is_some() && self.ack_through_and_apply(now, e.first_psn.wrapping_sub(1), cq).is_none() {
            return true;
        }
        if self.state == QpState::Err {
            return true;
        }
        let e = *self.entry(idx);
        let expected = e.first_psn.wrapping_add(e.rcvd);
        let d = p.distance(expected);
        if d != 0 {
            if d > 0 && !self.comp.started_retry {
                if !verified(deferred) {
                    return false;
                }
                // A response was lost: re-request from the first missing PSN (D5).
                self.retry_or_fail(now, expected, cq);
            } else {
                self.stats.dropped += 1;
            }
            return true;
        }
        let mtu = u64::from(self.mtu());
        let off = u64::from(e.rcvd) * mtu;
        let remain = e.len.saturating_sub(off);
        let is_last = p == e.last_psn();
        let ok = if is_last {
            payload.len() as u64 == remain && pos.is_end()
        } else {
            payload.len() as u64 == mtu && !pos.is_end()
        };
        if !ok {
            self.stats.dropped += 1;
            return true;
        }
        if !payload.is_empty() {
            let placed = match deferred {
                None => mem.scatter(self.pd, self.qpn, self.sq_side.sges(idx, e.num_sge), off, payload).map(|()| true),
                // Verify while placing: the bytes land at [off, off + MTU) of this READ's local
                // buffer, which the response at this PSN (retransmitted if need be) rewrites and
                // which the consumer may not read before the completion.
                Some(c) => mem.scatter_crc(self.pd, self.qpn, self.sq_side.sges(idx, e.num_sge), off, payload, c.seed()).map(|crc| c.matches(crc)),
            };
            match placed {
                Ok(true) => {}
                Ok(false) => return false,
                Err(_) => {
                    if !verified(deferred) {
                        return false;
                    }
                    self.finish_wqe(idx, WcStatus::LocProtErr);
                    self.retire(cq);
                    return true;
                }
            }
        }
        let en = self.entry_mut(idx);
        en.rcvd += 1;
        self.comp.psn = p.wrapping_add(1);
        if is_last {
            self.finish_wqe(idx, WcStatus::Success);
        }
        self.on_progress(now);
        self.retire(cq);
        true
    }
}
