//! A deterministic simulated wire (quinn-proto's `Pair`, smoltcp's fault injector): nodes
//! (an [`Engine`] and a `MemTable` behind an epoch `Reader` each, as on an lcore) joined by a
//! link with latency; a virtual clock; a seeded RNG that drops, delays, duplicates, reorders
//! and corrupts packets by rate; and filters that hit specific packets (by PSN, opcode,
//! direction ...).
//!
//! Packets cross as real bytes: Ethernet/IPv4/UDP headers and the ICRC are written with
//! `pmrxe_wire` (`emit_frame_headers` + `finish_frame_with_tail_crc`, the ICRC from the CRC the
//! engine folded while writing the packet; every frame is also checked by `parse_frame`) and
//! parsed with `parse_frame_deferred` on the other side, the ICRC check going to the engine as
//! on the lcore, so the wire format and both ICRC paths are exercised on every packet.
//! Every packet is recorded in [`Sim::trace`] with its send time.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use pmrxe_wire::{BthRepr, Psn, Qpn, TransportHeaders};
use pmrxe_wire::{emit_frame_headers, finish_frame, finish_frame_with_tail_crc, frame_header_len, parse_frame, parse_frame_deferred, udp_sport, L3Info, MacAddr, Opcode, Syndrome, ICRC_LEN};
use pmrxe_mem::{MemTable, Reader};

use crate::cq::{Completions, CqSide, Cqe, Deferred, Delivery};
use crate::engine::{Engine, TxPort};
use crate::source::{Offer, Pulled, Queue, WorkSource};
use crate::link::Link;
use crate::AddressVector;
use crate::packet::RxPacket;
use crate::qp::{AsyncEvent, PostError, Qp, Transmit};
use crate::wqe::{RecvWqe, SendWqe};
use crate::timers::Instant;

pub use crate::link::{Fault, Impairments};

/// A packet as filters and the trace see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketInfo {
    /// Send time.
    pub time: Instant,
    /// Sending node.
    pub from: usize,
    /// Receiving node.
    pub to: usize,
    /// Source QPN.
    pub src_qpn: u32,
    /// Destination QPN.
    pub dst_qpn: u32,
    /// BTH opcode.
    pub opcode: Opcode,
    /// BTH PSN.
    pub psn: u32,
    /// AckReq bit.
    pub ack_req: bool,
    /// AETH syndrome (ACKs, READ responses).
    pub syndrome: Option<Syndrome>,
    /// Payload bytes.
    pub payload_len: usize,
    /// UDP source port.
    pub udp_sport: u16,
    /// What the link did with it.
    pub fault: Fault,
}

impl PacketInfo {
    /// A request (requester → responder)?
    pub fn is_request(&self) -> bool {
        self.opcode.info().is_some_and(|i| i.is_request())
    }
}


/// The simulator's CQ: every completion joins its node's log the moment the QP produces it, as
/// the lcore's sink stages it into the consumer's ring; with a limit set
/// ([`Node::cq_limit`]) it refuses completions while the log holds that many, as a full CQ
/// ring does, and records the overflows the engine reports.
struct NodeCq<'a> {
    log: &'a mut VecDeque<(u32, CqSide, Cqe)>,
    events: &'a mut VecDeque<(u32, AsyncEvent)>,
    limit: Option<usize>,
    overflows: &'a mut Vec<(u32, CqSide)>,
}

impl<X> Completions<X> for NodeCq<'_> {
    fn complete(&mut self, _ext: &X, side: CqSide, c: &Cqe) -> bool {
        if self.limit.is_some_and(|l| self.log.len() >= l) {
            return false;
        }
        self.log.push_back((c.qp_num, side, *c));
        true
    }
}

impl<X> Delivery<X> for NodeCq<'_> {
    fn overflow(&mut self, _ext: &X, qpn: u32, side: CqSide) {
        self.overflows.push((qpn, side));
    }
    fn event(&mut self, _ext: &X, qpn: u32, ev: AsyncEvent) {
        self.events.push_back((qpn, ev));
    }
}

/// A packet a node's engine built: its path and its transport part (BTH to pad; no ICRC).
#[derive(Debug)]
pub struct Outgoing {
    /// What the engine reported.
    pub t: Transmit,
    /// Its path.
    pub av: AddressVector,
    /// The frame buffer: the transport part is its first `t.len` bytes.
    pub roce: Vec<u8>,
}

/// Room for the transport part of any packet.
const ROCE_ROOM: usize = 10_000;

/// The simulator's port for [`Engine::transmit`]: `Vec<u8>` frames and a neighbour table a
/// test can empty ([`Node::set_reachable`]).
struct SimPort<'a> {
    unresolved: &'a [[u8; 16]],
    gen: u64,
    limit: usize,
    out: &'a mut Vec<Outgoing>,
    spare: &'a mut Vec<Vec<u8>>,
    holds: &'a mut u64,
    no_neighbor: &'a mut u64,
}

impl<X> TxPort<X> for SimPort<'_> {
    type Frame = Vec<u8>;
    fn has_room(&self, _ext: &X) -> bool {
        self.out.len() < self.limit
    }
    fn neigh_generation(&self) -> u64 {
        self.gen
    }
    fn resolve(&mut self, _ext: &mut X, av: &AddressVector, _src_qpn: u32, _dest_qpn: u32, _now: Instant) -> bool {
        !self.unresolved.contains(&av.dgid)
    }
    fn held(&mut self, _ext: &X, _av: &AddressVector) {
        *self.holds += 1;
    }
    fn frame(&mut self, _ext: &mut X) -> Option<Vec<u8>> {
        // Reused buffers keep their length: no clearing per packet (the engine writes what
        // it reports).
        let mut f = self.spare.pop().unwrap_or_default();
        if f.len() != ROCE_ROOM {
            f.resize(ROCE_ROOM, 0);
        }
        Some(f)
    }
    fn room(frame: &mut Vec<u8>) -> &mut [u8] {
        frame
    }
    fn emit(&mut self, _ext: &mut X, frame: Vec<u8>, t: &Transmit, av: &AddressVector, _now: Instant) {
        if self.unresolved.contains(&av.dgid) {
            // Built for a neighbour that never resolved (the hold ran out): dropped, counted.
            *self.no_neighbor += 1;
            self.spare.push(frame);
            return;
        }
        self.out.push(Outgoing { t: *t, av: *av, roce: frame });
    }
    fn give_back(&mut self, _ext: &mut X, frame: Vec<u8>) {
        self.spare.push(frame);
    }
    fn end_burst(&mut self, _ext: &mut X, _qpn: u32) {}
}

/// A CQ that never fills, for a bare [`Engine`] (fuzz targets, benches): every completion joins
/// the list, tagged with its QPN and side.
impl<X> Completions<X> for VecDeque<(u32, CqSide, Cqe)> {
    fn complete(&mut self, _ext: &X, side: CqSide, c: &Cqe) -> bool {
        self.push_back((c.qp_num, side, *c));
        true
    }
}

/// A port with unlimited room and every neighbour resolved, for a bare [`Engine`] (fuzz
/// targets): [`Engine::transmit`]'s packets join `out`.
#[derive(Debug, Default)]
pub struct Collect {
    /// The packets built, in order.
    pub out: Vec<Outgoing>,
}

impl<X> TxPort<X> for Collect {
    type Frame = Vec<u8>;
    fn has_room(&self, _ext: &X) -> bool {
        true
    }
    fn neigh_generation(&self) -> u64 {
        0
    }
    fn resolve(&mut self, _ext: &mut X, _av: &AddressVector, _src_qpn: u32, _dest_qpn: u32, _now: Instant) -> bool {
        true
    }
    fn held(&mut self, _ext: &X, _av: &AddressVector) {}
    fn frame(&mut self, _ext: &mut X) -> Option<Vec<u8>> {
        Some(vec![0u8; ROCE_ROOM])
    }
    fn room(frame: &mut Vec<u8>) -> &mut [u8] {
        frame
    }
    fn emit(&mut self, _ext: &mut X, frame: Vec<u8>, t: &Transmit, av: &AddressVector, _now: Instant) {
        self.out.push(Outgoing { t: *t, av: *av, roce: frame });
    }
    fn give_back(&mut self, _ext: &mut X, _frame: Vec<u8>) {}
    fn end_burst(&mut self, _ext: &mut X, _qpn: u32) {}
}

/// One entry of a simulated client ring.
#[derive(Clone, Copy, Debug)]
pub enum Rung<W> {
    /// A work request.
    Wr(W),
    /// An entry that is no valid work request (what a client that bypassed the shim writes).
    Malformed,
    /// A ring whose indices are corrupt from here on.
    Corrupt,
}

/// A node's simulated client rings: the WRs a test rang in ([`Node::ring_send`],
/// [`Node::ring_recv`]), pulled by the engine every step ([`Engine::pull`]) exactly as the
/// lcore pulls a client's shared rings: receive first, a full queue leaves the rest rung, a
/// malformed entry or a corrupt ring fails the QP.
#[derive(Debug, Default)]
pub struct Rings {
    queues: std::collections::BTreeMap<u32, QpRings>,
}

/// One QP's simulated (send, receive) rings.
type QpRings = (VecDeque<Rung<SendWqe>>, VecDeque<Rung<RecvWqe>>);

impl Rings {
    /// Entries rung and not yet taken by the engine, (send, receive), for `qpn`.
    pub fn waiting(&self, qpn: u32) -> (usize, usize) {
        self.queues.get(&qpn).map_or((0, 0), |(s, r)| (s.len(), r.len()))
    }
}

fn offer<W: Copy>(q: Option<&Rung<W>>) -> Offer<W> {
    match q {
        None => Offer::Empty,
        Some(Rung::Wr(w)) => Offer::Wr(*w),
        Some(Rung::Malformed) => Offer::Malformed,
        Some(Rung::Corrupt) => Offer::Corrupt,
    }
}

impl<X> WorkSource<X> for Rings {
    type Send<'a> = SendWqe;
    type Recv<'a> = RecvWqe;
    fn next_send(&mut self, qpn: u32, _ext: &mut X) -> Offer<SendWqe> {
        offer(self.queues.get(&qpn).and_then(|(s, _)| s.front()))
    }
    fn next_recv(&mut self, qpn: u32, _ext: &mut X) -> Offer<RecvWqe> {
        offer(self.queues.get(&qpn).and_then(|(_, r)| r.front()))
    }
    fn consume(&mut self, qpn: u32, _ext: &mut X, queue: Queue) {
        if let Some((s, r)) = self.queues.get_mut(&qpn) {
            match queue {
                Queue::Send => drop(s.pop_front()),
                Queue::Recv => drop(r.pop_front()),
            }
        }
    }
    fn finish(&mut self, _qpn: u32, _ext: &mut X, _queue: Queue) {}
    fn reset(&mut self, qpn: u32, _ext: &mut X) {
        self.queues.remove(&qpn);
    }
}

/// The client rings a simulated node's engine pulls every step ([`Engine::pull`]): the
/// simulator's own [`Rings`] (transport WRs a test rings in), or an embedder's — the runtime's
/// tests ring the clients' shared-memory WQEs and let its production conversion offer them,
/// so that conversion runs under the seeded loss, duplication and reordering too.
pub trait ClientRings: WorkSource<()> + Default {
    /// The QPs with entries waiting in any of their rings (appended to `out`).
    fn waiting_qps(&self, out: &mut Vec<u32>);
}

impl ClientRings for Rings {
    fn waiting_qps(&self, out: &mut Vec<u32>) {
        out.extend(self.queues.iter().filter(|(_, (s, r))| !s.is_empty() || !r.is_empty()).map(|(&q, _)| q));
    }
}

/// One host on the simulated link.
#[derive(Debug)]
pub struct Node<R = Rings> {
    /// Its QPs and SRQs.
    pub engine: Engine,
    /// Its memory table, through an epoch reader as an lcore reaches it (the engine's lookups
    /// and carried translations take the production path). The reader is offline between
    /// steps, so a test may call the table's own control methods (`mem.table()`) there.
    pub mem: Reader,
    /// Its IPv4 address (GID = IPv4-mapped).
    pub ip: Ipv4Addr,
    /// The node's CQ: (QPN, side, CQE) in the order the QPs produced them (the engine's calls
    /// made through the node write here directly; completions of calls on a QP itself join at
    /// the end of the step).
    pub cqes: VecDeque<(u32, CqSide, Cqe)>,
    /// Events collected by `drive`.
    pub events: VecDeque<(u32, AsyncEvent)>,
    /// The node's CQ refuses completions while [`Node::cqes`] holds this many (`None`: never
    /// full): a consumer that does not poll, for CQ overflow scenarios.
    pub cq_limit: Option<usize>,
    /// CQ overflows the engine reported: (QPN, side), once per refused retry.
    pub cq_overflows: Vec<(u32, CqSide)>,
    /// GIDs whose next hop this node cannot resolve (an empty neighbour entry): the engine
    /// holds QPs sending there ([`Engine::transmit`]); change it with [`Node::set_reachable`].
    pub unresolved: Vec<[u8; 16]>,
    /// Generation of `unresolved` (the neighbour table's).
    pub neigh_gen: u64,
    /// Times the engine held a QP for an unresolved neighbour.
    pub tx_neigh_holds: u64,
    /// Packets built for an unresolved neighbour and dropped by the port (after the hold).
    pub tx_no_neighbor: u64,
    /// Frame buffers for the engine's packets (reused).
    tx_spare: Vec<Vec<u8>>,
    /// Frames dropped by the receive parser (bad ICRC, malformed).
    pub rx_parse_drops: u64,
    /// Frames for a QPN this node does not have.
    pub rx_unknown_qp: u64,
    /// Its simulated client rings.
    pub rings: R,
    /// What the engine's pulls of [`Node::rings`] did, summed (`full`: some pull found a
    /// queue full).
    pub pulled: Pulled,
}

impl Node {
    /// A host at `ip` with an empty engine and memory table.
    pub fn new(ip: Ipv4Addr) -> Self {
        Node::with_rings(ip)
    }
    /// Ring a send WR into `qpn`'s simulated client ring (the engine pulls it at the next
    /// step, as the lcore pulls a client's ring when its doorbell rings).
    pub fn ring_send(&mut self, qpn: u32, wqe: SendWqe) {
        self.rings.queues.entry(qpn).or_default().0.push_back(Rung::Wr(wqe));
    }
    /// Ring a receive WR into `qpn`'s simulated client ring.
    pub fn ring_recv(&mut self, qpn: u32, wqe: RecvWqe) {
        self.rings.queues.entry(qpn).or_default().1.push_back(Rung::Wr(wqe));
    }
    /// Ring an entry that is no valid work request into a queue (what a client that bypassed
    /// the shim's checks writes): the engine consumes it and fails the QP.
    pub fn ring_malformed(&mut self, qpn: u32, queue: Queue) {
        let q = self.rings.queues.entry(qpn).or_default();
        match queue {
            Queue::Send => q.0.push_back(Rung::Malformed),
            Queue::Recv => q.1.push_back(Rung::Malformed),
        }
    }
    /// Make a queue's ring corrupt from here on (impossible indices): the engine fails the QP
    /// and reads that ring no further.
    pub fn ring_corrupt(&mut self, qpn: u32, queue: Queue) {
        let q = self.rings.queues.entry(qpn).or_default();
        match queue {
            Queue::Send => q.0.push_back(Rung::Corrupt),
            Queue::Recv => q.1.push_back(Rung::Corrupt),
        }
    }
}

impl<R: ClientRings> Node<R> {
    /// A host at `ip` with an empty engine and memory table, and client rings of type `R`.
    pub fn with_rings(ip: Ipv4Addr) -> Self {
        let mem = Arc::new(MemTable::new(Default::default())).reader().expect("a fresh table has reader slots");
        Node { engine: Engine::new(), mem, ip, cqes: VecDeque::new(), events: VecDeque::new(), cq_limit: None, cq_overflows: Vec::new(), unresolved: Vec::new(), neigh_gen: 0, tx_neigh_holds: 0, tx_no_neighbor: 0, tx_spare: Vec::new(), rx_parse_drops: 0, rx_unknown_qp: 0, rings: R::default(), pulled: Pulled::default() }
    }

    /// The end of a step: the reader goes offline (as an lcore that parks), so invalidations
    /// from the test between steps do not wait for it.
    pub(crate) fn end_step(&mut self) {
        self.mem.offline();
    }

    /// The node's GID (IPv4-mapped IPv6).
    pub fn gid(&self) -> [u8; 16] {
        gid_of(self.ip)
    }
    /// A QP.
    pub fn qp(&self, qpn: u32) -> &Qp {
        self.engine.qp(qpn).expect("no such QP")
    }
    /// A QP, mutably.
    pub fn qp_mut(&mut self, qpn: u32) -> &mut Qp {
        self.engine.qp_mut(qpn).expect("no such QP")
    }
    /// The engine, the memory reader and the node's CQ, borrowed apart.
    fn parts(&mut self) -> (&mut Engine, &Reader, NodeCq<'_>) {
        let cq = NodeCq { log: &mut self.cqes, events: &mut self.events, limit: self.cq_limit, overflows: &mut self.cq_overflows };
        (&mut self.engine, &self.mem, cq)
    }
    /// Post a send WR to `qpn` (its completions join [`Node::cqes`]).
    pub fn post_send(&mut self, qpn: u32, now: Instant, wqe: SendWqe) -> Result<(), PostError> {
        let (engine, _, mut cq) = self.parts();
        engine.post_send(qpn, now, wqe, &mut cq)
    }
    /// Post a receive WR to `qpn` (its completions join [`Node::cqes`]).
    pub fn post_recv(&mut self, qpn: u32, wqe: &RecvWqe) -> Result<(), PostError> {
        let (engine, _, mut cq) = self.parts();
        engine.post_recv(qpn, wqe, &mut cq)
    }
    /// Let the engine pull every QP's rung WRs ([`Engine::pull`]); true if any moved.
    pub fn pull_rings(&mut self, now: Instant) -> bool {
        let mut qpns = Vec::new();
        self.rings.waiting_qps(&mut qpns);
        let mut moved = false;
        for qpn in qpns {
            let cq = NodeCq { log: &mut self.cqes, events: &mut self.events, limit: self.cq_limit, overflows: &mut self.cq_overflows };
            let p = self.engine.pull(qpn, now, &mut self.rings, &mut { cq });
            moved |= p.moved != 0;
            self.pulled.moved += p.moved;
            self.pulled.malformed += p.malformed;
            self.pulled.corrupt += p.corrupt;
            self.pulled.full |= p.full;
        }
        moved
    }
    /// Modify QP `qpn` through the engine ([`Engine::modify`]): a move to RESET also empties
    /// its rings.
    pub fn modify(&mut self, qpn: u32, attr: &crate::QpAttr, mask: crate::AttrMask) -> Option<Result<(), crate::ModifyError>> {
        let mut cq = NodeCq { log: &mut self.cqes, events: &mut self.events, limit: self.cq_limit, overflows: &mut self.cq_overflows };
        self.engine.modify(qpn, attr, mask, &mut self.rings, &mut cq)
    }
    /// Hand a packet to the QP it is for (see [`Engine::handle_packet`]).
    pub fn handle_packet(&mut self, now: Instant, pkt: &RxPacket<'_>) -> bool {
        let (engine, mem, mut cq) = self.parts();
        engine.handle_packet(now, pkt, mem, &mut cq)
    }
    /// Let the engine serve its ready list ([`Engine::transmit`], as the lcore's pass does):
    /// up to `burst` packets per QP visit, `limit` packets in all (the port's room); the
    /// packets join `out`.
    pub fn transmit(&mut self, now: Instant, limit: usize, burst: usize, out: &mut Vec<Outgoing>) -> bool {
        let mut port = SimPort {
            unresolved: &self.unresolved,
            gen: self.neigh_gen,
            limit: out.len().saturating_add(limit),
            out,
            spare: &mut self.tx_spare,
            holds: &mut self.tx_neigh_holds,
            no_neighbor: &mut self.tx_no_neighbor,
        };
        let mut cq = NodeCq { log: &mut self.cqes, events: &mut self.events, limit: self.cq_limit, overflows: &mut self.cq_overflows };
        self.engine.transmit(now, &self.mem, &mut port, &mut cq, burst)
    }
    /// Make the next hop of `gid` resolvable or not (a neighbour entry appears or goes).
    pub fn set_reachable(&mut self, gid: [u8; 16], reachable: bool) {
        self.unresolved.retain(|g| *g != gid);
        if !reachable {
            self.unresolved.push(gid);
        }
        self.neigh_gen += 1;
    }
    /// A frame buffer of an [`Outgoing`] packet goes back for reuse.
    pub fn recycle(&mut self, roce: Vec<u8>) {
        self.tx_spare.push(roce);
    }
    /// A received frame, as the lcore takes it: header prediction ([`Engine::predict`]) or the
    /// full parse with the ICRC check deferred to the QP, then [`Engine::receive`] (which
    /// records predictions).
    pub fn receive_frame(&mut self, now: Instant, frame: &[u8]) {
        let (engine, mem, mut cq) = self.parts();
        let blank = TransportHeaders::new(BthRepr::new(Opcode(0), Qpn::new(0), Psn::new(0)));
        let mut pkt = RxPacket::new(blank, &[]);
        if let Some(slot) = engine.predict(0, frame, &mut pkt) {
            engine.receive(now, slot, 0, frame, &pkt, true, mem, &mut cq);
            return;
        }
        let Ok((f, check)) = parse_frame_deferred(frame) else {
            self.rx_parse_drops += 1;
            return;
        };
        let pkt = RxPacket::of_frame(&f, Some(check));
        let Some(slot) = engine.slot(pkt.hdr.bth.dest_qp.value()) else {
            self.rx_unknown_qp += 1;
            return;
        };
        engine.receive(now, slot, 0, frame, &pkt, false, mem, &mut cq);
    }
    /// Service the expired timers (see [`Engine::handle_timeout`]).
    pub fn handle_timeout(&mut self, now: Instant) -> bool {
        let (engine, mem, mut cq) = self.parts();
        engine.handle_timeout(now, mem, &mut cq)
    }
    /// The end of a step's completion work ([`Engine::deliver`], as the lcore's pass ends):
    /// completions the QPs kept (refused by a full CQ, or from calls made on a QP directly with
    /// the [`crate::cq::Deferred`] sink) are retried into the CQ, overflows are recorded in
    /// [`Node::cq_overflows`], events join [`Node::events`].
    pub fn collect(&mut self) {
        let (engine, _, mut cq) = self.parts();
        engine.deliver(&mut cq);
    }
    /// Completions of `qpn` on `side` collected so far (removed from the log).
    pub fn take_cqes(&mut self, qpn: u32, side: CqSide) -> Vec<Cqe> {
        let mut out = Vec::new();
        self.cqes.retain(|(q, s, c)| {
            if *q == qpn && *s == side {
                out.push(*c);
                false
            } else {
                true
            }
        });
        out
    }
}

/// IPv4-mapped GID of `ip`.
pub fn gid_of(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// The simulated network (`R`: the nodes' client rings, see [`ClientRings`]).
pub struct Sim<R = Rings> {
    /// Virtual time.
    pub now: Instant,
    /// One-way latency.
    pub latency_ns: u64,
    /// Hosts.
    pub nodes: Vec<Node<R>>,
    /// Random impairments.
    pub impair: Impairments,
    /// Every packet sent, in send order.
    pub trace: Vec<PacketInfo>,
    /// Record the trace (turn off for long soaks).
    pub record: bool,
    /// Packets each node may send per step (`usize::MAX`: everything ready).
    pub max_burst: usize,
    /// Packets a QP sends per visit of the ready list (the lcore's burst).
    pub burst: usize,
    outgoing: Vec<Outgoing>,
    link: Link<PacketInfo>,
    buf: Vec<u8>,
}

impl<R> core::fmt::Debug for Sim<R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sim").field("now", &self.now).field("nodes", &self.nodes.len()).field("link", &self.link).finish()
    }
}

/// `drive` did not reach quiescence within the step bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Livelock;

impl Sim {
    /// `n` nodes, seeded RNG, 1 µs latency.
    pub fn new(n: usize, seed: u64) -> Self {
        Sim::with_rings(n, seed)
    }
}

impl<R: ClientRings> Sim<R> {
    /// [`Sim::new`] with client rings of type `R`.
    pub fn with_rings(n: usize, seed: u64) -> Self {
        let nodes = (0..n)
            .map(|i| Node::with_rings(Ipv4Addr::new(10, 0, 0, i as u8 + 1)))
            .collect();
        Sim {
            now: Instant(0),
            latency_ns: 1_000,
            nodes,
            impair: Impairments::default(),
            trace: Vec::new(),
            record: true,
            max_burst: usize::MAX,
            burst: 32,
            outgoing: Vec::new(),
            link: Link::new(seed),
            buf: vec![0u8; 10_000],
        }
    }

    /// Add a filter; the first filter returning `Some` decides a packet's fate (before
    /// random impairments). Filters keep their own state (e.g. "only once").
    pub fn add_filter(&mut self, f: impl FnMut(&PacketInfo) -> Option<Fault> + 'static) {
        self.link.add_filter(f);
    }
    /// Remove all filters.
    pub fn clear_filters(&mut self) {
        self.link.clear_filters();
    }
    /// Node index owning `ip`'s GID.
    fn node_of(&self, gid: &[u8; 16]) -> Option<usize> {
        self.nodes.iter().position(|n| &n.gid() == gid)
    }

    /// Move every ready packet of node `i` onto the link.
    fn transmit_node(&mut self, i: usize) -> usize {
        let hl = frame_header_len(false);
        let now = self.now;
        let mut out = core::mem::take(&mut self.outgoing);
        self.nodes[i].transmit(now, self.max_burst, self.burst, &mut out);
        let sent = out.len();
        let node_ip = self.nodes[i].ip;
        for Outgoing { t, av, roce } in out.drain(..) {
            self.buf[hl..hl + t.len].copy_from_slice(&roce[..t.len]);
            self.nodes[i].recycle(roce);
            let dst = self.node_of(&av.dgid);
            let dst_ip = Ipv4Addr::from(<[u8; 4]>::try_from(&av.dgid[12..16]).expect("4 bytes"));
            let l3 = L3Info {
                src_mac: MacAddr([2, 0, 0, 0, 0, i as u8]),
                dst_mac: MacAddr([2, 0, 0, 0, 0, dst.unwrap_or(255) as u8]),
                src_ip: IpAddr::V4(node_ip),
                dst_ip: IpAddr::V4(dst_ip),
                tclass: av.traffic_class,
                ttl: av.hop_limit.max(1),
                flow_label: av.flow_label,
                udp_sport: udp_sport(av.flow_label, t.src_qpn, t.dest_qpn),
                ip_id: 0,
            };
            let n = emit_frame_headers(&mut self.buf, &l3, t.len).expect("frame headers");
            let total = n + t.len + ICRC_LEN;
            // The ICRC from the tail CRC the engine folded while writing (one pass), checked in
            // full by `parse_frame` right below.
            match t.tail_crc {
                Some(c) => finish_frame_with_tail_crc(&mut self.buf[..total], c).expect("finish frame"),
                None => finish_frame(&mut self.buf[..total]).expect("finish frame"),
            }
            let frame = self.buf[..total].to_vec();
            let parsed = parse_frame(&frame).expect("our own frame parses");
            let h = parsed.headers;
            let mut info = PacketInfo {
                time: now,
                from: i,
                to: dst.unwrap_or(usize::MAX),
                src_qpn: t.src_qpn,
                dst_qpn: h.bth.dest_qp.value(),
                opcode: h.bth.opcode,
                psn: h.bth.psn.value(),
                ack_req: h.bth.ack_req,
                syndrome: h.aeth.map(|a| a.syndrome),
                payload_len: parsed.payload.len(),
                udp_sport: parsed.udp_sport,
                fault: Fault::Pass,
            };
            let fault = self.link.fate(&info, &self.impair);
            info.fault = fault;
            if self.record {
                self.trace.push(info);
            }
            let Some(dst) = dst else { continue };
            self.link.send(now.add_ns(self.latency_ns), dst, frame, fault, hl);
        }
        self.outgoing = out;
        sent
    }

    fn collect(&mut self) {
        for n in &mut self.nodes {
            n.collect();
        }
    }

    fn deliver(&mut self, dst: usize, frame: &[u8]) {
        let now = self.now;
        // Predicted or parsed as the lcore does; the ICRC check is deferred to the engine: the
        // QP verifies it first or while placing the payload (`RxPacket::icrc()`; bad ones count
        // in its `icrc_errors`).
        self.nodes[dst].receive_frame(now, frame);
    }

    /// Make every QP of every node that has work eligible to send (after posting directly
    /// through `qp_mut`).
    pub fn kick_all(&mut self) {
        for n in &mut self.nodes {
            let qpns: Vec<u32> = n.engine.qpns().collect();
            for q in qpns {
                n.engine.kick(q);
            }
        }
    }

    /// One step: transmit everything ready, then advance the clock to the next delivery or
    /// timer and process it. Returns `false` when nothing is left to do.
    pub fn step(&mut self) -> bool {
        let more = self.step_inner();
        for n in &mut self.nodes {
            n.end_step();
        }
        more
    }

    fn step_inner(&mut self) -> bool {
        let now = self.now;
        for n in &mut self.nodes {
            n.pull_rings(now);
        }
        self.kick_all();
        for i in 0..self.nodes.len() {
            self.transmit_node(i);
        }
        self.collect();
        let next_pkt = self.link.next_arrival();
        let next_timer = self.nodes.iter().filter_map(|n| n.engine.poll_timeout()).min();
        let busy = self.nodes.iter().any(|n| n.engine.has_ready());
        let Some(next) = [next_pkt, next_timer].into_iter().flatten().min() else {
            return busy;
        };
        let next = if busy { self.now } else { next };
        if next > self.now {
            self.now = next;
        }
        while let Some((dst, frame)) = self.link.arrive(self.now) {
            self.deliver(dst, &frame);
        }
        let now = self.now;
        for n in &mut self.nodes {
            n.handle_timeout(now);
        }
        self.collect();
        true
    }

    /// Run until quiescent (no packet in flight, no timer, nothing to send), at most
    /// `max_steps` steps.
    pub fn drive(&mut self, max_steps: usize) -> Result<usize, Livelock> {
        for i in 0..max_steps {
            if !self.step() {
                return Ok(i);
            }
        }
        Err(Livelock)
    }

    /// Run until `cond` holds or quiescence, at most `max_steps` steps; returns whether
    /// `cond` held.
    pub fn drive_until(&mut self, max_steps: usize, mut cond: impl FnMut(&Self) -> bool) -> bool {
        for _ in 0..max_steps {
            if cond(self) {
                return true;
            }
            if !self.step() {
                return cond(self);
            }
        }
        cond(self)
    }

    /// Run until virtual time reaches `t` (or quiescence).
    pub fn run_until(&mut self, t: Instant, max_steps: usize) {
        let _ = self.drive_until(max_steps, |s| s.now >= t);
        if self.now < t {
            self.now = t;
        }
    }
}

/// Connection parameters for [`Sim::connect`] (defaults: the SEMANTICS.md §7 setup).
#[derive(Clone, Copy, Debug)]
pub struct PairParams {
    /// Transport.
    pub qp_type: crate::QpType,
    /// Path MTU.
    pub mtu: crate::PathMtu,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// Advertised RNR timer code.
    pub min_rnr_timer: u8,
    /// Requester READ/ATOMIC credits.
    pub max_rd_atomic: u8,
    /// Responder resources.
    pub max_dest_rd_atomic: u8,
    /// `qp_access_flags`.
    pub access: u32,
    /// First PSN of each side's requester.
    pub sq_psn: u32,
    /// Capacities.
    pub caps: crate::QpCaps,
    /// PD of both QPs.
    pub pd: u32,
    /// GRH traffic class of both QPs' address vectors (DSCP << 2 | ECN).
    pub traffic_class: u8,
}

impl Default for PairParams {
    fn default() -> Self {
        PairParams {
            qp_type: crate::QpType::Rc,
            mtu: crate::PathMtu::Mtu1024,
            timeout: 14,
            retry_cnt: 3,
            rnr_retry: 3,
            min_rnr_timer: 1,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            access: 2 | 4 | 8,
            sq_psn: 100,
            caps: crate::QpCaps { max_send_wr: 1024, max_recv_wr: 1024, max_send_sge: 8, max_recv_sge: 8, max_inline_data: 256 },
            pd: 1,
            traffic_class: 0,
        }
    }
}

impl<R: ClientRings> Sim<R> {
    /// Create QP `qa` on node `a` and `qb` on node `b` and move both to RTS connected to
    /// each other (UD: RTS with Q_Key 0x11111111, no peer).
    pub fn connect(&mut self, a: usize, qa: u32, b: usize, qb: u32, p: &PairParams) {
        self.connect_with_srq(a, qa, None, b, qb, None, p)
    }

    /// [`Sim::connect`] with SRQs.
    #[allow(clippy::too_many_arguments)]
    pub fn connect_with_srq(&mut self, a: usize, qa: u32, srq_a: Option<u32>, b: usize, qb: u32, srq_b: Option<u32>, p: &PairParams) {
        let (ga, gb) = (self.nodes[a].gid(), self.nodes[b].gid());
        for (node, qpn, srq, peer, peer_gid) in [(a, qa, srq_a, qb, gb), (b, qb, srq_b, qa, ga)] {
            let mut qp = Qp::new(qpn, p.qp_type, p.pd, p.caps, srq).expect("create QP");
            bring_up(&mut qp, peer, peer_gid, p);
            self.nodes[node].engine.add_qp(qp);
        }
    }
}

/// RESET → INIT → RTR → RTS with the masks the IBTA table requires.
pub fn bring_up(qp: &mut Qp, peer: u32, peer_gid: [u8; 16], p: &PairParams) {
    use crate::attr::{AddressVector, AttrMask as M, QpAttr, QpState};
    let av = AddressVector { dgid: peer_gid, hop_limit: 64, port: 1, traffic_class: p.traffic_class, ..AddressVector::default() };
    let a = QpAttr {
        qp_state: QpState::Init,
        qkey: 0x1111_1111,
        path_mtu: p.mtu,
        qp_access_flags: p.access,
        port_num: 1,
        dest_qp_num: pmrxe_wire::Qpn::new(peer),
        rq_psn: Psn::new(p.sq_psn),
        sq_psn: Psn::new(p.sq_psn),
        timeout: p.timeout,
        retry_cnt: p.retry_cnt,
        rnr_retry: p.rnr_retry,
        min_rnr_timer: p.min_rnr_timer,
        max_rd_atomic: p.max_rd_atomic,
        max_dest_rd_atomic: p.max_dest_rd_atomic,
        ah_attr: av,
        ..QpAttr::default()
    };
    let ty = qp.qp_type();
    let init = match ty {
        crate::QpType::Ud => M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
        _ => M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    };
    qp.modify(&a, init, &mut Deferred).expect("INIT");
    let rtr = match ty {
        crate::QpType::Ud => M::STATE,
        crate::QpType::Uc => M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
        crate::QpType::Rc => M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
    };
    qp.modify(&QpAttr { qp_state: QpState::Rtr, ..a }, rtr, &mut Deferred).expect("RTR");
    let rts = match ty {
        crate::QpType::Rc => M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
        _ => M::STATE | M::SQ_PSN,
    };
    qp.modify(&QpAttr { qp_state: QpState::Rts, ..a }, rts, &mut Deferred).expect("RTS");
    if ty == crate::QpType::Ud {
        // A UD QP's path MTU is the port's active MTU.
        qp.set_port_mtu(p.mtu);
    }
}
