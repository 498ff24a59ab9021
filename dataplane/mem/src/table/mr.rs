//! Control path of MRs: user registrations and fast-reg MRs (alloc, map, iova rewrite,
//! dereg).

use std::sync::Arc;

use crate::access::{Access, Key, PdHandle};
use crate::map::{self, SgMapping};
use crate::region::Region;
use crate::sync::{lock, Ordering};
use crate::MemError;

use super::slot::{set_word, Meta};
use super::{MemTable, MrKind, MrState, SgEntry};

impl MemTable {
    /// What `ibv_reg_mr`/`ibv_rereg_mr` check of a user registration; returns its length.
    fn check_user_region(&self, region: &Region, iova: u64, access: Access) -> Result<u64, MemError> {
        if region.is_empty() {
            return Err(MemError::ZeroLength);
        }
        if !access.combo_ok() {
            return Err(MemError::BadAccessCombo);
        }
        let len = region.len() as u64;
        if len > self.limits.max_mr_size {
            return Err(MemError::OutOfRange);
        }
        iova.checked_add(len).ok_or(MemError::Overflow)?;
        Ok(len)
    }

    /// `ibv_reg_mr`: an MR over `region`, VALID at once, lkey == rkey.
    pub fn reg_mr(
        &self,
        pd: PdHandle,
        region: Region,
        iova: u64,
        access: Access,
    ) -> Result<Key, MemError> {
        let len = self.check_user_region(&region, iova, access)?;
        let index = lock(&self.free_mr).pop().ok_or(MemError::TableFull)?;
        let slot = self.mr_slot(index).ok_or(MemError::TableFull)?;
        let mut ctl = lock(&slot.ctl);
        let key = Key::new(index, self.next_key_byte(ctl.key.key_byte()));
        slot.pd.store(pd, Ordering::Relaxed);
        slot.access.store(access.bits(), Ordering::Relaxed);
        slot.shift.store(0, Ordering::Relaxed);
        slot.iova.store(iova, Ordering::Relaxed);
        slot.length.store(len, Ordering::Relaxed);
        slot.base.store(region.addr(), Ordering::Relaxed);
        slot.mw_bound.store(0, Ordering::Relaxed);
        ctl.kind = Some(MrKind::User);
        ctl.pd = pd;
        ctl.key = key;
        ctl.access = access;
        ctl.max_num_sg = 0;
        ctl.active = Some(Meta {
            iova,
            length: len,
            mapped: len,
            shift: 0,
        });
        ctl.staged = None;
        ctl.revoked = false;
        ctl.active_buf = 0;
        ctl.owners[0].clear();
        ctl.owners[0].push(region.owner().clone());
        ctl.owners[1].clear();
        // Preserve the reference count: a failed lookup may hold a transient reference.
        set_word(&slot.word, MrState::Valid, key);
        Ok(key)
    }

    /// `ibv_rereg_mr`: give the user MR `key` a new PD, access and/or translation in place,
    /// keeping its keys (as mlx5 does; rxe keeps them for PD/access changes). The MR is
    /// blocked and drained of in-flight copies first, so no reader sees a mix of old and new
    /// attributes; refused while memory windows are bound to it (IBA 10.6.7.2.6). On an error
    /// the MR is left unchanged and valid.
    pub fn rereg_mr(&self, key: Key, pd: PdHandle, region: Region, iova: u64, access: Access) -> Result<(), MemError> {
        let len = self.check_user_region(&region, iova, access)?;
        let slot = self.mr_slot(key.index()).ok_or(MemError::NoSuchKey)?;
        let mut ctl = lock(&slot.ctl);
        if ctl.kind != Some(MrKind::User) || ctl.key != key {
            return Err(MemError::NoSuchKey);
        }
        if slot.mw_bound.load(Ordering::SeqCst) != 0 {
            return Err(MemError::MwBound);
        }
        self.block(&slot.word, MrState::Invalid, key);
        slot.pd.store(pd, Ordering::Relaxed);
        slot.access.store(access.bits(), Ordering::Relaxed);
        slot.iova.store(iova, Ordering::Relaxed);
        slot.length.store(len, Ordering::Relaxed);
        slot.base.store(region.addr(), Ordering::Relaxed);
        ctl.pd = pd;
        ctl.access = access;
        ctl.revoked = false;
        ctl.active = Some(Meta { iova, length: len, mapped: len, shift: 0 });
        let old = std::mem::replace(&mut ctl.owners[0], vec![region.owner().clone()]);
        // Preserve the reference count: a failed lookup may hold a transient reference.
        set_word(&slot.word, MrState::Valid, key);
        drop(ctl);
        drop(old); // may unmap: outside the slot lock
        Ok(())
    }

    /// `ib_alloc_mr(pd, MEM_REG, max_num_sg)`: a FREE fast-reg MR with `2 × max_num_sg` page
    /// slots reserved (active + staging), so `map_mr_sg` never allocates.
    pub fn alloc_mr(&self, pd: PdHandle, max_num_sg: u32) -> Result<Key, MemError> {
        if max_num_sg == 0 {
            return Err(MemError::ZeroLength);
        }
        if max_num_sg > self.limits.max_fast_reg_pages {
            return Err(MemError::TooManyPages);
        }
        let slots = max_num_sg.checked_mul(2).ok_or(MemError::TooManyPages)?;
        let start = lock(&self.arena).alloc(slots).ok_or(MemError::TableFull)?;
        let Some(index) = lock(&self.free_mr).pop() else {
            lock(&self.arena).release(start, slots);
            return Err(MemError::TableFull);
        };
        let slot = self.mr_slot(index).ok_or(MemError::TableFull)?;
        let mut ctl = lock(&slot.ctl);
        let key = Key::new(index, self.next_key_byte(ctl.key.key_byte()));
        slot.pd.store(pd, Ordering::Relaxed);
        slot.mw_bound.store(0, Ordering::Relaxed);
        ctl.kind = Some(MrKind::FastReg);
        ctl.pd = pd;
        ctl.key = key;
        ctl.access = Access::EMPTY;
        ctl.max_num_sg = max_num_sg;
        ctl.arena_start = start;
        ctl.active_buf = 0;
        ctl.active = None;
        ctl.staged = None;
        ctl.revoked = false;
        for o in ctl.owners.iter_mut() {
            o.clear();
            o.reserve(max_num_sg as usize);
        }
        set_word(&slot.word, MrState::Free, key);
        Ok(key)
    }

    /// `ib_map_mr_sg`: build the MR's *staging* page list (the active translation, if any, is
    /// untouched until REG_MR executes — A11). Returns the number of elements mapped. Sets the
    /// staged iova (first element + `sg_offset`), length and page size. Never allocates.
    pub fn map_mr_sg(
        &self,
        key: Key,
        sg: &[SgEntry<'_>],
        sg_offset: u64,
        page_size: u64,
    ) -> Result<usize, MemError> {
        let slot = self.mr_slot(key.index()).ok_or(MemError::NoSuchKey)?;
        let mut ctl = lock(&slot.ctl);
        ctl.check_fast_reg()?;
        map::page_shift(page_size)?;
        for e in sg {
            let end = e.offset.checked_add(e.len).ok_or(MemError::Overflow)?;
            if end > e.region.len() {
                return Err(MemError::OutOfRange);
            }
        }
        if sg.is_empty() {
            return Ok(0);
        }
        let max = ctl.max_num_sg as usize;
        let stage_buf = ctl.active_buf ^ 1;
        // The staging buffer is about to be overwritten: forget what it held, so a failed map
        // cannot leave a staged page list pointing into memory whose owners we dropped.
        if ctl.staged_is_remap {
            ctl.staged = None;
            ctl.staged_is_remap = false;
        }
        let base = ctl.arena_start as usize + stage_buf as usize * max;
        let pages = &self.pages[base..base + max];
        let m: SgMapping = map::sg_to_pages(
            sg.iter()
                .map(|e| (e.region.addr() + e.offset as u64, e.len as u64)),
            sg_offset,
            page_size,
            max,
            |i, a| pages[i].store(a, Ordering::Relaxed),
        )?;
        if m.length > self.limits.max_mr_size {
            return Err(MemError::OutOfRange);
        }
        let owners = &mut ctl.owners[stage_buf as usize];
        owners.clear();
        for e in &sg[..m.entries] {
            // Capacity max_num_sg was reserved and entries <= pages <= max_num_sg.
            if !owners.iter().any(|o| Arc::ptr_eq(o, e.region.owner())) {
                owners.push(e.region.owner().clone());
            }
        }
        ctl.staged = Some(Meta {
            iova: m.iova,
            length: m.length,
            mapped: m.length,
            shift: m.page_shift,
        });
        ctl.staged_is_remap = true;
        Ok(m.entries)
    }

    /// Rewrite the iova the next REG_MR installs (xprtrdma puts the XID in the upper 32 bits).
    /// The offset inside the first page must stay the same.
    pub fn set_fast_reg_iova(&self, key: Key, iova: u64) -> Result<(), MemError> {
        let slot = self.mr_slot(key.index()).ok_or(MemError::NoSuchKey)?;
        let mut ctl = lock(&slot.ctl);
        ctl.check_fast_reg()?;
        let mut m = ctl.staged.or(ctl.active).ok_or(MemError::NotMapped)?;
        check_iova_rewrite(&m, iova)?;
        m.iova = iova;
        if ctl.staged.is_none() {
            // Revalidation path: the next REG_MR keeps the active pages with this iova; the
            // VALID translation itself is not touched under readers.
            ctl.staged_is_remap = false;
        }
        ctl.staged = Some(m);
        Ok(())
    }

    /// Revoke the MR named by `key`'s index on the service's behalf (its memory faulted under
    /// an lcore: issue 37), like a LOCAL_INV the client cannot undo: the MR goes FREE, so every
    /// later local access through its keys fails (LOC_PROT_ERR) and every remote one is NAKed
    /// (remote access error); REG_MR refuses it from now on; memory windows bound to it are
    /// blocked and unbound (their translation is the MR's). Returns once no copy through the old state
    /// is in flight (as LOCAL_INV: counted references drained, every lcore past a quiescent
    /// point). Deregistration works as usual afterwards. Returns the MR's PD.
    ///
    /// Must not be called by a thread whose [`Reader`](crate::Reader) is online.
    pub fn revoke_mr(&self, key: Key) -> Result<PdHandle, MemError> {
        let index = key.index();
        let slot = self.mr_slot(index).ok_or(MemError::NoSuchKey)?;
        let pd = {
            let mut ctl = lock(&slot.ctl);
            if ctl.kind.is_none() || matches!(ctl.kind, Some(MrKind::Mw(_))) {
                return Err(MemError::NoSuchKey);
            }
            ctl.revoked = true;
            let (state, k) = super::slot::unpack(slot.word.load(Ordering::SeqCst));
            if state == MrState::Valid {
                self.block(&slot.word, MrState::Free, k);
            }
            ctl.pd
        };
        // Windows bound to it (lock order MW ctl → MR ctl: the MR's lock is released). A bind
        // after the block above fails (the MR is not VALID), so none is missed.
        // They are unbound (as an invalidation does), so the MR can be deregistered.
        for mw in self.mws.iter() {
            let mut ctl = lock(&mw.ctl);
            if ctl.bound_mr == Some(index) {
                let (state, k) = super::slot::unpack(mw.word.load(Ordering::SeqCst));
                if state == MrState::Valid {
                    self.block(&mw.word, MrState::Free, k);
                }
                self.unbind_locked(&mut ctl);
            }
        }
        Ok(pd)
    }

    /// Whether the MR named by `key`'s index was revoked ([`revoke_mr`](Self::revoke_mr)).
    pub fn is_revoked(&self, key: Key) -> bool {
        self.mr_slot(key.index()).is_some_and(|s| lock(&s.ctl).revoked)
    }

    /// `ibv_dereg_mr`: any state → gone; refused while MWs are bound. Waits for in-flight copies.
    pub fn dereg_mr(&self, key: Key) -> Result<(), MemError> {
        let index = key.index();
        let slot = self.mr_slot(index).ok_or(MemError::NoSuchKey)?;
        let mut ctl = lock(&slot.ctl);
        if ctl.kind.is_none() || matches!(ctl.kind, Some(MrKind::Mw(_))) {
            return Err(MemError::NoSuchKey);
        }
        if slot.mw_bound.load(Ordering::SeqCst) != 0 {
            return Err(MemError::MwBound); // IBA 10.6.7.2.6
        }
        self.block(&slot.word, MrState::Invalid, ctl.key);
        if ctl.kind == Some(MrKind::FastReg) {
            lock(&self.arena).release(ctl.arena_start, ctl.max_num_sg * 2);
        }
        ctl.kind = None;
        ctl.active = None;
        ctl.staged = None;
        ctl.revoked = false;
        let owners = std::mem::take(&mut ctl.owners);
        drop(ctl);
        drop(owners); // may unmap: outside the slot lock
        lock(&self.free_mr).push(index);
        Ok(())
    }
}

pub(super) fn check_iova_rewrite(meta: &Meta, iova: u64) -> Result<(), MemError> {
    let mask = if meta.shift == 0 {
        0
    } else {
        (1u64 << meta.shift) - 1
    };
    if iova & mask != meta.iova & mask {
        return Err(MemError::BadAlignment);
    }
    iova.checked_add(meta.length).ok_or(MemError::Overflow)?;
    Ok(())
}
