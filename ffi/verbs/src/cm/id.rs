//! `rdma_cm_id` life cycle and the connection calls, with librdmacm's semantics (cma.c).
use super::event::{ack, complete, is_ud};
use super::{call_ok, channel, ids_insert, ids_remove, read_sockaddr, ret, McJoin, ShimEventChannel, ShimId};
use crate::boundary::{ffi_boundary, Errno, Handle, Res};
use crate::client::client;
use crate::sys::*;
use pmrxe_abi::ctrl::{CmConnParam, Request, Response};
use std::os::raw::{c_int, c_void};

const MAX_RESP_RES: u8 = RDMA_MAX_RESP_RES as u8;
const MAX_INIT_DEPTH: u8 = RDMA_MAX_INIT_DEPTH as u8;

/// librdmacm `rdma_create_id2`: `channel` NULL makes a synchronous id with a private channel.
pub(crate) fn create(channel: *mut rdma_event_channel, context: *mut c_void, ps: rdma_port_space, qp_type: ibv_qp_type) -> Res<*mut rdma_cm_id> {
    let sync = channel.is_null();
    let channel = if sync { channel::create()? } else { channel };
    let r = (|| {
        // SAFETY: magic-checked (the application's channel, or ours).
        let ch = unsafe { ShimEventChannel::from_c(channel) }?;
        let (r, _) = client()?.call(&Request::CmCreateId { channel: ch.handle, ps: ps as u16, qp_type, context: context as u64 }, &[])?;
        let Response::CmId { id } = r else { return Err(Errno(libc::EPROTO)) };
        let p = ShimId::new(channel, context, ps, qp_type, id, sync).into_c();
        ids_insert(id, p.cast());
        Ok(p)
    })();
    if r.is_err() && sync {
        // SAFETY: the private channel made above, used by nobody.
        unsafe { channel::rdma_destroy_event_channel(channel) };
    }
    r
}

/// `rdma_destroy_id`: the service forgets the id (sending REJ/DREQ as needed), then we wait
/// until the application acknowledged every event of it.
pub(crate) fn destroy(p: *mut rdma_cm_id) -> Res<()> {
    // SAFETY: magic-checked.
    let id = unsafe { ShimId::from_id(p) }?;
    match call_ok(&Request::CmDestroyId { id: id.handle }) {
        // Unknown to the service (it stopped, or already dropped it): free our side anyway.
        Ok(()) | Err(Errno(libc::ENOENT | libc::EINVAL | libc::ENODEV | libc::ECONNRESET | libc::EPIPE)) => {}
        Err(e) => return Err(e),
    }
    ids_remove(id.handle);
    if !id.event().is_null() {
        let _ = ack(id.event());
        id.set_event(std::ptr::null_mut());
    }
    {
        let mut g = id.events.lock().unwrap_or_else(|e| e.into_inner());
        while g.acked < g.delivered {
            g = id.events_cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
    // SAFETY: allocated with calloc/malloc (set_path, create_ep) and owned by the id; every
    // event of it is acknowledged, so no other thread uses it any more.
    unsafe {
        libc::free(id.path_rec().cast());
        libc::free(id.take_connect_data());
    }
    let (sync, ch) = (id.is_sync(), id.channel_ptr());
    // SAFETY: validated above; the application gives it up.
    drop(unsafe { ShimId::take(p) });
    if sync {
        // SAFETY: the id's private channel.
        unsafe { channel::rdma_destroy_event_channel(ch) };
    }
    Ok(())
}

/// `rdma_migrate_id` (NULL channel: a private one, the id becomes synchronous).
pub(crate) fn migrate(id: &ShimId, channel: *mut rdma_event_channel) -> Res<()> {
    if id.is_sync() && channel.is_null() {
        return Err(Errno::INVAL);
    }
    let sync = channel.is_null();
    let channel = if sync { channel::create()? } else { channel };
    let r = (|| {
        // SAFETY: magic-checked.
        let ch = unsafe { ShimEventChannel::from_c(channel) }?;
        call_ok(&Request::CmMigrateId { id: id.handle, channel: ch.handle })
    })();
    if let Err(e) = r {
        if sync {
            // SAFETY: made above, unused.
            unsafe { channel::rdma_destroy_event_channel(channel) };
        }
        return Err(e);
    }
    if id.is_sync() {
        if !id.event().is_null() {
            let _ = ack(id.event());
            id.set_event(std::ptr::null_mut());
        }
        // SAFETY: the id's old private channel.
        unsafe { channel::rdma_destroy_event_channel(id.channel_ptr()) };
    }
    id.set_sync(sync);
    id.set_channel_ptr(channel);
    Ok(())
}

fn addr_response(id: &ShimId, r: Response) -> Res<()> {
    let Response::CmAddr { addr, device } = r else { return Err(Errno(libc::EPROTO)) };
    id.set_src(&addr);
    if let Some(d) = device {
        id.attach_device(d)?;
    }
    Ok(())
}

/// `rdma_bind_addr`.
///
/// # Safety
/// `addr` is NULL or a socket address of its family's size.
pub unsafe fn bind(id: &ShimId, addr: *const sockaddr) -> Res<()> {
    // SAFETY: forwarded.
    let a = unsafe { read_sockaddr(addr) }?.ok_or(Errno::INVAL)?;
    let (r, _) = client()?.call(&Request::CmBindAddr { id: id.handle, addr: a }, &[])?;
    addr_response(id, r)
}

/// `rdma_resolve_addr`.
///
/// # Safety
/// `src`, `dst` NULL or socket addresses.
pub unsafe fn resolve_addr(id: &ShimId, src: *const sockaddr, dst: *const sockaddr, timeout_ms: c_int) -> Res<()> {
    // SAFETY: forwarded.
    let d = unsafe { read_sockaddr(dst) }?.ok_or(Errno::INVAL)?;
    // SAFETY: forwarded.
    let s = unsafe { read_sockaddr(src) }?;
    let (r, _) = client()?.call(&Request::CmResolveAddr { id: id.handle, src: s, dst: d, timeout_ms: timeout_ms.max(0) as u32 }, &[])?;
    addr_response(id, r)?;
    id.set_dst(&d);
    complete(id)
}

/// librdmacm `ucma_valid_param`.
fn valid_param(id: &ShimId, p: Option<&rdma_conn_param>) -> Res<()> {
    if id.ps() != RDMA_PS_TCP {
        return Ok(());
    }
    let Some(p) = p else {
        return if id.qp().is_null() { Err(Errno::INVAL) } else { Ok(()) };
    };
    if let Some(d) = id.device() {
        if p.responder_resources != MAX_RESP_RES && p.responder_resources > d.max_responder_resources {
            return Err(Errno::INVAL);
        }
        if p.initiator_depth != MAX_INIT_DEPTH && p.initiator_depth > d.max_initiator_depth {
            return Err(Errno::INVAL);
        }
    }
    Ok(())
}

/// librdmacm `ucma_copy_conn_param_to_kern`.
fn conn_to_service(id: &ShimId, p: Option<&rdma_conn_param>, qp_num: u32, srq: u8) -> CmConnParam {
    let mut c = CmConnParam {
        qp_num,
        srq,
        responder_resources: id.responder_resources(),
        initiator_depth: id.initiator_depth(),
        ..Default::default()
    };
    let (data, len) = id.connect_data();
    if len > 0 && !data.is_null() {
        // SAFETY: `connect` holds `connect_len` bytes (create_ep), freed only by a call on the
        // id (this thread's) or its destruction.
        c.private_data.extend_from_slice(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) });
    }
    match p {
        Some(p) => {
            c.flow_control = p.flow_control;
            c.retry_count = p.retry_count;
            c.rnr_retry_count = p.rnr_retry_count;
            if !p.private_data.is_null() && p.private_data_len > 0 {
                // SAFETY: the application's private data of the stated length.
                c.private_data.extend_from_slice(unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len as usize) });
            }
        }
        None => {
            c.retry_count = 7;
            c.rnr_retry_count = 7;
        }
    }
    c
}

fn qp_num_srq(id: &ShimId, p: Option<&rdma_conn_param>) -> (u32, u8) {
    // SAFETY: id.qp is NULL or our live QP (rdma_create_qp).
    match unsafe { id.qp().as_ref() } {
        Some(q) => (q.qp_num, u8::from(!q.srq.is_null())),
        None => p.map(|p| (p.qp_num, p.srq)).unwrap_or((0, 0)),
    }
}

/// The attributes for moving the id's QP to `state` (`rdma_init_qp_attr`).
pub fn init_qp_attr(id: &ShimId, state: u32) -> Res<(ibv_qp_attr, c_int)> {
    let (r, _) = client()?.call(&Request::CmInitQpAttr { id: id.handle, qp_state: state }, &[])?;
    let Response::CmQpAttr { attr, mask } = r else { return Err(Errno(libc::EPROTO)) };
    // SAFETY: plain C data.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    crate::qp::qp_attr_to_c(&attr, &mut a);
    Ok((a, mask as c_int))
}

fn modify(qp: *mut ibv_qp, a: &mut ibv_qp_attr, mask: c_int) -> Res<()> {
    // SAFETY: `qp` is the id's live QP; `a` is a valid attribute block.
    match unsafe { crate::qp::ibv_modify_qp(qp, a, mask) } {
        0 => Ok(()),
        e => Err(Errno(e)),
    }
}

/// librdmacm `ucma_modify_qp_rtr` (INIT again with the CM's attributes, then RTR).
pub fn modify_qp_rtr(id: &ShimId, resp_res: u8) -> Res<()> {
    let qp = id.qp();
    if qp.is_null() {
        return Ok(());
    }
    let (mut a, m) = init_qp_attr(id, IBV_QPS_INIT)?;
    modify(qp, &mut a, m)?;
    let (mut a, m) = init_qp_attr(id, IBV_QPS_RTR)?;
    if resp_res != MAX_RESP_RES {
        a.max_dest_rd_atomic = resp_res;
    }
    modify(qp, &mut a, m)
}

/// librdmacm `ucma_modify_qp_rts`.
pub fn modify_qp_rts(id: &ShimId, init_depth: u8) -> Res<()> {
    let qp = id.qp();
    if qp.is_null() {
        return Ok(());
    }
    let (mut a, m) = init_qp_attr(id, IBV_QPS_RTS)?;
    if init_depth != MAX_INIT_DEPTH {
        a.max_rd_atomic = init_depth;
    }
    modify(qp, &mut a, m)
}

/// librdmacm `ucma_modify_qp_err` (best effort).
pub fn modify_qp_err(id: &ShimId) {
    let qp = id.qp();
    if qp.is_null() {
        return;
    }
    // SAFETY: plain C data.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = IBV_QPS_ERR;
    let _ = modify(qp, &mut a, IBV_QP_STATE as c_int);
}

/// librdmacm `ucma_process_conn_resp`: RTR, RTS, then the RTU.
pub fn process_conn_resp(id: &ShimId) -> Res<()> {
    let r = modify_qp_rtr(id, MAX_RESP_RES).and_then(|_| modify_qp_rts(id, MAX_INIT_DEPTH)).and_then(|_| call_ok(&Request::CmEstablish { id: id.handle }));
    if r.is_err() {
        modify_qp_err(id);
    }
    r
}

/// `rdma_connect`.
pub fn connect(id: &ShimId, p: Option<&rdma_conn_param>) -> Res<()> {
    valid_param(id, p)?;
    let d = id.device();
    let initiator_depth = match p {
        Some(p) if p.initiator_depth != MAX_INIT_DEPTH => p.initiator_depth,
        _ => d.map(|d| d.max_initiator_depth).unwrap_or(0),
    };
    let responder_resources = match p {
        Some(p) if p.responder_resources != MAX_RESP_RES => p.responder_resources,
        _ => d.map(|d| d.max_responder_resources).unwrap_or(0),
    };
    id.set_depths(initiator_depth, responder_resources);
    let (qpn, srq) = qp_num_srq(id, p);
    let conn = conn_to_service(id, p, qpn, srq);
    call_ok(&Request::CmConnect { id: id.handle, qpn, conn })?;
    if id.connect_data().1 > 0 {
        // SAFETY: malloc'd by create_ep; taken out of the id, so freed once.
        unsafe { libc::free(id.take_connect_data()) };
    }
    complete(id)
}

/// `rdma_accept`.
pub fn accept(id: &ShimId, p: Option<&rdma_conn_param>) -> Res<()> {
    valid_param(id, p)?;
    let d = id.device();
    let initiator_depth = match p {
        Some(p) if p.initiator_depth != MAX_INIT_DEPTH => p.initiator_depth,
        _ => id.initiator_depth().min(d.map(|d| d.max_initiator_depth).unwrap_or(u8::MAX)),
    };
    let responder_resources = match p {
        Some(p) if p.responder_resources != MAX_RESP_RES => p.responder_resources,
        _ => id.responder_resources().min(d.map(|d| d.max_responder_resources).unwrap_or(u8::MAX)),
    };
    id.set_depths(initiator_depth, responder_resources);
    let ud = is_ud(id.qp_type());
    if !ud {
        modify_qp_rtr(id, responder_resources)?;
        modify_qp_rts(id, initiator_depth)?;
    }
    let (qpn, srq) = qp_num_srq(id, p);
    let conn = conn_to_service(id, p, qpn, srq);
    if let Err(e) = call_ok(&Request::CmAccept { id: id.handle, qpn, conn }) {
        modify_qp_err(id);
        return Err(e);
    }
    if ud {
        if id.is_sync() && !id.event().is_null() {
            let _ = ack(id.event());
            id.set_event(std::ptr::null_mut());
        }
        return Ok(());
    }
    complete(id)
}

/// `rdma_get_request` on a synchronous listener.
pub fn get_request(listen: &ShimId) -> Res<*mut rdma_cm_id> {
    if !listen.is_sync() {
        return Err(Errno::INVAL);
    }
    if !listen.event().is_null() {
        let _ = ack(listen.event());
        listen.set_event(std::ptr::null_mut());
    }
    let e = super::event::get(listen.channel_ptr())?;
    // SAFETY: just made by `get`.
    let ev = unsafe { &*e };
    let r = if ev.event == RDMA_CM_EVENT_REJECTED {
        Err(Errno(libc::ECONNREFUSED))
    } else if ev.status != 0 {
        Err(Errno(ev.status.unsigned_abs() as c_int))
    } else if ev.event != RDMA_CM_EVENT_CONNECT_REQUEST {
        Err(Errno::INVAL)
    } else if let Some(mut attr) = listen.qp_init_attr() {
        // SAFETY: ev.id is the new id the event made.
        super::qp::create_qp(unsafe { ShimId::from_id(ev.id) }?, listen.pd(), &mut attr)
    } else {
        Ok(())
    };
    if let Err(err) = r {
        listen.set_event(e);
        return Err(err);
    }
    // SAFETY: the event's new id.
    let new = unsafe { ShimId::from_id(ev.id) }?;
    new.set_event(e);
    Ok(ev.id)
}

fn port_of(st: &sockaddr_storage) -> u16 {
    let p = (st as *const sockaddr_storage).cast::<u8>();
    match c_int::from(st.ss_family) {
        // SAFETY: the storage holds an address of this family.
        libc::AF_INET => unsafe { (*p.cast::<libc::sockaddr_in>()).sin_port },
        // SAFETY: as above.
        libc::AF_INET6 => unsafe { (*p.cast::<libc::sockaddr_in6>()).sin6_port },
        _ => 0,
    }
}

// ---- exports ----

pub(crate) fn with_id(p: *mut rdma_cm_id, f: impl FnOnce(&ShimId) -> Res<()>) -> c_int {
    ffi_boundary(-1, || {
        // SAFETY: magic-checked.
        ret(unsafe { ShimId::from_id(p) }.and_then(f))
    })
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(channel: *mut rdma_event_channel, id: *mut *mut rdma_cm_id, context: *mut c_void, ps: rdma_port_space) -> c_int {
    ffi_boundary(-1, || {
        ret((|| {
            if id.is_null() {
                return Err(Errno::INVAL);
            }
            let qp_type = if ps == RDMA_PS_IPOIB || ps == RDMA_PS_UDP { IBV_QPT_UD } else { IBV_QPT_RC };
            let p = create(channel, context, ps, qp_type)?;
            // SAFETY: checked non-NULL.
            unsafe { *id = p };
            Ok(())
        })())
    })
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    ffi_boundary(-1, || ret(destroy(id)))
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    with_id(id, |i| migrate(i, channel))
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    // SAFETY: forwarded.
    with_id(id, |i| unsafe { bind(i, addr) })
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(id: *mut rdma_cm_id, src_addr: *mut sockaddr, dst_addr: *mut sockaddr, timeout_ms: c_int) -> c_int {
    // SAFETY: forwarded.
    with_id(id, |i| unsafe { resolve_addr(i, src_addr, dst_addr, timeout_ms) })
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    with_id(id, |i| {
        call_ok(&Request::CmResolveRoute { id: i.handle, timeout_ms: timeout_ms.max(0) as u32 })?;
        complete(i)
    })
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    with_id(id, |i| call_ok(&Request::CmListen { id: i.handle, backlog: backlog.max(0) as u32 }))
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    with_id(listen, |l| {
        if id.is_null() {
            return Err(Errno::INVAL);
        }
        let p = get_request(l)?;
        // SAFETY: checked non-NULL.
        unsafe { *id = p };
        Ok(())
    })
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
    // SAFETY: NULL or the application's parameters.
    with_id(id, |i| connect(i, unsafe { conn_param.as_ref() }))
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
    // SAFETY: NULL or the application's parameters.
    with_id(id, |i| accept(i, unsafe { conn_param.as_ref() }))
}

fn reject(id: &ShimId, data: *const c_void, len: u8) -> Res<()> {
    let private_data = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: the application's private data of the stated length.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len as usize) }.to_vec()
    };
    call_ok(&Request::CmReject { id: id.handle, private_data })
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, private_data_len: u8) -> c_int {
    with_id(id, |i| reject(i, private_data, private_data_len))
}

/// `rdma_reject_ece`: pmrxe has no ECE, so the REJ carries the private data and the usual
/// consumer-reject reason; `reason` is not sent.
///
/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(id: *mut rdma_cm_id, private_data: *const c_void, private_data_len: u8) -> c_int {
    with_id(id, |i| reject(i, private_data, private_data_len))
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    with_id(id, |i| {
        // ucma_shutdown: our devices are IBV_TRANSPORT_IB, so the QP goes to ERR first.
        modify_qp_err(i);
        call_ok(&Request::CmDisconnect { id: i.handle })?;
        complete(i)
    })
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    with_id(id, |i| {
        if !i.qp().is_null() {
            return Err(Errno::INVAL);
        }
        process_conn_resp(i)
    })
}

/// `rdma_notify`: IBV_EVENT_COMM_EST establishes the connection before the RTU arrives.
///
/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: ibv_event_type) -> c_int {
    with_id(id, |i| match event {
        IBV_EVENT_COMM_EST => call_ok(&Request::CmEstablish { id: i.handle }),
        _ => Err(Errno::INVAL),
    })
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(id: *mut rdma_cm_id, qp_attr: *mut ibv_qp_attr, qp_attr_mask: *mut c_int) -> c_int {
    with_id(id, |i| {
        if qp_attr.is_null() || qp_attr_mask.is_null() {
            return Err(Errno::INVAL);
        }
        // SAFETY: checked non-NULL; the application's buffers.
        let state = unsafe { (*qp_attr).qp_state };
        let (a, m) = init_qp_attr(i, state)?;
        // SAFETY: as above.
        unsafe {
            *qp_attr = a;
            *qp_attr_mask = m;
        }
        Ok(())
    })
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(id: *mut rdma_cm_id, level: c_int, optname: c_int, optval: *mut c_void, optlen: usize) -> c_int {
    with_id(id, |i| {
        if optval.is_null() && optlen > 0 {
            return Err(Errno::INVAL);
        }
        let value = if optlen == 0 {
            Vec::new()
        } else {
            // SAFETY: the application's option value of `optlen` bytes.
            unsafe { std::slice::from_raw_parts(optval.cast::<u8>(), optlen) }.to_vec()
        };
        call_ok(&Request::CmSetOption { id: i.handle, level, name: optname, value })
    })
}

/// # Safety
/// `id` is ours. Network byte order, as librdmacm.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    ffi_boundary(0, || {
        // SAFETY: magic-checked.
        unsafe { ShimId::from_id(id) }.map(|i| port_of(&i.src_storage())).unwrap_or(0)
    })
}

/// # Safety
/// `id` is ours. Network byte order, as librdmacm.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    ffi_boundary(0, || {
        // SAFETY: magic-checked.
        unsafe { ShimId::from_id(id) }.map(|i| port_of(&i.dst_storage())).unwrap_or(0)
    })
}

/// `rdma_create_ep` (librdmacm semantics: a synchronous id; passive: bind and remember the QP
/// attributes for `rdma_get_request`; active: resolve address and route, create the QP).
///
/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(id: *mut *mut rdma_cm_id, res: *mut rdma_addrinfo, pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> c_int {
    ffi_boundary(-1, || {
        ret((|| {
            if id.is_null() || res.is_null() {
                return Err(Errno::INVAL);
            }
            // SAFETY: checked non-NULL; the application's addrinfo.
            let res = unsafe { &*res };
            let p = create(std::ptr::null_mut(), std::ptr::null_mut(), res.ai_port_space as rdma_port_space, res.ai_qp_type as ibv_qp_type)?;
            // SAFETY: just made.
            let i = unsafe { ShimId::from_id(p) }?;
            let r = (|| {
                if res.ai_flags as u32 & RAI_PASSIVE != 0 {
                    // SAFETY: the addrinfo's source address.
                    unsafe { bind(i, res.ai_src_addr) }?;
                    if !pd.is_null() {
                        i.set_pd(pd);
                    }
                    // SAFETY: NULL or the application's attributes.
                    if let Some(qa) = unsafe { qp_init_attr.as_ref() } {
                        let mut a = *qa;
                        a.qp_type = res.ai_qp_type as ibv_qp_type;
                        i.set_qp_init_attr(Some(a));
                    }
                    return Ok(());
                }
                // SAFETY: the addrinfo's addresses.
                unsafe { resolve_addr(i, res.ai_src_addr, res.ai_dst_addr, 2000) }?;
                call_ok(&Request::CmResolveRoute { id: i.handle, timeout_ms: 2000 })?;
                complete(i)?;
                // SAFETY: NULL or the application's attributes.
                if let Some(qa) = unsafe { qp_init_attr.as_mut() } {
                    qa.qp_type = res.ai_qp_type as ibv_qp_type;
                    super::qp::create_qp(i, pd, qa)?;
                }
                if res.ai_connect_len > 0 && !res.ai_connect.is_null() {
                    // SAFETY: plain allocation, freed by connect or destroy.
                    let c = unsafe { libc::malloc(res.ai_connect_len) };
                    if c.is_null() {
                        return Err(Errno::NOMEM);
                    }
                    // SAFETY: both hold ai_connect_len bytes.
                    unsafe { std::ptr::copy_nonoverlapping(res.ai_connect.cast::<u8>(), c.cast::<u8>(), res.ai_connect_len) };
                    i.set_connect_data(c, res.ai_connect_len);
                }
                Ok(())
            })();
            if let Err(e) = r {
                let _ = destroy_ep(p);
                return Err(e);
            }
            // SAFETY: checked non-NULL.
            unsafe { *id = p };
            Ok(())
        })())
    })
}

fn destroy_ep(p: *mut rdma_cm_id) -> Res<()> {
    // SAFETY: magic-checked.
    let i = unsafe { ShimId::from_id(p) }?;
    if !i.qp().is_null() {
        super::qp::destroy_qp(i);
    }
    if !i.srq().is_null() {
        super::qp::destroy_srq(i);
    }
    i.set_qp_init_attr(None);
    destroy(p)
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    ffi_boundary((), || {
        let _ = destroy_ep(id);
    })
}

/// `rdma_join_multicast`: join the IPv4 group `addr` as a full member (the id's QP, if any,
/// is attached when MULTICAST_JOIN is read; `context` is that event's `param.ud.private_data`).
///
/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr, context: *mut c_void) -> c_int {
    // SAFETY: forwarded.
    with_id(id, |i| unsafe { join(i, addr, false, context) })
}

/// `rdma_join_multicast_ex`: as librdmacm, the address and the join flags must both be given;
/// RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER joins without attaching the QP.
///
/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(id: *mut rdma_cm_id, attr: *mut rdma_cm_join_mc_attr_ex, context: *mut c_void) -> c_int {
    with_id(id, |i| {
        // SAFETY: the caller's attribute struct, if not NULL.
        let a = unsafe { attr.as_ref() }.ok_or(Errno::INVAL)?;
        if a.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return Err(Errno(libc::EOPNOTSUPP));
        }
        if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0 || a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0 || a.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED {
            return Err(Errno::INVAL);
        }
        // SAFETY: forwarded.
        unsafe { join(i, a.addr, a.join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, context) }
    })
}

/// # Safety
/// `addr` is a readable sockaddr (or NULL).
unsafe fn join(i: &ShimId, addr: *const sockaddr, send_only: bool, context: *mut c_void) -> Res<()> {
    // SAFETY: forwarded.
    let a = unsafe { read_sockaddr(addr) }?.ok_or(Errno::INVAL)?;
    let ip = mapped_group(&a);
    // Recorded before the request: the event may be read by another thread as soon as the
    // service writes it.
    i.join_record(McJoin { ip, context, send_only })?;
    if let Err(e) = call_ok(&Request::CmJoinMulticast { id: i.handle, addr: a }) {
        i.join_forget(ip);
        return Err(e);
    }
    complete(i)
}

/// The group's address as the service keeps it: an IPv4 group (or IPv4-mapped IPv6) as
/// IPv4-mapped octets, which is also the group's GID.
fn mapped_group(a: &pmrxe_abi::ctrl::CmSockAddr) -> [u8; 16] {
    let v6 = std::net::Ipv6Addr::from(a.ip);
    v6.to_ipv4_mapped().map_or(a.ip, |v4| v4.to_ipv6_mapped().octets())
}

/// `rdma_leave_multicast`: the QP leaves the group (ibv_detach_mcast) and the id forgets it;
/// EADDRNOTAVAIL if the id did not join `addr`.
///
/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    with_id(id, |i| {
        // SAFETY: forwarded.
        let a = unsafe { read_sockaddr(addr) }?.ok_or(Errno::INVAL)?;
        let ip = mapped_group(&a);
        let Some(j) = i.join_forget(ip) else { return Err(Errno(libc::EADDRNOTAVAIL)) };
        if !i.qp().is_null() && !j.send_only {
            // EINVAL: the QP was never attached (the join event was not read yet).
            match crate::device::mcast_qp(i.qp(), ip, false) {
                Ok(()) | Err(Errno(libc::EINVAL)) => {}
                Err(e) => return Err(e),
            }
        }
        call_ok(&Request::CmLeaveMulticast { id: i.handle, addr: a })
    })
}

/// ECE (enhanced connection establishment) is not offered.
///
/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, _ece: *mut ibv_ece) -> c_int {
    with_id(id, |_| Err(Errno::OPNOTSUPP))
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, _ece: *mut ibv_ece) -> c_int {
    with_id(id, |_| Err(Errno::OPNOTSUPP))
}
