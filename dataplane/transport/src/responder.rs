//! Responder: executes incoming requests in PSN order and produces ACKs, NAKs, READ
//! responses and atomic ACKs.
//!
//! Checks, in order (rxe `check_psn` … `execute`, as small functions returning
//! `Result<_, RespError>`): PSN (ahead → one sequence NAK per gap; behind → duplicate), opcode
//! sequence, QP access flags, lengths (C9-92/C9-94), rkey/range (C9-88: zero length skips
//! the lookup), resources (RQ/SRQ → RNR NAK). Class C errors NAK and move the QP to ERR.
//!
//! Duplicates never touch memory (C9-105): SEND/WRITE are re-ACKed; READ is replayed from the
//! resource ring with the rkey checked again per packet; an atomic returns the saved original
//! value.

use std::collections::VecDeque;

use pmrxe_wire::{next_opcode, AethRepr, IcrcCheck, AtomicAckEthRepr, MsgPos, Msn, NakCode, OpKind, Opcode, Psn, Syndrome, TransportHeaders};
use pmrxe_mem::{Access, MemError, Translation};

use crate::cq::{CompletionSink, CqSide, Cqe, WcFlags, WcOpcode, WcStatus};
use crate::memops::{AtomicOp, MemOps};
use crate::packet::RxPacket;
use crate::attr::{QpState, QpType};
use crate::qp::{AsyncEvent, Qp, Transmit};
use crate::builder::{bth, build, Payload};
use crate::srq::Srq;
use crate::timers::Instant;
use crate::wqe::RecvWqe;

/// `IBV_ACCESS_REMOTE_WRITE` etc. in `qp_access_flags`.
const QP_REMOTE_WRITE: u32 = 2;
const QP_REMOTE_READ: u32 = 4;
const QP_REMOTE_ATOMIC: u32 = 8;
/// Bound of the responder output queue.
const OUT_CAP: usize = 256;

/// Responder errors, mapped to the spec in one place ([`RespError::nak`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RespError {
    /// Class C: opcode sequence, unsupported op, length, alignment.
    InvalidRequest,
    /// Class C: rkey/range/access violation.
    RemoteAccess,
    /// Class A: bad receive WQE.
    RemoteOp,
    /// Class B: no receive WQE.
    Rnr,
    /// Class C at the receiver: SEND longer than the receive buffer.
    LocalLength,
    /// Class J: invalid IETH rkey.
    InvalidInvalidate,
}

impl RespError {
    /// The NAK syndrome sent for this error.
    pub fn nak(self, min_rnr_timer: u8) -> Syndrome {
        match self {
            RespError::InvalidRequest | RespError::LocalLength | RespError::InvalidInvalidate => Syndrome::Nak(NakCode::InvalidRequest),
            RespError::RemoteAccess => Syndrome::Nak(NakCode::RemoteAccess),
            RespError::RemoteOp => Syndrome::Nak(NakCode::RemoteOpErr),
            RespError::Rnr => Syndrome::RnrNak { timer: min_rnr_timer },
        }
    }
    /// Status of the receive WQE involved, if any.
    pub fn wc_status(self) -> WcStatus {
        match self {
            RespError::InvalidRequest => WcStatus::RemInvReqErr,
            RespError::RemoteAccess => WcStatus::RemAccessErr,
            RespError::RemoteOp => WcStatus::LocQpOpErr,
            RespError::Rnr => WcStatus::Success,
            // IBTA/HW report LOC_LEN_ERR at the receiver (rxe: REM_INV_REQ_ERR).
            RespError::LocalLength => WcStatus::LocLenErr,
            RespError::InvalidInvalidate => WcStatus::RemInvReqErr,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ResKind {
    Read,
    Atomic,
}

/// A READ/ATOMIC responder resource (ring of `max_dest_rd_atomic`).
#[derive(Clone, Copy, Debug)]
struct Resource {
    kind: ResKind,
    gen: u64,
    first: Psn,
    last: Psn,
    rkey: u32,
    va: u64,
    len: u64,
    orig: u64,
    /// READ of `len > 0`: the window validated for `[va, va + len)`, carried to its response
    /// packets.
    tr: Option<Translation>,
}

#[derive(Clone, Copy, Debug)]
enum Out {
    Ack { psn: Psn, syndrome: Syndrome },
    AtomicAck { psn: Psn, orig: u64 },
    Read { slot: usize, gen: u64, next: Psn, sfirst: Psn },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InMsg {
    None,
    Send,
    /// A WRITE being placed: `[va, va + len)` through `rkey`, `off` bytes so far (the
    /// translation validated at FIRST is `RespState::write_tr`).
    Write { rkey: u32, va: u64, len: u64, off: u64 },
    /// UC: drop until the next FIRST/ONLY.
    Drop,
}

/// Responder state.
#[derive(Debug)]
pub(crate) struct RespState {
    epsn: Psn,
    msn: u32,
    nak_sent: bool,
    in_msg: InMsg,
    /// The window a WRITE's FIRST packet validated, carried across the message's packets
    /// (`pmrxe_mem::Translation`: placed without a lookup while the lcore's reader allows, else
    /// its key is looked up again). Set by every FIRST/ONLY with a length but the ONLY placed by
    /// its one lookup; read only while `in_msg` is the WRITE it was set for.
    write_tr: Option<Translation>,
    /// The SRQ receive WQE a message is filling (taken by copy; a QP's own RQ keeps its
    /// current WQE in its slot, `rq.rs`).
    recv: Option<RecvWqe>,
    recv_off: u64,
    res: Vec<Option<Resource>>,
    res_next: usize,
    gen: u64,
    out: VecDeque<Out>,
    comm_est: bool,
}

impl RespState {
    pub(crate) fn new() -> Self {
        RespState {
            epsn: Psn::new(0),
            msn: 0,
            nak_sent: false,
            in_msg: InMsg::None,
            write_tr: None,
            recv: None,
            recv_off: 0,
            res: vec![None; 1],
            res_next: 0,
            gen: 0,
            out: VecDeque::with_capacity(OUT_CAP),
            comm_est: false,
        }
    }
    pub(crate) fn reset_psn(&mut self, p: Psn) {
        self.epsn = p;
    }
    pub(crate) fn set_resources(&mut self, n: u8) {
        self.res = vec![None; usize::from(n.max(1))];
        self.res_next = 0;
    }
    pub(crate) fn has_output(&self) -> bool {
        !self.out.is_empty()
    }
    /// Entering ERR: only NAKs already queued may still leave.
    pub(crate) fn on_error(&mut self) {
        self.out.retain(|o| matches!(o, Out::Ack { syndrome: Syndrome::Nak(_), .. }));
        self.in_msg = InMsg::None;
    }
    /// The SRQ receive WQE a message was filling, for flushing.
    pub(crate) fn take_current_recv(&mut self) -> Option<RecvWqe> {
        self.recv_off = 0;
        self.recv.take()
    }
    fn push(&mut self, o: Out) {
        if let (Out::Ack { syndrome: Syndrome::Ack { .. }, .. }, Some(Out::Ack { syndrome: Syndrome::Ack { .. }, .. })) = (&o, self.out.back()) {
            // ACK coalescing: a later cumulative ACK replaces a queued one.
            *self.out.back_mut().expect("checked") = o;
            return;
        }
        if self.out.len() < OUT_CAP {
            self.out.push_back(o);
        }
    }
}

/// Outcome of `execute` beyond success: a responder error, or a deferred ICRC check that failed
/// while the payload was placed (the packet is dropped as if never received).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Exec {
    Resp(RespError),
    BadIcrc,
}

impl From<RespError> for Exec {
    fn from(e: RespError) -> Exec {
        Exec::Resp(e)
    }
}

fn mem_to_resp(e: MemError) -> RespError {
    match e {
        MemError::BadAlignment => RespError::InvalidRequest,
        _ => RespError::RemoteAccess,
    }
}

impl Qp {
    /// Header prediction's second half (the first is the receiver's `RxPrediction`): the
    /// common packet of a long WRITE — a WRITE MIDDLE at the expected PSN continuing the
    /// message in progress, with a full PMTU of payload and its ICRC still to check — handled
    /// in one step. Returns false, having changed nothing, for any other packet, or when the
    /// placement refuses (the general path then makes the same attempt and reports it).
    ///
    /// The conditions are those under which the general path (`handle_packet` →
    /// `on_request` → `execute`) takes this packet without error, and the effects are its
    /// effects: the bytes placed through the translation the FIRST validated while the ICRC
    /// is folded (a mismatch counts `icrc_errors` and changes nothing else), the write's
    /// offset and the expected PSN advanced, an ACK queued for AckReq (RC), ECN noted after
    /// the check. `tests/fast_path.rs` runs both paths over the same packet streams.
    #[inline]
    pub(crate) fn write_middle_predicted<M: MemOps + ?Sized>(&mut self, now: Instant, pkt: &RxPacket<'_>, mem: &M) -> bool {
        // RC and UC WRITE MIDDLE share their low five opcode bits: every other packet (an 8 B
        // WRITE's ONLY, an ACK) leaves at this first compare, and the rest is out of line (the
        // small-packet path keeps its code compact).
        pkt.hdr.bth.opcode.0 & 0x1F == Opcode::RC_RDMA_WRITE_MIDDLE.0 && self.fast_paths && self.write_middle_fast(now, pkt, mem)
    }

    /// [`Qp::write_middle_predicted`] past its first compare.
    #[inline(never)]
    fn write_middle_fast<M: MemOps + ?Sized>(&mut self, now: Instant, pkt: &RxPacket<'_>, mem: &M) -> bool {
        let h = &pkt.hdr;
        let want = match self.qp_type {
            QpType::Rc => Opcode::RC_RDMA_WRITE_MIDDLE,
            QpType::Uc => Opcode::UC_RDMA_WRITE_MIDDLE,
            _ => return false,
        };
        // (A write in progress implies communication established: its FIRST set it.)
        let InMsg::Write { rkey, va, len, off } = self.resp.in_msg else { return false };
        let (Some(c), Some(t)) = (pkt.icrc(), self.resp.write_tr.as_ref()) else { return false };
        let data = pkt.payload();
        let plen = data.len() as u64;
        let end = off + plen;
        if h.bth.opcode != want
            || h.bth.psn != self.resp.epsn
            || self.resp.nak_sent
            || !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
            || plen != u64::from(self.mtu())
            || end > len
            || self.attr.qp_access_flags & QP_REMOTE_WRITE == 0
            || !self.is_from_peer(pkt)
        {
            return false;
        }
        let Some(at) = va.checked_add(off) else { return false };
        // (A full-PMTU datagram is longer than `SETTLE_LEN`: its check is never settled at
        // parse, and `matches` would give a settled result anyway.)
        let Ok(crc) = mem.write_carried_crc(t, at, data, c.seed()) else { return false };
        if !c.matches(crc) {
            self.stats.icrc_errors += 1;
            return true;
        }
        self.stats.resp_bytes_written += plen;
        self.stats.rx_fast_path += 1;
        self.resp.in_msg = InMsg::Write { rkey, va, len, off: end };
        let p = h.bth.psn;
        self.resp.epsn = p.wrapping_add(1);
        if h.bth.ack_req && self.qp_type == QpType::Rc {
            self.queue_ack(p);
        }
        self.on_ecn(now, pkt.frame.tclass);
        true
    }

    /// May this packet's ICRC be checked while its payload is placed (rather than before
    /// anything)? Only when every check but the ICRC already passes on state that no earlier
    /// effect of this packet changes, and the payload's destination is fixed by that state:
    /// WRITE MIDDLE/LAST at the expected PSN of a write in progress (its range validated by the
    /// FIRST), and READ response MIDDLE (no AETH; offset from the requester's own count into
    /// the READ's local buffer). Everything else — FIRST/ONLY (RETH or receive WQE chosen by the
    /// packet), SEND (bytes past a message's end stay untouched), acknowledgements, atomics,
    /// UD — is verified first.
    pub(crate) fn may_place_before_icrc(&self, info: &pmrxe_wire::OpInfo, pkt: &RxPacket<'_>) -> bool {
        if pkt.payload().is_empty() || !matches!(info.pos, MsgPos::Middle | MsgPos::Last) {
            return false;
        }
        match info.kind {
            OpKind::Write => {
                matches!(self.qp_type, QpType::Rc | QpType::Uc)
                    && matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
                    && self.resp.comm_est
                    && matches!(self.resp.in_msg, InMsg::Write { .. })
                    && pkt.hdr.bth.psn == self.resp.epsn
            }
            OpKind::ReadResponse => {
                info.pos == MsgPos::Middle && self.qp_type == QpType::Rc && matches!(self.state, QpState::Rts | QpState::Sqd)
            }
            _ => false,
        }
    }

    /// The request half of `handle_packet` (after the ICRC gate); returns false if a deferred
    /// ICRC check failed (the packet then had no effect).
    pub(crate) fn on_request_packet<M: MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, pkt: &RxPacket<'_>, mem: &M, srq: Option<&mut Srq>, deferred: Option<IcrcCheck>, cq: &mut C) -> bool {
        match self.state {
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe => {}
            _ => {
                // Never execute after ERR (rxe problem 14), nor before RTR.
                self.stats.dropped += 1;
                return true;
            }
        }
        if !self.resp.comm_est {
            self.resp.comm_est = true;
            if self.state == QpState::Rtr {
                self.events.push_back(AsyncEvent::CommEstablished);
            }
        }
        if self.qp_type == QpType::Ud {
            self.on_ud_request(pkt, mem, srq, cq);
            true
        } else {
            self.on_request(pkt, mem, srq, deferred, cq)
        }
    }

    fn on_ud_request<M: MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, pkt: &RxPacket<'_>, mem: &M, srq: Option<&mut Srq>, cq: &mut C) {
        let Some(deth) = pkt.hdr.deth else { return };
        if deth.qkey != self.attr.qkey || pkt.payload().len() > self.mtu() as usize {
            self.stats.dropped += 1;
            return;
        }
        if !self.start_recv(srq) {
            self.stats.dropped += 1;
            return;
        }
        let grh = pkt.grh();
        let total = 40 + pkt.payload().len() as u64;
        let (wr_id, status) = {
            let wqe = self.cur_recv().expect("started");
            let st = if total > wqe.capacity() {
                WcStatus::LocLenErr
            } else if mem.scatter(self.pd, self.qpn, wqe.sg_list(), 0, &grh).is_err() || mem.scatter(self.pd, self.qpn, wqe.sg_list(), 40, pkt.payload()).is_err() {
                WcStatus::LocProtErr
            } else {
                WcStatus::Success
            };
            (wqe.wr_id, st)
        };
        self.end_recv();
        let mut c = Cqe::new(wr_id, status, WcOpcode::Recv, self.qpn);
        c.byte_len = total as u32;
        c.src_qp = deth.src_qp.value();
        c.grh_present = true;
        c.wc_flags = WcFlags::GRH;
        if let Some(i) = pkt.hdr.imm {
            c.imm_data = Some(i);
            c.wc_flags |= WcFlags::WITH_IMM;
        }
        self.stats.resp_bytes_written += pkt.payload().len() as u64;
        self.stats.completion(c.status);
        self.complete(cq, CqSide::Recv, c);
    }

    /// Take the next receive WQE as the current one (a no-op returning true if one is
    /// current): from the QP's RQ, where it stays in its slot, or a copy from the SRQ. False if
    /// there is none.
    fn start_recv(&mut self, srq: Option<&mut Srq>) -> bool {
        if self.cur_recv().is_some() {
            return true;
        }
        match (self.srq, srq) {
            (Some(n), Some(s)) => {
                let Some((w, fire)) = s.take() else { return false };
                if fire {
                    self.events.push_back(AsyncEvent::SrqLimitReached { srqn: n });
                }
                self.resp.recv = Some(w);
                true
            }
            (Some(_), None) => false,
            _ => self.rq.start(),
        }
    }

    /// The receive WQE a message is filling.
    fn cur_recv(&self) -> Option<&RecvWqe> {
        match self.srq {
            Some(_) => self.resp.recv.as_ref(),
            None => self.rq.current(),
        }
    }

    /// The current receive WQE completed: release it.
    fn end_recv(&mut self) {
        match self.srq {
            Some(_) => self.resp.recv = None,
            None => {
                self.rq.finish();
            }
        }
        self.resp.recv_off = 0;
    }

    fn has_recv(&self, srq: &Option<&mut Srq>) -> bool {
        match self.srq {
            Some(_) => srq.as_ref().is_some_and(|s| !s.is_empty()),
            None => self.rq.has_next(),
        }
    }

    fn queue_ack(&mut self, psn: Psn) {
        self.resp.push(Out::Ack { psn, syndrome: Syndrome::ACK_UNLIMITED });
    }

    /// Returns false if a deferred ICRC check failed: the packet then changed nothing (the
    /// bytes it placed lie in the range the rest of the message rewrites).
    fn on_request<M: MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, pkt: &RxPacket<'_>, mem: &M, mut srq: Option<&mut Srq>, deferred: Option<IcrcCheck>, cq: &mut C) -> bool {
        let h = &pkt.hdr;
        let info = h.bth.opcode.info().expect("checked by caller");
        let p = h.bth.psn;
        let rc = self.qp_type == QpType::Rc;
        let d = p.distance(self.resp.epsn);
        let mut nak_sent = self.resp.nak_sent;
        if rc {
            if d > 0 {
                self.stats.out_of_sequence += 1;
                if !self.resp.nak_sent {
                    // Class B: one PSN sequence NAK per gap.
                    self.resp.nak_sent = true;
                    self.stats.seq_naks_sent += 1;
                    let e = self.resp.epsn;
                    self.resp.push(Out::Ack { psn: e, syndrome: Syndrome::Nak(NakCode::PsnSeqErr) });
                }
                return true;
            }
            if d < 0 {
                self.on_duplicate(pkt);
                return true;
            }
            // (A deferred check only reaches here at d == 0: the flag is set back below if it
            // fails.)
            nak_sent = std::mem::replace(&mut self.resp.nak_sent, false);
        } else if d != 0 || self.resp.in_msg == InMsg::Drop {
            // UC: a gap drops the rest of the current message (IBA 9.8.3).
            if info.pos.is_start() {
                self.resp.in_msg = InMsg::None;
                self.resp.recv_off = 0;
            } else {
                self.resp.in_msg = InMsg::Drop;
                self.resp.epsn = p.wrapping_add(1);
                self.stats.dropped += 1;
                return true;
            }
            self.resp.epsn = p;
        }
        let r = match self.execute(pkt, mem, &mut srq, deferred, cq) {
            Ok(()) => Ok(()),
            // Under a deferred check, an error acts on the packet only once the check passed
            // (a second pass, on error paths only).
            Err(Exec::Resp(_)) if deferred.is_some_and(|c| !c.verify(pkt.payload())) => Err(Exec::BadIcrc),
            Err(e) => Err(e),
        };
        let r = match r {
            Ok(()) => Ok(()),
            Err(Exec::BadIcrc) => {
                self.resp.nak_sent = nak_sent;
                return false;
            }
            Err(Exec::Resp(e)) => Err(e),
        };
        match r {
            Ok(()) => {}
            Err(RespError::Rnr) => {
                if rc {
                    self.stats.rnr_naks_sent += 1;
                    let t = self.attr.min_rnr_timer;
                    self.resp.push(Out::Ack { psn: p, syndrome: Syndrome::RnrNak { timer: t } });
                } else {
                    self.resp.in_msg = InMsg::Drop;
                    self.resp.epsn = p.wrapping_add(1);
                    self.stats.dropped += 1;
                }
            }
            Err(e) => {
                if matches!(e, RespError::RemoteAccess) {
                    self.stats.rkey_violations += 1;
                }
                if !rc {
                    // UC (class D/E): drop the message silently.
                    self.resp.in_msg = InMsg::Drop;
                    self.resp.epsn = p.wrapping_add(1);
                    self.stats.dropped += 1;
                    return true;
                }
                // Class C/J: report on the receive WQE if one is involved, NAK, QP → ERR.
                match self.cur_recv().map(|w| w.wr_id) {
                    Some(wr_id) => {
                        self.end_recv();
                        let st = e.wc_status();
                        self.stats.completion(st);
                        self.complete(cq, CqSide::Recv, Cqe::new(wr_id, st, WcOpcode::Recv, self.qpn));
                    }
                    None => self.events.push_back(match e {
                        RespError::RemoteAccess => AsyncEvent::QpAccessError,
                        _ => AsyncEvent::QpRequestError,
                    }),
                }
                self.enter_error(cq);
                self.stats.err_naks_sent += 1;
                let t = self.attr.min_rnr_timer;
                self.resp.push(Out::Ack { psn: p, syndrome: e.nak(t) });
            }
        }
        true
    }

    /// Execute the in-sequence request packet `pkt`. With a `deferred` ICRC check (only for the
    /// packets `may_place_before_icrc` admits) the payload is placed while checked, and a
    /// mismatch returns `Exec::BadIcrc` before any other state changed.
    fn execute<M: MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, pkt: &RxPacket<'_>, mem: &M, srq: &mut Option<&mut Srq>, deferred: Option<IcrcCheck>, cq: &mut C) -> Result<(), Exec> {
        let h = &pkt.hdr;
        let info = h.bth.opcode.info().expect("checked");
        let p = h.bth.psn;
        let mtu = self.mtu() as usize;
        let plen = pkt.payload().len();
        let rc = self.qp_type == QpType::Rc;
        // Opcode sequence (C9-90/91).
        let seq_ok = match (self.resp.in_msg, info.kind) {
            (InMsg::None | InMsg::Drop, _) => info.pos.is_start(),
            (InMsg::Send, OpKind::Send) | (InMsg::Write { .. }, OpKind::Write) => !info.pos.is_start(),
            _ => false,
        };
        if !seq_ok {
            return Err(RespError::InvalidRequest.into());
        }
        // QP access flags.
        let need = match info.kind {
            OpKind::Write => QP_REMOTE_WRITE,
            OpKind::ReadRequest => QP_REMOTE_READ,
            OpKind::CompareSwap | OpKind::FetchAdd => QP_REMOTE_ATOMIC,
            _ => 0,
        };
        if self.attr.qp_access_flags & need != need {
            return Err(RespError::InvalidRequest.into());
        }
        // C9-92: FIRST/MIDDLE carry exactly one PMTU, LAST 1..=PMTU, ONLY ≤ PMTU.
        if info.has_payload() {
            let ok = match info.pos {
                MsgPos::First | MsgPos::Middle => plen == mtu,
                MsgPos::Last => plen >= 1 && plen <= mtu,
                MsgPos::Only => plen <= mtu,
            };
            if !ok {
                return Err(RespError::InvalidRequest.into());
            }
        }
        let ack_req = h.bth.ack_req && rc;
        match info.kind {
            OpKind::Send => {
                if info.pos.is_start() {
                    // The WQE a dropped UC message left current, else the next one: none is RNR.
                    if !self.start_recv(srq.as_deref_mut()) {
                        return Err(RespError::Rnr.into());
                    }
                    self.resp.recv_off = 0;
                }
                // Read in place (RQ slot or the SRQ's copy): no copy of the WQE per packet.
                let wr_id = {
                    let Some(w) = self.cur_recv() else { return Err(RespError::InvalidRequest.into()) };
                    if self.resp.recv_off + plen as u64 > w.capacity() {
                        return Err(RespError::LocalLength.into());
                    }
                    if plen > 0 && mem.scatter(self.pd, self.qpn, w.sg_list(), self.resp.recv_off, pkt.payload()).is_err() {
                        return Err(RespError::RemoteOp.into());
                    }
                    w.wr_id
                };
                self.stats.resp_bytes_written += plen as u64;
                self.resp.recv_off += plen as u64;
                if info.pos.is_end() {
                    let mut c = Cqe::new(wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
                    c.byte_len = self.resp.recv_off as u32;
                    if let Some(i) = h.imm {
                        c.imm_data = Some(i);
                        c.wc_flags |= WcFlags::WITH_IMM;
                    }
                    if let Some(k) = h.ieth {
                        // IBA 9.4.1.1.1 / rxe: place, then invalidate (class J on failure).
                        if mem.invalidate_remote(self.pd, self.qpn, k).is_err() {
                            return Err(RespError::InvalidInvalidate.into());
                        }
                        c.invalidated_rkey = Some(k);
                        c.wc_flags |= WcFlags::WITH_INV;
                    }
                    self.end_recv();
                    self.resp.in_msg = InMsg::None;
                    self.resp.msn = self.resp.msn.wrapping_add(1);
                    self.stats.completion(WcStatus::Success);
                    self.complete(cq, CqSide::Recv, c);
                } else {
                    self.resp.in_msg = InMsg::Send;
                }
            }
            OpKind::Write => {
                let mut placed_whole = false;
                if info.pos.is_start() {
                    let r = h.reth.ok_or(RespError::InvalidRequest)?;
                    let len = u64::from(r.len);
                    if len > 1 << 31 {
                        return Err(RespError::InvalidRequest.into()); // C9-94
                    }
                    // A WRITE ONLY without immediate whose payload is the whole message: the
                    // placement below validates exactly [va, va + len) with the same access
                    // (one MR lookup instead of two). Anything else is checked here first.
                    placed_whole = info.pos == MsgPos::Only && !info.imm && plen as u64 == len;
                    if len > 0 && !placed_whole {
                        self.resp.write_tr = Some(mem.check_remote(self.pd, self.qpn, r.rkey, r.va, len, Access::REMOTE_WRITE).map_err(mem_to_resp)?);
                    }
                    self.resp.in_msg = InMsg::Write { rkey: r.rkey, va: r.va, len, off: 0 };
                }
                let InMsg::Write { rkey, va, len, off } = self.resp.in_msg else { return Err(RespError::InvalidRequest.into()) };
                let end = off + plen as u64;
                if end > len || (info.pos.is_end() && end != len) {
                    return Err(RespError::InvalidRequest.into());
                }
                if info.pos.is_end() && info.imm && !self.has_recv(srq) && self.cur_recv().is_none() {
                    // WRITE with immediate consumes a receive WQE: check before writing.
                    return Err(RespError::Rnr.into());
                }
                if plen > 0 {
                    let at = va.checked_add(off).ok_or(RespError::RemoteAccess)?;
                    let data = pkt.payload();
                    let crc = if placed_whole {
                        // Verified before placing (an ONLY's RETH is untrusted).
                        match deferred {
                            None => mem.write_remote(self.pd, self.qpn, rkey, at, data).map(|()| None),
                            Some(c) => mem.write_remote_crc(self.pd, self.qpn, rkey, at, data, c.seed()).map(|crc| Some((c, crc))),
                        }
                    } else {
                        // Every other packet continues the window its FIRST validated (set
                        // above: `len > 0` whenever there is payload).
                        let t = self.resp.write_tr.as_ref().ok_or(RespError::InvalidRequest)?;
                        match deferred {
                            None => mem.write_carried(t, at, data).map(|()| None),
                            Some(c) => mem.write_carried_crc(t, at, data, c.seed()).map(|crc| Some((c, crc))),
                        }
                    };
                    // Verified while placing: the bytes land in [va + off, va + end), inside the
                    // range validated at FIRST that the message's remaining packets
                    // (retransmissions included) rewrite, so a mismatch changes nothing the
                    // consumer may rely on (docs/reliability.md, "ICRC and placement").
                    if let Some((c, crc)) = crc.map_err(mem_to_resp)? {
                        if !c.matches(crc) {
                            return Err(Exec::BadIcrc);
                        }
                    }
                    self.stats.resp_bytes_written += plen as u64;
                }
                if info.pos.is_end() {
                    self.resp.in_msg = InMsg::None;
                    self.resp.msn = self.resp.msn.wrapping_add(1);
                    if info.imm {
                        if !self.start_recv(srq.as_deref_mut()) {
                            return Err(RespError::Rnr.into());
                        }
                        let wr_id = self.cur_recv().expect("started").wr_id;
                        self.end_recv();
                        let mut c = Cqe::new(wr_id, WcStatus::Success, WcOpcode::RecvRdmaWithImm, self.qpn);
                        c.byte_len = len as u32;
                        c.imm_data = h.imm;
                        c.wc_flags |= WcFlags::WITH_IMM;
                        self.stats.completion(WcStatus::Success);
                        self.complete(cq, CqSide::Recv, c);
                    }
                } else {
                    self.resp.in_msg = InMsg::Write { rkey, va, len, off: end };
                }
            }
            OpKind::ReadRequest => {
                let r = h.reth.ok_or(RespError::InvalidRequest)?;
                let len = u64::from(r.len);
                if len > 1 << 31 || self.attr.max_dest_rd_atomic == 0 {
                    return Err(RespError::InvalidRequest.into());
                }
                let tr = if len > 0 {
                    Some(mem.check_remote(self.pd, self.qpn, r.rkey, r.va, len, Access::REMOTE_READ).map_err(mem_to_resp)?)
                } else {
                    None
                };
                let npkts = (len.div_ceil(mtu as u64) as u32).max(1);
                let slot = self.alloc_res(Resource {
                    kind: ResKind::Read,
                    gen: 0,
                    first: p,
                    last: p.wrapping_add(npkts - 1),
                    rkey: r.rkey,
                    va: r.va,
                    len,
                    orig: 0,
                    tr,
                });
                let gen = self.resp.res[slot].as_ref().map_or(0, |r| r.gen);
                self.resp.push(Out::Read { slot, gen, next: p, sfirst: p });
                self.resp.msn = self.resp.msn.wrapping_add(1);
                self.resp.epsn = p.wrapping_add(npkts);
                return Ok(());
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                let a = h.atomic_eth.ok_or(RespError::InvalidRequest)?;
                if self.attr.max_dest_rd_atomic == 0 || a.va & 7 != 0 {
                    return Err(RespError::InvalidRequest.into()); // E11
                }
                let op = if info.kind == OpKind::CompareSwap {
                    AtomicOp::CmpSwap { compare: a.compare, swap: a.swap_add }
                } else {
                    AtomicOp::FetchAdd { add: a.swap_add }
                };
                let orig = mem.atomic_remote(self.pd, self.qpn, a.rkey, a.va, op).map_err(mem_to_resp)?;
                self.stats.resp_bytes_written += 8;
                self.alloc_res(Resource { kind: ResKind::Atomic, gen: 0, first: p, last: p, rkey: a.rkey, va: a.va, len: 8, orig, tr: None });
                self.resp.push(Out::AtomicAck { psn: p, orig });
                self.resp.msn = self.resp.msn.wrapping_add(1);
                self.resp.epsn = p.wrapping_add(1);
                return Ok(());
            }
            _ => return Err(RespError::InvalidRequest.into()),
        }
        self.resp.epsn = p.wrapping_add(1);
        if ack_req {
            self.queue_ack(p);
        }
        Ok(())
    }

    fn alloc_res(&mut self, mut r: Resource) -> usize {
        let n = self.resp.res.len();
        let slot = self.resp.res_next % n;
        self.resp.res_next = (slot + 1) % n;
        self.resp.gen += 1;
        r.gen = self.resp.gen;
        // Drop any queued response stream of the slot being reused.
        self.resp.out.retain(|o| !matches!(o, Out::Read { slot: s, .. } if *s == slot));
        self.resp.res[slot] = Some(r);
        slot
    }

    fn on_duplicate(&mut self, pkt: &RxPacket<'_>) {
        let h = &pkt.hdr;
        let info = h.bth.opcode.info().expect("checked");
        let p = h.bth.psn;
        self.stats.duplicates += 1;
        match info.kind {
            OpKind::Send | OpKind::Write => {
                // C9-105: re-ACK, never re-execute.
                let a = self.resp.epsn.wrapping_sub(1);
                if h.bth.ack_req {
                    self.queue_ack(a);
                }
            }
            OpKind::ReadRequest => {
                let Some(r) = h.reth else { return };
                let mtu = u64::from(self.mtu());
                let found = self.resp.res.iter().enumerate().find_map(|(i, s)| match s {
                    Some(res) if res.kind == ResKind::Read && p.distance(res.first) >= 0 && p.distance(res.last) <= 0 => Some((i, *res)),
                    _ => None,
                });
                let Some((slot, res)) = found else {
                    self.stats.dropped += 1;
                    return;
                };
                // Must be the original request or a subset of it starting at p.
                let skip = p.distance(res.first) as u64 * mtu;
                if r.rkey != res.rkey || r.va != res.va.wrapping_add(skip) || u64::from(r.len) > res.len.saturating_sub(skip) {
                    self.stats.dropped += 1;
                    return;
                }
                self.resp.out.retain(|o| !matches!(o, Out::Read { slot: s, .. } if *s == slot));
                self.stats.read_replays += 1;
                self.resp.push(Out::Read { slot, gen: res.gen, next: p, sfirst: p });
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                let found = self.resp.res.iter().flatten().find(|r| r.kind == ResKind::Atomic && r.first == p).copied();
                match found {
                    Some(r) => {
                        self.stats.atomic_replays += 1;
                        self.resp.push(Out::AtomicAck { psn: p, orig: r.orig });
                    }
                    None => self.stats.dropped += 1,
                }
            }
            _ => {}
        }
    }

    /// Responder half of `poll_transmit`.
    pub(crate) fn poll_response<M: MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, mem: &M, buf: &mut [u8], cq: &mut C) -> Option<Transmit> {
        loop {
            let o = *self.resp.out.front()?;
            let dest = self.attr.dest_qp_num.value();
            let msn = Msn::new(self.resp.msn);
            let me = self.qpn;
            let tx = |(len, tail_crc)| Transmit { len, av: None, dest_qpn: dest, src_qpn: me, tail_crc };
            match o {
                Out::Ack { psn, syndrome } => {
                    self.resp.out.pop_front();
                    let mut hdr = TransportHeaders::new(bth(Opcode::RC_ACKNOWLEDGE, dest, psn));
                    hdr.aeth = Some(AethRepr { syndrome, msn });
                    let len = build(mem, self.pd, self.qpn, hdr, Payload::None, buf).ok()??;
                    self.stats.acks_sent += 1;
                    return Some(tx(len));
                }
                Out::AtomicAck { psn, orig } => {
                    self.resp.out.pop_front();
                    if self.state == QpState::Err {
                        continue;
                    }
                    let mut hdr = TransportHeaders::new(bth(Opcode::RC_ATOMIC_ACKNOWLEDGE, dest, psn));
                    hdr.aeth = Some(AethRepr { syndrome: Syndrome::ACK_UNLIMITED, msn });
                    hdr.atomic_ack = Some(AtomicAckEthRepr { orig });
                    let len = build(mem, self.pd, self.qpn, hdr, Payload::None, buf).ok()??;
                    self.stats.acks_sent += 1;
                    return Some(tx(len));
                }
                Out::Read { slot, gen, next, sfirst } => {
                    // By reference: the resource (with its carried translation) is not copied
                    // per response packet.
                    let res = match self.resp.res.get(slot).and_then(Option::as_ref) {
                        Some(r) if r.gen == gen && self.state != QpState::Err => r,
                        _ => {
                            self.resp.out.pop_front();
                            continue;
                        }
                    };
                    let mtu = u64::from(self.mtu());
                    let off = next.distance(res.first) as u64 * mtu;
                    let plen = res.len.saturating_sub(off).min(mtu) as usize;
                    let pos = match (next == sfirst, next == res.last) {
                        (true, true) => MsgPos::Only,
                        (true, false) => MsgPos::First,
                        (false, true) => MsgPos::Last,
                        (false, false) => MsgPos::Middle,
                    };
                    let opc = next_opcode(pmrxe_wire::QpType::Rc, OpKind::ReadResponse, pos, false, false)?;
                    let mut hdr = TransportHeaders::new(bth(opc, dest, next));
                    if pos != MsgPos::Middle {
                        hdr.aeth = Some(AethRepr { syndrome: Syndrome::ACK_UNLIMITED, msn });
                    }
                    let payload = match &res.tr {
                        Some(tr) if plen > 0 => Payload::Remote { tr, va: res.va.wrapping_add(off), len: plen },
                        _ => Payload::None,
                    };
                    match build(mem, self.pd, self.qpn, hdr, payload, buf) {
                        Ok(Some(built)) => {
                            if next == res.last {
                                self.resp.out.pop_front();
                            } else if let Some(Out::Read { next: n, .. }) = self.resp.out.front_mut() {
                                *n = next.wrapping_add(1);
                            }
                            self.stats.read_responses_sent += 1;
                            return Some(tx(built));
                        }
                        Ok(None) => return None,
                        Err(_) => {
                            // rkey recheck failed mid-stream (invalidate/dereg): NAK 0x62 at this
                            // PSN, class C (§2.9 item 7, E12).
                            self.stats.rkey_violations += 1;
                            self.stats.err_naks_sent += 1;
                            self.events.push_back(AsyncEvent::QpAccessError);
                            self.enter_error(cq);
                            self.resp.out.clear();
                            let mut hdr = TransportHeaders::new(bth(Opcode::RC_ACKNOWLEDGE, dest, next));
                            hdr.aeth = Some(AethRepr { syndrome: Syndrome::Nak(NakCode::RemoteAccess), msn });
                            let len = build(mem, self.pd, self.qpn, hdr, Payload::None, buf).ok()??;
                            return Some(tx(len));
                        }
                    }
                }
            }
        }
    }
}
