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
//! the clock is the TSC (or the vDSO). The exceptions are explicit and counted: idle sleeps
//! (wait and back-off modes, only after empty iterations: see `sleep.rs`), the eventfd write
//! for a CQ the application armed, the wake-up of a sleeping peer lcore (wait mode, several
//! lcores), and replies to control commands. Each iteration is a quiescent point for MR reclamation:
//! no `MrRef` outlives the call that took it.
//!
//! This file holds the lcore's state and loop; each step lives in its own file:
//! `objects.rs` (1), `rx.rs` (2), `neighbours.rs` (ARP/ND), `mcast.rs` (multicast, IGMP),
//! `doorbells.rs` (3), `tx.rs` (4, 5), `completions.rs` (6) and `ports.rs` (7). The state a
//! stage alone uses is that stage's struct: `CqSet` (completions.rs), `Posts` (doorbells.rs),
//! `Ports` (ports.rs), `Qp1` (qp1.rs: connection-manager MADs) and `Sleeper` (sleep.rs: the
//! idle policy).
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam::channel::{Receiver, Sender};
use pmrxe_abi::ring::{Consumer, Producer};
use pmrxe_abi::{ClientPage, CqNotify, CqSegmentLayout, QpSegmentLayout, QpShared, ShmCqe, ShmRecvWqe, ShmSendWqe, SrqSegmentLayout};
use pmrxe_mem::{MemTable, Reader};
use pmrxe_port::Port;
use pmrxe_transport::{AddressVector, AttrMask, Engine, Instant, Qp, QpAttr, QpnLayout, Srq, SrqAttr};
use pmrxe_wire as wire;

use crate::call::CallError;
use crate::clock::Clock;
use crate::gsi::GsiPipe;
use crate::idle::{Idle, Waker};
use crate::neigh::Neighbors;
use crate::shm::{EventFd, Segment};
use crate::stats::{bump, DropStats, LcoreStats};

mod completions;
mod doorbells;
mod mcast;
mod neighbours;
mod objects;
mod ports;
mod qp1;
mod rx;
mod sleep;
mod tx;

use completions::{CqSet, CqTarget};
use doorbells::Posts;
use ports::Ports;
use qp1::Qp1;
use sleep::Sleeper;

/// The lcore's scratch WQEs: a client's ring entry is copied into `shm_*` (head and live tail
/// only, `Consumer::peek_into`: the untrusted bytes are read once); `post_send` reads a send
/// WQE from there (`convert::ShmSendWr`) and copies what it keeps.
struct Scratch {
    shm_send: ShmSendWqe,
    shm_recv: ShmRecvWqe,
}

/// Frames per burst.
pub const BURST: usize = 32;
/// Frames a port queues for transmit (or for its own loopback) before `tx_burst`.
const TX_QUEUE: usize = BURST * 4;
/// Receive bursts per port in one pass at most: receiving keeps up with what one pass can queue
/// for transmit (TX_QUEUE), so queues between lcores stay short.
const RX_BURSTS: usize = TX_QUEUE / BURST;

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
    /// The lcores' wakers (each registers its own in `Lcore::set_handoff`): an lcore in wait
    /// mode that handed frames over, or sent frames on a ring pair another lcore receives,
    /// wakes the ones that sleep.
    wakers: Vec<std::sync::OnceLock<Arc<Waker>>>,
}

impl<B> Handoff<B> {
    /// Inboxes for `lcores` lcores, `depth` frames each (allocated here, never on the fast path).
    pub fn new(lcores: usize, depth: usize) -> Arc<Handoff<B>> {
        Arc::new(Handoff {
            inbox: (0..lcores).map(|_| crossbeam::queue::ArrayQueue::new(depth.max(1))).collect(),
            wakers: (0..lcores).map(|_| std::sync::OnceLock::new()).collect(),
        })
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
    /// An address handle of `client` for its UD WQEs (looked up by (client, ah): a post names
    /// only its own client's handles). `RemoveClient` drops the client's handles.
    AddAh { client: u32, ah: u32, av: AddressVector },
    /// Drop an address handle.
    RemoveAh { client: u32, ah: u32 },
    /// The QPs attached to multicast group `gid` on device `device` are now `members` (empty:
    /// the group is gone from the device). Every lcore holds every group of its ports (a
    /// datagram may arrive on any lcore's queue); only the one told to `announce` sends the
    /// IGMP report when a group appears and the leave when it goes.
    McastGroup { device: u32, gid: [u8; 16], members: Vec<u32>, announce: bool },
    /// Per-QP statistics: (QPN, owning client, counters).
    QpStats { done: Sender<Vec<(u32, u32, pmrxe_transport::QpStats)>> },
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
    sq: Consumer<ShmSendWqe>,
    rq: Option<Consumer<ShmRecvWqe>>,
    /// Its CQs (and its shared segment).
    cq: CqTarget,
    is_ud: bool,
    /// Eth/IP/UDP addressing of the last path this QP sent on.
    path: Option<PathCache>,
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
    /// The destination is a multicast group (its group MAC; looped back to the port's own
    /// members too).
    mcast: bool,
    /// Eth/IP/UDP and the ICRC prefix state for the last two RoCE lengths sent on this path (a
    /// QP that sends both requests and responses alternates two lengths: data and ACKs).
    headers: [Option<wire::frame::HeaderTemplate>; 2],
    /// The entry the next new length replaces.
    next_header: usize,
}

impl PathCache {
    /// The header for a RoCE part of `roce_len` bytes: prebuilt once per (path, length), so
    /// equal-length packets (every MTU-sized one of a bulk message, every small WRITE, every
    /// ACK) copy it. `None` if the length cannot be framed.
    fn header(&mut self, roce_len: usize) -> Option<&wire::frame::HeaderTemplate> {
        let i = match self.headers.iter().position(|h| h.as_ref().is_some_and(|h| h.roce_len() == roce_len)) {
            Some(i) => i,
            None => {
                let i = self.next_header;
                self.headers[i] = Some(wire::frame::HeaderTemplate::new(&self.l3, roce_len).ok()?);
                self.next_header ^= 1;
                i
            }
        };
        self.headers[i].as_ref()
    }
}


struct CqSlot {
    /// The CQ's handle (what events name).
    handle: u32,
    client: u32,
    /// Keeps the CQ's segment mapped (its ring and `notify` point into it).
    _seg: Arc<Segment>,
    ring: Producer<ShmCqe>,
    notify: *const CqNotify,
    channel: Option<Arc<EventFd>>,
    fresh: bool,
    refs: u32,
}

// SAFETY: `notify` points into `_seg`, which the slot keeps alive; the slot moves between
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

/// The sending side of an lcore's command queue: every command also signals the lcore's
/// wake-up eventfd, so an lcore asleep in `wait` mode takes it at once (a system call on the
/// control path only; an lcore that is awake finds the eventfd readable at its next sleep
/// and goes round once more).
#[derive(Clone)]
pub struct CmdSender {
    tx: Sender<Cmd>,
    waker: Arc<Waker>,
}

impl CmdSender {
    /// Queue a command and wake the lcore.
    pub fn send(&self, cmd: Cmd) -> Result<(), crossbeam::channel::SendError<Cmd>> {
        self.tx.send(cmd)?;
        self.waker.wake();
        Ok(())
    }
}

/// Handles the control thread keeps for an lcore.
#[derive(Clone)]
pub struct LcoreHandle {
    /// Command queue.
    pub cmds: CmdSender,
    /// The lcore's wake-up eventfd (given to clients at Hello; signalled to stop it).
    pub waker: Arc<Waker>,
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
    /// One frame sent (`tx`) or received. `local_qpn`: the QP on this host the frame belongs
    /// to when the lcore knows it without parsing (the sender of a transmitted RoCE frame);
    /// `None` for received frames and for ARP/ND.
    fn frame(&self, tx: bool, local_qpn: Option<u32>, data: &[u8]);
}

/// A poll-mode lcore.
pub struct Lcore<L: Port> {
    index: usize,
    /// The ports stage: devices, their queues, the receive scratch.
    ports: Ports<L>,
    /// This lcore's epoch reader of the MR table (QSBR): `&*self.mem` is what the QPs copy
    /// through; `poll_once` ends with its quiescent point.
    mem: Box<Reader>,
    cmds: Receiver<Cmd>,
    /// The transport engine: every QP and SRQ of this lcore, with the work lists.
    engine: Engine<QpSlot>,
    /// The CQ stage: every CQ of this lcore, and those written this iteration.
    cq: CqSet,
    srqs: HashMap<u32, SrqSlot>,
    clients: Vec<ClientSlot>,
    /// The post stage: address handles, the scratch WQEs, the doorbell and backlog lists.
    posts: Posts,
    neigh: Neighbors,
    stats: Arc<LcoreStats>,
    drops: Arc<DropStats>,
    clock: Clock,
    /// The idle stage: the back-off or wait policy, the wake-up eventfd and sleep flag.
    sleeper: Sleeper,
    stop: Arc<AtomicBool>,
    tap: Option<Box<dyn Tap>>,
    grave: Sender<Box<dyn Send>>,
    handoff: Option<Arc<Handoff<L::Buf>>>,
    last_solicit: Instant,
    /// The QP1 stage: MADs to and from the connection manager.
    qp1: Qp1,
}

/// Capacity of the per-lcore QP table.
pub const MAX_QPS_PER_LCORE: usize = 4096;

impl<L: Port> Lcore<L> {
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
        let waker = Arc::new(Waker::new().expect("lcore wake-up eventfd"));
        let stats = Arc::new(LcoreStats::default());
        let drops = Arc::new(DropStats::default());
        let mut neigh = Neighbors::new();
        for (ip, mac) in neighbors {
            neigh.add_static(*ip, *mac);
        }
        let ports = Ports::new(ports);
        let lc = Lcore {
            index,
            ports,
            mem: Box::new(mem.reader().expect("more lcores than MemLimits::max_readers")),
            cmds: rx,
            engine: Engine::with_layout(QpnLayout { lcores: 1, slots: MAX_QPS_PER_LCORE as u32 }, 0),
            cq: CqSet::new(MAX_QPS_PER_LCORE),
            srqs: HashMap::with_capacity(256),
            clients: Vec::with_capacity(256),
            posts: Posts::new(MAX_QPS_PER_LCORE),
            neigh,
            stats: stats.clone(),
            drops: drops.clone(),
            clock: Clock::new(),
            sleeper: Sleeper::new(Idle::new(idle), waker.clone()),
            stop,
            tap,
            grave,
            handoff: None,
            last_solicit: Instant(0),
            qp1: Qp1::default(),
        };
        let stop = lc.stop.clone();
        (lc, LcoreHandle { cmds: CmdSender { tx, waker: waker.clone() }, waker, stats, drops, index, graveyard: grave_rx, stop })
    }

    /// Join a multi-lcore service: frames for QPs owned by another lcore are handed over
    /// through `h`. Must be called before `run`.
    pub fn set_handoff(&mut self, h: Arc<Handoff<L::Buf>>) {
        // QPNs of this lcore are `qpn % lcores == index`; the engine's slab follows.
        self.engine = Engine::with_layout(qpn_layout(h.lcores()), self.index);
        if let Some(w) = h.wakers.get(self.index) {
            let _ = w.set(self.sleeper.waker.clone());
        }
        self.handoff = Some(h);
    }

    /// Carry QP1 (CM MADs) to and from the connection manager through `pipe`. Must be called
    /// before `run`.
    pub fn set_gsi(&mut self, pipe: Arc<GsiPipe>) {
        pipe.set_lcore_waker(self.index, self.sleeper.waker.clone());
        self.qp1.pipe = Some(pipe);
    }

    /// Run until the stop flag is set.
    pub fn run(&mut self) {
        let wait = self.sleeper.idle.mode() == pmrxe_config::IdleMode::Wait;
        if wait {
            self.arm_wait();
        }
        // Wait mode with several lcores: peers may sleep while this one feeds them.
        let peers = wait && self.handoff.is_some();
        // Wait mode: this lcore's Waker flag is set and the pass about to run is the last look
        // before it blocks (`sleep.rs`; one `poll_once` call site, so the busy loop's code is
        // what it was).
        let mut last_look = false;
        while !self.stop.load(Ordering::Relaxed) {
            let now = self.clock.now();
            let work = self.poll_once(now);
            if !work {
                self.ports.check_rings(now, &self.stats);
            }
            if work {
                bump(&self.stats.busy_iterations, 1);
                bump(&self.stats.busy_ns, self.clock.now().0.saturating_sub(now.0));
                self.sleeper.idle.work();
                if wait {
                    if last_look {
                        last_look = false;
                        self.sleeper.waker.sleep_end();
                    }
                    if peers {
                        self.wake_peers();
                    }
                }
            } else if wait {
                bump(&self.stats.idle_iterations, 1);
                if last_look {
                    last_look = false;
                    if self.sleep() {
                        bump(&self.stats.idle_sleeps, 1);
                    }
                } else if self.sleeper.idle.spun_out(&self.stats.cpu_contended) {
                    self.sleeper.waker.sleep_begin();
                    std::sync::atomic::fence(Ordering::SeqCst);
                    last_look = true;
                }
            } else {
                bump(&self.stats.idle_iterations, 1);
                // The next timer bounds a sleep; only worth computing when we may sleep.
                let next = if self.sleeper.idle.may_sleep() {
                    self.next_deadline().map(|d| d.0.saturating_sub(self.clock.now().0) / 1000)
                } else {
                    None
                };
                // Offline before a sleep: a parked lcore never delays an invalidation.
                if self.sleeper.idle.idle(next, || self.mem.offline()) {
                    bump(&self.stats.idle_sleeps, 1);
                }
            }
        }
        // Shutdown: flush every QP to ERR so clients see WR_FLUSH_ERR (written into the CQ
        // rings as they are produced), then publish them.
        let now = self.clock.now();
        let mut w = self.cq.writer(&self.stats);
        self.engine.fail_all(&mut w);
        self.deliver_completions(now);
        for c in &self.clients {
            c.page().service_down.store(1, Ordering::Release);
        }
    }

    /// One loop iteration; returns whether it did any work.
    ///
    /// Receive comes before commands: a command may be caused by a completion an earlier pass
    /// made visible (a program saw its last receive, exited, and its peer's QP is moved to
    /// ERR), and every frame this lcore sent to itself before that completion (the ACK of
    /// that receive) must act first, as it would on a wire that delivers in order. Commands
    /// first let the ERR overtake the ACK and flush a SEND that had been acknowledged.
    pub fn poll_once(&mut self, now: Instant) -> bool {
        let mut work = self.receive(now);
        work |= self.commands();
        work |= self.doorbells(now);
        work |= self.timers(now);
        work |= self.gsi_transmit(now);
        work |= self.transmit(now);
        work |= self.deliver_completions(now);
        work |= self.ports.flush(&self.stats);
        // End of the iteration: no MrRef is alive, a quiescent point for MR invalidation.
        self.mem.quiescent();
        work
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.engine.poll_timeout()
    }

    // ---- control ------------------------------------------------------------------------

}

/// The shared header of a QP segment.
fn qp_shared(seg: &Segment) -> &QpShared {
    // SAFETY: a QP segment starts with a QpShared header (QpSegmentLayout::HEADER bytes,
    // 64-aligned at the segment start), all atomics; the caller's Arc keeps it mapped.
    unsafe { &*(seg.as_ptr() as *const QpShared) }
}

impl QpSlot {
    fn shared(&self) -> &QpShared {
        qp_shared(&self.cq.seg)
    }

    /// The QP went to RESET: the engine emptied its queues; WQEs still in the rings are
    /// discarded too (IBTA: a reset QP's queues are empty; completions it kept waiting for CQ
    /// room went with its queues), and every receive WQE ever posted counts as retired.
    fn reset_rings(&mut self) {
        let _ = self.sq.discard_all();
        if let Some(rq) = self.rq.as_mut() {
            if let Ok(tail) = rq.discard_all() {
                let shared = self.shared();
                shared.rq_retired.store(tail, Ordering::Release);
            }
        }
    }
}




/// The QPN layout of a service with `lcores` lcores (what the service allocates QPNs by).
pub fn qpn_layout(lcores: usize) -> QpnLayout {
    QpnLayout { lcores: lcores.max(1) as u32, slots: MAX_QPS_PER_LCORE as u32 }
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
