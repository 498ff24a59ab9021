//! The fast path: key lookups (counted, or through an epoch reader) and [`MrRef`], the
//! validated window copies and atomics go through.

use std::cell::Cell;

use crate::access::{Access, Key, PdHandle};
use crate::sync::{AtomicU64, Ordering};
use crate::MemError;

use super::slot::{unpack, REF_ONE, REF_SHIFT};
use super::{MemTable, MrState};

impl MemTable {
    /// Resolve `key` for `[iova, iova+len)` with rights `need` (empty for a local read,
    /// LOCAL_WRITE for a local write, REMOTE_* for responder accesses). Checks state VALID,
    /// exact key, PD, access subset, range (checked: `iova + len` must not wrap) and, for a
    /// type-2 MW, the QP. No lock, no allocation.
    ///
    /// `len == 0` needs no key (C9-88): it returns an empty reference without looking at
    /// `key`, through which only zero-length copies succeed.
    ///
    /// The returned [`MrRef`] holds a counted reference (two locked RMWs on the slot word)
    /// that keeps invalidation of this key waiting until it is dropped: hold it for one
    /// packet's copy, not across a loop iteration. Lcores look up through their
    /// [`Reader`](crate::Reader) instead (no RMW).
    #[inline]
    pub fn lookup(
        &self,
        key: Key,
        pd: PdHandle,
        qpn: u32,
        iova: u64,
        len: u64,
        need: Access,
    ) -> Result<MrRef<'_>, MemError> {
        self.lookup_with(key, pd, qpn, iova, len, need, |w| {
            let old = w.fetch_add(REF_ONE, Ordering::Acquire);
            (Hold::Counted(w), old)
        })
    }

    /// [`lookup`](Self::lookup) for an online epoch reader whose live-reference count is
    /// `live`: the slot word is only loaded (Acquire: pairs with the Release RMW that made it
    /// VALID); the reader's next quiescent point is what invalidation waits for.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lookup_epoch<'a>(
        &'a self,
        live: &'a Cell<u32>,
        key: Key,
        pd: PdHandle,
        qpn: u32,
        iova: u64,
        len: u64,
        need: Access,
    ) -> Result<MrRef<'a>, MemError> {
        self.lookup_with(key, pd, qpn, iova, len, need, |w| {
            live.set(live.get() + 1);
            (Hold::Epoch(live), w.load(Ordering::Acquire))
        })
    }

    /// The checks of a lookup; `enter` takes the hold on a slot word and returns the word.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn lookup_with<'a>(
        &'a self,
        key: Key,
        pd: PdHandle,
        qpn: u32,
        iova: u64,
        len: u64,
        need: Access,
        enter: impl Fn(&'a AtomicU64) -> (Hold<'a>, u64),
    ) -> Result<MrRef<'a>, MemError> {
        if len == 0 {
            return Ok(MrRef::empty(self));
        }
        let end = iova.checked_add(len).ok_or(MemError::Overflow)?;
        if let Some(slot) = self.mr_slot(key.index()) {
            let (guard, w) = enter(&slot.word);
            let (state, k) = unpack(w);
            check_word(state, k, key)?;
            if slot.pd.load(Ordering::Relaxed) != pd {
                return Err(MemError::PdMismatch);
            }
            if !Access(slot.access.load(Ordering::Relaxed)).contains(need) {
                return Err(MemError::AccessDenied);
            }
            let mr_iova = slot.iova.load(Ordering::Relaxed);
            let mr_end = mr_iova.wrapping_add(slot.length.load(Ordering::Relaxed));
            if iova < mr_iova || end > mr_end {
                return Err(MemError::OutOfRange);
            }
            return Ok(MrRef {
                table: self,
                _hold: guard,
                start: iova,
                end,
                add: 0,
                mr_iova,
                shift: slot.shift.load(Ordering::Relaxed),
                base: slot.base.load(Ordering::Relaxed),
            });
        }
        let slot = self.mw_slot(key.index()).ok_or(MemError::NoSuchKey)?;
        let (guard, w) = enter(&slot.word);
        let (state, k) = unpack(w);
        check_word(state, k, key)?;
        let mw_len = slot.length.load(Ordering::Relaxed);
        if mw_len == 0 {
            return Err(MemError::NotValid); // unbound type-1 window
        }
        if slot.pd.load(Ordering::Relaxed) != pd {
            return Err(MemError::PdMismatch);
        }
        if slot.type2.load(Ordering::Relaxed) != 0 && slot.qpn.load(Ordering::Relaxed) != qpn {
            return Err(MemError::QpMismatch);
        }
        let access = Access(slot.access.load(Ordering::Relaxed));
        if !access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        let addr = slot.addr.load(Ordering::Relaxed);
        // Zero-based windows are addressed by offset from 0.
        let (win_start, add) = if access.contains(Access::ZERO_BASED) {
            (0, addr)
        } else {
            (addr, 0)
        };
        let win_end = win_start.wrapping_add(mw_len);
        if iova < win_start || end > win_end {
            return Err(MemError::OutOfRange);
        }
        // The bound MR stays VALID and unchanged while this MW is bound (bound count > 0
        // refuses LOCAL_INV, remote invalidate and dereg), and the MW cannot finish being
        // unbound while our hold lives.
        let mr = self
            .mr_slot(slot.mr_index.load(Ordering::Relaxed))
            .ok_or(MemError::NotValid)?;
        Ok(MrRef {
            table: self,
            _hold: guard,
            start: iova,
            end,
            add,
            mr_iova: mr.iova.load(Ordering::Relaxed),
            shift: mr.shift.load(Ordering::Relaxed),
            base: mr.base.load(Ordering::Relaxed),
        })
    }

    /// Copies currently holding a reference to `key`'s object (diagnostics, tests).
    pub fn inflight(&self, key: Key) -> u32 {
        let w = if let Some(s) = self.mr_slot(key.index()) {
            s.word.load(Ordering::Acquire)
        } else if let Some(s) = self.mw_slot(key.index()) {
            s.word.load(Ordering::Acquire)
        } else {
            0
        };
        (w >> REF_SHIFT) as u32
    }

    /// The state and in-flight copy count published in the slot of `key`'s index, read from
    /// the slot's word alone (no control lock: an invalidation holds that lock while it
    /// drains). An invalidation waiting for copies shows `(Free, n)` with `n > 0` (diagnostics,
    /// tests). `None` when the index names no slot.
    pub fn slot_state(&self, key: Key) -> Option<(MrState, u32)> {
        let w = if let Some(s) = self.mr_slot(key.index()) {
            s.word.load(Ordering::Acquire)
        } else {
            self.mw_slot(key.index())?.word.load(Ordering::Acquire)
        };
        Some((unpack(w).0, (w >> REF_SHIFT) as u32))
    }
}

#[inline]
fn check_word(state: MrState, k: Key, want: Key) -> Result<(), MemError> {
    match state {
        MrState::Invalid => Err(MemError::NoSuchKey),
        _ if k != want => Err(MemError::KeyMismatch),
        MrState::Free => Err(MemError::NotValid),
        MrState::Valid => Ok(()),
    }
}

/// What keeps an [`MrRef`]'s translation from being invalidated under it; released on drop.
enum Hold<'a> {
    /// A zero-length reference: nothing to protect.
    Nothing,
    /// One counted reference in a slot word (lookups through the table).
    Counted(&'a AtomicU64),
    /// A lookup of an online epoch reader: protected by the reader's next quiescent point,
    /// which the borrow of the reader orders after this reference's drop. Counts the
    /// reader's live references so a control operation through the reader can assert none.
    Epoch(&'a Cell<u32>),
}

impl Drop for Hold<'_> {
    #[inline]
    fn drop(&mut self) {
        match self {
            Hold::Nothing => {}
            Hold::Counted(w) => {
                w.fetch_sub(REF_ONE, Ordering::Release);
            }
            Hold::Epoch(live) => live.set(live.get() - 1),
        }
    }
}

/// A lookup carried past the packet it was made for (the responder carries one across the
/// packets of a WRITE and of a READ response): the lookup's parameters (key, PD, QP, rights)
/// and the window it validated, stamped with the grace period its epoch reader had announced.
/// [`MemAccess::resume`](crate::MemAccess::resume) returns the window again without a lookup
/// while that reader still announces the same grace period, i.e. while no invalidation of any
/// key of the table can have completed since (`epoch.rs`, "Carried translations"); otherwise
/// it looks the key up again with the same parameters. A stamp of 0 never resumes (the
/// table's counted lookups, and an empty window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    key: Key,
    pd: PdHandle,
    qpn: u32,
    need: Access,
    stamp: u64,
    start: u64,
    end: u64,
    add: u64,
    mr_iova: u64,
    base: u64,
    shift: u32,
}

impl Translation {
    /// The key it was looked up with.
    pub fn key(&self) -> Key {
        self.key
    }

    /// The lookup again, for `[iova, iova + len)` (`resume`'s fallback).
    #[inline]
    pub(crate) fn lookup_again<'a, M: crate::MemAccess + ?Sized>(&self, m: &'a M, iova: u64, len: u64) -> Result<MrRef<'a>, MemError> {
        m.lookup(self.key, self.pd, self.qpn, iova, len, self.need)
    }
}

impl MemTable {
    /// `t`'s window again, for `[iova, iova + len)` inside it, if the reader whose live count
    /// is `live` still announces `last == t.stamp` (a nonzero stamp: the reader is online).
    #[inline(always)]
    pub(crate) fn resume_epoch<'a>(&'a self, live: &'a Cell<u32>, last: u64, t: &Translation, iova: u64, len: u64) -> Option<MrRef<'a>> {
        if t.stamp != last {
            return None;
        }
        let end = iova.checked_add(len)?;
        if len == 0 || iova < t.start || end > t.end {
            return None;
        }
        live.set(live.get() + 1);
        Some(MrRef {
            table: self,
            _hold: Hold::Epoch(live),
            start: iova,
            end,
            add: t.add,
            mr_iova: t.mr_iova,
            shift: t.shift,
            base: t.base,
        })
    }
}

/// A validated window `[start, end)` of a key's address space. While it lives, the key cannot
/// finish being invalidated, so copies through it are copies through a VALID translation.
pub struct MrRef<'a> {
    table: &'a MemTable,
    _hold: Hold<'a>,
    start: u64,
    end: u64,
    /// Added to a key-space address to get an MR iova (zero-based MWs).
    add: u64,
    mr_iova: u64,
    /// 0: contiguous, `base` is the address of `mr_iova`; else log2(page size) and `base` is
    /// the arena index of page 0.
    shift: u32,
    base: u64,
}

impl std::fmt::Debug for MrRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MrRef[{:#x}, {:#x})", self.start, self.end)
    }
}

impl<'a> MrRef<'a> {
    fn empty(table: &'a MemTable) -> Self {
        MrRef {
            table,
            _hold: Hold::Nothing,
            start: 0,
            end: 0,
            add: 0,
            mr_iova: 0,
            shift: 0,
            base: 0,
        }
    }

    /// The validated window.
    pub fn range(&self) -> (u64, u64) {
        (self.start, self.end)
    }

    /// This window as a [`Translation`] of a lookup with these parameters, stamped `stamp`
    /// (0 for a counted or empty reference: never resumed).
    pub(crate) fn carry(&self, key: Key, pd: PdHandle, qpn: u32, need: Access, stamp: u64) -> Translation {
        let stamp = if matches!(self._hold, Hold::Epoch(_)) { stamp } else { 0 };
        Translation {
            key,
            pd,
            qpn,
            need,
            stamp,
            start: self.start,
            end: self.end,
            add: self.add,
            mr_iova: self.mr_iova,
            base: self.base,
            shift: self.shift,
        }
    }

    /// Visit the process addresses backing `[iova, iova+len)` in order: `f(addr, done, n)`.
    #[inline(always)]
    pub(crate) fn walk(
        &self,
        iova: u64,
        len: u64,
        mut f: impl FnMut(usize, usize, usize),
    ) -> Result<(), MemError> {
        if len == 0 {
            return Ok(());
        }
        let end = iova.checked_add(len).ok_or(MemError::Overflow)?;
        if iova < self.start || end > self.end {
            return Err(MemError::OutOfRange);
        }
        let mut va = iova.wrapping_add(self.add);
        if self.shift == 0 {
            let a = self.base.wrapping_add(va - self.mr_iova);
            f(a as usize, 0, len as usize);
            return Ok(());
        }
        let ps = 1u64 << self.shift;
        let mut done = 0u64;
        while done < len {
            let idx = (va >> self.shift) - (self.mr_iova >> self.shift);
            let off = va & (ps - 1);
            let n = (ps - off).min(len - done);
            let slot = self.base.checked_add(idx).ok_or(MemError::OutOfRange)?;
            let page = self
                .table
                .pages
                .get(slot as usize)
                .ok_or(MemError::OutOfRange)?
                .load(Ordering::Relaxed);
            f((page + off) as usize, done as usize, n as usize);
            done += n;
            va += n;
        }
        Ok(())
    }

    /// Copy `dst.len()` bytes starting at `iova` out of the memory.
    #[inline]
    pub fn copy_out(&self, iova: u64, dst: &mut [u8]) -> Result<(), MemError> {
        let d = dst.as_mut_ptr();
        self.walk(iova, dst.len() as u64, |a, done, n| {
            // SAFETY: `a..a+n` lies inside a Region kept alive by the MR's owners while the MR
            // is VALID, which our hold keeps it (module protocol); `d+done..+n` is
            // inside `dst`; a Rust buffer never overlaps registered memory we copy through.
            // (Short pieces, the usual case here, are inline loads and stores: no memcpy call.)
            unsafe { pmrxe_crc::copy_short_raw(d.add(done), a as *const u8, n) }
        })
    }

    /// Copy `src` into the memory at `iova`.
    #[inline]
    pub fn copy_in(&self, iova: u64, src: &[u8]) -> Result<(), MemError> {
        let s = src.as_ptr();
        self.walk(iova, src.len() as u64, |a, done, n| {
            // SAFETY: as in `copy_out`, with the roles swapped.
            unsafe { pmrxe_crc::copy_short_raw(a as *mut u8, s.add(done), n) }
        })
    }

    fn atomic_at(&self, iova: u64) -> Result<&core::sync::atomic::AtomicU64, MemError> {
        if iova & 7 != 0 {
            return Err(MemError::BadAlignment);
        }
        let mut addr = 0usize;
        let mut pieces = 0;
        self.walk(iova, 8, |a, _, _| {
            addr = a;
            pieces += 1;
        })?;
        if pieces != 1 || addr & 7 != 0 {
            return Err(MemError::BadAlignment);
        }
        // SAFETY: 8 aligned bytes inside a live VALID translation (see `copy_out`); the memory
        // is only ever accessed by raw copies and atomics, never through Rust references, and
        // lives at least as long as `self` (its hold).
        Ok(unsafe { core::sync::atomic::AtomicU64::from_ptr(addr as *mut u64) })
    }

    /// 64-bit fetch-and-add at `iova` (8-byte aligned); returns the original value.
    pub fn atomic_fetch_add(&self, iova: u64, add: u64) -> Result<u64, MemError> {
        Ok(self
            .atomic_at(iova)?
            .fetch_add(add, core::sync::atomic::Ordering::SeqCst))
    }

    /// 64-bit compare-and-swap at `iova` (8-byte aligned); returns the original value.
    pub fn atomic_cmp_swap(&self, iova: u64, cmp: u64, swap: u64) -> Result<u64, MemError> {
        let a = self.atomic_at(iova)?;
        Ok(
            match a.compare_exchange(
                cmp,
                swap,
                core::sync::atomic::Ordering::SeqCst,
                core::sync::atomic::Ordering::SeqCst,
            ) {
                Ok(v) | Err(v) => v,
            },
        )
    }
}
