//! [`Mbuf`]: an owned, single-segment DPDK packet buffer.
//!
//! Ownership: an `Mbuf` is the unique owner of one `rte_mbuf` and frees it on drop.
//! `into_raw`/`from_raw` move ownership to and from DPDK bursts. Mbufs carry no reference
//! to their pool or to EAL (that would cost an atomic per packet): drop every mbuf before
//! the last `Mempool`/`Eal` handle. Multi-segment chains are freed correctly, but the data
//! accessors see the first segment only (ports here never enable scatter RX).

use std::ptr::NonNull;

use pmrxe_dpdk_sys as sys;

/// An owned packet buffer. `#[repr(transparent)]` over the mbuf pointer, so a slice of
/// `Mbuf` has the layout of a `struct rte_mbuf *` array.
#[repr(transparent)]
pub struct Mbuf {
    raw: NonNull<sys::rte_mbuf>,
}

// SAFETY: an Mbuf is the only handle to its rte_mbuf; freeing from any thread is allowed
// (mempool ops are MP/MC safe).
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// Takes ownership of a raw mbuf.
    ///
    /// # Safety
    /// `raw` must be a valid, non-NULL mbuf that nothing else owns or frees.
    #[inline]
    pub unsafe fn from_raw(raw: *mut sys::rte_mbuf) -> Mbuf {
        debug_assert!(!raw.is_null());
        // SAFETY: caller guarantees non-NULL.
        Mbuf { raw: unsafe { NonNull::new_unchecked(raw) } }
    }

    /// Gives up ownership; the caller must free or transmit the mbuf.
    #[inline]
    pub fn into_raw(self) -> *mut sys::rte_mbuf {
        let p = self.raw.as_ptr();
        std::mem::forget(self);
        p
    }

    /// The raw pointer, still owned by `self`.
    #[inline]
    pub fn as_ptr(&self) -> *mut sys::rte_mbuf {
        self.raw.as_ptr()
    }

    #[inline]
    fn m(&self) -> &sys::rte_mbuf {
        // SAFETY: we own a valid mbuf; shared access through &self.
        unsafe { self.raw.as_ref() }
    }

    /// Bytes of data in this (first) segment.
    #[inline]
    pub fn len(&self) -> usize {
        usize::from(self.m().data_len)
    }

    /// True when the buffer holds no data.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total packet length over all segments.
    #[inline]
    pub fn pkt_len(&self) -> usize {
        self.m().pkt_len as usize
    }

    /// Free bytes before the data.
    #[inline]
    pub fn headroom(&self) -> usize {
        usize::from(self.m().data_off)
    }

    /// Free bytes after the data (first segment).
    #[inline]
    pub fn tailroom(&self) -> usize {
        let m = self.m();
        usize::from(m.buf_len).saturating_sub(usize::from(m.data_off) + usize::from(m.data_len))
    }

    /// The packet data (first segment).
    #[inline]
    pub fn data(&self) -> &[u8] {
        let m = self.m();
        // SAFETY: buf_addr + data_off .. + data_len lies inside the mbuf's data room, which
        // we own; the slice borrows self so the mbuf cannot be freed meanwhile.
        unsafe {
            let p = m.buf_addr.cast::<u8>().add(usize::from(m.data_off));
            std::slice::from_raw_parts(p, usize::from(m.data_len))
        }
    }

    /// The packet data, mutable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        let (p, len) = {
            let m = self.m();
            (m.buf_addr.cast::<u8>(), usize::from(m.data_len))
        };
        let off = self.headroom();
        // SAFETY: as in `data`, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(p.add(off), len) }
    }

    /// Grows the data at the tail by `len` bytes and returns the new (uninitialised-content,
    /// but initialised-memory) region; `None` if the tailroom is too small.
    ///
    /// A single-segment mbuf (every one the data path builds) is adjusted here, as
    /// `rte_pktmbuf_append` would: one length check and two stores, not a call into the C
    /// shim per frame. Chains go to DPDK.
    #[inline]
    pub fn append(&mut self, len: usize) -> Option<&mut [u8]> {
        let l = u16::try_from(len).ok()?;
        if let Some(m) = self.single_mut() {
            if usize::from(m.data_off) + usize::from(m.data_len) + len > usize::from(m.buf_len) {
                return None;
            }
            let at = usize::from(m.data_off) + usize::from(m.data_len);
            m.data_len += l;
            m.pkt_len += u32::from(l);
            let base = m.buf_addr.cast::<u8>();
            // SAFETY: `at + len <= buf_len` was checked: the region lies inside the data room
            // of an mbuf we own, and &mut self makes the access exclusive.
            return Some(unsafe { std::slice::from_raw_parts_mut(base.add(at), len) });
        }
        // SAFETY: we own the mbuf; DPDK checks the tailroom and returns NULL if short.
        let p = unsafe { sys::pmrxe_pktmbuf_append(self.raw.as_ptr(), l) };
        if p.is_null() {
            return None;
        }
        // SAFETY: DPDK returned a pointer to `len` bytes inside our data room.
        Some(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) })
    }

    /// Grows the data at the head by `len` bytes and returns the new region (single segment:
    /// adjusted here, as `rte_pktmbuf_prepend` would).
    #[inline]
    pub fn prepend(&mut self, len: usize) -> Option<&mut [u8]> {
        let l = u16::try_from(len).ok()?;
        if let Some(m) = self.single_mut() {
            if l > m.data_off {
                return None;
            }
            m.data_off -= l;
            m.data_len += l;
            m.pkt_len += u32::from(l);
            let at = usize::from(m.data_off);
            let base = m.buf_addr.cast::<u8>();
            // SAFETY: `len <= data_off` was checked: the region [at, at + len) is the end of
            // the old headroom, inside the buffer of an mbuf we own; &mut self makes the access
            // exclusive.
            return Some(unsafe { std::slice::from_raw_parts_mut(base.add(at), len) });
        }
        // SAFETY: we own the mbuf; DPDK checks the headroom and returns NULL if short.
        let p = unsafe { sys::pmrxe_pktmbuf_prepend(self.raw.as_ptr(), l) };
        if p.is_null() {
            return None;
        }
        // SAFETY: DPDK returned a pointer to `len` bytes inside our data room.
        Some(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) })
    }

    /// Removes `len` bytes from the tail. `false` (and no change) if `len > len()`.
    #[inline]
    pub fn trim(&mut self, len: usize) -> bool {
        let Ok(l) = u16::try_from(len) else { return false };
        if let Some(m) = self.single_mut() {
            if l > m.data_len {
                return false;
            }
            m.data_len -= l;
            m.pkt_len -= u32::from(l);
            return true;
        }
        // SAFETY: we own the mbuf; DPDK checks the length.
        unsafe { sys::pmrxe_pktmbuf_trim(self.raw.as_ptr(), l) == 0 }
    }

    /// The mbuf's header for in-place length changes, if it is a single segment (its
    /// `pkt_len` is its `data_len`).
    #[inline]
    fn single_mut(&mut self) -> Option<&mut sys::rte_mbuf> {
        // SAFETY: we own a valid mbuf; &mut self makes the access exclusive.
        let m = unsafe { self.raw.as_mut() };
        (m.nb_segs == 1 && m.next.is_null()).then_some(m)
    }

    /// [`PacketBuf::open_aligned`](crate::PacketBuf::open_aligned) for a fresh one-segment
    /// mbuf: three stores to its header, no call into the C shim.
    #[inline]
    pub fn open_aligned(&mut self, at: usize, keep: usize) -> Option<&mut [u8]> {
        let m = self.single_mut()?;
        if m.data_len != 0 {
            return None;
        }
        let base = m.buf_addr.cast::<u8>();
        let mut start = usize::from(m.data_off);
        let back = (base as usize).wrapping_add(start + at) & 63;
        if start >= keep + back {
            start -= back;
        }
        let len = usize::from(m.buf_len).checked_sub(start)?;
        // Both fit in u16: they are at most buf_len.
        m.data_off = start as u16;
        m.data_len = len as u16;
        m.pkt_len = len as u32;
        // SAFETY: [start, start + len) = [start, buf_len) lies inside the data room of an mbuf
        // we own; &mut self makes the access exclusive.
        Some(unsafe { std::slice::from_raw_parts_mut(base.add(start), len) })
    }

    /// Removes `len` bytes from the head. `false` (and no change) if `len > len()`.
    #[inline]
    pub fn adj(&mut self, len: usize) -> bool {
        let Ok(l) = u16::try_from(len) else { return false };
        // SAFETY: we own the mbuf; DPDK checks the length and returns NULL if too long.
        unsafe { !sys::pmrxe_pktmbuf_adj(self.raw.as_ptr(), l).is_null() }
    }

    /// Empties the buffer and restores the default headroom.
    #[inline]
    pub fn reset(&mut self) {
        // SAFETY: we own the mbuf (single segment after reset of a fresh/owned buffer).
        unsafe { sys::pmrxe_pktmbuf_reset(self.raw.as_ptr()) }
    }
}

impl Drop for Mbuf {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: we are the unique owner; frees the whole chain back to its pool.
        unsafe { sys::pmrxe_pktmbuf_free(self.raw.as_ptr()) }
    }
}

impl std::fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mbuf").field("len", &self.len()).field("headroom", &self.headroom()).finish()
    }
}
