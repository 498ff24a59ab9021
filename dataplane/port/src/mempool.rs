//! [`Mempool`]: a DPDK pktmbuf pool, shared by the ports of one process.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use pmrxe_dpdk_sys as sys;

use crate::{Eal, Mbuf, PortError};

/// Headroom DPDK reserves in front of packet data (`RTE_PKTMBUF_HEADROOM`).
pub const MBUF_HEADROOM: u16 = sys::RTE_PKTMBUF_HEADROOM as u16;

/// Names must be unique per process; EAL has no anonymous pools.
static POOL_SEQ: AtomicU32 = AtomicU32::new(0);

struct PoolInner {
    raw: NonNull<sys::rte_mempool>,
    name: String,
    data_room: u16,
    _eal: Eal,
}

// SAFETY: the pool's default ops (ring_mp_mc) are multi-producer/multi-consumer safe; the
// pointer itself is immutable after creation.
unsafe impl Send for PoolInner {}
// SAFETY: see Send; all operations through `&PoolInner` are thread-safe DPDK calls.
unsafe impl Sync for PoolInner {}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // SAFETY: every port using this pool holds an Arc to it and has been closed;
        // mbufs must not outlive the pool (crate contract, see `Mbuf`).
        unsafe { sys::rte_mempool_free(self.raw.as_ptr()) };
    }
}

/// A pktmbuf pool. Clone is cheap (shared handle).
#[derive(Clone)]
pub struct Mempool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for Mempool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mempool").field("name", &self.inner.name).field("data_room", &self.inner.data_room).finish()
    }
}

impl Mempool {
    /// Creates a pool of `n` mbufs able to hold frames up to `max_frame` bytes in one
    /// segment (plus headroom), with a per-lcore cache of `cache` mbufs.
    pub fn new(eal: &Eal, n: u32, cache: u32, max_frame: u32) -> Result<Mempool, PortError> {
        let seq = POOL_SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("pmrxe_mp{seq}");
        let cname = CString::new(name.clone()).map_err(|_| PortError::Nul(name.clone()))?;
        let room = (u32::from(MBUF_HEADROOM) + max_frame.max(2048)).min(u32::from(u16::MAX));
        let data_room = room as u16;
        let cache = cache.min(512 /* RTE_MEMPOOL_CACHE_MAX_SIZE */).min(n / 2);
        // SAFETY: EAL is initialised (`eal` handle); `cname` is a valid C string.
        let raw = unsafe {
            sys::rte_pktmbuf_pool_create(cname.as_ptr(), n, cache, 0, data_room, sys::SOCKET_ID_ANY)
        };
        let raw = NonNull::new(raw).ok_or_else(|| PortError::from_rte_errno(format!("rte_pktmbuf_pool_create({name}, n={n})")))?;
        Ok(Mempool { inner: Arc::new(PoolInner { raw, name, data_room, _eal: eal.clone() }) })
    }

    /// Allocates one mbuf (empty, default headroom). `None` when the pool is exhausted.
    #[inline]
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: the pool is alive for the duration of the call.
        let m = unsafe { sys::pmrxe_pktmbuf_alloc(self.inner.raw.as_ptr()) };
        // SAFETY: a non-NULL result is a freshly allocated mbuf we now own.
        NonNull::new(m).map(|m| unsafe { Mbuf::from_raw(m.as_ptr()) })
    }

    /// Allocates `out.remaining_capacity()` mbufs at once, all or nothing. Returns how many
    /// were added (0 when the pool cannot supply them all).
    pub fn alloc_bulk<const N: usize>(&self, out: &mut arrayvec::ArrayVec<Mbuf, N>) -> usize {
        let want = out.remaining_capacity();
        if want == 0 {
            return 0;
        }
        let mut ptrs = [std::ptr::null_mut::<sys::rte_mbuf>(); N];
        // SAFETY: `ptrs` has room for `want <= N` pointers; the pool is alive.
        let rc = unsafe { sys::pmrxe_pktmbuf_alloc_bulk(self.inner.raw.as_ptr(), ptrs.as_mut_ptr(), want as u32) };
        if rc != 0 {
            return 0;
        }
        for &p in &ptrs[..want] {
            // SAFETY: alloc_bulk succeeded, so each of the first `want` pointers is an mbuf we own.
            out.push(unsafe { Mbuf::from_raw(p) });
        }
        want
    }

    /// Mbufs currently free in the pool (including per-lcore caches).
    pub fn available(&self) -> u32 {
        // SAFETY: the pool is alive.
        unsafe { sys::rte_mempool_avail_count(self.inner.raw.as_ptr()) }
    }

    /// Mbufs currently allocated.
    pub fn in_use(&self) -> u32 {
        // SAFETY: the pool is alive.
        unsafe { sys::rte_mempool_in_use_count(self.inner.raw.as_ptr()) }
    }

    /// Data room per mbuf (headroom + largest frame).
    pub fn data_room(&self) -> u16 {
        self.inner.data_room
    }

    /// The raw pool pointer, for DPDK calls this crate does not wrap. Valid while any clone
    /// of this handle lives.
    pub fn as_raw(&self) -> *mut sys::rte_mempool {
        self.inner.raw.as_ptr()
    }
}
