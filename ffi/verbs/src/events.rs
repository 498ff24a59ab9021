//! Asynchronous events. The context's `async_fd` is an eventfd of our own; events come from
//! the service through `GetAsyncEvent`, which `ibv_get_async_event` polls (every 10 ms while
//! blocking; immediately EAGAIN when the application made `async_fd` non-blocking). Object
//! events carry the application's pointer for the QP/CQ/SRQ the service names ([`crate::registry`]).
use crate::boundary::{ffi_boundary, nonnull, ret_minus1, Errno};
use crate::client;
use crate::device::ShimContext;
use crate::sys::*;
use pmrxe_abi::ctrl::{Request, Response};

/// # Safety
/// `context` ours, `event` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> std::os::raw::c_int {
    ffi_boundary(-1, || {
        ret_minus1((|| {
            // SAFETY: magic-checked; caller-provided out pointer.
            let (c, ev) = unsafe { (ShimContext::from_ctx(context)?, nonnull(event)?) };
            let fd = c.vctx.context.async_fd;
            // SAFETY: fcntl on our own fd.
            let nonblock = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
            loop {
                let cl = client::existing()?;
                if cl.is_dead() || cl.service_down() {
                    if !cl.fatal_reported.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        // SAFETY: plain C data.
                        *ev = unsafe { std::mem::zeroed() };
                        ev.event_type = IBV_EVENT_DEVICE_FATAL;
                        return Ok(());
                    }
                    return Err(Errno::IO);
                }
                let r = match cl.call(&Request::GetAsyncEvent, &[]) {
                    Ok((r, _)) => r,
                    Err(_) if { let _ = cl.dead_after_empty_poll(); true } => {
                        // The control socket failed: the service is gone.
                        if !cl.fatal_reported.swap(true, std::sync::atomic::Ordering::Relaxed) {
                            // SAFETY: plain C data.
                            *ev = unsafe { std::mem::zeroed() };
                            ev.event_type = IBV_EVENT_DEVICE_FATAL;
                            return Ok(());
                        }
                        return Err(Errno::IO);
                    }
                    Err(e) => return Err(e),
                };
                let Response::AsyncEvent(e) = r else { return Err(Errno(libc::EPROTO)) };
                if let Some(e) = e {
                    // SAFETY: plain C data.
                    *ev = unsafe { std::mem::zeroed() };
                    ev.event_type = e.event_type;
                    use crate::registry::{get, Kind};
                    match e.event_type {
                        IBV_EVENT_CQ_ERR => ev.element.cq = get(Kind::Cq, e.element).unwrap_or(std::ptr::null_mut()),
                        IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR | IBV_EVENT_COMM_EST
                        | IBV_EVENT_SQ_DRAINED | IBV_EVENT_PATH_MIG | IBV_EVENT_PATH_MIG_ERR | IBV_EVENT_QP_LAST_WQE_REACHED => {
                            ev.element.qp = get(Kind::Qp, e.element).unwrap_or(std::ptr::null_mut())
                        }
                        IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => {
                            ev.element.srq = get(Kind::Srq, e.element).unwrap_or(std::ptr::null_mut())
                        }
                        _ => ev.element.port_num = e.element as i32,
                    }
                    return Ok(());
                }
                if nonblock {
                    return Err(Errno::AGAIN);
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })())
    })
}

/// # Safety
/// `event` came from `ibv_get_async_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}

