//! `rdma_getaddrinfo` / `rdma_freeaddrinfo` (librdmacm `ucma_getaddrinfo`: getaddrinfo(3)
//! with the hints translated, the first answer converted; no ibacm) and `rdma_get_devices` /
//! `rdma_free_devices` (the process's cached contexts).
use crate::boundary::{ffi_boundary, ret_ptr, Errno, Res};
use crate::sys::*;
use std::os::raw::{c_char, c_int};

/// librdmacm `ucma_convert_to_ai`.
pub fn hints_to_ai(h: &rdma_addrinfo) -> libc::addrinfo {
    // SAFETY: addrinfo is plain C data.
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    if h.ai_flags as u32 & RAI_PASSIVE != 0 {
        ai.ai_flags = libc::AI_PASSIVE;
    }
    if h.ai_flags as u32 & RAI_NUMERICHOST != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if h.ai_family != libc::AF_IB {
        ai.ai_family = h.ai_family;
    }
    match h.ai_qp_type as u32 {
        IBV_QPT_RC | IBV_QPT_UC => ai.ai_socktype = libc::SOCK_STREAM,
        IBV_QPT_UD => ai.ai_socktype = libc::SOCK_DGRAM,
        _ => {}
    }
    match h.ai_port_space as u32 {
        RDMA_PS_TCP => ai.ai_protocol = libc::IPPROTO_TCP,
        RDMA_PS_IB => ai.ai_socktype = libc::SOCK_STREAM,
        RDMA_PS_UDP => ai.ai_protocol = libc::IPPROTO_UDP,
        _ => {}
    }
    ai
}

/// A malloc'd copy of `len` bytes (freed by `rdma_freeaddrinfo` with free(3)).
///
/// # Safety
/// `p` is readable for `len` bytes.
unsafe fn dup(p: *const u8, len: usize) -> Res<*mut u8> {
    // SAFETY: plain allocation.
    let d = unsafe { libc::malloc(len.max(1)) }.cast::<u8>();
    if d.is_null() {
        return Err(Errno::NOMEM);
    }
    // SAFETY: `p` holds `len` bytes (caller), `d` was just allocated with as many.
    unsafe { std::ptr::copy_nonoverlapping(p, d, len) };
    Ok(d)
}

/// librdmacm `ucma_convert_to_rai` of one getaddrinfo answer into `rai`.
///
/// # Safety
/// `ai` is a getaddrinfo(3) result entry.
pub unsafe fn ai_to_rai(rai: &mut rdma_addrinfo, h: &rdma_addrinfo, ai: &libc::addrinfo) -> Res<()> {
    rai.ai_qp_type = if h.ai_qp_type != 0 {
        h.ai_qp_type
    } else {
        match ai.ai_socktype {
            libc::SOCK_STREAM => IBV_QPT_RC as c_int,
            libc::SOCK_DGRAM => IBV_QPT_UD as c_int,
            _ => 0,
        }
    };
    rai.ai_port_space = if h.ai_port_space != 0 {
        h.ai_port_space
    } else {
        match ai.ai_protocol {
            libc::IPPROTO_TCP => RDMA_PS_TCP as c_int,
            libc::IPPROTO_UDP => RDMA_PS_UDP as c_int,
            _ => 0,
        }
    };
    let canon = if ai.ai_canonname.is_null() {
        std::ptr::null_mut()
    } else {
        // SAFETY: a NUL-terminated string from getaddrinfo.
        let c = unsafe { libc::strdup(ai.ai_canonname) };
        if c.is_null() {
            return Err(Errno::NOMEM);
        }
        c
    };
    // SAFETY: getaddrinfo's result: `ai_addr` holds `ai_addrlen` bytes.
    let addr = unsafe { dup(ai.ai_addr.cast(), ai.ai_addrlen as usize) }?.cast::<sockaddr>();
    if ai.ai_flags & libc::AI_PASSIVE != 0 {
        rai.ai_flags = RAI_PASSIVE as c_int;
        rai.ai_src_canonname = canon;
        rai.ai_src_addr = addr;
        rai.ai_src_len = ai.ai_addrlen;
    } else {
        rai.ai_dst_canonname = canon;
        rai.ai_dst_addr = addr;
        rai.ai_dst_len = ai.ai_addrlen;
    }
    rai.ai_family = ai.ai_family;
    Ok(())
}

/// Free one rdma_addrinfo chain.
///
/// # Safety
/// `res` came from our `rdma_getaddrinfo`.
pub unsafe fn free_chain(mut res: *mut rdma_addrinfo) {
    while !res.is_null() {
        // SAFETY: a node we allocated with calloc, its members with malloc/strdup.
        unsafe {
            let r = &*res;
            let next = r.ai_next;
            libc::free(r.ai_src_addr.cast());
            libc::free(r.ai_dst_addr.cast());
            libc::free(r.ai_src_canonname.cast());
            libc::free(r.ai_dst_canonname.cast());
            libc::free(r.ai_route);
            libc::free(r.ai_connect);
            libc::free(res.cast());
            res = next;
        }
    }
}

/// `rdma_getaddrinfo`. Returns 0, a getaddrinfo(3) EAI_* code (as librdmacm does), or -1 with
/// errno.
///
/// # Safety
/// librdmacm contract.
pub unsafe fn getaddrinfo(node: *const c_char, service: *const c_char, hints: *const rdma_addrinfo, res: *mut *mut rdma_addrinfo) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        crate::boundary::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: plain C data.
    let nohints: rdma_addrinfo = unsafe { std::mem::zeroed() };
    // SAFETY: NULL or the application's hints.
    let h = unsafe { hints.as_ref() }.unwrap_or(&nohints);
    // SAFETY: plain allocation of one zeroed node.
    let rai = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
    if rai.is_null() {
        crate::boundary::set_errno(libc::ENOMEM);
        return -1;
    }
    // SAFETY: just allocated.
    let r = unsafe { &mut *rai };
    let fail = |code: c_int, e: Option<Errno>| {
        // SAFETY: our node.
        unsafe { free_chain(rai) };
        if let Some(Errno(e)) = e {
            crate::boundary::set_errno(e);
        }
        code
    };
    if !node.is_null() || !service.is_null() {
        let hint = hints_to_ai(h);
        let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: C strings (or NULL) from the application, a valid hint, an out pointer.
        let rc = unsafe { libc::getaddrinfo(node, service, &hint, &mut ai) };
        if rc != 0 {
            return fail(rc, None);
        }
        // SAFETY: getaddrinfo succeeded: `ai` is a non-empty list.
        let conv = unsafe { ai_to_rai(r, h, &*ai) };
        // SAFETY: the list getaddrinfo returned.
        unsafe { libc::freeaddrinfo(ai) };
        if let Err(e) = conv {
            return fail(-1, Some(e));
        }
    } else {
        r.ai_flags = h.ai_flags;
        r.ai_family = h.ai_family;
        r.ai_qp_type = h.ai_qp_type;
        r.ai_port_space = h.ai_port_space;
        if h.ai_dst_len > 0 && !h.ai_dst_addr.is_null() {
            // SAFETY: the application's hints: `ai_dst_addr` holds `ai_dst_len` bytes.
            match unsafe { dup(h.ai_dst_addr.cast(), h.ai_dst_len as usize) } {
                Ok(d) => {
                    r.ai_dst_addr = d.cast();
                    r.ai_dst_len = h.ai_dst_len;
                }
                Err(e) => return fail(-1, Some(e)),
            }
        }
    }
    if r.ai_src_len == 0 && h.ai_src_len > 0 && !h.ai_src_addr.is_null() {
        // SAFETY: the application's hints: `ai_src_addr` holds `ai_src_len` bytes.
        match unsafe { dup(h.ai_src_addr.cast(), h.ai_src_len as usize) } {
            Ok(d) => {
                r.ai_src_addr = d.cast();
                r.ai_src_len = h.ai_src_len;
            }
            Err(e) => return fail(-1, Some(e)),
        }
    }
    // SAFETY: checked non-NULL.
    unsafe { *res = rai };
    0
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: *const rdma_addrinfo, res: *mut *mut rdma_addrinfo) -> c_int {
    // SAFETY: forwarded.
    ffi_boundary(-1, || unsafe { getaddrinfo(node, service, hints, res) })
}

/// # Safety
/// `res` came from `rdma_getaddrinfo`.
#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    // SAFETY: forwarded.
    ffi_boundary((), || unsafe { free_chain(res) })
}

fn devices() -> Res<(*mut *mut ibv_context, c_int)> {
    let n = crate::client::client()?.devices.len();
    // SAFETY: plain allocation of n+1 pointers (freed by rdma_free_devices with free(3)).
    let arr = unsafe { libc::calloc(n + 1, std::mem::size_of::<*mut ibv_context>()) }.cast::<*mut ibv_context>();
    if arr.is_null() {
        return Err(Errno::NOMEM);
    }
    for i in 0..n {
        match super::cma_device(i as u32) {
            // SAFETY: `arr` has n+1 slots.
            Ok(d) => unsafe { *arr.add(i) = d.verbs },
            Err(e) => {
                // SAFETY: ours, unused.
                unsafe { libc::free(arr.cast()) };
                return Err(e);
            }
        }
    }
    Ok((arr, n as c_int))
}

/// # Safety
/// `num_devices` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    ffi_boundary(std::ptr::null_mut(), || {
        let r = devices();
        if !num_devices.is_null() {
            // SAFETY: caller contract.
            unsafe { *num_devices = r.as_ref().map(|x| x.1).unwrap_or(0) };
        }
        ret_ptr(r.map(|x| x.0))
    })
}

/// # Safety
/// `list` came from `rdma_get_devices` (the contexts stay open for the process, as
/// librdmacm's cached ones).
#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: allocated with calloc by rdma_get_devices.
    ffi_boundary((), || unsafe { libc::free(list.cast()) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    fn hints(flags: u32, qp: u32, ps: u32) -> rdma_addrinfo {
        // SAFETY: plain C data.
        let mut h: rdma_addrinfo = unsafe { std::mem::zeroed() };
        h.ai_flags = flags as c_int;
        h.ai_qp_type = qp as c_int;
        h.ai_port_space = ps as c_int;
        h
    }

    #[test]
    fn active_numeric_tcp() {
        let (node, port) = (CString::new("198.18.0.1").unwrap(), CString::new("7471").unwrap());
        let h = hints(0, IBV_QPT_RC, RDMA_PS_TCP);
        let mut res = std::ptr::null_mut();
        // SAFETY: valid strings, hints and out pointer.
        assert_eq!(unsafe { getaddrinfo(node.as_ptr(), port.as_ptr(), &h, &mut res) }, 0);
        // SAFETY: filled above.
        let r = unsafe { &*res };
        assert_eq!((r.ai_flags, r.ai_family, r.ai_qp_type, r.ai_port_space), (0, libc::AF_INET, IBV_QPT_RC as c_int, RDMA_PS_TCP as c_int));
        assert!(r.ai_src_addr.is_null());
        assert_eq!(r.ai_dst_len as usize, std::mem::size_of::<libc::sockaddr_in>());
        // SAFETY: an AF_INET address.
        let sin = unsafe { &*r.ai_dst_addr.cast::<libc::sockaddr_in>() };
        assert_eq!((u16::from_be(sin.sin_port), sin.sin_addr.s_addr.to_ne_bytes()), (7471, [198, 18, 0, 1]));
        // SAFETY: ours.
        unsafe { free_chain(res) };
    }

    #[test]
    fn passive_udp_fills_source() {
        let port = CString::new("7472").unwrap();
        let h = hints(RAI_PASSIVE, IBV_QPT_UD, RDMA_PS_UDP);
        let mut res = std::ptr::null_mut();
        // SAFETY: as above (node NULL: the wildcard).
        assert_eq!(unsafe { getaddrinfo(std::ptr::null(), port.as_ptr(), &h, &mut res) }, 0);
        // SAFETY: filled above.
        let r = unsafe { &*res };
        assert_eq!((r.ai_flags as u32, r.ai_qp_type as u32, r.ai_port_space as u32), (RAI_PASSIVE, IBV_QPT_UD, RDMA_PS_UDP));
        assert!(!r.ai_src_addr.is_null() && r.ai_dst_addr.is_null());
        // SAFETY: a socket address from getaddrinfo.
        let a = unsafe { super::super::read_sockaddr(r.ai_src_addr) }.unwrap().unwrap();
        assert_eq!(a.port, 7472);
        // SAFETY: ours.
        unsafe { free_chain(res) };
    }

    #[test]
    fn no_hints_defaults_to_tcp_rc_and_names_resolve() {
        let (node, port) = (CString::new("localhost").unwrap(), CString::new("7473").unwrap());
        let mut res = std::ptr::null_mut();
        // SAFETY: as above.
        assert_eq!(unsafe { getaddrinfo(node.as_ptr(), port.as_ptr(), std::ptr::null(), &mut res) }, 0);
        // SAFETY: filled above.
        let r = unsafe { &*res };
        assert_eq!((r.ai_qp_type as u32, r.ai_port_space as u32), (IBV_QPT_RC, RDMA_PS_TCP));
        assert!(r.ai_family == libc::AF_INET || r.ai_family == libc::AF_INET6);
        // SAFETY: ours.
        unsafe { free_chain(res) };
    }

    #[test]
    fn errors_are_librdmacms() {
        let mut res = std::ptr::null_mut();
        // SAFETY: all NULL: EINVAL.
        assert_eq!(unsafe { getaddrinfo(std::ptr::null(), std::ptr::null(), std::ptr::null(), &mut res) }, -1);
        let node = CString::new("not-an-address").unwrap();
        let h = hints(RAI_NUMERICHOST, 0, 0);
        // SAFETY: valid pointers; a non-numeric host with RAI_NUMERICHOST is EAI_NONAME.
        assert_eq!(unsafe { getaddrinfo(node.as_ptr(), std::ptr::null(), &h, &mut res) }, libc::EAI_NONAME);
    }
}
