//! Shared receive queues: one receive ring per SRQ segment (the shim produces).
use crate::boundary::{ffi_boundary, handle, nonnull, ret_errno, ret_ptr, Errno, Handle, Mapping, SpinLock};
use crate::client;
use crate::pd::ShimPd;
use crate::qp::post_recv_ring;
use crate::sys::*;
use pmrxe_abi::ctrl::{Request, Response};
use pmrxe_abi::client::SrqSegment;
use pmrxe_abi::ring::Producer;
use pmrxe_abi::{Doorbell, ShmRecvWqe};
use std::os::raw::c_int;

/// An SRQ handle.
#[repr(C)]
pub struct ShimSrq {
    pub srq: ibv_srq,
    magic: u64,
    pub handle: u32,
    ring: SpinLock<Producer<ShmRecvWqe>>,
    _map: Mapping,
    doorbell: Doorbell,
    max_sge: u32,
}
handle!(ShimSrq, ibv_srq, 0x504d_5845_5352_3031);

/// # Safety
/// `pd` ours; `attr` readable/writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    ffi_boundary(std::ptr::null_mut(), || {
        ret_ptr((|| {
            // SAFETY: magic-checked; caller-provided attributes.
            let (p, a) = unsafe { (ShimPd::from_c(pd)?, nonnull(attr)?) };
            if a.attr.max_wr == 0 {
                return Err(Errno::INVAL);
            }
            let ctx = p.ctx()?;
            let req = Request::CreateSrq { device: ctx.dev, pd: p.pd.handle, max_wr: a.attr.max_wr, max_sge: a.attr.max_sge, srq_limit: a.attr.srq_limit };
            let (r, fds) = client::existing()?.call(&req, &[])?;
            let Response::Srq { srq, max_wr, max_sge, layout, doorbell } = r else { return Err(Errno(libc::EPROTO)) };
            let SrqSegment { rq: prod, map } = SrqSegment::attach(&fds, &layout)?;
            a.attr.max_wr = max_wr;
            a.attr.max_sge = max_sge;
            // SAFETY: plain C data (pthread types zeroed = initialisers on glibc).
            let mut s: ibv_srq = unsafe { std::mem::zeroed() };
            s.context = p.pd.context;
            s.srq_context = a.srq_context;
            s.pd = pd;
            s.handle = srq;
            let p = Box::new(ShimSrq { srq: s, magic: ShimSrq::MAGIC, handle: srq, ring: SpinLock::new(prod), _map: map, doorbell, max_sge }).into_c();
            crate::registry::insert(crate::registry::Kind::Srq, srq, p);
            Ok(p)
        })())
    })
}

/// `ops.post_srq_recv`.
///
/// # Safety
/// libibverbs `ibv_post_srq_recv` contract.
pub unsafe extern "C" fn op_post_srq_recv(srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let s = unsafe { ShimSrq::from_c(srq) }?;
            // SAFETY: forwarded ibv_post_srq_recv contract.
            unsafe { post_recv_ring(&s.ring, s.max_sge, s.doorbell, None, wr, bad_wr) }
        })())
    })
}

/// # Safety
/// `srq` ours, `attr` readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked; caller-provided attributes.
            let (s, a) = unsafe { (ShimSrq::from_c(srq)?, nonnull(attr)?) };
            client::existing()?.call_ok(&Request::ModifySrq { srq: s.handle, max_wr: a.max_wr, srq_limit: a.srq_limit, mask: mask as u32 })
        })())
    })
}

/// # Safety
/// `srq` ours, `attr` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked; caller-provided out pointer.
            let (s, a) = unsafe { (ShimSrq::from_c(srq)?, nonnull(attr)?) };
            let (r, _) = client::existing()?.call(&Request::QuerySrq { srq: s.handle }, &[])?;
            let Response::SrqAttr { max_wr, max_sge, srq_limit } = r else { return Err(Errno(libc::EPROTO)) };
            *a = ibv_srq_attr { max_wr, max_sge, srq_limit };
            Ok(())
        })())
    })
}

/// # Safety
/// `srq` ours; no QP uses it any more.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let s = unsafe { ShimSrq::from_c(srq) }?;
            client::existing()?.call_ok(&Request::DestroySrq { srq: s.handle })?;
            crate::registry::remove(crate::registry::Kind::Srq, s.handle);
            // SAFETY: validated above.
            drop(unsafe { ShimSrq::take(srq) });
            Ok(())
        })())
    })
}

/// `ibv_get_srq_num` is for XRC SRQs only.
///
/// # Safety
/// Pointers unused.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_srq_num(_srq: *mut ibv_srq, _srq_num: *mut u32) -> c_int {
    libc::EOPNOTSUPP
}
