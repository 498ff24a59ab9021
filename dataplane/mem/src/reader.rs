//! An lcore's epoch reader, and [`MemAccess`]: the one interface the transport reaches memory
//! through, implemented by the table (counted lookups) and by a reader (epoch lookups).

use std::cell::Cell;
use std::sync::Arc;

use crate::access::{Access, Key, PdHandle};
use crate::table::{MemTable, MrRef, Translation};
use crate::MemError;

/// Key translation and the executed memory operations, as the transport uses them.
///
/// Implemented by [`MemTable`] (lookups take a counted reference: any thread) and by
/// [`Reader`] (an lcore: lookups only load the slot word, see `epoch.rs`). The methods have
/// the meaning of the [`MemTable`] methods of the same names.
pub trait MemAccess {
    /// The table behind this view.
    fn table(&self) -> &MemTable;
    /// See [`MemTable::lookup`].
    fn lookup(&self, key: Key, pd: PdHandle, qpn: u32, iova: u64, len: u64, need: Access) -> Result<MrRef<'_>, MemError>;
    /// See [`MemTable::exec_reg_mr_for`].
    fn exec_reg_mr_for(&self, qp_pd: PdHandle, mr: Key, wr_key: Key, access: Access, iova: Option<u64>, length: Option<u64>) -> Result<(), MemError>;
    /// See [`MemTable::exec_local_inv`].
    fn exec_local_inv(&self, qp_pd: PdHandle, key: Key) -> Result<(), MemError>;
    /// See [`MemTable::remote_invalidate`].
    fn remote_invalidate(&self, pd: PdHandle, qpn: u32, key: Key) -> Result<(), MemError>;
    /// See [`MemTable::exec_bind_mw`].
    #[allow(clippy::too_many_arguments)]
    fn exec_bind_mw(&self, qp_pd: PdHandle, qpn: u32, mw: Key, new_key: Key, mr: Key, addr: u64, len: u64, access: Access) -> Result<(), MemError>;
    /// [`lookup`](Self::lookup) of `[iova, iova + len)`, returned as a [`Translation`] that the
    /// later packets of the same message [`resume`](Self::resume). The table's counted lookups
    /// cannot be carried (a count held across packets would stall invalidation): their
    /// translation looks the key up again on every resume.
    fn lookup_carried(&self, key: Key, pd: PdHandle, qpn: u32, iova: u64, len: u64, need: Access) -> Result<Translation, MemError> {
        Ok(self.lookup(key, pd, qpn, iova, len, need)?.carry(key, pd, qpn, need, 0))
    }
    /// `t`'s window for `[iova, iova + len)`: without a lookup while `t` is still valid and
    /// covers the range (an lcore's reader), else by looking `t`'s key up again with its PD, QP
    /// and rights (which then reports what an invalidated key gets).
    fn resume(&self, t: &Translation, iova: u64, len: u64) -> Result<MrRef<'_>, MemError> {
        t.lookup_again(self, iova, len)
    }
}

impl MemAccess for MemTable {
    fn table(&self) -> &MemTable {
        self
    }
    #[inline]
    fn lookup(&self, key: Key, pd: PdHandle, qpn: u32, iova: u64, len: u64, need: Access) -> Result<MrRef<'_>, MemError> {
        MemTable::lookup(self, key, pd, qpn, iova, len, need)
    }
    fn exec_reg_mr_for(&self, qp_pd: PdHandle, mr: Key, wr_key: Key, access: Access, iova: Option<u64>, length: Option<u64>) -> Result<(), MemError> {
        MemTable::exec_reg_mr_for(self, qp_pd, mr, wr_key, access, iova, length)
    }
    fn exec_local_inv(&self, qp_pd: PdHandle, key: Key) -> Result<(), MemError> {
        MemTable::exec_local_inv(self, qp_pd, key)
    }
    fn remote_invalidate(&self, pd: PdHandle, qpn: u32, key: Key) -> Result<(), MemError> {
        MemTable::remote_invalidate(self, pd, qpn, key)
    }
    fn exec_bind_mw(&self, qp_pd: PdHandle, qpn: u32, mw: Key, new_key: Key, mr: Key, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        MemTable::exec_bind_mw(self, qp_pd, qpn, mw, new_key, mr, addr, len, access)
    }
}

/// An lcore's registration as an epoch reader of a [`MemTable`] (QSBR, `epoch.rs`).
///
/// * [`lookup`](Self::lookup) is a load of the key's slot word plus checks. The [`MrRef`] it
///   returns borrows the reader, so it cannot outlive the next
///   [`quiescent`](Self::quiescent) (which takes `&mut self`): invalidations wait for that
///   point instead of counting references.
/// * Call [`quiescent`](Self::quiescent) once per loop iteration and
///   [`offline`](Self::offline) before sleeping; the next lookup brings the reader back online.
/// * Control operations through the reader ([`MemAccess`]: LOCAL_INV, SEND_WITH_INV, REG_MR,
///   BIND_MW) first take the reader offline, so an lcore never waits for its own quiescent
///   point and two lcores invalidating at once never wait for each other. They panic if the
///   reader still holds an [`MrRef`] (a copy through it could outlive the invalidation).
/// * A thread that owns an online reader must not call the table's own invalidating methods
///   (dereg, rereg, LOCAL_INV ...) directly: they would wait for the thread's own reader.
///
/// `Send` (built on one thread, run on the lcore's) but not `Sync`.
pub struct Reader {
    table: Arc<MemTable>,
    slot: u32,
    /// Grace period announced at the last quiescent point; 0 = offline.
    last: Cell<u64>,
    /// `MrRef`s from this reader still alive.
    live: Cell<u32>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").field("slot", &self.slot).field("announced", &self.last.get()).finish_non_exhaustive()
    }
}

impl Reader {
    pub(crate) fn new(table: Arc<MemTable>, slot: u32) -> Reader {
        Reader { table, slot, last: Cell::new(0), live: Cell::new(0) }
    }

    /// The table this reader reads.
    pub fn table(&self) -> &MemTable {
        &self.table
    }

    /// [`MemTable::lookup`] without a counted reference: the returned [`MrRef`] is protected
    /// by this reader's next quiescent point. Brings an offline reader online first (one RMW
    /// on the reader's own slot).
    #[inline(always)]
    pub fn lookup(&self, key: Key, pd: PdHandle, qpn: u32, iova: u64, len: u64, need: Access) -> Result<MrRef<'_>, MemError> {
        if self.last.get() == 0 {
            self.go_online();
        }
        self.table.lookup_epoch(&self.live, key, pd, qpn, iova, len, need)
    }

    #[cold]
    fn go_online(&self) {
        self.last.set(self.table.epochs.online(self.slot));
    }

    /// A quiescent point: this reader holds no [`MrRef`] (the `&mut` proves it). One load of
    /// the grace-period counter, plus a store to the reader's own line only while an
    /// invalidation is waiting. Nothing to do while offline.
    #[inline]
    pub fn quiescent(&mut self) {
        let last = self.last.get();
        if last != 0 {
            self.last.set(self.table.epochs.quiescent(self.slot, last));
        }
    }

    /// Go offline (before sleeping or parking): invalidations stop waiting for this reader
    /// until its next lookup.
    #[inline]
    pub fn offline(&mut self) {
        self.go_offline();
    }

    fn go_offline(&self) {
        if self.last.get() != 0 {
            self.table.epochs.offline(self.slot);
            self.last.set(0);
        }
    }

    /// Would [`resume`](MemAccess::resume) return `t`'s window for `[iova, iova + len)`
    /// without a lookup now? (Diagnostics and tests.)
    pub fn is_current(&self, t: &Translation, iova: u64, len: u64) -> bool {
        self.last.get() != 0 && self.table.resume_epoch(&self.live, self.last.get(), t, iova, len).is_some()
    }

    /// Is the reader online?
    pub fn is_online(&self) -> bool {
        self.last.get() != 0
    }

    /// The grace period announced at the last quiescent point (0 = offline; diagnostics and
    /// tests, compare [`MemTable::grace_period`]).
    pub fn announced(&self) -> u64 {
        self.table.epochs.announced(self.slot)
    }

    /// Run a control operation with the reader offline (see the type's documentation).
    fn control<R>(&self, f: impl FnOnce(&MemTable) -> R) -> R {
        assert_eq!(self.live.get(), 0, "memory control operation through a Reader that holds an MrRef");
        self.go_offline();
        f(&self.table)
    }
}

impl MemAccess for Reader {
    fn table(&self) -> &MemTable {
        &self.table
    }
    // Always inlined: the data path's lookups (one per gathered SGE and per placed payload)
    // then keep the window in registers instead of returning a 64-byte `MrRef` through memory.
    #[inline(always)]
    fn lookup(&self, key: Key, pd: PdHandle, qpn: u32, iova: u64, len: u64, need: Access) -> Result<MrRef<'_>, MemError> {
        Reader::lookup(self, key, pd, qpn, iova, len, need)
    }
    fn exec_reg_mr_for(&self, qp_pd: PdHandle, mr: Key, wr_key: Key, access: Access, iova: Option<u64>, length: Option<u64>) -> Result<(), MemError> {
        // No wait for readers, but it takes the slot lock, which an invalidator may hold while
        // it waits for this lcore: offline first.
        self.control(|t| t.exec_reg_mr_for(qp_pd, mr, wr_key, access, iova, length))
    }
    fn exec_local_inv(&self, qp_pd: PdHandle, key: Key) -> Result<(), MemError> {
        self.control(|t| t.exec_local_inv(qp_pd, key))
    }
    fn remote_invalidate(&self, pd: PdHandle, qpn: u32, key: Key) -> Result<(), MemError> {
        self.control(|t| t.remote_invalidate(pd, qpn, key))
    }
    fn exec_bind_mw(&self, qp_pd: PdHandle, qpn: u32, mw: Key, new_key: Key, mr: Key, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        self.control(|t| t.exec_bind_mw(qp_pd, qpn, mw, new_key, mr, addr, len, access))
    }
    /// Stamped with the grace period this reader announces (`epoch.rs`, "Carried
    /// translations").
    fn lookup_carried(&self, key: Key, pd: PdHandle, qpn: u32, iova: u64, len: u64, need: Access) -> Result<Translation, MemError> {
        let r = Reader::lookup(self, key, pd, qpn, iova, len, need)?;
        Ok(r.carry(key, pd, qpn, need, self.last.get()))
    }
    /// One compare of the stamp with the grace period this reader announces, and the range.
    /// An offline reader comes online first, as for a lookup: the translation survives that if
    /// no grace period has begun since its lookup (`Epochs::online`).
    #[inline(always)]
    fn resume(&self, t: &Translation, iova: u64, len: u64) -> Result<MrRef<'_>, MemError> {
        if self.last.get() == 0 {
            self.go_online();
        }
        match self.table.resume_epoch(&self.live, self.last.get(), t, iova, len) {
            Some(r) => Ok(r),
            None => t.lookup_again(self, iova, len),
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.go_offline();
        self.table.epochs.unregister(self.slot);
    }
}
