//! Asynchronous events. The lcores queue a client's events in the service and signal the
//! client's async-event eventfd (handed over in `Hello`); every context's `async_fd` is a
//! duplicate of it, so it is readable while an event may be pending and epoll/poll/select
//! event loops work (UCX's async thread, libfabric's). `ibv_get_async_event` consumes the
//! eventfd's count, fetches one event with `GetAsyncEvent`, and after handing one out signals
//! the eventfd again (more may be queued): readiness never gets lost, at the price of at most
//! one wake-up that finds nothing (EAGAIN on a non-blocking `async_fd`, as the kernel's).
//! Blocking calls wait in poll(2) on the fd (100 ms slices, to notice a dead service). Object
//! events carry the application's pointer for the QP/CQ/SRQ the service names ([`crate::registry`]).
use crate::boundary::{cancel, ffi_boundary, nonnull, ret_minus1, Errno};
use crate::client;
use crate::device::ShimContext;
use crate::sys::*;
use pmrxe_abi::ctrl::{Request, Response};

/// Blocks in poll(2) on `async_fd` (100 ms slices), a cancellation point as libibverbs'
/// read(2) is (see [`crate::boundary::cancel`]).
///
/// # Safety
/// `context` ours, `event` writable.
#[no_mangle]
pub unsafe extern "C-unwind" fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> std::os::raw::c_int {
    loop {
        // SAFETY: caller contract, forwarded.
        let step = ffi_boundary(Err(-1), || cancel::no_cancel(|| unsafe { async_event_step(context, event) }));
        match step {
            Err(r) => return r,
            Ok(fd) => cancel::wait_readable(fd, 100),
        }
    }
}

/// `ibv_get_async_event` without blocking: `Err(return value)` when done (errno set), or
/// `Ok(fd)` to wait on before trying again.
///
/// # Safety
/// As `ibv_get_async_event`.
unsafe fn async_event_step(context: *mut ibv_context, event: *mut ibv_async_event) -> Result<std::os::raw::c_int, std::os::raw::c_int> {
    let r = (|| {
        // SAFETY: magic-checked; caller-provided out pointer.
        let (c, ev) = unsafe { (ShimContext::from_ctx(context)?, nonnull(event)?) };
        let fd = c.async_fd();
        // SAFETY: fcntl on our own fd.
        let nonblock = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
        loop {
            let cl = client::existing()?;
            if cl.is_dead() || cl.service_down() {
                if !cl.fatal_reported.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    // SAFETY: plain C data.
                    *ev = unsafe { std::mem::zeroed() };
                    ev.event_type = IBV_EVENT_DEVICE_FATAL;
                    return Ok(None);
                }
                return Err(Errno::IO);
            }
            // Consume the readiness first: an event queued after this point signals again.
            drain(fd);
            let r = match cl.call(&Request::GetAsyncEvent, &[]) {
                Ok((r, _)) => r,
                Err(_) if { let _ = cl.dead_after_empty_poll(); true } => {
                    // The control socket failed: the service is gone.
                    if !cl.fatal_reported.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        // SAFETY: plain C data.
                        *ev = unsafe { std::mem::zeroed() };
                        ev.event_type = IBV_EVENT_DEVICE_FATAL;
                        return Ok(None);
                    }
                    return Err(Errno::IO);
                }
                Err(e) => return Err(e),
            };
            let Response::AsyncEvent(e) = r else { return Err(Errno(libc::EPROTO)) };
            if let Some(e) = e {
                // Others may be queued behind it: stay readable until a call finds none.
                signal(fd);
                use crate::registry::{get, Kind};
                // An event of an object the application already destroyed is dropped, as
                // the kernel drops a destroyed uobject's pending events: handing out a NULL
                // element crashes consumers (UCX reads event.element.qp->qp_num).
                let element = match e.event_type {
                    IBV_EVENT_CQ_ERR => get(Kind::Cq, e.element).map(|cq| ibv_async_event__bindgen_ty_1 { cq }),
                    IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR | IBV_EVENT_COMM_EST
                    | IBV_EVENT_SQ_DRAINED | IBV_EVENT_PATH_MIG | IBV_EVENT_PATH_MIG_ERR | IBV_EVENT_QP_LAST_WQE_REACHED => {
                        get(Kind::Qp, e.element).map(|qp| ibv_async_event__bindgen_ty_1 { qp })
                    }
                    IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => {
                        get(Kind::Srq, e.element).map(|srq| ibv_async_event__bindgen_ty_1 { srq })
                    }
                    _ => Some(ibv_async_event__bindgen_ty_1 { port_num: e.element as i32 }),
                };
                let Some(element) = element else { continue };
                // SAFETY: plain C data.
                *ev = unsafe { std::mem::zeroed() };
                ev.event_type = e.event_type;
                ev.element = element;
                return Ok(None);
            }
            if nonblock {
                return Err(Errno::AGAIN);
            }
            return Ok(Some(fd));
        }
    })();
    match r {
        Ok(Some(fd)) => Ok(fd),
        Ok(None) => Err(0),
        Err(e) => Err(ret_minus1(Err(e))),
    }
}

/// Wait until `fd` is readable or `ms` milliseconds passed.
fn wait_readable(fd: std::os::raw::c_int, ms: std::os::raw::c_int) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// Reset the eventfd's count if it is readable. Only a second thread draining the same
/// context between the poll and the read could make this read wait (for the next event);
/// applications read async events from one thread.
fn drain(fd: std::os::raw::c_int) {
    if wait_readable(fd, 0) {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a local u64 from the context's eventfd; it was readable.
        unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    }
}

/// Make `fd` readable (add 1 to the eventfd's count).
fn signal(fd: std::os::raw::c_int) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes from a local to the context's eventfd.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// # Safety
/// `event` came from `ibv_get_async_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}

