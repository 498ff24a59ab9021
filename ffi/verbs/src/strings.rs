//! `ibv_*_str` helpers (static strings, as libibverbs returns them).
use std::os::raw::{c_char, c_uint};

fn s(b: &'static [u8]) -> *const c_char {
    b.as_ptr().cast()
}

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_uint) -> *const c_char {
    const T: [&[u8]; 23] = [
        b"success\0", b"local length error\0", b"local QP operation error\0", b"local EE context operation error\0",
        b"local protection error\0", b"Work Request Flushed Error\0", b"memory management operation error\0",
        b"bad response error\0", b"local access error\0", b"remote invalid request error\0",
        b"remote access error\0", b"remote operation error\0", b"transport retry counter exceeded\0",
        b"RNR retry counter exceeded\0", b"local RDD violation error\0", b"remote invalid RD request\0",
        b"aborted error\0", b"invalid EE context number\0", b"invalid EE context state\0", b"fatal error\0",
        b"response timeout error\0", b"general error\0", b"TM error\0",
    ];
    s(T.get(status as usize).copied().unwrap_or(b"unknown\0"))
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: c_uint) -> *const c_char {
    const T: [&[u8]; 22] = [
        b"CQ error\0", b"local work queue catastrophic error\0", b"invalid request local work queue error\0",
        b"local access violation work queue error\0", b"communication established\0", b"send queue drained\0",
        b"path migrated\0", b"path migration request error\0", b"local catastrophic error\0", b"port active\0",
        b"port error\0", b"LID change\0", b"P_Key change\0", b"SM change\0", b"SRQ catastrophic error\0",
        b"SRQ limit reached\0", b"last WQE reached\0", b"client reregistration\0", b"GID table change\0",
        b"WQ fatal\0", b"unknown\0", b"unknown\0",
    ];
    if event == pmrxe_abi::ctrl::EVENT_MR_REVOKED {
        return s(b"MR revoked: its memory faulted\0");
    }
    s(T.get(event as usize).copied().unwrap_or(b"unknown\0"))
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: std::os::raw::c_int) -> *const c_char {
    const T: [&[u8]; 7] =
        [b"unknown\0", b"InfiniBand channel adapter\0", b"InfiniBand switch\0", b"InfiniBand router\0", b"iWARP NIC\0", b"usNIC\0", b"usNIC UDP\0"];
    s(if node_type < 0 { b"unknown\0" } else { T.get(node_type as usize).copied().unwrap_or(b"unknown\0") })
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(port_state: c_uint) -> *const c_char {
    const T: [&[u8]; 6] = [b"no state change (NOP)\0", b"down\0", b"init\0", b"armed\0", b"active\0", b"active deferred\0"];
    s(T.get(port_state as usize).copied().unwrap_or(b"unknown\0"))
}

#[cfg(test)]
mod tests {
    use super::*;
    fn st(p: *const c_char) -> String {
        // SAFETY: all our strings are static and NUL-terminated.
        unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
    #[test]
    fn strings_match_libibverbs_and_out_of_range_is_unknown() {
        assert_eq!(st(ibv_wc_status_str(0)), "success");
        assert_eq!(st(ibv_wc_status_str(5)), "Work Request Flushed Error");
        assert_eq!(st(ibv_wc_status_str(12)), "transport retry counter exceeded");
        assert_eq!(st(ibv_wc_status_str(999)), "unknown");
        assert_eq!(st(ibv_port_state_str(4)), "active");
        assert_eq!(st(ibv_node_type_str(1)), "InfiniBand channel adapter");
        assert_eq!(st(ibv_event_type_str(15)), "SRQ limit reached");
    }
}
