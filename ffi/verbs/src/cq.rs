//! Completion queues and completion channels.
//!
//! Data path: the CQ segment holds a [`CqNotify`] and an SPSC ring of [`ShmCqe`] produced by
//! the service; the shim is the consumer. `poll_cq` copies CQEs out under the CQ's spinlock
//! and releases the slots once per call. No system call.
//!
//! Events: `req_notify_cq` stores the arm state into `CqNotify.armed`; when the service fires
//! it bumps `CqNotify.events` and writes the channel's eventfd. `ibv_get_cq_event` blocks on
//! the eventfd, then looks for CQs of the channel whose `events` advanced past what it has
//! delivered, queueing one pending event per increment.
use crate::boundary::{ffi_boundary, handle, nonnull, ret_count, ret_errno, ret_minus1, ret_ptr, set_errno, Errno, Handle, Mapping, Res, SpinLock};
use crate::client;
use crate::device::ShimContext;
use crate::sys::*;
use pmrxe_abi::ctrl::{Request, Response};
use pmrxe_abi::client::{poll_cq, CqSegment};
use pmrxe_abi::ring::Consumer;
use pmrxe_abi::{CqNotify, ShmCqe};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// Consumer state of a CQ (under the spinlock).
pub struct CqRing {
    cons: Consumer<ShmCqe>,
    /// The CQE the extended poll API (`start_poll`/`next_poll`) is positioned on.
    cur: Option<ShmCqe>,
}

/// A CQ handle; `ibv_cq` is the prefix of `ibv_cq_ex`, so one struct serves both APIs.
///
/// Several application threads may poll, arm and acknowledge one CQ at once, so the shim only
/// ever holds `&ShimCq`: the consumer sits behind the ring's spinlock, the event counters are
/// atomics, and the C struct (whose `wr_id`, `status`, `cqe` and `comp_events_completed` the
/// application reads while we write them) lives in an `UnsafeCell`, reached field by field
/// through [`ShimCq::ex`].
#[repr(C)]
pub struct ShimCq {
    ex: std::cell::UnsafeCell<ibv_cq_ex>,
    magic: u64,
    pub handle: u32,
    ring: SpinLock<CqRing>,
    notify: *const CqNotify,
    _map: Mapping,
    channel: *const ShimChannel,
    /// `CqNotify.events` value up to which events were queued for delivery.
    events_seen: AtomicU32,
}
handle!(ShimCq, ibv_cq_ex, 0x504d_5845_4351_3031);

impl ShimCq {
    /// Recover from a plain `ibv_cq` pointer.
    ///
    /// # Safety
    /// As [`Handle::from_c`].
    pub unsafe fn from_cq<'a>(cq: *mut ibv_cq) -> Res<&'a ShimCq> {
        // SAFETY: ibv_cq is the prefix of ibv_cq_ex, the first field of ShimCq.
        unsafe { ShimCq::from_c(cq.cast()) }
    }
    /// The C struct the application holds; read and write it one field at a time through
    /// this pointer, never through a reference (the application reads it concurrently).
    pub fn ex(&self) -> *mut ibv_cq_ex {
        self.ex.get()
    }
    fn notify(&self) -> &CqNotify {
        // SAFETY: points into `_map`, which lives as long as `self`; fields are atomics.
        unsafe { &*self.notify }
    }
    /// Service-side handle of a CQ pointer given by the application.
    ///
    /// # Safety
    /// As [`Handle::from_c`].
    pub unsafe fn handle_of(cq: *mut ibv_cq) -> Res<u32> {
        // SAFETY: forwarded.
        Ok(unsafe { ShimCq::from_cq(cq) }?.handle)
    }
}

/// Convert a CQE to `struct ibv_wc` (field for field; values are libibverbs values).
pub fn cqe_to_wc(e: &ShmCqe) -> ibv_wc {
    // SAFETY: plain C data.
    let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
    wc.wr_id = e.wr_id;
    wc.status = e.status;
    wc.opcode = e.opcode;
    wc.vendor_err = e.vendor_err;
    wc.byte_len = e.byte_len;
    wc.__bindgen_anon_1.imm_data = e.imm_or_inv;
    wc.qp_num = e.qp_num;
    wc.src_qp = e.src_qp;
    wc.wc_flags = e.wc_flags;
    wc.pkey_index = e.pkey_index;
    wc.slid = e.slid;
    wc.sl = e.sl;
    wc.dlid_path_bits = e.dlid_path_bits;
    wc
}

/// `ops.poll_cq`.
///
/// # Safety
/// `wc` has room for `num_entries` entries.
pub unsafe extern "C" fn op_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    ffi_boundary(-libc::EIO, || {
        ret_count((|| {
            // SAFETY: magic-checked.
            let c = unsafe { ShimCq::from_cq(cq) }?;
            if num_entries <= 0 {
                return Ok(0);
            }
            if wc.is_null() {
                return Err(Errno::INVAL);
            }
            let mut r = c.ring.lock();
            let n = poll_cq(&mut r.cons, num_entries as usize, |i, e| {
                // SAFETY: i < num_entries, the caller's array size.
                unsafe { wc.add(i).write(cqe_to_wc(&e)) }
            })
            .map_err(|_| Errno::IO)?;
            if n == 0 {
                if let Ok(cl) = crate::client::existing() {
                    if cl.dead_after_empty_poll() {
                        // The service is gone: nothing will ever complete. Fail instead of hanging.
                        return Err(Errno::IO);
                    }
                    drop(r);
                    cl.yield_to_waiting_lcore();
                }
            }
            Ok(n as c_int)
        })())
    })
}

/// `ops.req_notify_cq`.
///
/// # Safety
/// `cq` is ours.
pub unsafe extern "C" fn op_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let c = unsafe { ShimCq::from_cq(cq) }?;
            // Ordered before the application's next poll (`CqNotify::arm`: the Dekker pair
            // with the lcore, which publishes, fences, then takes the arm).
            c.notify().arm(solicited_only != 0);
            Ok(())
        })())
    })
}

/// A completion channel.
#[repr(C)]
pub struct ShimChannel {
    pub ch: ibv_comp_channel,
    magic: u64,
    pub handle: u32,
    efd: OwnedFd,
    state: Mutex<ChanState>,
}
handle!(ShimChannel, ibv_comp_channel, 0x504d_5845_4343_3031);

#[derive(Default)]
struct ChanState {
    /// CQs attached to this channel (ShimCq addresses).
    cqs: Vec<usize>,
    /// CQs with an event not yet returned by ibv_get_cq_event.
    pending: VecDeque<usize>,
}

/// # Safety
/// `context` is ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    ffi_boundary(std::ptr::null_mut(), || {
        ret_ptr((|| {
            // SAFETY: magic-checked.
            let c = unsafe { ShimContext::from_ctx(context) }?;
            let (r, mut fds) = client::existing()?.call(&Request::CreateCompChannel { device: c.dev }, &[])?;
            let Response::CompChannel { channel } = r else { return Err(Errno(libc::EPROTO)) };
            if fds.is_empty() {
                return Err(Errno(libc::EPROTO));
            }
            let efd = fds.swap_remove(0);
            // `channel->fd` is blocking by default in libibverbs; applications that want
            // non-blocking reads set O_NONBLOCK themselves (and then get EAGAIN). The service may
            // have created its eventfd non-blocking, and the flag lives in the shared file
            // description, so clear it here (an eventfd write of 1 never blocks in practice).
            // SAFETY: fcntl on an fd we own.
            unsafe {
                let fl = libc::fcntl(efd.as_raw_fd(), libc::F_GETFL);
                if fl >= 0 && fl & libc::O_NONBLOCK != 0 {
                    libc::fcntl(efd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
                }
            }
            let ch = ibv_comp_channel { context, fd: efd.as_raw_fd(), refcnt: 0 };
            Ok(Box::new(ShimChannel { ch, magic: ShimChannel::MAGIC, handle: channel, efd, state: Mutex::new(ChanState::default()) }).into_c())
        })())
    })
}

/// # Safety
/// `channel` is ours and has no CQs left.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let ch = unsafe { ShimChannel::from_c(channel) }?;
            if !ch.state.lock().unwrap_or_else(|e| e.into_inner()).cqs.is_empty() {
                return Err(Errno(libc::EBUSY));
            }
            client::existing()?.call_ok(&Request::DestroyCompChannel { channel: ch.handle })?;
            // SAFETY: validated above.
            drop(unsafe { ShimChannel::take(channel) });
            Ok(())
        })())
    })
}

fn create_cq(context: *mut ibv_context, cqe: c_int, cq_context: *mut c_void, channel: *mut ibv_comp_channel, comp_vector: c_int) -> Res<Box<ShimCq>> {
    // SAFETY: magic-checked.
    let c = unsafe { ShimContext::from_ctx(context) }?;
    // As the kernel: the vector must be one the context reported (num_comp_vectors).
    if cqe <= 0 || comp_vector < 0 || comp_vector >= c.num_comp_vectors() {
        return Err(Errno::INVAL);
    }
    let ch = if channel.is_null() {
        None
    } else {
        // SAFETY: magic-checked.
        Some(unsafe { ShimChannel::from_c(channel) }?)
    };
    let req = Request::CreateCq { device: c.dev, cqe: cqe as u32, channel: ch.as_ref().map(|c| c.handle) };
    let (r, fds) = client::existing()?.call(&req, &[])?;
    let Response::Cq { cq, cqe, layout } = r else { return Err(Errno(libc::EPROTO)) };
    let seg = CqSegment::attach(&fds, &layout)?;
    let notify = seg.notify();
    let CqSegment { cons, map } = seg;
    // SAFETY: plain C data.
    let mut ex: ibv_cq_ex = unsafe { std::mem::zeroed() };
    ex.context = context;
    ex.channel = channel;
    ex.cq_context = cq_context;
    ex.handle = cq;
    ex.cqe = cqe as c_int;
    let start = notify_events(notify);
    let b = Box::new(ShimCq {
        ex: std::cell::UnsafeCell::new(ex),
        magic: ShimCq::MAGIC,
        handle: cq,
        ring: SpinLock::new(CqRing { cons, cur: None }),
        notify,
        _map: map,
        channel: ch.map(|c| c as *const ShimChannel).unwrap_or(std::ptr::null()),
        events_seen: AtomicU32::new(start),
    });
    Ok(b)
}

impl ShimCq {
    /// Drop the completions of QP `qpn` still waiting in this CQ (the QP was reset or
    /// destroyed: IBTA leaves them undefined, mlx5 removes them, and so do we, so that a reused
    /// QP's first poll does not see the previous incarnation's flushes and no completion
    /// outlives its QP).
    pub fn purge_qp(&self, qpn: u32) -> Res<u32> {
        let mut r = self.ring.lock();
        if r.cur.is_some_and(|e| e.qp_num == qpn) {
            // Only between start_poll and end_poll of this very thread; leave it to end_poll.
            return Ok(0);
        }
        r.cons.retain(|e| e.qp_num != qpn).map_err(|_| Errno::IO)
    }
}

fn notify_events(n: *const CqNotify) -> u32 {
    // SAFETY: `n` points into a live CQ mapping.
    unsafe { &*n }.events.load(Ordering::Acquire)
}

fn attach_to_channel(cq: &ShimCq) {
    if !cq.channel.is_null() {
        // SAFETY: validated when the CQ was created; channels outlive their CQs (EBUSY).
        let ch = unsafe { &*cq.channel };
        ch.state.lock().unwrap_or_else(|e| e.into_inner()).cqs.push(cq as *const ShimCq as usize);
    }
}

/// # Safety
/// `context` is ours; `channel` NULL or ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    ffi_boundary(std::ptr::null_mut(), || {
        ret_ptr(create_cq(context, cqe, cq_context, channel, comp_vector).map(|b| {
            let p = Box::into_raw(b);
            // SAFETY: fresh allocation.
            attach_to_channel(unsafe { &*p });
            // SAFETY: fresh allocation.
            crate::registry::insert(crate::registry::Kind::Cq, unsafe { (*p).handle }, p.cast::<ibv_cq>());
            p.cast::<ibv_cq>()
        }))
    })
}

/// Completion fields the extended CQ can report.
const SUPPORTED_WC_FLAGS: u64 = (IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

/// `verbs_context.create_cq_ex`. Timestamps, CVLAN, flow tag and TM info are not available
/// (EOPNOTSUPP, as a device without them answers).
///
/// # Safety
/// `attr` readable.
pub unsafe extern "C" fn vctx_create_cq_ex(context: *mut ibv_context, attr: *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex {
    ffi_boundary(std::ptr::null_mut(), || {
        ret_ptr((|| {
            // SAFETY: caller contract.
            let a = unsafe { nonnull(attr) }?;
            if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
                return Err(Errno::OPNOTSUPP);
            }
            if a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 || a.cqe == 0 || a.cqe > i32::MAX as u32 {
                return Err(Errno::INVAL);
            }
            let vector = i32::try_from(a.comp_vector).map_err(|_| Errno::INVAL)?;
            let mut b = create_cq(context, a.cqe as c_int, a.cq_context, a.channel, vector)?;
            let e = b.ex.get_mut();
            e.start_poll = Some(ex_start_poll);
            e.next_poll = Some(ex_next_poll);
            e.end_poll = Some(ex_end_poll);
            e.read_opcode = Some(ex_read_opcode);
            e.read_vendor_err = Some(ex_read_vendor_err);
            e.read_byte_len = Some(ex_read_byte_len);
            e.read_imm_data = Some(ex_read_imm_data);
            e.read_qp_num = Some(ex_read_qp_num);
            e.read_src_qp = Some(ex_read_src_qp);
            e.read_wc_flags = Some(ex_read_wc_flags);
            e.read_slid = Some(ex_read_slid);
            e.read_sl = Some(ex_read_sl);
            e.read_dlid_path_bits = Some(ex_read_dlid_path_bits);
            let p = Box::into_raw(b);
            // SAFETY: fresh allocation.
            attach_to_channel(unsafe { &*p });
            // SAFETY: fresh allocation.
            crate::registry::insert(crate::registry::Kind::Cq, unsafe { (*p).handle }, p.cast::<ibv_cq>());
            Ok(p.cast::<ibv_cq_ex>())
        })())
    })
}

/// The CQ from an `ibv_cq_ex` callback (the pointer is ours by construction: only our CQs
/// carry these callbacks).
///
/// # Safety
/// `cq` is the `ibv_cq_ex` of a live CQ of this shim (only they carry the callbacks).
unsafe fn ex_cq<'a>(cq: *mut ibv_cq_ex) -> &'a ShimCq {
    // SAFETY: see above.
    unsafe { &*cq.cast::<ShimCq>() }
}

/// Position on the next CQE (consuming the current one); ENOENT when empty.
///
/// # Safety
/// The calling thread holds `c.ring` (taken with `raw_lock` in `start_poll`).
unsafe fn ex_step(c: &ShimCq, consume_current: bool) -> c_int {
    // SAFETY: the lock is held from start_poll to end_poll by this thread (contract).
    let r = unsafe { c.ring.raw_get() };
    if consume_current && r.cur.take().is_some() {
        r.cons.advance();
    }
    match r.cons.peek() {
        Ok(Some(e)) => {
            let x = c.ex();
            // SAFETY: fields of our allocation inside the UnsafeCell, written through the raw
            // pointer; the application reads them after this callback returns (same thread).
            unsafe {
                (*x).wr_id = e.wr_id;
                (*x).status = e.status;
            }
            r.cur = Some(e);
            0
        }
        Ok(None) => libc::ENOENT,
        Err(_) => libc::EIO,
    }
}

/// `ibv_start_poll`: take the CQ's lock (held until `end_poll`, or released here when there is
/// nothing to poll) and position on the first completion.
///
/// # Safety
/// `cq` is one of this shim's extended CQs (only they carry the callback); the calling thread
/// does not hold its lock already.
unsafe extern "C" fn ex_start_poll(cq: *mut ibv_cq_ex, _attr: *mut ibv_poll_cq_attr) -> c_int {
    ffi_boundary(libc::EIO, || {
        // SAFETY: only our CQs have this callback.
        let c = unsafe { ex_cq(cq) };
        c.ring.raw_lock();
        // SAFETY: locked just above by this thread.
        let rc = unsafe { ex_step(c, false) };
        if rc != 0 {
            // Per the API, end_poll is not called when start_poll fails.
            // SAFETY: locked just above by this thread.
            unsafe { c.ring.raw_unlock() };
            if rc == libc::ENOENT {
                // Empty, as in `op_poll_cq`: let a woken lcore on this CPU run.
                if let Ok(cl) = crate::client::existing() {
                    cl.yield_to_waiting_lcore();
                }
            }
        }
        rc
    })
}

/// `ibv_next_poll`: consume the current completion, position on the next.
///
/// # Safety
/// `cq` is one of this shim's extended CQs and the calling thread holds its lock since a
/// successful `start_poll`.
unsafe extern "C" fn ex_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: only our CQs have this callback; lock held since start_poll.
    ffi_boundary(libc::EIO, || unsafe { ex_step(ex_cq(cq), true) })
}

/// `ibv_end_poll`: consume the current completion, release the slots and the lock.
///
/// # Safety
/// As [`ex_next_poll`].
unsafe extern "C" fn ex_end_poll(cq: *mut ibv_cq_ex) {
    ffi_boundary((), || {
        // SAFETY: only our CQs have this callback.
        let c = unsafe { ex_cq(cq) };
        // SAFETY: lock held since start_poll.
        let r = unsafe { c.ring.raw_get() };
        if r.cur.take().is_some() {
            r.cons.advance();
        }
        r.cons.release();
        // SAFETY: held since start_poll by this thread.
        unsafe { c.ring.raw_unlock() };
    })
}

/// The completion the extended poll API is positioned on (zeroes when none).
///
/// # Safety
/// As [`ex_next_poll`]: `cq` is ours and the calling thread holds its lock (between a
/// successful `start_poll` and `end_poll`).
unsafe fn cur(cq: *mut ibv_cq_ex) -> ShmCqe {
    // SAFETY: the contract above.
    unsafe { ex_cq(cq).ring.raw_get() }.cur.unwrap_or_default()
}
/// `ibv_wc_read_opcode` of the current completion.
///
/// # Safety
/// As [`ex_next_poll`].
unsafe extern "C" fn ex_read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode {
    // SAFETY: the callback's contract is `cur`'s.
    unsafe { cur(cq) }.opcode
}
/// `ibv_wc_read_vendor_err` of the current completion.
///
/// # Safety
/// As [`ex_next_poll`].
unsafe extern "C" fn ex_read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the callback's contract is `cur`'s.
    unsafe { cur(cq) }.vendor_err
}
/// `ibv_wc_read_byte_len` of the current completion.
///
/// # Safety
/// As [`ex_next_poll`].
unsafe extern "C" fn ex_read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the callback's contract is `cur`'s.
    unsafe { cur(cq) }.byte_len
}
/// `ibv_wc_read_imm_data` of the current completion.
///
/// # Safety
/// As [`ex_next_poll`].
unsafe extern "C" fn ex_read_imm_data(cq: *mut ibv_cq_ex) -> __be32 {
    // SAFETY: the callback's contract is `cur`'s.
    unsafe { cur(cq) }.imm_or_inv
}
/// `ibv_wc_read_qp_num` of the current completion.
///
/// # Safety
/// As [`ex_next_poll`].
unsafe extern "C" fn ex_read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the callback's contract is `cur`'s.
    unsafe { cur(cq) }.qp_num
}
/// `ibv_wc_read_src_qp` of the current completion.
///
/// # Safety
/// As [`ex_next_poll`].
unsafe extern "C" fn ex_read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the callback's contract is `cur`'s.
    unsafe { cur(cq) }.src_qp
}
/// `ibv_wc_read_wc_flags` of the current completion.
///
/// # Safety
/// As [`ex_next_poll`].
unsafe extern "C" fn ex_read_wc_flags(cq: *mut ibv_cq_ex) -> std::os::raw::c_uint {
    // SAFETY: the callback's contract is `cur`'s.
    unsafe { cur(cq) }.wc_flags
}
/// `ibv_wc_read_slid` of the current completion.
///
/// # Safety
/// As [`ex_next_poll`].
unsafe extern "C" fn ex_read_slid(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the callback's contract is `cur`'s.
    u32::from(unsafe { cur(cq) }.slid)
}
/// `ibv_wc_read_sl` of the current completion.
///
/// # Safety
/// As [`ex_next_poll`].
unsafe extern "C" fn ex_read_sl(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: the callback's contract is `cur`'s.
    unsafe { cur(cq) }.sl
}
/// `ibv_wc_read_dlid_path_bits` of the current completion.
///
/// # Safety
/// As [`ex_next_poll`].
unsafe extern "C" fn ex_read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: the callback's contract is `cur`'s.
    unsafe { cur(cq) }.dlid_path_bits
}

/// # Safety
/// `cq` is ours; no QP uses it any more.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let c = unsafe { ShimCq::from_cq(cq) }?;
            client::existing()?.call_ok(&Request::DestroyCq { cq: c.handle })?;
            crate::registry::remove(crate::registry::Kind::Cq, c.handle);
            if !c.channel.is_null() {
                // SAFETY: channels outlive their CQs (destroy_comp_channel refuses with EBUSY).
                let ch = unsafe { &*c.channel };
                let me = c as *const ShimCq as usize;
                let mut st = ch.state.lock().unwrap_or_else(|e| e.into_inner());
                st.cqs.retain(|x| *x != me);
                st.pending.retain(|x| *x != me);
            }
            // SAFETY: validated above.
            drop(unsafe { ShimCq::take(cq.cast()) });
            Ok(())
        })())
    })
}

/// `ibv_resize_cq`: the ring is sized at creation (at least 63 usable entries); a request
/// that fits the existing ring succeeds (and updates `cqe`), a larger one is EOPNOTSUPP
/// (docs/limits.md), one below the completions waiting to be polled is EINVAL.
///
/// # Safety
/// `cq` is ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let c = unsafe { ShimCq::from_cq(cq) }?;
            if cqe <= 0 {
                return Err(Errno::INVAL);
            }
            // Hold the ring so nothing is polled while the service counts what is waiting.
            let ring = c.ring.lock();
            let r = client::existing()?.call_ok(&Request::ResizeCq { cq: c.handle, cqe: cqe as u32 });
            drop(ring);
            r?;
            // SAFETY: a field of our allocation inside the UnsafeCell, written through the raw
            // pointer (volatile: other threads of the application may read it).
            unsafe { std::ptr::addr_of_mut!((*c.ex()).cqe).write_volatile(cqe) };
            Ok(())
        })())
    })
}

/// One step of `ibv_get_cq_event`.
enum CqEventStep {
    /// The call's return value (errno set).
    Done(c_int),
    /// Nothing pending: block reading the channel's eventfd, then look again.
    Block(c_int),
}

/// `ibv_get_cq_event` without blocking: a pending event, or the fd to wait on.
///
/// # Safety
/// As `ibv_get_cq_event`.
unsafe fn cq_event_step(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> Res<Option<c_int>> {
    // SAFETY: magic-checked.
    let ch = unsafe { ShimChannel::from_c(channel) }?;
    if cq.is_null() || cq_context.is_null() {
        return Err(Errno::INVAL);
    }
    // The service bumps `events` before writing the eventfd: an event that misses this scan
    // makes the eventfd readable, so the caller's read returns and we scan again.
    let mut st = ch.state.lock().unwrap_or_else(|e| e.into_inner());
    let fd = ch.efd.as_raw_fd();
    // A wakeup whose event an earlier call already took from the scan leaves the eventfd
    // readable with nothing behind it: consume it here (never blocks: see `drain`) and look
    // again, so the read below waits for a new event instead of swallowing the stale one
    // and then blocking (tgt's epoll loop hung in this read).
    if !scan(&mut st) && st.pending.is_empty() && drain(fd) {
        scan(&mut st);
    }
    if let Some(p) = st.pending.pop_front() {
        // The fd is readable exactly while an event waits, as the kernel's event file is
        // (what poll/epoll users such as tgt rely on): with the last one taken, consume the
        // wakeups that announced it, then re-arm it for any event that came in meanwhile.
        if st.pending.is_empty() && drain(fd) && scan(&mut st) {
            signal(fd);
        }
        // SAFETY: CQs remove themselves from the lists before being freed.
        let c = unsafe { &*(p as *const ShimCq) };
        // SAFETY: caller-provided out pointers.
        unsafe {
            *cq = p as *mut ibv_cq;
            *cq_context = (*c.ex()).cq_context;
        }
        return Ok(None);
    }
    Ok(Some(fd))
}

/// Blocks in `read(2)` of the channel's eventfd, a cancellation point as in libibverbs
/// (see [`crate::boundary::cancel`]); EINTR is returned to the caller as libibverbs' read()
/// returns it (qperf ends its tests with SIGALRM).
///
/// # Safety
/// `channel` ours; `cq`, `cq_context` writable.
#[no_mangle]
pub unsafe extern "C-unwind" fn ibv_get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> c_int {
    loop {
        // SAFETY: caller contract, forwarded.
        let step = ffi_boundary(CqEventStep::Done(-1), || match unsafe { cq_event_step(channel, cq, cq_context) } {
            Ok(None) => CqEventStep::Done(0),
            Ok(Some(fd)) => CqEventStep::Block(fd),
            Err(e) => CqEventStep::Done(ret_minus1(Err(e))),
        });
        match step {
            CqEventStep::Done(r) => return r,
            CqEventStep::Block(fd) => {
                if let Err(e) = crate::boundary::cancel::read_u64(fd) {
                    set_errno(e);
                    return -1;
                }
            }
        }
    }
}

/// Consume the eventfd's count if it has one, without blocking; whether it had. Called with
/// the channel's state locked; a thread blocked in `ibv_get_cq_event`'s own read may take the
/// count between the poll and the read, and then this read waits for the next event (only
/// when several threads wait on one channel at once).
fn drain(fd: c_int) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd; zero timeout.
    if unsafe { libc::poll(&mut p, 1, 0) } != 1 || p.revents & libc::POLLIN == 0 {
        return false;
    }
    let mut v = 0u64;
    // SAFETY: reading 8 bytes into a local u64.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) == 8 }
}

/// Make the eventfd readable (one count).
fn signal(fd: c_int) {
    let v = 1u64;
    // SAFETY: writing 8 bytes from a local u64.
    let _ = unsafe { libc::write(fd, (&v as *const u64).cast(), 8) };
}

fn scan(st: &mut ChanState) -> bool {
    let mut any = false;
    for &p in &st.cqs {
        // SAFETY: CQs in the list are alive (removed before free).
        let c = unsafe { &*(p as *const ShimCq) };
        let now = c.notify().events.load(Ordering::Acquire);
        let seen = c.events_seen.swap(now, Ordering::AcqRel);
        let delta = now.wrapping_sub(seen).min(1024);
        for _ in 0..delta {
            st.pending.push_back(p);
            any = true;
        }
    }
    any
}

/// # Safety
/// `cq` is ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: std::os::raw::c_uint) {
    ffi_boundary((), || {
        // SAFETY: magic-checked.
        if let Ok(c) = unsafe { ShimCq::from_cq(cq) } {
            // Several threads may acknowledge at once (libibverbs counts under the CQ's mutex):
            // the count is only ever updated atomically here; the application just reads it.
            // SAFETY: an aligned u32 field of our allocation inside the UnsafeCell, accessed
            // by the shim only through atomics, for as long as the CQ lives.
            let n = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*c.ex()).comp_events_completed)) };
            n.fetch_add(nevents, Ordering::Relaxed);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cqe_converts_field_for_field() {
        let e = ShmCqe {
            wr_id: 0x1122_3344_5566_7788,
            status: IBV_WC_REM_ACCESS_ERR,
            opcode: IBV_WC_RECV_RDMA_WITH_IMM,
            vendor_err: 7,
            byte_len: 4096,
            imm_or_inv: 0xdead_beef,
            qp_num: 0x11,
            src_qp: 0x22,
            wc_flags: IBV_WC_WITH_IMM | IBV_WC_GRH,
            pkey_index: 3,
            slid: 4,
            sl: 5,
            dlid_path_bits: 6,
            _reserved: [0; 18],
        };
        let wc = cqe_to_wc(&e);
        assert_eq!(wc.wr_id, e.wr_id);
        assert_eq!(wc.status, IBV_WC_REM_ACCESS_ERR);
        assert_eq!(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
        assert_eq!(wc.vendor_err, 7);
        assert_eq!(wc.byte_len, 4096);
        // SAFETY: union of two u32.
        assert_eq!(unsafe { wc.__bindgen_anon_1.imm_data }, 0xdead_beef);
        assert_eq!((wc.qp_num, wc.src_qp, wc.wc_flags), (0x11, 0x22, IBV_WC_WITH_IMM | IBV_WC_GRH));
        assert_eq!((wc.pkey_index, wc.slid, wc.sl, wc.dlid_path_bits), (3, 4, 5, 6));
    }
}
