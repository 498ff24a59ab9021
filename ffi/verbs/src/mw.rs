//! Memory windows: `ops.alloc_mw`, `ops.bind_mw` (type 1, posts a BIND_MW WQE) and
//! `ops.dealloc_mw`; type 2 windows are bound with `IBV_WR_BIND_MW` / `ibv_wr_bind_mw`.
use crate::boundary::{ffi_boundary, handle, nonnull, ret_errno, ret_ptr, Errno, Handle};
use crate::client;
use crate::pd::ShimPd;
use crate::post::set_bind;
use crate::qp::ShimQp;
use crate::sys::*;
use pmrxe_abi::ctrl::{Request, Response};
use pmrxe_abi::{wr_opcode, ShmSendWqe};
use std::os::raw::c_int;

/// An MW handle.
#[repr(C)]
pub struct ShimMw {
    pub mw: ibv_mw,
    magic: u64,
}
handle!(ShimMw, ibv_mw, 0x504d_5845_4d57_3031);

/// `ops.alloc_mw`.
///
/// # Safety
/// `pd` ours.
pub unsafe extern "C" fn op_alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw {
    ffi_boundary(std::ptr::null_mut(), || {
        ret_ptr((|| {
            // SAFETY: magic-checked.
            let p = unsafe { ShimPd::from_c(pd) }?;
            if type_ != IBV_MW_TYPE_1 && type_ != IBV_MW_TYPE_2 {
                return Err(Errno::INVAL);
            }
            let (r, _) = client::existing()?.call(&Request::AllocMw { pd: p.pd.handle, mw_type: type_ }, &[])?;
            let Response::Mw { key } = r else { return Err(Errno(libc::EPROTO)) };
            let mw = ibv_mw { context: p.pd.context, pd, rkey: key, handle: key, type_ };
            Ok(Box::new(ShimMw { mw, magic: ShimMw::MAGIC }).into_c())
        })())
    })
}

/// `ops.bind_mw` (type 1): posts a BIND_MW WQE on `qp` and, as providers do, updates
/// `mw->rkey` to the new key (low 8 bits incremented) at post time.
///
/// # Safety
/// `qp`, `mw`, `bind.bind_info.mr` ours.
pub unsafe extern "C" fn op_bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, bind: *mut ibv_mw_bind) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked; caller-provided bind description.
            let (q, m, b) = unsafe { (ShimQp::from_qp(qp)?, ShimMw::from_c(mw)?, nonnull(bind)?) };
            let new_key = (m.mw.rkey & !0xff) | (m.mw.rkey.wrapping_add(1) & 0xff);
            let mut w = ShmSendWqe { wr_id: b.wr_id, opcode: wr_opcode::BIND_MW, send_flags: b.send_flags, ..Default::default() };
            // SAFETY: handles magic-checked inside.
            unsafe { set_bind(&mut w, mw, new_key, &b.bind_info) }?;
            let mut sq = q.sq.lock();
            q.post_batch(&mut sq, &[w])?;
            m.mw.rkey = new_key;
            Ok(())
        })())
    })
}

/// `ops.dealloc_mw`.
///
/// # Safety
/// `mw` ours.
pub unsafe extern "C" fn op_dealloc_mw(mw: *mut ibv_mw) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let m = unsafe { ShimMw::from_c(mw) }?;
            client::existing()?.call_ok(&Request::DeallocMw { key: m.mw.handle })?;
            // SAFETY: validated above.
            drop(unsafe { ShimMw::take(mw) });
            Ok(())
        })())
    })
}
