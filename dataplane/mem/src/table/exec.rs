//! Executed operations (send-queue order, exactly once each): REG_MR, LOCAL_INV, remote
//! invalidate (SEND_WITH_INV), BIND_MW.

use crate::access::{Access, Key, PdHandle};
use crate::sync::{lock, Ordering};
use crate::MemError;

use super::mr::check_iova_rewrite;
use super::slot::{set_word, unpack};
use super::{MemTable, MrState, MwType};

impl MemTable {
    /// IB_WR_REG_MR (§2.5): FREE precondition (A3), PD check (A5), access combination (A15),
    /// then installs the staged page list, or revalidates the existing translation when nothing
    /// was mapped since (A10). `iova`/`length`, when given, override the mapped values (the
    /// page offset must be kept; the length cannot exceed what was mapped). On success
    /// lkey = rkey = `wr_key`, state VALID.
    ///
    /// The MR is named by `wr_key`'s index; use [`exec_reg_mr_for`](Self::exec_reg_mr_for) when
    /// the WR carries the MR separately from the key (A4).
    pub fn exec_reg_mr(
        &self,
        qp_pd: PdHandle,
        wr_key: Key,
        access: Access,
        iova: Option<u64>,
        length: Option<u64>,
    ) -> Result<(), MemError> {
        let slot = self.mr_slot(wr_key.index()).ok_or(MemError::NoSuchKey)?;
        let mut ctl = lock(&slot.ctl);
        ctl.check_fast_reg()?;
        if ctl.revoked {
            return Err(MemError::NotValid);
        }
        let (state, _) = unpack(slot.word.load(Ordering::SeqCst));
        if state != MrState::Free {
            return Err(MemError::NotFree);
        }
        if ctl.pd != qp_pd {
            return Err(MemError::PdMismatch);
        }
        if !access.combo_ok() {
            return Err(MemError::BadAccessCombo);
        }
        let (mut meta, swap) = match (ctl.staged, ctl.active) {
            (Some(m), _) => (m, ctl.staged_is_remap),
            (None, Some(m)) => (m, false),
            (None, None) => return Err(MemError::NotMapped),
        };
        if let Some(v) = iova {
            check_iova_rewrite(&meta, v)?;
            meta.iova = v;
        }
        if let Some(l) = length {
            if l == 0 {
                return Err(MemError::ZeroLength);
            }
            if l > meta.mapped {
                return Err(MemError::OutOfRange);
            }
            meta.length = l;
        }
        meta.iova
            .checked_add(meta.length)
            .ok_or(MemError::Overflow)?;
        // FREE ⇒ drained (every FREE transition drains), so no reader sees these stores
        // before the Release of VALID below.
        if swap {
            ctl.active_buf ^= 1;
            let (a, b) = ctl.owners.split_at_mut(1);
            std::mem::swap(&mut a[0], &mut b[0]);
            // The old owners stay referenced until the next map_mr_sg (control path) drops them.
        }
        ctl.staged = None;
        ctl.active = Some(meta);
        ctl.key = wr_key;
        ctl.access = access;
        let base = ctl.arena_start as u64 + ctl.active_buf as u64 * ctl.max_num_sg as u64;
        slot.pd.store(ctl.pd, Ordering::Relaxed);
        slot.access.store(access.bits(), Ordering::Relaxed);
        slot.shift.store(meta.shift, Ordering::Relaxed);
        slot.iova.store(meta.iova, Ordering::Relaxed);
        slot.length.store(meta.length, Ordering::Relaxed);
        slot.base.store(base, Ordering::Relaxed);
        // Preserve the reference count: a failed lookup may hold a transient reference.
        set_word(&slot.word, MrState::Valid, wr_key);
        Ok(())
    }

    /// [`exec_reg_mr`](Self::exec_reg_mr) for a WR that names the MR (`mr`, any key byte) and
    /// the new key separately: the key's upper 24 bits must be the MR's index (A4).
    pub fn exec_reg_mr_for(
        &self,
        qp_pd: PdHandle,
        mr: Key,
        wr_key: Key,
        access: Access,
        iova: Option<u64>,
        length: Option<u64>,
    ) -> Result<(), MemError> {
        if mr.index() != wr_key.index() {
            return Err(MemError::KeyMismatch);
        }
        self.exec_reg_mr(qp_pd, wr_key, access, iova, length)
    }

    /// IB_WR_LOCAL_INV (§2.6): fast-reg MR or type-2 MW, exact key (lkey == rkey), PD match
    /// (stricter than rxe), no MWs bound. VALID → FREE; invalidating a FREE object succeeds
    /// (as rxe). Returns only when no [`MrRef`] from the old state is alive — do not call it
    /// while holding one for the same key.
    pub fn exec_local_inv(&self, qp_pd: PdHandle, key: Key) -> Result<(), MemError> {
        self.invalidate(qp_pd, None, key, false)
    }

    /// SEND_WITH_INV at the responder (§2.7, B1): like LOCAL_INV, but the object must be VALID
    /// and a type-2 MW must be bound to `qpn`.
    pub fn remote_invalidate(&self, pd: PdHandle, qpn: u32, key: Key) -> Result<(), MemError> {
        self.invalidate(pd, Some(qpn), key, true)
    }

    fn invalidate(
        &self,
        pd: PdHandle,
        qpn: Option<u32>,
        key: Key,
        must_be_valid: bool,
    ) -> Result<(), MemError> {
        if let Some(slot) = self.mr_slot(key.index()) {
            let ctl = lock(&slot.ctl);
            ctl.check_fast_reg()?; // A9: only fast-reg MRs are invalidated
            if ctl.key != key {
                return Err(MemError::KeyMismatch); // A7
            }
            if ctl.pd != pd {
                return Err(MemError::PdMismatch);
            }
            if slot.mw_bound.load(Ordering::SeqCst) != 0 {
                return Err(MemError::MwBound); // A8
            }
            let (state, _) = unpack(slot.word.load(Ordering::SeqCst));
            match state {
                MrState::Valid => {}
                MrState::Free if !must_be_valid => return Ok(()),
                _ => return Err(MemError::NotValid),
            }
            self.block(&slot.word, MrState::Free, key);
            return Ok(());
        }
        let slot = self.mw_slot(key.index()).ok_or(MemError::NoSuchKey)?;
        let mut ctl = lock(&slot.ctl);
        match ctl.mw_type {
            None => return Err(MemError::NoSuchKey),
            Some(MwType::Type2) => {}
            Some(MwType::Type1) => return Err(MemError::WrongMrType), // o10-37.2.26
        }
        if ctl.key != key {
            return Err(MemError::KeyMismatch);
        }
        if ctl.pd != pd {
            return Err(MemError::PdMismatch);
        }
        let (state, _) = unpack(slot.word.load(Ordering::SeqCst));
        match state {
            MrState::Valid => {}
            MrState::Free if !must_be_valid => return Ok(()),
            _ => return Err(MemError::NotValid),
        }
        if let Some(q) = qpn {
            if ctl.qpn != q {
                return Err(MemError::QpMismatch);
            }
        }
        self.block(&slot.word, MrState::Free, key);
        self.unbind_locked(&mut ctl);
        Ok(())
    }

    /// IB_WR_BIND_MW / `ibv_bind_mw` (§2.8, C10-72..75). `new_key` must carry the MW's index;
    /// its byte is the consumer's choice. Type 1 with `len == 0` unbinds.
    ///
    /// `mw` names the window by its index only: verbs names it by the `ibv_mw` object, whose
    /// `rkey` is the allocation key for a type-2 window (nothing updates it when a posted
    /// BIND_MW or an invalidation changes the key), so its key byte is not compared. Binding
    /// still needs the MW's PD, and a type-2 window must be FREE, so a stale name can neither
    /// reach another PD's window nor take over a live binding.
    #[allow(clippy::too_many_arguments)]
    pub fn exec_bind_mw(
        &self,
        qp_pd: PdHandle,
        qpn: u32,
        mw: Key,
        new_key: Key,
        mr: Key,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemError> {
        if new_key.index() != mw.index() {
            return Err(MemError::KeyMismatch);
        }
        let slot = self.mw_slot(mw.index()).ok_or(MemError::NoSuchKey)?;
        let mut ctl = lock(&slot.ctl);
        let t = ctl.mw_type.ok_or(MemError::NoSuchKey)?;
        if ctl.pd != qp_pd {
            return Err(MemError::PdMismatch); // C10-72
        }
        let (state, _) = unpack(slot.word.load(Ordering::SeqCst));
        match t {
            MwType::Type1 => {
                if state != MrState::Valid {
                    return Err(MemError::NotValid);
                }
                if access.contains(Access::ZERO_BASED) {
                    return Err(MemError::BadAccessCombo);
                }
                if len == 0 {
                    self.block(&slot.word, MrState::Free, ctl.key);
                    self.unbind_locked(&mut ctl);
                    ctl.key = new_key;
                    slot.length.store(0, Ordering::Relaxed);
                    // Preserve the reference count: a failed lookup may hold a transient reference.
                    set_word(&slot.word, MrState::Valid, new_key);
                    return Ok(());
                }
            }
            MwType::Type2 => {
                if state != MrState::Free {
                    return Err(MemError::NotFree);
                }
                if len == 0 {
                    return Err(MemError::ZeroLength);
                }
            }
        }
        let mr_slot = self.mr_slot(mr.index()).ok_or(MemError::NoSuchKey)?;
        let mr_ctl = lock(&mr_slot.ctl);
        if mr_ctl.kind.is_none() {
            return Err(MemError::NoSuchKey);
        }
        if mr_ctl.key != mr {
            return Err(MemError::KeyMismatch);
        }
        let (mr_state, _) = unpack(mr_slot.word.load(Ordering::SeqCst));
        if mr_state != MrState::Valid {
            return Err(MemError::NotValid);
        }
        if mr_ctl.pd != ctl.pd {
            return Err(MemError::PdMismatch);
        }
        if !mr_ctl.access.contains(Access::MW_BIND) {
            return Err(MemError::AccessDenied); // C10-73
        }
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !mr_ctl.access.contains(Access::LOCAL_WRITE)
        {
            return Err(MemError::BadAccessCombo); // C10-74
        }
        let a = mr_ctl.active.unwrap_or_default();
        let end = addr.checked_add(len).ok_or(MemError::Overflow)?;
        if addr < a.iova || end > a.iova + a.length {
            return Err(MemError::OutOfRange); // C10-75
        }
        // Rebinding a type-1 MW: block its old binding first.
        if ctl.bound_mr.is_some() {
            self.block(&slot.word, MrState::Free, ctl.key);
            self.unbind_locked(&mut ctl);
        }
        mr_slot.mw_bound.fetch_add(1, Ordering::SeqCst);
        drop(mr_ctl);
        ctl.bound_mr = Some(mr.index());
        ctl.key = new_key;
        ctl.access = access;
        ctl.addr = addr;
        ctl.length = len;
        ctl.qpn = qpn;
        slot.access.store(access.bits(), Ordering::Relaxed);
        slot.addr.store(addr, Ordering::Relaxed);
        slot.length.store(len, Ordering::Relaxed);
        slot.mr_index.store(mr.index(), Ordering::Relaxed);
        slot.qpn.store(qpn, Ordering::Relaxed);
        // Preserve the reference count: a failed lookup may hold a transient reference.
        set_word(&slot.word, MrState::Valid, new_key);
        Ok(())
    }
}
