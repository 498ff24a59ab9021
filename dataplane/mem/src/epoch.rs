//! Quiescent-state-based reclamation (QSBR) for the lookup fast path (DESIGN invariant 3).
//!
//! # Contract
//! * Each lcore owns a [`Reader`](crate::Reader) with one slot here. A lookup through the reader
//!   is a load of the key's slot word plus checks: no read-modify-write, no lock, no store to a
//!   shared line. The lcore announces a *quiescent point* (it holds no `MrRef`) once per loop
//!   iteration, and goes *offline* before it sleeps, so an idle lcore never delays anybody.
//! * An invalidation (LOCAL_INV, SEND_WITH_INV, dereg, rereg, MW unbind/rebind/dealloc) first
//!   changes the slot's state, then calls [`Epochs::synchronize`], which returns once every
//!   reader has passed a quiescent point after the change or is offline. From then on no
//!   lookup that saw the old state can still be copying.
//!
//! # Protocol
//! `gp` is a global grace-period counter (starts at 1, only grows). A reader's slot holds 0
//! while it is offline (or unregistered), else the `gp` value it read at its last quiescent
//! point (Acquire). Every write to a slot is an RMW (`swap`, AcqRel) and so is every read by an
//! invalidator (`fetch_or(0)`): the slot's modification order is one chain of RMWs, each
//! reading the one before. A reader writes its slot only when it comes online, goes offline,
//! or passes a quiescent point after `gp` moved (once per invalidation), so its steady-state
//! quiescent point stays a load and a compare.
//!
//! `synchronize`: `target = gp.fetch_add(1) + 1` (sequenced after the state change), then for
//! every registered slot wait until it holds a value `>= target` or is offline:
//! * a slot value `c >= target` was written after its reader loaded `gp >= target`, i.e. read
//!   from our `fetch_add` or a later RMW of its release sequence: our state change
//!   happens-before every lookup the reader makes after that point, and every copy it made
//!   before it happens-before our return (its Release RMW, our Acquire RMW read);
//! * a slot that reads 0 (our RMW reads the latest value) belongs to a reader that is offline
//!   *now*: its copies before going offline happen-before our return (same pair), and when it
//!   comes back online its `swap` reads from our RMW or a later one, so our state change
//!   happens-before its next lookups.
//!
//! Registration bumps `hwm` (the scan bound) with an RMW and `synchronize` reads it with an
//! RMW, the same argument for a reader that registers while an invalidation scans. As in the
//! counted protocol (`table.rs`), every race is decided by the modification order of one
//! location, with acquire/release only (no store-load ordering), so the loom models check it
//! exactly.
//!
//! # Carried translations
//! A reader may keep a validated window past its quiescent points (a [`Translation`]: the
//! responder carries one across the packets of a WRITE and of a READ response) only while the value it announces is
//! still the one it held at the lookup, `L`. An invalidation whose state change the lookup did
//! not see takes a `target > L`: had the reader read `gp >= target` before the lookup, that
//! read would have read from the invalidation's `fetch_add` (or a later RMW), and the state
//! change would happen-before the lookup. So the invalidation cannot return before the reader
//! announces `>= target`, or is seen offline; either way the reader's value has changed by the
//! time it resumes a translation: `quiescent` returns the new `gp`, and coming back online
//! re-reads `gp` after its swap (see [`Epochs::online`]). A translation is therefore resumed
//! only while `last == L`: one compare, no shared load.
//!
//! [`Translation`]: crate::Translation
//!
//! # Invalidation on an lcore
//! A LOCAL_INV or SEND_WITH_INV executed *by* an lcore must not wait for that lcore's own
//! quiescent point (it is between packets, holding nothing, but it would never announce while
//! it waits), and two lcores invalidating at once must not wait for each other. So the reader
//! goes offline before any control operation (it asserts that it holds no `MrRef`) and comes
//! back online with its next lookup. Offline, it is skipped by every `synchronize`, its own
//! included, and it may block on a slot lock held by another invalidator without deadlock.

use crate::sync::{lock, spin_wait, AtomicU32, AtomicU64, Mutex, Ordering};

/// One reader slot per cache line pair (adjacent-line prefetch), so an lcore's announcement
/// never invalidates another lcore's line.
#[repr(align(128))]
struct Padded<T>(T);

/// The grace-period state shared by every reader of one table.
pub(crate) struct Epochs {
    gp: Padded<AtomicU64>,
    slots: Box<[Padded<AtomicU64>]>,
    /// Slots ever handed out: `synchronize` scans `0..hwm`.
    hwm: AtomicU32,
    free: Mutex<Vec<u32>>,
}

impl Epochs {
    /// Room for `n` readers.
    pub(crate) fn new(n: u32) -> Self {
        Epochs {
            gp: Padded(AtomicU64::new(1)),
            slots: (0..n).map(|_| Padded(AtomicU64::new(0))).collect(),
            hwm: AtomicU32::new(0),
            // Pop from the end: lowest slot first.
            free: Mutex::new((0..n).rev().collect()),
        }
    }

    /// Take a slot (offline).
    pub(crate) fn register(&self) -> Option<u32> {
        let i = lock(&self.free).pop()?;
        self.hwm.fetch_max(i + 1, Ordering::AcqRel);
        Some(i)
    }

    /// Give a slot back (the reader is offline and gone).
    pub(crate) fn unregister(&self, i: u32) {
        self.slots[i as usize].0.swap(0, Ordering::AcqRel);
        lock(&self.free).push(i);
    }

    /// Come online (an RMW: see the module protocol); returns the value announced.
    ///
    /// `gp` is read again after the swap and announced if it moved: the first read may be
    /// older than a grace period whose scan skipped this reader while it was offline (the scan's
    /// RMW came before our swap, which reads from it, so the second read sees that grace
    /// period's `fetch_add`). Lookups need no more than the swap, but a reader's carried
    /// translations (`Translation`) are valid only while the value it announces stays the one
    /// they were stamped with, so that value must cover every grace period that skipped it.
    #[inline(never)]
    pub(crate) fn online(&self, i: u32) -> u64 {
        let slot = &self.slots[i as usize].0;
        let g = self.gp.0.load(Ordering::Acquire);
        slot.swap(g, Ordering::AcqRel);
        let now = self.gp.0.load(Ordering::Acquire);
        if now != g {
            slot.swap(now, Ordering::AcqRel);
        }
        now
    }

    /// Go offline: copies made so far happen-before any `synchronize` that reads the 0.
    #[inline]
    pub(crate) fn offline(&self, i: u32) {
        self.slots[i as usize].0.swap(0, Ordering::AcqRel);
    }

    /// A quiescent point of an online reader that last announced `last`; returns the value
    /// announced now. A load of `gp` and, only when an invalidation has started since the
    /// last one, an RMW on the reader's own line.
    #[inline]
    pub(crate) fn quiescent(&self, i: u32, last: u64) -> u64 {
        let g = self.gp.0.load(Ordering::Acquire);
        if g != last {
            self.announce(i, g);
        }
        g
    }

    #[cold]
    fn announce(&self, i: u32, g: u64) {
        self.slots[i as usize].0.swap(g, Ordering::AcqRel);
    }

    /// Current grace-period counter (diagnostics, tests).
    pub(crate) fn current(&self) -> u64 {
        self.gp.0.load(Ordering::Acquire)
    }

    /// What slot `i` announces (0 = offline).
    pub(crate) fn announced(&self, i: u32) -> u64 {
        self.slots[i as usize].0.load(Ordering::Acquire)
    }

    /// Wait until every reader has passed a quiescent point after this call began, or is
    /// offline. Call after the state change it protects (module protocol). The caller must not
    /// be an online reader (it would wait for itself).
    pub(crate) fn synchronize(&self) {
        let target = self.gp.0.fetch_add(1, Ordering::AcqRel) + 1;
        // An RMW read of the scan bound (module protocol: registration races).
        let n = self.hwm.fetch_add(0, Ordering::AcqRel) as usize;
        for s in &self.slots[..n] {
            let s = &s.0;
            let mut i = 0u32;
            // Every poll is an RMW read: it returns the latest value in the slot's modification
            // order, which a plain load need not (a 0 read by a plain load would not exclude a
            // reader coming online right now). Only this waiting thread pays for it: the reader
            // never reads its slot, and writes it once per grace period.
            loop {
                let c = s.fetch_or(0, Ordering::AcqRel);
                if c == 0 || c >= target {
                    break;
                }
                spin_wait(i);
                i = i.saturating_add(1);
            }
        }
    }
}
