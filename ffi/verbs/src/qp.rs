//! Queue pairs: create (plain and extended), modify, query, destroy, and the data path
//! (`ops.post_send`, `ops.post_recv`).
//!
//! Posting converts each WR ([`crate::post`]), stages it in the QP segment's ring, publishes
//! once per call (one release store) and rings the doorbell in the client page. Each ring has
//! one producer: a per-QP spinlock makes concurrent posters from several application threads
//! safe without system calls.
use crate::boundary::{ffi_boundary, handle, nonnull, ret_errno, ret_ptr, Errno, Handle, Mapping, Res, SpinLock};
use crate::client;
use crate::cq::ShimCq;
use crate::device::ShimContext;
use crate::pd::{ah_attr_from_c, ah_attr_to_c, ShimPd};
use crate::post::{fill_recv_wqe, fill_send_wqe, Limits};
use crate::srq::ShimSrq;
use crate::sys::*;
use pmrxe_abi::ctrl::{QpAttr, QpCap, Request, Response};
use pmrxe_abi::client::QpSegment;
use pmrxe_abi::ring::{Pod, Producer};
use pmrxe_abi::{Doorbell, QpShared, ShmRecvWqe, ShmSendWqe};
use std::sync::atomic::{AtomicU32, Ordering};
use std::os::raw::c_int;

/// Send-queue producer state (under the QP's spinlock).
pub struct SqState {
    /// The send ring's producer. Between `ibv_wr_start` and `ibv_wr_complete` it holds the
    /// `ibv_wr_*` batch staged in its slots (`Producer::staged`); every other post publishes
    /// what it stages before the lock is released.
    pub prod: Producer<ShmSendWqe>,
    /// First error seen by a `wr_*` builder call in the current batch.
    pub batch_err: Option<Errno>,
}

/// A QP handle. `ibv_qp` is the first member of `ibv_qp_ex`, which is our first field.
///
/// Verbs lets several application threads use one QP at once, so the shim only ever holds
/// `&ShimQp`: the send and receive producers sit behind their spinlocks, everything else is
/// fixed at creation except the C struct, which the application reads and writes too
/// (`qp->state`, `qpx->wr_id`, ...): it lives in an `UnsafeCell` and is reached through raw
/// pointers ([`ShimQp::state`], [`ShimQp::set_state`], [`ShimQp::ex`]).
#[repr(C)]
pub struct ShimQp {
    ex: std::cell::UnsafeCell<ibv_qp_ex>,
    magic: u64,
    pub qpn: u32,
    pub sq: SpinLock<SqState>,
    rq: Option<SpinLock<Producer<ShmRecvWqe>>>,
    _map: Mapping,
    pub doorbell: Doorbell,
    pub lim: Limits,
    cap: QpCap,
    sq_sig_all: bool,
}
handle!(ShimQp, ibv_qp_ex, 0x504d_5845_5150_3031);

impl ShimQp {
    /// Recover from a plain `ibv_qp` pointer.
    ///
    /// # Safety
    /// As [`Handle::from_c`].
    pub unsafe fn from_qp<'a>(qp: *mut ibv_qp) -> Res<&'a ShimQp> {
        // SAFETY: ibv_qp is the first member of ibv_qp_ex, our first field.
        unsafe { ShimQp::from_c(qp.cast()) }
    }

    /// Stage `wqes` and publish them; all or nothing (ENOMEM when the ring lacks room).
    pub fn post_batch(&self, sq: &mut SqState, wqes: &[ShmSendWqe]) -> Res<()> {
        self.may_post_send()?;
        for w in wqes {
            crate::post::check_wqe(w, &self.lim)?;
        }
        let free = sq.prod.free().map_err(|_| Errno::IO)?;
        if (free as usize) < wqes.len() {
            return Err(Errno::NOMEM);
        }
        for w in wqes {
            if sq.prod.stage_prefixed(w).is_err() {
                // Nothing of a failed post may stay staged (the next publish would send it).
                sq.prod.unstage();
                return Err(Errno::IO);
            }
        }
        match client::existing() {
            Ok(c) => c.publish(&mut sq.prod, self.doorbell),
            Err(e) => {
                sq.prod.unstage();
                return Err(e);
            }
        }
        Ok(())
    }

    fn shared(&self) -> &QpShared {
        // SAFETY: the QP segment (mapped for the QP's lifetime, page aligned) starts with the
        // QpShared header; it is all atomics.
        unsafe { &*(self._map.ptr() as *const QpShared) }
    }

    /// The C struct the application holds (`ibv_qp_ex`, `ibv_qp` at its start). Read and
    /// write its fields through the pointer, one field at a time: the application may be
    /// writing other fields (`wr_id`, `wr_flags`) from another thread.
    pub fn ex(&self) -> *mut ibv_qp_ex {
        self.ex.get()
    }

    /// The QP state as this process last set or queried it. Only the application moves a QP
    /// to RESET/INIT/RTR (the service can only move it to SQE/ERR), so those are exact.
    pub fn state(&self) -> u32 {
        // SAFETY: a plain integer field of our own allocation (inside the UnsafeCell); another
        // thread may be in ibv_modify_qp on the same QP (the application's race), so read it
        // as volatile, through a raw pointer (no reference to the shared struct).
        unsafe { std::ptr::addr_of!((*self.ex()).qp_base.state).read_volatile() }
    }

    /// Record the QP state `ibv_modify_qp`/`ibv_query_qp` learned (`qp->state`, which the
    /// application reads).
    fn set_state(&self, state: u32) {
        // SAFETY: as in `state`: a field of our allocation inside the UnsafeCell, written
        // through a raw pointer (volatile: other threads read it).
        unsafe { std::ptr::addr_of_mut!((*self.ex()).qp_base.state).write_volatile(state) }
    }

    /// The QP's `ibv_qp` (fixed at creation apart from `state`, which [`ShimQp::state`]
    /// reads): a copy, so no reference to the shared struct is ever held.
    fn base(&self) -> ibv_qp {
        // SAFETY: a field of our allocation inside the UnsafeCell, copied out through a raw
        // pointer; a concurrent `state` update is the application's race (volatile read).
        unsafe { std::ptr::addr_of!((*self.ex()).qp_base).read_volatile() }
    }

    /// IBTA C10-..: posting to a send queue in RESET, INIT or RTR is an immediate error
    /// (rxe: EINVAL); in RTS, SQD, SQE and ERR it is accepted (ERR flushes).
    pub fn may_post_send(&self) -> Res<()> {
        match self.state() {
            IBV_QPS_RESET | IBV_QPS_INIT | IBV_QPS_RTR => Err(Errno::INVAL),
            _ => Ok(()),
        }
    }

    /// C10-97.2.1: posting a receive to a QP in RESET is an immediate error.
    pub fn may_post_recv(&self) -> Res<()> {
        match self.state() {
            IBV_QPS_RESET => Err(Errno::INVAL),
            _ => Ok(()),
        }
    }
}

/// The common body of `ibv_post_send` and `ibv_post_recv`: convert each WR of the
/// application's list in order straight into the next ring slot (`admit` first says whether
/// the queue has room for one more, `fill` writes the slot), stop at the first that fails and
/// report it in `bad_wr`, then publish what was staged with one release store and one
/// doorbell. No WQE is built anywhere but in its slot, and nothing allocates.
///
/// # Safety
/// `wr` is the application's WR list, linked by `next`; `bad_wr` is NULL or writable.
unsafe fn stage_list<W, T: Pod>(
    prod: &mut Producer<T>,
    db: Doorbell,
    wr: *mut W,
    next: impl Fn(&W) -> *mut W,
    mut admit: impl FnMut(&Producer<T>) -> Res<()>,
    mut fill: impl FnMut(&W, &mut T) -> Res<()>,
    bad_wr: *mut *mut W,
) -> Res<()> {
    let mut cur = wr;
    let mut staged = 0usize;
    let mut result = Ok(());
    while !cur.is_null() {
        // SAFETY: the application's WR list (the post verbs' contract).
        let w = unsafe { &*cur };
        let r = admit(prod).and_then(|()| prod.stage_with(|slot| fill(w, slot)));
        if let Err(e) = r {
            result = Err(e);
            break;
        }
        staged += 1;
        cur = next(w);
    }
    if staged > 0 {
        // A queue implies a connection; without one, nothing staged may stay for a later
        // publish to send.
        match client::existing() {
            Ok(c) => c.publish(prod, db),
            Err(e) => {
                prod.unstage();
                return Err(e);
            }
        }
    }
    if result.is_err() && !bad_wr.is_null() {
        // SAFETY: caller-provided out pointer.
        unsafe { *bad_wr = cur };
    }
    result
}

/// The body of `ops.post_send`.
///
/// # Safety
/// The `ibv_post_send` contract: `qp` is NULL or one of this shim's QPs; `wr` is the
/// application's WR list (SGE lists, inline buffers, AH/MW/MR handles valid); `bad_wr` is NULL
/// or writable.
unsafe fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> Res<()> {
    // SAFETY: magic-checked.
    let q = unsafe { ShimQp::from_qp(qp) }?;
    if let Err(e) = q.may_post_send() {
        if !bad_wr.is_null() {
            // SAFETY: caller-provided out pointer.
            unsafe { *bad_wr = wr };
        }
        return Err(e);
    }
    let mut sq = q.sq.lock();
    // SAFETY: the application's WR list and out pointer (ibv_post_send contract); each WR's
    // SGE list and inline buffers are the application's (same contract).
    unsafe { stage_list(&mut sq.prod, q.doorbell, wr, |w| w.next, |_| Ok(()), |w, slot| fill_send_wqe(slot, w, &q.lim), bad_wr) }
}

/// `ops.post_send`.
///
/// # Safety
/// libibverbs `ibv_post_send` contract.
pub unsafe extern "C" fn op_post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    // SAFETY: forwarded ibv_post_send contract.
    ffi_boundary(libc::EIO, || ret_errno(unsafe { post_send(qp, wr, bad_wr) }))
}

/// Post receive WRs into a receive ring (QP RQ or SRQ).
///
/// # Safety
/// `wr` is the application's receive WR list (each `sg_list` holding `num_sge` entries);
/// `bad_wr` is NULL or writable (the `ibv_post_recv` contract).
pub unsafe fn post_recv_ring(
    ring: &SpinLock<Producer<ShmRecvWqe>>,
    max_sge: u32,
    db: Doorbell,
    occupancy: Option<(&AtomicU32, u32)>,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> Res<()> {
    let mut p = ring.lock();
    // The queue holds `max_wr` WQEs from post to completion (QpShared): refuse beyond it.
    let admit = |p: &Producer<ShmRecvWqe>| match occupancy {
        Some((retired, max_wr)) if p.head().wrapping_sub(retired.load(Ordering::Acquire)) >= max_wr => Err(Errno::NOMEM),
        _ => Ok(()),
    };
    // SAFETY: the WR's SGE list (ibv_post_recv contract).
    let fill = |w: &ibv_recv_wr, slot: &mut ShmRecvWqe| unsafe { fill_recv_wqe(slot, w, max_sge) };
    // SAFETY: the application's WR list and out pointer (same contract).
    unsafe { stage_list(&mut p, db, wr, |w| w.next, admit, fill, bad_wr) }
}

/// `ops.post_recv`.
///
/// # Safety
/// libibverbs `ibv_post_recv` contract.
pub unsafe extern "C" fn op_post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let q = unsafe { ShimQp::from_qp(qp) }?;
            let rq = q.rq.as_ref().filter(|_| q.may_post_recv().is_ok());
            let Some(rq) = rq else {
                if !bad_wr.is_null() {
                    // SAFETY: caller-provided out pointer.
                    unsafe { *bad_wr = wr };
                }
                return Err(Errno::INVAL); // RESET, or the QP uses an SRQ
            };
            // SAFETY: forwarded ibv_post_recv contract.
            unsafe { post_recv_ring(rq, q.lim.max_recv_sge, q.doorbell, Some((&q.shared().rq_retired, q.cap.max_recv_wr)), wr, bad_wr) }
        })())
    })
}

/// `ibv_wr_*` operations our QPs execute (`send_ops_flags` of `ibv_create_qp_ex`): everything
/// but TSO and ATOMIC_WRITE.
const SUPPORTED_SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW
    | IBV_QP_EX_WITH_SEND_WITH_INV) as u64;

fn create_qp(context: *mut ibv_context, a: &mut ibv_qp_init_attr_ex) -> Res<*mut ibv_qp> {
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
        return Err(Errno::INVAL);
    }
    let supported = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    if a.comp_mask & !supported != 0 {
        return Err(Errno::OPNOTSUPP);
    }
    // No creation flag (scatter-FCS, CVLAN stripping, ...) is implemented; 0 is just "none".
    if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
        return Err(Errno::OPNOTSUPP);
    }
    // Refuse at creation what the QP could not execute (rather than failing at wr_complete).
    if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 && a.send_ops_flags & !SUPPORTED_SEND_OPS != 0 {
        return Err(Errno::OPNOTSUPP);
    }
    // SAFETY: magic-checked handles.
    let pd = unsafe { ShimPd::from_c(a.pd) }?;
    let ctx = pd.ctx()?;
    if !context.is_null() && context != ctx.as_ctx() {
        return Err(Errno::INVAL);
    }
    if !matches!(a.qp_type, IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_UD) {
        return Err(Errno::OPNOTSUPP);
    }
    // SAFETY: magic-checked handles.
    let (send_cq, recv_cq) = unsafe { (ShimCq::handle_of(a.send_cq)?, ShimCq::handle_of(a.recv_cq)?) };
    let srq = if a.srq.is_null() {
        None
    } else {
        // SAFETY: magic-checked.
        Some(unsafe { ShimSrq::from_c(a.srq) }?.handle)
    };
    let want = QpCap {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: if srq.is_some() { 0 } else { a.cap.max_recv_wr },
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: if srq.is_some() { 0 } else { a.cap.max_recv_sge },
        max_inline_data: a.cap.max_inline_data,
    };
    let req = Request::CreateQp {
        device: ctx.dev,
        pd: pd.pd.handle,
        qp_type: a.qp_type,
        send_cq,
        recv_cq,
        srq,
        cap: want,
        sq_sig_all: a.sq_sig_all != 0,
    };
    let c = client::existing()?;
    let (r, fds) = c.call(&req, &[])?;
    let Response::Qp { qpn, cap, layout, doorbell } = r else { return Err(Errno(libc::EPROTO)) };
    let QpSegment { sq: prod, rq, map } = QpSegment::attach(&fds, &layout, srq.is_none())?;
    let rq = rq.map(SpinLock::new);
    // SAFETY: plain C data.
    let mut ex: ibv_qp_ex = unsafe { std::mem::zeroed() };
    let b = &mut ex.qp_base;
    b.context = ctx.as_ctx();
    b.qp_context = a.qp_context;
    b.pd = a.pd;
    b.send_cq = a.send_cq;
    b.recv_cq = a.recv_cq;
    b.srq = a.srq;
    b.handle = qpn;
    b.qp_num = qpn;
    b.state = IBV_QPS_RESET;
    b.qp_type = a.qp_type;
    crate::qpex::install(&mut ex);
    let lim = Limits { max_send_sge: cap.max_send_sge, max_recv_sge: cap.max_recv_sge, max_inline: cap.max_inline_data, qp_type: a.qp_type };
    let q = Box::new(ShimQp {
        ex: std::cell::UnsafeCell::new(ex),
        magic: ShimQp::MAGIC,
        qpn,
        sq: SpinLock::new(SqState { prod, batch_err: None }),
        rq,
        _map: map,
        doorbell,
        lim,
        cap,
        sq_sig_all: a.sq_sig_all != 0,
    });
    // ibv_create_qp reports the granted capabilities back through the attributes.
    a.cap = ibv_qp_cap {
        max_send_wr: cap.max_send_wr,
        max_recv_wr: cap.max_recv_wr,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: cap.max_recv_sge,
        max_inline_data: cap.max_inline_data,
    };
    let p: *mut ibv_qp = q.into_c().cast();
    crate::registry::insert(crate::registry::Kind::Qp, qpn, p);
    Ok(p)
}

/// # Safety
/// `pd` ours, `attr` readable/writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    ffi_boundary(std::ptr::null_mut(), || {
        ret_ptr((|| {
            // SAFETY: caller contract.
            let a = unsafe { nonnull(attr) }?;
            // SAFETY: plain C data.
            let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
            ex.qp_context = a.qp_context;
            ex.send_cq = a.send_cq;
            ex.recv_cq = a.recv_cq;
            ex.srq = a.srq;
            ex.cap = a.cap;
            ex.qp_type = a.qp_type;
            ex.sq_sig_all = a.sq_sig_all;
            ex.comp_mask = IBV_QP_INIT_ATTR_PD;
            ex.pd = pd;
            let r = create_qp(std::ptr::null_mut(), &mut ex)?;
            a.cap = ex.cap;
            Ok(r)
        })())
    })
}

/// `verbs_context.create_qp_ex`.
///
/// # Safety
/// `attr` readable/writable.
pub unsafe extern "C" fn vctx_create_qp_ex(context: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    ffi_boundary(std::ptr::null_mut(), || {
        // SAFETY: caller contract; context magic-checked.
        ret_ptr(unsafe { ShimContext::from_ctx(context) }.and_then(|_| unsafe { nonnull(attr) }).and_then(|a| create_qp(context, a)))
    })
}

/// `ibv_qp_to_qp_ex@1.6`: our QPs are always extended.
///
/// # Safety
/// `qp` is ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    ffi_boundary(std::ptr::null_mut(), || {
        // SAFETY: magic-checked.
        ret_ptr(unsafe { ShimQp::from_qp(qp) }.map(|q| q.ex()))
    })
}

/// Convert the application's attributes (only what `mask` names is meaningful).
pub fn qp_attr_from_c(a: &ibv_qp_attr) -> QpAttr {
    QpAttr {
        qp_state: a.qp_state,
        cur_qp_state: a.cur_qp_state,
        path_mtu: a.path_mtu,
        path_mig_state: a.path_mig_state,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags,
        cap: QpCap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        },
        ah_attr: ah_attr_from_c(&a.ah_attr),
        pkey_index: a.pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify,
        sq_draining: a.sq_draining,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
    }
}

pub fn qp_attr_to_c(a: &QpAttr, out: &mut ibv_qp_attr) {
    // SAFETY: plain C data.
    *out = unsafe { std::mem::zeroed() };
    out.qp_state = a.qp_state;
    out.cur_qp_state = a.cur_qp_state;
    out.path_mtu = a.path_mtu;
    out.path_mig_state = a.path_mig_state;
    out.qkey = a.qkey;
    out.rq_psn = a.rq_psn;
    out.sq_psn = a.sq_psn;
    out.dest_qp_num = a.dest_qp_num;
    out.qp_access_flags = a.qp_access_flags;
    out.cap = cap_to_c(&a.cap);
    out.ah_attr = ah_attr_to_c(&a.ah_attr);
    out.pkey_index = a.pkey_index;
    out.en_sqd_async_notify = a.en_sqd_async_notify;
    out.sq_draining = a.sq_draining;
    out.max_rd_atomic = a.max_rd_atomic;
    out.max_dest_rd_atomic = a.max_dest_rd_atomic;
    out.min_rnr_timer = a.min_rnr_timer;
    out.port_num = a.port_num;
    out.timeout = a.timeout;
    out.retry_cnt = a.retry_cnt;
    out.rnr_retry = a.rnr_retry;
}

fn cap_to_c(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// # Safety
/// `qp` ours, `attr` readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked; caller-provided attributes.
            let (q, a) = unsafe { (ShimQp::from_qp(qp)?, nonnull(attr)?) };
            let mask = attr_mask as u32;
            let cur = q.state();
            crate::qp_state::check(q.lim.qp_type, cur, a, mask)?;
            if mask & IBV_QP_AV != 0 {
                crate::pd::check_roce_ah(&ah_attr_from_c(&a.ah_attr))?;
            }
            client::existing()?.call_ok(&Request::ModifyQp { qpn: q.qpn, attr: qp_attr_from_c(a), mask })?;
            if mask & IBV_QP_STATE != 0 {
                q.set_state(a.qp_state);
                if a.qp_state == IBV_QPS_RESET {
                    purge_cqs(q)?;
                }
            }
            Ok(())
        })())
    })
}

/// Drop QP `q`'s completions still waiting in its send and receive CQs (reset or destroy).
fn purge_cqs(q: &ShimQp) -> Res<()> {
    let b = q.base();
    let (scq, rcq) = (b.send_cq, b.recv_cq);
    for cq in [scq, rcq] {
        // SAFETY: the QP's CQs are ours (checked at create) and outlive it.
        if let Ok(c) = unsafe { ShimCq::from_cq(cq) } {
            c.purge_qp(q.qpn)?;
        }
        if scq == rcq {
            break;
        }
    }
    Ok(())
}

/// # Safety
/// `qp` ours; `attr`, `init_attr` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, _attr_mask: c_int, init_attr: *mut ibv_qp_init_attr) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked; caller-provided out pointers.
            let (q, a, ia) = unsafe { (ShimQp::from_qp(qp)?, nonnull(attr)?, nonnull(init_attr)?) };
            let (r, _) = client::existing()?.call(&Request::QueryQp { qpn: q.qpn }, &[])?;
            let Response::QpAttr { attr: qa, init_cap } = r else { return Err(Errno(libc::EPROTO)) };
            qp_attr_to_c(&qa, a);
            // The inline limit we enforce is the granted one.
            if a.cap.max_inline_data == 0 {
                a.cap.max_inline_data = q.cap.max_inline_data;
            }
            let b = q.base();
            ia.qp_context = b.qp_context;
            ia.send_cq = b.send_cq;
            ia.recv_cq = b.recv_cq;
            ia.srq = b.srq;
            ia.cap = cap_to_c(&init_cap);
            ia.qp_type = b.qp_type;
            ia.sq_sig_all = c_int::from(q.sq_sig_all);
            q.set_state(qa.qp_state);
            Ok(())
        })())
    })
}

/// # Safety
/// `qp` ours; the application no longer uses it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let q = unsafe { ShimQp::from_qp(qp) }?;
            client::existing()?.call_ok(&Request::DestroyQp { qpn: q.qpn })?;
            // The service produces nothing for the QP any more: drop its completions still in
            // the CQs, as mlx5 does. An application frees the buffers its receive WQEs named
            // once the QP is gone (libfabric's rxm at endpoint close) and may poll the CQ again
            // (progress during close): a flush completion left behind would hand it a wr_id
            // pointing at freed memory. fi_pingpong -e rdm crashed so in about 1 run in 20.
            // The QP is gone at the service either way: a CQ ring found corrupt here (EIO, which
            // its next poll reports) must not leave the QP half destroyed.
            let _ = purge_cqs(q);
            crate::registry::remove(crate::registry::Kind::Qp, q.qpn);
            // SAFETY: validated above.
            drop(unsafe { ShimQp::take(qp.cast()) });
            Ok(())
        })())
    })
}
