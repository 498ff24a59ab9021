//! The per-core run-to-completion loop.
//!
//! One [`Lcore`] owns a set of devices (ports), the QPs and CQs of the clients assigned to it,
//! and their shared-memory rings. Each iteration:
//!
//! 1. control commands (create/modify/destroy objects) — a lock-free `try_recv`;
//! 2. `rx_burst` on every port → parse and validate → ARP, or dispatch by destination QPN to
//!    the owning QP's responder/completer;
//! 3. doorbells: swap each non-zero doorbell word of each client to 0 and drain exactly those
//!    SQ/RQ rings into the engine (no scan of idle QPs);
//! 4. timers (retransmit, RNR) of QPs whose deadline passed;
//! 5. requester: every QP with something to send builds packets straight into port buffers
//!    (headers + payload gathered from the MR; then Eth/IP/UDP + ICRC);
//! 6. completions into client CQ rings (and a completion event for armed CQs);
//! 7. `tx_burst`.
//!
//! The loop makes no system call, takes no lock and allocates nothing on this path: all
//! vectors are reserved up front and only used within capacity, rings are shared memory,
//! the clock is the vDSO. The exceptions are explicit and counted: idle sleeps (back-off
//! mode, only after an empty iteration), the eventfd write for a CQ the application armed,
//! and replies to control commands. Each iteration is a quiescent point for MR reclamation:
//! no `MrRef` outlives the call that took it.
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam::channel::{Receiver, Sender, TryRecvError};
use pmrxe_abi::ring::{Consumer, Producer, PushError};
use pmrxe_abi::{
    ClientPage, CqNotify, CqSegmentLayout, QpSegmentLayout, QpShared, ShmCqe, ShmRecvWqe, ShmSendWqe, DOORBELL_SLOTS, DOORBELL_WORDS,
};
use pmrxe_mem::{MemTable, Reader};
use pmrxe_abi::SrqSegmentLayout;
use pmrxe_transport::{AddressVector, AttrMask, CqSide, Cqe, Engine, Instant, Qp, QpAttr, QpType, QpnLayout, RxPacket, SendOp, SendWqe, Srq, SrqAttr};
use pmrxe_wire::{self as wire, MacAddr};

use crate::call::CallError;
use crate::clock::Clock;
use crate::convert;
use crate::gsi::{GsiFrame, GsiPipe, MAX_GSI_FRAME};
use crate::idle::Idle;
use crate::link::{FrameBuf, Link};
use crate::neigh::{gid_to_ip, Neighbors};
use crate::shm::{EventFd, Segment};
use crate::stats::{bump, DropStats, LcoreStats};

/// Frames per burst.
pub const BURST: usize = 32;

/// One device (port) as this lcore serves it.
#[derive(Clone, Debug, Default)]
pub struct DeviceConfig {
    /// Device index (pmrxeN).
    pub index: u32,
    /// Our MAC.
    pub mac: [u8; 6],
    /// GID table: index → GID (IPv4-mapped or IPv6).
    pub gids: Vec<[u8; 16]>,
    /// Ethernet MTU.
    pub mtu: u16,
    /// ECN on: every RoCE frame leaves ECT(0) (DSCP from the QP's GRH traffic class).
    pub ecn: bool,
    /// Congestion control of every QP on this device ([`Qp::set_congestion`]): CNPs for
    /// CE-marked packets and DCQCN. Off (default) unless the port's `ecn` is on.
    pub cc: pmrxe_transport::CcConfig,
}


/// Cross-lcore hand-off of received frames. With several lcores every lcore polls its own RX
/// queue of every port, so a frame can arrive on an lcore that does not own its destination
/// QP; it is passed, as the owned buffer (no copy), to the owner's inbox: a bounded lock-free
/// MPMC queue (crossbeam `ArrayQueue`), drained by the owner every iteration. A QP's owner is
/// encoded in its QPN (`qpn % lcores`), so routing needs no shared table.
pub struct Handoff<B> {
    inbox: Vec<crossbeam::queue::ArrayQueue<(usize, B)>>,
}

impl<B> Handoff<B> {
    /// Inboxes for `lcores` lcores, `depth` frames each (allocated here, never on the fast path).
    pub fn new(lcores: usize, depth: usize) -> Arc<Handoff<B>> {
        Arc::new(Handoff { inbox: (0..lcores).map(|_| crossbeam::queue::ArrayQueue::new(depth.max(1))).collect() })
    }
    /// Number of lcores.
    pub fn lcores(&self) -> usize {
        self.inbox.len()
    }
    /// The lcore owning `qpn`.
    pub fn owner(&self, qpn: u32) -> usize {
        qpn as usize % self.inbox.len()
    }
}

/// A QP handed to the lcore by the control thread.
pub struct QpSetup {
    /// The engine QP (state RESET).
    pub qp: Qp,
    /// Owning client.
    pub client: u32,
    /// Device index.
    pub device: u32,
    /// The QP's ring segment.
    pub seg: Arc<Segment>,
    /// Where its rings are.
    pub layout: QpSegmentLayout,
    /// Send CQ handle.
    pub send_cq: u32,
    /// Receive CQ handle.
    pub recv_cq: u32,
    /// Doorbell slot in the client's page.
    pub db_slot: u16,
}

/// Control commands. Replies go back on the enclosed channel.
pub enum Cmd {
    /// A client connected (its doorbell page).
    /// `events_fd`, when given, is signalled after every event queued on `events` (the client's
    /// `async_fd`, so epoll loops see pending asynchronous events).
    AddClient { client: u32, page: Arc<Segment>, events: Sender<pmrxe_abi::ctrl::AsyncEvent>, events_fd: Option<Arc<crate::shm::EventFd>> },
    /// A client is gone: drop all its QPs and CQs (after flushing nothing: its memory is
    /// going away). Replies when done.
    RemoveClient { client: u32, done: Sender<()> },
    /// A CQ and its ring segment.
    AddCq { cq: u32, client: u32, seg: Arc<Segment>, layout: CqSegmentLayout, channel: Option<Arc<EventFd>>, done: Sender<Result<(), String>> },
    /// Destroy a CQ (refused while a QP uses it).
    RemoveCq { cq: u32, done: Sender<Result<(), i32>> },
    /// ibv_resize_cq within the CQ's ring: EOPNOTSUPP if `cqe` does not fit the ring, EINVAL if
    /// fewer than the completions already produced and not yet polled.
    ResizeCq { cq: u32, cqe: u32, done: Sender<Result<(), i32>> },
    /// A new QP.
    AddQp { setup: Box<QpSetup>, done: Sender<Result<(), String>> },
    /// ibv_modify_qp.
    ModifyQp { qpn: u32, attr: Box<QpAttr>, mask: AttrMask, done: Sender<Result<(), i32>> },
    /// ibv_query_qp.
    QueryQp { qpn: u32, done: Sender<Option<QpAttr>> },
    /// ibv_destroy_qp.
    DestroyQp { qpn: u32, done: Sender<Result<(), i32>> },
    /// An address handle for UD WQEs.
    AddAh { ah: u32, av: AddressVector },
    /// Drop an address handle.
    RemoveAh { ah: u32 },
    /// Per-QP statistics.
    QpStats { done: Sender<Vec<(u32, pmrxe_transport::QpStats)>> },
    /// A shared receive queue and its ring.
    AddSrq { srq: Box<Srq>, client: u32, seg: Arc<Segment>, layout: SrqSegmentLayout, db_slot: u16, done: Sender<Result<(), String>> },
    /// ibv_modify_srq (limit only; resizing is not supported).
    ModifySrq { srqn: u32, attr: SrqAttr, arm: bool, done: Sender<Result<(), i32>> },
    /// ibv_query_srq.
    QuerySrq { srqn: u32, done: Sender<Option<SrqAttr>> },
    /// ibv_destroy_srq (refused while a QP uses it).
    RemoveSrq { srqn: u32, done: Sender<Result<(), i32>> },
}

/// Doorbell slot values with this bit name an SRQ, not a QP.
const SRQ_SLOT: u32 = 0x8000_0000;

/// What the lcore keeps beside an SRQ the engine owns.
struct SrqSlot {
    client: u32,
    _seg: Arc<Segment>,
    ring: Consumer<ShmRecvWqe>,
    refs: u32,
    backlog: bool,
}

/// What the lcore keeps beside each QP of its engine (the engine's attachment).
struct QpSlot {
    client: u32,
    dev: usize,
    _seg: Arc<Segment>,
    sq: Consumer<ShmSendWqe>,
    rq: Option<Consumer<ShmRecvWqe>>,
    /// Index of the send CQ in `Lcore::cqs`.
    send_cq: usize,
    /// Index of the receive CQ in `Lcore::cqs`.
    recv_cq: usize,
    stash: Option<(CqSide, Cqe)>,
    is_ud: bool,
    /// WQEs are waiting in a ring because the engine queue was full.
    backlog: bool,
    /// On `Lcore::backlog` (listed once).
    backlog_listed: bool,
    /// Eth/IP/UDP addressing of the last path this QP sent on.
    path: Option<PathCache>,
    /// Since when the QP's next packet has been held for an unresolved neighbour.
    hold_since: Option<Instant>,
}

/// A QP's resolved path: valid while the address vector, destination QPN and the neighbour
/// table's generation are unchanged (RC/UC: set at RTR, so one resolution per connection).
#[derive(Clone, Copy)]
struct PathCache {
    av: AddressVector,
    dest_qpn: u32,
    neigh_gen: u64,
    l3: wire::L3Info,
    /// The destination is one of this port's own addresses: loop back inside the device.
    local: bool,
}

/// How long a QP's send state is held while ARP/ND resolves its next hop; after that the
/// packet is built and dropped (counted `tx_no_neighbor`) and the transport's own timeouts
/// decide, so a peer that never answers cannot hang a WR.
const NEIGH_HOLD_NS: u64 = 50_000_000;

struct CqSlot {
    /// The CQ's handle (what events name).
    handle: u32,
    client: u32,
    seg: Arc<Segment>,
    ring: Producer<ShmCqe>,
    notify: *const CqNotify,
    channel: Option<Arc<EventFd>>,
    fresh: bool,
    refs: u32,
}

// SAFETY: `notify` points into `seg`, which the slot keeps alive; the slot moves between
// threads only inside a `Cmd` before the lcore owns it.
unsafe impl Send for CqSlot {}

impl CqSlot {
    fn notify(&self) -> &CqNotify {
        // SAFETY: offset 0 of the CQ segment holds a CqNotify (initialised by the service);
        // the segment outlives the slot; CqNotify is all atomics.
        unsafe { &*self.notify }
    }
}

struct ClientSlot {
    id: u32,
    page: Arc<Segment>,
    events: Sender<pmrxe_abi::ctrl::AsyncEvent>,
    events_fd: Option<Arc<crate::shm::EventFd>>,
    /// doorbell slot → QPN (0 = none).
    slots: Vec<u32>,
}

impl ClientSlot {
    /// Queue an asynchronous event for the client and make its `async_fd` readable (a full
    /// queue drops the event, as before: the client is not reading them).
    fn post_event(&self, ev: pmrxe_abi::ctrl::AsyncEvent) {
        if self.events.try_send(ev).is_ok() {
            if let Some(fd) = &self.events_fd {
                fd.signal();
            }
        }
    }

    fn page(&self) -> &ClientPage {
        // SAFETY: the client page segment starts with a ClientPage the service initialised;
        // it is all atomics and plain integers, and the Arc keeps it mapped.
        unsafe { &*(self.page.as_ptr() as *const ClientPage) }
    }
}

struct Port<L: Link> {
    link: L,
    dev: DeviceConfig,
    /// The GIDs as IP addresses (same order as `dev.gids`), converted once.
    ips: Vec<IpAddr>,
    rx: Vec<L::Buf>,
    tx: Vec<L::Buf>,
    /// Frames this port sent to one of its own addresses (two QPs of the same device): looped
    /// back inside the device, as rxe and every NIC do, and received on the next iteration.
    lo: Vec<L::Buf>,
}

impl<L: Link> Port<L> {
    fn owns_ip(&self, ip: IpAddr) -> bool {
        self.ips.contains(&ip)
    }
    /// Our first address of the family of `like`.
    fn ip_like(&self, like: IpAddr) -> Option<IpAddr> {
        self.ips.iter().copied().find(|i| i.is_ipv4() == like.is_ipv4())
    }
}

/// Handles the control thread keeps for an lcore.
#[derive(Clone)]
pub struct LcoreHandle {
    /// Command queue.
    pub cmds: Sender<Cmd>,
    /// Counters.
    pub stats: Arc<LcoreStats>,
    /// Parser drops by reason.
    pub drops: Arc<DropStats>,
    /// Index of this lcore (doorbell bitmap row).
    pub index: usize,
    /// Objects the lcore removed, to be dropped here (unmapping their rings and freeing their
    /// queues are system calls the lcore must not make).
    pub graveyard: Receiver<Box<dyn Send>>,
    /// The service's stop flag (the lcore's own): tells `call` "stopping" from "stuck".
    pub stop: Arc<AtomicBool>,
}

impl LcoreHandle {
    /// Drop whatever the lcore handed back (call from a control thread after a command).
    pub fn bury(&self) {
        while let Ok(x) = self.graveyard.try_recv() {
            drop(x);
        }
    }

    /// Send a command and wait for its reply without ever blocking in a way the lcore would
    /// have to wake with a system call: poll the reply channel with short sleeps, for as long
    /// as the lcore is alive and making progress (see [`crate::call`] for the rules and errors).
    pub fn call<R>(&self, make: impl FnOnce(Sender<R>) -> Cmd) -> Result<R, CallError> {
        let (tx, rx) = crossbeam::channel::bounded(1);
        let w = crate::call::LiveWatch { stop: &self.stop, stats: &self.stats, t0: std::time::Instant::now() };
        if self.cmds.send(make(tx)).is_err() {
            return Err(if crate::call::Watch::stopping(&w) { CallError::Stopping } else { CallError::Gone { index: self.index } });
        }
        let r = crate::call::wait_reply(&rx, self.index, &w, crate::call::STALL_LIMIT);
        self.bury();
        r
    }
}

/// Capture tap: frames the lcore saw, copied out only while a capture is running.
pub trait Tap: Send {
    /// Is a capture running? (one relaxed load per burst when off)
    fn active(&self) -> bool;
    /// A frame sent (`tx = true`) or received.
    fn frame(&self, tx: bool, data: &[u8]);
}

/// A poll-mode lcore.
pub struct Lcore<L: Link> {
    index: usize,
    ports: Vec<Port<L>>,
    /// This lcore's epoch reader of the MR table (QSBR): `&*self.mem` is what the QPs copy
    /// through; `poll_once` ends with its quiescent point.
    mem: Box<Reader>,
    cmds: Receiver<Cmd>,
    /// The transport engine: every QP and SRQ of this lcore, with the work lists.
    engine: Engine<QpSlot>,
    /// CQs by index (QPs refer to theirs by index: no lookup per completion).
    cqs: Vec<Option<CqSlot>>,
    /// CQ handle → index (control path only).
    cq_index: HashMap<u32, usize>,
    /// CQs with staged, unpublished completions (indices; each listed once: `CqSlot::fresh`).
    dirty_cqs: Vec<usize>,
    srqs: HashMap<u32, SrqSlot>,
    clients: Vec<ClientSlot>,
    ahs: HashMap<u32, AddressVector>,
    /// The send WQE a client's ring entry is converted into before `post_send` (reused: no
    /// per-post 512-byte clear or move).
    wqe_scratch: Box<SendWqe>,
    neigh: Neighbors,
    stats: Arc<LcoreStats>,
    drops: Arc<DropStats>,
    clock: Clock,
    idle: Idle,
    stop: Arc<AtomicBool>,
    tap: Option<Box<dyn Tap>>,
    grave: Sender<Box<dyn Send>>,
    handoff: Option<Arc<Handoff<L::Buf>>>,
    last_solicit: Instant,
    /// Reserved scratch: QPNs whose doorbell rang this iteration.
    work: Vec<u32>,
    /// QPNs with WQEs left in their rings because the engine's queue was full.
    backlog: Vec<u32>,
    /// Reserved scratch: ready QPs whose port was full this pass (served first next time).
    deferred: Vec<u32>,
    /// QPNs holding their next packet until a neighbour resolves.
    neigh_wait: Vec<u32>,
    /// Neighbour-table generation `neigh_wait` was last re-examined at, and when.
    neigh_wait_seen: (u64, Instant),
    /// QP1 queues to and from the connection manager (None: QP1 frames are dropped).
    gsi: Option<Arc<GsiPipe>>,
    /// PSN of the next MAD this lcore sends from QP1 (receivers do not check it).
    gsi_psn: u32,
}

/// Capacity of the per-lcore QP table.
pub const MAX_QPS_PER_LCORE: usize = 4096;

impl<L: Link> Lcore<L> {
    /// Build an lcore over `ports` (each with its device description).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: usize,
        ports: Vec<(L, DeviceConfig)>,
        mem: Arc<MemTable>,
        neighbors: &[(IpAddr, [u8; 6])],
        idle: pmrxe_config::IdleConfig,
        stop: Arc<AtomicBool>,
        tap: Option<Box<dyn Tap>>,
    ) -> (Lcore<L>, LcoreHandle) {
        let (tx, rx) = crossbeam::channel::unbounded();
        let (grave, grave_rx) = crossbeam::channel::unbounded();
        let stats = Arc::new(LcoreStats::default());
        let drops = Arc::new(DropStats::default());
        let mut neigh = Neighbors::new();
        for (ip, mac) in neighbors {
            neigh.add_static(*ip, *mac);
        }
        let ports = ports
            .into_iter()
            .map(|(link, dev)| {
                let ips = dev.gids.iter().map(gid_to_ip).collect();
                Port { link, dev, ips, rx: Vec::with_capacity(BURST), tx: Vec::with_capacity(BURST * 4), lo: Vec::with_capacity(BURST * 4) }
            })
            .collect();
        let lc = Lcore {
            index,
            ports,
            mem: Box::new(mem.reader().expect("more lcores than MemLimits::max_readers")),
            cmds: rx,
            engine: Engine::with_layout(QpnLayout { lcores: 1, slots: MAX_QPS_PER_LCORE as u32 }, 0),
            cqs: Vec::with_capacity(MAX_QPS_PER_LCORE),
            cq_index: HashMap::with_capacity(MAX_QPS_PER_LCORE),
            dirty_cqs: Vec::with_capacity(MAX_QPS_PER_LCORE),
            srqs: HashMap::with_capacity(256),
            clients: Vec::with_capacity(256),
            ahs: HashMap::with_capacity(1024),
            wqe_scratch: Box::new(SendWqe::new(0, SendOp::Send)),
            neigh,
            stats: stats.clone(),
            drops: drops.clone(),
            clock: Clock::new(),
            idle: Idle::new(idle),
            stop,
            tap,
            grave,
            handoff: None,
            last_solicit: Instant(0),
            work: Vec::with_capacity(MAX_QPS_PER_LCORE),
            backlog: Vec::with_capacity(MAX_QPS_PER_LCORE),
            deferred: Vec::with_capacity(MAX_QPS_PER_LCORE),
            neigh_wait: Vec::with_capacity(MAX_QPS_PER_LCORE),
            neigh_wait_seen: (0, Instant(0)),
            gsi: None,
            gsi_psn: 0,
        };
        let stop = lc.stop.clone();
        (lc, LcoreHandle { cmds: tx, stats, drops, index, graveyard: grave_rx, stop })
    }

    /// Join a multi-lcore service: frames for QPs owned by another lcore are handed over
    /// through `h`. Must be called before `run`.
    pub fn set_handoff(&mut self, h: Arc<Handoff<L::Buf>>) {
        // QPNs of this lcore are `qpn % lcores == index`; the engine's slab follows.
        self.engine = Engine::with_layout(qpn_layout(h.lcores()), self.index);
        self.handoff = Some(h);
    }

    /// Carry QP1 (CM MADs) to and from the connection manager through `pipe`. Must be called
    /// before `run`.
    pub fn set_gsi(&mut self, pipe: Arc<GsiPipe>) {
        self.gsi = Some(pipe);
    }

    /// Run until the stop flag is set.
    pub fn run(&mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            let now = self.clock.now();
            let work = self.poll_once(now);
            if work {
                bump(&self.stats.busy_iterations, 1);
                self.idle.work();
            } else {
                bump(&self.stats.idle_iterations, 1);
                // The next timer bounds a sleep; only worth computing when we may sleep.
                let next = if self.idle.may_sleep() {
                    self.next_deadline().map(|d| d.0.saturating_sub(self.clock.now().0) / 1000)
                } else {
                    None
                };
                // Offline before a sleep: a parked lcore never delays an invalidation.
                if self.idle.idle(next, || self.mem.offline()) {
                    bump(&self.stats.idle_sleeps, 1);
                }
            }
        }
        // Shutdown: flush every QP to ERR so clients see WR_FLUSH_ERR, then deliver CQEs.
        let now = self.clock.now();
        self.engine.for_each_mut(|qp, _| fatal(qp));
        self.deliver_completions(now);
        for c in &self.clients {
            c.page().service_down.store(1, Ordering::Release);
        }
    }

    /// One loop iteration; returns whether it did any work.
    pub fn poll_once(&mut self, now: Instant) -> bool {
        let mut work = self.commands();
        work |= self.receive(now);
        work |= self.doorbells(now);
        work |= self.timers(now);
        work |= self.gsi_transmit(now);
        work |= self.transmit(now);
        work |= self.deliver_completions(now);
        work |= self.flush_tx();
        // End of the iteration: no MrRef is alive, a quiescent point for MR invalidation.
        self.mem.quiescent();
        work
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.engine.poll_timeout()
    }

    // ---- control ------------------------------------------------------------------------

    fn commands(&mut self) -> bool {
        let mut any = false;
        loop {
            match self.cmds.try_recv() {
                Ok(c) => {
                    any = true;
                    bump(&self.stats.commands, 1);
                    self.command(c);
                }
                Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => return any,
            }
        }
    }

    fn command(&mut self, c: Cmd) {
        match c {
            Cmd::AddClient { client, page, events, events_fd } => {
                self.clients.push(ClientSlot { id: client, page, events, events_fd, slots: vec![0; DOORBELL_SLOTS] });
            }
            Cmd::RemoveClient { client, done } => {
                let qpns: Vec<u32> = self.engine.iter().filter(|(_, s)| s.client == client).map(|(q, _)| q.qpn()).collect();
                for q in qpns {
                    self.remove_qp(q);
                }
                let cqs: Vec<u32> = self.cq_index.iter().filter(|(_, &i)| self.cqs[i].as_ref().is_some_and(|c| c.client == client)).map(|(k, _)| *k).collect();
                for k in cqs {
                    if let Some(c) = self.cq_index.remove(&k).and_then(|i| self.cqs[i].take()) {
                        let _ = self.grave.send(Box::new(c));
                    }
                }
                let srqs: Vec<u32> = self.srqs.iter().filter(|(_, x)| x.client == client).map(|(k, _)| *k).collect();
                for k in srqs {
                    if let Some(x) = self.srqs.remove(&k) {
                        let _ = self.grave.send(Box::new((x, self.engine.remove_srq(k))));
                    }
                }
                if let Some(i) = self.clients.iter().position(|c| c.id == client) {
                    let c = self.clients.swap_remove(i);
                    let _ = self.grave.send(Box::new(c));
                }
                let _ = done.send(());
            }
            Cmd::AddCq { cq, client, seg, layout, channel, done } => {
                // SAFETY: the service created this segment with `layout` and initialised the
                // ring; the Arc in the slot keeps it mapped as long as the producer lives.
                let ring = unsafe {
                    Producer::<ShmCqe>::attach(seg.as_ptr().add(layout.ring_offset as usize), seg.len() - layout.ring_offset as usize, layout.capacity)
                };
                let r = ring.map(|ring| {
                    let notify = seg.as_ptr() as *const CqNotify;
                    let slot = CqSlot { handle: cq, client, seg, ring, notify, channel, fresh: false, refs: 0 };
                    let i = match self.cqs.iter().position(Option::is_none) {
                        Some(i) => {
                            self.cqs[i] = Some(slot);
                            i
                        }
                        None => {
                            self.cqs.push(Some(slot));
                            self.cqs.len() - 1
                        }
                    };
                    if let Some(old) = self.cq_index.insert(cq, i).and_then(|o| self.cqs[o].take()) {
                        let _ = self.grave.send(Box::new(old));
                    }
                });
                let _ = done.send(r.map_err(|e| e.to_string()));
            }
            Cmd::RemoveCq { cq, done } => {
                let r = match self.cq_index.get(&cq).and_then(|&i| self.cqs[i].as_ref()) {
                    None => Err(libc::EINVAL),
                    Some(c) if c.refs > 0 => Err(libc::EBUSY),
                    Some(_) => {
                        if let Some(c) = self.cq_index.remove(&cq).and_then(|i| self.cqs[i].take()) {
                            let _ = self.grave.send(Box::new(c));
                        }
                        Ok(())
                    }
                };
                let _ = done.send(r);
            }
            Cmd::ResizeCq { cq, cqe, done } => {
                // Work posted before this call completes first (as on hardware, where the
                // resize is queued behind it), so the count below includes it.
                let now = self.clock.now();
                self.doorbells(now);
                self.transmit(now);
                self.flush_tx();
                self.receive(now);
                self.deliver_completions(now);
                let r = match self.cq_index.get(&cq).and_then(|&i| self.cqs[i].as_mut()) {
                    None => Err(libc::EINVAL),
                    Some(c) => {
                        let cap = c.ring.capacity();
                        match c.ring.free() {
                            Err(_) => Err(libc::EIO),
                            Ok(_) if cqe >= cap => Err(libc::EOPNOTSUPP),
                            Ok(free) if cap - free > cqe => Err(libc::EINVAL),
                            Ok(_) => Ok(()),
                        }
                    }
                };
                let _ = done.send(r);
            }
            Cmd::AddQp { setup, done } => {
                let _ = done.send(self.add_qp(*setup));
            }
            Cmd::ModifyQp { qpn, attr, mask, done } => {
                let r = self
                    .engine
                    .with(qpn, |qp, s| {
                        let r = qp.modify(&attr, mask).map_err(|_| libc::EINVAL);
                        if r.is_ok() && mask.contains(AttrMask::STATE) && attr.qp_state == pmrxe_transport::QpState::Reset {
                            s.reset_rings();
                        }
                        r
                    })
                    .unwrap_or(Err(libc::EINVAL));
                let _ = done.send(r);
            }
            Cmd::QueryQp { qpn, done } => {
                let a = self.engine.qp(qpn).map(Qp::query);
                let _ = done.send(a);
            }
            Cmd::DestroyQp { qpn, done } => {
                let r = if self.remove_qp(qpn) { Ok(()) } else { Err(libc::EINVAL) };
                let _ = done.send(r);
            }
            Cmd::AddAh { ah, av } => {
                self.ahs.insert(ah, av);
            }
            Cmd::RemoveAh { ah } => {
                self.ahs.remove(&ah);
            }
            Cmd::AddSrq { srq, client, seg, layout, db_slot, done } => {
                let r = (|| {
                    let ci = self.clients.iter().position(|c| c.id == client).ok_or("unknown client")?;
                    if db_slot as usize >= DOORBELL_SLOTS || self.clients[ci].slots[db_slot as usize] != 0 {
                        return Err("doorbell slot in use".to_string());
                    }
                    // SAFETY: the service laid the segment out with `layout` and initialised the
                    // ring; the slot keeps the segment alive as long as the consumer.
                    let ring = unsafe { Consumer::<ShmRecvWqe>::attach(seg.as_ptr(), seg.len(), layout.capacity) }.map_err(|e| e.to_string())?;
                    let srqn = srq.srqn();
                    self.clients[ci].slots[db_slot as usize] = SRQ_SLOT | srqn;
                    self.engine.add_srq(*srq);
                    self.srqs.insert(srqn, SrqSlot { client, _seg: seg, ring, refs: 0, backlog: false });
                    Ok(())
                })();
                let _ = done.send(r);
            }
            Cmd::ModifySrq { srqn, attr, arm, done } => {
                let r = match self.engine.srq_mut(srqn) {
                    None => Err(libc::EINVAL),
                    Some(s) => {
                        if arm {
                            s.arm_limit(attr.srq_limit);
                        }
                        Ok(())
                    }
                };
                let _ = done.send(r);
            }
            Cmd::QuerySrq { srqn, done } => {
                let _ = done.send(self.engine.srq(srqn).map(Srq::query));
            }
            Cmd::RemoveSrq { srqn, done } => {
                let r = match self.srqs.get(&srqn) {
                    None => Err(libc::EINVAL),
                    Some(s) if s.refs > 0 => Err(libc::EBUSY),
                    Some(s) => {
                        let client = s.client;
                        if let Some(x) = self.srqs.remove(&srqn) {
                            let _ = self.grave.send(Box::new((x, self.engine.remove_srq(srqn))));
                        }
                        if let Some(c) = self.clients.iter_mut().find(|c| c.id == client) {
                            for v in c.slots.iter_mut().filter(|v| **v == SRQ_SLOT | srqn) {
                                *v = 0;
                            }
                        }
                        Ok(())
                    }
                };
                let _ = done.send(r);
            }
            Cmd::QpStats { done } => {
                let v = self.engine.iter().map(|(q, _)| (q.qpn(), q.stats().clone())).collect();
                let _ = done.send(v);
            }
        }
    }

    fn add_qp(&mut self, s: QpSetup) -> Result<(), String> {
        let dev = self.ports.iter().position(|p| p.dev.index == s.device).ok_or("device not on this lcore")?;
        let (Some(&send_cq), Some(&recv_cq)) = (self.cq_index.get(&s.send_cq), self.cq_index.get(&s.recv_cq)) else {
            return Err("unknown CQ".into());
        };
        let ci = self.clients.iter().position(|c| c.id == s.client).ok_or("unknown client")?;
        if s.db_slot as usize >= DOORBELL_SLOTS || self.clients[ci].slots[s.db_slot as usize] != 0 {
            return Err("doorbell slot in use".into());
        }
        let base = s.seg.as_ptr();
        let len = s.seg.len();
        // SAFETY: the service laid the segment out with `layout` and initialised both rings;
        // the slot keeps the segment alive as long as the consumers.
        let sq = unsafe { Consumer::<ShmSendWqe>::attach(base.add(s.layout.sq_offset as usize), len - s.layout.sq_offset as usize, s.layout.sq_capacity) }
            .map_err(|e| e.to_string())?;
        let rq = if s.layout.rq_capacity > 0 {
            // SAFETY: as above.
            Some(unsafe { Consumer::<ShmRecvWqe>::attach(base.add(s.layout.rq_offset as usize), len - s.layout.rq_offset as usize, s.layout.rq_capacity) }.map_err(|e| e.to_string())?)
        } else {
            None
        };
        if let Some(srqn) = s.qp.srq() {
            if !self.srqs.contains_key(&srqn) {
                return Err("unknown SRQ".into());
            }
        }
        let mut s = s;
        s.qp.set_congestion(self.ports[dev].dev.cc);
        let qpn = s.qp.qpn();
        let is_ud = s.qp.qp_type() == QpType::Ud;
        let srq = s.qp.srq();
        let slot = QpSlot {
            client: s.client,
            dev,
            _seg: s.seg,
            sq,
            rq,
            send_cq,
            recv_cq,
            stash: None,
            is_ud,
            backlog: false,
            backlog_listed: false,
            path: None,
            hold_since: None,
        };
        self.engine.insert(s.qp, slot).map_err(|e| e.to_string())?;
        if let Some(x) = srq.and_then(|n| self.srqs.get_mut(&n)) {
            x.refs += 1;
        }
        self.clients[ci].slots[s.db_slot as usize] = qpn;
        for cq in [send_cq, recv_cq] {
            if let Some(c) = self.cqs[cq].as_mut() {
                c.refs += 1;
            }
        }
        Ok(())
    }

    fn remove_qp(&mut self, qpn: u32) -> bool {
        let Some((qp, slot)) = self.engine.remove(qpn) else { return false };
        for cq in [slot.send_cq, slot.recv_cq] {
            if let Some(c) = self.cqs[cq].as_mut() {
                c.refs = c.refs.saturating_sub(1);
            }
        }
        if let Some(x) = qp.srq().and_then(|n| self.srqs.get_mut(&n)) {
            x.refs = x.refs.saturating_sub(1);
        }
        if let Some(c) = self.clients.iter_mut().find(|c| c.id == slot.client) {
            for s in c.slots.iter_mut().filter(|s| **s == qpn) {
                *s = 0;
            }
        }
        self.backlog.retain(|&q| q != qpn);
        self.neigh_wait.retain(|&q| q != qpn);
        let _ = self.grave.send(Box::new((qp, slot)));
        true
    }

    // ---- receive ------------------------------------------------------------------------

    fn receive(&mut self, now: Instant) -> bool {
        let mut any = false;
        for pi in 0..self.ports.len() {
            if !self.ports[pi].lo.is_empty() {
                any = true;
                let mut lo = std::mem::take(&mut self.ports[pi].lo);
                bump(&self.stats.rx_loopback, lo.len() as u64);
                for buf in lo.drain(..) {
                    if let Some(owner) = self.on_frame(pi, now, buf.data(), true) {
                        self.hand_over(owner, pi, buf);
                    }
                }
                self.ports[pi].lo = lo;
            }
            let mut rx = std::mem::take(&mut self.ports[pi].rx);
            let n = self.ports[pi].link.rx_burst(&mut rx, BURST);
            if n > 0 {
                any = true;
                bump(&self.stats.rx_packets, n as u64);
                for buf in rx.drain(..) {
                    let data = buf.data();
                    bump(&self.stats.rx_bytes, data.len() as u64);
                    if let Some(t) = &self.tap {
                        if t.active() {
                            t.frame(false, data);
                        }
                    }
                    if let Some(owner) = self.on_frame(pi, now, data, true) {
                        self.hand_over(owner, pi, buf);
                    }
                }
            }
            self.ports[pi].rx = rx;
        }
        if self.handoff.is_some() {
            let mut budget = BURST * 4;
            while budget > 0 {
                budget -= 1;
                let item = self.handoff.as_ref().and_then(|h| h.inbox[self.index % h.lcores()].pop());
                let Some((pi, buf)) = item else { break };
                any = true;
                bump(&self.stats.handoff_in, 1);
                let _ = self.on_frame(pi, now, buf.data(), false);
            }
        }
        any
    }

    fn hand_over(&mut self, owner: usize, pi: usize, buf: L::Buf) {
        let Some(h) = &self.handoff else { return };
        match h.inbox[owner].push((pi, buf)) {
            Ok(()) => bump(&self.stats.handoff_out, 1),
            // The owner is behind: drop (counted); the transport's retransmission recovers.
            Err(_) => bump(&self.stats.handoff_drops, 1),
        }
    }

    /// Handle one received frame. Returns the lcore to hand it to when its QP lives on another
    /// lcore (only when `may_hand_off`: a frame that was already handed over is not bounced).
    fn on_frame(&mut self, pi: usize, now: Instant, data: &[u8], may_hand_off: bool) -> Option<usize> {
        // The ICRC check is deferred: to the owning QP (checked before the packet acts, or while
        // its payload is placed), or made here for frames the lcore itself consumes.
        match wire::parse_frame_deferred(data) {
            Ok((f, check)) => {
                if !self.ports[pi].owns_ip(f.dst_ip) {
                    bump(&self.stats.rx_not_for_us, 1);
                    return None;
                }
                // The P_Key must match the port's only partition, the default one (0xFFFF, or
                // its limited-member form 0x7FFF): SEMANTICS §5.7. (TVer is checked by parse.)
                if f.headers.bth.pkey & 0x7fff != 0x7fff {
                    bump(&self.stats.rx_malformed, 1);
                    return None;
                }
                let qpn: u32 = f.headers.bth.dest_qp.into();
                if qpn == 1 {
                    // QP1 takes only GSI datagrams (UD SEND_ONLY, Q_Key 0x80010000); anything
                    // else for it is a frame for a QP that does not exist.
                    let gsi = f.headers.bth.opcode == wire::Opcode::UD_SEND_ONLY
                        && f.headers.deth.is_some_and(|d| d.qkey == pmrxe_cm::gsi::GSI_QKEY);
                    if !gsi {
                        bump(&self.stats.rx_unknown_qp, 1);
                    } else if !check.verify(f.payload) {
                        self.count_bad_icrc();
                    } else {
                        self.gsi_receive(pi, data);
                    }
                    return None;
                }
                let Some(slot) = self.engine.ext(qpn) else {
                    if let (true, Some(h)) = (may_hand_off, &self.handoff) {
                        let owner = h.owner(qpn);
                        if owner != self.index % h.lcores() {
                            return Some(owner);
                        }
                    }
                    bump(&self.stats.rx_unknown_qp, 1);
                    return None;
                };
                // Learn the sender's MAC only from a valid frame for one of our QPs, and only
                // for an IP we know nothing about: a spoofed RoCE frame cannot redirect an
                // established neighbour (ARP/ND and static entries are authoritative).
                // (Only while the QP has no current path: steady traffic costs one compare.)
                let gen = self.neigh.generation();
                if slot.path.is_none_or(|p| p.neigh_gen != gen) && self.neigh.lookup(f.src_ip, now.0).is_none() && check.verify(f.payload) {
                    self.neigh.learn(f.src_ip, f.src_mac.0, now.0);
                }
                if slot.dev != pi {
                    bump(&self.stats.rx_unknown_qp, 1);
                    return None;
                }
                if wire::ecn::is_ce(f.tclass) {
                    bump(&self.stats.rx_ecn_ce, 1);
                }
                let mut pkt = RxPacket::new(f.headers, f.payload);
                pkt.src_gid = crate::neigh::ip_to_gid(f.src_ip);
                pkt.dst_gid = crate::neigh::ip_to_gid(f.dst_ip);
                pkt.src_udp_port = f.udp_sport;
                pkt.traffic_class = f.tclass;
                pkt.hop_limit = f.ttl;
                pkt.flow_label = f.flow_label;
                pkt.icrc = Some(check);
                let icrc_errors = |e: &Engine<QpSlot>| e.qp(qpn).map_or(0, |q| q.stats().icrc_errors);
                let before = icrc_errors(&self.engine);
                self.engine.handle_packet(now, &pkt, &*self.mem);
                if icrc_errors(&self.engine) != before {
                    self.count_bad_icrc();
                }
                None
            }
            Err(wire::Error::Arp) => {
                self.on_arp(pi, data, now);
                None
            }
            Err(wire::Error::Icmpv6) => {
                self.on_nd(pi, data, now);
                None
            }
            Err(wire::Error::UnknownOpcode(op)) if op == wire::cnp::OPCODE.0 => self.on_cnp(pi, now, data, may_hand_off),
            Err(e) => {
                if e == wire::Error::BadIcrc {
                    bump(&self.stats.rx_icrc_errors, 1);
                } else if matches!(e, wire::Error::NotIp | wire::Error::NotUdp | wire::Error::NotRoce | wire::Error::Icmpv6) {
                    bump(&self.stats.rx_not_for_us, 1);
                } else {
                    bump(&self.stats.rx_malformed, 1);
                }
                bump(&self.drops.by_reason[e.index()], 1);
                None
            }
        }
    }

    /// A RoCEv2 CNP (BTH opcode 0x81): validated whole (layout, ICRC), then the QP it names
    /// cuts its rate (DCQCN reaction point). Returns the owning lcore when the QP lives there.
    fn on_cnp(&mut self, pi: usize, now: Instant, data: &[u8], may_hand_off: bool) -> Option<usize> {
        let f = match wire::parse_cnp_frame(data) {
            Ok(f) => f,
            Err(e) => {
                if e == wire::Error::BadIcrc {
                    bump(&self.stats.rx_icrc_errors, 1);
                } else {
                    bump(&self.stats.rx_malformed, 1);
                }
                bump(&self.drops.by_reason[e.index()], 1);
                return None;
            }
        };
        if !self.ports[pi].owns_ip(f.dst_ip) {
            bump(&self.stats.rx_not_for_us, 1);
            return None;
        }
        if f.cnp.pkey & 0x7fff != 0x7fff {
            bump(&self.stats.rx_malformed, 1);
            return None;
        }
        let qpn: u32 = f.cnp.dest_qp.into();
        match self.engine.ext(qpn) {
            Some(slot) if slot.dev == pi => {
                bump(&self.stats.rx_cnp, 1);
                self.engine.handle_cnp(now, qpn);
                None
            }
            None if may_hand_off => match &self.handoff {
                Some(h) if h.owner(qpn) != self.index % h.lcores() => Some(h.owner(qpn)),
                _ => {
                    bump(&self.stats.rx_unknown_qp, 1);
                    None
                }
            },
            _ => {
                bump(&self.stats.rx_unknown_qp, 1);
                None
            }
        }
    }

    /// A frame dropped for a bad ICRC (found here or by the QP it was for).
    fn count_bad_icrc(&self) {
        bump(&self.stats.rx_icrc_errors, 1);
        bump(&self.drops.by_reason[wire::Error::BadIcrc.index()], 1);
    }

    /// A valid RoCE frame for QP1: a copy goes to the connection manager's queue (fixed-size
    /// slots allocated up front; full or oversize → dropped and counted, the CM retransmits).
    fn gsi_receive(&mut self, pi: usize, data: &[u8]) {
        let Some(pipe) = &self.gsi else {
            bump(&self.stats.rx_unknown_qp, 1);
            return;
        };
        if data.len() > MAX_GSI_FRAME {
            bump(&self.stats.cm_drops, 1);
            return;
        }
        let mut f = GsiFrame { device: self.ports[pi].dev.index, len: data.len() as u16, data: [0; MAX_GSI_FRAME] };
        f.data[..data.len()].copy_from_slice(data);
        if pipe.push_rx(f) {
            bump(&self.stats.cm_rx, 1);
        } else {
            bump(&self.stats.cm_drops, 1);
        }
    }

    /// MADs the connection manager wants sent from QP1 of one of our ports.
    fn gsi_transmit(&mut self, now: Instant) -> bool {
        // Every iteration: one load of the queue, no Arc clone (refcount traffic) unless a MAD
        // is waiting.
        let Some(pipe) = self.gsi.as_ref().filter(|p| p.tx.get(self.index).is_some_and(|q| !q.is_empty())).cloned() else {
            return false;
        };
        let Some(q) = pipe.tx.get(self.index) else { return false };
        let mut any = false;
        let mut unresolved: Option<(usize, IpAddr)> = None;
        for _ in 0..BURST {
            let Some(out) = q.pop() else { break };
            any = true;
            let Some(pi) = self.ports.iter().position(|p| p.dev.index == out.device) else {
                bump(&self.stats.cm_drops, 1);
                continue;
            };
            let port = &mut self.ports[pi];
            if port.tx.len() >= port.tx.capacity() || port.lo.len() >= port.lo.capacity() {
                bump(&self.stats.cm_drops, 1);
                continue;
            }
            let dst_ip = out.path.dgid.to_ip();
            let local = port.owns_ip(dst_ip);
            let dmac = if local { Some(port.dev.mac) } else { self.neigh.lookup(dst_ip, now.0) };
            let Some(dmac) = dmac else {
                bump(&self.stats.tx_no_neighbor, 1);
                bump(&self.stats.cm_drops, 1);
                unresolved = Some((pi, dst_ip));
                continue;
            };
            let Some(mut b) = port.link.alloc() else {
                bump(&self.stats.tx_alloc_failures, 1);
                bump(&self.stats.cm_drops, 1);
                continue;
            };
            let need = pmrxe_cm::gsi::mad_frame_len(dst_ip.is_ipv6());
            let Some(buf) = b.resize(need) else {
                bump(&self.stats.cm_drops, 1);
                continue;
            };
            self.gsi_psn = (self.gsi_psn + 1) & 0xff_ffff;
            let psn = wire::Psn::new(self.gsi_psn);
            match pmrxe_cm::gsi::build_mad_frame_into(buf, &out.path, MacAddr(port.dev.mac), MacAddr(dmac), psn, &out.mad) {
                Ok(n) => {
                    let _ = b.resize(n);
                }
                Err(_) => {
                    bump(&self.stats.tx_build_errors, 1);
                    continue;
                }
            }
            if let Some(tap) = &self.tap {
                if tap.active() {
                    tap.frame(true, b.data());
                }
            }
            bump(&self.stats.cm_tx, 1);
            if local {
                port.lo.push(b);
            } else {
                port.tx.push(b);
            }
        }
        if let Some((pi, ip)) = unresolved {
            self.solicit(pi, ip, now);
        }
        any
    }

    fn on_arp(&mut self, pi: usize, data: &[u8], now: Instant) {
        let Ok((_, a)) = wire::arp::parse_arp_frame(data) else {
            bump(&self.stats.rx_malformed, 1);
            return;
        };
        let (src, for_us) = (IpAddr::V4(a.source_ip), self.ports[pi].owns_ip(IpAddr::V4(a.target_ip)));
        if a.operation == wire::ArpOp::Request && for_us {
            // A peer resolving our address is about to talk to us (as Linux, learn it).
            self.neigh.learn(src, a.source_mac.0, now.0);
        } else {
            // A reply (or a request for someone else, gratuitous ARP): only for addresses we
            // asked about or already know.
            self.neigh.answer(src, a.source_mac.0, now.0);
        }
        let port = &self.ports[pi];
        if a.operation != wire::ArpOp::Request || !for_us {
            return;
        }
        let mac = MacAddr(port.dev.mac);
        let reply = wire::ArpRepr {
            operation: wire::ArpOp::Reply,
            source_mac: mac,
            source_ip: a.target_ip,
            target_mac: a.source_mac,
            target_ip: a.source_ip,
        };
        self.emit_control(pi, |buf| wire::arp::emit_arp_frame(buf, mac, &reply).ok());
        bump(&self.stats.arp_replies, 1);
    }

    fn on_nd(&mut self, pi: usize, data: &[u8], now: Instant) {
        let Ok(f) = wire::parse_nd_frame(data) else {
            bump(&self.stats.rx_not_for_us, 1);
            return;
        };
        match f.nd {
            wire::NdRepr::Solicit { target, src_lladdr } => {
                let for_us = self.ports[pi].owns_ip(IpAddr::V6(target));
                if let Some(mac) = src_lladdr.filter(|_| for_us) {
                    self.neigh.learn(IpAddr::V6(f.src_ip), mac.0, now.0);
                }
                let port = &self.ports[pi];
                if !port.owns_ip(IpAddr::V6(target)) || f.src_ip.is_unspecified() {
                    return;
                }
                let adv = wire::NdRepr::Advert { router: false, solicited: true, override_: true, target, target_lladdr: Some(MacAddr(port.dev.mac)) };
                let (mac, dst_mac) = (port.dev.mac, src_lladdr.unwrap_or(f.src_mac));
                self.emit_control(pi, |buf| wire::emit_nd_frame(buf, MacAddr(mac), dst_mac, target, f.src_ip, &adv).ok());
                bump(&self.stats.arp_replies, 1);
            }
            wire::NdRepr::Advert { target, target_lladdr, .. } => {
                if let Some(mac) = target_lladdr {
                    self.neigh.answer(IpAddr::V6(target), mac.0, now.0);
                }
            }
        }
    }

    /// Queue a small control frame (ARP/ND) built by `build` into a fresh buffer.
    fn emit_control(&mut self, pi: usize, build: impl FnOnce(&mut [u8]) -> Option<usize>) {
        let port = &mut self.ports[pi];
        if port.tx.len() >= port.tx.capacity() {
            return;
        }
        let Some(mut b) = port.link.alloc() else {
            bump(&self.stats.tx_alloc_failures, 1);
            return;
        };
        let Some(buf) = b.resize(128) else { return };
        buf.fill(0);
        if let Some(n) = build(buf) {
            let _ = b.resize(n.max(60));
            port.tx.push(b);
        }
    }

    /// No MAC for `ip`: ask for it (ARP request or neighbour solicitation), at most once per
    /// 100 µs per lcore so a stream of packets to an unknown peer does not flood the link.
    fn solicit(&mut self, pi: usize, ip: IpAddr, now: Instant) {
        self.neigh.want(ip, now.0);
        if now.0 < self.last_solicit.0 + 100_000 && self.last_solicit.0 != 0 {
            return;
        }
        self.last_solicit = now;
        let mac = MacAddr(self.ports[pi].dev.mac);
        let Some(src) = self.ports[pi].ip_like(ip) else { return };
        match (ip, src) {
            (IpAddr::V4(t), IpAddr::V4(src)) => {
                let req = wire::ArpRepr { operation: wire::ArpOp::Request, source_mac: mac, source_ip: src, target_mac: MacAddr([0; 6]), target_ip: t };
                self.emit_control(pi, |buf| wire::arp::emit_arp_frame(buf, mac, &req).ok());
            }
            (IpAddr::V6(t), IpAddr::V6(src)) => {
                let sn = wire::icmpv6::solicited_node(&t);
                let ns = wire::NdRepr::Solicit { target: t, src_lladdr: Some(mac) };
                self.emit_control(pi, |buf| wire::emit_nd_frame(buf, mac, wire::icmpv6::multicast_mac(&sn), src, sn, &ns).ok());
            }
            _ => {}
        }
    }

    // ---- doorbells ----------------------------------------------------------------------

    fn doorbells(&mut self, now: Instant) -> bool {
        self.work.clear();
        for c in &self.clients {
            let page = c.page();
            let row = page.row(self.index);
            let summary = &row.summary;
            if summary.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut words = summary.swap(0, Ordering::Acquire) & ((1u64 << DOORBELL_WORDS) - 1);
            while words != 0 {
                let w = words.trailing_zeros() as usize;
                words &= words - 1;
                let word = &row.words[w];
                let mut bits = word.swap(0, Ordering::Acquire);
                while bits != 0 {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    let qpn = c.slots[w * 64 + b];
                    if qpn & SRQ_SLOT != 0 {
                        if let Some(x) = self.srqs.get_mut(&(qpn & !SRQ_SLOT)) {
                            x.backlog = true;
                        }
                        continue;
                    }
                    if qpn != 0 && self.work.len() < self.work.capacity() {
                        self.work.push(qpn);
                    }
                }
            }
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
    fn drain_srqs(&mut self) -> bool {
        let mut any = false;
        for (&n, x) in self.srqs.iter_mut() {
            if x.backlog {
                if let Some(srq) = self.engine.srq_mut(n) {
                    any |= drain_srq(x, srq, &self.stats);
                }
            }
        }
        any
    }

    /// Move a QP's new WQEs from its rings into the engine; a QP whose ring holds more than
    /// the engine's queue takes goes on the backlog list, retried every iteration.
    fn drain_rings(&mut self, qpn: u32, now: Instant) -> bool {
        let (ahs, stats, backlog, scratch) = (&self.ahs, &*self.stats, &mut self.backlog, &mut *self.wqe_scratch);
        self.engine
            .with(qpn, |qp, s| {
                let any = drain_qp_rings(qp, s, ahs, stats, scratch, now);
                if s.backlog && !s.backlog_listed && backlog.len() < backlog.capacity() {
                    s.backlog_listed = true;
                    backlog.push(qpn);
                }
                any
            })
            .unwrap_or(false)
    }

    /// Retry the rings of QPs on the backlog list (completions may have made room).
    fn drain_backlog(&mut self, now: Instant) -> bool {
        let mut any = false;
        let mut k = 0;
        while k < self.backlog.len() {
            let qpn = self.backlog[k];
            any |= self.drain_rings(qpn, now);
            let still = self.engine.with(qpn, |_, s| {
                s.backlog_listed = s.backlog;
                s.backlog
            });
            if still == Some(true) {
                k += 1;
            } else {
                self.backlog.swap_remove(k);
            }
        }
        any
    }

    // ---- timers, transmit, completions --------------------------------------------------

    fn timers(&mut self, now: Instant) -> bool {
        self.engine.handle_timeout(now, &*self.mem)
    }

    /// Serve the engine's ready list: each ready QP sends up to a burst into its port's
    /// buffers (transport headers + payload straight into the buffer, then Eth/IP/UDP from the
    /// QP's path cache and the ICRC), then goes to the back of the list if it has more. A QP
    /// whose port is full keeps its place at the front for the next pass.
    fn transmit(&mut self, now: Instant) -> bool {
        let mut any = self.drain_srqs();
        any |= self.drain_backlog(now);
        self.recheck_neigh_wait(now);
        let mut unresolved: Option<(usize, IpAddr)> = None;
        let mut deferred = core::mem::take(&mut self.deferred);
        for _ in 0..self.engine.ready_len() {
            let Some(slot) = self.engine.pop_ready() else { break };
            let Some((qp, s)) = self.engine.entry(slot) else { continue };
            let port = &mut self.ports[s.dev];
            if port.tx.len() >= port.tx.capacity() || port.lo.len() >= port.lo.capacity() {
                deferred.push(slot);
                continue;
            }
            // The next packet's path must be resolved before the QP's send state advances
            // (a UC/UD packet built for an unknown MAC would be lost yet reported sent).
            if let Some((av, dest)) = qp.next_path() {
                if path_for(&mut s.path, port, &self.neigh, &av, qp.qpn(), dest, now).is_none() {
                    let held = *s.hold_since.get_or_insert(now);
                    if now.0.saturating_sub(held.0) < NEIGH_HOLD_NS {
                        bump(&self.stats.tx_neigh_hold, 1);
                        unresolved = Some((s.dev, gid_to_ip(&av.dgid)));
                        if self.neigh_wait.len() < self.neigh_wait.capacity() && !self.neigh_wait.contains(&qp.qpn()) {
                            self.neigh_wait.push(qp.qpn());
                        }
                        continue; // off the ready list until the neighbour changes
                    }
                } else {
                    s.hold_since = None;
                }
            }
            let mut budget = BURST;
            // Stays true unless the QP itself had nothing to send (then it leaves the ready
            // list until a packet, timer or post re-files it).
            let mut progressed = true;
            while budget > 0 && port.tx.len() < port.tx.capacity() && port.lo.len() < port.lo.capacity() {
                budget -= 1;
                let Some(mut b) = port.link.alloc() else {
                    bump(&self.stats.tx_alloc_failures, 1);
                    break;
                };
                let cap = b.capacity();
                let Some(buf) = b.resize(cap) else { break };
                // Transport headers + payload go at the start of the data room; Eth/IP/UDP are
                // prepended into the headroom afterwards, so the payload is written once.
                let room = cap.saturating_sub(wire::ICRC_LEN);
                let Some(t) = qp.poll_transmit(now, &*self.mem, &mut buf[..room]) else {
                    progressed = budget + 1 < BURST;
                    break;
                };
                any = true;
                if buf[0] == wire::cnp::OPCODE.0 {
                    bump(&self.stats.tx_cnp, 1);
                }
                let Some(path) = path_for(&mut s.path, port, &self.neigh, &t.av, t.src_qpn, t.dest_qpn, now) else {
                    bump(&self.stats.tx_no_neighbor, 1);
                    unresolved = Some((s.dev, gid_to_ip(&t.av.dgid)));
                    continue; // the engine's retransmission recovers once ARP/ND resolves
                };
                let (l3, local) = (path.l3, path.local);
                let hl = wire::frame_header_len(l3.dst_ip.is_ipv6());
                if b.resize(t.len + wire::ICRC_LEN).is_none() {
                    continue;
                }
                let Some(frame) = b.prepend(hl) else {
                    bump(&self.stats.tx_alloc_failures, 1);
                    continue;
                };
                if wire::emit_frame_headers(frame, &l3, t.len).is_err() || wire::finish_frame_with_tail_crc(frame, t.tail_crc).is_err() {
                    bump(&self.stats.tx_build_errors, 1);
                    continue;
                }
                if let Some(tap) = &self.tap {
                    if tap.active() {
                        tap.frame(true, b.data());
                    }
                }
                if local {
                    port.lo.push(b);
                } else {
                    port.tx.push(b);
                }
            }
            self.engine.requeue(slot, progressed);
        }
        // Cut off by a full port: first in line next time, in the order they were waiting.
        for &slot in deferred.iter().rev() {
            self.engine.defer(slot);
        }
        deferred.clear();
        self.deferred = deferred;
        if let Some((pi, ip)) = unresolved {
            self.solicit(pi, ip, now);
        }
        any
    }

    /// QPs holding for a neighbour go back on the ready list when the neighbour table changed,
    /// and at least every solicitation interval (to re-ask, or to give up after the hold).
    fn recheck_neigh_wait(&mut self, now: Instant) {
        if self.neigh_wait.is_empty() {
            return;
        }
        let gen = self.neigh.generation();
        let (seen_gen, seen_at) = self.neigh_wait_seen;
        if gen == seen_gen && now.0.saturating_sub(seen_at.0) < 100_000 {
            return;
        }
        self.neigh_wait_seen = (gen, now);
        for k in 0..self.neigh_wait.len() {
            self.engine.kick(self.neigh_wait[k]);
        }
        self.neigh_wait.clear();
    }

    fn deliver_completions(&mut self, _now: Instant) -> bool {
        let (cqs, dirty, clients, stats) = (&mut self.cqs, &mut self.dirty_cqs, &self.clients, &*self.stats);
        let mut any = self.engine.drain_pending(|qp, s| {
            loop {
                let next = s.stash.take().or_else(|| qp.poll_completion());
                let Some((side, c)) = next else { break };
                let ci = if side == CqSide::Send { s.send_cq } else { s.recv_cq };
                let Some(cq) = cqs[ci].as_mut() else { break };
                match cq.ring.stage(convert::cqe(&c)) {
                    Ok(()) => {
                        if side == CqSide::Recv {
                            s.retire_recv();
                        }
                        if !cq.fresh {
                            cq.fresh = true;
                            if dirty.len() < dirty.capacity() {
                                dirty.push(ci);
                            }
                        }
                        bump(&stats.cqes, 1);
                    }
                    Err(PushError::Full(_)) | Err(PushError::Corrupt(_)) => {
                        // CQ overflow (IBTA: the CQ is in error and its QPs go to ERROR). The
                        // completion is kept and delivered once the consumer makes room, so
                        // nothing is lost; the application hears IBV_EVENT_CQ_ERR once.
                        s.stash = Some((side, c));
                        bump(&stats.cq_full, 1);
                        if cq.notify().overflow.swap(1, Ordering::AcqRel) == 0 {
                            if let Some(cl) = clients.iter().find(|cl| cl.id == s.client) {
                                cl.post_event(pmrxe_abi::ctrl::AsyncEvent { event_type: 0, element: cq.handle });
                            }
                        }
                        if qp.state() != pmrxe_transport::QpState::Err {
                            fatal(qp);
                        }
                        break;
                    }
                }
            }
            while let Some(ev) = qp.poll_event() {
                if let Some(c) = clients.iter().find(|c| c.id == s.client) {
                    let element = match ev {
                        pmrxe_transport::AsyncEvent::SrqLimitReached { srqn } => srqn,
                        _ => qp.qpn(),
                    };
                    c.post_event(pmrxe_abi::ctrl::AsyncEvent { event_type: event_code(ev), element });
                }
            }
            // Keep a QP whose completion waits for CQ room on the pending list.
            s.stash.is_some()
        });
        if self.dirty_cqs.is_empty() {
            return any;
        }
        // Publish every CQ written this iteration (one release store each)...
        for k in 0..self.dirty_cqs.len() {
            let Some(cq) = self.cqs[self.dirty_cqs[k]].as_mut() else { continue };
            if cq.fresh {
                cq.fresh = false;
                cq.ring.publish();
            }
        }
        any = true;
        // ...then one full fence for all of them, then read each `armed`: pairs with the shim's
        // SeqCst store of `armed` before its next poll (Dekker): either we see the arm and
        // signal, or the application's poll sees these completions. Without the fence x86 may
        // let the load pass the store and both sides miss each other (a hang with -e).
        std::sync::atomic::fence(Ordering::SeqCst);
        for k in 0..self.dirty_cqs.len() {
            let Some(cq) = self.cqs[self.dirty_cqs[k]].as_ref() else { continue };
            if cq.notify().armed.load(Ordering::Relaxed) != 0 && cq.notify().armed.swap(0, Ordering::AcqRel) != 0 {
                cq.notify().events.fetch_add(1, Ordering::Release);
                if let Some(ch) = &cq.channel {
                    ch.signal();
                    bump(&self.stats.cq_events, 1);
                }
            }
            let _ = &cq.seg;
        }
        self.dirty_cqs.clear();
        any
    }

    fn flush_tx(&mut self) -> bool {
        let mut any = false;
        for p in &mut self.ports {
            if p.tx.is_empty() {
                continue;
            }
            any = true;
            let bytes: usize = p.tx.iter().map(|b| b.data().len()).sum();
            let want = p.tx.len();
            let sent = p.link.tx_burst(&mut p.tx);
            bump(&self.stats.tx_packets, sent as u64);
            if sent == want {
                bump(&self.stats.tx_bytes, bytes as u64);
            } else {
                bump(&self.stats.tx_backpressure, 1);
                let left: usize = p.tx.iter().map(|b| b.data().len()).sum();
                bump(&self.stats.tx_bytes, (bytes - left) as u64);
            }
        }
        any
    }
}

impl QpSlot {
    fn shared(&self) -> &QpShared {
        // SAFETY: a QP segment starts with a QpShared header (QpSegmentLayout::HEADER bytes,
        // 64-aligned at the segment start), all atomics; the Arc keeps it mapped.
        unsafe { &*(self._seg.as_ptr() as *const QpShared) }
    }

    /// A receive WQE of the QP's own RQ completed: count it retired (the client frees its slot).
    fn retire_recv(&self) {
        if self.rq.is_some() {
            let r = &self.shared().rq_retired;
            r.store(r.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        }
    }

    /// The QP went to RESET: the engine emptied its queues; WQEs still in the rings are
    /// discarded too (IBTA: a reset QP's queues are empty), a completion waiting for CQ room
    /// is dropped, and every receive WQE ever posted counts as retired.
    fn reset_rings(&mut self) {
        self.stash = None;
        self.backlog = false;
        let _ = self.sq.discard_all();
        if let Some(rq) = self.rq.as_mut() {
            if let Ok(tail) = rq.discard_all() {
                let shared = self.shared();
                shared.rq_retired.store(tail, Ordering::Release);
            }
        }
    }
}

/// Move a QP's new WQEs from its rings into its engine queues (receive first, so a SEND
/// arriving in the same burst finds them).
fn drain_qp_rings(qp: &mut Qp, s: &mut QpSlot, ahs: &HashMap<u32, AddressVector>, stats: &LcoreStats, scratch: &mut SendWqe, now: Instant) -> bool {
    let mut any = false;
    s.backlog = false;
    // Receive WQEs first so a SEND arriving in the same burst finds them.
    if let Some(rq) = s.rq.as_mut() {
        loop {
            match rq.peek() {
                Ok(Some(w)) => {
                    any = true;
                    match convert::recv_wqe(&w) {
                        Ok(r) => {
                            if qp.post_recv(r).is_err() {
                                s.backlog = true;
                                break; // full: leave it in the ring, retry next iteration
                            }
                        }
                        Err(_) => {
                            bump(&stats.bad_wqes, 1);
                            fatal(qp);
                        }
                    }
                    rq.advance();
                    bump(&stats.rq_wqes, 1);
                }
                Ok(None) => break,
                Err(_) => {
                    bump(&stats.ring_corrupt, 1);
                    fatal(qp);
                    break;
                }
            }
        }
        rq.release();
    }
    loop {
        match s.sq.peek() {
            Ok(Some(w)) => {
                any = true;
                match convert::send_wqe(&w, |h| ahs.get(&h).copied(), s.is_ud, scratch) {
                    Ok(()) => {
                        if let Err(e) = qp.post_send(now, scratch) {
                            if e == pmrxe_transport::PostError::QueueFull {
                                s.backlog = true;
                                break; // retry when completions free space
                            }
                            bump(&stats.bad_wqes, 1);
                            fatal(qp);
                        }
                    }
                    Err(_) => {
                        bump(&stats.bad_wqes, 1);
                        fatal(qp);
                    }
                }
                s.sq.advance();
                bump(&stats.sq_wqes, 1);
                if w.send_flags & pmrxe_abi::send_flags::INLINE != 0 {
                    bump(&stats.sq_inline_wqes, 1);
                }
            }
            Ok(None) => break,
            Err(_) => {
                bump(&stats.ring_corrupt, 1);
                fatal(qp);
                break;
            }
        }
    }
    s.sq.release();
    any
}

fn drain_srq(x: &mut SrqSlot, srq: &mut Srq, stats: &LcoreStats) -> bool {
    x.backlog = false;
    let mut any = false;
    loop {
        match x.ring.peek() {
            Ok(Some(w)) => {
                any = true;
                match convert::recv_wqe(&w) {
                    Ok(r) => {
                        if srq.post_recv(r).is_err() {
                            x.backlog = true;
                            break;
                        }
                    }
                    Err(_) => bump(&stats.bad_wqes, 1),
                }
                x.ring.advance();
                bump(&stats.rq_wqes, 1);
            }
            Ok(None) => break,
            Err(_) => {
                bump(&stats.ring_corrupt, 1);
                break;
            }
        }
    }
    x.ring.release();
    any
}

/// The Eth/IP/UDP addressing of a packet on `av` to `dest_qpn` from `src_qpn`, from the QP's
/// cache when nothing it depends on changed; `None` while the next hop's MAC is unknown.
#[allow(clippy::too_many_arguments)]
fn path_for<'a, L: Link>(cache: &'a mut Option<PathCache>, port: &Port<L>, neigh: &Neighbors, av: &AddressVector, src_qpn: u32, dest_qpn: u32, now: Instant) -> Option<&'a PathCache> {
    let gen = neigh.generation();
    let hit = cache.as_ref().is_some_and(|c| c.neigh_gen == gen && c.dest_qpn == dest_qpn && c.av == *av);
    if !hit {
        let dst_ip = gid_to_ip(&av.dgid);
        let src_ip = port.ips.get(av.sgid_index as usize).copied().unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let local = port.owns_ip(dst_ip);
        let dmac = if local { Some(port.dev.mac) } else { av.dmac.or_else(|| neigh.lookup(dst_ip, now.0)) }?;
        let l3 = wire::L3Info {
            src_mac: MacAddr(port.dev.mac),
            dst_mac: MacAddr(dmac),
            src_ip,
            dst_ip,
            // RoCEv2 over an ECN fabric: ECT(0), the DSCP from the GRH traffic class.
            tclass: if port.dev.ecn { wire::ecn::with_ecn(av.traffic_class, wire::ecn::ECT0) } else { av.traffic_class },
            ttl: if av.hop_limit == 0 { 64 } else { av.hop_limit },
            flow_label: av.flow_label,
            udp_sport: wire::udp_sport(av.flow_label, src_qpn, dest_qpn),
            ip_id: 0,
        };
        *cache = Some(PathCache { av: *av, dest_qpn, neigh_gen: gen, l3, local });
    }
    cache.as_ref()
}

/// The QPN layout of a service with `lcores` lcores (what the service allocates QPNs by).
pub fn qpn_layout(lcores: usize) -> QpnLayout {
    QpnLayout { lcores: lcores.max(1) as u32, slots: MAX_QPS_PER_LCORE as u32 }
}

fn fatal(qp: &mut Qp) {
    let a = QpAttr { qp_state: pmrxe_transport::QpState::Err, ..QpAttr::default() };
    let _ = qp.modify(&a, AttrMask::STATE);
}

/// `enum ibv_event_type` code of an engine event.
pub fn event_code(ev: pmrxe_transport::AsyncEvent) -> u32 {
    use pmrxe_transport::AsyncEvent as E;
    match ev {
        E::QpFatal => 1,
        E::QpRequestError => 2,
        E::QpAccessError => 3,
        E::CommEstablished => 4,
        E::SqDrained => 5,
        E::SrqLimitReached { .. } => 15,
        E::LastWqeReached => 16,
    }
}
