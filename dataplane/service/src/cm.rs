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

const IBV_QPT_RC: u32 = 2;
const IBV_QPT_UC: u32 = 3;
const IBV_QPT_UD: u32 = 4;
const IBV_ACCESS_LOCAL_WRITE: u32 = 1;
const IBV_ACCESS_REMOTE_WRITE: u32 = 2;
const IBV_ACCESS_REMOTE_READ: u32 = 4;
const IBV_ACCESS_REMOTE_ATOMIC: u32 = 8;

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
/// RTR `min_rnr_timer` (IBA code 12: 0.64 ms).
pub const MIN_RNR_TIMER: u8 = 12;
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

impl CmPort {
    fn owns(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|(a, _)| *a == ip)
    }
    fn routes(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|&(a, p)| same_subnet(a, ip, p))
    }
    fn addr_like(&self, like: IpAddr) -> Option<IpAddr> {
        self.nets.iter().map(|(a, _)| *a).find(|a| a.is_ipv4() == like.is_ipv4())
    }
    fn sgid_index(&self, gid: Gid) -> u8 {
        self.gids.iter().position(|x| *x == gid.0).unwrap_or(0) as u8
    }
    /// The GID that stands for `ip` on the wire: `ip`'s own, except for a loopback address,
    /// which (as with the kernel CMA's `cma_bind_loopback`/`cma_resolve_loopback`) is this
    /// device's: the GID of its address of the same family, else GID index 0.
    fn wire_gid(&self, ip: IpAddr) -> Gid {
        if !is_loopback(ip) {
            return Gid::from_ip(ip);
        }
        match self.addr_like(ip) {
            Some(a) => Gid::from_ip(a),
            None => Gid(self.gids.first().copied().unwrap_or_default()),
        }
    }
}

/// 127.0.0.0/8, ::1 (and ::ffff:127.0.0.0/104): the kernel CMA's `cma_loopback_addr`.
fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v) => v.is_loopback(),
        IpAddr::V6(v) => v.is_loopback() || v.to_ipv4_mapped().is_some_and(|m| m.is_loopback()),
    }
}

/// The source address of an id that resolves loopback `dst` with no source: the loopback
/// interface's address of that family (what a TCP socket to `dst` gets).
fn loopback_src(dst: IpAddr) -> IpAddr {
    match dst {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

fn same_subnet(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let p = u32::from(prefix.min(32));
            let m = if p == 0 { 0 } else { u32::MAX << (32 - p) };
            u32::from(a) & m == u32::from(b) & m
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let p = u32::from(prefix.min(128));
            let m = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            u128::from(a) & m == u128::from(b) & m
        }
        _ => false,
    }
}

fn sock_ip(a: &CmSockAddr) -> IpAddr {
    let v6 = Ipv6Addr::from(a.ip);
    if a.v6 {
        IpAddr::V6(v6)
    } else {
        IpAddr::V4(v6.to_ipv4_mapped().unwrap_or(Ipv4Addr::new(a.ip[12], a.ip[13], a.ip[14], a.ip[15])))
    }
}

fn sock_addr(ip: IpAddr, port: u16) -> CmSockAddr {
    match ip {
        IpAddr::V4(v) => CmSockAddr { ip: v.to_ipv6_mapped().octets(), v6: false, port },
        IpAddr::V6(v) => CmSockAddr { ip: v.octets(), v6: true, port },
    }
}

fn is_wildcard(a: &CmSockAddr) -> bool {
    sock_ip(a).is_unspecified()
}

/// A listener that takes requests of both families (an IPv6 id that is not AF-only).
const FAM_ANY: u8 = 0;

/// Whether a bound id takes only its own address family (`RDMA_OPTION_ID_AFONLY`, else the
/// kernel's default: IPv4 yes, IPv6 no).
fn is_afonly(r: &IdRec) -> bool {
    r.afonly.unwrap_or(!r.src.v6)
}

/// Which requests a listener takes: 4, 6 or [`FAM_ANY`]. Only an id that asked for AF-only
/// (`RDMA_OPTION_ID_AFONLY` = 1) is held to its family; any other listener takes both, as
/// pmrxe always did (the kernel would hold an IPv4 listener to IPv4).
fn listen_family(r: &IdRec) -> u8 {
    match (r.afonly, r.src.v6) {
        (Some(true), false) => 4,
        (Some(true), true) => 6,
        _ => FAM_ANY,
    }
}

/// The family of a request's address: 4 for IPv4 and IPv4-mapped IPv6, else 6.
fn ip_family(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 4,
        IpAddr::V6(v) if v.to_ipv4_mapped().is_some() => 4,
        IpAddr::V6(_) => 6,
    }
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
    remote_qpn: u32,
    rq_psn: u32,
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
    ps: u16,
    qp_type: u32,
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
    psn: u32,
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
}

impl IdRec {
    fn is_ud(&self) -> bool {
        self.ps == PortSpace::UDP.0 || self.ps == PortSpace::IPOIB.0 || self.qp_type == IBV_QPT_UD
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

    /// A QP1 frame received on `device`.
    pub fn on_frame(&mut self, now: Instant, device: u32, frame: &[u8]) {
        let Some(pi) = self.ports.iter().position(|p| p.cfg.device == device) else { return };
        match pmrxe_cm::gsi::parse_mad_frame(frame) {
            Ok((src, mad)) => {
                if !self.ports[pi].cfg.gids.contains(&src.dgid.0) {
                    self.stats.rx_bad += 1;
                    return;
                }
                if self.ports[pi].cm.handle_mad(now, &src, mad).is_err() {
                    self.stats.rx_bad += 1;
                }
            }
            Err(_) => self.stats.rx_bad += 1,
        }
        self.drain_events(now);
    }

    /// Fire due CM timers.
    pub fn handle_timeouts(&mut self, now: Instant) {
        for p in &mut self.ports {
            if p.cm.poll_timeout().is_some_and(|t| t <= now) {
                p.cm.handle_timeout(now);
            }
        }
        self.drain_events(now);
    }

    /// MADs to send: (port index, transmit).
    pub fn take_transmits(&mut self) -> Vec<(usize, Transmit)> {
        let mut v = Vec::new();
        for (i, p) in self.ports.iter_mut().enumerate() {
            while let Some(t) = p.cm.poll_transmit() {
                v.push((i, t));
            }
        }
        v
    }

    /// Move the MADs to send into the owning lcores' queues.
    fn pump(&mut self, pipe: &GsiPipe) {
        for (pi, t) in self.take_transmits() {
            let cfg = &self.ports[pi].cfg;
            let out = GsiOut { device: cfg.device, path: t.path, mad: *t.mad };
            if !pipe.push_tx(cfg.lcore, out) {
                self.stats.tx_dropped += 1;
            }
        }
    }

    /// Retry channel backlogs; drop channels whose client closed its end.
    pub fn housekeeping(&mut self) {
        let mut dead = Vec::new();
        let handles: Vec<u32> = self.channels.keys().copied().collect();
        for h in handles {
            // Read the client's acknowledgements (and see whether it closed its end).
            if !self.read_acks(h) {
                dead.push(h);
                continue;
            }
            if self.channels.get_mut(&h).is_some_and(|ch| flush_backlog(ch).is_err()) {
                dead.push(h);
            }
        }
        for h in dead {
            if let Some(ch) = self.channels.remove(&h) {
                self.stats.events_dropped += ch.backlog.len() as u64;
            }
        }
    }

    // ---- events -------------------------------------------------------------------------

    fn deliver(&mut self, channel: u32, msg: &CmEventMsg) {
        let Some(ch) = self.channels.get_mut(&channel) else {
            self.stats.events_dropped += 1;
            return;
        };
        let Ok(bytes) = ctrl::encode(msg) else {
            self.stats.events_dropped += 1;
            return;
        };
        if flush_backlog(ch).is_err() {
            self.channels.remove(&channel);
            self.stats.events_dropped += 1;
            return;
        }
        if !ch.backlog.is_empty() {
            if ch.backlog.len() >= CHANNEL_BACKLOG {
                self.stats.events_dropped += 1;
            } else {
                ch.backlog.push_back(bytes);
            }
            self.stats.events += 1;
            return;
        }
        match send_dgram(&ch.sock, &bytes) {
            Ok(true) => self.stats.events += 1,
            Ok(false) => {
                ch.backlog.push_back(bytes);
                self.stats.events += 1;
            }
            Err(_) => {
                self.channels.remove(&channel);
                self.stats.events_dropped += 1;
            }
        }
    }

    fn event_msg(&self, id: u32, event: u32, status: i32) -> Option<(u32, CmEventMsg)> {
        let r = self.ids.get(&id)?;
        let device = r.device.map(|p| self.ports[p].cfg.device);
        Some((r.channel, CmEventMsg { id, context: r.context, listen_id: None, event, status, device, src: r.src, dst: r.dst, ..Default::default() }))
    }

    fn emit(&mut self, id: u32, event: u32, status: i32, conn: Option<CmConnParam>, ud: Option<CmUdParam>) {
        let Some((ch, mut m)) = self.event_msg(id, event, status) else { return };
        if let Some(c) = conn {
            m.conn = c;
        }
        m.ud = ud;
        self.deliver(ch, &m);
    }

    fn ah_to(&self, pi: usize, src: IpAddr, peer: Gid, tos: u8) -> AhAttr {
        AhAttr {
            dgid: peer.0,
            sgid_index: self.ports[pi].cfg.sgid_index(self.ports[pi].cfg.wire_gid(src)),
            hop_limit: 64,
            traffic_class: tos,
            is_global: true,
            port_num: 1,
            ..Default::default()
        }
    }

    fn drain_events(&mut self, now: Instant) {
        for pi in 0..self.ports.len() {
            while let Some(ev) = self.ports[pi].cm.poll_event() {
                self.on_event(now, pi, ev);
            }
        }
    }

    fn conn_gone(&mut self, pi: usize, cid: ConnId) -> Option<u32> {
        let id = self.by_conn.remove(&(pi, cid))?;
        if let Some(r) = self.ids.get_mut(&id) {
            r.conn = None;
        }
        Some(id)
    }

    fn on_event(&mut self, now: Instant, pi: usize, ev: Event) {
        match ev {
            Event::ConnectRequest { id: cid, req } => {
                let sid = req.req.service_id;
                let split = req.cma().map(|(h, u)| (h, u.to_vec()));
                let source = req.source;
                let r = &req.req;
                let peer = PeerReq {
                    transport: if r.transport == 1 { Transport::Uc } else { Transport::Rc },
                    remote_qpn: r.local_qpn.value(),
                    rq_psn: r.starting_psn.value(),
                    path_mtu: r.path_mtu.min(self.ports[pi].cfg.active_mtu as u8).max(1),
                    resp_res: r.initiator_depth,
                    init_depth: r.responder_resources,
                    timeout: r.primary.local_ack_timeout,
                    retry_cnt: r.retry_count,
                    rnr_retry: r.rnr_retry_count,
                };
                let conn = CmConnParam {
                    private_data: split.as_ref().map(|(_, u)| u.clone()).unwrap_or_else(|| r.private_data.clone()),
                    responder_resources: r.initiator_depth,
                    initiator_depth: r.responder_resources,
                    flow_control: r.flow_control as u8,
                    retry_count: r.retry_count,
                    rnr_retry_count: r.rnr_retry_count,
                    srq: r.srq as u8,
                    qp_num: r.local_qpn.value(),
                };
                let new = match self.child_of(pi, sid, cid, source.sgid, split.map(|(h, _)| h)) {
                    Ok(new) => new,
                    Err(why) => {
                        // A full backlog: REJ 28, as the kernel's cm_destroy_id after ucma refused it.
                        let reason = if why == NoChild::Backlog { RejReason::CONSUMER_DEFINED } else { RejReason::NO_RESOURCES };
                        let _ = self.ports[pi].cm.reject(now, cid, reason, &[], &[]);
                        return;
                    }
                };
                if let Some(rec) = self.ids.get_mut(&new) {
                    rec.peer_req = Some(peer);
                }
                self.emit_request(new, Some(conn), None);
            }
            Event::SidrRequest { id: cid, req } => {
                let sid = req.req.service_id;
                let split = cma::split_private_data(sid, &req.req.private_data).map(|(h, u)| (h, u.to_vec()));
                let source = req.source;
                let user = split.as_ref().map(|(_, u)| u.clone()).unwrap_or_else(|| req.req.private_data.clone());
                let Ok(new) = self.child_of(pi, sid, cid, source.sgid, split.map(|(h, _)| h)) else {
                    let p = SidrReplyParams { status: SidrStatus::REJECT, qpn: Qpn::new(0), qkey: 0, vendor_id: 0, info: vec![], private_data: vec![] };
                    let _ = self.ports[pi].cm.sidr_reply(now, cid, &p);
                    return;
                };
                let (src, tos) = self.ids.get(&new).map(|r| (sock_ip(&r.src), r.tos)).unwrap_or((IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
                let ud = CmUdParam { private_data: user, ah_attr: self.ah_to(pi, src, source.sgid, tos), qp_num: 0, qkey: cma::UDP_QKEY };
                self.emit_request(new, None, Some(ud));
            }
            Event::ConnectResponse { id: cid, rep } => {
                let Some(&id) = self.by_conn.get(&(pi, cid)) else { return };
                let conn = CmConnParam {
                    private_data: rep.private_data.clone(),
                    responder_resources: rep.initiator_depth,
                    initiator_depth: rep.responder_resources,
                    flow_control: rep.flow_control as u8,
                    retry_count: 0,
                    rnr_retry_count: rep.rnr_retry_count,
                    srq: rep.srq as u8,
                    qp_num: rep.local_qpn.value(),
                };
                self.emit(id, ctrl::CM_EVENT_CONNECT_RESPONSE, 0, Some(conn), None);
            }
            Event::Established { id: cid, private_data } => {
                let Some(&id) = self.by_conn.get(&(pi, cid)) else { return };
                if self.ids.get(&id).is_some_and(|r| r.active) {
                    return; // the client turned CONNECT_RESPONSE into ESTABLISHED (librdmacm)
                }
                self.emit(id, event::ESTABLISHED, 0, Some(CmConnParam { private_data, ..Default::default() }), None);
            }
            Event::Rejected { id: cid, reason, private_data, .. } => {
                let Some(id) = self.conn_gone(pi, cid) else { return };
                self.emit(id, event::REJECTED, i32::from(reason.0), Some(CmConnParam { private_data, ..Default::default() }), None);
            }
            Event::TimedOut { id: cid, waiting_for } => {
                let Some(id) = self.conn_gone(pi, cid) else { return };
                let _ = waiting_for == Waiting::Rep;
                self.emit(id, event::UNREACHABLE, -libc::ETIMEDOUT, None, None);
            }
            Event::Disconnected { id: cid, private_data, .. } => {
                let Some(&id) = self.by_conn.get(&(pi, cid)) else { return };
                self.emit(id, event::DISCONNECTED, 0, Some(CmConnParam { private_data, ..Default::default() }), None);
            }
            Event::TimewaitExit { id: cid } => {
                let Some(id) = self.conn_gone(pi, cid) else { return };
                self.emit(id, event::TIMEWAIT_EXIT, 0, None, None);
            }
            Event::SidrReply { id: cid, rep } => {
                let Some(id) = self.conn_gone(pi, cid) else { return };
                if rep.status == SidrStatus::SUCCESS {
                    let Some(r) = self.ids.get(&id) else { return };
                    let ah = self.ah_to(pi, sock_ip(&r.src), self.ports[pi].cfg.wire_gid(sock_ip(&r.dst)), r.tos);
                    let ud = CmUdParam { private_data: rep.private_data.clone(), ah_attr: ah, qp_num: rep.qpn.value(), qkey: rep.qkey };
                    self.emit(id, event::ESTABLISHED, 0, None, Some(ud));
                } else {
                    let ud = CmUdParam { private_data: rep.private_data.clone(), ..Default::default() };
                    self.emit(id, event::UNREACHABLE, i32::from(rep.status.0), None, Some(ud));
                }
            }
        }
    }

    /// A new passive id for a REQ/SIDR_REQ of connection `cid` on port `pi` to listener `sid`.
    /// Each refusal is counted: `rej_backlog` or `rej_resources`.
    fn child_of(&mut self, pi: usize, sid: u64, cid: ConnId, peer: Gid, hdr: Option<cma::Repr>) -> Result<u32, NoChild> {
        let r = self.new_child(pi, sid, cid, peer, hdr);
        if r == Err(NoChild::Resources) {
            self.stats.rej_resources += 1;
        }
        r
    }

    fn new_child(&mut self, pi: usize, sid: u64, cid: ConnId, peer: Gid, hdr: Option<cma::Repr>) -> Result<u32, NoChild> {
        let fam = ip_family(hdr.as_ref().map_or(peer.to_ip(), |h| h.dst_ip));
        let &lid = self.listeners.get(&(pi, sid, fam)).or_else(|| self.listeners.get(&(pi, sid, FAM_ANY))).ok_or(NoChild::Resources)?;
        let l = self.ids.get(&lid).ok_or(NoChild::Resources)?;
        if l.pending >= l.backlog {
            // Full as far as we know: collect the client's read-acknowledgements first.
            let ch = l.channel;
            self.read_acks(ch);
        }
        let l = self.ids.get(&lid).ok_or(NoChild::Resources)?;
        if l.pending >= l.backlog {
            self.stats.rej_backlog += 1;
            return Err(NoChild::Backlog);
        }
        let client = l.client;
        if self.ids.len() >= MAX_IDS || self.ids.values().filter(|r| r.client == client).count() >= MAX_IDS_PER_CLIENT {
            return Err(NoChild::Resources);
        }
        let port = l.src.port;
        let (src, dst) = match hdr {
            Some(h) => (sock_addr(h.dst_ip, port), sock_addr(h.src_ip, h.src_port)),
            None => {
                let ours = self.ports[pi].cfg.addr_like(peer.to_ip()).unwrap_or(peer.to_ip());
                (sock_addr(ours, port), sock_addr(peer.to_ip(), 0))
            }
        };
        let rec = IdRec {
            client,
            channel: l.channel,
            context: l.context,
            ps: l.ps,
            qp_type: l.qp_type,
            device: Some(pi),
            bound: true,
            child: true,
            src,
            dst,
            addr_resolved: true,
            route_resolved: true,
            listen_sid: None,
            conn: Some(cid),
            psn: self.rng.gen::<u32>() & 0xff_ffff,
            tos: l.tos,
            ack_timeout: l.ack_timeout,
            reuseaddr: false,
            afonly: None,
            peer_req: None,
            active: false,
            parent: Some(lid),
            peer_gid: Some(peer),
            backlog: 0,
            pending: 0,
            unread: true,
        };
        let h = self.handle();
        self.ids.insert(h, rec);
        self.by_conn.insert((pi, cid), h);
        if let Some(l) = self.ids.get_mut(&lid) {
            l.pending += 1;
        }
        Ok(h)
    }

    /// The client read the CONNECT_REQUEST of child `id` (or named the id in a request): its
    /// listener's backlog slot is free again.
    fn request_read(&mut self, id: u32) {
        let Some(r) = self.ids.get_mut(&id) else { return };
        if !std::mem::take(&mut r.unread) {
            return;
        }
        if let Some(l) = r.parent.and_then(|p| self.ids.get_mut(&p)) {
            l.pending = l.pending.saturating_sub(1);
        }
    }

    /// Read the [`ctrl::CmEventAck`]s the client wrote on `channel`. `false`: the client
    /// closed its end.
    fn read_acks(&mut self, channel: u32) -> bool {
        let mut read = Vec::new();
        let mut datagrams = 0;
        let alive = match self.channels.get(&channel) {
            Some(ch) => loop {
                if datagrams >= MAX_ACKS_PER_READ {
                    // A client that writes without end does not keep this thread here.
                    break true;
                }
                let mut b = [0u8; 64];
                match rustix::net::recv(&ch.sock, &mut b[..], RecvFlags::DONTWAIT) {
                    Ok((n, _)) if n > 0 => {
                        datagrams += 1;
                        if let Ok(a) = ctrl::decode::<ctrl::CmEventAck>(&b[..n]) {
                            read.push(a.id);
                        }
                        continue;
                    }
                    // EOF, or ECONNRESET when the client closed with events unread: gone.
                    Ok(_) => break false,
                    Err(e) => break e == Errno::AGAIN || e == Errno::INTR,
                }
            },
            None => return false,
        };
        let owner = self.channels.get(&channel).map(|c| c.client);
        for id in read {
            if self.ids.get(&id).map(|r| r.client) == owner {
                self.request_read(id);
            }
        }
        alive
    }
}

/// Why no passive id was made for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NoChild {
    /// No listener, or the id tables are full.
    Resources,
    /// The listener's backlog of unread CONNECT_REQUESTs is full.
    Backlog,
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

impl CmCore {
    fn emit_request(&mut self, id: u32, conn: Option<CmConnParam>, ud: Option<CmUdParam>) {
        let parent = self.ids.get(&id).and_then(|r| r.parent);
        let Some((ch, mut m)) = self.event_msg(id, event::CONNECT_REQUEST, 0) else { return };
        m.listen_id = parent;
        if let Some(c) = conn {
            m.conn = c;
        }
        m.ud = ud;
        self.deliver(ch, &m);
    }

    /// The client's id `id` (other clients' ids do not exist for it).
    fn own(&self, client: u32, id: u32) -> Result<&IdRec, Fail> {
        match self.ids.get(&id) {
            Some(r) if r.client == client => Ok(r),
            _ => Err((libc::EINVAL, "no such rdma_cm id")),
        }
    }

    fn own_channel(&self, client: u32, ch: u32) -> bool {
        self.channels.get(&ch).is_some_and(|c| c.client == client)
    }

    /// Is (`ps`, `port`) on `device` (None = every device) taken by another id?
    /// Is `port` taken for id `me` binding on `device`? `fam`: the family of the address it
    /// binds and whether it is AF-only; two AF-only ids of different families never clash
    /// (the kernel's `cma_check_port`).
    fn port_taken(&self, me: u32, ps: u16, device: Option<usize>, port: u16, fam: Option<(bool, bool)>) -> bool {
        self.ids.iter().any(|(&h, r)| {
            h != me && r.bound && !r.child && r.ps == ps && r.src.port == port && (r.device.is_none() || device.is_none() || r.device == device)
                && !(r.reuseaddr && r.listen_sid.is_none())
                && !fam.is_some_and(|(v6, afonly)| afonly && is_afonly(r) && v6 != r.src.v6)
        })
    }

    fn ephemeral(&mut self, me: u32, ps: u16, device: Option<usize>) -> Option<u16> {
        let n = EPHEMERAL.end() - EPHEMERAL.start() + 1;
        for _ in 0..n {
            let p = self.next_port;
            self.next_port = if p >= *EPHEMERAL.end() { *EPHEMERAL.start() } else { p + 1 };
            if !self.port_taken(me, ps, device, p, None) {
                return Some(p);
            }
        }
        None
    }

    /// Bind `id` to `addr` (wildcard = every device; port 0 = ephemeral).
    fn bind(&mut self, id: u32, addr: CmSockAddr) -> Result<(), Fail> {
        let Some(r) = self.ids.get(&id) else { return Err((libc::EINVAL, "no such rdma_cm id")) };
        if r.bound {
            return Err((libc::EINVAL, "rdma_cm id already bound"));
        }
        let ps = r.ps;
        let device = if is_wildcard(&addr) {
            None
        } else {
            let ip = sock_ip(&addr);
            match self.ports.iter().position(|p| p.cfg.owns(ip)) {
                Some(p) => Some(p),
                // cma_bind_loopback: the first device; the id keeps the loopback address.
                None if is_loopback(ip) && !self.ports.is_empty() => Some(LOOPBACK_DEVICE),
                None => return Err((libc::EADDRNOTAVAIL, "no pmrxe device has this address")),
            }
        };
        let port = if addr.port == 0 {
            match self.ephemeral(id, ps, device) {
                Some(p) => p,
                None => return Err((libc::EADDRINUSE, "no free port")),
            }
        } else {
            let afonly = self.ids[&id].afonly.unwrap_or(!addr.v6);
            if self.port_taken(id, ps, device, addr.port, Some((addr.v6, afonly))) {
                return Err((libc::EADDRINUSE, "address already in use"));
            }
            addr.port
        };
        let r = self.ids.get_mut(&id).expect("checked above");
        r.device = device;
        r.bound = true;
        r.src = CmSockAddr { port, ..addr };
        Ok(())
    }

    fn addr_reply(&self, id: u32) -> Reply {
        let r = &self.ids[&id];
        (Response::CmAddr { addr: r.src, device: r.device.map(|p| self.ports[p].cfg.device) }, None)
    }

    /// One `Request::Cm*` of `client`.
    pub fn request(&mut self, now: Instant, client: u32, req: Request) -> Reply {
        // A client that names a passive id has read its CONNECT_REQUEST.
        if let Some(id) = named_id(&req).filter(|id| self.ids.get(id).is_some_and(|r| r.client == client)) {
            self.request_read(id);
        }
        let r = self.request_inner(now, client, req);
        self.drain_events(now);
        r
    }

    fn request_inner(&mut self, now: Instant, client: u32, req: Request) -> Reply {
        match req {
            Request::CmOpenChannel => {
                if self.channels.len() >= MAX_CHANNELS || self.channels.values().filter(|c| c.client == client).count() >= MAX_CHANNELS_PER_CLIENT {
                    return fail(libc::EMFILE, "too many rdma_cm event channels");
                }
                let (ours, theirs) = match seqpacket_pair() {
                    Ok(p) => p,
                    Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE), &e.to_string()),
                };
                let h = self.handle();
                self.channels.insert(h, Channel { client, sock: ours, backlog: VecDeque::new() });
                (Response::CmChannel { channel: h }, Some(theirs))
            }
            Request::CmCreateId { channel, ps, qp_type, context } => {
                if !self.own_channel(client, channel) {
                    return fail(libc::EINVAL, "no such rdma_cm event channel");
                }
                if ![PortSpace::TCP.0, PortSpace::UDP.0, PortSpace::IB.0, PortSpace::IPOIB.0].contains(&ps) {
                    return fail(libc::EPROTONOSUPPORT, "unknown rdma_cm port space");
                }
                if ![IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD].contains(&qp_type) {
                    return fail(libc::EINVAL, "rdma_cm ids are for RC, UC or UD QPs");
                }
                if self.ids.len() >= MAX_IDS || self.ids.values().filter(|r| r.client == client).count() >= MAX_IDS_PER_CLIENT {
                    return fail(libc::ENOMEM, "too many rdma_cm ids");
                }
                let h = self.handle();
                self.ids.insert(
                    h,
                    IdRec {
                        client,
                        channel,
                        context,
                        ps,
                        qp_type,
                        device: None,
                        bound: false,
                        child: false,
                        src: CmSockAddr::default(),
                        dst: CmSockAddr::default(),
                        addr_resolved: false,
                        route_resolved: false,
                        listen_sid: None,
                        conn: None,
                        psn: self.rng.gen::<u32>() & 0xff_ffff,
                        tos: 0,
                        ack_timeout: None,
                        reuseaddr: false,
                        afonly: None,
                        peer_req: None,
                        active: false,
                        parent: None,
                        peer_gid: None,
                        backlog: 0,
                        pending: 0,
                        unread: false,
                    },
                );
                (Response::CmId { id: h }, None)
            }
            Request::CmMigrateId { id, channel } => {
                if let Err(e) = self.own(client, id) {
                    return fail(e.0, e.1);
                }
                if !self.own_channel(client, channel) {
                    return fail(libc::EINVAL, "no such rdma_cm event channel");
                }
                self.ids.get_mut(&id).expect("owned").channel = channel;
                ok()
            }
            Request::CmBindAddr { id, addr } => {
                if let Err(e) = self.own(client, id) {
                    return fail(e.0, e.1);
                }
                match self.bind(id, addr) {
                    Ok(()) => self.addr_reply(id),
                    Err(e) => fail(e.0, e.1),
                }
            }
            Request::CmResolveAddr { id, src, dst, .. } => self.resolve_addr(client, id, src, dst),
            Request::CmResolveRoute { id, .. } => {
                let r = match self.own(client, id) {
                    Ok(r) => r,
                    Err(e) => return fail(e.0, e.1),
                };
                if !r.addr_resolved {
                    return fail(libc::EINVAL, "resolve the address first");
                }
                self.ids.get_mut(&id).expect("owned").route_resolved = true;
                self.emit(id, event::ROUTE_RESOLVED, 0, None, None);
                ok()
            }
            Request::CmListen { id, backlog } => self.listen(client, id, backlog),
            Request::CmConnect { id, qpn, conn } => self.connect(now, client, id, qpn, conn),
            Request::CmAccept { id, qpn, conn } => self.accept(now, client, id, qpn, conn),
            Request::CmReject { id, private_data } => {
                let r = match self.own(client, id) {
                    Ok(r) => r,
                    Err(e) => return fail(e.0, e.1),
                };
                let (Some(pi), Some(cid), ud) = (r.device, r.conn, r.is_ud()) else { return fail(libc::EINVAL, "no connection request to reject") };
                let res = if ud {
                    let p = SidrReplyParams { status: SidrStatus::REJECT, qpn: Qpn::new(0), qkey: 0, vendor_id: 0, info: vec![], private_data };
                    self.ports[pi].cm.sidr_reply(now, cid, &p)
                } else {
                    self.ports[pi].cm.reject(now, cid, RejReason::CONSUMER_DEFINED, &[], &private_data)
                };
                match res {
                    Ok(()) => {
                        self.conn_gone(pi, cid);
                        ok()
                    }
                    Err(e) => fail(libc::EINVAL, &format!("reject: {e:?}")),
                }
            }
            Request::CmEstablish { id } => {
                let r = match self.own(client, id) {
                    Ok(r) => r,
                    Err(e) => return fail(e.0, e.1),
                };
                let (Some(pi), Some(cid)) = (r.device, r.conn) else { return fail(libc::EINVAL, "not connecting") };
                let cm = &mut self.ports[pi].cm;
                let res = match cm.state(cid) {
                    Some(ConnState::RepRcvd | ConnState::MraRepSent) => cm.rtu(now, cid, &[]),
                    Some(ConnState::RepSent | ConnState::MraRepRcvd) => cm.establish(now, cid),
                    Some(ConnState::Established) => Ok(()),
                    _ => return fail(libc::EINVAL, "the connection is not being established"),
                };
                match res {
                    Ok(()) => ok(),
                    Err(e) => fail(libc::EINVAL, &format!("establish: {e:?}")),
                }
            }
            Request::CmDisconnect { id } => {
                let r = match self.own(client, id) {
                    Ok(r) => r,
                    Err(e) => return fail(e.0, e.1),
                };
                let (Some(pi), Some(cid)) = (r.device, r.conn) else { return fail(libc::EINVAL, "not connected") };
                let cm = &mut self.ports[pi].cm;
                match cm.state(cid) {
                    Some(ConnState::Established) => match cm.disconnect(now, cid, &[]) {
                        Ok(()) => ok(),
                        Err(e) => fail(libc::EINVAL, &format!("disconnect: {e:?}")),
                    },
                    Some(ConnState::DreqSent | ConnState::TimeWait) => ok(),
                    _ => fail(libc::EINVAL, "not connected"),
                }
            }
            Request::CmInitQpAttr { id, qp_state } => match self.own(client, id) {
                Ok(_) => self.init_qp_attr(id, qp_state),
                Err(e) => fail(e.0, e.1),
            },
            Request::CmSetOption { id, level, name, value } => {
                if let Err(e) = self.own(client, id) {
                    return fail(e.0, e.1);
                }
                let r = self.ids.get_mut(&id).expect("owned");
                let int = || value.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                match (level, name) {
                    (0, 0) => match value.first() {
                        Some(&t) => r.tos = t,
                        None => return fail(libc::EINVAL, "TOS needs one byte"),
                    },
                    (0, 1) => match int() {
                        Some(v) => r.reuseaddr = v != 0,
                        None => return fail(libc::EINVAL, "REUSEADDR needs an int"),
                    },
                    (0, 2) => match int() {
                        Some(v) => r.afonly = Some(v != 0),
                        None => return fail(libc::EINVAL, "AFONLY needs an int"),
                    },
                    (0, 3) => match value.first() {
                        Some(&t) => r.ack_timeout = Some(t.min(31)),
                        None => return fail(libc::EINVAL, "ACK_TIMEOUT needs one byte"),
                    },
                    _ => return fail(libc::ENOSYS, "unsupported rdma_cm option"),
                }
                ok()
            }
            Request::CmDestroyId { id } => {
                if let Err(e) = self.own(client, id) {
                    return fail(e.0, e.1);
                }
                self.destroy(now, id);
                ok()
            }
            _ => fail(libc::EINVAL, "not an rdma_cm request"),
        }
    }

    fn resolve_addr(&mut self, client: u32, id: u32, src: Option<CmSockAddr>, dst: CmSockAddr) -> Reply {
        let r = match self.own(client, id) {
            Ok(r) => r,
            Err(e) => return fail(e.0, e.1),
        };
        if r.listen_sid.is_some() || r.conn.is_some() {
            return fail(libc::EINVAL, "rdma_cm id is listening or connected");
        }
        if let Some(s) = src {
            if !r.bound {
                if let Err(e) = self.bind(id, s) {
                    return fail(e.0, e.1);
                }
            }
        }
        let r = &self.ids[&id];
        let dip = sock_ip(&dst);
        if dip.is_unspecified() {
            return fail(libc::EADDRNOTAVAIL, "no destination address");
        }
        let chosen = r
            .device
            .or_else(|| self.ports.iter().position(|p| p.cfg.owns(dip)))
            .or_else(|| self.ports.iter().position(|p| p.cfg.routes(dip)))
            .or_else(|| (is_loopback(dip) && !self.ports.is_empty()).then_some(LOOPBACK_DEVICE));
        let Some(pi) = chosen else { return fail(libc::EADDRNOTAVAIL, "no pmrxe device owns or routes to the destination") };
        let sip = if r.bound && !is_wildcard(&r.src) {
            Some(sock_ip(&r.src))
        } else if is_loopback(dip) {
            Some(loopback_src(dip))
        } else {
            self.ports[pi].cfg.addr_like(dip)
        };
        let Some(sip) = sip.filter(|s| s.is_ipv4() == dip.is_ipv4()) else {
            return fail(libc::EADDRNOTAVAIL, "the device has no address of the destination's family");
        };
        let port = if r.bound && r.src.port != 0 {
            r.src.port
        } else {
            match self.ephemeral(id, r.ps, Some(pi)) {
                Some(p) => p,
                None => return fail(libc::EADDRINUSE, "no free port"),
            }
        };
        let r = self.ids.get_mut(&id).expect("owned");
        r.device = Some(pi);
        r.bound = true;
        r.src = sock_addr(sip, port);
        r.dst = dst;
        r.addr_resolved = true;
        self.emit(id, event::ADDR_RESOLVED, 0, None, None);
        self.addr_reply(id)
    }

    fn listen(&mut self, client: u32, id: u32, backlog: u32) -> Reply {
        let r = match self.own(client, id) {
            Ok(r) => r,
            Err(e) => return fail(e.0, e.1),
        };
        if r.listen_sid.is_some() {
            return ok();
        }
        if r.conn.is_some() || r.child {
            return fail(libc::EINVAL, "rdma_cm id is connected");
        }
        if !r.bound {
            if let Err(e) = self.bind(id, CmSockAddr::default()) {
                return fail(e.0, e.1);
            }
        }
        let r = &self.ids[&id];
        let ps = if r.is_ud() && r.ps != PortSpace::IPOIB.0 { PortSpace::UDP } else { PortSpace(r.ps) };
        let sid = cma::service_id(ps, r.src.port);
        let ports: Vec<usize> = match r.device {
            Some(p) => vec![p],
            None => (0..self.ports.len()).collect(),
        };
        let backlog = if backlog == 0 || backlog > MAX_BACKLOG { MAX_BACKLOG } else { backlog };
        let fam = listen_family(r);
        for (k, &pi) in ports.iter().enumerate() {
            // The CM's own bound on requests waiting for an answer is the client's id limit;
            // the listen backlog (unread CONNECT_REQUESTs, as the kernel's ucma) is ours.
            // An AF-only IPv4 and an AF-only IPv6 listener share a port (tgt's iSER portals);
            // the port's CM listens once for both.
            let others: Vec<u8> = [FAM_ANY, 4, 6].into_iter().filter(|&f| self.listeners.contains_key(&(pi, sid, f))).collect();
            let clash = others.iter().any(|&f| f == fam || f == FAM_ANY || fam == FAM_ANY);
            if clash || (others.is_empty() && self.ports[pi].cm.listen(sid, MAX_IDS_PER_CLIENT).is_err()) {
                for &undo in &ports[..k] {
                    self.listeners.remove(&(undo, sid, fam));
                    if ![FAM_ANY, 4, 6].iter().any(|&f| self.listeners.contains_key(&(undo, sid, f))) {
                        let _ = self.ports[undo].cm.unlisten(sid);
                    }
                }
                return fail(libc::EADDRINUSE, "already listening on this port");
            }
            self.listeners.insert((pi, sid, fam), id);
        }
        let r = self.ids.get_mut(&id).expect("owned");
        r.listen_sid = Some(sid);
        r.backlog = backlog;
        ok()
    }

    fn route(&self, r: &IdRec, pi: usize) -> RoutePath {
        let mut path = RoutePath::between(sock_ip(&r.src), sock_ip(&r.dst));
        let cfg = &self.ports[pi].cfg;
        path.sgid = cfg.wire_gid(sock_ip(&r.src));
        path.dgid = cfg.wire_gid(sock_ip(&r.dst));
        path.mtu = self.ports[pi].cfg.active_mtu.clamp(1, 5) as u8;
        path.traffic_class = r.tos;
        if let Some(t) = r.ack_timeout {
            path.local_ack_timeout = t;
        }
        path
    }

    fn connect(&mut self, now: Instant, client: u32, id: u32, qpn: u32, conn: CmConnParam) -> Reply {
        let r = match self.own(client, id) {
            Ok(r) => r,
            Err(e) => return fail(e.0, e.1),
        };
        let Some(pi) = r.device.filter(|_| r.route_resolved) else { return fail(libc::EINVAL, "resolve the route first") };
        if r.conn.is_some() || r.listen_sid.is_some() {
            return fail(libc::EISCONN, "rdma_cm id is already connecting or listening");
        }
        let path = self.route(r, pi);
        let hdr = cma::Repr { src_ip: sock_ip(&r.src), src_port: r.src.port, dst_ip: sock_ip(&r.dst) };
        let (ud, ps, dport, psn, qp_type) = (r.is_ud(), r.ps, r.dst.port, r.psn, r.qp_type);
        let res = if ud {
            let Ok(pd) = hdr.with_user_data(&conn.private_data, sidr_req::PRIVATE_DATA_LEN) else {
                return fail(libc::EINVAL, "private data too long");
            };
            let sid = cma::service_id(if ps == PortSpace::IPOIB.0 { PortSpace::IPOIB } else { PortSpace::UDP }, dport);
            let p = SidrParams { path, service_id: sid, timeout: pmrxe_cm::types::CMA_CM_RESPONSE_TIMEOUT, max_cm_retries: pmrxe_cm::types::CMA_MAX_CM_RETRIES, private_data: pd };
            self.ports[pi].cm.sidr_resolve(now, &p)
        } else {
            let Ok(pd) = hdr.with_user_data(&conn.private_data, req::PRIVATE_DATA_LEN) else {
                return fail(libc::EINVAL, "private data too long");
            };
            let sid = cma::service_id(PortSpace(ps), dport);
            let mut p = ConnectParams::new(path, sid, Qpn::new(qpn), Psn::new(psn));
            p.transport = if qp_type == IBV_QPT_UC { Transport::Uc } else { Transport::Rc };
            p.responder_resources = conn.responder_resources;
            p.initiator_depth = conn.initiator_depth;
            p.retry_count = conn.retry_count.min(7);
            p.rnr_retry_count = conn.rnr_retry_count.min(7);
            p.flow_control = conn.flow_control != 0;
            p.srq = conn.srq != 0;
            p.private_data = pd;
            self.ports[pi].cm.connect(now, &p)
        };
        match res {
            Ok(cid) => {
                let rec = self.ids.get_mut(&id).expect("owned");
                rec.conn = Some(cid);
                rec.active = !ud;
                self.by_conn.insert((pi, cid), id);
                ok()
            }
            Err(pmrxe_cm::CmError::TableFull) => fail(libc::ENOMEM, "connection table full"),
            Err(e) => fail(libc::EINVAL, &format!("connect: {e:?}")),
        }
    }

    fn accept(&mut self, now: Instant, client: u32, id: u32, qpn: u32, conn: CmConnParam) -> Reply {
        let r = match self.own(client, id) {
            Ok(r) => r,
            Err(e) => return fail(e.0, e.1),
        };
        let (Some(pi), Some(cid)) = (r.device, r.conn) else { return fail(libc::EINVAL, "no connection request to accept") };
        let res = if r.is_ud() {
            let p = SidrReplyParams { status: SidrStatus::SUCCESS, qpn: Qpn::new(qpn), qkey: cma::UDP_QKEY, vendor_id: 0, info: vec![], private_data: conn.private_data };
            let res = self.ports[pi].cm.sidr_reply(now, cid, &p);
            if res.is_ok() {
                self.conn_gone(pi, cid);
            }
            res
        } else {
            let p = AcceptParams {
                local_qpn: Qpn::new(qpn),
                starting_psn: Psn::new(r.psn),
                responder_resources: conn.responder_resources,
                initiator_depth: conn.initiator_depth,
                rnr_retry_count: conn.rnr_retry_count.min(7),
                flow_control: conn.flow_control != 0,
                srq: conn.srq != 0,
                ece: Default::default(),
                private_data: conn.private_data,
            };
            self.ports[pi].cm.accept(now, cid, &p)
        };
        match res {
            Ok(()) => ok(),
            Err(e) => fail(libc::EINVAL, &format!("accept: {e:?}")),
        }
    }

    /// `rdma_init_qp_attr` (kernel `rdma_init_qp_attr` + `ib_cm_init_qp_attr` for RoCE).
    fn init_qp_attr(&self, id: u32, qp_state: u32) -> Reply {
        let r = &self.ids[&id];
        let Some(pi) = r.device else { return fail(libc::EINVAL, "rdma_cm id has no device yet") };
        let port = &self.ports[pi];
        let mut a = QpAttr { qp_state, cur_qp_state: qp_state, ..Default::default() };
        let ud = r.is_ud();
        let attrs = r.conn.and_then(|c| port.cm.qp_attrs(c));
        let mask = match qp_state {
            1 => {
                a.pkey_index = 0;
                a.port_num = 1;
                if ud {
                    a.qkey = cma::UDP_QKEY;
                    mask::STATE | mask::PKEY_INDEX | mask::PORT | mask::QKEY
                } else {
                    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
                    let resp = attrs.map(|x| x.max_dest_rd_atomic).or(r.peer_req.map(|p| p.resp_res)).unwrap_or(0);
                    if resp > 0 {
                        a.qp_access_flags |= IBV_ACCESS_REMOTE_ATOMIC;
                    }
                    mask::STATE | mask::ACCESS_FLAGS | mask::PKEY_INDEX | mask::PORT
                }
            }
            2 if ud => mask::STATE,
            2 => {
                let (transport, dqpn, rq_psn, mtu, resp) = match (attrs, r.peer_req) {
                    (Some(x), _) => (x.transport, x.remote_qpn.value(), x.rq_psn.value(), x.path_mtu, x.max_dest_rd_atomic),
                    (None, Some(p)) => (p.transport, p.remote_qpn, p.rq_psn, p.path_mtu, p.resp_res),
                    (None, None) => return fail(libc::EINVAL, "no connection parameters yet (RTR needs the REQ or REP)"),
                };
                a.dest_qp_num = dqpn;
                a.rq_psn = rq_psn;
                a.path_mtu = u32::from(mtu);
                let peer = r.peer_gid.unwrap_or_else(|| port.cfg.wire_gid(sock_ip(&r.dst)));
                a.ah_attr = self.ah_to(pi, sock_ip(&r.src), peer, r.tos);
                let mut m = mask::STATE | mask::AV | mask::PATH_MTU | mask::DEST_QPN | mask::RQ_PSN;
                if transport == Transport::Rc {
                    a.max_dest_rd_atomic = resp;
                    a.min_rnr_timer = MIN_RNR_TIMER;
                    m |= mask::MAX_DEST_RD_ATOMIC | mask::MIN_RNR_TIMER;
                }
                m
            }
            3 if ud => {
                a.sq_psn = 0;
                mask::STATE | mask::SQ_PSN
            }
            3 => {
                let (transport, timeout, retry, rnr, init) = match (attrs, r.peer_req) {
                    (Some(x), _) => (x.transport, x.timeout, x.retry_cnt, x.rnr_retry, x.max_rd_atomic),
                    (None, Some(p)) => (p.transport, p.timeout, p.retry_cnt, p.rnr_retry, p.init_depth),
                    (None, None) => return fail(libc::EINVAL, "no connection parameters yet (RTS needs the REQ or REP)"),
                };
                a.sq_psn = r.psn;
                let mut m = mask::STATE | mask::SQ_PSN;
                if transport == Transport::Rc {
                    a.timeout = r.ack_timeout.unwrap_or(timeout);
                    a.retry_cnt = retry;
                    a.rnr_retry = rnr;
                    a.max_rd_atomic = init;
                    m |= mask::TIMEOUT | mask::RETRY_CNT | mask::RNR_RETRY | mask::MAX_QP_RD_ATOMIC;
                }
                m
            }
            _ => return fail(libc::EINVAL, "rdma_init_qp_attr: only INIT, RTR and RTS"),
        };
        (Response::CmQpAttr { attr: a, mask }, None)
    }

    fn destroy(&mut self, now: Instant, id: u32) {
        self.request_read(id);
        let Some(r) = self.ids.remove(&id) else { return };
        if let (Some(pi), Some(cid)) = (r.device, r.conn) {
            let _ = self.ports[pi].cm.destroy(now, cid);
            self.by_conn.remove(&(pi, cid));
        }
        if let Some(sid) = r.listen_sid {
            let keys: Vec<(usize, u64, u8)> = self.listeners.iter().filter(|(k, &v)| k.1 == sid && v == id).map(|(k, _)| *k).collect();
            for k in keys {
                self.listeners.remove(&k);
                if ![FAM_ANY, 4, 6].iter().any(|&f| self.listeners.contains_key(&(k.0, sid, f))) {
                    let _ = self.ports[k.0].cm.unlisten(sid);
                }
            }
        }
        for c in self.ids.values_mut() {
            if c.parent == Some(id) {
                c.parent = None;
            }
        }
    }

    /// A client is gone: its ids are destroyed (the CM sends DREQ/REJ) and its channels closed.
    pub fn client_gone(&mut self, now: Instant, client: u32) {
        let ids: Vec<u32> = self.ids.iter().filter(|(_, r)| r.client == client).map(|(&h, _)| h).collect();
        for h in ids {
            self.destroy(now, h);
        }
        self.channels.retain(|_, c| c.client != client);
        self.drain_events(now);
    }
}

/// The id a request names (for the backlog: naming a passive id means its CONNECT_REQUEST
/// was read).
fn named_id(req: &Request) -> Option<u32> {
    match *req {
        Request::CmMigrateId { id, .. }
        | Request::CmBindAddr { id, .. }
        | Request::CmResolveAddr { id, .. }
        | Request::CmResolveRoute { id, .. }
        | Request::CmListen { id, .. }
        | Request::CmConnect { id, .. }
        | Request::CmAccept { id, .. }
        | Request::CmReject { id, .. }
        | Request::CmEstablish { id }
        | Request::CmDisconnect { id }
        | Request::CmInitQpAttr { id, .. }
        | Request::CmSetOption { id, .. }
        | Request::CmDestroyId { id } => Some(id),
        _ => None,
    }
}

/// Send one datagram without blocking: Ok(true) sent, Ok(false) the socket is full.
fn send_dgram(sock: &OwnedFd, bytes: &[u8]) -> std::io::Result<bool> {
    loop {
        match rustix::net::send(sock, bytes, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
}

fn flush_backlog(ch: &mut Channel) -> std::io::Result<()> {
    while let Some(b) = ch.backlog.front() {
        if !send_dgram(&ch.sock, b)? {
            return Ok(());
        }
        ch.backlog.pop_front();
    }
    Ok(())
}

/// A `SOCK_SEQPACKET` pair: (service end, client end).
fn seqpacket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    ctrl::seqpacket_pair()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmrxe_wire::MacAddr;

    const A: [u8; 4] = [198, 18, 0, 1];
    const B: [u8; 4] = [198, 18, 0, 2];

    fn port(i: u32, ip: [u8; 4]) -> CmPort {
        let ip = IpAddr::V4(Ipv4Addr::from(ip));
        CmPort { device: i, guid: 0x0200_00ff_fe00_0001 + u64::from(i), gids: vec![[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, i as u8], Gid::from_ip(ip).0], nets: vec![(ip, 24)], active_mtu: 5, lcore: 0 }
    }

    fn v4(ip: [u8; 4], port: u16) -> CmSockAddr {
        sock_addr(IpAddr::V4(Ipv4Addr::from(ip)), port)
    }

    /// Carry every MAD as a real RoCEv2 frame to the port that owns its destination.
    fn wire(c: &mut CmCore) -> usize {
        let mut n = 0;
        loop {
            let t = c.take_transmits();
            if t.is_empty() {
                return n;
            }
            for (_, t) in t {
                let f = pmrxe_cm::gsi::build_mad_frame(&t.path, MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]), Psn::new(1), &t.mad).unwrap();
                let dst = t.path.dgid.to_ip();
                let dev = c.ports.iter().find(|p| p.cfg.owns(dst)).map(|p| p.cfg.device).expect("destination port");
                let now = c.now();
                c.on_frame(now, dev, &f);
                n += 1;
            }
        }
    }

    fn req(c: &mut CmCore, client: u32, r: Request) -> Response {
        let now = c.now();
        c.request(now, client, r).0
    }

    fn channel(c: &mut CmCore, client: u32) -> (u32, OwnedFd) {
        let now = c.now();
        match c.request(now, client, Request::CmOpenChannel) {
            (Response::CmChannel { channel }, Some(fd)) => (channel, fd),
            r => panic!("{r:?}"),
        }
    }

    fn id(c: &mut CmCore, client: u32, ch: u32, ps: u16, qpt: u32, ctx: u64) -> u32 {
        match req(c, client, Request::CmCreateId { channel: ch, ps, qp_type: qpt, context: ctx }) {
            Response::CmId { id } => id,
            r => panic!("{r:?}"),
        }
    }

    /// An RC listener of client 1 (event channel `ch`) on A:`port`.
    fn rc_listener(c: &mut CmCore, ch: u32, port: u16, backlog: u32) -> u32 {
        let l = id(c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 0x11);
        assert!(matches!(req(c, 1, Request::CmBindAddr { id: l, addr: v4(A, port) }), Response::CmAddr { .. }));
        assert_eq!(req(c, 1, Request::CmListen { id: l, backlog }), Response::Ok);
        l
    }

    /// Client 2 (event channel `ch`) resolves A:`port` and connects QP `qpn` to it; the MADs
    /// are carried. Returns the active id.
    fn rc_connect(c: &mut CmCore, ch: u32, port: u16, qpn: u32) -> u32 {
        let a = id(c, 2, ch, PortSpace::TCP.0, IBV_QPT_RC, 0x22);
        assert!(matches!(req(c, 2, Request::CmResolveAddr { id: a, src: None, dst: v4(A, port), timeout_ms: 2000 }), Response::CmAddr { .. }));
        assert_eq!(req(c, 2, Request::CmResolveRoute { id: a, timeout_ms: 2000 }), Response::Ok);
        let conn = CmConnParam { responder_resources: 1, initiator_depth: 1, retry_count: 7, rnr_retry_count: 7, ..Default::default() };
        assert_eq!(req(c, 2, Request::CmConnect { id: a, qpn, conn }), Response::Ok);
        wire(c);
        a
    }

    fn events(fd: &OwnedFd) -> Vec<CmEventMsg> {
        let mut v = Vec::new();
        let mut buf = vec![0u8; 4096];
        loop {
            match rustix::net::recv(fd, &mut buf[..], RecvFlags::DONTWAIT) {
                Ok((n, _)) if n > 0 => v.push(ctrl::decode::<CmEventMsg>(&buf[..n]).unwrap()),
                _ => return v,
            }
        }
    }

    fn kinds(v: &[CmEventMsg]) -> Vec<u32> {
        v.iter().map(|e| e.event).collect()
    }

    /// `rdma_listen`'s backlog counts CONNECT_REQUESTs the client has not read (kernel ucma),
    /// not requests waiting for `rdma_accept`: a slow acceptor that reads its events promptly
    /// is never refused, one that does not read them is refused with REJ 28.
    #[test]
    fn listen_backlog_counts_unread_connect_requests() {
        let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
        let (sch, sfd) = channel(&mut c, 1);
        let (cch, cfd) = channel(&mut c, 2);
        rc_listener(&mut c, sch, 7472, 2);
        let connect = |c: &mut CmCore, qpn: u32| rc_connect(c, cch, 7472, qpn);
        let ack = |id: u32| {
            let b = ctrl::encode(&ctrl::CmEventAck { id }).unwrap();
            assert_eq!(rustix::net::send(&sfd, &b, SendFlags::empty()).unwrap(), b.len());
        };
        // Two requests fill the backlog while their events sit unread in the socket.
        connect(&mut c, 0x101);
        connect(&mut c, 0x102);
        let _ = events(&cfd);
        connect(&mut c, 0x103);
        let ev = events(&cfd);
        assert_eq!(kinds(&ev), [event::ADDR_RESOLVED, event::ROUTE_RESOLVED, event::REJECTED]);
        assert_eq!(ev[2].status, 28, "backlog overflow is REJ 28 (consumer defined), as the kernel's");
        assert_eq!(c.stats.rej_backlog, 1);
        // The client reads both requests (its shim acknowledges each one); it has accepted
        // neither, yet new requests are taken again.
        let reqs = events(&sfd);
        assert_eq!(kinds(&reqs), [event::CONNECT_REQUEST, event::CONNECT_REQUEST]);
        ack(reqs[0].id);
        ack(reqs[1].id);
        connect(&mut c, 0x104);
        connect(&mut c, 0x105);
        let more = events(&sfd);
        assert_eq!(kinds(&more), [event::CONNECT_REQUEST, event::CONNECT_REQUEST]);
        assert_eq!(c.stats.rej_backlog, 1);
        connect(&mut c, 0x106);
        let ev = events(&cfd);
        assert_eq!(ev.last().map(|e| (e.event, e.status)), Some((event::REJECTED, 28)));
        // Naming a child in a request counts as reading it too (a client whose ack was lost).
        assert!(matches!(req(&mut c, 1, Request::CmInitQpAttr { id: more[0].id, qp_state: 2 }), Response::CmQpAttr { .. }));
        connect(&mut c, 0x107);
        assert_eq!(kinds(&events(&sfd)), [event::CONNECT_REQUEST]);
        assert_eq!(c.stats.rej_backlog, 2);
        c.client_gone(c.now(), 1);
        c.client_gone(c.now(), 2);
        wire(&mut c);
        assert_eq!(c.id_count(), 0);
    }

    #[test]
    fn request_to_a_listener_whose_client_has_no_ids_left_is_rej_no_resources() {
        let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
        let (sch, _sfd) = channel(&mut c, 1);
        let (cch, cfd) = channel(&mut c, 2);
        rc_listener(&mut c, sch, 7473, 0);
        // The listening client holds every id it may: a child id cannot be made for it.
        for k in 1..MAX_IDS_PER_CLIENT {
            id(&mut c, 1, sch, PortSpace::TCP.0, IBV_QPT_RC, k as u64);
        }
        rc_connect(&mut c, cch, 7473, 0x101);
        let ev = events(&cfd);
        assert_eq!(ev.last().map(|e| (e.event, e.status)), Some((event::REJECTED, 3)), "REJ 3: no resources");
        assert_eq!((c.stats.rej_resources, c.stats.rej_backlog), (1, 0));
        c.client_gone(c.now(), 1);
        c.client_gone(c.now(), 2);
        wire(&mut c);
        assert_eq!(c.id_count(), 0);
    }

    #[test]
    fn rc_connect_accept_establish_disconnect() {
        let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
        let (sch, sfd) = channel(&mut c, 1);
        let (cch, cfd) = channel(&mut c, 2);
        let l = id(&mut c, 1, sch, PortSpace::TCP.0, IBV_QPT_RC, 0x11);
        assert!(matches!(req(&mut c, 1, Request::CmBindAddr { id: l, addr: v4(A, 7471) }), Response::CmAddr { device: Some(0), .. }));
        assert_eq!(req(&mut c, 1, Request::CmListen { id: l, backlog: 8 }), Response::Ok);
        // Another client cannot name the listener, nor take its port.
        assert!(matches!(req(&mut c, 2, Request::CmListen { id: l, backlog: 8 }), Response::Err { errno: libc::EINVAL, .. }));
        let a = id(&mut c, 2, cch, PortSpace::TCP.0, IBV_QPT_RC, 0x22);
        match req(&mut c, 2, Request::CmResolveAddr { id: a, src: None, dst: v4(A, 7471), timeout_ms: 2000 }) {
            Response::CmAddr { addr, device: Some(0) } => assert_eq!(sock_ip(&addr), IpAddr::V4(Ipv4Addr::from(A))),
            r => panic!("{r:?}"),
        }
        assert_eq!(req(&mut c, 2, Request::CmResolveRoute { id: a, timeout_ms: 2000 }), Response::Ok);
        assert_eq!(kinds(&events(&cfd)), [event::ADDR_RESOLVED, event::ROUTE_RESOLVED]);
        // RTR before the REP: no parameters yet.
        assert!(matches!(req(&mut c, 2, Request::CmInitQpAttr { id: a, qp_state: 2 }), Response::Err { .. }));
        let conn = CmConnParam { private_data: b"hello".to_vec(), responder_resources: 4, initiator_depth: 2, retry_count: 7, rnr_retry_count: 7, ..Default::default() };
        assert_eq!(req(&mut c, 2, Request::CmConnect { id: a, qpn: 0x123, conn }), Response::Ok);
        wire(&mut c);
        let ev = events(&sfd);
        assert_eq!(kinds(&ev), [event::CONNECT_REQUEST]);
        let cr = &ev[0];
        assert_eq!((cr.listen_id, cr.context), (Some(l), 0x11));
        assert_eq!(&cr.conn.private_data[..5], b"hello");
        assert_eq!(cr.conn.private_data.len(), cma::REQ_USER_DATA_LEN);
        assert_eq!((cr.conn.responder_resources, cr.conn.initiator_depth, cr.conn.qp_num), (2, 4, 0x123));
        assert_eq!(cr.dst.port, c.ids[&a].src.port);
        assert_eq!(sock_ip(&cr.dst), IpAddr::V4(Ipv4Addr::from(A)));
        let p = cr.id;
        // Passive QP attributes before the accept (librdmacm moves the QP first).
        match req(&mut c, 1, Request::CmInitQpAttr { id: p, qp_state: 2 }) {
            Response::CmQpAttr { attr, mask } => {
                assert_eq!(attr.dest_qp_num, 0x123);
                assert_eq!(attr.max_dest_rd_atomic, 2);
                assert_eq!(attr.path_mtu, 5);
                assert!(attr.ah_attr.is_global);
                assert_eq!(attr.ah_attr.dgid, Gid::from_ip(IpAddr::V4(Ipv4Addr::from(A))).0);
                assert_eq!(attr.ah_attr.sgid_index, 1);
                assert_eq!(mask, mask::STATE | mask::AV | mask::PATH_MTU | mask::DEST_QPN | mask::RQ_PSN | mask::MAX_DEST_RD_ATOMIC | mask::MIN_RNR_TIMER);
            }
            r => panic!("{r:?}"),
        }
        let rts_psn = match req(&mut c, 1, Request::CmInitQpAttr { id: p, qp_state: 3 }) {
            Response::CmQpAttr { attr, mask } => {
                assert_eq!(mask, mask::STATE | mask::SQ_PSN | mask::TIMEOUT | mask::RETRY_CNT | mask::RNR_RETRY | mask::MAX_QP_RD_ATOMIC);
                assert_eq!(attr.max_rd_atomic, 4);
                attr.sq_psn
            }
            r => panic!("{r:?}"),
        };
        let acc = CmConnParam { private_data: b"welcome".to_vec(), responder_resources: 2, initiator_depth: 4, rnr_retry_count: 6, ..Default::default() };
        assert_eq!(req(&mut c, 1, Request::CmAccept { id: p, qpn: 0x456, conn: acc }), Response::Ok);
        wire(&mut c);
        let ev = events(&cfd);
        assert_eq!(kinds(&ev), [ctrl::CM_EVENT_CONNECT_RESPONSE]);
        assert_eq!(ev[0].conn.qp_num, 0x456);
        assert_eq!(&ev[0].conn.private_data[..7], b"welcome");
        match req(&mut c, 2, Request::CmInitQpAttr { id: a, qp_state: 2 }) {
            Response::CmQpAttr { attr, .. } => {
                assert_eq!((attr.dest_qp_num, attr.rq_psn), (0x456, rts_psn));
                assert_eq!(attr.ah_attr.dgid, Gid::from_ip(IpAddr::V4(Ipv4Addr::from(A))).0);
            }
            r => panic!("{r:?}"),
        }
        match req(&mut c, 2, Request::CmInitQpAttr { id: a, qp_state: 3 }) {
            Response::CmQpAttr { attr, .. } => assert_eq!(attr.rnr_retry, 6),
            r => panic!("{r:?}"),
        }
        assert_eq!(req(&mut c, 2, Request::CmEstablish { id: a }), Response::Ok);
        wire(&mut c);
        assert_eq!(kinds(&events(&sfd)), [event::ESTABLISHED]);
        assert!(events(&cfd).is_empty(), "the active client reports ESTABLISHED itself");
        assert_eq!(req(&mut c, 2, Request::CmDisconnect { id: a }), Response::Ok);
        wire(&mut c);
        assert_eq!(kinds(&events(&sfd)), [event::DISCONNECTED]);
        assert_eq!(kinds(&events(&cfd)), [event::DISCONNECTED]);
        assert_eq!(req(&mut c, 1, Request::CmDisconnect { id: p }), Response::Ok, "already disconnected: fine");
        assert_eq!(req(&mut c, 2, Request::CmDestroyId { id: a }), Response::Ok);
        c.client_gone(c.now(), 1);
        c.client_gone(c.now(), 2);
        assert_eq!((c.id_count(), c.channel_count()), (0, 0));
    }

    #[test]
    fn loopback_addresses_select_the_first_device_and_its_gid() {
        let lo4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let lo6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        let ga = Gid::from_ip(IpAddr::V4(Ipv4Addr::from(A)));
        for ip in [lo4, IpAddr::V4(Ipv4Addr::new(127, 1, 2, 3)), lo6, IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped())] {
            assert!(is_loopback(ip), "{ip}");
        }
        for ip in [IpAddr::V4(Ipv4Addr::from(A)), IpAddr::V4(Ipv4Addr::UNSPECIFIED), IpAddr::V6(Ipv6Addr::UNSPECIFIED), "fe80::1".parse().unwrap()] {
            assert!(!is_loopback(ip), "{ip}");
        }
        let p0 = port(0, A);
        // On the wire a loopback address is the device's address of the same family...
        assert_eq!(p0.wire_gid(lo4), ga);
        assert_eq!(p0.sgid_index(p0.wire_gid(lo4)), 1);
        // ...or GID index 0 when the device has none of that family; other addresses are their own.
        assert_eq!(p0.wire_gid(lo6).0, p0.gids[0]);
        assert_eq!(p0.wire_gid(IpAddr::V4(Ipv4Addr::from(B))), Gid::from_ip(IpAddr::V4(Ipv4Addr::from(B))));
        assert_eq!(loopback_src(IpAddr::V4(Ipv4Addr::new(127, 9, 9, 9))), lo4);
        assert_eq!(loopback_src(lo6), lo6);

        let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
        let (ch, _fd) = channel(&mut c, 1);
        // Bind: 127.0.0.0/8 and ::1 attach to device 0 and keep their address; others still fail.
        for (ip, p) in [(lo4, 7000), (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), 7001), (lo6, 7002)] {
            let i = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 0);
            match req(&mut c, 1, Request::CmBindAddr { id: i, addr: sock_addr(ip, p) }) {
                Response::CmAddr { addr, device: Some(0) } => assert_eq!((sock_ip(&addr), addr.port), (ip, p)),
                r => panic!("{ip}: {r:?}"),
            }
        }
        let i = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 0);
        assert!(matches!(req(&mut c, 1, Request::CmBindAddr { id: i, addr: v4([10, 9, 9, 9], 7003) }), Response::Err { errno: libc::EADDRNOTAVAIL, .. }));
        // The loopback bind takes the port on device 0 (as a bind to A would), not on device 1.
        let i = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 0);
        assert!(matches!(req(&mut c, 1, Request::CmBindAddr { id: i, addr: v4(A, 7000) }), Response::Err { errno: libc::EADDRINUSE, .. }));
        assert!(matches!(req(&mut c, 1, Request::CmBindAddr { id: i, addr: v4(B, 7000) }), Response::CmAddr { device: Some(1), .. }));
        // Resolve with no source: device 0, source 127.0.0.1 (::1), destination kept.
        for (dst, src) in [(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 5)), lo4), (lo6, lo6)] {
            let i = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 0);
            match req(&mut c, 1, Request::CmResolveAddr { id: i, src: None, dst: sock_addr(dst, 7471), timeout_ms: 2000 }) {
                Response::CmAddr { addr, device: Some(0) } => assert_eq!(sock_ip(&addr), src),
                r => panic!("{dst}: {r:?}"),
            }
            assert_eq!(sock_ip(&c.ids[&i].dst), dst);
        }
        // A source bound to device 1's address keeps device 1: the loopback peer is that device.
        let i = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 0);
        assert!(matches!(req(&mut c, 1, Request::CmResolveAddr { id: i, src: Some(v4(B, 0)), dst: sock_addr(lo4, 7471), timeout_ms: 2000 }), Response::CmAddr { device: Some(1), .. }));
        assert_eq!(c.route(&c.ids[&i], 1).dgid, Gid::from_ip(IpAddr::V4(Ipv4Addr::from(B))));
    }

    #[test]
    fn rc_connect_over_loopback_uses_the_device_gid_and_keeps_127_0_0_1() {
        let lo = [127, 0, 0, 1];
        let ga = Gid::from_ip(IpAddr::V4(Ipv4Addr::from(A)));
        let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
        let (sch, sfd) = channel(&mut c, 1);
        let (cch, cfd) = channel(&mut c, 2);
        // libfabric's verbs server: bind localhost, listen.
        let l = id(&mut c, 1, sch, PortSpace::TCP.0, IBV_QPT_RC, 0x11);
        assert!(matches!(req(&mut c, 1, Request::CmBindAddr { id: l, addr: v4(lo, 7471) }), Response::CmAddr { device: Some(0), .. }));
        assert_eq!(req(&mut c, 1, Request::CmListen { id: l, backlog: 8 }), Response::Ok);
        let a = id(&mut c, 2, cch, PortSpace::TCP.0, IBV_QPT_RC, 0x22);
        assert!(matches!(req(&mut c, 2, Request::CmResolveAddr { id: a, src: None, dst: v4(lo, 7471), timeout_ms: 2000 }), Response::CmAddr { device: Some(0), .. }));
        assert_eq!(req(&mut c, 2, Request::CmResolveRoute { id: a, timeout_ms: 2000 }), Response::Ok);
        assert_eq!(kinds(&events(&cfd)), [event::ADDR_RESOLVED, event::ROUTE_RESOLVED]);
        let conn = CmConnParam { responder_resources: 1, initiator_depth: 1, retry_count: 7, rnr_retry_count: 7, ..Default::default() };
        assert_eq!(req(&mut c, 2, Request::CmConnect { id: a, qpn: 0x123, conn }), Response::Ok);
        // The REQ goes from device 0's GID to device 0's GID, never to ::ffff:127.0.0.1.
        let t = c.take_transmits();
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].1.path.sgid, t[0].1.path.dgid), (ga, ga));
        let f = pmrxe_cm::gsi::build_mad_frame(&t[0].1.path, MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]), Psn::new(1), &t[0].1.mad).unwrap();
        let now = c.now();
        c.on_frame(now, 0, &f);
        // The CMA header carried 127.0.0.1 both ways: the child's addresses are loopback.
        let ev = events(&sfd);
        assert_eq!(kinds(&ev), [event::CONNECT_REQUEST]);
        let cr = &ev[0];
        assert_eq!(cr.listen_id, Some(l));
        assert_eq!((sock_ip(&cr.src), sock_ip(&cr.dst)), (IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!((cr.src.port, cr.dst.port), (7471, c.ids[&a].src.port));
        // Both QPs' address vectors name device 0's GID (index 1 of its table).
        match req(&mut c, 1, Request::CmInitQpAttr { id: cr.id, qp_state: 2 }) {
            Response::CmQpAttr { attr, .. } => assert_eq!((attr.ah_attr.dgid, attr.ah_attr.sgid_index), (ga.0, 1)),
            r => panic!("{r:?}"),
        }
        let acc = CmConnParam { responder_resources: 1, initiator_depth: 1, rnr_retry_count: 7, ..Default::default() };
        assert_eq!(req(&mut c, 1, Request::CmAccept { id: cr.id, qpn: 0x456, conn: acc }), Response::Ok);
        wire(&mut c);
        assert_eq!(kinds(&events(&cfd)), [ctrl::CM_EVENT_CONNECT_RESPONSE]);
        match req(&mut c, 2, Request::CmInitQpAttr { id: a, qp_state: 2 }) {
            Response::CmQpAttr { attr, .. } => assert_eq!((attr.dest_qp_num, attr.ah_attr.dgid, attr.ah_attr.sgid_index), (0x456, ga.0, 1)),
            r => panic!("{r:?}"),
        }
        assert_eq!(req(&mut c, 2, Request::CmEstablish { id: a }), Response::Ok);
        wire(&mut c);
        assert_eq!(kinds(&events(&sfd)), [event::ESTABLISHED]);
        c.client_gone(c.now(), 1);
        c.client_gone(c.now(), 2);
        wire(&mut c);
        assert_eq!((c.id_count(), c.channel_count()), (0, 0));
    }

    #[test]
    fn no_listener_is_rejected_and_reject_carries_private_data() {
        let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
        let (ch, fd) = channel(&mut c, 1);
        let a = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 1);
        req(&mut c, 1, Request::CmResolveAddr { id: a, src: Some(v4(B, 0)), dst: v4(A, 9999), timeout_ms: 100 });
        req(&mut c, 1, Request::CmResolveRoute { id: a, timeout_ms: 100 });
        assert_eq!(req(&mut c, 1, Request::CmConnect { id: a, qpn: 5, conn: CmConnParam::default() }), Response::Ok);
        wire(&mut c);
        let ev = events(&fd);
        assert_eq!(kinds(&ev), [event::ADDR_RESOLVED, event::ROUTE_RESOLVED, event::REJECTED]);
        assert_eq!(ev[2].status, 8);
        assert_eq!(ev[0].device, Some(1), "source 198.18.0.2 is pmrxe1");

        // A listener that rejects with private data.
        let l = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 2);
        req(&mut c, 1, Request::CmBindAddr { id: l, addr: CmSockAddr::default() });
        let lport = c.ids[&l].src.port;
        assert_eq!(req(&mut c, 1, Request::CmListen { id: l, backlog: 0 }), Response::Ok);
        let b = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 3);
        req(&mut c, 1, Request::CmResolveAddr { id: b, src: None, dst: v4(B, lport), timeout_ms: 100 });
        req(&mut c, 1, Request::CmResolveRoute { id: b, timeout_ms: 100 });
        req(&mut c, 1, Request::CmConnect { id: b, qpn: 6, conn: CmConnParam::default() });
        wire(&mut c);
        let ev = events(&fd);
        let cr = ev.iter().find(|e| e.event == event::CONNECT_REQUEST).expect("request on the wildcard listener");
        assert_eq!(cr.device, Some(1));
        assert_eq!(req(&mut c, 1, Request::CmReject { id: cr.id, private_data: b"go away".to_vec() }), Response::Ok);
        wire(&mut c);
        let ev = events(&fd);
        assert_eq!(kinds(&ev), [event::REJECTED]);
        assert_eq!(ev[0].status, 28);
        assert_eq!(&ev[0].conn.private_data[..7], b"go away");
    }

    #[test]
    fn ud_sidr_resolves_to_established_with_qpn_and_qkey() {
        let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
        let (ch, fd) = channel(&mut c, 1);
        let l = id(&mut c, 1, ch, PortSpace::UDP.0, IBV_QPT_UD, 7);
        req(&mut c, 1, Request::CmBindAddr { id: l, addr: v4(A, 7174) });
        req(&mut c, 1, Request::CmListen { id: l, backlog: 4 });
        let a = id(&mut c, 1, ch, PortSpace::UDP.0, IBV_QPT_UD, 8);
        req(&mut c, 1, Request::CmResolveAddr { id: a, src: Some(v4(B, 0)), dst: v4(A, 7174), timeout_ms: 100 });
        match req(&mut c, 1, Request::CmInitQpAttr { id: a, qp_state: 1 }) {
            Response::CmQpAttr { attr, mask } => {
                assert_eq!(attr.qkey, cma::UDP_QKEY);
                assert_eq!(mask, mask::STATE | mask::PKEY_INDEX | mask::PORT | mask::QKEY);
            }
            r => panic!("{r:?}"),
        }
        req(&mut c, 1, Request::CmResolveRoute { id: a, timeout_ms: 100 });
        req(&mut c, 1, Request::CmConnect { id: a, qpn: 0x77, conn: CmConnParam { private_data: b"ud?".to_vec(), ..Default::default() } });
        wire(&mut c);
        let ev = events(&fd);
        let cr = ev.iter().find(|e| e.event == event::CONNECT_REQUEST).expect("SIDR_REQ → CONNECT_REQUEST");
        assert_eq!(&cr.ud.as_ref().unwrap().private_data[..3], b"ud?");
        assert_eq!(req(&mut c, 1, Request::CmAccept { id: cr.id, qpn: 0x99, conn: CmConnParam::default() }), Response::Ok);
        wire(&mut c);
        let ev = events(&fd);
        assert_eq!(kinds(&ev), [event::ESTABLISHED]);
        let ud = ev[0].ud.as_ref().unwrap();
        assert_eq!((ud.qp_num, ud.qkey), (0x99, cma::UDP_QKEY));
        assert_eq!(ud.ah_attr.dgid, Gid::from_ip(IpAddr::V4(Ipv4Addr::from(A))).0);
        assert!(ud.ah_attr.is_global);
    }

    #[test]
    fn closed_channel_is_dropped_and_client_death_sends_dreq() {
        let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
        let (sch, sfd) = channel(&mut c, 1);
        let (cch, cfd) = channel(&mut c, 2);
        let l = id(&mut c, 1, sch, PortSpace::TCP.0, IBV_QPT_RC, 1);
        req(&mut c, 1, Request::CmBindAddr { id: l, addr: v4(A, 5000) });
        req(&mut c, 1, Request::CmListen { id: l, backlog: 4 });
        let a = id(&mut c, 2, cch, PortSpace::TCP.0, IBV_QPT_RC, 2);
        req(&mut c, 2, Request::CmResolveAddr { id: a, src: None, dst: v4(A, 5000), timeout_ms: 100 });
        req(&mut c, 2, Request::CmResolveRoute { id: a, timeout_ms: 100 });
        req(&mut c, 2, Request::CmConnect { id: a, qpn: 1, conn: CmConnParam::default() });
        wire(&mut c);
        let p = events(&sfd).iter().find(|e| e.event == event::CONNECT_REQUEST).unwrap().id;
        req(&mut c, 1, Request::CmAccept { id: p, qpn: 2, conn: CmConnParam::default() });
        wire(&mut c);
        req(&mut c, 2, Request::CmEstablish { id: a });
        wire(&mut c);
        assert_eq!(kinds(&events(&sfd)), [event::ESTABLISHED]);
        // The active client dies: its id is destroyed (DREQ), the passive side hears it.
        drop(cfd);
        c.housekeeping();
        assert_eq!(c.channel_count(), 1);
        c.client_gone(c.now(), 2);
        wire(&mut c);
        assert_eq!(kinds(&events(&sfd)), [event::DISCONNECTED]);
        assert_eq!(c.id_count(), 2);
    }
}
