//! `rdma_create_qp` / `rdma_create_qp_ex` / `rdma_destroy_qp` and the SRQ calls: the shim's
//! own QP/CQ/SRQ verbs on the id's context and PD, CQs with completion channels made for the
//! id when the caller gives none (librdmacm `ucma_create_cqs`), and the QP moved to INIT (RC,
//! UC) or RTS (UD) with the CM's attributes (`ucma_init_conn_qp` / `ucma_init_ud_qp`).
use super::id::{init_qp_attr, with_id};
use super::ShimId;
use crate::boundary::{Errno, Res};
use crate::sys::*;
use std::os::raw::c_int;

fn last() -> Errno {
    Errno::last()
}

/// librdmacm `ucma_create_cqs`.
fn create_cqs(id: &ShimId, send_size: u32, recv_size: u32) -> Res<()> {
    let ctx = id.verbs();
    let me = id.c().cast();
    if recv_size > 0 {
        // SAFETY: the id's context (ours).
        let ch = unsafe { crate::cq::ibv_create_comp_channel(ctx) };
        id.set_recv_cq_channel(ch);
        if ch.is_null() {
            return Err(last());
        }
        // SAFETY: as above; the channel was made on the same context.
        let cq = unsafe { crate::cq::ibv_create_cq(ctx, recv_size as c_int, me, ch, 0) };
        id.set_recv_cq(cq);
        if cq.is_null() {
            return Err(last());
        }
    }
    if send_size > 0 {
        // SAFETY: as above.
        let ch = unsafe { crate::cq::ibv_create_comp_channel(ctx) };
        id.set_send_cq_channel(ch);
        if ch.is_null() {
            return Err(last());
        }
        // SAFETY: as above.
        let cq = unsafe { crate::cq::ibv_create_cq(ctx, send_size as c_int, me, ch, 0) };
        id.set_send_cq(cq);
        if cq.is_null() {
            return Err(last());
        }
    }
    Ok(())
}

/// librdmacm `ucma_destroy_cqs`: only what `create_cqs` made is set in the id.
fn destroy_cqs(id: &ShimId) {
    // SAFETY: the CQs and channels were made by create_cqs on the id's context and are used by
    // no QP any more.
    unsafe {
        if !id.recv_cq().is_null() {
            crate::cq::ibv_destroy_cq(id.recv_cq());
            if !id.send_cq().is_null() && id.send_cq() != id.recv_cq() {
                crate::cq::ibv_destroy_cq(id.send_cq());
                id.set_send_cq(std::ptr::null_mut());
            }
            id.set_recv_cq(std::ptr::null_mut());
        }
        if !id.send_cq().is_null() {
            crate::cq::ibv_destroy_cq(id.send_cq());
            id.set_send_cq(std::ptr::null_mut());
        }
        if !id.recv_cq_channel().is_null() {
            crate::cq::ibv_destroy_comp_channel(id.recv_cq_channel());
            if !id.send_cq_channel().is_null() && id.send_cq_channel() != id.recv_cq_channel() {
                crate::cq::ibv_destroy_comp_channel(id.send_cq_channel());
                id.set_send_cq_channel(std::ptr::null_mut());
            }
            id.set_recv_cq_channel(std::ptr::null_mut());
        }
        if !id.send_cq_channel().is_null() {
            crate::cq::ibv_destroy_comp_channel(id.send_cq_channel());
            id.set_send_cq_channel(std::ptr::null_mut());
        }
    }
}

fn modify(qp: *mut ibv_qp, a: &mut ibv_qp_attr, mask: c_int) -> Res<()> {
    // SAFETY: our fresh QP; a valid attribute block.
    match unsafe { crate::qp::ibv_modify_qp(qp, a, mask) } {
        0 => Ok(()),
        e => Err(Errno(e)),
    }
}

/// librdmacm `ucma_init_conn_qp` / `ucma_init_ud_qp`.
fn init_qp(id: &ShimId, qp: *mut ibv_qp) -> Res<()> {
    let (mut a, m) = init_qp_attr(id, IBV_QPS_INIT)?;
    modify(qp, &mut a, m)?;
    if id.qp_type() != IBV_QPT_UD {
        return Ok(());
    }
    a.qp_state = IBV_QPS_RTR;
    modify(qp, &mut a, IBV_QP_STATE as c_int)?;
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    modify(qp, &mut a, (IBV_QP_STATE | IBV_QP_SQ_PSN) as c_int)
}

/// `rdma_create_qp_ex`.
pub fn create_qp_ex(id: &ShimId, attr: &mut ibv_qp_init_attr_ex) -> Res<()> {
    if !id.qp().is_null() || id.verbs().is_null() {
        return Err(Errno::INVAL);
    }
    if attr.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.comp_mask |= IBV_QP_INIT_ATTR_PD;
        attr.pd = id.pd();
    // SAFETY: the application's PD (ours: checked again by the create path).
    } else if unsafe { (*attr.pd).context } != id.verbs() {
        return Err(Errno::INVAL);
    }
    if (!id.recv_cq().is_null() && !attr.recv_cq.is_null() && id.recv_cq() != attr.recv_cq)
        || (!id.send_cq().is_null() && !attr.send_cq.is_null() && id.send_cq() != attr.send_cq)
    {
        return Err(Errno::INVAL);
    }
    let send = if !attr.send_cq.is_null() || !id.send_cq().is_null() { 0 } else { attr.cap.max_send_wr };
    let recv = if !attr.recv_cq.is_null() || !id.recv_cq().is_null() { 0 } else { attr.cap.max_recv_wr };
    if let Err(e) = create_cqs(id, send, recv) {
        destroy_cqs(id);
        return Err(e);
    }
    if attr.send_cq.is_null() {
        attr.send_cq = id.send_cq();
    }
    if attr.recv_cq.is_null() {
        attr.recv_cq = id.recv_cq();
    }
    if !id.srq().is_null() && attr.srq.is_null() {
        attr.srq = id.srq();
    }
    // SAFETY: the id's context (ours); `attr` is a valid ibv_qp_init_attr_ex.
    let qp = unsafe { crate::qp::vctx_create_qp_ex(id.verbs(), attr) };
    if qp.is_null() {
        let e = last();
        destroy_cqs(id);
        return Err(e);
    }
    if let Err(e) = init_qp(id, qp) {
        // SAFETY: the QP made just above, unused.
        unsafe { crate::qp::ibv_destroy_qp(qp) };
        destroy_cqs(id);
        return Err(e);
    }
    // SAFETY: our live QP.
    id.set_pd(unsafe { (*qp).pd });
    id.set_qp(qp);
    Ok(())
}

/// `rdma_create_qp` (`pd` NULL: the id's PD).
pub fn create_qp(id: &ShimId, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> Res<()> {
    // SAFETY: plain C data.
    let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    ex.qp_context = attr.qp_context;
    ex.send_cq = attr.send_cq;
    ex.recv_cq = attr.recv_cq;
    ex.srq = attr.srq;
    ex.cap = attr.cap;
    ex.qp_type = attr.qp_type;
    ex.sq_sig_all = attr.sq_sig_all;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = if pd.is_null() { id.pd() } else { pd };
    let r = create_qp_ex(id, &mut ex);
    attr.qp_context = ex.qp_context;
    attr.send_cq = ex.send_cq;
    attr.recv_cq = ex.recv_cq;
    attr.srq = ex.srq;
    attr.cap = ex.cap;
    attr.qp_type = ex.qp_type;
    attr.sq_sig_all = ex.sq_sig_all;
    r
}

/// `rdma_destroy_qp`.
pub fn destroy_qp(id: &ShimId) {
    if !id.qp().is_null() {
        // SAFETY: the id's QP; the application gives it up.
        unsafe { crate::qp::ibv_destroy_qp(id.qp()) };
        id.set_qp(std::ptr::null_mut());
    }
    destroy_cqs(id);
}

/// `rdma_destroy_srq`.
pub fn destroy_srq(id: &ShimId) {
    if !id.srq().is_null() {
        // SAFETY: the id's SRQ; the application gives it up.
        unsafe { crate::srq::ibv_destroy_srq(id.srq()) };
        id.set_srq(std::ptr::null_mut());
    }
}

/// `rdma_create_srq_ex` for basic SRQs (XRC: EOPNOTSUPP, as pmrxe has no XRC).
pub fn create_srq_ex(id: &ShimId, attr: &mut ibv_srq_init_attr_ex) -> Res<()> {
    if id.verbs().is_null() {
        return Err(Errno::INVAL);
    }
    if attr.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
        attr.comp_mask |= IBV_SRQ_INIT_ATTR_TYPE;
        attr.srq_type = IBV_SRQT_BASIC;
    }
    if attr.srq_type != IBV_SRQT_BASIC {
        return Err(Errno::OPNOTSUPP);
    }
    if attr.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
        attr.pd = id.pd();
    }
    let mut a = ibv_srq_init_attr { srq_context: attr.srq_context, attr: attr.attr };
    // SAFETY: the id's PD (ours); a valid attribute block.
    let srq = unsafe { crate::srq::ibv_create_srq(attr.pd, &mut a) };
    if srq.is_null() {
        return Err(last());
    }
    attr.attr = a.attr;
    id.set_srq(srq);
    // SAFETY: our live SRQ.
    id.set_pd(unsafe { (*srq).pd });
    Ok(())
}

// ---- exports ----

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> c_int {
    // SAFETY: NULL or the application's attributes.
    with_id(id, |i| create_qp(i, pd, unsafe { qp_init_attr.as_mut() }.ok_or(Errno::INVAL)?))
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(id: *mut rdma_cm_id, qp_init_attr: *mut ibv_qp_init_attr_ex) -> c_int {
    // SAFETY: NULL or the application's attributes.
    with_id(id, |i| create_qp_ex(i, unsafe { qp_init_attr.as_mut() }.ok_or(Errno::INVAL)?))
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    with_id(id, |i| {
        destroy_qp(i);
        Ok(())
    });
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> c_int {
    with_id(id, |i| {
        // SAFETY: NULL or the application's attributes.
        let a = unsafe { attr.as_mut() }.ok_or(Errno::INVAL)?;
        // SAFETY: plain C data.
        let mut ex: ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        ex.srq_context = a.srq_context;
        ex.attr = a.attr;
        ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
        ex.srq_type = IBV_SRQT_BASIC;
        ex.pd = if pd.is_null() { i.pd() } else { pd };
        let r = create_srq_ex(i, &mut ex);
        a.attr = ex.attr;
        r
    })
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(id: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> c_int {
    // SAFETY: NULL or the application's attributes.
    with_id(id, |i| create_srq_ex(i, unsafe { attr.as_mut() }.ok_or(Errno::INVAL)?))
}

/// # Safety
/// librdmacm contract.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    with_id(id, |i| {
        destroy_srq(i);
        Ok(())
    });
}
