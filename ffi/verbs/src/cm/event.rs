//! `rdma_get_cm_event`, `rdma_ack_cm_event`, `rdma_event_str`, and librdmacm's
//! `ucma_complete` (how a synchronous id waits for its event).
use super::{channel, ids_hold, ids_insert, ShimEventChannel, ShimId};
use crate::boundary::{cancel, ffi_boundary, handle, set_errno, Errno, Handle, Res};
use crate::pd::ah_attr_to_c;
use crate::sys::*;
use pmrxe_abi::ctrl::{CmConnParam, CmEventMsg, CmUdParam, CM_EVENT_CONNECT_RESPONSE};
use std::os::raw::{c_char, c_int};

/// An event handed to the application: the C struct, then the memory its `param` points
/// into (valid until `rdma_ack_cm_event`).
#[repr(C)]
pub struct ShimEvent {
    pub ev: rdma_cm_event,
    magic: u64,
    /// The id whose acknowledged-event count this event belongs to (the listener for
    /// CONNECT_REQUEST, as librdmacm). Only ever used as `&ShimId`.
    owner: *const ShimId,
    private_data: Vec<u8>,
}
handle!(ShimEvent, rdma_cm_event, 0x504d_5845_4345_5654);

/// `rdma_conn_param` of an event; the private data pointer is filled by the caller.
pub fn conn_to_c(c: &CmConnParam) -> rdma_conn_param {
    rdma_conn_param {
        private_data: std::ptr::null(),
        private_data_len: c.private_data.len().min(super::MAX_PRIVATE_DATA).min(255) as u8,
        responder_resources: c.responder_resources,
        initiator_depth: c.initiator_depth,
        flow_control: c.flow_control,
        retry_count: c.retry_count,
        rnr_retry_count: c.rnr_retry_count,
        srq: c.srq,
        qp_num: c.qp_num,
    }
}

/// `rdma_ud_param` of an event (private data pointer filled by the caller).
pub fn ud_to_c(u: &CmUdParam) -> rdma_ud_param {
    rdma_ud_param {
        private_data: std::ptr::null(),
        private_data_len: u.private_data.len().min(255) as u8,
        ah_attr: ah_attr_to_c(&u.ah_attr),
        qp_num: u.qp_num,
        qkey: u.qkey,
    }
}

/// Build the C event for `msg` on `id` (no side effects): `ud` selects the param member.
pub(crate) fn build(msg: &CmEventMsg, id: *mut rdma_cm_id, listen_id: *mut rdma_cm_id, event: u32, ud: bool) -> Box<ShimEvent> {
    // SAFETY: rdma_cm_event is plain C data.
    let mut ev: rdma_cm_event = unsafe { std::mem::zeroed() };
    ev.id = id;
    ev.listen_id = listen_id;
    ev.event = event;
    ev.status = msg.status;
    let mut private_data;
    if ud {
        let u = msg.ud.clone().unwrap_or_else(|| CmUdParam { private_data: msg.conn.private_data.clone(), ..Default::default() });
        ev.param.ud = ud_to_c(&u);
        private_data = u.private_data;
        private_data.truncate(255);
    } else {
        ev.param.conn = conn_to_c(&msg.conn);
        private_data = msg.conn.private_data.clone();
        private_data.truncate(255);
    }
    let mut b = Box::new(ShimEvent { ev, magic: <ShimEvent as Handle>::MAGIC, owner: std::ptr::null(), private_data });
    if !b.private_data.is_empty() {
        let p = b.private_data.as_ptr().cast();
        // Writing a Copy field of a union member is safe; it is the member filled above.
        if ud {
            b.ev.param.ud.private_data = p;
        } else {
            b.ev.param.conn.private_data = p;
        }
    }
    b
}

/// Is the id's QP type datagram (librdmacm `ucma_is_ud_qp`)?
pub fn is_ud(qp_type: u32) -> bool {
    qp_type == IBV_QPT_UD
}

/// What one message becomes: an event for the application, or nothing (read the next).
fn process(msg: CmEventMsg) -> Res<Option<Box<ShimEvent>>> {
    let ev = msg.event;
    if ev == RDMA_CM_EVENT_CONNECT_REQUEST {
        let Some(held) = msg.listen_id.and_then(ids_hold) else { return Ok(None) };
        // The listener is shared with the application's threads: only ever `&ShimId`.
        let listener = held.id();
        let sync = listener.is_sync();
        let new = ShimId::new(listener.channel_ptr(), listener.context(), listener.ps(), listener.qp_type(), msg.id, false);
        if let Some(d) = msg.device {
            new.attach_device(d)?;
        }
        new.set_src(&msg.src);
        new.set_dst(&msg.dst);
        new.set_path()?;
        new.set_depths(msg.conn.initiator_depth, msg.conn.responder_resources);
        let np: *mut rdma_cm_id = new.into_c();
        ids_insert(msg.id, np.cast());
        if sync {
            // A synchronous listener's requests get their own channel (librdmacm
            // ucma_process_conn_req).
            // SAFETY: `np` is the id made just above (live, not handed out yet).
            if let Err(e) = unsafe { ShimId::from_id(np) }.and_then(|n| super::id::migrate(n, std::ptr::null_mut())) {
                // SAFETY: as above; the service forgets it on destroy.
                let _ = super::id::destroy(np);
                return Err(e);
            }
        }
        let mut e = build(&msg, np, listener.c(), ev, is_ud(listener.qp_type()));
        e.owner = held.deliver();
        return Ok(Some(e));
    }
    let Some(held) = ids_hold(msg.id) else { return Ok(None) };
    // The application may be using the id on another thread meanwhile: only ever `&ShimId`.
    let id = held.id();
    let ud = is_ud(id.qp_type());
    if let Some(d) = msg.device {
        id.attach_device(d)?;
    }
    let mut event = ev;
    let mut status = msg.status;
    let mut join_context: *mut std::os::raw::c_void = std::ptr::null_mut();
    match ev {
        RDMA_CM_EVENT_ADDR_RESOLVED | RDMA_CM_EVENT_ROUTE_RESOLVED => {
            id.set_src(&msg.src);
            id.set_dst(&msg.dst);
            if ev == RDMA_CM_EVENT_ROUTE_RESOLVED && status == 0 {
                id.set_path()?;
            }
            if ev == RDMA_CM_EVENT_ADDR_RESOLVED && id.device().is_none() && status == 0 {
                event = RDMA_CM_EVENT_ADDR_ERROR;
                status = -libc::ENODEV;
            }
        }
        CM_EVENT_CONNECT_RESPONSE => {
            if id.qp().is_null() {
                // QP-less id: the application moves its QP and calls rdma_establish.
                event = RDMA_CM_EVENT_CONNECT_RESPONSE;
            } else {
                match super::id::process_conn_resp(id) {
                    Ok(()) => event = RDMA_CM_EVENT_ESTABLISHED,
                    Err(Errno(e)) => {
                        event = RDMA_CM_EVENT_CONNECT_ERROR;
                        status = -e;
                        id.set_connect_error();
                    }
                }
            }
        }
        RDMA_CM_EVENT_REJECTED | RDMA_CM_EVENT_DISCONNECTED if id.connect_error() => return Ok(None),
        RDMA_CM_EVENT_REJECTED => super::id::modify_qp_err(id),
        RDMA_CM_EVENT_MULTICAST_JOIN => {
            // librdmacm `ucma_process_join`: the id's QP joins the group now (unless it joined
            // send-only); a refusal becomes MULTICAST_ERROR.
            let Some(j) = id.join_find(msg.dst.ip) else { return Ok(None) };
            join_context = j.context;
            let qp = id.qp();
            if !qp.is_null() && !j.send_only {
                if let Err(Errno(e)) = crate::device::mcast_qp(qp, j.ip, true) {
                    event = RDMA_CM_EVENT_MULTICAST_ERROR;
                    status = -e;
                }
            }
        }
        RDMA_CM_EVENT_ESTABLISHED if !ud && (msg.dst.port != 0 || msg.dst.ip != [0; 16]) => id.set_dst(&msg.dst),
        _ => {}
    }
    let mut e = build(&msg, id.c(), std::ptr::null_mut(), event, ud);
    e.ev.status = status;
    if ev == RDMA_CM_EVENT_MULTICAST_JOIN {
        e.ev.param.ud.private_data = join_context;
    }
    e.owner = held.deliver();
    Ok(Some(e))
}

/// What one non-blocking attempt to read a channel found.
pub(crate) enum GetStep {
    /// An event for the application.
    Event(*mut rdma_cm_event),
    /// Nothing yet on a blocking channel: wait until `fd` is readable, then try again.
    Wait(c_int),
}

/// `rdma_get_cm_event` without blocking on a blocking channel (a non-blocking one gives
/// EAGAIN as librdmacm's read does).
pub(crate) fn get_step(channel: *mut rdma_event_channel) -> Res<GetStep> {
    // SAFETY: magic-checked channel (the application's).
    let ch = unsafe { ShimEventChannel::from_c(channel) }?;
    let fd = ch.ch.fd;
    // SAFETY: fcntl on the channel's fd.
    let nonblock = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    loop {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        if !nonblock && unsafe { libc::poll(&mut p, 1, 0) } <= 0 {
            return Ok(GetStep::Wait(fd));
        }
        let msg = channel::recv_event(fd)?;
        if msg.event == RDMA_CM_EVENT_CONNECT_REQUEST {
            // The listener's backlog slot is free once the request is read (kernel ucma).
            channel::ack_request(fd, msg.id);
        }
        if let Some(e) = process(msg)? {
            // Counted as delivered when its id was held (process); its ack ends the hold.
            return Ok(GetStep::Event(e.into_c()));
        }
    }
}

/// `rdma_get_cm_event` on a channel, blocking (the shim's own waits: synchronous ids).
pub(crate) fn get(channel: *mut rdma_event_channel) -> Res<*mut rdma_cm_event> {
    loop {
        match get_step(channel)? {
            GetStep::Event(e) => return Ok(e),
            GetStep::Wait(fd) => {
                let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, -1) };
            }
        }
    }
}

/// `rdma_ack_cm_event`.
pub(crate) fn ack(event: *mut rdma_cm_event) -> Res<()> {
    // SAFETY: magic-checked event.
    unsafe { ShimEvent::from_c(event) }?;
    // SAFETY: validated; the application gives it up.
    let e = unsafe { ShimEvent::take(event) };
    // SAFETY: the owner waits for this ack before it is freed.
    if let Some(o) = unsafe { e.owner.as_ref() } {
        o.ack_one();
    }
    Ok(())
}

/// librdmacm `ucma_complete`: a synchronous id waits for its next event and keeps it in
/// `id->event`; a failed event becomes the call's error.
///
/// Runs on the thread inside a call on the id: a synchronous id's `event` and `channel` are
/// call fields no other thread writes (its private channel is read by nobody else).
pub fn complete(id: &ShimId) -> Res<()> {
    if !id.is_sync() {
        return Ok(());
    }
    if !id.event().is_null() {
        ack(id.event())?;
        id.set_event(std::ptr::null_mut());
    }
    let e = get(id.channel_ptr())?;
    id.set_event(e);
    // SAFETY: just made by `get`.
    let (ev, status) = unsafe { ((*e).event, (*e).status) };
    if status != 0 {
        return Err(Errno(if ev == RDMA_CM_EVENT_REJECTED {
            libc::ECONNREFUSED
        } else if status < 0 {
            -status
        } else {
            status
        }));
    }
    Ok(())
}

/// Blocks in recv(2) on the channel's socket, a cancellation point as librdmacm's read(2)
/// (see [`crate::boundary::cancel`]).
///
/// # Safety
/// `channel` is ours; `event` writable.
#[no_mangle]
pub unsafe extern "C-unwind" fn rdma_get_cm_event(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int {
    // SAFETY: the application's channel pointer (magic-checked inside).
    if let Err(r) = ffi_boundary(Err(-1), || unsafe { channel::enter(channel) }.map_err(|e| super::ret(Err(e)))) {
        return r;
    }
    // SAFETY: after a successful enter, on every way out (a cancellation skips it: the
    // channel then stays allocated).
    let leave = || ffi_boundary((), || unsafe { channel::leave(channel) });
    loop {
        let step = ffi_boundary(Err(-1), || {
            cancel::no_cancel(|| {
                if event.is_null() {
                    return Err(super::ret(Err(Errno::INVAL)));
                }
                match get_step(channel) {
                    Ok(GetStep::Event(e)) => {
                        // SAFETY: checked non-NULL; caller's out pointer.
                        unsafe { *event = e };
                        Err(0)
                    }
                    Ok(GetStep::Wait(fd)) => Ok(fd),
                    Err(e) => Err(super::ret(Err(e))),
                }
            })
        });
        match step {
            Err(r) => {
                let e = Errno::last();
                leave();
                set_errno(e.0);
                return r;
            }
            Ok(fd) => {
                if let Err(e) = cancel::wait_datagram(fd) {
                    leave();
                    set_errno(e);
                    return -1;
                }
            }
        }
    }
}

/// # Safety
/// `event` came from `rdma_get_cm_event` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    ffi_boundary(-1, || super::ret(ack(event)))
}

/// The names librdmacm prints.
pub fn event_name(e: u32) -> &'static std::ffi::CStr {
    match e {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    }
}

#[no_mangle]
pub extern "C" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    event_name(event).as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmrxe_abi::ctrl::AhAttr;

    #[test]
    fn conn_event_points_into_owned_private_data() {
        let msg = CmEventMsg {
            event: RDMA_CM_EVENT_ESTABLISHED,
            status: 0,
            conn: CmConnParam { private_data: vec![1, 2, 3, 4], responder_resources: 4, initiator_depth: 2, retry_count: 7, rnr_retry_count: 6, qp_num: 0x11, ..Default::default() },
            ..Default::default()
        };
        let e = build(&msg, std::ptr::null_mut(), std::ptr::null_mut(), msg.event, false);
        // SAFETY: `conn` is the member `build` filled.
        let c = unsafe { e.ev.param.conn };
        assert_eq!(c.private_data_len, 4);
        // SAFETY: points into the event's own buffer of 4 bytes.
        assert_eq!(unsafe { std::slice::from_raw_parts(c.private_data.cast::<u8>(), 4) }, &[1, 2, 3, 4]);
        assert_eq!((c.responder_resources, c.initiator_depth, c.retry_count, c.rnr_retry_count, c.qp_num), (4, 2, 7, 6, 0x11));
        assert_eq!(e.ev.event, RDMA_CM_EVENT_ESTABLISHED);
    }

    #[test]
    fn ud_event_carries_ah_qpn_qkey_and_no_data_is_null() {
        let mut ah = AhAttr { is_global: true, hop_limit: 64, sgid_index: 1, port_num: 1, ..Default::default() };
        ah.dgid[15] = 9;
        let msg = CmEventMsg {
            event: RDMA_CM_EVENT_ESTABLISHED,
            ud: Some(CmUdParam { private_data: vec![], ah_attr: ah, qp_num: 0x42, qkey: RDMA_UDP_QKEY }),
            ..Default::default()
        };
        let e = build(&msg, std::ptr::null_mut(), std::ptr::null_mut(), msg.event, true);
        // SAFETY: `ud` is the member `build` filled.
        let u = unsafe { e.ev.param.ud };
        assert!(u.private_data.is_null());
        assert_eq!((u.qp_num, u.qkey, u.ah_attr.is_global, u.ah_attr.grh.hop_limit, u.ah_attr.port_num), (0x42, RDMA_UDP_QKEY, 1, 64, 1));
        // SAFETY: plain bytes.
        assert_eq!(unsafe { u.ah_attr.grh.dgid.raw[15] }, 9);
    }

    #[test]
    fn event_strings_match_librdmacm() {
        assert_eq!(event_name(RDMA_CM_EVENT_ESTABLISHED).to_str().unwrap(), "RDMA_CM_EVENT_ESTABLISHED");
        assert_eq!(event_name(RDMA_CM_EVENT_TIMEWAIT_EXIT).to_str().unwrap(), "RDMA_CM_EVENT_TIMEWAIT_EXIT");
        assert_eq!(event_name(77).to_str().unwrap(), "UNKNOWN EVENT");
    }
}
