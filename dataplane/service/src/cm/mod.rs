//! rdma_cm in the service: one thread that owns a [`pmrxe_cm::Cm`] per port (QP1 of every
//! device), the rdma_cm ids, listeners and event channels of every client, and turns the
//! control requests `Request::Cm*` into CM commands and CM events into librdmacm events
//! (`CmEventMsg`, one SOCK_SEQPACKET datagram per event on the channel's socket).
//!
//! It is neither an lcore nor a session thread: sessions forward their `Cm*` requests through
//! [`CmHandle`] (a channel with a reply); the lcores copy QP1 frames into
//! [`GsiPipe::rx`](pmrxe_runtime::gsi::GsiPipe) and send the MADs this thread pushes into the
//! owning lcore's `tx` queue. Time is explicit (ns since the thread started). The thread
//! parks until there is work: a session's request and a frame queued by an lcore
//! ([`GsiPipe::push_rx`]) both unpark it; the sleep is bounded by the next CM deadline and by
//! [`TICK`] (channel housekeeping). Every table is bounded. Design and protocol: `docs/cm.md`.
//!
//! By concern: [`request`] dispatches a client's requests; [`ids`] owns and destroys ids;
//! [`addr`] binds and resolves addresses; [`listen`] makes passive ids within a backlog;
//! [`connect`] runs `rdma_connect`/`rdma_accept`; [`qp_attr`] answers `rdma_init_qp_attr`;
//! [`events`] drives the per-port CM (frames, timers, events); [`channel`] writes events to
//! the clients' event channels.

mod addr;
mod channel;
mod connect;
mod events;
mod ids;
mod listen;
mod mcast;
mod qp_attr;
mod request;
#[cfg(test)]
mod tests;

use addr::*;
use channel::*;
use listen::*;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam::channel::{bounded, Receiver, Sender, TryRecvError};
use pmrxe_abi::ctrl::{self, AhAttr, CmConnParam, CmEventMsg, CmSockAddr, CmUdParam, QpAttr, Request, Response};
use pmrxe_cm::cma::{self, PortSpace};
use pmrxe_cm::msg::{req, sidr_req};
use pmrxe_cm::{
    AcceptParams, Cm, CmConfig, ConnId, ConnState, ConnectParams, Event, Gid, Instant, RejReason, RoutePath, SidrParams, SidrReplyParams,
    SidrStatus, Transmit, Transport, Waiting,
};
use pmrxe_runtime::gsi::{GsiOut, GsiPipe};
use pmrxe_transport::QpType;
use pmrxe_wire::{Psn, Qpn};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// librdmacm `enum rdma_cm_event_type` (rdma/rdma_cma.h).
pub mod event {
    pub const ADDR_RESOLVED: u32 = 0;
    pub const ADDR_ERROR: u32 = 1;
    pub const ROUTE_RESOLVED: u32 = 2;
    pub const ROUTE_ERROR: u32 = 3;
    pub const CONNECT_REQUEST: u32 = 4;
    pub const CONNECT_RESPONSE: u32 = 5;
    pub const CONNECT_ERROR: u32 = 6;
    pub const UNREACHABLE: u32 = 7;
    pub const REJECTED: u32 = 8;
    pub const ESTABLISHED: u32 = 9;
    pub const DISCONNECTED: u32 = 10;
    pub const DEVICE_REMOVAL: u32 = 11;
    pub const MULTICAST_JOIN: u32 = 12;
    pub const MULTICAST_ERROR: u32 = 13;
    pub const ADDR_CHANGE: u32 = 14;
    pub const TIMEWAIT_EXIT: u32 = 15;
}

/// `enum ibv_qp_attr_mask` bits used by `CmInitQpAttr` (the shared QP table's).
pub use pmrxe_abi::qp_table::attr as mask;

/// Longest sleep of the CM thread when nothing wakes it (requests and QP1 frames do; CM
/// deadlines bound it too): the pace of channel housekeeping.
pub const TICK: Duration = Duration::from_millis(10);
/// Channel housekeeping period (backlogs retried, closed channels dropped).
const HOUSEKEEPING: Duration = Duration::from_millis(50);
/// rdma_cm ids in the whole service.
pub const MAX_IDS: usize = 16384;
/// rdma_cm ids per client.
pub const MAX_IDS_PER_CLIENT: usize = 4096;
/// Event channels in the whole service.
pub const MAX_CHANNELS: usize = 4096;
/// Event channels per client.
pub const MAX_CHANNELS_PER_CLIENT: usize = 512;
/// Events kept for a channel whose client does not read (more are dropped and counted).
pub const CHANNEL_BACKLOG: usize = 1024;
/// Acknowledgements read from one channel at a time (the rest wait for the next read).
const MAX_ACKS_PER_READ: usize = 2 * CHANNEL_BACKLOG;
/// Largest listen backlog (the kernel's ucma `max_backlog` default).
pub const MAX_BACKLOG: u32 = 1024;
/// RTR `min_rnr_timer` of a connected RC QP: IBA code 0, 655.36 ms, as the kernel's ib_cm
/// gives every rdma_cm QP (`cm_init_qp_rtr_attr`). It is the delay this QP's RNR NAKs ask the
/// peer to wait, so with the CMA's usual `rnr_retry` of 6 or 7 it is how long a receiver may
/// run without a posted receive. Applications count on it: libiscsi 1.19 registers 255
/// receive buffers (~0.4 s here) after its login response while tgtd may already send, and
/// with 0.64 ms (code 12, what this was) tgtd's seven tries ended in 5 ms with RNR_RETRY_EXC.
pub const MIN_RNR_TIMER: u8 = 0;
/// How long (IBA exponent: 4.096 µs · 2^21 = 8.6 s) a SIDR server keeps its SIDR_REP to answer
/// a retransmitted SIDR_REQ: two of the CMA requester's retransmission intervals (2^20). A
/// later retransmission is shown to the consumer again, as the kernel shows every one; the
/// crate's default (2^24, the requester's whole retry budget) kept an entry for 69 s after
/// every udaddy connection.
const SIDR_LINGER: u8 = 21;
/// The device a loopback address binds/resolves to (the kernel CMA's first active device).
const LOOPBACK_DEVICE: usize = 0;
/// Ephemeral ports for ids bound with port 0, handed out in turn from a random start (as the
/// kernel's `cma_alloc_any_port` starts from a random point of the local port range): two
/// services started alike must not give their first ids the same port, or a program told a
/// peer's `127.0.0.1:PORT` (libfabric's verbs provider listens on localhost when given no
/// address) connects to its own listener of the same port instead of being refused.
const EPHEMERAL: std::ops::RangeInclusive<u16> = 32768..=60999;

/// One device as the CM sees it.
#[derive(Clone, Debug)]
pub struct CmPort {
    /// Device index (pmrxeN).
    pub device: u32,
    /// Node GUID (the CM's CA GUID).
    pub guid: u64,
    /// GID table (index → GID).
    pub gids: Vec<[u8; 16]>,
    /// Interface addresses with their prefix length (for `rdma_resolve_addr`).
    pub nets: Vec<(IpAddr, u8)>,
    /// `enum ibv_mtu` of the port (path MTU of every route).
    pub active_mtu: u32,
    /// The lcore that sends this device's QP1 frames.
    pub lcore: usize,
}

/// A call from a session.
pub enum CmCall {
    /// One `Request::Cm*`; the reply carries an fd for `CmOpenChannel`.
    Request { client: u32, req: Request, reply: Sender<(Response, Option<OwnedFd>)> },
    /// The client is gone: destroy its ids (DREQ/REJ go out) and channels.
    ClientGone { client: u32, done: Sender<()> },
    /// Table sizes and counters for `pmrxe stats`.
    Snapshot { reply: Sender<CmSnapshot> },
}

/// The CM thread's tables and counters at one instant (`pmrxe stats --json`, key `cm`).
#[derive(Clone, Debug, Default)]
pub struct CmSnapshot {
    /// rdma_cm ids of every client (listeners included).
    pub ids: usize,
    /// Event channels of every client.
    pub channels: usize,
    /// (port, service ID) listen entries (a wildcard listen counts once per port).
    pub listeners: usize,
    /// Connections + SIDR entries of every port's CM (TIMEWAIT included).
    pub conns: usize,
    /// Events not yet written to a channel whose client does not read.
    pub backlog: usize,
    /// The thread's counters.
    pub service: CmServiceStats,
    /// Per port: (device index, connections + SIDR entries, the CM's counters).
    pub ports: Vec<(u32, usize, pmrxe_cm::CmStats)>,
}

/// What sessions hold to reach the CM thread.
#[derive(Clone)]
pub struct CmHandle {
    tx: Sender<CmCall>,
    /// The CM thread (unparked after every call).
    thread: std::thread::Thread,
}

impl CmHandle {
    /// Queue a call and wake the thread; `false` once the thread is gone.
    fn send(&self, c: CmCall) -> bool {
        if self.tx.send(c).is_err() {
            return false;
        }
        self.thread.unpark();
        true
    }
}

impl CmHandle {
    /// Forward a request and wait for its reply.
    pub fn request(&self, client: u32, req: Request) -> (Response, Option<OwnedFd>) {
        let (tx, rx) = bounded(1);
        if !self.send(CmCall::Request { client, req, reply: tx }) {
            return (err(libc::ESHUTDOWN, "the connection manager is stopping"), None);
        }
        rx.recv().unwrap_or_else(|_| (err(libc::ESHUTDOWN, "the connection manager is stopping"), None))
    }
    /// Tell the CM a client is gone (waits until its ids are destroyed).
    pub fn client_gone(&self, client: u32) {
        let (tx, rx) = bounded(1);
        if self.send(CmCall::ClientGone { client, done: tx }) {
            let _ = rx.recv();
        }
    }
    /// The CM's tables and counters; `None` if the thread does not answer within `limit`.
    pub fn snapshot(&self, limit: Duration) -> Option<CmSnapshot> {
        let (tx, rx) = bounded(1);
        if !self.send(CmCall::Snapshot { reply: tx }) {
            return None;
        }
        rx.recv_timeout(limit).ok()
    }
}

fn err(errno: i32, msg: &str) -> Response {
    Response::Err { errno, msg: msg.to_string() }
}

/// Start the CM thread.
pub fn spawn(ports: Vec<CmPort>, pipe: Arc<GsiPipe>, stop: Arc<AtomicBool>) -> std::io::Result<(CmHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = crossbeam::channel::unbounded();
    let t = std::thread::Builder::new().name("pmrxe-cm".into()).spawn(move || run(CmCore::new(ports), rx, pipe, stop))?;
    Ok((CmHandle { tx, thread: t.thread().clone() }, t))
}

fn run(mut core: CmCore, rx: Receiver<CmCall>, pipe: Arc<GsiPipe>, stop: Arc<AtomicBool>) {
    pipe.set_waker(std::thread::current());
    let mut last_house = std::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let now = core.now();
        let wait = match core.next_deadline() {
            Some(d) => Duration::from_nanos(d.0.saturating_sub(now.0)).min(TICK),
            None => TICK,
        };
        let mut call = match rx.try_recv() {
            Ok(c) => Some(c),
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                // Unpark tokens are kept: a wake-up between the checks and the park is not lost.
                if pipe.rx.is_empty() && !wait.is_zero() {
                    std::thread::park_timeout(wait);
                }
                rx.try_recv().ok()
            }
        };
        while let Some(c) = call.take() {
            match c {
                CmCall::Request { client, req, reply } => {
                    let now = core.now();
                    let r = core.request(now, client, req);
                    let _ = reply.send(r);
                }
                CmCall::ClientGone { client, done } => {
                    let now = core.now();
                    core.client_gone(now, client);
                    let _ = done.send(());
                }
                CmCall::Snapshot { reply } => {
                    let _ = reply.send(core.snapshot());
                }
            }
            core.pump(&pipe);
            call = rx.try_recv().ok();
        }
        let now = core.now();
        while let Some(f) = pipe.rx.pop() {
            core.on_frame(now, f.device, f.bytes());
        }
        core.handle_timeouts(now);
        core.pump(&pipe);
        if last_house.elapsed() >= HOUSEKEEPING {
            last_house = std::time::Instant::now();
            core.housekeeping();
        }
    }
    // Stopping: say goodbye to every peer (DREQ/REJ) as a dying client would.
    let now = core.now();
    let clients: Vec<u32> = core.ids.values().map(|r| r.client).collect();
    for c in clients {
        core.client_gone(now, c);
    }
    core.pump(&pipe);
}

/// The passive side's view of a REQ, kept until `accept` so the client can move its QP to
/// RTR/RTS before the REP exists (as librdmacm does).
#[derive(Clone, Copy, Debug)]
struct PeerReq {
    transport: Transport,
    remote_qpn: Qpn,
    rq_psn: Psn,
    path_mtu: u8,
    /// The peer's initiator depth: our max_dest_rd_atomic.
    resp_res: u8,
    /// The peer's responder resources: our max_rd_atomic.
    init_depth: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
}

#[derive(Debug)]
struct IdRec {
    client: u32,
    channel: u32,
    context: u64,
    ps: PortSpace,
    qp_type: QpType,
    /// Port index (= device index) once bound to a device.
    device: Option<usize>,
    bound: bool,
    /// A passive child of a listener (shares the listener's port).
    child: bool,
    src: CmSockAddr,
    dst: CmSockAddr,
    addr_resolved: bool,
    route_resolved: bool,
    listen_sid: Option<u64>,
    conn: Option<ConnId>,
    /// Our starting PSN (REQ or REP).
    psn: Psn,
    tos: u8,
    ack_timeout: Option<u8>,
    reuseaddr: bool,
    /// `RDMA_OPTION_ID_AFONLY` as set; unset, an IPv4 id is AF-only and an IPv6 one is not
    /// (the kernel's default with `bindv6only = 0`).
    afonly: Option<bool>,
    peer_req: Option<PeerReq>,
    /// Active RC id: the client reports ESTABLISHED itself after CONNECT_RESPONSE.
    active: bool,
    /// The listener a passive child came from (named in its CONNECT_REQUEST).
    parent: Option<u32>,
    /// A passive child: the GID its REQ/SIDR_REQ came from (the RTR address vector's).
    peer_gid: Option<Gid>,
    /// A listener: its `rdma_listen` backlog.
    backlog: u32,
    /// A listener: CONNECT_REQUESTs of its children not yet read by the client.
    pending: u32,
    /// A passive child whose CONNECT_REQUEST the client has not read yet (counted in its
    /// listener's `pending`).
    unread: bool,
    /// The multicast groups the id joined (`rdma_join_multicast`).
    joins: Vec<CmSockAddr>,
}

impl IdRec {
    fn is_ud(&self) -> bool {
        self.ps == PortSpace::UDP || self.ps == PortSpace::IPOIB || self.qp_type == QpType::Ud
    }
}

struct Channel {
    client: u32,
    sock: OwnedFd,
    backlog: VecDeque<Vec<u8>>,
}

struct PortState {
    cfg: CmPort,
    cm: Cm,
}

/// Counters of the CM thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmServiceStats {
    /// Events written to channels.
    pub events: u64,
    /// Events dropped (channel gone or its backlog full).
    pub events_dropped: u64,
    /// QP1 frames that were not CM MADs for us.
    pub rx_bad: u64,
    /// MADs dropped because an lcore's queue was full.
    pub tx_dropped: u64,
    /// Requests rejected (REJ 28 / SIDR_REP reject) because the listener's backlog of unread
    /// CONNECT_REQUESTs was full.
    pub rej_backlog: u64,
    /// Requests rejected (REJ 3 / SIDR_REP reject) because the service-side listener record
    /// was gone or the id tables were full.
    pub rej_resources: u64,
}

/// The CM state without the thread (unit-testable).
pub struct CmCore {
    ports: Vec<PortState>,
    ids: HashMap<u32, IdRec>,
    by_conn: HashMap<(usize, ConnId), u32>,
    /// (port, service id, family: [`FAM_ANY`], 4 or 6) → the listening id.
    listeners: HashMap<(usize, u64, u8), u32>,
    channels: HashMap<u32, Channel>,
    next_handle: u32,
    next_port: u16,
    rng: SmallRng,
    t0: std::time::Instant,
    /// Counters.
    pub stats: CmServiceStats,
}

impl CmCore {
    /// A CM per port, no id.
    pub fn new(ports: Vec<CmPort>) -> CmCore {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
        let ports = ports
            .into_iter()
            .enumerate()
            .map(|(i, cfg)| {
                let seed = seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                PortState { cm: Cm::new(CmConfig { ca_guid: cfg.guid, seed, sidr_linger: SIDR_LINGER, ..CmConfig::default() }), cfg }
            })
            .collect();
        CmCore {
            ports,
            ids: HashMap::new(),
            by_conn: HashMap::new(),
            listeners: HashMap::new(),
            channels: HashMap::new(),
            next_handle: 1,
            next_port: SmallRng::seed_from_u64(seed ^ 0x005E_ED0F_9047).gen_range(EPHEMERAL),
            rng: SmallRng::seed_from_u64(seed),
            t0: std::time::Instant::now(),
            stats: CmServiceStats::default(),
        }
    }

    /// Explicit time: ns since this CM started.
    pub fn now(&self) -> Instant {
        Instant(self.t0.elapsed().as_nanos() as u64)
    }

    fn handle(&mut self) -> u32 {
        loop {
            let h = self.next_handle;
            self.next_handle = self.next_handle.wrapping_add(1).max(1);
            if !self.ids.contains_key(&h) && !self.channels.contains_key(&h) {
                return h;
            }
        }
    }

    /// The earliest CM deadline of any port.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.ports.iter().filter_map(|p| p.cm.poll_timeout()).min()
    }

    /// Number of rdma_cm ids (all clients).
    pub fn id_count(&self) -> usize {
        self.ids.len()
    }

    /// Number of event channels (all clients).
    pub fn channel_count(&self) -> usize {
        self.channels.len()
    }

    /// Connections + SIDR entries of every port's CM (TIMEWAIT included).
    pub fn conn_count(&self) -> usize {
        self.ports.iter().map(|p| p.cm.len()).sum()
    }

    /// Table sizes and counters (`pmrxe stats`).
    pub fn snapshot(&self) -> CmSnapshot {
        CmSnapshot {
            ids: self.ids.len(),
            channels: self.channels.len(),
            listeners: self.listeners.len(),
            conns: self.conn_count(),
            backlog: self.channels.values().map(|c| c.backlog.len()).sum(),
            service: self.stats,
            ports: self.ports.iter().map(|p| (p.cfg.device, p.cm.len(), *p.cm.stats())).collect(),
        }
    }
}

type Reply = (Response, Option<OwnedFd>);
/// An errno and why.
type Fail = (i32, &'static str);

fn fail(errno: i32, msg: &str) -> Reply {
    (err(errno, msg), None)
}

fn ok() -> Reply {
    (Response::Ok, None)
}
