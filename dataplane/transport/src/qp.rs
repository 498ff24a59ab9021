//! The QP: the IBTA state machine (modify/query, with the attribute types and per-transition
//! masks in `attr.rs`), posting (the SQ's compact entries in `sq.rs`), flushing and in-order
//! retirement. The three roles live in
//! `requester.rs`, `completer.rs` and `responder.rs`; this file is the only code that
//! connects them (retry, error, retire).

use std::collections::VecDeque;

use pmrxe_mem::PdHandle;

use crate::attr::{transition_masks, AddressVector, AttrMask, CreateError, ModifyError, PathMtu, QpAttr, QpCaps, QpState, QpType, MAX_QP_WR, MAX_RD_ATOMIC};
use crate::completer::CompState;
use crate::cq::{CompletionSink, CqSide, Cqe, WcOpcode, WcStatus};
use crate::dcqcn::{CcConfig, Dcqcn};
use crate::requester::{ReqState, TxStream};
use crate::responder::RespState;
use crate::sq::{SqEntry, SqRing, SqSide};
use crate::stats::QpStats;
use crate::timers::{Instant, Timer, TimerTable};
use crate::rq::RecvQueue;
use crate::wqe::{RecvWr, SendFlags, SendOp, SendWr, MAX_INLINE, MAX_SGE};

/// `post_send`/`post_recv` failure (the WR is returned as `bad_wr`; no CQE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostError {
    /// The QP state does not accept this post.
    InvalidState,
    /// The queue is full.
    QueueFull,
    /// Opcode not valid for this QP type.
    BadOpcode,
    /// More SGEs than the QP's capacity.
    TooManySge,
    /// Message longer than 2^31 bytes.
    TooLong,
    /// Atomic with length ≠ 8 or misaligned remote address.
    BadAtomic,
    /// Inline payload larger than `max_inline_data`, or inline on an op that cannot be inline.
    BadInline,
    /// UD send without a destination.
    NoDestination,
}

/// Asynchronous events (`ibv_event_type` subset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// IBV_EVENT_COMM_EST: first packet received in RTR.
    CommEstablished,
    /// IBV_EVENT_SQ_DRAINED.
    SqDrained,
    /// IBV_EVENT_SRQ_LIMIT_REACHED for SRQ `srqn`.
    SrqLimitReached {
        /// The SRQ.
        srqn: u32,
    },
    /// IBV_EVENT_QP_LAST_WQE_REACHED (QP with an SRQ entered ERR).
    LastWqeReached,
    /// IBV_EVENT_QP_FATAL.
    QpFatal,
    /// IBV_EVENT_QP_REQ_ERR: invalid request at our responder with no WQE to report it.
    QpRequestError,
    /// IBV_EVENT_QP_ACCESS_ERR: rkey violation at our responder with no WQE to report it.
    QpAccessError,
}

/// One packet written by [`Qp::poll_transmit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Bytes written: BTH + extension headers + payload + pad (no ICRC).
    pub len: usize,
    /// Path: `None` for the QP's connected path as it stands (`ah_attr` to `dest_qp_num`:
    /// every RC/UC request and every response; [`Qp::transmit_av`] gives it), a UD WQE's
    /// address handle or a CNP's path (its own traffic class) otherwise. The connected path is
    /// not copied into every packet's `Transmit`, and the lcore reuses one path lookup for a
    /// burst's packets on it.
    pub av: Option<AddressVector>,
    /// Destination QPN.
    pub dest_qpn: u32,
    /// Our QPN.
    pub src_qpn: u32,
    /// CRC-32 of the `len` bytes written, as the ICRC covers them (BTH byte 4 masked), folded
    /// while a long payload was copied: give it to `pmrxe_wire::finish_frame_with_tail_crc`,
    /// which hashes only the IP/UDP prefix. `None` for a short packet (at most
    /// 128 payload bytes, ACKs, CNPs): hash the finished frame in one pass
    /// (`pmrxe_wire::finish_frame`, or `seal_frame` for a templated one), best once the frame's
    /// stores have settled. Hashing it right after the header stores made the CRC's first
    /// loads wait for them (a store-forwarding stall on every short packet).
    pub tail_crc: Option<u32>,
}

/// A queue pair.
#[derive(Debug)]
pub struct Qp {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) pd: PdHandle,
    pub(crate) caps: QpCaps,
    pub(crate) srq: Option<u32>,
    pub(crate) sq_sig_all: bool,
    pub(crate) state: QpState,
    pub(crate) attr: QpAttr,
    /// SQ entries, by absolute WQE index.
    pub(crate) sq: SqRing,
    /// Gather lists, inline data and UD destinations of the SQ's WQEs.
    pub(crate) sq_side: SqSide,
    pub(crate) rq: RecvQueue,
    pub(crate) req: ReqState,
    pub(crate) comp: CompState,
    pub(crate) resp: RespState,
    pub(crate) timers: TimerTable,
    /// Completions kept in order: refused by a full CQ, or produced by a call given the
    /// [`crate::cq::Deferred`] sink. (Every other completion went to its sink when produced.)
    pub(crate) cqes: VecDeque<(CqSide, Cqe)>,
    pub(crate) events: VecDeque<AsyncEvent>,
    pub(crate) stats: QpStats,
    pub(crate) sqd_notified: bool,
    /// Active MTU of the port the QP lives on ([`Qp::set_port_mtu`]); a UD QP's path MTU.
    pub(crate) port_mtu: PathMtu,
    /// Congestion control configuration ([`Qp::set_congestion`]).
    pub(crate) cc: CcConfig,
    /// DCQCN reaction point (when `cc.rp` is set).
    pub(crate) dcqcn: Option<Dcqcn>,
    /// Notification point: when the last CNP was queued, and whether one waits to be sent.
    pub(crate) np_last_cnp: Option<Instant>,
    pub(crate) cnp_pending: bool,
    /// Header prediction's fast paths are on: the responder's for WRITE MIDDLE packets, the
    /// requester's for the MIDDLE packets it sends (always, but in the test that runs them
    /// against the general paths: [`Qp::set_fast_paths`]).
    pub(crate) fast_paths: bool,
    /// The requester's carried gather for the MIDDLE packets of the WQE it is sending.
    pub(crate) tx_stream: TxStream,
}

impl Qp {
    /// Create a QP in RESET. Queues are allocated here, never on the fast path.
    pub fn new(qpn: u32, qp_type: QpType, pd: PdHandle, caps: QpCaps, srq: Option<u32>) -> Result<Self, CreateError> {
        if caps.max_send_wr > MAX_QP_WR
            || caps.max_recv_wr > MAX_QP_WR
            || caps.max_send_sge as usize > MAX_SGE
            || caps.max_recv_sge as usize > MAX_SGE
            || caps.max_inline_data as usize > MAX_INLINE
        {
            return Err(CreateError::CapsTooLarge);
        }
        if qpn == 0 || qpn > 0x00FF_FFFF {
            return Err(CreateError::InvalidArgument);
        }
        let attr = QpAttr { cap: caps, ..QpAttr::default() };
        Ok(Qp {
            qpn,
            qp_type,
            pd,
            caps,
            srq,
            sq_sig_all: false,
            state: QpState::Reset,
            attr,
            sq: SqRing::new(caps.max_send_wr),
            sq_side: SqSide::new(&caps, qp_type),
            rq: RecvQueue::with_capacity(caps.max_recv_wr as usize),
            req: ReqState::default(),
            comp: CompState::default(),
            resp: RespState::new(),
            timers: TimerTable::default(),
            cqes: VecDeque::with_capacity((caps.max_send_wr + caps.max_recv_wr) as usize),
            events: VecDeque::with_capacity(8),
            stats: QpStats::default(),
            sqd_notified: false,
            port_mtu: PathMtu::Mtu1024,
            cc: CcConfig::default(),
            dcqcn: None,
            np_last_cnp: None,
            cnp_pending: false,
            fast_paths: true,
            tx_stream: TxStream::none(),
        })
    }

    /// Turn the fast paths (a predicted WRITE MIDDLE handled in one step; a MIDDLE packet of a
    /// message in progress built in one step) off or on. Behaviour is the same either way; the
    /// switch exists so a test can check that.
    pub fn set_fast_paths(&mut self, on: bool) {
        self.fast_paths = on;
    }

    /// The active MTU of the QP's port (`ibv_port_attr.active_mtu`), given by whoever creates
    /// the QP. A UD QP has no path MTU attribute (`IBV_QP_PATH_MTU` is not a UD modify
    /// attribute): its messages may be as large as the port MTU (C10-93.1.1), so its path MTU
    /// is this value, from now on and after every RESET. RC/UC take the path MTU from RTR.
    pub fn set_port_mtu(&mut self, mtu: PathMtu) {
        self.port_mtu = mtu;
        if self.qp_type == QpType::Ud {
            self.attr.path_mtu = mtu;
        }
    }

    /// Congestion control of this QP (from its port's configuration): CNPs for CE-marked
    /// packets (notification point) and DCQCN rate control with pacing (reaction point). Kept
    /// across RESET. Changing it restarts the reaction point at line rate.
    pub fn set_congestion(&mut self, cc: CcConfig) {
        self.cc = cc;
        self.dcqcn = cc.rp.map(Dcqcn::new);
        for t in [Timer::Pacing, Timer::DcqcnAlpha, Timer::DcqcnIncrease] {
            self.timers.stop(t);
        }
        self.stats.cc_rate_mbps = self.dcqcn.map_or(0, |d| d.rate_bps() / 1_000_000);
    }

    /// The DCQCN state, if the reaction point is on.
    pub fn dcqcn(&self) -> Option<&Dcqcn> {
        self.dcqcn.as_ref()
    }

    /// A CNP addressed to this QP arrived (reaction point): cut the rate (DCQCN on) and count.
    pub fn handle_cnp(&mut self, now: Instant) {
        self.stats.cnp_received += 1;
        if let Some(d) = &mut self.dcqcn {
            d.on_cnp(now);
            self.stats.cc_rate_decreases = d.decreases;
        }
        self.sync_cc_timers();
    }

    /// Mirror the DCQCN deadlines into the timer table and the rate into the stats.
    pub(crate) fn sync_cc_timers(&mut self) {
        let Some(d) = &self.dcqcn else { return };
        let (a, i, r) = (d.alpha_deadline(), d.increase_deadline(), d.rate_bps());
        for (t, at) in [(Timer::DcqcnAlpha, a), (Timer::DcqcnIncrease, i)] {
            match at {
                Some(at) => self.timers.set(t, at),
                None => self.timers.stop(t),
            }
        }
        if !d.is_limiting() {
            self.timers.stop(Timer::Pacing);
        }
        self.stats.cc_rate_mbps = r / 1_000_000;
    }

    /// Notification point: a packet for this QP arrived with traffic class `tclass`; a CE mark
    /// queues a CNP to the peer QP unless one was queued less than the CNP interval ago.
    pub(crate) fn on_ecn(&mut self, now: Instant, tclass: u8) {
        if !pmrxe_wire::ecn::is_ce(tclass) {
            return;
        }
        self.stats.ecn_ce_received += 1;
        let Some(np) = self.cc.np else { return };
        if self.qp_type == QpType::Ud || !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe) {
            return;
        }
        if self.np_last_cnp.is_some_and(|t| now.since(t) < np.cnp_interval_ns) {
            return;
        }
        self.np_last_cnp = Some(now);
        self.cnp_pending = true;
    }

    /// Write the pending CNP (BTH 0x81 + 16 reserved bytes) for the peer QP.
    #[inline]
    fn poll_cnp(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        if !self.cnp_pending {
            return None;
        }
        self.cnp_pending = false;
        let len = pmrxe_wire::CnpRepr::new(self.attr.dest_qp_num).emit(buf).ok()?;
        let mut av = self.attr.ah_attr;
        av.traffic_class = self.cc.np.map_or(0, |n| n.cnp_dscp << 2);
        self.stats.cnp_sent += 1;
        Some(Transmit { len, av: Some(av), dest_qpn: self.attr.dest_qp_num.value(), src_qpn: self.qpn, tail_crc: None })
    }

    /// Signal every send WR (`sq_sig_all` of `ibv_qp_init_attr`).
    pub fn set_sq_sig_all(&mut self, on: bool) {
        self.sq_sig_all = on;
    }

    /// Our QPN.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    /// Transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }
    /// Attached SRQ.
    pub fn srq(&self) -> Option<u32> {
        self.srq
    }
    /// Counters.
    pub fn stats(&self) -> &QpStats {
        &self.stats
    }
    /// Path MTU in bytes.
    pub(crate) fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> QpAttr {
        let mut a = self.attr;
        a.qp_state = self.state;
        a.cur_qp_state = self.state;
        a.sq_draining = self.state == QpState::Sqd && !self.sq_drained();
        a.cap = self.caps;
        a
    }

    /// `ibv_modify_qp`: checks the transition and the attribute mask against the IBTA table
    /// ([`transition_masks`]), validates values, then applies. Entering ERR flushes both
    /// queues (the flushed completions go to `cq`); entering RESET clears everything.
    pub fn modify<C: CompletionSink + ?Sized>(&mut self, attr: &QpAttr, mask: AttrMask, cq: &mut C) -> Result<(), ModifyError> {
        let cur = self.state;
        if mask.contains(AttrMask::CUR_STATE) && attr.cur_qp_state != cur {
            // IBA 11.2.4.2 allows CUR_STATE only to confirm the state (or SQE/RTS recovery).
            return Err(ModifyError::CurrentStateMismatch);
        }
        let next = if mask.contains(AttrMask::STATE) { attr.qp_state } else { cur };
        let t = transition_masks(self.qp_type, cur, next)
            .ok_or(ModifyError::InvalidTransition { from: cur, to: next })?;
        let given = mask.minus(AttrMask::STATE);
        let missing = t.required.minus(given);
        if !missing.is_empty() {
            return Err(ModifyError::MissingAttributes(missing));
        }
        let extra = given.minus(t.required | t.optional);
        if !extra.is_empty() {
            return Err(ModifyError::InvalidAttributes(extra));
        }
        // Values.
        if mask.contains(AttrMask::TIMEOUT) && attr.timeout > 31 {
            return Err(ModifyError::InvalidValue("timeout > 31"));
        }
        if mask.contains(AttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
            return Err(ModifyError::InvalidValue("retry_cnt > 7"));
        }
        if mask.contains(AttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
            return Err(ModifyError::InvalidValue("rnr_retry > 7"));
        }
        if mask.contains(AttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return Err(ModifyError::InvalidValue("min_rnr_timer > 31"));
        }
        if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > MAX_RD_ATOMIC {
            return Err(ModifyError::InvalidValue("max_rd_atomic"));
        }
        if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > MAX_RD_ATOMIC {
            return Err(ModifyError::InvalidValue("max_dest_rd_atomic"));
        }
        if mask.contains(AttrMask::PORT) && attr.port_num != 1 {
            return Err(ModifyError::InvalidValue("port_num"));
        }
        if mask.contains(AttrMask::CAP) {
            return Err(ModifyError::InvalidAttributes(AttrMask::CAP));
        }
        // Apply values.
        macro_rules! set {
            ($($bit:ident => $f:ident),* $(,)?) => { $( if mask.contains(AttrMask::$bit) { self.attr.$f = attr.$f; } )* };
        }
        set!(
            ACCESS_FLAGS => qp_access_flags, PKEY_INDEX => pkey_index, PORT => port_num,
            QKEY => qkey, AV => ah_attr, PATH_MTU => path_mtu, TIMEOUT => timeout,
            RETRY_CNT => retry_cnt, RNR_RETRY => rnr_retry, RQ_PSN => rq_psn,
            MAX_QP_RD_ATOMIC => max_rd_atomic, MIN_RNR_TIMER => min_rnr_timer, SQ_PSN => sq_psn,
            MAX_DEST_RD_ATOMIC => max_dest_rd_atomic, DEST_QPN => dest_qp_num,
            EN_SQD_ASYNC_NOTIFY => en_sqd_async_notify,
        );
        if mask.contains(AttrMask::RQ_PSN) {
            self.resp.reset_psn(attr.rq_psn);
        }
        if mask.contains(AttrMask::SQ_PSN) {
            self.req.reset_psn(attr.sq_psn);
            self.comp.reset_psn(attr.sq_psn);
        }
        if mask.contains(AttrMask::RETRY_CNT) || mask.contains(AttrMask::RNR_RETRY) {
            self.comp.reset_retry(&self.attr);
        }
        if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) {
            self.resp.set_resources(self.attr.max_dest_rd_atomic);
        }
        if next != cur {
            match next {
                QpState::Reset => self.reset(),
                QpState::Err => self.enter_error(cq),
                QpState::Sqd => {
                    self.state = QpState::Sqd;
                    self.sqd_notified = false;
                    self.check_sq_drained();
                }
                s => self.state = s,
            }
        }
        Ok(())
    }

    fn reset(&mut self) {
        let (qpn, ty, pd, caps, srq, sig, port_mtu, cc) = (self.qpn, self.qp_type, self.pd, self.caps, self.srq, self.sq_sig_all, self.port_mtu, self.cc);
        // Reuse the allocations.
        let mut sq = core::mem::replace(&mut self.sq, SqRing::new(0));
        let mut rq = core::mem::take(&mut self.rq);
        let mut cqes = core::mem::take(&mut self.cqes);
        let mut events = core::mem::take(&mut self.events);
        sq.clear();
        rq.clear();
        cqes.clear();
        events.clear();
        *self = Qp::new(qpn, ty, pd, caps, srq).unwrap_or_else(|_| unreachable!("caps validated at create"));
        self.sq = sq;
        self.rq = rq;
        self.cqes = cqes;
        self.events = events;
        self.sq_sig_all = sig;
        self.set_port_mtu(port_mtu);
        self.set_congestion(cc);
    }

    /// Move to ERR and flush: every WQE still on the SQ or RQ completes with WR_FLUSH_ERR
    /// (IBA 10.7.3.1). Nothing executes after this.
    pub(crate) fn enter_error<C: CompletionSink + ?Sized>(&mut self, cq: &mut C) {
        if self.state == QpState::Err {
            self.flush(cq);
            return;
        }
        self.state = QpState::Err;
        self.timers.clear();
        self.resp.on_error();
        self.flush(cq);
        if self.srq.is_some() {
            self.events.push_back(AsyncEvent::LastWqeReached);
        }
    }

    fn flush<C: CompletionSink + ?Sized>(&mut self, cq: &mut C) {
        while let Some(e) = self.sq.pop_front() {
            if e.credit {
                self.req.release_rd_atomic();
            }
            let mut c = Cqe::new(e.wr_id, WcStatus::WrFlushErr, wc_opcode(&e.op), self.qpn);
            c.byte_len = 0;
            self.stats.completion(WcStatus::WrFlushErr);
            self.complete(cq, CqSide::Send, c);
        }
        self.req.flushed_to(self.sq.head());
        // The RQ's current WQE is its head: flushed first, in order.
        while let Some(wr_id) = self.rq.pop() {
            self.stats.completion(WcStatus::WrFlushErr);
            self.complete(cq, CqSide::Recv, Cqe::new(wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn));
        }
        if let Some(r) = self.resp.take_current_recv() {
            self.stats.completion(WcStatus::WrFlushErr);
            self.complete(cq, CqSide::Recv, Cqe::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn));
        }
    }

    /// `ibv_post_send`. Validation failures return an error and produce no CQE
    /// (rxe `validate_send_wr`). In ERR the WR is accepted and flushed (its completion to `cq`).
    pub fn post_send<W: SendWr + ?Sized, C: CompletionSink + ?Sized>(&mut self, now: Instant, wqe: &W, cq: &mut C) -> Result<(), PostError> {
        let _ = now;
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {}
            _ => return Err(PostError::InvalidState),
        }
        if self.send_queue_full() {
            return Err(PostError::QueueFull);
        }
        let op = wqe.op();
        let ok_for_type = match self.qp_type {
            QpType::Rc => true,
            QpType::Uc => matches!(op, SendOp::Send | SendOp::SendImm(_) | SendOp::Write | SendOp::WriteImm(_))
                || op.is_local(),
            QpType::Ud => matches!(op, SendOp::Send | SendOp::SendImm(_)),
        };
        if !ok_for_type {
            return Err(PostError::BadOpcode);
        }
        let num_sge = wqe.num_sge();
        if num_sge > self.caps.max_send_sge as usize || num_sge > MAX_SGE {
            return Err(PostError::TooManySge);
        }
        let flags = wqe.flags();
        let inline = flags.contains(SendFlags::INLINE);
        let inline_len = wqe.inline_len();
        if inline
            && (op.is_local() || op.is_rd_atomic() || inline_len > self.caps.max_inline_data as usize || inline_len > MAX_INLINE) {
                return Err(PostError::BadInline);
            }
        // The out-of-line parts go into the free slot at the queue's end now (they count only
        // once the entry is pushed below), so each gather entry is read once: `store` sums
        // their lengths as it copies them.
        let idx = self.sq_end();
        let gathered = self.sq_side.store(idx, wqe, inline);
        // Payload length: the inline length, or the sum of the gather entries; local ops: 0.
        let len = match () {
            _ if op.is_local() => 0,
            _ if inline => inline_len as u64,
            _ => gathered,
        };
        if len > 1 << 31 {
            return Err(PostError::TooLong);
        }
        let remote_addr = wqe.remote_addr();
        if op.is_atomic() && (len != 8 || remote_addr & 7 != 0) {
            return Err(PostError::BadAtomic);
        }
        if self.qp_type == QpType::Ud && self.sq_side.ud(idx).is_none() {
            return Err(PostError::NoDestination);
        }
        let npsn = match op {
            _ if op.is_local() => 0,
            SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. } => 1,
            // The path MTU is a power of two (128 << n): a shift, not a 64-bit division per WQE.
            _ => {
                let shift = self.mtu().trailing_zeros();
                (((len + (1u64 << shift) - 1) >> shift) as u32).max(1)
            }
        };
        self.sq.push(SqEntry {
            wr_id: wqe.wr_id(),
            op,
            flags,
            remote_addr,
            rkey: wqe.rkey(),
            num_sge: if inline { 0 } else { num_sge as u8 },
            len,
            npsn,
            // Not started: no PSNs, no packets, no credit, no status.
            ..SqEntry::NOT_STARTED
        });
        if self.state == QpState::Err {
            self.flush(cq);
        }
        Ok(())
    }

    /// `ibv_post_recv` (QP without SRQ). Accepted from INIT on; flushed in ERR (its completion
    /// to `cq`).
    pub fn post_recv<W: RecvWr + ?Sized, C: CompletionSink + ?Sized>(&mut self, wqe: &W, cq: &mut C) -> Result<(), PostError> {
        if self.srq.is_some() {
            return Err(PostError::InvalidState);
        }
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState);
        }
        let n = wqe.num_sge();
        if n > self.caps.max_recv_sge as usize || n > MAX_SGE {
            return Err(PostError::TooManySge);
        }
        if self.rq.len() >= self.caps.max_recv_wr as usize || !self.rq.push(wqe) {
            return Err(PostError::QueueFull);
        }
        if self.state == QpState::Err {
            self.flush(cq);
        }
        Ok(())
    }

    /// Whether the send queue holds `max_send_wr` WQEs: a post now fails with
    /// [`PostError::QueueFull`] until a completion retires one.
    #[inline]
    pub fn send_queue_full(&self) -> bool {
        self.sq.len() >= self.caps.max_send_wr as usize
    }

    /// Whether the QP's own receive queue holds `max_recv_wr` WQEs (false on an SRQ).
    #[inline]
    pub fn recv_queue_full(&self) -> bool {
        self.srq.is_none() && self.rq.len() >= self.caps.max_recv_wr as usize
    }

    /// Whether the QP's own receive queue holds no WQE, queued or in progress. When a request
    /// that needs one arrives (a SEND, or the end of a WRITE with immediate), the lcore then
    /// takes the WQEs the client has posted meanwhile from its ring before the packet acts, as
    /// a NIC reads the receive queue when a message arrives; without that, a receive posted
    /// just before the SEND arrived (its doorbell not read yet) earned an RNR NAK on RC and lost
    /// the datagram on UD. False for a QP on an SRQ (see [`Qp::srq`]).
    #[must_use]
    pub fn recv_queue_empty(&self) -> bool {
        self.srq.is_none() && !self.rq.has_next() && self.rq.current().is_none()
    }

    /// Hand `c` to `cq`, or keep it (in order) if `cq` is full or completions already wait.
    #[inline]
    pub(crate) fn complete<C: CompletionSink + ?Sized>(&mut self, cq: &mut C, side: CqSide, c: Cqe) {
        if !(self.cqes.is_empty() && cq.complete(side, &c)) {
            self.cqes.push_back((side, c));
        }
    }

    /// Move the completions this QP kept (its CQ was full, or the sink [`crate::cq::Deferred`])
    /// to `cq`, in order, until it refuses one. Returns whether any are still kept.
    pub fn drain_completions<C: CompletionSink + ?Sized>(&mut self, cq: &mut C) -> bool {
        while let Some((side, c)) = self.cqes.front() {
            if !cq.complete(*side, c) {
                return true;
            }
            self.cqes.pop_front();
        }
        false
    }

    /// The CQ side of the first completion the QP kept (the one its CQ refused).
    pub(crate) fn kept_side(&self) -> Option<CqSide> {
        self.cqes.front().map(|(side, _)| *side)
    }

    /// Next completion the QP kept, in order per side.
    #[must_use]
    pub fn poll_completion(&mut self) -> Option<(CqSide, Cqe)> {
        self.cqes.pop_front()
    }

    /// Are completions or asynchronous events waiting to be polled?
    #[must_use]
    pub fn has_output(&self) -> bool {
        !self.cqes.is_empty() || !self.events.is_empty()
    }

    /// Next asynchronous event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// The earliest timer deadline.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next_timeout()
    }

    // ---- the dispatcher: a received packet to the role it is for -------------------------

    /// Hand a received packet to the QP. `mem` is the lcore's memory table, `srq` the SRQ
    /// this QP draws from (if any).
    ///
    /// A packet whose ICRC check was deferred (`pkt.icrc()`) is checked here before it has any
    /// effect, except the payload of a WRITE MIDDLE/LAST continuing a validated message and of
    /// a READ response MIDDLE, which is checked while it is placed (one pass; the bytes can only
    /// land where the rest of the message will write them anyway): see docs/reliability.md,
    /// "ICRC and placement". A bad ICRC drops the packet, counted in `icrc_errors`.
    pub fn handle_packet<M: crate::MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, now: Instant, pkt: &crate::RxPacket<'_>, mem: &M, srq: Option<&mut crate::Srq>, cq: &mut C) {
        self.stats.rx_packets += 1;
        if self.write_middle_predicted(now, pkt, mem) {
            return;
        }
        let Some(info) = pkt.hdr.bth.opcode.info() else {
            self.stats.dropped += 1;
            return;
        };
        if info.qp != self.qp_type.wire() {
            self.stats.dropped += 1;
            return;
        }
        if !self.is_from_peer(pkt) {
            self.stats.dropped += 1;
            return;
        }
        let deferred = match pkt.icrc() {
            // (A short frame's check is already made: nothing to gain from placing first.)
            Some(c) if c.settled().is_none() && self.may_place_before_icrc(info, pkt) => Some(c),
            Some(c) => {
                if !c.verify(pkt.payload()) {
                    self.stats.icrc_errors += 1;
                    return;
                }
                None
            }
            None => None,
        };
        // Notification point: ECN-CE from our peer (requests and responses alike) → CNP. For a
        // packet still under check, only once the check passed.
        if deferred.is_none() {
            self.on_ecn(now, pkt.frame.tclass);
        }
        let icrc_ok = if info.is_response() {
            if self.qp_type == QpType::Rc {
                self.on_response(now, &pkt.hdr, pkt.payload(), mem, deferred, cq)
            } else {
                self.stats.dropped += 1;
                true
            }
        } else {
            self.on_request_packet(pkt, mem, srq, deferred, cq)
        };
        if !icrc_ok {
            self.stats.icrc_errors += 1;
        } else if deferred.is_some() {
            self.on_ecn(now, pkt.frame.tclass);
        }
    }

    /// RC/UC path check: the source must be our peer (when both are known).
    #[inline]
    pub(crate) fn is_from_peer(&self, pkt: &crate::RxPacket<'_>) -> bool {
        self.qp_type == QpType::Ud || self.attr.ah_attr.dgid == [0; 16] || pkt.frame.src_gid == [0; 16] || pkt.frame.src_gid == self.attr.ah_attr.dgid
    }

    /// Service every expired timer (completions of a failed retry to `cq`).
    pub fn handle_timeout<M: crate::MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, now: Instant, mem: &M, cq: &mut C) {
        let _ = mem;
        for t in Timer::ALL {
            if self.timers.is_expired(t, now) {
                self.timers.stop(t);
                match t {
                    Timer::Retransmit => self.on_retransmit_timeout(now, cq),
                    Timer::RnrWait => self.on_rnr_timer(now),
                    // The pacer's deadline passed: the requester may send again.
                    Timer::Pacing => {}
                    Timer::DcqcnAlpha => {
                        if let Some(d) = &mut self.dcqcn {
                            d.on_alpha_timer(now);
                        }
                        self.sync_cc_timers();
                    }
                    Timer::DcqcnIncrease => {
                        if let Some(d) = &mut self.dcqcn {
                            d.on_increase_timer(now);
                        }
                        self.sync_cc_timers();
                    }
                }
            }
        }
    }

    /// Absolute index one past the last posted WQE.
    pub(crate) fn sq_end(&self) -> u64 {
        self.sq.end()
    }
    #[inline]
    pub(crate) fn entry(&self, idx: u64) -> &SqEntry {
        self.sq.get(idx)
    }
    #[inline]
    pub(crate) fn entry_mut(&mut self, idx: u64) -> &mut SqEntry {
        self.sq.get_mut(idx)
    }

    /// Set the final status of WQE `idx` (first status wins) and release its credit.
    pub(crate) fn finish_wqe(&mut self, idx: u64, st: WcStatus) {
        let e = self.entry_mut(idx);
        if e.done.is_some() {
            return;
        }
        e.done = Some(st);
        let had = core::mem::replace(&mut e.credit, false);
        if had {
            self.req.release_rd_atomic();
        }
        if st != WcStatus::Success {
            // Nothing at or after the failing WQE is started any more.
            self.req.stop_before(idx);
        }
    }

    /// Retire finished WQEs from the head in SQ order, producing CQEs (always for errors,
    /// IBA 10.7.3.1). A failed WQE moves the QP to ERR and flushes the rest.
    pub(crate) fn retire<C: CompletionSink + ?Sized>(&mut self, cq: &mut C) {
        while let Some(e) = self.sq.front() {
            let Some(st) = e.done else { break };
            // Only the fields the CQE needs (not a copy of the whole entry).
            let (wr_id, op, len, signaled) = (e.wr_id, e.op, e.len, e.signaled());
            self.sq.pop_front();
            if st != WcStatus::Success || signaled || self.sq_sig_all {
                let mut c = Cqe::new(wr_id, st, wc_opcode(&op), self.qpn);
                if st == WcStatus::Success {
                    c.byte_len = match op {
                        SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. } => 8,
                        _ => len as u32,
                    };
                }
                self.stats.completion(st);
                self.complete(cq, CqSide::Send, c);
            }
            if st != WcStatus::Success {
                self.enter_error(cq);
                return;
            }
        }
        // A cumulative ACK may retire WQEs the (rewound) network cursor had not reached yet.
        self.req.retired_to(self.sq.head());
        self.check_sq_drained();
    }

    pub(crate) fn sq_drained(&self) -> bool {
        // Drained: nothing started is still outstanding.
        self.sq.iter().all(|e| e.done.is_some() || !e.started)
    }

    fn check_sq_drained(&mut self) {
        if self.state == QpState::Sqd && !self.sqd_notified && self.sq_drained() {
            self.sqd_notified = true;
            if self.attr.en_sqd_async_notify {
                self.events.push_back(AsyncEvent::SqDrained);
            }
        }
    }

    /// Write the next packet into `buf` (BTH + extension headers + payload + pad; no ICRC, no
    /// L2/L3/L4). Responder output (ACK/NAK, READ responses, atomic ACKs) goes first, then
    /// requester packets. Local operations execute here when the SQ walk reaches them; what
    /// completes (a local operation, a UC/UD send, a failed gather) goes to `cq`.
    #[must_use]
    pub fn poll_transmit<M: crate::MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, now: Instant, mem: &M, buf: &mut [u8], cq: &mut C) -> Option<Transmit> {
        if let Some(t) = self.poll_cnp(buf) {
            return Some(t);
        }
        if let Some(t) = self.poll_response(mem, buf, cq) {
            return Some(t);
        }
        self.poll_request(now, mem, buf, cq)
    }

    /// The address vector and destination QPN of the packet `poll_transmit` would write next
    /// (the runtime resolves the path before the QP's send state advances). `None` when the
    /// next WQE is a local operation or there is nothing to send.
    pub fn next_path(&self) -> Option<(&AddressVector, u32)> {
        let connected = (&self.attr.ah_attr, self.attr.dest_qp_num.value());
        if self.resp.has_output() || self.cnp_pending {
            return Some(connected);
        }
        if self.qp_type == QpType::Ud {
            let i = self.req.net_cursor();
            return if i < self.sq_end() { self.sq_side.ud(i).map(|u| (&u.av, u.remote_qpn)) } else { None };
        }
        Some(connected)
    }

    /// The path of packet `t` this QP wrote: its own address vector, or the QP's connected
    /// path.
    #[inline]
    pub fn transmit_av<'a>(&'a self, t: &'a Transmit) -> &'a AddressVector {
        t.av.as_ref().unwrap_or(&self.attr.ah_attr)
    }

    /// Does this QP have something to send right now (responder output or requester work)?
    /// The runtime keeps QPs for which this is true on its ready list.
    pub fn wants_transmit(&self) -> bool {
        if self.resp.has_output() || self.cnp_pending {
            return true;
        }
        match self.state {
            QpState::Rts | QpState::Sqd => {
                self.req.net_cursor() < self.sq_end() && self.timers.get(Timer::RnrWait).is_none() && self.timers.get(Timer::Pacing).is_none()
            }
            _ => false,
        }
    }
}

/// The CQE opcode of a send WQE.
pub(crate) fn wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendImm(_) | SendOp::SendInv(_) => WcOpcode::Send,
        SendOp::Write | SendOp::WriteImm(_) => WcOpcode::RdmaWrite,
        SendOp::Read => WcOpcode::RdmaRead,
        SendOp::CmpSwap { .. } => WcOpcode::CompSwap,
        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        SendOp::RegMr { .. } => WcOpcode::RegMr,
        SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        SendOp::BindMw { .. } => WcOpcode::BindMw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cq::Deferred;

    fn rc() -> Qp {
        Qp::new(17, QpType::Rc, 1, QpCaps::default(), None).unwrap()
    }

    #[test]
    fn reset_to_init_requires_pkey_port_access() {
        let mut q = rc();
        let a = QpAttr { qp_state: QpState::Init, ..QpAttr::default() };
        assert_eq!(
            q.modify(&a, AttrMask::STATE | AttrMask::PKEY_INDEX, &mut Deferred),
            Err(ModifyError::MissingAttributes(AttrMask::PORT | AttrMask::ACCESS_FLAGS))
        );
        q.modify(&a, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS, &mut Deferred).unwrap();
        assert_eq!(q.state(), QpState::Init);
    }

    #[test]
    fn init_to_rts_is_invalid_and_extra_bits_rejected() {
        let mut q = rc();
        let a = QpAttr { qp_state: QpState::Init, ..QpAttr::default() };
        q.modify(&a, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS, &mut Deferred).unwrap();
        let a = QpAttr { qp_state: QpState::Rts, ..QpAttr::default() };
        assert!(matches!(q.modify(&a, AttrMask::STATE, &mut Deferred), Err(ModifyError::InvalidTransition { .. })));
        let a = QpAttr { qp_state: QpState::Rtr, ..QpAttr::default() };
        let need = AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        assert_eq!(
            q.modify(&a, AttrMask::STATE | need | AttrMask::SQ_PSN, &mut Deferred),
            Err(ModifyError::InvalidAttributes(AttrMask::SQ_PSN))
        );
        q.modify(&a, AttrMask::STATE | need, &mut Deferred).unwrap();
        let a = QpAttr { qp_state: QpState::Rts, timeout: 32, ..QpAttr::default() };
        let need = AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::SQ_PSN | AttrMask::MAX_QP_RD_ATOMIC;
        assert_eq!(q.modify(&a, AttrMask::STATE | need, &mut Deferred), Err(ModifyError::InvalidValue("timeout > 31")));
        let a = QpAttr { qp_state: QpState::Rts, ..QpAttr::default() };
        q.modify(&a, AttrMask::STATE | need, &mut Deferred).unwrap();
        assert_eq!(q.query().qp_state, QpState::Rts);
    }

    #[test]
    fn ud_transitions() {
        let mut q = Qp::new(5, QpType::Ud, 1, QpCaps::default(), None).unwrap();
        let a = QpAttr { qp_state: QpState::Init, qkey: 0x1111, ..QpAttr::default() };
        q.modify(&a, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY, &mut Deferred).unwrap();
        q.modify(&QpAttr { qp_state: QpState::Rtr, ..a }, AttrMask::STATE, &mut Deferred).unwrap();
        q.modify(&QpAttr { qp_state: QpState::Rts, ..a }, AttrMask::STATE | AttrMask::SQ_PSN, &mut Deferred).unwrap();
        assert_eq!(q.query().qkey, 0x1111);
        q.modify(&QpAttr { qp_state: QpState::Err, ..a }, AttrMask::STATE, &mut Deferred).unwrap();
        q.modify(&QpAttr { qp_state: QpState::Reset, ..a }, AttrMask::STATE, &mut Deferred).unwrap();
        assert_eq!(q.state(), QpState::Reset);
    }

    /// A CQ with room for `room` more completions (what the runtime's shared ring does).
    struct Room(usize, Vec<(CqSide, u64)>);
    impl CompletionSink for Room {
        fn complete(&mut self, side: CqSide, c: &Cqe) -> bool {
            if self.0 == 0 {
                return false;
            }
            self.0 -= 1;
            self.1.push((side, c.wr_id));
            true
        }
    }

    /// A completion the sink refuses stays in the QP, and every later one queues behind it
    /// (even when the sink would take it): the consumer sees them in order once it makes room.
    #[test]
    fn refused_completions_wait_in_order_behind_the_first() {
        let caps = QpCaps { max_send_wr: 4, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
        let mut q = Qp::new(9, QpType::Rc, 1, caps, None).unwrap();
        let a = QpAttr { qp_state: QpState::Init, ..QpAttr::default() };
        q.modify(&a, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS, &mut Deferred).unwrap();
        for i in 0..5 {
            q.post_recv(&crate::wqe::RecvWqe::new(i), &mut Deferred).unwrap();
        }
        assert!(!q.has_output(), "posting completes nothing");
        // Into ERR: five flushed receives, the CQ has room for two.
        let mut cq = Room(2, Vec::new());
        q.modify(&QpAttr { qp_state: QpState::Err, ..a }, AttrMask::STATE, &mut cq).unwrap();
        assert_eq!(cq.1, vec![(CqSide::Recv, 0), (CqSide::Recv, 1)]);
        assert!(q.has_output(), "three kept");
        // A post in ERR completes at once (flushed), but only behind the kept ones.
        cq.0 = 10;
        q.post_recv(&crate::wqe::RecvWqe::new(5), &mut cq).unwrap();
        assert_eq!(cq.1.len(), 2, "a new completion does not overtake kept ones");
        // Room for one more: one moves, the rest stay.
        cq.0 = 1;
        assert!(q.drain_completions(&mut cq), "some still kept");
        cq.0 = 10;
        assert!(!q.drain_completions(&mut cq), "all moved");
        assert_eq!(cq.1.iter().map(|&(_, w)| w).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5]);
        assert!(!q.has_output());
        assert_eq!(q.stats().completions[WcStatus::WrFlushErr as usize], 6, "each counted once, when produced");
    }
}
