//! librdmacm (`rdma/rdma_cma.h`, rdma-core 44) over the service's rdma_cm control contract
//! (`pmrxe_abi::ctrl::Request::Cm*`, docs/cm.md "Control protocol").
//!
//! Every function `librdmacm.so.1` exports that takes or returns an rdma_cm object is defined
//! here (unversioned exports interpose the `RDMACM_1.x` ones, reference/PLATFORM.md §8), with
//! librdmacm's semantics (`librdmacm/cma.c`): `-1` + `errno` on failure, synchronous ids
//! (`rdma_create_id(NULL, ...)`) that own a private channel and wait for their event, the
//! internal CONNECT_RESPONSE handled inside `rdma_get_cm_event` (RTR, RTS, establish), QPs made
//! with the shim's own create path and moved to INIT with `rdma_init_qp_attr`, one cached
//! verbs context (and PD) per device for the process.
//!
//! Objects: [`ShimEventChannel`] (the `rdma_event_channel` whose `fd` is the service's event
//! socket), [`ShimId`] (an `rdma_cm_id` followed by the leading fields of librdmacm's private
//! `struct cma_id_private`, so the rsockets code inside librdmacm, which reaches into them
//! with `container_of`, keeps working), [`event::ShimEvent`] (an `rdma_cm_event` owning its
//! private data until `rdma_ack_cm_event`).
pub mod addrinfo;
pub mod channel;
pub mod event;
pub mod id;
pub mod qp;

use crate::boundary::{handle, Errno, Handle, Res};
use crate::client;
use crate::sys::*;
use pmrxe_abi::ctrl::{CmSockAddr, Request};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::AtomicU32;
use std::sync::{Condvar, Mutex};

/// `RDMA_MAX_PRIVATE_DATA` of `rdma_cma_abi.h`.
pub const MAX_PRIVATE_DATA: usize = 256;

/// An event channel: the C struct, then the service's handle and the event socket.
#[repr(C)]
pub struct ShimEventChannel {
    pub ch: rdma_event_channel,
    magic: u64,
    /// The service's channel handle.
    pub handle: u32,
    /// The event socket (`ch.fd`); closed with the channel, which the service sees.
    _sock: OwnedFd,
    /// Threads inside `rdma_get_cm_event` on this channel, plus [`ShimEventChannel::DESTROYED`]
    /// once the application destroyed it: the last of them frees it (see `channel::destroy`).
    pub users: AtomicU32,
}
handle!(ShimEventChannel, rdma_event_channel, 0x504d_5845_4345_4348);

impl ShimEventChannel {
    /// `users` flag: `rdma_destroy_event_channel` was called.
    pub const DESTROYED: u32 = 1 << 31;
}

/// Layout of librdmacm's private `struct cma_device` (cma.c), of which the rsockets code reads
/// `max_qpsize` through `ucma_max_qpsize`. One per device, for the process.
#[repr(C)]
pub struct CmaDevice {
    pub dev: *mut ibv_device,
    /// `struct list_node entry` (unused here).
    entry: [*mut c_void; 2],
    pub verbs: *mut ibv_context,
    pub pd: *mut ibv_pd,
    xrcd: *mut c_void,
    port: *mut c_void,
    guid: u64,
    port_cnt: c_int,
    refcnt: c_int,
    pub max_qpsize: c_int,
    pub max_initiator_depth: u8,
    pub max_responder_resources: u8,
    ibv_idx: c_int,
    is_device_dead: u8,
}

// SAFETY: the pointers name process-lifetime shim objects (context, PD); the struct is never
// mutated after it is published.
unsafe impl Send for CmaDevice {}
// SAFETY: as above (read-only after publication).
unsafe impl Sync for CmaDevice {}

static CMA_DEVICES: Mutex<Vec<Option<&'static CmaDevice>>> = Mutex::new(Vec::new());

/// The process's cached context + PD on client device `index` (opened on first use, as
/// librdmacm's `ucma_init_device` + `ucma_get_device`).
pub fn cma_device(index: u32) -> Res<&'static CmaDevice> {
    let mut g = CMA_DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(d)) = g.get(index as usize) {
        return Ok(d);
    }
    let dev = crate::device::device_ptr(index)?;
    // SAFETY: `dev` is one of our devices (process lifetime).
    let verbs = unsafe { crate::device::ibv_open_device(dev) };
    if verbs.is_null() {
        return Err(Errno::last());
    }
    // SAFETY: plain C data.
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: our fresh context; `attr` is writable.
    let r = unsafe { crate::device::ibv_query_device(verbs, &mut attr) };
    if r != 0 {
        return Err(Errno(r));
    }
    // SAFETY: our fresh context.
    let pd = unsafe { crate::pd::ibv_alloc_pd(verbs) };
    if pd.is_null() {
        return Err(Errno::last());
    }
    let d: &'static CmaDevice = Box::leak(Box::new(CmaDevice {
        dev,
        entry: [std::ptr::null_mut(); 2],
        verbs,
        pd,
        xrcd: std::ptr::null_mut(),
        port: std::ptr::null_mut(),
        guid: 0,
        port_cnt: 1,
        refcnt: 1,
        max_qpsize: attr.max_qp_wr,
        max_initiator_depth: attr.max_qp_init_rd_atom.clamp(0, 255) as u8,
        max_responder_resources: attr.max_qp_rd_atom.clamp(0, 255) as u8,
        ibv_idx: index as c_int,
        is_device_dead: 0,
    }));
    if g.len() <= index as usize {
        g.resize(index as usize + 1, None);
    }
    g[index as usize] = Some(d);
    Ok(d)
}

/// Events of an id handed to the application and acknowledged (librdmacm's
/// `events_completed`, which `rdma_destroy_id` waits for).
#[derive(Default)]
pub struct EventCount {
    pub delivered: u64,
    pub acked: u64,
}

/// An `rdma_cm_id`. The fields after `id` up to `sync` have the layout of librdmacm's
/// `struct cma_id_private` (cma.c): rsockets, compiled into librdmacm, calls the internal
/// `ucma_max_qpsize` (reads `cma_dev->max_qpsize`) and `ucma_complete` (reads `sync`, then
/// calls our `rdma_get_cm_event` through the PLT) on ids it got from our `rdma_create_id`.
#[repr(C)]
pub struct ShimId {
    pub id: rdma_cm_id,
    pub cma_dev: *const CmaDevice,
    /// Connect data from `rdma_create_ep`'s `ai_connect` (malloc'd), prepended to the private
    /// data of the next `rdma_connect`.
    pub connect: *mut c_void,
    pub connect_len: usize,
    events_completed: c_int,
    pub connect_error: c_int,
    /// Synchronous id: owns its private channel, calls wait for their event.
    pub sync: c_int,
    magic: u64,
    /// The service's id handle.
    pub handle: u32,
    pub initiator_depth: u8,
    pub responder_resources: u8,
    /// `rdma_create_ep` on a passive endpoint: the QP every `rdma_get_request` creates.
    pub qp_init_attr: Option<Box<ibv_qp_init_attr>>,
    pub events: Mutex<EventCount>,
    pub events_cv: Condvar,
    /// The multicast groups joined (`rdma_join_multicast`), by group address.
    pub joins: Vec<McJoin>,
}

/// One `rdma_join_multicast` of an id.
pub struct McJoin {
    /// The group's address as the service names it (IPv4-mapped); also its GID.
    pub ip: [u8; 16],
    /// The application's context: MULTICAST_JOIN's `param.ud.private_data`.
    pub context: *mut c_void,
    /// RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: the QP is not attached (it only sends).
    pub send_only: bool,
}
handle!(ShimId, rdma_cm_id, 0x504d_5845_434d_4944);

// SAFETY: the raw pointers are shim objects or malloc'd memory owned by the id; concurrent
// use follows librdmacm's rules (the application serialises calls on one id).
unsafe impl Send for ShimId {}
// SAFETY: as above; the shared counters are behind a Mutex.
unsafe impl Sync for ShimId {}

/// Live ids by service handle (events name their id by handle).
static IDS: Mutex<Option<HashMap<u32, usize>>> = Mutex::new(None);

pub fn ids_insert(handle: u32, p: *mut ShimId) {
    IDS.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert(handle, p as usize);
}
pub fn ids_remove(handle: u32) {
    if let Some(m) = IDS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        m.remove(&handle);
    }
}
pub fn ids_get(handle: u32) -> Option<*mut ShimId> {
    IDS.lock().unwrap_or_else(|e| e.into_inner()).as_ref()?.get(&handle).map(|p| *p as *mut ShimId)
}

impl ShimId {
    /// # Safety
    /// `p` is NULL or an id this shim made and has not destroyed.
    pub unsafe fn from_id<'a>(p: *mut rdma_cm_id) -> Res<&'a mut ShimId> {
        // SAFETY: forwarded.
        unsafe { ShimId::from_c_exclusive(p) }
    }

    pub fn new(channel: *mut rdma_event_channel, context: *mut c_void, ps: rdma_port_space, qp_type: ibv_qp_type, handle: u32, sync: bool) -> Box<ShimId> {
        // SAFETY: rdma_cm_id is plain C data; all-zero is its initial state (calloc in librdmacm).
        let mut id: rdma_cm_id = unsafe { std::mem::zeroed() };
        id.channel = channel;
        id.context = context;
        id.ps = ps;
        id.qp_type = qp_type;
        Box::new(ShimId {
            id,
            cma_dev: std::ptr::null(),
            connect: std::ptr::null_mut(),
            connect_len: 0,
            events_completed: 0,
            connect_error: 0,
            sync: c_int::from(sync),
            magic: <ShimId as Handle>::MAGIC,
            handle,
            initiator_depth: 0,
            responder_resources: 0,
            qp_init_attr: None,
            events: Mutex::new(EventCount::default()),
            events_cv: Condvar::new(),
            joins: Vec::new(),
        })
    }

    /// The id's channel.
    pub fn channel(&self) -> Res<&'static ShimEventChannel> {
        // SAFETY: id.channel is set by the shim to one of its live channels.
        unsafe { ShimEventChannel::from_c(self.id.channel) }
    }

    /// Attach the id to device `index` (librdmacm `ucma_get_device`): `verbs`, `pd`,
    /// `port_num`.
    pub fn attach_device(&mut self, index: u32) -> Res<()> {
        if !self.cma_dev.is_null() {
            return Ok(());
        }
        let d = cma_device(index)?;
        self.cma_dev = d;
        self.id.verbs = d.verbs;
        if self.id.pd.is_null() {
            self.id.pd = d.pd;
        }
        self.id.port_num = 1;
        Ok(())
    }

    pub fn device(&self) -> Option<&'static CmaDevice> {
        // SAFETY: set only from `cma_device`, process lifetime.
        unsafe { self.cma_dev.as_ref() }
    }

    /// Record the source address (and keep the IB address in step).
    pub fn set_src(&mut self, a: &CmSockAddr) {
        let r = &mut self.id.route.addr;
        // SAFETY: writing the storage member of a C union of sockaddrs.
        unsafe { write_sockaddr(&mut r.__bindgen_anon_1.src_storage, a) };
        r.addr.ibaddr.sgid.raw = a.ip;
        r.addr.ibaddr.pkey = 0xffffu16.to_be();
    }

    pub fn set_dst(&mut self, a: &CmSockAddr) {
        let r = &mut self.id.route.addr;
        // SAFETY: as above.
        unsafe { write_sockaddr(&mut r.__bindgen_anon_2.dst_storage, a) };
        r.addr.ibaddr.dgid.raw = a.ip;
    }

    /// The route is resolved: one path record, as the kernel reports on RoCE.
    pub fn set_path(&mut self) -> Res<()> {
        if self.id.route.path_rec.is_null() {
            // SAFETY: plain allocation, freed in destroy (free(3), as librdmacm).
            let p = unsafe { libc::calloc(1, std::mem::size_of::<ibv_sa_path_rec>()) }.cast::<ibv_sa_path_rec>();
            if p.is_null() {
                return Err(Errno::NOMEM);
            }
            self.id.route.path_rec = p;
        }
        let mtu = self.device().and_then(|d| {
            let c = client::existing().ok()?;
            // SAFETY: d.dev is one of our devices.
            let dev = unsafe { crate::device::ShimDevice::from_c(d.dev) }.ok()?;
            c.devices.get(dev.index as usize).map(|i| i.port.active_mtu)
        });
        // SAFETY: allocated above, owned by the id.
        let p = unsafe { &mut *self.id.route.path_rec };
        // SAFETY: the union members are plain bytes.
        let (sgid, dgid) = unsafe { (self.id.route.addr.addr.ibaddr.sgid, self.id.route.addr.addr.ibaddr.dgid) };
        p.sgid = sgid;
        p.dgid = dgid;
        p.pkey = 0xffffu16.to_be();
        p.numb_path = 1;
        p.reversible = 1;
        p.hop_limit = 64;
        p.mtu_selector = 2; // exactly
        p.mtu = mtu.unwrap_or(IBV_MTU_1024) as u8;
        p.rate_selector = 2;
        p.rate = 0; // not reported
        p.packet_life_time_selector = 2;
        p.packet_life_time = 16; // CMA_IBOE_PACKET_LIFETIME
        self.id.route.num_paths = 1;
        Ok(())
    }
}

/// The service's form of a C socket address (AF_INET / AF_INET6; anything else EAFNOSUPPORT).
///
/// # Safety
/// `sa` is NULL or points at a socket address of its family's size.
pub unsafe fn read_sockaddr(sa: *const sockaddr) -> Res<Option<CmSockAddr>> {
    if sa.is_null() {
        return Ok(None);
    }
    // SAFETY: caller contract: the family field is readable.
    let fam = c_int::from(unsafe { (*sa).sa_family });
    match fam {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let s = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            let mut ip = [0u8; 16];
            ip[10] = 0xff;
            ip[11] = 0xff;
            ip[12..].copy_from_slice(&s.sin_addr.s_addr.to_ne_bytes());
            if s.sin_addr.s_addr == 0 {
                ip = [0; 16]; // wildcard
            }
            Ok(Some(CmSockAddr { ip, v6: false, port: u16::from_be(s.sin_port) }))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let s = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            Ok(Some(CmSockAddr { ip: s.sin6_addr.s6_addr, v6: true, port: u16::from_be(s.sin6_port) }))
        }
        _ => Err(Errno(libc::EAFNOSUPPORT)),
    }
}

/// Length of a C socket address by family (`ucma_addrlen`), 0 for unknown families.
///
/// # Safety
/// `sa` is NULL or readable for its family field.
pub unsafe fn addrlen(sa: *const sockaddr) -> usize {
    if sa.is_null() {
        return 0;
    }
    // SAFETY: caller contract.
    match c_int::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
        libc::AF_IB => 48, // sizeof(struct sockaddr_ib)
        _ => 0,
    }
}

/// Write the service's address into C storage (IPv4-mapped addresses become AF_INET).
///
/// # Safety
/// `st` is writable for a `sockaddr_storage`.
pub unsafe fn write_sockaddr(st: &mut sockaddr_storage, a: &CmSockAddr) {
    // SAFETY: sockaddr_storage is plain data.
    *st = unsafe { std::mem::zeroed() };
    let p = (st as *mut sockaddr_storage).cast::<u8>();
    if !a.v6 {
        // SAFETY: sockaddr_storage (128 bytes) holds a sockaddr_in.
        let s = unsafe { &mut *p.cast::<libc::sockaddr_in>() };
        s.sin_family = libc::AF_INET as libc::sa_family_t;
        s.sin_port = a.port.to_be();
        s.sin_addr.s_addr = u32::from_ne_bytes([a.ip[12], a.ip[13], a.ip[14], a.ip[15]]);
    } else {
        // SAFETY: sockaddr_storage holds a sockaddr_in6.
        let s = unsafe { &mut *p.cast::<libc::sockaddr_in6>() };
        s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        s.sin6_port = a.port.to_be();
        s.sin6_addr.s6_addr = a.ip;
    }
}

/// librdmacm's error convention: 0, or -1 with errno.
pub fn ret(r: Res<()>) -> c_int {
    crate::boundary::ret_minus1(r)
}

/// One control request whose success is `Response::Ok`.
pub fn call_ok(req: &Request) -> Res<()> {
    client::client()?.call_ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trip_v4_v6() {
        // SAFETY: plain data.
        let mut st: sockaddr_storage = unsafe { std::mem::zeroed() };
        let v4 = CmSockAddr { ip: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1], v6: false, port: 7174 };
        // SAFETY: local storage.
        unsafe { write_sockaddr(&mut st, &v4) };
        // SAFETY: filled above.
        let sin = unsafe { &*(&st as *const sockaddr_storage).cast::<libc::sockaddr_in>() };
        assert_eq!(sin.sin_family as i32, libc::AF_INET);
        assert_eq!(u16::from_be(sin.sin_port), 7174);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [198, 18, 0, 1]);
        // SAFETY: a valid sockaddr_in.
        assert_eq!(unsafe { read_sockaddr((&st as *const sockaddr_storage).cast()) }, Ok(Some(v4)));
        let v6 = CmSockAddr { ip: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9], v6: true, port: 1 };
        // SAFETY: local storage.
        unsafe { write_sockaddr(&mut st, &v6) };
        // SAFETY: a valid sockaddr_in6.
        assert_eq!(unsafe { read_sockaddr((&st as *const sockaddr_storage).cast()) }, Ok(Some(v6)));
        // SAFETY: a valid sockaddr_in6 (128-byte storage).
        assert_eq!(unsafe { addrlen((&st as *const sockaddr_storage).cast()) }, 28);
        // The IPv4 wildcard is the all-zero address.
        // SAFETY: plain data.
        let mut w: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        w.sin_family = libc::AF_INET as libc::sa_family_t;
        // SAFETY: a valid sockaddr_in.
        assert_eq!(unsafe { read_sockaddr((&w as *const libc::sockaddr_in).cast()) }, Ok(Some(CmSockAddr::default())));
        w.sin_family = 99;
        // SAFETY: as above.
        assert_eq!(unsafe { read_sockaddr((&w as *const libc::sockaddr_in).cast()) }, Err(Errno(libc::EAFNOSUPPORT)));
    }

    #[test]
    fn id_prefix_matches_cma_id_private() {
        use std::mem::offset_of;
        // struct cma_id_private { struct rdma_cm_id id; struct cma_device *cma_dev; void *connect;
        // size_t connect_len; int events_completed; int connect_error; int sync; ... }
        let base = std::mem::size_of::<rdma_cm_id>();
        assert_eq!(offset_of!(ShimId, cma_dev), base);
        assert_eq!(offset_of!(ShimId, connect), base + 8);
        assert_eq!(offset_of!(ShimId, connect_len), base + 16);
        assert_eq!(offset_of!(ShimId, events_completed), base + 24);
        assert_eq!(offset_of!(ShimId, connect_error), base + 28);
        assert_eq!(offset_of!(ShimId, sync), base + 32);
        // struct cma_device: dev, entry{next,prev}, verbs, pd, xrcd, port, guid, port_cnt,
        // refcnt, max_qpsize, ...
        assert_eq!(offset_of!(CmaDevice, verbs), 24);
        assert_eq!(offset_of!(CmaDevice, guid), 56);
        assert_eq!(offset_of!(CmaDevice, max_qpsize), 72);
        assert_eq!(offset_of!(CmaDevice, max_initiator_depth), 76);
        assert_eq!(offset_of!(CmaDevice, ibv_idx), 80);
    }
}
