//! Slots: the published word (state, key, reference count), the MR/MW slots with their
//! control state, and the page-list arena (module protocol: see the `table` module).

use std::sync::Arc;

use crate::access::{Access, Key, PdHandle};
use crate::region::Backing;
use crate::sync::{spin_wait, AtomicU32, AtomicU64, Mutex, Ordering};
use crate::MemError;

use super::{MrKind, MrState, MwType};

const STATE_SHIFT: u32 = 32;
pub(super) const REF_SHIFT: u32 = 34;
pub(super) const REF_ONE: u64 = 1 << REF_SHIFT;
const REF_MASK: u64 = !(REF_ONE - 1);

const fn pack(state: MrState, key: Key) -> u64 {
    (state.code() << STATE_SHIFT) | key.0 as u64
}
pub(super) const fn unpack(w: u64) -> (MrState, Key) {
    (MrState::from_code((w >> STATE_SHIFT) & 3), Key(w as u32))
}

/// Translation meta as the control side knows it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Meta {
    pub(super) iova: u64,
    pub(super) length: u64,
    /// Bytes actually mapped (upper bound for a WR length).
    pub(super) mapped: u64,
    pub(super) shift: u32,
}

#[derive(Default)]
pub(super) struct MrCtl {
    pub(super) kind: Option<MrKind>,
    pub(super) pd: PdHandle,
    pub(super) key: Key,
    pub(super) access: Access,
    pub(super) max_num_sg: u32,
    pub(super) arena_start: u32,
    pub(super) active_buf: u32,
    pub(super) active: Option<Meta>,
    pub(super) staged: Option<Meta>,
    /// `staged` came from map_mr_sg (swap buffers at REG_MR), not only from an iova rewrite.
    pub(super) staged_is_remap: bool,
    /// Owners of the memory each buffer's pages point into (capacity reserved at alloc).
    pub(super) owners: [Vec<Arc<dyn Backing>>; 2],
    /// Revoked by the service ([`MemTable::revoke_mr`](super::MemTable::revoke_mr)): REG_MR
    /// refuses it until it is deregistered (a user MR: until `rereg_mr` gives it new memory).
    pub(super) revoked: bool,
}

impl MrCtl {
    /// `Ok` for a fast-reg MR; `NoSuchKey` for a free slot, `WrongMrType` for any other kind.
    pub(super) fn check_fast_reg(&self) -> Result<(), MemError> {
        match self.kind {
            None => Err(MemError::NoSuchKey),
            Some(MrKind::FastReg) => Ok(()),
            Some(_) => Err(MemError::WrongMrType),
        }
    }
}

#[repr(align(64))]
pub(super) struct MrSlot {
    pub(super) word: AtomicU64,
    pub(super) mw_bound: AtomicU32,
    pub(super) pd: AtomicU32,
    pub(super) access: AtomicU32,
    pub(super) shift: AtomicU32,
    pub(super) iova: AtomicU64,
    pub(super) length: AtomicU64,
    /// Contiguous (shift 0): address of `iova`. Paged: arena index of page 0 of the active list.
    pub(super) base: AtomicU64,
    pub(super) ctl: Mutex<MrCtl>,
}

impl MrSlot {
    pub(super) fn new() -> Self {
        MrSlot {
            word: AtomicU64::new(0),
            mw_bound: AtomicU32::new(0),
            pd: AtomicU32::new(0),
            access: AtomicU32::new(0),
            shift: AtomicU32::new(0),
            iova: AtomicU64::new(0),
            length: AtomicU64::new(0),
            base: AtomicU64::new(0),
            ctl: Mutex::new(MrCtl::default()),
        }
    }
}

#[derive(Default)]
pub(super) struct MwCtl {
    pub(super) mw_type: Option<MwType>,
    pub(super) pd: PdHandle,
    pub(super) key: Key,
    /// MR index while bound.
    pub(super) bound_mr: Option<u32>,
    pub(super) access: Access,
    pub(super) addr: u64,
    pub(super) length: u64,
    pub(super) qpn: u32,
}

#[repr(align(64))]
pub(super) struct MwSlot {
    pub(super) word: AtomicU64,
    pub(super) pd: AtomicU32,
    pub(super) access: AtomicU32,
    pub(super) mr_index: AtomicU32,
    pub(super) qpn: AtomicU32,
    /// 1 = type 2 (QP check), 0 = type 1.
    pub(super) type2: AtomicU32,
    pub(super) addr: AtomicU64,
    pub(super) length: AtomicU64,
    pub(super) ctl: Mutex<MwCtl>,
}

impl MwSlot {
    pub(super) fn new() -> Self {
        MwSlot {
            word: AtomicU64::new(0),
            pd: AtomicU32::new(0),
            access: AtomicU32::new(0),
            mr_index: AtomicU32::new(0),
            qpn: AtomicU32::new(0),
            type2: AtomicU32::new(0),
            addr: AtomicU64::new(0),
            length: AtomicU64::new(0),
            ctl: Mutex::new(MwCtl::default()),
        }
    }
}

/// Set state and key, keeping the reference count (Release: publishes translation fields).
pub(super) fn set_word(word: &AtomicU64, state: MrState, key: Key) {
    let new = pack(state, key);
    let mut cur = word.load(Ordering::Relaxed);
    loop {
        match word.compare_exchange_weak(cur, (cur & REF_MASK) | new, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return,
            Err(w) => cur = w,
        }
    }
}

/// Move to a non-VALID state, then wait until no counted reference is held (module protocol).
/// Callers go through [`MemTable::block`](super::MemTable::block), which also waits for the epoch readers.
pub(super) fn block_and_drain(word: &AtomicU64, state: MrState, key: Key) {
    set_word(word, state, key);
    let mut i = 0u32;
    while word.load(Ordering::Acquire) & REF_MASK != 0 {
        spin_wait(i);
        i = i.saturating_add(1);
    }
}

/// First-fit allocator over the page-list arena (control path only).
pub(super) struct Arena {
    /// Free ranges (start, len), sorted by start, coalesced.
    pub(super) free: Vec<(u32, u32)>,
}

impl Arena {
    pub(super) fn alloc(&mut self, n: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, l)| l >= n)?;
        let (s, l) = self.free[i];
        if l == n {
            self.free.remove(i);
        } else {
            self.free[i] = (s + n, l - n);
        }
        Some(s)
    }
    pub(super) fn release(&mut self, s: u32, n: u32) {
        let i = self.free.partition_point(|&(fs, _)| fs < s);
        self.free.insert(i, (s, n));
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}
