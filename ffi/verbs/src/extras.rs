//! The rest of libibverbs' exported surface that takes a pmrxe object.
//!
//! Every exported function of libibverbs.so.1 (rdma-core 44) that dereferences a context, QP
//! or PD reaches provider state the real library expects (its private `verbs_context_ops`, the
//! kernel command fd); called on a shim object it would follow a null pointer. Each such entry
//! point is defined here (or in the module of its object) and either works or fails with a
//! clean errno. The full list with its status is in docs/verbs-coverage.md.
use crate::boundary::{ffi_boundary, set_errno, Errno};
use crate::device::ShimContext;
use crate::qp::ShimQp;
use crate::sys::*;
use std::os::raw::c_int;

/// `ibv_query_qp_data_in_order` flag: return the capability bits instead of 0/1.
const DATA_IN_ORDER_RETURN_CAPS: u32 = 1;
/// Capability: a whole message's data is written in order.
const DATA_IN_ORDER_WHOLE_MSG: c_int = 1;
/// Capability: data is written in order in 128-byte aligned chunks.
const DATA_IN_ORDER_ALIGNED_128_BYTES: c_int = 2;

/// `ibv_query_qp_data_in_order@IBVERBS_1.14`. pmrxe places every message's packets in PSN
/// order, each packet front to back (DESIGN invariant 7), for every opcode and QP type, so a
/// poller of the last byte sees the whole message: WHOLE_MSG (and therefore 128-byte chunks).
///
/// # Safety
/// `qp` is one of ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(qp: *mut ibv_qp, _op: c_int, flags: u32) -> c_int {
    ffi_boundary(0, || {
        // SAFETY: magic-checked.
        if unsafe { ShimQp::from_qp(qp) }.is_err() {
            return 0;
        }
        if flags & DATA_IN_ORDER_RETURN_CAPS != 0 {
            DATA_IN_ORDER_WHOLE_MSG | DATA_IN_ORDER_ALIGNED_128_BYTES
        } else {
            1
        }
    })
}

/// `ibv_query_ece@IBVERBS_1.10`: Enhanced Connection Establishment (a vendor option set
/// exchanged through rdma_cm) is a ConnectX feature; none is offered (EOPNOTSUPP, as every
/// provider without it answers).
///
/// # Safety
/// `qp` one of ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_ece(qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    // SAFETY: magic-checked.
    let e = match unsafe { ShimQp::from_qp(qp) } {
        Ok(_) => libc::EOPNOTSUPP,
        Err(Errno(e)) => e,
    };
    set_errno(e);
    e
}

/// `ibv_set_ece@IBVERBS_1.10`: see [`ibv_query_ece`].
///
/// # Safety
/// `qp` one of ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_set_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { ibv_query_ece(qp, ece) }
}

/// `ibv_reg_dmabuf_mr@IBVERBS_1.12`: device memory exported as a dma-buf (GPU memory) cannot
/// be mapped by the service; EOPNOTSUPP.
///
/// # Safety
/// No pointer is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(_pd: *mut ibv_pd, _offset: u64, _length: usize, _iova: u64, _fd: c_int, _access: c_int) -> *mut ibv_mr {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_import_dm@IBVERBS_1.13`: no device memory (ibv_alloc_dm is not offered).
///
/// # Safety
/// No pointer is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(_context: *mut ibv_context, _dm_handle: u32) -> *mut ibv_dm {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_unimport_dm@IBVERBS_1.13`: nothing can have been imported.
///
/// # Safety
/// No pointer is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(_dm: *mut ibv_dm) {}

/// `ibv_resolve_eth_l2_from_gid@IBVERBS_PRIVATE_34` (used by providers, not applications):
/// pmrxe resolves peer MACs in the service (ARP/ND, neighbour table) when it transmits, so
/// only a GID of this context's own port resolves here (to the port's MAC); any other GID is
/// ENOENT.
///
/// # Safety
/// `attr` readable, `eth_mac` has 6 writable bytes, `vid` writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(context: *mut ibv_context, attr: *mut ibv_ah_attr, eth_mac: *mut u8, vid: *mut u16) -> c_int {
    ffi_boundary(libc::EIO, || {
        // SAFETY: magic-checked context.
        let Ok(c) = (unsafe { ShimContext::from_ctx(context) }) else { return libc::EINVAL };
        if attr.is_null() || eth_mac.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: caller contract; a union of byte arrays.
        let dgid = unsafe { (*attr).grh.dgid.raw };
        let Ok(info) = c.info() else { return libc::EIO };
        if !info.gids.iter().any(|g| g.gid == dgid) {
            return libc::ENOENT;
        }
        // SAFETY: caller contract: 6 writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(info.mac.as_ptr(), eth_mac, 6) };
        if !vid.is_null() {
            // SAFETY: caller contract. 0xffff: no VLAN, as rdma-core reports it.
            unsafe { *vid = 0xffff };
        }
        0
    })
}
