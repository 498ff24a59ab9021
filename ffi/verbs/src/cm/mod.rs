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
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU8, AtomicUsize, Ordering};
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

/// Events of an id handed to the application, or being built for it ([`ids_hold`]), and those
/// acknowledged (librdmacm's `events_reported`/`events_completed`, which `rdma_destroy_id`
/// waits to be equal).
#[derive(Default)]
pub struct EventCount {
    pub delivered: u64,
    pub acked: u64,
}

/// An `rdma_cm_id`. The fields after `id` up to `sync` have the layout of librdmacm's
/// `struct cma_id_private` (cma.c): rsockets, compiled into librdmacm, calls the internal
/// `ucma_max_qpsize` (reads `cma_dev->max_qpsize`) and `ucma_complete` (reads `sync` and
/// `id.event`, writes `id.event`, then calls our `rdma_get_cm_event` through the PLT) on ids
/// it got from our `rdma_create_id`.
///
/// # Threads
/// The shim only ever holds `&ShimId` ([`ShimId::from_id`]): an application may read events
/// on one thread (`rdma_get_cm_event`, which processes them on the id: [`event`]) while it
/// uses the id on another, and it reads fields of the C struct directly. So:
///
/// * The C struct `id` is in an `UnsafeCell` and is reached one field at a time through the
///   raw pointer [`ShimId::c`], never as a reference. Who writes which field mirrors
///   librdmacm (cma.c), which takes no lock for them either:
///   - *call fields* (`qp`, `srq`, `pd`, the CQs and their channels, `channel`, `event`;
///     accessors made by `call_fields!`) are written only by the thread inside a call on this
///     id (`rdma_create_qp`, `rdma_migrate_id`, a synchronous id's wait in [`event::complete`],
///     rsockets' `ucma_complete`...), or before the id is handed out. The application makes
///     no call that changes one of them while another thread uses it (librdmacm's rules; e.g.
///     rdma_migrate_id(3): nobody polls the current channel meanwhile). The thread reading
///     events reads the id's `qp` (as `ucma_process_conn_resp` / `ucma_process_join`) and a
///     listener's `channel`, `context`, `ps`, `qp_type` (as `ucma_process_conn_req`);
///   - *route fields* (`route`, `verbs`, `port_num`, and `pd` while still NULL) are written
///     by a call (`rdma_bind_addr`, `rdma_resolve_addr`) or by the thread reading the channel
///     while it processes the id's event, before that event is handed out (as librdmacm's
///     `ucma_query_addr` / `ucma_query_route` inside `rdma_get_cm_event`); the application
///     reads them after the call returned or after it got the event. The shim's own two
///     writers can overlap (the reply of `rdma_resolve_addr` and its ADDR_RESOLVED event), so
///     they hold `route_lock`;
///   - `context`, `ps`, `qp_type` are written by the shim only at creation.
/// * The `cma_id_private` prefix that C code reads (`cma_dev`, `sync`) and the shim-only words
///   around it are atomics, which have the layout of the C types.
/// * The shim's own state: `handle` never changes; the rest is in atomics or mutexes.
#[repr(C)]
pub struct ShimId {
    id: UnsafeCell<rdma_cm_id>,
    /// Set once, by [`ShimId::attach_device`] (under `route_lock`); read by rsockets.
    cma_dev: AtomicPtr<CmaDevice>,
    /// Connect data from `rdma_create_ep`'s `ai_connect` (malloc'd), prepended to the private
    /// data of the next `rdma_connect`.
    connect: AtomicPtr<c_void>,
    connect_len: AtomicUsize,
    /// Layout only (librdmacm's event count, which the shim keeps in `events`); never written.
    events_completed: c_int,
    /// The internal CONNECT_RESPONSE failed: its REJECTED / DISCONNECTED are not reported.
    /// Read and written by the thread reading the id's events.
    connect_error: AtomicI32,
    /// Synchronous id: owns its private channel, calls wait for their event. Read by rsockets.
    sync: AtomicI32,
    magic: u64,
    /// The service's id handle.
    pub handle: u32,
    initiator_depth: AtomicU8,
    responder_resources: AtomicU8,
    /// `rdma_create_ep` on a passive endpoint: the QP every `rdma_get_request` creates.
    qp_init_attr: Mutex<Option<ibv_qp_init_attr>>,
    pub events: Mutex<EventCount>,
    pub events_cv: Condvar,
    /// The multicast groups joined (`rdma_join_multicast`), by group address: recorded by the
    /// application's thread, read by the thread reading MULTICAST_JOIN.
    joins: Mutex<Vec<McJoin>>,
    /// Serialises the shim's writes of route fields (see "Threads").
    route_lock: Mutex<()>,
}

/// One `rdma_join_multicast` of an id.
#[derive(Clone, Copy)]
pub struct McJoin {
    /// The group's address as the service names it (IPv4-mapped); also its GID.
    pub ip: [u8; 16],
    /// The application's context: MULTICAST_JOIN's `param.ud.private_data`.
    pub context: *mut c_void,
    /// RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: the QP is not attached (it only sends).
    pub send_only: bool,
}
handle!(ShimId, rdma_cm_id, 0x504d_5845_434d_4944);

// SAFETY: the raw pointers are shim objects (process-wide), malloc'd memory owned by the id,
// or the application's opaque contexts, which the shim never dereferences.
unsafe impl Send for ShimId {}
// SAFETY: every access through `&ShimId` is to an atomic, behind a mutex, or to a field of
// the C struct under the per-field thread rules of "Threads" on `ShimId` (librdmacm's).
unsafe impl Sync for ShimId {}

/// Live ids by service handle (events name their id by handle).
static IDS: Mutex<Option<HashMap<u32, usize>>> = Mutex::new(None);

pub fn ids_insert(handle: u32, p: *const ShimId) {
    IDS.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert(handle, p as usize);
}
pub fn ids_remove(handle: u32) {
    if let Some(m) = IDS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        m.remove(&handle);
    }
}
/// The id registered as `handle`, held for an event: until the hold is given up (dropped, or
/// handed to the event with [`Held::deliver`], whose ack gives it up) the id's
/// `rdma_destroy_id` waits. The hold is counted under the map's lock, and `rdma_destroy_id`
/// takes the id out of the map before it waits, so either the destroy comes first and the id
/// is not found, or it waits for this event: an event is never built on a freed id.
pub fn ids_hold(handle: u32) -> Option<Held> {
    let map = IDS.lock().unwrap_or_else(|e| e.into_inner());
    let p = *map.as_ref()?.get(&handle)? as *const ShimId;
    // SAFETY: a registered id is live while it is in the map (destroy removes it before it
    // frees it), and the map's lock is held.
    unsafe { &*p }.events.lock().unwrap_or_else(|e| e.into_inner()).delivered += 1;
    Some(Held(p))
}

impl ShimId {
    /// One of the id's events acknowledged (or given up): wakes a waiting `rdma_destroy_id`.
    /// The notify happens with the lock held, as librdmacm's `rdma_ack_cm_event` signals: the
    /// destroy cannot see the last ack, free the id and its condvar before this call is done
    /// with them.
    pub fn ack_one(&self) {
        let mut g = self.events.lock().unwrap_or_else(|e| e.into_inner());
        g.acked += 1;
        self.events_cv.notify_all();
        drop(g);
    }
}

/// A registered id an event is being built for ([`ids_hold`]).
pub struct Held(*const ShimId);

impl Held {
    pub fn id(&self) -> &ShimId {
        // SAFETY: held (ids_hold): its destroy waits for this hold to end.
        unsafe { &*self.0 }
    }
    /// The id as the owner of the event handed out: the event's ack gives the hold up.
    pub fn deliver(self) -> *const ShimId {
        let p = self.0;
        std::mem::forget(self);
        p
    }
}

impl Drop for Held {
    /// No event after all (or an error building it): as if delivered and acknowledged.
    fn drop(&mut self) {
        self.id().ack_one();
    }
}

/// Getter and setter of call fields of the C id (see "Threads" on [`ShimId`]).
macro_rules! call_fields {
    ($($get:ident / $set:ident: $f:ident: $t:ty;)*) => {
        impl ShimId {$(
            #[doc = concat!("The C id's `", stringify!($f), "` (a call field).")]
            pub fn $get(&self) -> $t {
                // SAFETY: one field of our live id, copied through the raw pointer (no
                // reference to the struct). A call field changes only on the thread inside a
                // call on this id, which librdmacm's rules keep from overlapping this use of it
                // (see "Threads" on `ShimId`).
                unsafe { (*self.c()).$f }
            }
            #[doc = concat!("Set the C id's `", stringify!($f), "` (a call field).")]
            pub fn $set(&self, v: $t) {
                // SAFETY: one field of our live id, written through the raw pointer. The
                // caller is the thread inside a call on this id (or the id is not handed out
                // yet), the only one that may write a call field (see "Threads" on `ShimId`).
                unsafe { (*self.c()).$f = v }
            }
        )*}
    };
}
call_fields! {
    qp / set_qp: qp: *mut ibv_qp;
    srq / set_srq: srq: *mut ibv_srq;
    pd / set_pd: pd: *mut ibv_pd;
    send_cq / set_send_cq: send_cq: *mut ibv_cq;
    recv_cq / set_recv_cq: recv_cq: *mut ibv_cq;
    send_cq_channel / set_send_cq_channel: send_cq_channel: *mut ibv_comp_channel;
    recv_cq_channel / set_recv_cq_channel: recv_cq_channel: *mut ibv_comp_channel;
    channel_ptr / set_channel_ptr: channel: *mut rdma_event_channel;
    event / set_event: event: *mut rdma_cm_event;
}

impl ShimId {
    /// # Safety
    /// `p` is NULL or an id this shim made and has not destroyed.
    pub unsafe fn from_id<'a>(p: *mut rdma_cm_id) -> Res<&'a ShimId> {
        // SAFETY: forwarded.
        unsafe { ShimId::from_c(p) }
    }

    pub fn new(channel: *mut rdma_event_channel, context: *mut c_void, ps: rdma_port_space, qp_type: ibv_qp_type, handle: u32, sync: bool) -> Box<ShimId> {
        // SAFETY: rdma_cm_id is plain C data; all-zero is its initial state (calloc in librdmacm).
        let mut id: rdma_cm_id = unsafe { std::mem::zeroed() };
        id.channel = channel;
        id.context = context;
        id.ps = ps;
        id.qp_type = qp_type;
        Box::new(ShimId {
            id: UnsafeCell::new(id),
            cma_dev: AtomicPtr::new(std::ptr::null_mut()),
            connect: AtomicPtr::new(std::ptr::null_mut()),
            connect_len: AtomicUsize::new(0),
            events_completed: 0,
            connect_error: AtomicI32::new(0),
            sync: AtomicI32::new(c_int::from(sync)),
            magic: <ShimId as Handle>::MAGIC,
            handle,
            initiator_depth: AtomicU8::new(0),
            responder_resources: AtomicU8::new(0),
            qp_init_attr: Mutex::new(None),
            events: Mutex::new(EventCount::default()),
            events_cv: Condvar::new(),
            joins: Mutex::new(Vec::new()),
            route_lock: Mutex::new(()),
        })
    }

    /// The C struct the application holds (`&id.id` as librdmacm hands it out). Its fields
    /// are read and written through this pointer one at a time (see "Threads").
    pub fn c(&self) -> *mut rdma_cm_id {
        self.id.get()
    }

    /// The id's port space (written only at creation).
    pub fn ps(&self) -> rdma_port_space {
        // SAFETY: a field of our live id copied through the raw pointer; the shim writes it
        // only in `new`, and librdmacm's applications do not change it.
        unsafe { (*self.c()).ps }
    }

    /// The id's QP type (written only at creation).
    pub fn qp_type(&self) -> ibv_qp_type {
        // SAFETY: as `ps`.
        unsafe { (*self.c()).qp_type }
    }

    /// The application's context of the id (the shim writes it only at creation; read for a
    /// listener's CONNECT_REQUEST, as librdmacm's `ucma_process_conn_req` does).
    pub fn context(&self) -> *mut c_void {
        // SAFETY: a field of our live id copied through the raw pointer. Only the application
        // writes it after creation, and not while it is reading the listener's events (it
        // would race with librdmacm's same read).
        unsafe { (*self.c()).context }
    }

    /// The id's verbs context (a route field).
    pub fn verbs(&self) -> *mut ibv_context {
        // SAFETY: a field of our live id copied through the raw pointer. Route fields are
        // written by a call on this id or while its event is processed, before the event is
        // handed out; the shim reads `verbs` in calls made after that (see "Threads").
        unsafe { (*self.c()).verbs }
    }

    /// `route.path_rec` (a route field; malloc'd by [`ShimId::set_path`], owned by the id).
    pub fn path_rec(&self) -> *mut ibv_sa_path_rec {
        // SAFETY: as `verbs`.
        unsafe { (*self.c()).route.path_rec }
    }

    /// A copy of the source address (`route.addr.src_storage`).
    pub fn src_storage(&self) -> sockaddr_storage {
        // SAFETY: a route field of our live id copied through the raw pointer (as `verbs`);
        // the storage member of the C union covers every member, all plain bytes.
        unsafe { std::ptr::addr_of!((*self.c()).route.addr.__bindgen_anon_1.src_storage).read() }
    }

    /// A copy of the destination address (`route.addr.dst_storage`).
    pub fn dst_storage(&self) -> sockaddr_storage {
        // SAFETY: as `src_storage`.
        unsafe { std::ptr::addr_of!((*self.c()).route.addr.__bindgen_anon_2.dst_storage).read() }
    }

    /// Synchronous id?
    pub fn is_sync(&self) -> bool {
        self.sync.load(Ordering::Acquire) != 0
    }

    /// Make the id (a)synchronous (`rdma_migrate_id`, on the thread inside that call).
    pub fn set_sync(&self, sync: bool) {
        self.sync.store(c_int::from(sync), Ordering::Release);
    }

    /// The internal CONNECT_RESPONSE failed (see the field).
    pub fn connect_error(&self) -> bool {
        self.connect_error.load(Ordering::Relaxed) != 0
    }

    pub fn set_connect_error(&self) {
        self.connect_error.store(1, Ordering::Relaxed);
    }

    pub fn initiator_depth(&self) -> u8 {
        self.initiator_depth.load(Ordering::Relaxed)
    }

    pub fn responder_resources(&self) -> u8 {
        self.responder_resources.load(Ordering::Relaxed)
    }

    /// Record the depths offered (CONNECT_REQUEST) or chosen (`rdma_connect`, `rdma_accept`).
    pub fn set_depths(&self, initiator_depth: u8, responder_resources: u8) {
        self.initiator_depth.store(initiator_depth, Ordering::Relaxed);
        self.responder_resources.store(responder_resources, Ordering::Relaxed);
    }

    /// `rdma_create_ep`'s connect data: (malloc'd bytes, length), or (NULL, 0).
    pub fn connect_data(&self) -> (*mut c_void, usize) {
        (self.connect.load(Ordering::Acquire), self.connect_len.load(Ordering::Acquire))
    }

    /// Keep `rdma_create_ep`'s connect data (malloc'd, `len` bytes), for the next connect.
    pub fn set_connect_data(&self, p: *mut c_void, len: usize) {
        self.connect_len.store(len, Ordering::Release);
        self.connect.store(p, Ordering::Release);
    }

    /// Give up the connect data: the caller frees the returned pointer (NULL if none).
    pub fn take_connect_data(&self) -> *mut c_void {
        self.connect_len.store(0, Ordering::Release);
        self.connect.swap(std::ptr::null_mut(), Ordering::AcqRel)
    }

    /// The QP attributes of `rdma_create_ep` on a passive endpoint.
    pub fn qp_init_attr(&self) -> Option<ibv_qp_init_attr> {
        *self.qp_init_attr.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_qp_init_attr(&self, a: Option<ibv_qp_init_attr>) {
        *self.qp_init_attr.lock().unwrap_or_else(|e| e.into_inner()) = a;
    }

    fn joins(&self) -> std::sync::MutexGuard<'_, Vec<McJoin>> {
        self.joins.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record a join of group `j.ip` (EADDRINUSE if the id already joined it).
    pub fn join_record(&self, j: McJoin) -> Res<()> {
        let mut g = self.joins();
        if g.iter().any(|x| x.ip == j.ip) {
            return Err(Errno(libc::EADDRINUSE));
        }
        g.push(j);
        Ok(())
    }

    /// Forget the join of group `ip`, if any.
    pub fn join_forget(&self, ip: [u8; 16]) -> Option<McJoin> {
        let mut g = self.joins();
        let at = g.iter().position(|j| j.ip == ip)?;
        Some(g.remove(at))
    }

    /// The join of group `ip`, if any.
    pub fn join_find(&self, ip: [u8; 16]) -> Option<McJoin> {
        self.joins().iter().find(|j| j.ip == ip).copied()
    }

    /// The id's channel.
    pub fn channel(&self) -> Res<&'static ShimEventChannel> {
        // SAFETY: id.channel is set by the shim to one of its live channels.
        unsafe { ShimEventChannel::from_c(self.channel_ptr()) }
    }

    /// Attach the id to device `index` (librdmacm `ucma_get_device`): `verbs`, `pd`,
    /// `port_num`.
    pub fn attach_device(&self, index: u32) -> Res<()> {
        let _g = self.route_lock.lock().unwrap_or_else(|e| e.into_inner());
        if !self.cma_dev.load(Ordering::Acquire).is_null() {
            return Ok(());
        }
        let d = cma_device(index)?;
        let c = self.c();
        // SAFETY: route fields of our live id, written through the raw pointer under
        // `route_lock` by a call on the id or while its event is processed, before the event
        // is handed out (see "Threads"); `pd` is set only while still NULL, before any QP.
        unsafe {
            (*c).verbs = d.verbs;
            if (*c).pd.is_null() {
                (*c).pd = d.pd;
            }
            (*c).port_num = 1;
        }
        self.cma_dev.store((d as *const CmaDevice).cast_mut(), Ordering::Release);
        Ok(())
    }

    pub fn device(&self) -> Option<&'static CmaDevice> {
        // SAFETY: set only from `cma_device`, process lifetime.
        unsafe { self.cma_dev.load(Ordering::Acquire).as_ref() }
    }

    /// Record the source address (and keep the IB address in step).
    pub fn set_src(&self, a: &CmSockAddr) {
        // SAFETY: plain C data.
        let mut st: sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: a local sockaddr_storage.
        unsafe { write_sockaddr(&mut st, a) };
        let _g = self.route_lock.lock().unwrap_or_else(|e| e.into_inner());
        let r = self.c();
        // SAFETY: route fields of our live id, written through the raw pointer under
        // `route_lock`, by a call on the id or while its event is processed (see "Threads").
        // The union members are plain bytes.
        unsafe {
            std::ptr::addr_of_mut!((*r).route.addr.__bindgen_anon_1.src_storage).write(st);
            (*r).route.addr.addr.ibaddr.sgid.raw = a.ip;
            (*r).route.addr.addr.ibaddr.pkey = 0xffffu16.to_be();
        }
    }

    pub fn set_dst(&self, a: &CmSockAddr) {
        // SAFETY: plain C data.
        let mut st: sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: a local sockaddr_storage.
        unsafe { write_sockaddr(&mut st, a) };
        let _g = self.route_lock.lock().unwrap_or_else(|e| e.into_inner());
        let r = self.c();
        // SAFETY: as in `set_src`.
        unsafe {
            std::ptr::addr_of_mut!((*r).route.addr.__bindgen_anon_2.dst_storage).write(st);
            (*r).route.addr.addr.ibaddr.dgid.raw = a.ip;
        }
    }

    /// The route is resolved: one path record, as the kernel reports on RoCE.
    pub fn set_path(&self) -> Res<()> {
        let mtu = self.device().and_then(|d| {
            let c = client::existing().ok()?;
            // SAFETY: d.dev is one of our devices.
            let dev = unsafe { crate::device::ShimDevice::from_c(d.dev) }.ok()?;
            c.devices.get(dev.index as usize).map(|i| i.port.active_mtu)
        });
        let _g = self.route_lock.lock().unwrap_or_else(|e| e.into_inner());
        let c = self.c();
        let mut p = self.path_rec();
        if p.is_null() {
            // SAFETY: plain allocation, freed in destroy (free(3), as librdmacm).
            p = unsafe { libc::calloc(1, std::mem::size_of::<ibv_sa_path_rec>()) }.cast::<ibv_sa_path_rec>();
            if p.is_null() {
                return Err(Errno::NOMEM);
            }
            // SAFETY: a route field of our live id, written under `route_lock` (see "Threads").
            unsafe { (*c).route.path_rec = p };
        }
        // SAFETY: route fields of our live id read under `route_lock`; the union members are
        // plain bytes.
        let (sgid, dgid) = unsafe { ((*c).route.addr.addr.ibaddr.sgid, (*c).route.addr.addr.ibaddr.dgid) };
        // SAFETY: the id's path record (allocated above or earlier, owned by the id), which the
        // application reads only after the event or call that set it.
        let mut rec = unsafe { p.read() };
        rec.sgid = sgid;
        rec.dgid = dgid;
        rec.pkey = 0xffffu16.to_be();
        rec.numb_path = 1;
        rec.reversible = 1;
        rec.hop_limit = 64;
        rec.mtu_selector = 2; // exactly
        rec.mtu = mtu.unwrap_or(IBV_MTU_1024) as u8;
        rec.rate_selector = 2;
        rec.rate = 0; // not reported
        rec.packet_life_time_selector = 2;
        rec.packet_life_time = 16; // CMA_IBOE_PACKET_LIFETIME
        // SAFETY: as the read above; then a route field of our live id, under `route_lock`.
        unsafe {
            p.write(rec);
            (*c).route.num_paths = 1;
        }
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

    /// The event-reading thread and an application thread use one id at once, each through
    /// `&ShimId` (as `rdma_get_cm_event` on one thread and calls on another do): joins
    /// recorded and forgotten by both, route fields written by one while the other writes
    /// call fields; every value is seen by the other thread afterwards.
    #[test]
    fn one_id_used_by_two_threads() {
        let group = |t: u8, n: u8| {
            let mut ip = [0u8; 16];
            ip[10] = 0xff;
            ip[11] = 0xff;
            ip[12] = 224;
            ip[13] = t;
            ip[15] = n;
            ip
        };
        let shared = group(9, 9);
        let p = ShimId::new(std::ptr::null_mut(), std::ptr::null_mut(), RDMA_PS_UDP, IBV_QPT_UD, 7, false).into_c();
        // SAFETY: just made, destroyed at the end of the test.
        let id = unsafe { ShimId::from_id(p) }.unwrap();
        let qp = std::ptr::NonNull::<ibv_qp>::dangling().as_ptr();
        let results = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2u8)
                .map(|t| {
                    // Each thread holds `&ShimId` (what `from_id` gives every caller).
                    s.spawn(move || {
                        for n in 0..50u8 {
                            id.join_record(McJoin { ip: group(t, n), context: std::ptr::without_provenance_mut(usize::from(n) + 1), send_only: t == 1 }).unwrap();
                        }
                        let won = id.join_record(McJoin { ip: shared, context: std::ptr::null_mut(), send_only: false });
                        for n in (0..50u8).step_by(2) {
                            let j = id.join_forget(group(t, n)).expect("recorded by this thread");
                            assert_eq!((j.context as usize, j.send_only), (usize::from(n) + 1, t == 1));
                        }
                        if t == 0 {
                            // The thread reading events: route fields and its own state.
                            id.set_src(&CmSockAddr { ip: group(1, 2), v6: false, port: 7471 });
                            id.set_dst(&CmSockAddr { ip: group(1, 3), v6: false, port: 7472 });
                            id.set_connect_error();
                        } else {
                            // The application inside a call: call fields and the depths.
                            id.set_qp(std::ptr::NonNull::<ibv_qp>::dangling().as_ptr());
                            id.set_depths(3, 4);
                        }
                        won
                    })
                })
                .collect();
            threads.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        });
        // Exactly one thread recorded the group both joined; the other got EADDRINUSE.
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
        assert!(results.contains(&Err(Errno(libc::EADDRINUSE))));
        assert!(id.join_find(shared).is_some());
        for t in 0..2u8 {
            for n in 0..50u8 {
                let j = id.join_find(group(t, n));
                assert_eq!(j.map(|j| (j.context as usize, j.send_only)), (n % 2 == 1).then_some((usize::from(n) + 1, t == 1)));
            }
        }
        assert_eq!(id.join_forget(group(0, 0)).map(|j| j.ip), None);
        assert_eq!((id.qp(), id.initiator_depth(), id.responder_resources(), id.connect_error()), (qp, 3, 4, true));
        assert_eq!((port_of_storage(&id.src_storage()), port_of_storage(&id.dst_storage())), (7471, 7472));
        // SAFETY: route fields, no other thread left.
        assert_eq!(unsafe { ((*id.c()).route.addr.addr.ibaddr.sgid.raw, (*id.c()).route.addr.addr.ibaddr.dgid.raw) }, (group(1, 2), group(1, 3)));
        // The C struct is the one the application holds.
        assert_eq!(id.c(), p);
        // SAFETY: the id made above; nothing uses it any more.
        drop(unsafe { ShimId::take(p) });
    }

    /// An event being built holds its id ([`ids_hold`]): a destroy that removed the id from
    /// the map and waits (as `rdma_destroy_id` does) ends only after the hold is given up, a
    /// delivered hold ends with the event's ack, and an id out of the map cannot be held.
    #[test]
    fn an_event_being_built_holds_its_id_against_destroy() {
        const H: u32 = 0x7fff_0001;
        let p = ShimId::new(std::ptr::null_mut(), std::ptr::null_mut(), RDMA_PS_TCP, IBV_QPT_RC, H, false).into_c();
        ids_insert(H, p.cast());
        // SAFETY: just made, freed at the end of the test.
        let id = unsafe { ShimId::from_id(p) }.unwrap();
        let counts = || {
            let g = id.events.lock().unwrap();
            (g.delivered, g.acked)
        };
        // Built, then not an event after all: as if delivered and acknowledged.
        drop(ids_hold(H).expect("registered"));
        assert_eq!(counts(), (1, 1));
        // Delivered: held until the ack (here done by hand as `ack` does).
        let owner = ids_hold(H).unwrap().deliver();
        assert_eq!((owner, counts()), (p.cast_const().cast(), (2, 1)));
        let held = ids_hold(H).unwrap();
        let destroyed = std::thread::scope(|s| {
            let d = s.spawn(|| {
                // `rdma_destroy_id`: out of the map first, then wait for every held event.
                ids_remove(H);
                let mut g = id.events.lock().unwrap();
                while g.acked < g.delivered {
                    g = id.events_cv.wait(g).unwrap();
                }
                (g.delivered, g.acked)
            });
            // The event thread finishes building one event and gives the other up; the
            // application acknowledges the delivered one. Only then can the destroy go on.
            drop(held);
            id.events.lock().unwrap().acked += 1;
            id.events_cv.notify_all();
            d.join().unwrap()
        });
        assert_eq!(destroyed, (3, 3));
        assert!(ids_hold(H).is_none(), "a removed id cannot be held");
        assert_eq!(counts(), (3, 3));
        // SAFETY: the id made above; nothing uses it any more.
        drop(unsafe { ShimId::take(p) });
    }

    fn port_of_storage(st: &sockaddr_storage) -> u16 {
        // SAFETY: an AF_INET address in a sockaddr_storage (write_sockaddr of a v4 address).
        u16::from_be(unsafe { (*(st as *const sockaddr_storage).cast::<libc::sockaddr_in>()).sin_port })
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
