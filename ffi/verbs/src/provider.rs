//! libibverbs' provider interface (`IBVERBS_PRIVATE_34`: the `ibv_cmd_*` kernel commands,
//! `execute_ioctl`, context set-up) on pmrxe objects: a clean EOPNOTSUPP.
//!
//! Providers (libmlx5, librxe, ...) build their verbs out of these; pmrxe has no provider and
//! no kernel device, and under the shim the real libibverbs never loads one (it never
//! enumerates devices: `ibv_get_device_list` is ours). Called on a shim object, the real
//! functions follow the `verbs_context`'s private part (`vctx->priv`, NULL here:
//! `execute_ioctl` reads `priv->driver_id`) or treat our `ibv_device` as a `verbs_device`: a
//! fault, not an error. So every exported one that takes a context or an object of a context
//! is defined here and fails: an errno return (EOPNOTSUPP, also in `errno`), `-1` for
//! `ibv_cmd_poll_cq`, NULL for the constructors, nothing for the `void` ones (with `errno`).
//! The pure ones (`__ioctl_final_num_attrs`, `verbs_allow_disassociate_destroy`,
//! `__verbs_log`, `verbs_init_cq`, the driver registration) are left to libibverbs.
//!
//! The argument-less Rust signatures are deliberate: these functions read none of their
//! arguments, and in the C calling conventions of the supported targets (x86-64 System V,
//! AArch64) the caller passes and cleans up arguments, so a callee may ignore them.
use crate::boundary::set_errno;
use crate::sys::*;
use std::os::raw::{c_int, c_void};

macro_rules! eopnotsupp {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "@IBVERBS_PRIVATE_34`: EOPNOTSUPP (module doc).")]
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            set_errno(libc::EOPNOTSUPP);
            libc::EOPNOTSUPP
        }
    )*};
}

eopnotsupp!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);

/// `ibv_cmd_poll_cq@IBVERBS_PRIVATE_34`: a count or -1; -1 with EOPNOTSUPP.
#[no_mangle]
pub extern "C" fn ibv_cmd_poll_cq() -> c_int {
    set_errno(libc::EOPNOTSUPP);
    -1
}

macro_rules! post_eopnotsupp {
    ($($name:ident: $obj:ty, $wr:ty;)*) => {$(
        #[doc = concat!("`", stringify!($name), "@IBVERBS_PRIVATE_34`: EOPNOTSUPP, `*bad_wr` = the first request (nothing posted).")]
        ///
        /// # Safety
        /// `bad_wr` is NULL or writable.
        #[no_mangle]
        pub unsafe extern "C" fn $name(_obj: *mut $obj, wr: *mut $wr, bad_wr: *mut *mut $wr) -> c_int {
            if !bad_wr.is_null() {
                // SAFETY: caller contract (verbs.h: bad_wr is writable).
                unsafe { *bad_wr = wr };
            }
            set_errno(libc::EOPNOTSUPP);
            libc::EOPNOTSUPP
        }
    )*};
}

post_eopnotsupp! {
    ibv_cmd_post_send: ibv_qp, ibv_send_wr;
    ibv_cmd_post_recv: ibv_qp, ibv_recv_wr;
    ibv_cmd_post_srq_recv: ibv_srq, ibv_recv_wr;
}

/// `verbs_open_device@IBVERBS_PRIVATE_34` (a provider opening its `verbs_device`): ours are
/// not `verbs_device`s; NULL, EOPNOTSUPP. Applications open with `ibv_open_device`.
#[no_mangle]
pub extern "C" fn verbs_open_device() -> *mut ibv_context {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `_verbs_init_and_alloc_context@IBVERBS_PRIVATE_34` (a provider's `alloc_context`): NULL,
/// EOPNOTSUPP.
#[no_mangle]
pub extern "C" fn _verbs_init_and_alloc_context() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `verbs_set_ops@IBVERBS_PRIVATE_34`: the ops of a pmrxe context are not a provider's to
/// change; nothing happens (errno EOPNOTSUPP).
#[no_mangle]
pub extern "C" fn verbs_set_ops() {
    set_errno(libc::EOPNOTSUPP);
}

/// `verbs_uninit_context@IBVERBS_PRIVATE_34`: contexts are closed with `ibv_close_device`;
/// nothing happens (errno EOPNOTSUPP).
#[no_mangle]
pub extern "C" fn verbs_uninit_context() {
    set_errno(libc::EOPNOTSUPP);
}
