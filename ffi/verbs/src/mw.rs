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

/// An MW handle. A type-1 bind changes `mw->rkey`, which the application reads (and another
/// thread may be posting with), so the C struct lives in an `UnsafeCell` ([`ShimMw::rkey`]).
#[repr(C)]
pub struct ShimMw {
    mw: std::cell::UnsafeCell<ibv_mw>,
    magic: u64,
}

impl ShimMw {
    /// The window's current rkey.
    pub fn rkey(&self) -> u32 {
        // SAFETY: a field of our allocation inside the UnsafeCell, read through a raw pointer.
        unsafe { std::ptr::addr_of!((*self.mw.get()).rkey).read_volatile() }
    }
    fn set_rkey(&self, rkey: u32) {
        // SAFETY: as in `rkey`; only `op_bind_mw` writes it (the application's serialisation
        // of binds on one window, as with providers).
        unsafe { std::ptr::addr_of_mut!((*self.mw.get()).rkey).write_volatile(rkey) }
    }
    /// The window's service handle (fixed).
    fn handle(&self) -> u32 {
        // SAFETY: as in `rkey`.
        unsafe { std::ptr::addr_of!((*self.mw.get()).handle).read_volatile() }
    }
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
            Ok(Box::new(ShimMw { mw: std::cell::UnsafeCell::new(mw), magic: ShimMw::MAGIC }).into_c())
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
            let old = m.rkey();
            let new_key = (old & !0xff) | (old.wrapping_add(1) & 0xff);
            let mut w = ShmSendWqe { wr_id: b.wr_id, opcode: wr_opcode::BIND_MW, send_flags: b.send_flags, ..Default::default() };
            // SAFETY: handles magic-checked inside.
            unsafe { set_bind(&mut w, mw, new_key, &b.bind_info) }?;
            let mut sq = q.sq.lock();
            q.post_batch(&mut sq, &[w])?;
            m.set_rkey(new_key);
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
            client::existing()?.call_ok(&Request::DeallocMw { key: m.handle() })?;
            // SAFETY: validated above.
            drop(unsafe { ShimMw::take(mw) });
            Ok(())
        })())
    })
}
