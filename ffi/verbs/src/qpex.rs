//! The `ibv_wr_*` API: callbacks in `struct ibv_qp_ex` (all inline in `verbs.h`).
//!
//! `wr_start` takes the QP's send spinlock and keeps it until `wr_complete`/`wr_abort`, as
//! providers do. Each builder writes a WQE (wr_id/flags from `qp->wr_id`/`qp->wr_flags`) straight
//! into the next free slot of the send ring, staged but not published; `wr_set_*` complete the
//! newest staged one in its slot. `wr_complete` publishes the whole batch (one release store, one
//! doorbell) or nothing: after the first builder error, or a ring with no free slot for the next
//! WQE (ENOMEM, as mlx5's builders), the batch is dropped (`Producer::unstage`) and the service
//! never sees it. Nothing is built twice and nothing allocates.
use crate::boundary::{ffi_boundary, Errno};
use crate::post::{check_wqe, send_head, set_bind, set_inline, set_sges};
use crate::qp::{ShimQp, SqState};
use crate::sys::*;
use pmrxe_abi::{send_flags, wr_opcode, ShmSendWqe};
use std::os::raw::{c_int, c_void};

/// Fill the callbacks of a new QP.
pub fn install(ex: &mut ibv_qp_ex) {
    ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    ex.wr_bind_mw = Some(wr_bind_mw);
    ex.wr_local_inv = Some(wr_local_inv);
    ex.wr_rdma_read = Some(wr_rdma_read);
    ex.wr_rdma_write = Some(wr_rdma_write);
    ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    ex.wr_send = Some(wr_send);
    ex.wr_send_imm = Some(wr_send_imm);
    ex.wr_send_inv = Some(wr_send_inv);
    ex.wr_send_tso = Some(wr_send_tso);
    ex.wr_set_ud_addr = Some(wr_set_ud_addr);
    ex.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    ex.wr_set_inline_data = Some(wr_set_inline_data);
    ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ex.wr_set_sge = Some(wr_set_sge);
    ex.wr_set_sge_list = Some(wr_set_sge_list);
    ex.wr_start = Some(wr_start);
    ex.wr_complete = Some(wr_complete);
    ex.wr_abort = Some(wr_abort);
    ex.wr_atomic_write = Some(wr_atomic_write);
}

/// The QP and its locked send state from a callback argument.
///
/// # Safety
/// `qp` is one of our QPs (only they carry these callbacks) and the calling thread holds the
/// send lock through `wr_start`.
unsafe fn st<'a>(qp: *mut ibv_qp_ex) -> (&'a ShimQp, &'a mut SqState) {
    // SAFETY: see above (shared: other threads may use the QP's other verbs meanwhile).
    let q = unsafe { &*qp.cast::<ShimQp>() };
    // SAFETY: lock held since wr_start (contract).
    let s = unsafe { &mut *(q.sq.raw_get() as *mut SqState) };
    (q, s)
}

fn fail(s: &mut SqState, e: Errno) {
    s.batch_err.get_or_insert(e);
}

/// Stage a WQE for `opcode` in the next ring slot and let `f` fill the opcode fields. After an
/// error in this batch nothing more is staged (the batch is dropped at `wr_complete`).
///
/// # Safety
/// As [`st`]: `qp` is one of this shim's QPs and the calling thread holds its send lock.
unsafe fn build(qp: *mut ibv_qp_ex, opcode: u32, f: impl FnOnce(&mut ShmSendWqe)) {
    ffi_boundary((), || {
        // SAFETY: callback contract.
        let (q, s) = unsafe { st(qp) };
        if s.batch_err.is_some() {
            return;
        }
        // SAFETY: fields of the QP's C struct, read through the raw pointer: the application
        // set them on this thread just before this callback.
        let (wr_id, wr_flags) = unsafe { ((*q.ex()).wr_id, (*q.ex()).wr_flags) };
        let r = s.prod.stage_with(|w: &mut ShmSendWqe| {
            send_head(w, wr_id, opcode, wr_flags & !send_flags::INLINE);
            f(w);
            Ok::<(), Errno>(())
        });
        if let Err(e) = r {
            fail(s, e);
        }
    })
}

/// Modify the newest staged WQE in its slot (EINVAL if the batch has none).
///
/// # Safety
/// As [`st`]: `qp` is one of this shim's QPs and the calling thread holds its send lock.
unsafe fn last(qp: *mut ibv_qp_ex, f: impl FnOnce(&ShimQp, &mut ShmSendWqe) -> Result<(), Errno>) {
    ffi_boundary((), || {
        // SAFETY: callback contract.
        let (q, s) = unsafe { st(qp) };
        if s.batch_err.is_some() {
            return;
        }
        let newest = s.prod.staged().wrapping_sub(1);
        let r = s.prod.with_staged(newest, |w| f(q, w)).unwrap_or(Err(Errno::INVAL));
        if let Err(e) = r {
            fail(s, e);
        }
    })
}

/// `ibv_wr_start`: take the QP's send lock (held until `wr_complete`/`wr_abort`) and start an
/// empty batch.
///
/// # Safety
/// `qp` is one of this shim's QPs (only they carry the callback); the calling thread does not
/// hold its send lock already.
unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    ffi_boundary((), || {
        // SAFETY: only our QPs carry this callback.
        let q = unsafe { &*qp.cast::<ShimQp>() };
        q.sq.raw_lock();
        // SAFETY: just locked.
        let s = unsafe { q.sq.raw_get() };
        // Every other post publishes what it stages before it unlocks: nothing is staged here.
        debug_assert_eq!(s.prod.staged(), 0);
        s.batch_err = None;
    })
}

/// `ibv_wr_complete`: publish the batch (all or nothing) and release the send lock.
///
/// # Safety
/// `qp` is one of this shim's QPs and the calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    ffi_boundary(libc::EIO, || {
        // SAFETY: callback contract.
        let (q, s) = unsafe { st(qp) };
        let r = publish_batch(q, s);
        if r.is_err() {
            s.prod.unstage();
        }
        s.batch_err = None;
        // SAFETY: locked in wr_start by this thread.
        unsafe { q.sq.raw_unlock() };
        match r {
            Ok(()) => 0,
            Err(Errno(e)) => e,
        }
    })
}

/// Check the staged batch (the builders' first error, the QP state, each WQE as
/// `ibv_post_send` checks it) and publish it with one doorbell.
fn publish_batch(q: &ShimQp, s: &mut SqState) -> Result<(), Errno> {
    if let Some(e) = s.batch_err {
        return Err(e);
    }
    let n = s.prod.staged();
    if n == 0 {
        return Ok(());
    }
    q.may_post_send()?;
    for i in 0..n {
        s.prod.with_staged(i, |w| check_wqe(w, &q.lim)).unwrap_or(Err(Errno::IO))?;
    }
    crate::client::existing()?.publish(&mut s.prod, q.doorbell);
    Ok(())
}

/// `ibv_wr_abort`: drop the batch and release the send lock.
///
/// # Safety
/// `qp` is one of this shim's QPs and the calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    ffi_boundary((), || {
        // SAFETY: callback contract.
        let (q, s) = unsafe { st(qp) };
        s.prod.unstage();
        s.batch_err = None;
        // SAFETY: locked in wr_start by this thread.
        unsafe { q.sq.raw_unlock() };
    })
}

/// `ibv_wr_atomic_cmp_swp`: append an ATOMIC_CMP_AND_SWP WQE.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_atomic_cmp_swp(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, compare: u64, swap: u64) {
    // SAFETY: callback contract.
    unsafe {
        build(qp, wr_opcode::ATOMIC_CMP_AND_SWP, |w| {
            (w.rkey, w.remote_addr, w.compare_add, w.swap) = (rkey, remote_addr, compare, swap);
        })
    }
}
/// `ibv_wr_atomic_fetch_add`: append an ATOMIC_FETCH_AND_ADD WQE.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64) {
    // SAFETY: callback contract.
    unsafe {
        build(qp, wr_opcode::ATOMIC_FETCH_AND_ADD, |w| {
            (w.rkey, w.remote_addr, w.compare_add) = (rkey, remote_addr, add);
        })
    }
}
/// `ibv_wr_bind_mw`: append a BIND_MW WQE for window `mw`.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`; `info` is NULL or readable, `mw` and `info->mr` NULL or handles of this shim.
unsafe extern "C" fn wr_bind_mw(qp: *mut ibv_qp_ex, mw: *mut ibv_mw, rkey: u32, info: *const ibv_mw_bind_info) {
    // SAFETY: callback contract.
    unsafe { build(qp, wr_opcode::BIND_MW, |_| {}) };
    // SAFETY: callback contract; `info` readable, `mw`/`info.mr` ours or rejected.
    unsafe { last(qp, |_, w| set_bind(w, mw, rkey, info.as_ref().ok_or(Errno::INVAL)?)) };
}
/// `ibv_wr_local_inv`: append a LOCAL_INV WQE.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: callback contract.
    unsafe { build(qp, wr_opcode::LOCAL_INV, |w| w.imm_or_inv = invalidate_rkey) }
}
/// `ibv_wr_rdma_read`: append an RDMA READ WQE.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: callback contract.
    unsafe { build(qp, wr_opcode::RDMA_READ, |w| (w.rkey, w.remote_addr) = (rkey, remote_addr)) }
}
/// `ibv_wr_rdma_write`: append an RDMA WRITE WQE.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: callback contract.
    unsafe { build(qp, wr_opcode::RDMA_WRITE, |w| (w.rkey, w.remote_addr) = (rkey, remote_addr)) }
}
/// `ibv_wr_rdma_write_imm`: append an RDMA WRITE with immediate WQE.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: __be32) {
    // SAFETY: callback contract.
    unsafe { build(qp, wr_opcode::RDMA_WRITE_WITH_IMM, |w| (w.rkey, w.remote_addr, w.imm_or_inv) = (rkey, remote_addr, imm)) }
}
/// `ibv_wr_send`: append a SEND WQE.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: callback contract.
    unsafe { build(qp, wr_opcode::SEND, |_| {}) }
}
/// `ibv_wr_send_imm`: append a SEND with immediate WQE.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: __be32) {
    // SAFETY: callback contract.
    unsafe { build(qp, wr_opcode::SEND_WITH_IMM, |w| w.imm_or_inv = imm) }
}
/// `ibv_wr_send_inv`: append a SEND with invalidate WQE.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    // SAFETY: callback contract.
    unsafe { build(qp, wr_opcode::SEND_WITH_INV, |w| w.imm_or_inv = rkey) }
}
/// `ibv_wr_send_tso`: not supported (the batch fails with EOPNOTSUPP).
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
    // SAFETY: callback contract.
    unsafe { build(qp, wr_opcode::TSO, |_| {}) };
    // SAFETY: callback contract.
    unsafe { last(qp, |_, _| Err(Errno::OPNOTSUPP)) };
}
/// `ibv_wr_atomic_write`: not supported (the batch fails with EOPNOTSUPP).
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_atomic_write(qp: *mut ibv_qp_ex, _rkey: u32, _remote_addr: u64, _atomic_wr: *const c_void) {
    // SAFETY: callback contract.
    unsafe { build(qp, wr_opcode::DRIVER1, |_| {}) };
    // SAFETY: callback contract.
    unsafe { last(qp, |_, _| Err(Errno::OPNOTSUPP)) };
}
/// `ibv_wr_set_xrc_srqn`: no XRC (the batch fails with EOPNOTSUPP).
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, _srqn: u32) {
    // SAFETY: callback contract.
    unsafe { last(qp, |_, _| Err(Errno::OPNOTSUPP)) };
}
/// `ibv_wr_set_ud_addr`: address the last WQE (UD).
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`; `ah` NULL or an AH of this shim.
unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32) {
    // SAFETY: callback contract.
    unsafe {
        last(qp, |_, w| {
            use crate::boundary::Handle;
            w.ah = crate::pd::ShimAh::from_c(ah)?.ah.handle;
            (w.remote_qpn, w.remote_qkey) = (remote_qpn, remote_qkey);
            Ok(())
        })
    }
}
/// `ibv_wr_set_sge`: one SGE for the last WQE.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`.
unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: callback contract.
    unsafe { last(qp, |q, w| set_sges(w, &q.lim, &[ibv_sge { addr, length, lkey }])) }
}
/// `ibv_wr_set_sge_list`: the SGEs of the last WQE.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`; `list` holds `n` readable entries.
unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    // SAFETY: callback contract.
    unsafe {
        last(qp, |q, w| {
            if n > 0 && list.is_null() {
                return Err(Errno::INVAL);
            }
            let s = if n == 0 { &[][..] } else { std::slice::from_raw_parts(list, n) };
            set_sges(w, &q.lim, s)
        })
    }
}
/// `ibv_wr_set_inline_data`: the last WQE carries these bytes inline.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`; `addr..addr+length` is readable.
unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: callback contract; the buffer is readable (ibv_wr_set_inline_data contract).
    unsafe { last(qp, |q, w| set_inline(w, &q.lim, [(addr as u64, length)])) }
}
/// `ibv_wr_set_inline_data_list`: the last WQE carries these buffers inline.
///
/// # Safety
/// `ibv_wr_*` contract: `qp` is one of this shim's QPs (only they carry the callback) and the
/// calling thread holds its send lock since `wr_start`; `list` holds `n` readable entries, each naming a readable buffer.
unsafe extern "C" fn wr_set_inline_data_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_data_buf) {
    // SAFETY: callback contract.
    unsafe {
        last(qp, |q, w| {
            if n > 0 && list.is_null() {
                return Err(Errno::INVAL);
            }
            let l = if n == 0 { &[][..] } else { std::slice::from_raw_parts(list, n) };
            set_inline(w, &q.lim, l.iter().map(|b| (b.addr as u64, b.length)))
        })
    }
}
