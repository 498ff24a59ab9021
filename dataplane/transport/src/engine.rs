//! The per-lcore container of QPs and SRQs — the one engine both production (the runtime's
//! lcore loop) and the deterministic simulator (the A1–F8 conformance suite, the soak, the
//! congested fabric) run.
//!
//! * **Slab indexed by the QPN.** A QPN encodes its owner and its slot:
//!   `owner = qpn % lcores`, `slot = (qpn / lcores) % slots`; the higher bits act as a
//!   generation (a reused slot gets a different QPN). Finding a QP is an index and one compare:
//!   no hashing. Whoever allocates QPNs picks one whose slot is free ([`QpnLayout`]).
//! * **Work lists, not scans.** A QP is on the *ready* list while it has something to send
//!   (doorbell, received packet, expired timer put it there; round-robin, FIFO), on the
//!   *pending* list while it holds async events or completions its CQ refused (the rest went
//!   to the embedder's [`Completions`] the moment they were produced), and in the *timer
//!   queue* while it has a deadline. Every operation that goes through the engine re-files the QP
//!   (`Engine::touch`), so one iteration costs in proportion to the events, not to the QPs.
//! * **Lazy timers.** The timer queue is a binary heap holding at most one live deadline per
//!   QP (`armed`): a QP is re-armed only when its deadline moves *earlier* (an ACK moving the
//!   retransmission deadline later costs nothing); a deadline that fires early is checked
//!   and re-armed. Stale heap entries are skipped (QPN and armed time must match).
//!
//! Each QP carries an attachment `X` the embedder needs beside it (the runtime: rings, CQ
//! indices, doorbell slot, path cache; the simulator: nothing).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use crate::attr::{AttrMask, ModifyError, QpAttr, QpState};
use crate::cq::{Bound, Completions, Delivery};
use crate::memops::MemOps;
use crate::packet::RxPacket;
use crate::attr::AddressVector;
use pmrxe_wire::{MsgPos, RxPrediction};
use crate::qp::{PostError, Qp, Transmit};
use crate::source::{Offer, Pulled, Queue, WorkSource};
use crate::srq::Srq;
use crate::stats::QpStats;
use crate::timers::Instant;
use crate::wqe::{RecvWqe, SendWqe};

/// How QPNs map to lcores and slab slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpnLayout {
    /// Lcores of the service (QPNs are spread `qpn % lcores`).
    pub lcores: u32,
    /// Slab slots per lcore.
    pub slots: u32,
}

impl Default for QpnLayout {
    fn default() -> Self {
        QpnLayout { lcores: 1, slots: DEFAULT_SLOTS }
    }
}

/// Default slab size: QPs per lcore.
pub const DEFAULT_SLOTS: u32 = 4096;

impl QpnLayout {
    /// The lcore owning `qpn`.
    #[inline]
    pub fn owner(&self, qpn: u32) -> usize {
        rem(qpn, self.lcores.max(1)) as usize
    }
    /// The slab slot of `qpn` on its owner.
    #[inline]
    pub fn slot(&self, qpn: u32) -> usize {
        let l = self.lcores.max(1);
        let q = if l.is_power_of_two() { qpn >> l.trailing_zeros() } else { qpn / l };
        rem(q, self.slots.max(1)) as usize
    }
}

/// `a % b` for `b > 0`, without a division when `b` is a power of two (every default layout:
/// the slot lookup runs several times per packet and a `div` was 3.7 % of the lcore at 8 B SEND).
#[inline]
fn rem(a: u32, b: u32) -> u32 {
    if b.is_power_of_two() {
        a & (b - 1)
    } else {
        a % b
    }
}

/// Why [`Engine::add_qp`] refused a QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddError {
    /// Another live QP occupies the slot this QPN maps to.
    SlotTaken,
    /// The QPN belongs to another lcore.
    WrongOwner,
}

impl core::fmt::Display for AddError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            AddError::SlotTaken => "QPN slot in use",
            AddError::WrongOwner => "QPN owned by another lcore",
        })
    }
}

struct Entry<X> {
    qp: Qp,
    ext: X,
    ready: bool,
    pending: bool,
    armed: Option<Instant>,
    /// Since when the QP's next packet has been held for an unresolved neighbour.
    hold_since: Option<Instant>,
    /// The header of the last MIDDLE packet received for this QP that took the full parse,
    /// and the port it arrived on: its successors on that port are parsed by prediction
    /// ([`Engine::predict`]). (Boxed: 400 bytes inline would spread the entry over more cache
    /// lines.)
    rx_predict: Option<(u32, Box<RxPrediction>)>,
}

/// A malformed work request or a corrupt queue: the QP moves to ERROR (its outstanding WRs
/// flush).
fn fail<X, C: Completions<X> + ?Sized>(qp: &mut Qp, ext: &X, cq: &mut C) {
    let a = QpAttr { qp_state: QpState::Err, ..QpAttr::default() };
    let _ = qp.modify(&a, AttrMask::STATE, &mut Bound { out: cq, ext });
}

/// QPs and SRQs owned by one lcore.
pub struct Engine<X = ()> {
    layout: QpnLayout,
    index: u32,
    entries: Vec<Option<Box<Entry<X>>>>,
    live: usize,
    srqs: BTreeMap<u32, Srq>,
    /// Slots with something to send (FIFO round robin).
    ready: VecDeque<u32>,
    /// Slots with completions or events.
    pending: Vec<u32>,
    /// Spare list swapped with `pending` while it is drained (no allocation).
    pending_spare: Vec<u32>,
    /// (deadline, slot, qpn): at most one live entry per QP, stale ones skipped.
    timers: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    /// Reserved scratch: ready QPs whose port was full this pass (served first next time).
    deferred: Vec<u32>,
    /// QPNs holding their next packet until a neighbour resolves (off the ready list).
    held: Vec<u32>,
    /// Neighbour generation `held` was last re-examined at, and when.
    held_seen: (u64, Instant),
    /// QPs with a receive prediction recorded: while there are none, frames do not look for
    /// one.
    predicting: usize,
    /// Frames parsed by prediction.
    pub rx_predicted: u64,
    /// Packets for a QPN we do not own.
    pub unknown_qpn: u64,
}

impl<X> core::fmt::Debug for Engine<X> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Engine").field("layout", &self.layout).field("qps", &self.live).field("ready", &self.ready.len()).finish()
    }
}

impl Default for Engine<()> {
    fn default() -> Self {
        Engine::with_layout(QpnLayout::default(), 0)
    }
}

impl Engine<()> {
    /// An engine for a single-lcore owner with the default slab size (the simulator's).
    pub fn new() -> Self {
        Self::default()
    }
    /// Take ownership of a QP (the simulator's form: panics if its slot is taken, which only
    /// a test choosing colliding QPNs can cause).
    pub fn add_qp(&mut self, qp: Qp) {
        let qpn = qp.qpn();
        if let Err(e) = self.insert(qp, ()) {
            panic!("add_qp({qpn:#x}): {e}");
        }
    }
}

impl<X> Engine<X> {
    /// An empty engine for lcore `index` of `layout`. Allocates every list to its final size
    /// here, so nothing on the per-packet path allocates.
    pub fn with_layout(layout: QpnLayout, index: usize) -> Self {
        let n = layout.slots.max(1) as usize;
        Engine {
            layout,
            index: index as u32,
            entries: (0..n).map(|_| None).collect(),
            live: 0,
            srqs: BTreeMap::new(),
            ready: VecDeque::with_capacity(n),
            pending: Vec::with_capacity(n),
            pending_spare: Vec::with_capacity(n),
            timers: BinaryHeap::with_capacity(4 * n),
            deferred: Vec::with_capacity(n),
            held: Vec::with_capacity(n),
            held_seen: (0, Instant(0)),
            predicting: 0,
            rx_predicted: 0,
            unknown_qpn: 0,
        }
    }

    /// The QPN layout.
    pub fn layout(&self) -> QpnLayout {
        self.layout
    }

    /// Number of QPs.
    pub fn len(&self) -> usize {
        self.live
    }

    /// No QPs?
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    #[inline]
    fn slot_of(&self, qpn: u32) -> Option<usize> {
        let s = self.layout.slot(qpn);
        match &self.entries[s] {
            Some(e) if e.qp.qpn() == qpn => Some(s),
            _ => None,
        }
    }

    /// Take ownership of a QP with its attachment.
    pub fn insert(&mut self, qp: Qp, ext: X) -> Result<(), AddError> {
        let qpn = qp.qpn();
        if self.layout.owner(qpn) != self.index as usize % self.layout.lcores.max(1) as usize {
            return Err(AddError::WrongOwner);
        }
        let s = self.layout.slot(qpn);
        if self.entries[s].is_some() {
            return Err(AddError::SlotTaken);
        }
        self.entries[s] = Some(Box::new(Entry { qp, ext, ready: false, pending: false, armed: None, hold_since: None, rx_predict: None }));
        self.live += 1;
        self.touch(s);
        Ok(())
    }

    /// Remove a QP (control path: the work lists are filtered).
    pub fn remove(&mut self, qpn: u32) -> Option<(Qp, X)> {
        let s = self.slot_of(qpn)?;
        let e = self.entries[s].take()?;
        self.live -= 1;
        let s = s as u32;
        self.ready.retain(|&q| q != s);
        self.pending.retain(|&q| q != s);
        self.held.retain(|&q| q != qpn);
        if e.rx_predict.is_some() {
            self.predicting -= 1;
        }
        let Entry { qp, ext, .. } = *e;
        Some((qp, ext))
    }

    /// Remove a QP, dropping its attachment.
    pub fn remove_qp(&mut self, qpn: u32) -> Option<Qp> {
        self.remove(qpn).map(|(q, _)| q)
    }

    /// Take ownership of an SRQ.
    pub fn add_srq(&mut self, srq: Srq) {
        self.srqs.insert(srq.srqn(), srq);
    }
    /// Remove an SRQ.
    pub fn remove_srq(&mut self, srqn: u32) -> Option<Srq> {
        self.srqs.remove(&srqn)
    }
    /// An SRQ.
    pub fn srq(&self, srqn: u32) -> Option<&Srq> {
        self.srqs.get(&srqn)
    }
    /// An SRQ, mutably.
    pub fn srq_mut(&mut self, srqn: u32) -> Option<&mut Srq> {
        self.srqs.get_mut(&srqn)
    }

    /// A QP.
    pub fn qp(&self, qpn: u32) -> Option<&Qp> {
        self.slot_of(qpn).and_then(|s| self.entries[s].as_deref()).map(|e| &e.qp)
    }
    /// A QP, mutably (after changing it call [`Engine::kick`]). For tests and the simulator
    /// only (feature `sim`): an embedder changes QPs through the engine's calls
    /// ([`Engine::pull`], [`Engine::modify`], [`Engine::receive`] ...), which re-file them.
    #[cfg(feature = "sim")]
    pub fn qp_mut(&mut self, qpn: u32) -> Option<&mut Qp> {
        let s = self.slot_of(qpn)?;
        self.entries[s].as_deref_mut().map(|e| &mut e.qp)
    }
    /// A QP's attachment.
    #[inline]
    pub fn ext(&self, qpn: u32) -> Option<&X> {
        self.slot_of(qpn).and_then(|s| self.entries[s].as_deref()).map(|e| &e.ext)
    }
    /// The slab slot of QP `qpn` if this engine has it: one lookup for a caller that goes on
    /// to [`Engine::ext_at`], [`Engine::qp_at`] and `Engine::handle_packet_at` (the receive
    /// path). Valid until a QP is added or removed.
    #[inline]
    pub fn slot(&self, qpn: u32) -> Option<u32> {
        self.slot_of(qpn).map(|s| s as u32)
    }
    /// [`Engine::ext`] by slot.
    #[inline]
    pub fn ext_at(&self, slot: u32) -> Option<&X> {
        self.entries.get(slot as usize)?.as_deref().map(|e| &e.ext)
    }
    /// [`Engine::qp`] by slot.
    #[inline]
    pub fn qp_at(&self, slot: u32) -> Option<&Qp> {
        self.entries.get(slot as usize)?.as_deref().map(|e| &e.qp)
    }
    /// Every QP with its attachment.
    pub fn iter(&self) -> impl Iterator<Item = (&Qp, &X)> + '_ {
        self.entries.iter().flatten().map(|e| (&e.qp, &e.ext))
    }
    /// Move every QP to ERROR (shutdown): their outstanding WRs flush into `cq`.
    pub fn fail_all<C: Completions<X> + ?Sized>(&mut self, cq: &mut C) {
        let a = QpAttr { qp_state: QpState::Err, ..QpAttr::default() };
        for s in 0..self.entries.len() {
            if let Some(e) = self.entries[s].as_deref_mut() {
                let _ = e.qp.modify(&a, AttrMask::STATE, &mut Bound { out: &mut *cq, ext: &e.ext });
                self.touch(s);
            }
        }
    }
    /// All QPNs.
    pub fn qpns(&self) -> impl Iterator<Item = u32> + '_ {
        self.entries.iter().flatten().map(|e| e.qp.qpn())
    }

    /// Re-file `qpn` on the work lists after a change made through [`Engine::qp_mut`] (feature
    /// `sim`).
    #[cfg(feature = "sim")]
    pub fn kick(&mut self, qpn: u32) {
        if let Some(s) = self.slot_of(qpn) {
            self.touch(s);
        }
    }

    /// Put slot `s` on the lists its QP now belongs to.
    fn touch(&mut self, s: usize) {
        self.refile(s, true);
    }

    /// [`Engine::touch`]; with `may_ready` false the QP stays off the ready list even if it
    /// claims work: it was just polled and produced nothing (a fence, the RDMA-read credit or
    /// the window holds it), and only an event (a packet, a timer, a post) can change that.
    fn refile(&mut self, s: usize, may_ready: bool) {
        let Some(e) = self.entries[s].as_deref_mut() else { return };
        if may_ready && !e.ready && e.qp.wants_transmit() {
            e.ready = true;
            self.ready.push_back(s as u32);
        }
        if !e.pending && e.qp.has_output() {
            e.pending = true;
            self.pending.push(s as u32);
        }
        if let Some(t) = e.qp.poll_timeout() {
            if e.armed.is_none_or(|a| t < a) {
                e.armed = Some(t);
                let qpn = e.qp.qpn();
                if self.timers.len() == self.timers.capacity() {
                    self.compact_timers();
                }
                self.timers.push(Reverse((t, s as u32, qpn)));
            }
        }
    }

    /// Rebuild the timer heap from the live deadlines (drops stale entries; rare: only when
    /// earlier-moving deadlines filled the reserved capacity).
    fn compact_timers(&mut self) {
        let live: Vec<_> = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(s, e)| e.as_deref().and_then(|e| e.armed.map(|t| Reverse((t, s as u32, e.qp.qpn())))))
            .collect();
        self.timers.clear();
        self.timers.extend(live);
    }

    /// Pull QP `qpn`'s new work requests from `src` (its doorbell rang): receive WRs first
    /// (a SEND arriving in the same burst finds them), then send WRs, each in order until its
    /// queue is empty or full. A full queue leaves the rest in the source
    /// ([`Pulled::full`]: pull again after completions made room); a malformed entry is
    /// consumed and moves the QP to ERROR, as does a corrupt queue (read no further). The QP
    /// is re-filed on the work lists.
    pub fn pull<S: WorkSource<X>, C: Completions<X> + ?Sized>(&mut self, qpn: u32, now: Instant, src: &mut S, cq: &mut C) -> Pulled {
        self.pull_queues(qpn, Some(now), src, cq)
    }

    /// [`Engine::pull`] of the receive queue only: a request arrived that needs a receive WR
    /// the QP lacks, and the source may hold one (a NIC reads its queue on arrival).
    pub fn pull_recv<S: WorkSource<X>, C: Completions<X> + ?Sized>(&mut self, qpn: u32, src: &mut S, cq: &mut C) -> Pulled {
        self.pull_queues(qpn, None, src, cq)
    }

    fn pull_queues<S: WorkSource<X>, C: Completions<X> + ?Sized>(&mut self, qpn: u32, send_at: Option<Instant>, src: &mut S, cq: &mut C) -> Pulled {
        let mut p = Pulled::default();
        let Some(s) = self.slot_of(qpn) else { return p };
        let Some(e) = self.entries[s].as_deref_mut() else { return p };
        let Entry { qp, ext, .. } = e;
        // A queue still full since the last pull (a backlogged QP retried every pass) is not
        // read: no entry is copied and converted just to be refused.
        let recv_full = qp.recv_queue_full();
        p.full |= recv_full;
        if !recv_full {
            loop {
                match src.next_recv(qpn, ext) {
                    Offer::Wr(w) => {
                        // The receive queue refuses when full (or while the QP is in RESET, or
                        // on an SRQ): the WRs wait in the source.
                        if qp.post_recv(&w, &mut Bound { out: &mut *cq, ext: &*ext }).is_err() {
                            p.full = true;
                            break;
                        }
                    }
                    Offer::Empty => break,
                    Offer::Malformed => {
                        p.malformed += 1;
                        fail(qp, ext, cq);
                    }
                    Offer::Corrupt => {
                        p.corrupt += 1;
                        fail(qp, ext, cq);
                        break;
                    }
                }
                src.consume(qpn, ext, Queue::Recv);
                p.moved += 1;
            }
        }
        src.finish(qpn, ext, Queue::Recv);
        if let Some(now) = send_at.filter(|_| {
            let full = qp.send_queue_full();
            p.full |= full;
            !full
        }) {
            loop {
                let bad = match src.next_send(qpn, ext) {
                    Offer::Wr(w) => match qp.post_send(now, &w, &mut Bound { out: &mut *cq, ext: &*ext }) {
                        Ok(()) => false,
                        Err(PostError::QueueFull) => {
                            p.full = true;
                            break;
                        }
                        Err(_) => true,
                    },
                    Offer::Empty => break,
                    Offer::Malformed => true,
                    Offer::Corrupt => {
                        p.corrupt += 1;
                        fail(qp, ext, cq);
                        break;
                    }
                };
                if bad {
                    p.malformed += 1;
                    fail(qp, ext, cq);
                }
                src.consume(qpn, ext, Queue::Send);
                p.moved += 1;
            }
            src.finish(qpn, ext, Queue::Send);
        }
        self.touch(s);
        p
    }

    /// Modify QP `qpn` (`None`: no such QP); a QP moved to RESET also has `src` drop what its
    /// queues still hold.
    pub fn modify<S: WorkSource<X>, C: Completions<X> + ?Sized>(&mut self, qpn: u32, attr: &QpAttr, mask: AttrMask, src: &mut S, cq: &mut C) -> Option<Result<(), ModifyError>> {
        let s = self.slot_of(qpn)?;
        let Entry { qp, ext, .. } = self.entries[s].as_deref_mut()?;
        let r = qp.modify(attr, mask, &mut Bound { out: cq, ext: &*ext });
        if r.is_ok() && mask.contains(AttrMask::STATE) && attr.qp_state == QpState::Reset {
            src.reset(qpn, ext);
        }
        self.touch(s);
        Some(r)
    }

    /// Post a send WR to `qpn`.
    pub fn post_send<C: Completions<X> + ?Sized>(&mut self, qpn: u32, now: Instant, wqe: SendWqe, cq: &mut C) -> Result<(), PostError> {
        let s = self.slot_of(qpn).ok_or(PostError::InvalidState)?;
        let e = self.entries[s].as_deref_mut().ok_or(PostError::InvalidState)?;
        let r = e.qp.post_send(now, &wqe, &mut Bound { out: cq, ext: &e.ext });
        self.touch(s);
        r
    }
    /// Post a receive WR to `qpn`.
    pub fn post_recv<C: Completions<X> + ?Sized>(&mut self, qpn: u32, wqe: &RecvWqe, cq: &mut C) -> Result<(), PostError> {
        let s = self.slot_of(qpn).ok_or(PostError::InvalidState)?;
        let e = self.entries[s].as_deref_mut().ok_or(PostError::InvalidState)?;
        let r = e.qp.post_recv(wqe, &mut Bound { out: cq, ext: &e.ext });
        self.touch(s);
        r
    }

    /// Dispatch a parsed packet by its destination QPN. Returns true if the QP dropped it for a
    /// bad ICRC (a deferred check that failed; counted in the QP's `icrc_errors`).
    pub fn handle_packet<M: MemOps + ?Sized, C: Completions<X> + ?Sized>(&mut self, now: Instant, pkt: &RxPacket<'_>, mem: &M, cq: &mut C) -> bool {
        let Some(s) = self.slot_of(pkt.hdr.bth.dest_qp.value()) else {
            self.unknown_qpn += 1;
            return false;
        };
        self.handle_packet_at(now, s as u32, pkt, mem, cq)
    }

    /// Header prediction (`pmrxe_wire::RxPrediction`, after Van Jacobson's for TCP): if
    /// `data` is for a QP whose MIDDLE header recorded on `port` it matches, write what the full
    /// parse would into `pkt` and return the QP's slot for [`Engine::receive`]. A predicted
    /// packet's ICRC check always goes with it to the QP (made before the packet acts, or
    /// while its payload is placed). Nothing is looked at but the frame's head and the record.
    #[inline]
    pub fn predict<'a>(&self, port: u32, data: &'a [u8], pkt: &mut RxPacket<'a>) -> Option<u32> {
        if self.predicting == 0 {
            return None;
        }
        let qpn = RxPrediction::dest_qp(data)?;
        self.predict_for(qpn, port, data, pkt)
    }

    /// [`Engine::predict`] for a frame whose BTH names a MIDDLE packet for `qpn` (out of line:
    /// small packets never get here).
    #[inline(never)]
    fn predict_for<'a>(&self, qpn: u32, port: u32, data: &'a [u8], pkt: &mut RxPacket<'a>) -> Option<u32> {
        let s = self.slot_of(qpn)?;
        let (_, p) = self.entries[s].as_deref()?.rx_predict.as_ref().filter(|(at, _)| *at == port)?;
        if !p.parse_into(data, &mut pkt.hdr, &mut pkt.frame) {
            return None;
        }
        pkt.deferred = true;
        Some(s as u32)
    }

    /// A received packet for the QP in `slot` ([`Engine::slot`] of its destination QPN, or
    /// what [`Engine::predict`] returned; `predicted`: it came from there), `data` its frame,
    /// arrived on `port`. The QP handles it; then a MIDDLE packet that took the full parse and
    /// passed its ICRC check (the first of a message, or one whose headers changed) becomes the
    /// QP's prediction record for its successors on `port`. Returns true if the QP dropped the
    /// packet for a bad ICRC.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn receive<M: MemOps + ?Sized, C: Completions<X> + ?Sized>(&mut self, now: Instant, slot: u32, port: u32, data: &[u8], pkt: &RxPacket<'_>, predicted: bool, mem: &M, cq: &mut C) -> bool {
        if predicted {
            self.rx_predicted += 1;
        }
        let bad_icrc = self.handle_packet_at(now, slot, pkt, mem, cq);
        if !bad_icrc && !predicted && pkt.hdr.bth.opcode.info().is_some_and(|i| i.pos == MsgPos::Middle) {
            self.record_prediction(slot, port, data);
        }
        bad_icrc
    }

    /// Record (or drop) the prediction of the QP in `slot` from `data` (the box is allocated
    /// once per QP and then rewritten in place). Out of line: once per message.
    #[inline(never)]
    fn record_prediction(&mut self, slot: u32, port: u32, data: &[u8]) {
        let Some(e) = self.entries.get_mut(slot as usize).and_then(|e| e.as_deref_mut()) else { return };
        match (RxPrediction::record(data), &mut e.rx_predict) {
            (Some(r), Some((at, b))) => {
                *at = port;
                **b = r;
            }
            (Some(r), none) => {
                *none = Some((port, Box::new(r)));
                self.predicting += 1;
            }
            (None, p) => {
                if p.take().is_some() {
                    self.predicting -= 1;
                }
            }
        }
    }

    /// [`Engine::handle_packet`] for the QP in `slot`, [`Engine::slot`] of the packet's
    /// destination QPN.
    pub(crate) fn handle_packet_at<M: MemOps + ?Sized, C: Completions<X> + ?Sized>(&mut self, now: Instant, slot: u32, pkt: &RxPacket<'_>, mem: &M, cq: &mut C) -> bool {
        let s = slot as usize;
        let Some(e) = self.entries.get_mut(s).and_then(|e| e.as_deref_mut()) else {
            self.unknown_qpn += 1;
            return false;
        };
        debug_assert_eq!(e.qp.qpn(), pkt.hdr.bth.dest_qp.value(), "a packet handed to another QP's slot");
        let srq = e.qp.srq().and_then(|n| self.srqs.get_mut(&n));
        let before = e.qp.stats().icrc_errors;
        e.qp.handle_packet(now, pkt, mem, srq, &mut Bound { out: cq, ext: &e.ext });
        let bad_icrc = e.qp.stats().icrc_errors != before;
        self.touch(s);
        bad_icrc
    }

    /// A CNP for `qpn` arrived (reaction point; see [`Qp::handle_cnp`]).
    pub fn handle_cnp(&mut self, now: Instant, qpn: u32) {
        let Some(s) = self.slot_of(qpn) else {
            self.unknown_qpn += 1;
            return;
        };
        if let Some(e) = self.entries[s].as_deref_mut() {
            e.qp.handle_cnp(now);
        }
        self.touch(s);
    }

    /// Service the timers that expired by `now`; returns whether any QP had one.
    pub fn handle_timeout<M: MemOps + ?Sized, C: Completions<X> + ?Sized>(&mut self, now: Instant, mem: &M, cq: &mut C) -> bool {
        let mut any = false;
        while let Some(&Reverse((t, s, qpn))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(e) = self.entries[s as usize].as_deref_mut() else { continue };
            if e.qp.qpn() != qpn || e.armed != Some(t) {
                continue; // stale
            }
            e.armed = None;
            if e.qp.poll_timeout().is_some_and(|d| d <= now) {
                e.qp.handle_timeout(now, mem, &mut Bound { out: cq, ext: &e.ext });
                any = true;
            }
            self.touch(s as usize);
        }
        any
    }

    /// The earliest armed deadline (possibly one that will turn out stale: never later than
    /// the real one), or the next re-examination of QPs held for a neighbour.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let t = self.timers.peek().map(|r| r.0 .0);
        if self.held.is_empty() {
            return t;
        }
        let recheck = self.held_seen.1.add_ns(HELD_RECHECK_NS);
        Some(t.map_or(recheck, |t| t.min(recheck)))
    }

    /// Serve the ready list: each ready QP, in turn, sends up to `burst` packets into `port`'s
    /// frames, then goes to the back of the list if it has more. The engine decides here, for
    /// the simulator and the lcore alike:
    ///
    /// * **Fairness.** A QP whose port has no room ([`TxPort::has_room`]) keeps its place at
    ///   the front of the list for the next pass, in the order such QPs were waiting; a QP whose
    ///   `poll_transmit` had nothing leaves the list until an event re-files it.
    /// * **Path gating.** The next packet's path must be resolved ([`TxPort::resolve`]) before
    ///   the QP's send state advances (a UC/UD packet built for an unknown MAC would be lost
    ///   yet reported sent). A QP whose neighbour is unresolved is held off the ready list
    ///   (re-examined when the port's neighbour generation changes, and at least every
    ///   [`HELD_RECHECK_NS`]) for at most [`NEIGH_HOLD_NS`]; after that its packets are built
    ///   and the port drops them, and the transport's own timeouts decide (a peer that never
    ///   answers cannot hang a WR).
    ///
    /// Completions a send produces (a UC/UD send, a local operation, a failed gather) go to
    /// `cq`. Returns whether any packet was built.
    pub fn transmit<M, C, P>(&mut self, now: Instant, mem: &M, port: &mut P, cq: &mut C, burst: usize) -> bool
    where
        M: MemOps + ?Sized,
        C: Completions<X> + ?Sized,
        P: TxPort<X> + ?Sized,
    {
        self.recheck_held(now, port.neigh_generation());
        let mut any = false;
        let mut deferred = core::mem::take(&mut self.deferred);
        for _ in 0..self.ready.len() {
            let Some(s) = self.ready.pop_front() else { break };
            let Some(e) = self.entries[s as usize].as_deref_mut() else { continue };
            e.ready = false;
            if !port.has_room(&e.ext) {
                deferred.push(s);
                continue;
            }
            if let Some((av, dest)) = e.qp.next_path() {
                if !port.resolve(&mut e.ext, av, e.qp.qpn(), dest, now) {
                    let held = *e.hold_since.get_or_insert(now);
                    if now.0.saturating_sub(held.0) < NEIGH_HOLD_NS {
                        port.held(&e.ext, av);
                        let qpn = e.qp.qpn();
                        if self.held.len() < self.held.capacity() && !self.held.contains(&qpn) {
                            self.held.push(qpn);
                        }
                        continue; // off the ready list until the neighbour changes
                    }
                } else {
                    e.hold_since = None;
                }
            }
            let (sent, progressed) = send_burst(&mut e.qp, &mut e.ext, port, now, mem, cq, burst);
            any |= sent;
            self.refile(s as usize, progressed);
        }
        // Cut off by a full port: first in line next time, in the order they were waiting.
        for &s in deferred.iter().rev() {
            if let Some(e) = self.entries.get_mut(s as usize).and_then(|e| e.as_deref_mut()) {
                if !e.ready {
                    e.ready = true;
                    self.ready.push_front(s);
                }
            }
        }
        deferred.clear();
        self.deferred = deferred;
        any
    }

    /// QPs holding for a neighbour go back on the ready list when the neighbour generation
    /// changed, and at least every [`HELD_RECHECK_NS`] (to re-ask, or to give up after the
    /// hold).
    fn recheck_held(&mut self, now: Instant, gen: u64) {
        if self.held.is_empty() {
            return;
        }
        let (seen_gen, seen_at) = self.held_seen;
        if gen == seen_gen && now.0.saturating_sub(seen_at.0) < HELD_RECHECK_NS {
            return;
        }
        self.held_seen = (gen, now);
        for k in 0..self.held.len() {
            if let Some(s) = self.slot_of(self.held[k]) {
                self.touch(s);
            }
        }
        self.held.clear();
    }

    /// The end of a pass's completion work: every QP holding completions its CQ refused
    /// retries them into `out`, and one whose CQ still refuses has overflowed:
    /// [`Delivery::overflow`] is reported and the QP goes to ERROR (its flushed WRs queue
    /// behind the refused completion; nothing is lost: they wait in the QP, in order, until the
    /// consumer makes room). Then every asynchronous event goes to [`Delivery::event`].
    /// Completions of calls made on a QP directly with the [`crate::cq::Deferred`] sink are
    /// delivered here too. Returns whether any QP had something.
    pub fn deliver<C: Delivery<X> + ?Sized>(&mut self, out: &mut C) -> bool {
        if self.pending.is_empty() {
            return false;
        }
        let mut list = core::mem::take(&mut self.pending);
        core::mem::swap(&mut self.pending, &mut self.pending_spare);
        for &s in &list {
            let Some(e) = self.entries[s as usize].as_deref_mut() else { continue };
            e.pending = false;
            let mut sink = Bound { out: &mut *out, ext: &e.ext };
            let kept = e.qp.drain_completions(&mut sink);
            if kept {
                if let Some(side) = e.qp.kept_side() {
                    sink.out.overflow(sink.ext, e.qp.qpn(), side);
                }
                if e.qp.state() != QpState::Err {
                    let a = QpAttr { qp_state: QpState::Err, ..QpAttr::default() };
                    let _ = e.qp.modify(&a, AttrMask::STATE, &mut sink);
                }
            }
            let qpn = e.qp.qpn();
            while let Some(ev) = e.qp.poll_event() {
                out.event(&e.ext, qpn, ev);
            }
            if e.qp.has_output() {
                e.pending = true;
                self.pending.push(s);
            }
            // Consuming completions can let a QP send (e.g. SQ space) or change its timers.
            self.touch(s as usize);
        }
        list.clear();
        self.pending_spare = list;
        true
    }

    /// Is any QP ready to send?
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Sum of all QP counters.
    pub fn stats(&self) -> QpStats {
        let mut s = QpStats::default();
        for e in self.entries.iter().flatten() {
            s.add(e.qp.stats());
        }
        s
    }
}

/// How long a QP's send state is held while its next hop's neighbour resolves; after that its
/// packets are built and the port drops them (the transport's own timeouts decide).
pub const NEIGH_HOLD_NS: u64 = 50_000_000;
/// Held QPs are re-examined at least this often (to re-ask, or to give up after the hold).
pub const HELD_RECHECK_NS: u64 = 100_000;

/// The port side of [`Engine::transmit`]: frame buffers and path (neighbour) state. The runtime
/// implements it over DPDK mbufs and its neighbour table, the simulator over `Vec<u8>` frames
/// and a neighbour table a test can empty. Calls for one QP's burst come in this order:
/// [`TxPort::resolve`] (once, before the burst), then per packet [`TxPort::frame`] and
/// [`TxPort::emit`] (or [`TxPort::give_back`] when the QP had nothing more), then
/// [`TxPort::end_burst`].
pub trait TxPort<X> {
    /// A frame being filled.
    type Frame;
    /// Has the port of the QP with attachment `ext` room for one more frame? (false before a
    /// burst: the QP keeps its place at the front of the ready list; within one: the burst ends)
    fn has_room(&self, ext: &X) -> bool;
    /// The neighbour table's generation: QPs held for a neighbour are re-examined when it
    /// changes.
    fn neigh_generation(&self) -> u64;
    /// Is the path on `av` from `src_qpn` to `dest_qpn` resolved (its next hop's MAC known)?
    /// May fill a path cache in `ext`.
    fn resolve(&mut self, ext: &mut X, av: &AddressVector, src_qpn: u32, dest_qpn: u32, now: Instant) -> bool;
    /// The QP is held for the unresolved neighbour of `av` (count it; ask for it).
    fn held(&mut self, ext: &X, av: &AddressVector);
    /// An empty frame for the QP's next packet (`None`: no buffer; the burst ends).
    fn frame(&mut self, ext: &mut X) -> Option<Self::Frame>;
    /// Where the transport part of the packet goes in `frame` (the room left for the ICRC and
    /// the outer headers excluded).
    fn room(frame: &mut Self::Frame) -> &mut [u8];
    /// The QP wrote packet `t` (path `av`) into `frame`: add the outer headers and the ICRC and
    /// queue it (or drop it, counted, if its path cannot be resolved now).
    fn emit(&mut self, ext: &mut X, frame: Self::Frame, t: &Transmit, av: &AddressVector, now: Instant);
    /// The QP had nothing to write: `frame` goes back unused.
    fn give_back(&mut self, ext: &mut X, frame: Self::Frame);
    /// The QP's burst is over (finish what was deferred to the end of the burst).
    fn end_burst(&mut self, ext: &mut X, qpn: u32);
}

/// Up to `burst` packets of one ready QP into `port`'s frames. Returns (any packet built,
/// progressed: false when the QP itself had nothing to send, which keeps it off the ready list
/// until an event). Out of line (one call per QP burst): profiles and
/// `scripts/instructions.sh` see the per-packet work here.
#[inline(never)]
fn send_burst<X, M, C, P>(qp: &mut Qp, ext: &mut X, port: &mut P, now: Instant, mem: &M, cq: &mut C, burst: usize) -> (bool, bool)
where
    M: MemOps + ?Sized,
    C: Completions<X> + ?Sized,
    P: TxPort<X> + ?Sized,
{
    let mut built = false;
    let mut progressed = true;
    let mut n = 0;
    while n < burst && port.has_room(ext) {
        n += 1;
        let Some(mut f) = port.frame(ext) else { break };
        // Read in place: moving the returned value out copied it in wide words right after
        // poll_transmit wrote it field by field (a store-forwarding stall).
        let sent = qp.poll_transmit(now, mem, P::room(&mut f), &mut Bound { out: &mut *cq, ext: &*ext });
        let Some(t) = &sent else {
            port.give_back(ext, f);
            progressed = n > 1;
            break;
        };
        built = true;
        port.emit(ext, f, t, qp.transmit_av(t), now);
    }
    port.end_burst(ext, qp.qpn());
    (built, progressed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::{QpCaps, QpType};

    #[test]
    fn layout_matches_division_for_every_lcore_and_slot_count() {
        for lcores in [0, 1, 2, 3, 4, 5, 7, 8, 12, 16, 64] {
            for slots in [0, 1, 3, 4096, 1000] {
                let l = QpnLayout { lcores, slots };
                for qpn in (0..5000).chain([u32::MAX - 3, u32::MAX, 0x00ff_ffff]) {
                    assert_eq!(l.owner(qpn), (qpn % lcores.max(1)) as usize, "{l:?} {qpn}");
                    assert_eq!(l.slot(qpn), ((qpn / lcores.max(1)) % slots.max(1)) as usize, "{l:?} {qpn}");
                }
            }
        }
    }

    fn qp(qpn: u32) -> Qp {
        let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
        Qp::new(qpn, QpType::Rc, 1, caps, None).unwrap()
    }

    #[test]
    fn slab_slots_follow_the_qpn_layout() {
        let layout = QpnLayout { lcores: 3, slots: 8 };
        let mut e: Engine<u8> = Engine::with_layout(layout, 1);
        // qpn 4: owner 1, slot 1. qpn 28 = 4 + 3*8: same owner, same slot, another generation.
        e.insert(qp(4), 7).unwrap();
        assert_eq!(e.insert(qp(28), 8), Err(AddError::SlotTaken));
        assert_eq!(e.insert(qp(5), 9), Err(AddError::WrongOwner));
        assert!(e.qp(28).is_none(), "a QPN of another generation does not find the slot's QP");
        assert_eq!(e.ext(4), Some(&7));
        assert_eq!(e.remove(4).map(|(_, x)| x), Some(7));
        e.insert(qp(28), 8).unwrap();
        assert_eq!(e.qpns().collect::<Vec<_>>(), vec![28]);
        assert!(e.qp(4).is_none());
    }
}
