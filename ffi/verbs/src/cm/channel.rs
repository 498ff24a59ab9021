//! Event channels: `rdma_create_event_channel` / `rdma_destroy_event_channel`, and reading one
//! event message from a channel's socket.
use super::{ShimEventChannel, Handle};
use crate::boundary::{ffi_boundary, ret_ptr, Errno, Res};
use crate::client::client;
use crate::sys::*;
use pmrxe_abi::ctrl::{self, CmEventMsg, Request, Response};
use std::os::fd::AsRawFd;

/// A new channel (the service's event socket as `fd`).
pub fn create() -> Res<*mut rdma_event_channel> {
    let (r, mut fds) = client()?.call(&Request::CmOpenChannel, &[])?;
    let Response::CmChannel { channel } = r else { return Err(Errno(libc::EPROTO)) };
    if fds.is_empty() {
        return Err(Errno(libc::EPROTO));
    }
    let sock = fds.swap_remove(0);
    let ch = rdma_event_channel { fd: sock.as_raw_fd() };
    let b = Box::new(ShimEventChannel { ch, magic: <ShimEventChannel as Handle>::MAGIC, handle: channel, _sock: sock });
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

/// # Safety
/// `channel` came from `rdma_create_event_channel` and has no ids left.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    ffi_boundary((), || {
        // SAFETY: magic-checked; the application gives the channel up (closing the socket
        // tells the service).
        if unsafe { ShimEventChannel::from_c(channel) }.is_ok() {
            // SAFETY: validated just above.
            drop(unsafe { ShimEventChannel::take(channel) });
        }
    })
}
