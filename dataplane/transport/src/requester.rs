//! Requester: walks the SQ in order and turns WQEs into request packets.
//!
//! Two cursors (DESIGN.md invariant 2): `net_cursor` is the next WQE to (re)transmit and is
//! rewound by go-back-N; `exec_cursor` is one past the last WQE whose first transmission /
//! local execution has happened and never goes back. A local operation below `exec_cursor`
//! is skipped on replay, so REG_MR / LOCAL_INV / BIND_MW execute exactly once.
//!
//! Gating, checked only when a WQE *starts* (first transmission):
//! * LOCAL_INV waits until every earlier WQE has completed (mandatory Local Invalidate Fence,
//!   IBA 10.6.5.1 as rxe/mlx4 SO implement it);
//! * IBV_SEND_FENCE waits until every earlier READ/ATOMIC has its data placed (IBA 10.8.3.3;
//!   the rd_atomic in-flight count reaches zero only when the completer placed the data);
//! * READ/ATOMIC need one of `max_rd_atomic` credits;
//! * at most [`MAX_UNACKED_PSNS`] PSNs outstanding (RC);
//! * SQD: no new WQE starts.
//!
//! Packets are a pure function of (WQE, packet index): the gather offset is
//! `index × PMTU`, so a retransmission rebuilds exactly the packet (rxe problem 8).

use pmrxe_crc::CrcShift;
use pmrxe_mem::Translation;
use pmrxe_wire::{bth as wire_bth, next_opcode, AtomicEthRepr, DethRepr, MsgPos, OpKind, Psn, Qpn, RethRepr, TransportHeaders};

use crate::builder::{bth, build, Payload};
use crate::cq::{CompletionSink, WcStatus};
use crate::memops::MemOps;
use crate::attr::{QpState, QpType, PRIVILEGED_QKEY_BIT};
use crate::qp::{Qp, Transmit};
use crate::timers::{local_ack_timeout_ns, Instant, Timer};
use crate::wqe::{SendFlags, SendOp};

/// Outstanding PSN window (rxe `RXE_MAX_UNACKED_PSNS`).
pub const MAX_UNACKED_PSNS: i32 = 128;
/// Request an ACK at least every this many packets of a long message (rxe
/// `RXE_MAX_PKT_PER_ACK`).
pub const MAX_PKT_PER_ACK: u32 = 64;
/// Bytes a packet adds on the wire beyond `Transmit::len` (Ethernet 14 + IPv4 20 + UDP 8 + ICRC
/// 4 + FCS 4 + preamble/SFD 8 + inter-frame gap 12): what the DCQCN pacer charges per packet.
pub const WIRE_OVERHEAD: usize = 70;

/// Requester state.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReqState {
    /// Next WQE (absolute SQ index) to transmit.
    net_cursor: u64,
    /// One past the last WQE that has started (local ops: executed). Never decreases.
    exec_cursor: u64,
    /// PSN for the next WQE that starts.
    next_psn: Psn,
    /// One past the highest PSN transmitted so far (to tell retransmissions apart).
    max_sent: Psn,
    /// READ/ATOMIC WQEs started whose data is not placed yet.
    rd_atomic_inflight: u32,
    /// A WQE at this index failed: start nothing at or after it.
    stop_at: Option<u64>,
    /// Packets sent since the last AckReq.
    noack_pkts: u32,
}

/// Transmit header prediction's state: the source range of the WQE whose MIDDLE packets
/// [`Qp::transmit_middle`] builds, and the translation of its lkey, looked up once for the
/// whole range instead of once per packet. Keyed by the WQE's absolute index, which no other
/// WQE of the QP has (a reset, which starts the indices again, clears it with the rest of the
/// QP's state). A field of the QP of its own (`Qp::tx_stream`), not of [`ReqState`]:
/// there its hundred bytes pushed the state every packet reads onto more cache lines, and 8 B
/// SENDs, which never use it, ran 2 % slower.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TxStream {
    /// The WQE (absolute index); `u64::MAX`: none.
    idx: u64,
    /// The payload length of its MIDDLE packets (the PMTU), and the CRC shift that appends
    /// that many bytes to the BTH's CRC.
    plen: usize,
    shift: CrcShift,
    /// `None`: the range did not validate as a whole; the general path gathers packet by
    /// packet and reports the error at the packet that meets it.
    tr: Option<Translation>,
}

impl TxStream {
    /// For no WQE.
    pub(crate) fn none() -> TxStream {
        TxStream { idx: u64::MAX, plen: 0, shift: CrcShift::new(0), tr: None }
    }
}

/// What the other roles may ask of the requester's state. Only this module writes its fields;
/// the completer and the QP's queue management change it through these calls.
impl ReqState {
    pub(crate) fn reset_psn(&mut self, p: Psn) {
        self.next_psn = p;
        self.max_sent = p;
    }
    /// PSN the next WQE starts at.
    pub(crate) fn next_psn(&self) -> Psn {
        self.next_psn
    }
    /// One past the highest PSN transmitted.
    pub(crate) fn max_sent(&self) -> Psn {
        self.max_sent
    }
    /// Next WQE (absolute SQ index) to transmit.
    pub(crate) fn net_cursor(&self) -> u64 {
        self.net_cursor
    }
    /// Do READ/atomic WQEs hold credits (so an ACK must look for a READ still missing data)?
    pub(crate) fn rd_atomic_outstanding(&self) -> bool {
        self.rd_atomic_inflight > 0
    }
    /// A READ/atomic WQE finished or was flushed: its credit comes back.
    pub(crate) fn release_rd_atomic(&mut self) {
        self.rd_atomic_inflight = self.rd_atomic_inflight.saturating_sub(1);
    }
    /// Does the RC packet at `psn` ask for an ACK (`acked`: the completer's next expected
    /// PSN; `window`: the PSN window now)? `last`: it ends its message (or is a READ or atomic
    /// request, which always asks). Counts the packets since the last AckReq.
    fn wants_ack(&mut self, psn: Psn, acked: Psn, window: i32, last: bool) -> bool {
        self.noack_pkts += 1;
        // In back-off the probe window ends mid-message: its last packet asks for the ACK
        // that ends the back-off.
        let probe_end = window < MAX_UNACKED_PSNS && psn.wrapping_add(1).distance(acked) >= window;
        let ask = last || self.noack_pkts >= MAX_PKT_PER_ACK || probe_end;
        if ask {
            self.noack_pkts = 0;
        }
        ask
    }
    /// Go-back-N (completer): transmit again from WQE `idx`.
    pub(crate) fn rewind_to(&mut self, idx: u64) {
        self.net_cursor = idx;
        self.noack_pkts = 0;
    }
    /// The WQE at `idx` failed: start nothing at or after it.
    pub(crate) fn stop_before(&mut self, idx: u64) {
        self.stop_at = Some(self.stop_at.map_or(idx, |s| s.min(idx)));
    }
    /// WQEs below `head` retired (a cumulative ACK may pass the rewound cursor).
    pub(crate) fn retired_to(&mut self, head: u64) {
        self.net_cursor = self.net_cursor.max(head);
    }
    /// Every WQE below `head` was flushed: nothing of them is sent or executed again.
    pub(crate) fn flushed_to(&mut self, head: u64) {
        self.net_cursor = head;
        self.exec_cursor = self.exec_cursor.max(head);
    }
}

impl Qp {
    /// Requester half of `poll_transmit`.
    pub(crate) fn poll_request<M: MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, now: Instant, mem: &M, buf: &mut [u8], cq: &mut C) -> Option<Transmit> {
        loop {
            if !matches!(self.state, QpState::Rts | QpState::Sqd) {
                return None;
            }
            if self.timers.get(Timer::RnrWait).is_some() {
                return None;
            }
            // DCQCN pacer: nothing leaves before the next departure time (the Pacing timer
            // carries it to poll_timeout; wants_transmit is false meanwhile).
            if let Some(at) = self.dcqcn.as_ref().and_then(|d| d.next_send()) {
                if at > now {
                    self.timers.set(Timer::Pacing, at);
                    return None;
                }
            }
            self.timers.stop(Timer::Pacing);
            let idx = self.req.net_cursor;
            if idx >= self.sq_end() {
                return None;
            }
            if self.req.stop_at.is_some_and(|s| idx >= s) {
                return None;
            }
            let first_time = idx >= self.req.exec_cursor;
            // The few fields the walk needs, not a copy of the whole entry (SGEs, inline data).
            let (op, flags, done, len) = {
                let e = self.entry(idx);
                (e.op, e.flags, e.done, e.len)
            };
            if op.is_local() {
                if !first_time {
                    // Replay: the local effect is already applied (execution cursor ahead).
                    self.stats.local_op_replay_skips += 1;
                    self.req.net_cursor += 1;
                    continue;
                }
                if self.state == QpState::Sqd {
                    return None;
                }
                if matches!(op, SendOp::LocalInv { .. }) && idx != self.sq.head() {
                    // Mandatory LIF: every earlier WQE must have completed.
                    return None;
                }
                if flags.contains(SendFlags::FENCE) && self.req.rd_atomic_inflight > 0 {
                    return None;
                }
                if done.is_some() {
                    // Would be a second execution: never happens by construction; counted.
                    self.stats.local_op_reexecutions += 1;
                }
                let st = self.execute_local(mem, &op);
                self.req.exec_cursor = idx + 1;
                self.req.net_cursor = idx + 1;
                self.finish_wqe(idx, st);
                self.retire(cq);
                continue;
            }
            if done.is_some() {
                // UC/UD already completed at last transmission.
                self.req.net_cursor += 1;
                continue;
            }
            // A later packet of a started WQE may be a MIDDLE one: the fast path's. (A small
            // message's only packet is its first; retransmitted, it leaves at the first check.)
            if !first_time && self.fast_paths {
                if let Some(t) = self.transmit_middle(now, mem, idx, buf, cq) {
                    return t;
                }
            }
            if first_time {
                if self.state == QpState::Sqd {
                    return None;
                }
                if flags.contains(SendFlags::FENCE) && self.req.rd_atomic_inflight > 0 {
                    return None;
                }
                if op.is_rd_atomic() && self.req.rd_atomic_inflight >= u32::from(self.attr.max_rd_atomic.max(1)) {
                    return None;
                }
                if self.qp_type == QpType::Rc && self.req.next_psn.distance(self.comp.psn()) >= self.unacked_window() {
                    return None;
                }
                if self.qp_type == QpType::Ud && len > u64::from(self.mtu()) {
                    // C10-93.1.1: a UD message over the (port) MTU emits no packet. rxe then
                    // fakes SUCCESS (C10-93.1.1 asks for no error), which hides the loss from
                    // the consumer; we complete it with LOC_LEN_ERR instead (issue 13), and as
                    // after every send error the QP goes to ERR.
                    self.req.exec_cursor = idx + 1;
                    self.req.net_cursor = idx + 1;
                    let e = self.entry_mut(idx);
                    e.started = true;
                    self.finish_wqe(idx, WcStatus::LocLenErr);
                    self.retire(cq);
                    continue;
                }
                let p = self.req.next_psn;
                let credit = op.is_rd_atomic();
                let en = self.entry_mut(idx);
                en.started = true;
                en.first_psn = p;
                en.credit = credit;
                let npsn = en.npsn;
                if credit {
                    self.req.rd_atomic_inflight += 1;
                }
                self.req.next_psn = p.wrapping_add(npsn);
                self.req.exec_cursor = idx + 1;
            }
            return self.transmit_wqe(now, mem, idx, buf, cq);
        }
    }

    fn execute_local<M: MemOps + ?Sized>(&mut self, mem: &M, op: &SendOp) -> WcStatus {
        self.stats.local_op_executions += 1;
        match *op {
            SendOp::RegMr { mr, key, access, iova, length } => match mem.reg_mr(self.pd, self.qpn, mr, key, access, iova, length) {
                Ok(()) => WcStatus::Success,
                Err(_) => WcStatus::LocQpOpErr,
            },
            SendOp::LocalInv { key } => match mem.local_inv(self.pd, self.qpn, key) {
                Ok(()) => WcStatus::Success,
                Err(_) => WcStatus::LocQpOpErr,
            },
            SendOp::BindMw { mw, new_key, mr, addr, len, access } => {
                match mem.bind_mw(self.pd, self.qpn, mw, new_key, mr, addr, len, access) {
                    Ok(()) => WcStatus::Success,
                    Err(_) => WcStatus::MwBindErr,
                }
            }
            _ => WcStatus::LocQpOpErr,
        }
    }

    /// Emit the next packet of started WQE `idx` (at its `tx_pkt`).
    fn transmit_wqe<M: MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, now: Instant, mem: &M, idx: u64, buf: &mut [u8], cq: &mut C) -> Option<Transmit> {
        let e = *self.entry(idx);
        let mtu = self.mtu();
        let wire_ty = self.qp_type.wire();
        let ud = if self.qp_type == QpType::Ud { self.sq_side.ud(idx) } else { None };
        let (dest_qpn, av) = match ud {
            Some(ud) => (ud.remote_qpn, Some(ud.av)),
            _ => (self.attr.dest_qp_num.value(), None),
        };
        let k = e.tx_pkt;
        let psn = e.first_psn.wrapping_add(k);
        let window = self.unacked_window();
        if self.qp_type == QpType::Rc && psn.distance(self.comp.psn()) >= window {
            return None;
        }
        let op = e.op;
        let inline = e.flags.contains(SendFlags::INLINE);
        let (hdr, payload, last) = match op {
            SendOp::Read => {
                let off = u64::from(k) * u64::from(mtu);
                let mut h = TransportHeaders::new(bth(pmrxe_wire::Opcode::RC_RDMA_READ_REQUEST, dest_qpn, psn));
                h.bth.ack_req = true;
                h.reth = Some(RethRepr {
                    va: e.remote_addr.wrapping_add(off),
                    rkey: e.rkey,
                    len: (e.len - off.min(e.len)) as u32,
                });
                (h, Payload::None, true)
            }
            SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. } => {
                let (opc, swap_add, compare) = match op {
                    SendOp::CmpSwap { compare, swap } => (pmrxe_wire::Opcode::RC_COMPARE_SWAP, swap, compare),
                    SendOp::FetchAdd { add } => (pmrxe_wire::Opcode::RC_FETCH_ADD, add, 0),
                    _ => unreachable!(),
                };
                let mut h = TransportHeaders::new(bth(opc, dest_qpn, psn));
                h.bth.ack_req = true;
                h.atomic_eth = Some(AtomicEthRepr { va: e.remote_addr, rkey: e.rkey, swap_add, compare });
                (h, Payload::None, true)
            }
            _ => {
                let npkts = e.npsn;
                let pos = match (k == 0, k + 1 == npkts) {
                    (true, true) => MsgPos::Only,
                    (true, false) => MsgPos::First,
                    (false, true) => MsgPos::Last,
                    (false, false) => MsgPos::Middle,
                };
                let kind = if op.is_write() { OpKind::Write } else { OpKind::Send };
                let imm = op.imm();
                let inv = match op {
                    SendOp::SendInv(k) => Some(k),
                    _ => None,
                };
                let opc = next_opcode(wire_ty, kind, pos, imm.is_some(), inv.is_some())?;
                let mut h = TransportHeaders::new(bth(opc, dest_qpn, psn));
                if pos.is_end() {
                    h.imm = imm;
                    h.ieth = inv;
                    h.bth.solicited = e.flags.contains(SendFlags::SOLICITED) && (kind == OpKind::Send || imm.is_some());
                }
                if kind == OpKind::Write && pos.is_start() {
                    h.reth = Some(RethRepr { va: e.remote_addr, rkey: e.rkey, len: e.len as u32 });
                }
                if let Some(ud) = ud {
                    // IBTA 10.2.5 / C10-15: a WR Q_Key with its most significant bit set is not
                    // sent; the QP's own Q_Key is (which only a privileged client may make
                    // privileged: the service refuses such a QKEY in modify_qp otherwise).
                    let qkey = if ud.remote_qkey & PRIVILEGED_QKEY_BIT != 0 { self.attr.qkey } else { ud.remote_qkey };
                    h.deth = Some(DethRepr { qkey, src_qp: Qpn::new(self.qpn) });
                }
                let off = u64::from(k) * u64::from(mtu);
                let len = (e.len - off.min(e.len)).min(u64::from(mtu)) as usize;
                let payload = if inline {
                    Payload::Bytes(&self.sq_side.inline(idx, off as usize + len)[off as usize..])
                } else {
                    Payload::Gather { sges: self.sq_side.sges(idx, e.num_sge), offset: off, len }
                };
                (h, payload, pos.is_end())
            }
        };
        let mut hdr = hdr;
        if self.qp_type == QpType::Rc && self.req.wants_ack(psn, self.comp.psn(), window, last || hdr.bth.ack_req) {
            hdr.bth.ack_req = true;
        }
        let plen = match &payload {
            Payload::Gather { len, .. } => *len,
            Payload::Bytes(b) => b.len(),
            Payload::None | Payload::Remote { .. } => 0,
        };
        let (len, tail_crc) = match build(mem, self.pd, self.qpn, hdr, payload, buf) {
            Ok(Some(n)) => n,
            Ok(None) => {
                self.stats.dropped += 1;
                return None;
            }
            Err(_) => {
                self.gather_failed(idx, cq);
                return None;
            }
        };
        // Advance.
        let npsn = e.npsn;
        let en = self.entry_mut(idx);
        let all_sent = match op {
            SendOp::Read => {
                en.read_req_out = true;
                true
            }
            _ => {
                en.tx_pkt += 1;
                en.tx_pkt >= npsn
            }
        };
        if all_sent {
            self.req.net_cursor = idx + 1;
        }
        let end_psn = match op {
            SendOp::Read => e.last_psn().wrapping_add(1),
            _ => psn.wrapping_add(1),
        };
        self.packet_sent(now, idx, psn, end_psn, plen, len, all_sent, cq);
        Some(Transmit { len, av, dest_qpn, src_qpn: self.qpn, tail_crc })
    }

    /// Transmit header prediction: the MIDDLE packet `tx_pkt` of started WQE `idx` — a WRITE or
    /// SEND of one SGE, not inline, on RC or UC — built in one step. Its headers are a bare
    /// BTH that differs from the previous packet's only in PSN and AckReq, its payload a full
    /// PMTU gathered through the translation of the WQE's lkey carried from its first MIDDLE
    /// (a load and a compare instead of a lookup per packet; the stamp ends it at the next
    /// grace period, after which each packet looks the key up again). Returns `None`, having
    /// changed nothing, for any other packet or when that range does not validate as a whole;
    /// the general path then builds it. Otherwise its result, with the general path's effects:
    /// the same bytes, PSN window, AckReq, counters, DCQCN charge and timers, and for a gather
    /// that fails (the MR went away), the same LOC_PROT_ERR. `tests/fast_path.rs` runs both
    /// paths over the same traffic.
    ///
    /// Inlined into `poll_transmit`, so the `Transmit` is written once, in place. Returned
    /// through a call, it was copied in wider words than it was written; a load that cannot
    /// take its data from the store buffer waits until every older store has left it, and
    /// the older stores are the 4 KiB payload just copied into the frame (its lines not yet
    /// in cache): a tenth of the lcore's time at 64 KiB. The BTH is written from registers
    /// for the same reason (`BthRepr::emit_bytes` inlined).
    #[inline(always)]
    fn transmit_middle<M: MemOps + ?Sized, C: CompletionSink + ?Sized>(&mut self, now: Instant, mem: &M, idx: u64, buf: &mut [u8], cq: &mut C) -> Option<Option<Transmit>> {
        let e = self.entry(idx);
        let (op, k, first_psn, num_sge, inline) = (e.op, e.tx_pkt, e.first_psn, e.num_sge, e.flags.contains(SendFlags::INLINE));
        let kind = match op {
            SendOp::Write | SendOp::WriteImm(_) => OpKind::Write,
            SendOp::Send | SendOp::SendImm(_) | SendOp::SendInv(_) => OpKind::Send,
            _ => return None,
        };
        if k == 0 || k + 1 >= e.npsn || num_sge != 1 || inline || self.qp_type == QpType::Ud {
            return None;
        }
        let sge = *self.sq_side.sges(idx, 1).first()?;
        let plen = self.mtu() as usize;
        let len = wire_bth::HEADER_LEN + plen;
        if buf.len() < len {
            return None;
        }
        let s = &mut self.tx_stream;
        if s.idx != idx || s.plen != plen {
            let tr = mem.check_local(self.pd, self.qpn, sge.lkey, sge.addr, u64::from(sge.len)).ok();
            *s = TxStream { idx, plen, shift: CrcShift::new(plen as u64), tr };
        }
        let (tr, shift) = (s.tr?, s.shift);
        let opcode = next_opcode(self.qp_type.wire(), kind, MsgPos::Middle, false, false)?;
        // From here on, the general path's steps in its order.
        let psn = first_psn.wrapping_add(k);
        let window = self.unacked_window();
        if self.qp_type == QpType::Rc && psn.distance(self.comp.psn()) >= window {
            return Some(None);
        }
        let mut h = bth(opcode, self.attr.dest_qp_num.value(), psn);
        h.ack_req = self.qp_type == QpType::Rc && self.req.wants_ack(psn, self.comp.psn(), window, false);
        let (head, body) = buf[..len].split_at_mut(wire_bth::HEADER_LEN);
        h.emit_bytes(head.try_into().ok()?);
        let off = u64::from(k) * plen as u64;
        let Ok(body_crc) = mem.read_carried_crc(&tr, sge.addr + off, body, 0) else {
            self.gather_failed(idx, cq);
            return Some(None);
        };
        let tail_crc = shift.combine(pmrxe_wire::icrc::transport_crc(head), body_crc);
        self.entry_mut(idx).tx_pkt += 1;
        self.stats.tx_fast_path += 1;
        self.packet_sent(now, idx, psn, psn.wrapping_add(1), plen, len, false, cq);
        Some(Some(Transmit { len, av: None, dest_qpn: self.attr.dest_qp_num.value(), src_qpn: self.qpn, tail_crc: Some(tail_crc) }))
    }

    /// A local protection error while gathering (IBTA / mlx5 status; rxe reports
    /// LOC_QP_OP_ERR), reported in order once earlier WQEs complete.
    fn gather_failed<C: CompletionSink + ?Sized>(&mut self, idx: u64, cq: &mut C) {
        self.finish_wqe(idx, WcStatus::LocProtErr);
        self.retire(cq);
    }

    /// The packet of WQE `idx` at `psn` left (`plen` payload bytes, `len` transport bytes;
    /// `end_psn` one past the last PSN it covers; `all_sent`: the WQE has no packet left): the
    /// counters, the highest PSN sent, the DCQCN charge, the retransmission timer (RC), or the
    /// completion of an unreliable WQE.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn packet_sent<C: CompletionSink + ?Sized>(&mut self, now: Instant, idx: u64, psn: Psn, end_psn: Psn, plen: usize, len: usize, all_sent: bool, cq: &mut C) {
        self.stats.tx_packets += 1;
        self.stats.tx_bytes += plen as u64;
        if psn.distance(self.req.max_sent) < 0 {
            self.stats.retransmits += 1;
            self.stats.retransmit_bytes += plen as u64;
        }
        if let Some(d) = &mut self.dcqcn {
            d.on_sent(now, (len + WIRE_OVERHEAD) as u64);
            if let Some(at) = d.next_send().filter(|&at| at > now) {
                self.timers.set(Timer::Pacing, at);
            }
            self.sync_cc_timers();
        }
        if end_psn.distance(self.req.max_sent) > 0 {
            self.req.max_sent = end_psn;
        }
        match self.qp_type {
            QpType::Rc => {
                if self.timers.get(Timer::Retransmit).is_none() {
                    if let Some(t) = local_ack_timeout_ns(self.attr.timeout) {
                        self.timers.set(Timer::Retransmit, now.add_ns(t));
                    }
                }
            }
            QpType::Uc | QpType::Ud => {
                if all_sent {
                    // Unreliable: complete when the last packet is handed to the wire.
                    self.comp.acknowledged_to(self.req.next_psn);
                    self.finish_wqe(idx, WcStatus::Success);
                    self.retire(cq);
                }
            }
        }
    }
}
