//! One client session: a thread per connected client that owns the client's objects and
//! turns control requests into memory-table calls and lcore commands.
//!
//! Isolation: every handle a request names is looked up in *this* client's tables, so a
//! client can never name another client's PD, CQ, QP, MR or segment; PD handles are unique
//! across the service, so keys registered by one client fail the PD check on another's QPs.
//! Segments are per client (separate memfds). On disconnect — orderly or SIGKILL — every
//! object is destroyed: QPs leave their lcore, MRs/MWs are deregistered, segments unmapped.
//!
//! `request` dispatches each request to a handler in the module of the object it names:
//! `client` (Hello, capture, rdma_cm), `pd`, `cq` (and completion channels), `segment`, `mr`, `mw`,
//! `qp`, `srq`, `ah`; `attr` converts ibv attribute values to the engine's and back.
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam::channel::Receiver;
use pmrxe_abi::ctrl::{self, AsyncEvent, QpCap, Request, Response};
use pmrxe_abi::DOORBELL_SLOTS;
use pmrxe_mem::{Key, MemTable, Region};
use pmrxe_runtime::lcore::{Cmd, LcoreHandle};
use pmrxe_runtime::shm::{EventFd, MapPiece, Segment};

use crate::access::{Access, Peer, Viewer};
use crate::stats::StatsSource;

/// What every session shares.
pub struct Shared {
    /// Devices, by index.
    pub devices: Vec<ctrl::DeviceInfo>,
    /// Which lcore serves each device.
    pub device_lcore: Vec<usize>,
    /// The lcores.
    pub lcores: Vec<LcoreHandle>,
    /// MR/MW table.
    pub mem: Arc<MemTable>,
    /// Handle allocators (unique across clients).
    pub next_handle: AtomicU32,
    /// QPN allocator.
    pub next_qpn: AtomicU32,
    /// Round-robin counter placing clients on lcores.
    pub next_home: AtomicU32,
    /// Connected clients, by id.
    pub clients: Mutex<HashMap<u32, crate::stats::ClientInfo>>,
    /// Statistics provider.
    pub stats: Arc<dyn StatsSource>,
    /// Capture control.
    pub capture: Arc<crate::stats::Capture>,
    /// The connection manager (rdma_cm), if the service runs one.
    pub cm: Option<crate::cm::CmHandle>,
    /// Device limits, per-client caps and the fd budget ([`crate::limits`]).
    pub limits: Arc<crate::limits::Budget>,
    /// Who may connect ([`crate::access`]).
    pub access: Access,
    /// Peers refused admission (counted, logged at debug level only: a refused user can
    /// connect in a loop).
    pub refused: std::sync::atomic::AtomicU64,
    /// Multicast groups and the QPs attached to them ([`crate::mcast`]).
    pub mcast: Mutex<crate::mcast::McastTable>,
}

impl Shared {
    fn handle(&self) -> u32 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// The lcore that owns a client's objects on `device`: with one lcore per device set the
    /// device's lcore; with several lcores sharing every port, the client's lcore (clients are
    /// spread round-robin, and all of a client's QPs/CQs/SRQs stay together so a CQ has one
    /// producer).
    fn lcore_for(&self, home: usize, device: u32) -> usize {
        if self.lcores.len() > 1 {
            home % self.lcores.len()
        } else {
            self.device_lcore[device as usize]
        }
    }

    /// A fresh QPN owned by lcore `lc` (`qpn % lcores == lc`, what the hand-off routes by).
    fn qpn_for(&self, lc: usize) -> u32 {
        let n = self.lcores.len().max(1) as u32;
        loop {
            let seq = self.next_qpn.fetch_add(1, Ordering::Relaxed);
            // 24-bit QPNs; 0 and 1 (SMI, GSI) are never handed out. Wrapping keeps
            // `qpn % n == lc` because the top is cut to a multiple of n.
            let top = (0x100_0000 / n) * n;
            let qpn = (seq.wrapping_mul(n) % top) + lc as u32;
            if qpn > 1 {
                return qpn;
            }
        }
    }
}

struct SegRec {
    fd: OwnedFd,
    base: u64,
    len: u64,
    /// File offset mapped at `base` (0 for the shim's memfds).
    offset: u64,
    /// The file's page size (4096, or the huge page size of a hugetlbfs file).
    page: u64,
    region: Option<Region>,
}

impl SegRec {
    fn piece(&self, seg_offset: u64, len: u64) -> MapPiece<'_> {
        MapPiece { fd: &self.fd, offset: self.offset + seg_offset, len, page: self.page }
    }
}

struct SrqRec {
    lcore: usize,
    db_slot: u16,
}

struct QpRec {
    lcore: usize,
    device: u32,
    /// A UD QP (the only type that joins multicast groups).
    ud: bool,
    init_cap: QpCap,
    db_slot: u16,
}

#[derive(Default)]
struct Objects {
    pds: HashMap<u32, u32>,        // pd → device
    channels: HashMap<u32, Arc<EventFd>>,
    cqs: HashMap<u32, usize>,      // cq → lcore
    qps: HashMap<u32, QpRec>,
    mrs: HashMap<u32, u32>,        // key → pd
    mws: HashMap<u32, u32>,        // key → pd
    ahs: HashMap<u32, usize>,      // ah → lcore
    srqs: HashMap<u32, SrqRec>,
    segs: HashMap<u64, SegRec>,
    db_used: Vec<bool>,
    /// What this client holds against the limits (given back when dropped).
    usage: crate::limits::Usage,
}

/// Serve one client until it disconnects.
pub fn run(shared: Arc<Shared>, sock: UnixStream) {
    let peer = match Peer::of(&sock) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!("control socket peer credentials: {e}");
            return;
        }
    };
    if let Err(why) = shared.access.admit(&peer) {
        refuse(&shared, &sock, peer.uid, &why);
        return;
    }
    let pid = peer.pid;
    let viewer = if shared.access.is_admin(peer.uid) { Viewer::Admin } else { Viewer::User(peer.uid) };
    let mut s = Session {
        shared,
        fd: sock.as_raw_fd(),
        id: 0,
        home: 0,
        uid: peer.uid,
        viewer,
        net_raw: peer.net_raw(),
        events: None,
        events_fd: None,
        hold: None,
        objs: Objects { db_used: vec![false; DOORBELL_SLOTS], ..Default::default() },
    };
    let mut buf = Vec::new();
    loop {
        let fds = match ctrl::recv_msg(s.fd, &mut buf) {
            Ok(Some(fds)) => fds,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(client = s.id, "control socket: {e}");
                break;
            }
        };
        let (resp, out_fds): (Response, Vec<RawFd>) = match ctrl::decode::<Request>(&buf) {
            Ok(req) => {
                if s.id == 0 && !matches!(req, Request::Hello { .. } | Request::Stats { .. } | Request::Capture { .. }) {
                    (err(libc::EPROTO, "first message must be Hello"), vec![])
                } else {
                    s.request(req, fds, pid)
                }
            }
            Err(e) => (err(libc::EPROTO, &format!("malformed request: {e}")), vec![]),
        };
        let bytes = match ctrl::encode(&resp) {
            Ok(b) => b,
            Err(_) => break,
        };
        let sent = ctrl::send_msg(s.fd, &bytes, &out_fds);
        s.hold = None; // an fd created for this reply (the rdma_cm event socket) is the client's now
        if sent.is_err() {
            break;
        }
        if matches!(resp, Response::Stats(_)) && s.id == 0 {
            continue;
        }
    }
    s.cleanup();
    drop(sock);
}

/// Answer a refused peer's first message with EACCES and why (so the shim prints the reason,
/// not a reset connection), then close. The wait for that message is bounded: a peer that
/// never speaks costs this thread at most a few seconds.
fn refuse(shared: &Shared, sock: &UnixStream, uid: u32, why: &str) {
    shared.refused.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(uid, "refusing client: {why}");
    let _ = ctrl::set_timeouts(sock, std::time::Duration::from_secs(5));
    let mut buf = Vec::new();
    if let Ok(Some(_fds)) = ctrl::recv_msg(sock.as_raw_fd(), &mut buf) {
        if let Ok(bytes) = ctrl::encode(&err(libc::EACCES, why)) {
            let _ = ctrl::send_msg(sock.as_raw_fd(), &bytes, &[]);
        }
    }
}

fn err(errno: i32, msg: &str) -> Response {
    Response::Err { errno, msg: msg.to_string() }
}

struct Session {
    shared: Arc<Shared>,
    fd: RawFd,
    id: u32,
    /// The client's uid (`SO_PEERCRED` at connect).
    uid: u32,
    /// What `pmrxe stats` and capture show this client.
    viewer: Viewer,
    /// The client holds CAP_NET_RAW (may give a QP a privileged Q_Key).
    net_raw: bool,
    /// The lcore this client's objects live on when lcores share the ports.
    home: usize,
    events: Option<Receiver<AsyncEvent>>,
    /// Signalled by the lcores for every queued async event; the client's `async_fd`.
    events_fd: Option<Arc<EventFd>>,
    /// An fd passed with the reply being sent, closed once it is sent.
    hold: Option<OwnedFd>,
    objs: Objects,
    // segments / objects above; keep the client page alive for the lcores via Arc
}

type Reply = (Response, Vec<RawFd>);

macro_rules! lcore_call {
    ($lc:expr, $variant:ident { $($f:ident : $v:expr),* }) => {{
        // Waits as long as the lcore is alive and making progress; ESHUTDOWN only when the
        // service is really stopping (pmrxe_runtime::call).
        match $lc.call(|tx| Cmd::$variant { $($f: $v,)* done: tx }) {
            Ok(r) => r,
            Err(e) => return (err(e.errno(), &e.to_string()), vec![]),
        }
    }};
}

mod ah;
mod mcast;
mod attr;
mod client;
mod cq;
pub mod fault;
mod mr;
mod mw;
mod pd;
mod qp;
mod segment;
mod srq;
mod usage;

pub use attr::{from_engine_attr, path_mtu, qp_state, qp_type as decode_qp_type, to_engine_attr, BadValue, QpTypeError};

impl Session {
    /// Dispatch one request to the handler of the object it names (one module per object).
    fn request(&mut self, req: Request, fds: Vec<OwnedFd>, pid: i32) -> Reply {
        match req {
            Request::Hello { abi_version, program, .. } => self.hello(abi_version, program, pid),
            // Within one control message, however many QPs and clients there are.
            Request::Stats { json } => (Response::Stats(crate::limits::fit_stats(json, self.shared.stats.render(json, self.viewer))), vec![]),
            Request::Capture { count, qpn } => self.capture(count, qpn, fds),
            Request::AllocPd { device } => self.alloc_pd(device),
            Request::DeallocPd { pd } => self.dealloc_pd(pd),
            Request::CreateCompChannel { .. } => self.create_comp_channel(),
            Request::DestroyCompChannel { channel } => self.destroy_comp_channel(channel),
            Request::CreateCq { device, cqe, channel } => self.create_cq(device, cqe, channel),
            req @ (Request::CmOpenChannel
            | Request::CmCreateId { .. }
            | Request::CmMigrateId { .. }
            | Request::CmBindAddr { .. }
            | Request::CmResolveAddr { .. }
            | Request::CmResolveRoute { .. }
            | Request::CmListen { .. }
            | Request::CmConnect { .. }
            | Request::CmAccept { .. }
            | Request::CmReject { .. }
            | Request::CmEstablish { .. }
            | Request::CmDisconnect { .. }
            | Request::CmInitQpAttr { .. }
            | Request::CmSetOption { .. }
            | Request::CmDestroyId { .. }
            | Request::CmJoinMulticast { .. }
            | Request::CmLeaveMulticast { .. }) => self.cm(req),
            Request::ResizeCq { cq, cqe } => self.resize_cq(cq, cqe),
            Request::DestroyCq { cq } => self.destroy_cq(cq),
            Request::AddSegment { seg, base, len } => self.counted_segment(seg, true, |s| s.add_segment(seg, base, len, fds)),
            Request::AddSharedSegment { seg, base, len, offset } => self.counted_segment(seg, true, |s| s.add_shared_segment(seg, base, len, offset, fds)),
            Request::ReleaseSegment { seg } => self.counted_segment(seg, false, |s| s.release_segment(seg)),
            Request::RegMr { pd, addr, len, iova, access, pieces } => self.reg_mr(pd, addr, len, iova, access, &pieces),
            Request::ReregMr { key, pd, addr, len, iova, access, pieces } => self.rereg_mr(key, pd, addr, len, iova, access, &pieces),
            Request::DeregMr { key } => self.dereg_mr(key),
            Request::AllocMr { pd, max_num_sg } => self.alloc_mr(pd, max_num_sg),
            Request::MapMrSg { key, sg, sg_offset, page_size } => self.map_mr_sg(key, &sg, sg_offset, page_size),
            Request::AllocMw { pd, mw_type } => self.alloc_mw(pd, mw_type),
            Request::DeallocMw { key } => self.dealloc_mw(key),
            Request::CreateQp { device, pd, qp_type, send_cq, recv_cq, srq, cap, sq_sig_all } => {
                self.create_qp(device, pd, qp_type, send_cq, recv_cq, srq, cap, sq_sig_all)
            }
            Request::ModifyQp { qpn, attr, mask } => self.modify_qp(qpn, attr, mask),
            Request::QueryQp { qpn } => self.query_qp(qpn),
            Request::DestroyQp { qpn } => self.destroy_qp(qpn),
            Request::CreateSrq { device, pd, max_wr, max_sge, srq_limit } => self.create_srq(device, pd, max_wr, max_sge, srq_limit),
            Request::ModifySrq { srq, max_wr: _, srq_limit, mask } => self.modify_srq(srq, srq_limit, mask),
            Request::QuerySrq { srq } => self.query_srq(srq),
            Request::DestroySrq { srq } => self.destroy_srq(srq),
            Request::CreateAh { pd, attr } => self.create_ah(pd, attr),
            Request::DestroyAh { ah } => self.destroy_ah(ah),
            Request::AttachMcast { qpn, gid } => self.attach_mcast(qpn, gid),
            Request::DetachMcast { qpn, gid } => self.detach_mcast(qpn, gid),
            Request::GetAsyncEvent => (Response::AsyncEvent(self.events.as_ref().and_then(|r| r.try_recv().ok())), vec![]),
        }
    }

    fn cleanup(&mut self) {
        let sh = self.shared.clone();
        if self.id == 0 {
            return;
        }
        // rdma_cm ids first: their connections end with DREQ/REJ while the QPs still exist.
        if let Some(cm) = &sh.cm {
            cm.client_gone(self.id);
        }
        // Its QPs leave their multicast groups (the other members' lists are republished).
        let qpns: Vec<u32> = self.objs.qps.keys().copied().collect();
        for qpn in qpns {
            self.leave_all_groups(qpn);
        }
        for lc in &sh.lcores {
            match lc.call(|tx| Cmd::RemoveClient { client: self.id, done: tx }) {
                Ok(()) | Err(pmrxe_runtime::call::CallError::Stopping) => {}
                Err(e) => {
                    if let Some(n) = sh.limits.session_warn.hit() {
                        tracing::warn!(client = self.id, suppressed = n, "removing the client's objects from lcore {}: {e}", lc.index);
                    }
                }
            }
        }
        for (&k, _) in self.objs.mws.iter() {
            let _ = sh.mem.dealloc_mw(Key(k));
        }
        for (&k, _) in self.objs.mrs.iter() {
            if let Err(e) = sh.mem.dereg_mr(Key(k)) {
                if let Some(n) = sh.limits.session_warn.hit() {
                    tracing::warn!(client = self.id, key = k, suppressed = n, "dereg on disconnect: {e}");
                }
            }
        }
        sh.clients.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
        // A client can connect and go in a loop: at most one line per second (limits::Budget).
        if let Some(n) = sh.limits.client_gone_log.hit() {
            tracing::info!(client = self.id, qps = self.objs.qps.len(), mrs = self.objs.mrs.len(), suppressed = n, "client gone; its objects are released");
        }
    }
}

/// Segments created for a client are owned by the lcore (through their Arc) from now on; this
/// only documents that the session's clone ends here.
fn drop_after_send(seg: Arc<Segment>) {
    drop(seg);
}
