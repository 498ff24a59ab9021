//! Control path of MWs: allocation, deallocation, unbinding.

use crate::access::{Key, PdHandle};
use crate::sync::{lock, Ordering};
use crate::MemError;

use super::slot::{set_word, MwCtl};
use super::{MemTable, MrState, MwType};

impl MemTable {
    /// `ibv_alloc_mw`: type 1 starts VALID (unbound), type 2 FREE.
    pub fn alloc_mw(&self, pd: PdHandle, mw_type: MwType) -> Result<Key, MemError> {
        let index = lock(&self.free_mw).pop().ok_or(MemError::TableFull)?;
        let slot = self.mw_slot(index).ok_or(MemError::TableFull)?;
        let mut ctl = lock(&slot.ctl);
        let key = Key::new(index, self.next_key_byte(ctl.key.key_byte()));
        *ctl = MwCtl {
            mw_type: Some(mw_type),
            pd,
            key,
            ..MwCtl::default()
        };
        slot.pd.store(pd, Ordering::Relaxed);
        slot.length.store(0, Ordering::Relaxed);
        slot.type2
            .store(u32::from(mw_type == MwType::Type2), Ordering::Relaxed);
        let state = match mw_type {
            MwType::Type1 => MrState::Valid,
            MwType::Type2 => MrState::Free,
        };
        set_word(&slot.word, state, key);
        Ok(key)
    }

    /// `ibv_dealloc_mw`: unbinds (waiting for in-flight copies) and frees the slot.
    pub fn dealloc_mw(&self, key: Key) -> Result<(), MemError> {
        let index = key.index();
        let slot = self.mw_slot(index).ok_or(MemError::NoSuchKey)?;
        let mut ctl = lock(&slot.ctl);
        if ctl.mw_type.is_none() {
            return Err(MemError::NoSuchKey);
        }
        self.block(&slot.word, MrState::Invalid, ctl.key);
        self.unbind_locked(&mut ctl);
        ctl.mw_type = None;
        drop(ctl);
        lock(&self.free_mw).push(index);
        Ok(())
    }

    pub(super) fn unbind_locked(&self, ctl: &mut MwCtl) {
        if let Some(mr) = ctl.bound_mr.take() {
            if let Some(s) = self.mr_slot(mr) {
                s.mw_bound.fetch_sub(1, Ordering::SeqCst);
            }
        }
        ctl.length = 0;
        // An unbound window belongs to no QP (the next bind, from any QP of the PD, sets it).
        ctl.qpn = 0;
    }
}
