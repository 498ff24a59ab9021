//! Event channels: `rdma_create_event_channel` / `rdma_destroy_event_channel`, and reading one
//! event message from a channel's socket.
use super::{ShimEventChannel, Handle};
use crate::boundary::{ffi_boundary, ret_ptr, Errno, Res};
use crate::client::client;
use crate::sys::*;
use pmrxe_abi::ctrl::{self, CmEventMsg, Request, Response};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};

/// A new channel (the service's event socket as `fd`).
pub fn create() -> Res<*mut rdma_event_channel> {
    let (r, mut fds) = client()?.call(&Request::CmOpenChannel, &[])?;
    let Response::CmChannel { channel } = r else { return Err(Errno(libc::EPROTO)) };
    if fds.is_empty() {
        return Err(Errno(libc::EPROTO));
    }
    let sock = fds.swap_remove(0);
    let ch = rdma_event_channel { fd: sock.as_raw_fd() };
    let b = Box::new(ShimEventChannel { ch, magic: <ShimEventChannel as Handle>::MAGIC, handle: channel, _sock: sock, users: AtomicU32::new(0) });
    Ok(b.into_c())
}

/// Read one event message from `fd`: blocks unless the fd is O_NONBLOCK (then EAGAIN).
pub fn recv_event(fd: i32) -> Res<CmEventMsg> {
    let mut buf = Vec::new();
    match ctrl::recv_msg(fd, &mut buf)? {
        // The service closed the channel (it stopped): no more events.
        None => Err(Errno::NODEV),
        Some(_) => Ok(ctrl::decode::<CmEventMsg>(&buf)?),
    }
}

/// Tell the service that the CONNECT_REQUEST of `id` was read from the channel `fd`
/// ([`ctrl::CmEventAck`]). Best effort and non-blocking: if it cannot be written, the
/// listener's backlog slot is released when the id is next named in a request.
pub fn ack_request(fd: i32, id: u32) {
    let Ok(bytes) = ctrl::encode(&ctrl::CmEventAck { id }) else { return };
    // SAFETY: sending a live buffer of its length on the channel's socket.
    let _ = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
}

#[no_mangle]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    ffi_boundary(std::ptr::null_mut(), || ret_ptr(create()))
}

/// A thread enters `rdma_get_cm_event` on `channel` (magic-checked): the channel stays alive
/// until it [`leave`]s.
///
/// # Safety
/// `channel` is NULL or points to readable memory (the application's channel).
pub unsafe fn enter(channel: *mut rdma_event_channel) -> Res<()> {
    // SAFETY: magic-checked.
    let ch = unsafe { ShimEventChannel::from_c(channel) }?;
    ch.users.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// A thread leaves `rdma_get_cm_event`: the last one out of a destroyed channel frees it.
///
/// # Safety
/// Pairs with a successful [`enter`] on the same channel.
pub unsafe fn leave(channel: *mut rdma_event_channel) {
    // SAFETY: alive while we are counted in `users`.
    let ch = unsafe { &*channel.cast::<ShimEventChannel>() };
    if ch.users.fetch_sub(1, Ordering::AcqRel) == ShimEventChannel::DESTROYED | 1 {
        // SAFETY: destroyed by the application and no other thread inside: ours to free.
        drop(unsafe { ShimEventChannel::take(channel) });
    }
}

/// `rdma_destroy_event_channel`. A thread still blocked in `rdma_get_cm_event` on it keeps it
/// (and its socket) alive and stays blocked, as a read(2) in progress on a closed ucma fd does:
/// events of destroyed ids are skipped, as the kernel purges them on `rdma_destroy_id`, so a
/// late DISCONNECTED does not wake it into a freed channel (rping 44's CM thread).
///
/// # Safety
/// `channel` came from `rdma_create_event_channel` and has no ids left.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    ffi_boundary((), || {
        // SAFETY: magic-checked; the application gives the channel up (closing the socket
        // tells the service).
        let Ok(ch) = (unsafe { ShimEventChannel::from_c(channel) }) else { return };
        if ch.users.fetch_or(ShimEventChannel::DESTROYED, Ordering::AcqRel) & !ShimEventChannel::DESTROYED == 0 {
            // SAFETY: validated just above; nobody inside rdma_get_cm_event.
            drop(unsafe { ShimEventChannel::take(channel) });
        }
    })
}
