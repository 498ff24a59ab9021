//! The MR/MW key table.
//!
//! # Contract
//! * One active translation per MR (DESIGN invariant 1). `map_mr_sg` writes a *staging* page
//!   list; `exec_reg_mr` installs it (a buffer swap) or, when nothing was staged since the last
//!   install, revalidates the existing translation. Invalidate blocks the key and keeps the
//!   mapping.
//! * Fast path (`lookup`, [`MrRef`] copies): no lock, no allocation, checked arithmetic.
//! * Invalidate (local, remote, dereg, MW unbind) returns only after every [`MrRef`] that was
//!   obtained through the old state has been dropped (DESIGN invariant 3).
//!
//! # Two kinds of lookup
//! * Through a [`Reader`](crate::Reader) (the lcores): the slot word is *loaded* and checked;
//!   the reference is protected by the reader's next quiescent point (QSBR, `epoch.rs`). No
//!   read-modify-write, nothing written to a shared line.
//! * Through the table itself ([`MemTable::lookup`]: any other thread, tests, tools): a counted
//!   reference in the slot word (below).
//!
//! Every invalidation does both waits: after its state change it drains the counted references
//! (`block_and_drain`), then waits for a grace period (`Epochs::synchronize`).
//!
//! # Publication protocol (per slot)
//! One atomic `word` per slot packs `refs << 34 | state << 32 | key`. A reader does a single
//! `fetch_add(1 << 34, Acquire)` and checks state and key *in the value it incremented*; on any
//! failure its guard subtracts again. Every state change is a read-modify-write of the same
//! word (keeping `refs`), and an invalidator, after its RMW to a non-VALID state, waits until
//! `refs == 0` (Acquire, pairing with the readers' Release decrement). Because all of this is
//! one location, its modification order decides every race: a reader incremented either before
//! the invalidating RMW (the invalidator then sees its ref and waits for it to drop) or after
//! (the reader sees the new state and backs off). No store-load (Dekker) ordering is needed,
//! so the argument holds under plain acquire/release and loom checks it exactly.
//! Translation fields are written only while the slot is not VALID and drained, and published
//! by the Release RMW that makes it VALID. All translation fields are atomics (Relaxed), so
//! there are no data races in the Rust model.
//!
//! Control operations on one slot are serialised by the slot's `ctl` mutex (never taken by
//! `lookup`). Lock order: MW ctl → MR ctl → table allocators.
//!
//! Control operations identify an object by the *index* of the key they are given (the consumer
//! may have changed the key byte with `update_fast_reg_key`); executed operations (`exec_*`,
//! `remote_invalidate`) and lookups compare the full 32-bit key.
//!
//! # Layout
//! * `slot.rs`: the slot word (state, key, reference count), the MR/MW slots and their control
//!   state, the page-list arena.
//! * `mr.rs`: control path of MRs (`reg_mr`, `rereg_mr`, `alloc_mr`, `map_mr_sg`, `dereg_mr`).
//! * `mw.rs`: control path of MWs (`alloc_mw`, `dealloc_mw`, unbinding).
//! * `exec.rs`: executed operations (REG_MR, LOCAL_INV, remote invalidate, BIND_MW).
//! * `lookup.rs`: the fast path (`lookup`, epoch lookups) and [`MrRef`], the copies through it.

mod exec;
mod lookup;
mod mr;
mod mw;
mod slot;

use std::sync::Arc;

use crate::access::{Key, PdHandle, Access};
use crate::epoch::Epochs;
use crate::reader::Reader;
use crate::region::Region;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use crate::MemError;
use slot::{block_and_drain, unpack, Arena, MrSlot, MwSlot};

pub use lookup::{MrRef, Translation};

/// First MW index: MR indexes are `1 .. MW_INDEX_BASE`, MW indexes `MW_INDEX_BASE ..` (as rxe).
pub const MW_INDEX_BASE: u32 = 1 << 19;
/// Largest index a key can carry.
pub const MAX_INDEX: u32 = (1 << 24) - 1;

/// Sizes of the table, fixed at creation (all memory is reserved up front).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemLimits {
    /// MR slots (indexes 1..=max_mr, < `MW_INDEX_BASE`).
    pub max_mr: u32,
    /// MW slots (indexes `MW_INDEX_BASE ..`).
    pub max_mw: u32,
    /// Largest `max_num_sg` for `alloc_mr` (rxe: 512).
    pub max_fast_reg_pages: u32,
    /// Total page-list entries shared by all fast-reg MRs (each reserves 2 × max_num_sg:
    /// active + staging).
    pub page_slots: u32,
    /// Largest MR length.
    pub max_mr_size: u64,
    /// Epoch readers (one per lcore) the table can register.
    pub max_readers: u32,
}

impl Default for MemLimits {
    fn default() -> Self {
        MemLimits {
            max_mr: 4096,
            max_mw: 4096,
            max_fast_reg_pages: 512,
            page_slots: 1 << 18,
            max_mr_size: 1 << 40,
            max_readers: 128,
        }
    }
}

/// MR/MW state (§2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MrState {
    /// Not allocated, or torn down.
    Invalid,
    /// Allocated (or invalidated); keys do not work.
    Free,
    /// Keys work.
    Valid,
}

impl MrState {
    const fn code(self) -> u64 {
        match self {
            MrState::Invalid => 0,
            MrState::Free => 1,
            MrState::Valid => 2,
        }
    }
    const fn from_code(c: u64) -> MrState {
        match c {
            1 => MrState::Free,
            2 => MrState::Valid,
            _ => MrState::Invalid,
        }
    }
}

/// Memory window type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Type 1: bound with `ibv_bind_mw`, rebindable, not invalidatable.
    Type1,
    /// Type 2 (2B): bound by a BIND_MW WR from one QP, usable only from that QP, invalidated by
    /// LOCAL_INV or SEND_WITH_INV.
    Type2,
}

/// What a key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MrKind {
    /// `reg_mr` over a region: VALID at once, not fast-reg.
    User,
    /// `alloc_mr` (IB_MR_TYPE_MEM_REG).
    FastReg,
    /// A memory window.
    Mw(MwType),
}

/// Snapshot of an MR or MW (control path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    /// Current key (lkey == rkey).
    pub key: Key,
    /// What it is.
    pub kind: MrKind,
    /// State.
    pub state: MrState,
    /// Protection domain.
    pub pd: PdHandle,
    /// Start of the active translation (MW: bound address).
    pub iova: u64,
    /// Length of the active translation (MW: bound length).
    pub length: u64,
    /// Access of the active registration.
    pub access: Access,
    /// Page size of the active translation (0 for a contiguous user MR or an MW).
    pub page_size: u64,
    /// Fast-reg: page slots reserved.
    pub max_num_sg: u32,
    /// MWs bound to this MR.
    pub mw_bound: u32,
    /// Fast-reg: a staged page list is waiting for REG_MR.
    pub staged: bool,
    /// Fast-reg: iova/length the next REG_MR will install (staged, else active).
    pub next_iova: u64,
    /// See `next_iova`.
    pub next_length: u64,
    /// Type-2 MW: QP it is bound to.
    pub qpn: u32,
}

/// One element of a `map_mr_sg` scatterlist: `len` bytes at `offset` inside `region`.
#[derive(Debug, Clone, Copy)]
pub struct SgEntry<'a> {
    /// Memory the element lives in.
    pub region: &'a Region,
    /// Offset inside the region.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

// ---------------------------------------------------------------------------------------------
// The table

/// MR/MW table shared by the control thread and every lcore (`Arc<MemTable>`).
pub struct MemTable {
    limits: MemLimits,
    mrs: Box<[MrSlot]>,
    mws: Box<[MwSlot]>,
    /// Page addresses of every fast-reg MR's active and staging lists.
    pages: Box<[AtomicU64]>,
    free_mr: Mutex<Vec<u32>>,
    free_mw: Mutex<Vec<u32>>,
    arena: Mutex<Arena>,
    rng: AtomicU64,
    pub(crate) epochs: Epochs,
}

impl std::fmt::Debug for MemTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemTable")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl MemTable {
    /// A table with every slot and page-list entry reserved.
    ///
    /// Limits are clamped so indexes fit the key space (`max_mr < MW_INDEX_BASE`).
    pub fn new(limits: MemLimits) -> Self {
        let mut limits = limits;
        limits.max_mr = limits.max_mr.min(MW_INDEX_BASE - 1);
        limits.max_mw = limits.max_mw.min(MAX_INDEX - MW_INDEX_BASE + 1);
        let mrs: Box<[MrSlot]> = (0..limits.max_mr).map(|_| MrSlot::new()).collect();
        let mws: Box<[MwSlot]> = (0..limits.max_mw).map(|_| MwSlot::new()).collect();
        let pages: Box<[AtomicU64]> = (0..limits.page_slots).map(|_| AtomicU64::new(0)).collect();
        // Pop from the end: lowest index first.
        let free_mr: Vec<u32> = (1..=limits.max_mr).rev().collect();
        let free_mw: Vec<u32> = (0..limits.max_mw)
            .rev()
            .map(|i| MW_INDEX_BASE + i)
            .collect();
        let arena = Arena {
            free: if limits.page_slots > 0 {
                vec![(0, limits.page_slots)]
            } else {
                vec![]
            },
        };
        // Deterministic under loom (models must replay identically).
        #[cfg(loom)]
        let seed = 0x1234_5678u64;
        #[cfg(not(loom))]
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        MemTable {
            limits,
            mrs,
            mws,
            pages,
            free_mr: Mutex::new(free_mr),
            free_mw: Mutex::new(free_mw),
            arena: Mutex::new(arena),
            rng: AtomicU64::new(seed),
            epochs: Epochs::new(limits.max_readers),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> MemLimits {
        self.limits
    }

    /// Register an epoch reader (one per lcore; see [`Reader`]). It starts offline.
    pub fn reader(self: &Arc<Self>) -> Result<Reader, MemError> {
        let slot = self.epochs.register().ok_or(MemError::TableFull)?;
        Ok(Reader::new(self.clone(), slot))
    }

    /// The grace-period counter: it grows by one each time an invalidation starts waiting for
    /// the epoch readers (diagnostics, tests; compare [`Reader::announced`]).
    pub fn grace_period(&self) -> u64 {
        self.epochs.current()
    }

    /// Block the slot (`state` is FREE or INVALID), then wait until no reference through the
    /// old state can be alive: counted references dropped, every epoch reader past a quiescent
    /// point or offline. Must not be called by a thread whose [`Reader`] is online (go through
    /// the reader, which goes offline first).
    fn block(&self, word: &AtomicU64, state: MrState, key: Key) {
        block_and_drain(word, state, key);
        self.epochs.synchronize();
    }

    /// A random key byte different from `prev` (rxe `rxe_get_next_key`).
    fn next_key_byte(&self, prev: u8) -> u8 {
        loop {
            let s = self.rng.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
            let mut z = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            let b = (z >> 56) as u8;
            if b != prev {
                return b;
            }
        }
    }

    fn mr_slot(&self, index: u32) -> Option<&MrSlot> {
        if index == 0 || index >= MW_INDEX_BASE {
            return None;
        }
        self.mrs.get(index as usize - 1)
    }

    fn mw_slot(&self, index: u32) -> Option<&MwSlot> {
        index
            .checked_sub(MW_INDEX_BASE)
            .and_then(|i| self.mws.get(i as usize))
    }

    /// Snapshot of the MR or MW named by `key`'s index (`None` if not allocated).
    pub fn query(&self, key: Key) -> Option<MrInfo> {
        if let Some(slot) = self.mr_slot(key.index()) {
            let ctl = lock(&slot.ctl);
            let kind = ctl.kind?;
            let (state, _) = unpack(slot.word.load(Ordering::Acquire));
            let a = ctl.active.unwrap_or_default();
            let next = ctl.staged.or(ctl.active).unwrap_or_default();
            return Some(MrInfo {
                key: ctl.key,
                kind,
                state,
                pd: ctl.pd,
                iova: a.iova,
                length: a.length,
                access: ctl.access,
                page_size: if a.shift == 0 { 0 } else { 1 << a.shift },
                max_num_sg: ctl.max_num_sg,
                mw_bound: slot.mw_bound.load(Ordering::Relaxed),
                staged: ctl.staged.is_some(),
                next_iova: next.iova,
                next_length: next.length,
                qpn: 0,
            });
        }
        let slot = self.mw_slot(key.index())?;
        let ctl = lock(&slot.ctl);
        let t = ctl.mw_type?;
        let (state, _) = unpack(slot.word.load(Ordering::Acquire));
        Some(MrInfo {
            key: ctl.key,
            kind: MrKind::Mw(t),
            state,
            pd: ctl.pd,
            iova: ctl.addr,
            length: ctl.length,
            access: ctl.access,
            page_size: 0,
            max_num_sg: 0,
            mw_bound: 0,
            staged: false,
            next_iova: ctl.addr,
            next_length: ctl.length,
            qpn: ctl.qpn,
        })
    }
}
