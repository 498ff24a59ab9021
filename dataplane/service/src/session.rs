//! One client session: a thread per connected client that owns the client's objects and
//! turns control requests into memory-table calls and lcore commands.
//!
//! Isolation: every handle a request names is looked up in *this* client's tables, so a
//! client can never name another client's PD, CQ, QP, MR or segment; PD handles are unique
//! across the service, so keys registered by one client fail the PD check on another's QPs.
//! Segments are per client (separate memfds). On disconnect — orderly or SIGKILL — every
//! object is destroyed: QPs leave their lcore, MRs/MWs are deregistered, segments unmapped.
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam::channel::{bounded, Receiver};
use pmrxe_abi::ctrl::{self, AhAttr, AsyncEvent, QpAttr as AbiQpAttr, QpCap, Request, Response};
use pmrxe_abi::ring::init_ring;
use pmrxe_abi::{
    ClientPage, CqSegmentLayout, Doorbell, QpSegmentLayout, SrqSegmentLayout, ShmCqe, ShmRecvWqe, ShmSendWqe, ABI_VERSION, CLIENT_PAGE_LEN,
    CLIENT_PAGE_MAGIC, DOORBELL_SLOTS,
};
use pmrxe_mem::{Access, Key, MemTable, MwType, Region, SgEntry};
use pmrxe_runtime::lcore::{Cmd, LcoreHandle, QpSetup};
use pmrxe_runtime::shm::{self, EventFd, MapPiece, MrMapping, Segment};
use pmrxe_transport::{AddressVector, AttrMask, PathMtu, Qp, QpAttr, QpCaps, QpState, QpType, Srq, SrqAttr};

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
    /// Connected clients: id → (pid, program).
    pub clients: Mutex<HashMap<u32, (i32, String)>>,
    /// Statistics provider.
    pub stats: Arc<dyn StatsSource>,
    /// Capture control.
    pub capture: Arc<crate::stats::Capture>,
    /// The connection manager (rdma_cm), if the service runs one.
    pub cm: Option<crate::cm::CmHandle>,
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
    /// Not sealed against shrinking: mapped under a SIGBUS guard.
    guard: bool,
    region: Option<Region>,
}

impl SegRec {
    fn piece(&self, seg_offset: u64, len: u64) -> MapPiece<'_> {
        MapPiece { fd: &self.fd, offset: self.offset + seg_offset, len, page: self.page, guard: self.guard }
    }
}

struct SrqRec {
    lcore: usize,
    db_slot: u16,
}

struct QpRec {
    lcore: usize,
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
}

/// Serve one client until it disconnects.
pub fn run(shared: Arc<Shared>, sock: UnixStream) {
    let (pid, uid, _) = ctrl::peer_cred(&sock).unwrap_or((-1, u32::MAX, u32::MAX));
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    if uid != me && uid != 0 {
        tracing::warn!(pid, uid, "refusing client of another user");
        return;
    }
    let mut s = Session { shared, fd: sock.as_raw_fd(), id: 0, home: 0, events: None, events_fd: None, hold: None, objs: Objects { db_used: vec![false; DOORBELL_SLOTS], ..Default::default() } };
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

fn err(errno: i32, msg: &str) -> Response {
    Response::Err { errno, msg: msg.to_string() }
}

struct Session {
    shared: Arc<Shared>,
    fd: RawFd,
    id: u32,
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

impl Session {
    fn request(&mut self, req: Request, fds: Vec<OwnedFd>, pid: i32) -> Reply {
        let sh = self.shared.clone();
        match req {
            Request::Hello { abi_version, program, .. } => {
                if abi_version != ABI_VERSION {
                    return (err(libc::EPROTONOSUPPORT, &format!("ABI version {abi_version}, service speaks {ABI_VERSION}")), vec![]);
                }
                if self.id != 0 {
                    return (err(libc::EALREADY, "already said hello"), vec![]);
                }
                let page = match Segment::create("pmrxe-client", CLIENT_PAGE_LEN as usize) {
                    Ok(p) => Arc::new(p),
                    Err(e) => return (err(libc::ENOMEM, &e.to_string()), vec![]),
                };
                // SAFETY: a fresh zeroed page-sized segment; ClientPage fits (const assert in abi).
                unsafe {
                    let p = page.as_ptr() as *mut ClientPage;
                    core::ptr::addr_of_mut!((*p).magic).write(CLIENT_PAGE_MAGIC);
                    core::ptr::addr_of_mut!((*p).version).write(ABI_VERSION);
                }
                self.id = sh.handle();
                self.home = sh.next_home.fetch_add(1, Ordering::Relaxed) as usize;
                let events_fd = match EventFd::new() {
                    Ok(e) => Arc::new(e),
                    Err(e) => return (err(libc::EMFILE, &e.to_string()), vec![]),
                };
                let (etx, erx) = bounded(256);
                self.events = Some(erx);
                for lc in &sh.lcores {
                    let _ = lc.cmds.send(Cmd::AddClient { client: self.id, page: page.clone(), events: etx.clone(), events_fd: Some(events_fd.clone()) });
                }
                sh.clients.lock().unwrap_or_else(|e| e.into_inner()).insert(self.id, (pid, program));
                let fd = page.fd().as_raw_fd();
                let efd = events_fd.fd().as_raw_fd();
                self.events_fd = Some(events_fd);
                // The lcores hold the page from now on; `page` keeps the fd valid until the reply is sent.
                // Second fd: the async-event eventfd (the shim's `async_fd`).
                let resp = Response::Hello { abi_version: ABI_VERSION, client_id: self.id, devices: sh.devices.clone() };
                (resp, vec![fd, efd])
            }
            Request::Stats { json } => (Response::Stats(sh.stats.render(json)), vec![]),
            Request::Capture { count, qpn } => {
                let Some(fd) = fds.into_iter().next() else { return (err(libc::EINVAL, "capture needs an output fd"), vec![]) };
                match sh.capture.start(fd, count, qpn) {
                    Ok(()) => (Response::Ok, vec![]),
                    Err(e) => (err(libc::EBUSY, &e), vec![]),
                }
            }
            Request::AllocPd { device } => {
                if device as usize >= sh.devices.len() {
                    return (err(libc::ENODEV, "no such device"), vec![]);
                }
                let pd = sh.handle();
                self.objs.pds.insert(pd, device);
                (Response::Pd { pd }, vec![])
            }
            Request::DeallocPd { pd } => {
                let busy = self.objs.mrs.values().chain(self.objs.mws.values()).any(|&p| p == pd);
                if busy {
                    return (err(libc::EBUSY, "PD still has MRs/MWs"), vec![]);
                }
                match self.objs.pds.remove(&pd) {
                    Some(_) => (Response::Ok, vec![]),
                    None => (err(libc::EINVAL, "no such PD"), vec![]),
                }
            }
            Request::CreateCompChannel { .. } => match EventFd::new() {
                Ok(e) => {
                    let ch = sh.handle();
                    let fd = e.fd().as_raw_fd();
                    self.objs.channels.insert(ch, Arc::new(e));
                    (Response::CompChannel { channel: ch }, vec![fd])
                }
                Err(e) => (err(libc::EMFILE, &e.to_string()), vec![]),
            },
            Request::DestroyCompChannel { channel } => match self.objs.channels.remove(&channel) {
                Some(_) => (Response::Ok, vec![]),
                None => (err(libc::EINVAL, "no such channel"), vec![]),
            },
            Request::CreateCq { device, cqe, channel } => self.create_cq(device, cqe, channel),
            // rdma_cm (issue 14): the connection-manager thread (crate::cm) owns ids, channels
            // and QP1; the reply of CmOpenChannel carries the client's end of the event socket.
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
            | Request::CmDestroyId { .. }) => {
                let Some(cm) = &sh.cm else { return (err(libc::EOPNOTSUPP, "rdma_cm is not available in this service"), vec![]) };
                let (resp, fd) = cm.request(self.id, req);
                let fds = fd.as_ref().map(|f| vec![f.as_raw_fd()]).unwrap_or_default();
                self.hold = fd;
                (resp, fds)
            }
            Request::ResizeCq { cq, cqe } => {
                let Some(&lc) = self.objs.cqs.get(&cq) else { return (err(libc::EINVAL, "no such CQ"), vec![]) };
                let r: Result<(), i32> = lcore_call!(sh.lcores[lc], ResizeCq { cq: cq, cqe: cqe });
                match r {
                    Ok(()) => (Response::Ok, vec![]),
                    Err(libc::EOPNOTSUPP) => (err(libc::EOPNOTSUPP, "the CQ's ring is smaller than the new size"), vec![]),
                    Err(e) => (err(e, "more completions waiting than the new size"), vec![]),
                }
            }
            Request::DestroyCq { cq } => {
                let Some(&lc) = self.objs.cqs.get(&cq) else { return (err(libc::EINVAL, "no such CQ"), vec![]) };
                let r: Result<(), i32> = lcore_call!(sh.lcores[lc], RemoveCq { cq: cq });
                match r {
                    Ok(()) => {
                        self.objs.cqs.remove(&cq);
                        (Response::Ok, vec![])
                    }
                    Err(e) => (err(e, "CQ busy or unknown"), vec![]),
                }
            }
            Request::AddSegment { seg, base, len } => {
                let Some(fd) = fds.into_iter().next() else { return (err(libc::EINVAL, "AddSegment needs an fd"), vec![]) };
                if len == 0 || base % 4096 != 0 || len % 4096 != 0 || self.objs.segs.contains_key(&seg) {
                    return (err(libc::EINVAL, "bad segment"), vec![]);
                }
                // SAFETY: fstat into a zeroed buffer on a valid fd.
                let mut st: libc::stat = unsafe { core::mem::zeroed() };
                // SAFETY: valid fd and out pointer.
                if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 || (st.st_size as u64) < len {
                    return (err(libc::EINVAL, "segment fd shorter than declared"), vec![]);
                }
                // A client that shrinks a segment the service maps would make the lcore fault
                // (SIGBUS) and kill the service: the segment must be sealed against shrinking.
                // SAFETY: fcntl on a valid fd.
                let sealed = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } == 0
                    // SAFETY: as above.
                    || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) } & libc::F_SEAL_SHRINK != 0;
                if !sealed {
                    return (err(libc::EPERM, "segment must be a memfd sealable against shrinking (MFD_ALLOW_SEALING)"), vec![]);
                }
                let page = match shm::file_page_size(fd.as_fd()) {
                    Ok(p) => p,
                    Err(e) => return (err(libc::EINVAL, &e.to_string()), vec![]),
                };
                if !base.is_multiple_of(page) || !len.is_multiple_of(page) {
                    return (err(libc::EINVAL, "huge-page segment not aligned to its page size"), vec![]);
                }
                self.objs.segs.insert(seg, SegRec { fd, base, len, offset: 0, page, guard: false, region: None });
                (Response::Ok, vec![])
            }
            Request::AddSharedSegment { seg, base, len, offset } => self.add_shared_segment(seg, base, len, offset, fds),
            Request::ReleaseSegment { seg } => match self.objs.segs.remove(&seg) {
                Some(_) => (Response::Ok, vec![]),
                None => (err(libc::EINVAL, "no such segment"), vec![]),
            },
            Request::RegMr { pd, addr, len, iova, access, pieces } => self.reg_mr(pd, addr, len, iova, access, &pieces),
            Request::ReregMr { key, pd, addr, len, iova, access, pieces } => self.rereg_mr(key, pd, addr, len, iova, access, &pieces),
            Request::DeregMr { key } => {
                if self.objs.mrs.remove(&key).is_none() {
                    return (err(libc::EINVAL, "no such MR"), vec![]);
                }
                match sh.mem.dereg_mr(Key(key)) {
                    Ok(()) => (Response::Ok, vec![]),
                    Err(e) => {
                        self.objs.mrs.insert(key, 0);
                        (err(libc::EBUSY, &e.to_string()), vec![])
                    }
                }
            }
            Request::AllocMr { pd, max_num_sg } => {
                if !self.objs.pds.contains_key(&pd) {
                    return (err(libc::EINVAL, "no such PD"), vec![]);
                }
                match sh.mem.alloc_mr(pd, max_num_sg) {
                    Ok(k) => {
                        self.objs.mrs.insert(k.0, pd);
                        (Response::Mr { key: k.0 }, vec![])
                    }
                    Err(e) => (err(libc::EINVAL, &e.to_string()), vec![]),
                }
            }
            Request::MapMrSg { key, sg, sg_offset, page_size } => self.map_mr_sg(key, &sg, sg_offset, page_size),
            Request::AllocMw { pd, mw_type } => {
                if !self.objs.pds.contains_key(&pd) {
                    return (err(libc::EINVAL, "no such PD"), vec![]);
                }
                let t = match mw_type {
                    1 => MwType::Type1,
                    2 => MwType::Type2,
                    _ => return (err(libc::EINVAL, "MW type must be 1 or 2"), vec![]),
                };
                match sh.mem.alloc_mw(pd, t) {
                    Ok(k) => {
                        self.objs.mws.insert(k.0, pd);
                        (Response::Mw { key: k.0 }, vec![])
                    }
                    Err(e) => (err(libc::ENOMEM, &e.to_string()), vec![]),
                }
            }
            Request::DeallocMw { key } => {
                if self.objs.mws.remove(&key).is_none() {
                    return (err(libc::EINVAL, "no such MW"), vec![]);
                }
                match sh.mem.dealloc_mw(Key(key)) {
                    Ok(()) => (Response::Ok, vec![]),
                    Err(e) => (err(libc::EBUSY, &e.to_string()), vec![]),
                }
            }
            Request::CreateQp { device, pd, qp_type, send_cq, recv_cq, srq, cap, sq_sig_all } => {
                self.create_qp(device, pd, qp_type, send_cq, recv_cq, srq, cap, sq_sig_all)
            }
            Request::ModifyQp { qpn, attr, mask } => {
                let Some(q) = self.objs.qps.get(&qpn) else { return (err(libc::EINVAL, "no such QP"), vec![]) };
                let a = Box::new(to_engine_attr(&attr));
                let r: Result<(), i32> = lcore_call!(sh.lcores[q.lcore], ModifyQp { qpn: qpn, attr: a, mask: AttrMask(mask) });
                match r {
                    Ok(()) => (Response::Ok, vec![]),
                    Err(e) => (err(e, "modify_qp rejected (state transition or attribute mask)"), vec![]),
                }
            }
            Request::QueryQp { qpn } => {
                let Some(q) = self.objs.qps.get(&qpn) else { return (err(libc::EINVAL, "no such QP"), vec![]) };
                let init_cap = q.init_cap;
                let a: Option<QpAttr> = lcore_call!(sh.lcores[q.lcore], QueryQp { qpn: qpn });
                match a {
                    Some(a) => (Response::QpAttr { attr: from_engine_attr(&a, init_cap), init_cap }, vec![]),
                    None => (err(libc::EINVAL, "no such QP"), vec![]),
                }
            }
            Request::DestroyQp { qpn } => {
                let Some(q) = self.objs.qps.get(&qpn) else { return (err(libc::EINVAL, "no such QP"), vec![]) };
                let lc = q.lcore;
                let slot = q.db_slot;
                let r: Result<(), i32> = lcore_call!(sh.lcores[lc], DestroyQp { qpn: qpn });
                self.objs.qps.remove(&qpn);
                self.objs.db_used[slot as usize] = false;
                match r {
                    Ok(()) => (Response::Ok, vec![]),
                    Err(e) => (err(e, "destroy_qp"), vec![]),
                }
            }
            Request::CreateSrq { device, pd, max_wr, max_sge, srq_limit } => self.create_srq(device, pd, max_wr, max_sge, srq_limit),
            Request::ModifySrq { srq, max_wr: _, srq_limit, mask } => {
                let Some(r) = self.objs.srqs.get(&srq) else { return (err(libc::EINVAL, "no such SRQ"), vec![]) };
                // IBV_SRQ_MAX_WR = 1 (resize: not supported), IBV_SRQ_LIMIT = 2.
                if mask & 1 != 0 {
                    return (err(libc::EOPNOTSUPP, "SRQ resize is not supported"), vec![]);
                }
                let attr = SrqAttr { max_wr: 0, max_sge: 0, srq_limit };
                let res: Result<(), i32> = lcore_call!(sh.lcores[r.lcore], ModifySrq { srqn: srq, attr: attr, arm: mask & 2 != 0 });
                match res {
                    Ok(()) => (Response::Ok, vec![]),
                    Err(e) => (err(e, "modify_srq"), vec![]),
                }
            }
            Request::QuerySrq { srq } => {
                let Some(r) = self.objs.srqs.get(&srq) else { return (err(libc::EINVAL, "no such SRQ"), vec![]) };
                let a: Option<SrqAttr> = lcore_call!(sh.lcores[r.lcore], QuerySrq { srqn: srq });
                match a {
                    Some(a) => (Response::SrqAttr { max_wr: a.max_wr, max_sge: a.max_sge, srq_limit: a.srq_limit }, vec![]),
                    None => (err(libc::EINVAL, "no such SRQ"), vec![]),
                }
            }
            Request::DestroySrq { srq } => {
                let Some(r) = self.objs.srqs.get(&srq) else { return (err(libc::EINVAL, "no such SRQ"), vec![]) };
                let (lc, slot) = (r.lcore, r.db_slot);
                let res: Result<(), i32> = lcore_call!(sh.lcores[lc], RemoveSrq { srqn: srq });
                match res {
                    Ok(()) => {
                        self.objs.srqs.remove(&srq);
                        self.objs.db_used[slot as usize] = false;
                        (Response::Ok, vec![])
                    }
                    Err(e) => (err(e, "SRQ busy or unknown"), vec![]),
                }
            }
            Request::CreateAh { pd, attr } => {
                let Some(&dev) = self.objs.pds.get(&pd) else { return (err(libc::EINVAL, "no such PD"), vec![]) };
                let ah = sh.handle();
                let lc = sh.lcore_for(self.home, dev);
                let _ = sh.lcores[lc].cmds.send(Cmd::AddAh { ah, av: to_av(&attr) });
                self.objs.ahs.insert(ah, lc);
                (Response::Ah { ah }, vec![])
            }
            Request::DestroyAh { ah } => match self.objs.ahs.remove(&ah) {
                Some(lc) => {
                    let _ = sh.lcores[lc].cmds.send(Cmd::RemoveAh { ah });
                    (Response::Ok, vec![])
                }
                None => (err(libc::EINVAL, "no such AH"), vec![]),
            },
            Request::GetAsyncEvent => (Response::AsyncEvent(self.events.as_ref().and_then(|r| r.try_recv().ok())), vec![]),
        }
    }

    fn create_cq(&mut self, device: u32, cqe: u32, channel: Option<u32>) -> Reply {
        /// Smallest CQ ring (64-byte CQEs: one 4 KiB page).
        const MIN_CQ_RING: u32 = 64;
        let sh = self.shared.clone();
        if device as usize >= sh.devices.len() {
            return (err(libc::ENODEV, "no such device"), vec![]);
        }
        let max = sh.devices[device as usize].attr.max_cqe;
        if cqe == 0 || cqe > max {
            return (err(libc::EINVAL, &format!("cqe must be 1..={max}")), vec![]);
        }
        let ch = match channel {
            None => None,
            Some(c) => match self.objs.channels.get(&c) {
                Some(e) => Some(e.clone()),
                None => return (err(libc::EINVAL, "no such completion channel"), vec![]),
            },
        };
        // At least MIN_CQ_RING entries, so ibv_resize_cq can grow a small CQ in place.
        let cap = (cqe + 1).max(MIN_CQ_RING).next_power_of_two();
        let layout = CqSegmentLayout::new(cap);
        let seg = match Segment::create("pmrxe-cq", layout.total_len as usize) {
            Ok(s) => Arc::new(s),
            Err(e) => return (err(libc::ENOMEM, &e.to_string()), vec![]),
        };
        // SAFETY: fresh zeroed segment sized by the layout; CqNotify (zeroes) at 0, ring here.
        if let Err(e) = unsafe { init_ring::<ShmCqe>(seg.as_ptr().add(layout.ring_offset as usize), cap) } {
            return (err(libc::EINVAL, &e.to_string()), vec![]);
        }
        let cq = sh.handle();
        let lc = sh.lcore_for(self.home, device);
        let fd = seg.fd().as_raw_fd();
        let r: Result<(), String> =
            lcore_call!(sh.lcores[lc], AddCq { cq: cq, client: self.id, seg: seg.clone(), layout: layout, channel: ch });
        if let Err(e) = r {
            return (err(libc::EINVAL, &e), vec![]);
        }
        self.objs.cqs.insert(cq, lc);
        // `seg` stays alive in the lcore; `fd` is valid until the reply is sent (we hold `seg`).
        let resp = (Response::Cq { cq, cqe: cap - 1, layout }, vec![fd]);
        drop_after_send(seg);
        resp
    }

    #[allow(clippy::too_many_arguments)]
    fn create_qp(&mut self, device: u32, pd: u32, qp_type: u32, send_cq: u32, recv_cq: u32, srq: Option<u32>, cap: QpCap, sig_all: bool) -> Reply {
        let sh = self.shared.clone();
        let Some(&pd_dev) = self.objs.pds.get(&pd) else { return (err(libc::EINVAL, "no such PD"), vec![]) };
        if pd_dev != device {
            return (err(libc::EINVAL, "PD belongs to another device"), vec![]);
        }
        let lc = sh.lcore_for(self.home, device);
        if let Some(n) = srq {
            if self.objs.srqs.get(&n).map(|r| r.lcore) != Some(lc) {
                return (err(libc::EINVAL, "SRQ unknown or on another device"), vec![]);
            }
        }
        for cq in [send_cq, recv_cq] {
            if self.objs.cqs.get(&cq) != Some(&lc) {
                return (err(libc::EINVAL, "CQ unknown or on another device"), vec![]);
            }
        }
        let ty = match qp_type {
            2 => QpType::Rc,
            3 => QpType::Uc,
            4 => QpType::Ud,
            _ => return (err(libc::EOPNOTSUPP, "QP type must be RC, UC or UD"), vec![]),
        };
        let d = &sh.devices[device as usize].attr;
        if cap.max_send_wr > d.max_qp_wr || cap.max_recv_wr > d.max_qp_wr || cap.max_send_sge > d.max_sge || cap.max_recv_sge > d.max_sge || cap.max_inline_data > d.max_inline_data {
            return (err(libc::EINVAL, "QP capabilities exceed the device limits"), vec![]);
        }
        let caps = QpCaps {
            max_send_wr: cap.max_send_wr.max(1),
            max_recv_wr: cap.max_recv_wr.max(1),
            max_send_sge: cap.max_send_sge.max(1),
            max_recv_sge: cap.max_recv_sge.max(1),
            max_inline_data: cap.max_inline_data,
        };
        let Some(slot) = self.objs.db_used.iter().position(|u| !u) else { return (err(libc::ENOMEM, "too many QPs for this client"), vec![]) };
        let rq_cap = if srq.is_some() { 0 } else { caps.max_recv_wr.next_power_of_two() };
        let layout = QpSegmentLayout::new(caps.max_send_wr.next_power_of_two(), rq_cap);
        let seg = match Segment::create("pmrxe-qp", layout.total_len as usize) {
            Ok(s) => Arc::new(s),
            Err(e) => return (err(libc::ENOMEM, &e.to_string()), vec![]),
        };
        // SAFETY: fresh zeroed segment laid out by `layout`.
        let ok = unsafe {
            init_ring::<ShmSendWqe>(seg.as_ptr().add(layout.sq_offset as usize), layout.sq_capacity).is_ok()
                && (layout.rq_capacity == 0 || init_ring::<ShmRecvWqe>(seg.as_ptr().add(layout.rq_offset as usize), layout.rq_capacity).is_ok())
        };
        if !ok {
            return (err(libc::EINVAL, "ring layout"), vec![]);
        }
        let fd = seg.fd().as_raw_fd();
        // A QPN names its lcore and its slot in that lcore's engine; a QP still living in the
        // slot a fresh QPN maps to (4096 creations ago) makes the lcore refuse it: take the next.
        let mut tries = 0;
        let qpn = loop {
            let qpn = sh.qpn_for(lc);
            let mut qp = match Qp::new(qpn, ty, pd, caps, srq) {
                Ok(q) => q,
                Err(e) => return (err(libc::EINVAL, &format!("{e:?}")), vec![]),
            };
            qp.set_sq_sig_all(sig_all);
            // UD messages may be as large as the port's active MTU (RC/UC get theirs at RTR).
            qp.set_port_mtu(mtu(sh.devices[device as usize].port.active_mtu));
            let setup = Box::new(QpSetup { qp, client: self.id, device, seg: seg.clone(), layout, send_cq, recv_cq, db_slot: slot as u16 });
            let r: Result<(), String> = lcore_call!(sh.lcores[lc], AddQp { setup: setup });
            match r {
                Ok(()) => break qpn,
                Err(e) if e == pmrxe_transport::AddError::SlotTaken.to_string() && tries < 64 => tries += 1,
                Err(e) => return (err(if tries > 0 { libc::ENOMEM } else { libc::EINVAL }, &e), vec![]),
            }
        };
        self.objs.db_used[slot] = true;
        let out_cap = QpCap { max_inline_data: caps.max_inline_data, ..cap };
        self.objs.qps.insert(qpn, QpRec { lcore: lc, init_cap: out_cap, db_slot: slot as u16 });
        let resp = (Response::Qp { qpn, cap: out_cap, layout, doorbell: Doorbell { lcore: sh.lcores[lc].index as u16, slot: slot as u16 } }, vec![fd]);
        drop_after_send(seg);
        resp
    }

    fn create_srq(&mut self, device: u32, pd: u32, max_wr: u32, max_sge: u32, srq_limit: u32) -> Reply {
        let sh = self.shared.clone();
        let Some(&pd_dev) = self.objs.pds.get(&pd) else { return (err(libc::EINVAL, "no such PD"), vec![]) };
        if pd_dev != device {
            return (err(libc::EINVAL, "PD belongs to another device"), vec![]);
        }
        let d = &sh.devices[device as usize].attr;
        if max_wr == 0 || max_wr > d.max_srq_wr || max_sge > d.max_srq_sge {
            return (err(libc::EINVAL, "SRQ attributes exceed the device limits"), vec![]);
        }
        let srqn = sh.handle();
        let srq = match Srq::new(srqn, SrqAttr { max_wr, max_sge: max_sge.max(1), srq_limit }) {
            Ok(s) => s,
            Err(e) => return (err(libc::EINVAL, &format!("{e:?}")), vec![]),
        };
        let Some(slot) = self.objs.db_used.iter().position(|u| !u) else { return (err(libc::ENOMEM, "too many queues for this client"), vec![]) };
        let layout = SrqSegmentLayout::new(max_wr.next_power_of_two());
        let seg = match Segment::create("pmrxe-srq", layout.total_len as usize) {
            Ok(s) => Arc::new(s),
            Err(e) => return (err(libc::ENOMEM, &e.to_string()), vec![]),
        };
        // SAFETY: fresh zeroed segment laid out by `layout` (one ring at offset 0).
        if unsafe { init_ring::<ShmRecvWqe>(seg.as_ptr(), layout.capacity) }.is_err() {
            return (err(libc::EINVAL, "ring layout"), vec![]);
        }
        let lc = sh.lcore_for(self.home, device);
        let fd = seg.fd().as_raw_fd();
        let r: Result<(), String> =
            lcore_call!(sh.lcores[lc], AddSrq { srq: Box::new(srq), client: self.id, seg: seg.clone(), layout: layout, db_slot: slot as u16 });
        if let Err(e) = r {
            return (err(libc::EINVAL, &e), vec![]);
        }
        self.objs.db_used[slot] = true;
        self.objs.srqs.insert(srqn, SrqRec { lcore: lc, db_slot: slot as u16 });
        let db = Doorbell { lcore: sh.lcores[lc].index as u16, slot: slot as u16 };
        (Response::Srq { srq: srqn, max_wr: layout.capacity, max_sge: max_sge.max(1), layout, doorbell: db }, vec![fd])
    }

    fn reg_mr(&mut self, pd: u32, addr: u64, len: u64, iova: u64, access: u32, pieces: &[ctrl::Piece]) -> Reply {
        let region = match self.mr_region(pd, addr, len, pieces) {
            Ok(r) => r,
            Err(msg) => return (err(libc::EINVAL, &msg), vec![]),
        };
        match self.shared.mem.reg_mr(pd, region, iova, Access(access)) {
            Ok(k) => {
                self.objs.mrs.insert(k.0, pd);
                (Response::Mr { key: k.0 }, vec![])
            }
            Err(e) => (err(libc::EINVAL, &e.to_string()), vec![]),
        }
    }

    /// `ibv_rereg_mr`: the same key over a new PD/access/translation (one of this client's MRs).
    #[allow(clippy::too_many_arguments)]
    fn rereg_mr(&mut self, key: u32, pd: u32, addr: u64, len: u64, iova: u64, access: u32, pieces: &[ctrl::Piece]) -> Reply {
        if !self.objs.mrs.contains_key(&key) {
            return (err(libc::EINVAL, "no such MR"), vec![]);
        }
        let region = match self.mr_region(pd, addr, len, pieces) {
            Ok(r) => r,
            Err(msg) => return (err(libc::EINVAL, &msg), vec![]),
        };
        match self.shared.mem.rereg_mr(pmrxe_mem::Key(key), pd, region, iova, Access(access)) {
            Ok(()) => {
                self.objs.mrs.insert(key, pd);
                (Response::Mr { key }, vec![])
            }
            Err(pmrxe_mem::MemError::MwBound) => (err(libc::EBUSY, "memory windows are bound to the MR"), vec![]),
            Err(e) => (err(libc::EINVAL, &e.to_string()), vec![]),
        }
    }

    /// The service's single map of a client registration `addr..addr+len` of PD `pd` from the
    /// segment pieces covering its pages. `Err`: why the request is invalid (answered EINVAL).
    fn mr_region(&mut self, pd: u32, addr: u64, len: u64, pieces: &[ctrl::Piece]) -> Result<Region, String> {
        if !self.objs.pds.contains_key(&pd) {
            return Err("no such PD".to_string());
        }
        if len == 0 {
            return Err("zero-length MR".to_string());
        }
        let Some(end) = addr.checked_add(len) else { return Err("range wraps".to_string()) };
        let a0 = addr & !4095;
        let a1 = match end.checked_add(4095) {
            Some(e) => e & !4095,
            None => return Err("range wraps".to_string()),
        };
        let mut parts = Vec::with_capacity(pieces.len());
        let mut total = 0u64;
        for p in pieces {
            let Some(s) = self.objs.segs.get(&p.seg) else { return Err("unknown segment".to_string()) };
            if p.seg_offset.checked_add(p.len).is_none_or(|e| e > s.len) {
                return Err("piece outside its segment".to_string());
            }
            total = total.saturating_add(p.len);
            parts.push(s.piece(p.seg_offset, p.len));
        }
        if total != a1 - a0 {
            return Err("pieces do not cover the registration".to_string());
        }
        let map = match MrMapping::assemble_at(a0, &parts) {
            Ok(m) => Arc::new(m),
            Err(e) => return Err(e.to_string()),
        };
        let ptr = map.as_ptr();
        // SAFETY: `map` covers [a0, a1) of the client's pages; the MR is [addr, addr+len) inside
        // it; the Arc keeps the mapping alive as long as the region; only raw copies touch it.
        let region = unsafe { Region::new(map, ptr.add((addr - a0) as usize), len as usize) };
        Ok(region)
    }

    /// `AddSharedSegment`: a file that already backs a shared mapping of the client, mapped as
    /// it is (no seal: the client keeps using it; a shrink is survived by the SIGBUS guard).
    fn add_shared_segment(&mut self, seg: u64, base: u64, len: u64, offset: u64, fds: Vec<OwnedFd>) -> Reply {
        let Some(fd) = fds.into_iter().next() else { return (err(libc::EINVAL, "AddSharedSegment needs an fd"), vec![]) };
        if len == 0 || !base.is_multiple_of(4096) || !len.is_multiple_of(4096) || !offset.is_multiple_of(4096) || self.objs.segs.contains_key(&seg) {
            return (err(libc::EINVAL, "bad segment"), vec![]);
        }
        if base.checked_add(len).is_none() || offset.checked_add(len).is_none_or(|e| e > i64::MAX as u64) {
            return (err(libc::EINVAL, "segment wraps"), vec![]);
        }
        // SAFETY: fstat into a zeroed buffer on a valid fd.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: valid fd and out pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return (err(libc::EINVAL, "fstat on the segment fd failed"), vec![]);
        }
        // Memory files only: never a device (its mmap could reach hardware).
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return (err(libc::EINVAL, "shared segment must be a regular, memfd, hugetlbfs or SysV SHM file"), vec![]);
        }
        // SAFETY: fcntl F_GETFL on a valid fd.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) } & libc::O_ACCMODE != libc::O_RDWR {
            return (err(libc::EACCES, "shared segment fd must be open read-write"), vec![]);
        }
        let page = match shm::file_page_size(fd.as_fd()) {
            Ok(p) => p,
            Err(e) => return (err(libc::EINVAL, &e.to_string()), vec![]),
        };
        if !base.is_multiple_of(page) || !len.is_multiple_of(page) || !offset.is_multiple_of(page) {
            return (err(libc::EINVAL, "shared segment not aligned to its file's page size"), vec![]);
        }
        if (offset + len).div_ceil(page) > (st.st_size as u64).div_ceil(page) {
            return (err(libc::EINVAL, "shared segment beyond the end of its file"), vec![]);
        }
        let guard = !shm::sealed_against_shrink(fd.as_fd());
        self.objs.segs.insert(seg, SegRec { fd, base, len, offset, page, guard, region: None });
        (Response::Ok, vec![])
    }

    fn map_mr_sg(&mut self, key: u32, sg: &[(u64, u64)], sg_offset: u64, page_size: u64) -> Reply {
        let sh = self.shared.clone();
        if !self.objs.mrs.contains_key(&key) {
            return (err(libc::EINVAL, "no such MR"), vec![]);
        }
        // Resolve each element to the segment containing it.
        let mut located = Vec::with_capacity(sg.len());
        for &(a, l) in sg {
            let hit = self.objs.segs.iter().find(|(_, s)| a >= s.base && a.checked_add(l).is_some_and(|e| e <= s.base + s.len));
            let Some((&id, _)) = hit else { return (err(libc::EINVAL, "scatter entry outside registered memory"), vec![]) };
            located.push((id, a, l));
        }
        for (id, _, _) in &located {
            let s = self.objs.segs.get_mut(id).expect("located above");
            if s.region.is_none() {
                match MrMapping::assemble_at(s.base, &[s.piece(0, s.len)]) {
                    Ok(m) => {
                        let (ptr, len) = (m.as_ptr(), m.len());
                        // SAFETY: `m` maps the whole segment [ptr, ptr+len); the Arc keeps it
                        // mapped as long as the region; only raw copies touch it.
                        s.region = Some(unsafe { Region::new(Arc::new(m), ptr, len) });
                    }
                    Err(e) => return (err(libc::ENOMEM, &e.to_string()), vec![]),
                }
            }
        }
        let entries: Vec<SgEntry<'_>> = located
            .iter()
            .map(|(id, a, l)| {
                let s = &self.objs.segs[id];
                SgEntry { region: s.region.as_ref().expect("mapped above"), offset: (a - s.base) as usize, len: *l as usize }
            })
            .collect();
        match sh.mem.map_mr_sg(Key(key), &entries, sg_offset, page_size) {
            Ok(n) => {
                // The client addresses are the iova space the peers use.
                if let Some(&(a, _)) = sg.first() {
                    let _ = sh.mem.set_fast_reg_iova(Key(key), a + sg_offset);
                }
                (Response::Mapped { n: n as u32 }, vec![])
            }
            Err(e) => (err(libc::EINVAL, &e.to_string()), vec![]),
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
        for lc in &sh.lcores {
            match lc.call(|tx| Cmd::RemoveClient { client: self.id, done: tx }) {
                Ok(()) | Err(pmrxe_runtime::call::CallError::Stopping) => {}
                Err(e) => tracing::warn!(client = self.id, "removing the client's objects from lcore {}: {e}", lc.index),
            }
        }
        for (&k, _) in self.objs.mws.iter() {
            let _ = sh.mem.dealloc_mw(Key(k));
        }
        for (&k, _) in self.objs.mrs.iter() {
            if let Err(e) = sh.mem.dereg_mr(Key(k)) {
                tracing::warn!(client = self.id, key = k, "dereg on disconnect: {e}");
            }
        }
        sh.clients.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
        tracing::info!(client = self.id, qps = self.objs.qps.len(), mrs = self.objs.mrs.len(), "client gone; its objects are released");
    }
}

/// Segments created for a client are owned by the lcore (through their Arc) from now on; this
/// only documents that the session's clone ends here.
fn drop_after_send(seg: Arc<Segment>) {
    drop(seg);
}

fn to_av(a: &AhAttr) -> AddressVector {
    AddressVector {
        dgid: a.dgid,
        sgid_index: a.sgid_index,
        flow_label: a.flow_label,
        hop_limit: a.hop_limit,
        traffic_class: a.traffic_class,
        dmac: None,
        port: a.port_num.max(1),
    }
}

fn state(v: u32) -> QpState {
    match v {
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => QpState::Reset,
    }
}

fn mtu(v: u32) -> PathMtu {
    match v {
        1 => PathMtu::Mtu256,
        2 => PathMtu::Mtu512,
        4 => PathMtu::Mtu2048,
        5 => PathMtu::Mtu4096,
        _ => PathMtu::Mtu1024,
    }
}

/// ibv_qp_attr (as sent by the shim) → engine attributes.
pub fn to_engine_attr(a: &AbiQpAttr) -> QpAttr {
    QpAttr {
        qp_state: state(a.qp_state),
        cur_qp_state: state(a.cur_qp_state),
        path_mtu: mtu(a.path_mtu),
        qkey: a.qkey,
        rq_psn: a.rq_psn & 0xff_ffff,
        sq_psn: a.sq_psn & 0xff_ffff,
        dest_qp_num: a.dest_qp_num & 0xff_ffff,
        qp_access_flags: a.qp_access_flags,
        pkey_index: a.pkey_index,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        min_rnr_timer: a.min_rnr_timer,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        ah_attr: to_av(&a.ah_attr),
        port_num: a.port_num.max(1),
        sq_draining: a.sq_draining != 0,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        cap: QpCaps {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        },
    }
}

/// Engine attributes → ibv_qp_attr values.
pub fn from_engine_attr(a: &QpAttr, cap: QpCap) -> AbiQpAttr {
    AbiQpAttr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.qp_state as u32,
        path_mtu: a.path_mtu as u32,
        path_mig_state: 0,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags,
        cap,
        ah_attr: AhAttr {
            dgid: a.ah_attr.dgid,
            flow_label: a.ah_attr.flow_label,
            sgid_index: a.ah_attr.sgid_index,
            hop_limit: a.ah_attr.hop_limit,
            traffic_class: a.ah_attr.traffic_class,
            is_global: true,
            port_num: a.ah_attr.port,
            ..Default::default()
        },
        pkey_index: a.pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify as u8,
        sq_draining: a.sq_draining as u8,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
    }
}
