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

use std::cell::Cell;
use std::sync::Arc;

use crate::access::{Access, Key, PdHandle};
use crate::epoch::Epochs;
use crate::reader::Reader;
use crate::map::{self, SgMapping};
use crate::region::{Backing, Region};
use crate::sync::{lock, spin_wait, AtomicU32, AtomicU64, Mutex, Ordering};
use crate::MemError;

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
// Slots

const STATE_SHIFT: u32 = 32;
const REF_SHIFT: u32 = 34;
const REF_ONE: u64 = 1 << REF_SHIFT;
const REF_MASK: u64 = !(REF_ONE - 1);

const fn pack(state: MrState, key: Key) -> u64 {
    (state.code() << STATE_SHIFT) | key.0 as u64
}
const fn unpack(w: u64) -> (MrState, Key) {
    (MrState::from_code((w >> STATE_SHIFT) & 3), Key(w as u32))
}

/// Translation meta as the control side knows it.
#[derive(Debug, Clone, Copy, Default)]
struct Meta {
    iova: u64,
    length: u64,
    /// Bytes actually mapped (upper bound for a WR length).
    mapped: u64,
    shift: u32,
}

#[derive(Default)]
struct MrCtl {
    kind: Option<MrKind>,
    pd: PdHandle,
    key: Key,
    access: Access,
    max_num_sg: u32,
    arena_start: u32,
    active_buf: u32,
    active: Option<Meta>,
    staged: Option<Meta>,
    /// `staged` came from map_mr_sg (swap buffers at REG_MR), not only from an iova rewrite.
    staged_is_remap: bool,
    /// Owners of the memory each buffer's pages point into (capacity reserved at alloc).
    owners: [Vec<Arc<dyn Backing>>; 2],
}

#[repr(align(64))]
struct MrSlot {
    word: AtomicU64,
    mw_bound: AtomicU32,
    pd: AtomicU32,
    access: AtomicU32,
    shift: AtomicU32,
    iova: AtomicU64,
    length: AtomicU64,
    /// Contiguous (shift 0): address of `iova`. Paged: arena index of page 0 of the active list.
    base: AtomicU64,
    ctl: Mutex<MrCtl>,
}

impl MrSlot {
    fn new() -> Self {
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
struct MwCtl {
    mw_type: Option<MwType>,
    pd: PdHandle,
    key: Key,
    /// MR index while bound.
    bound_mr: Option<u32>,
    access: Access,
    addr: u64,
    length: u64,
    qpn: u32,
}

#[repr(align(64))]
struct MwSlot {
    word: AtomicU64,
    pd: AtomicU32,
    access: AtomicU32,
    mr_index: AtomicU32,
    qpn: AtomicU32,
    /// 1 = type 2 (QP check), 0 = type 1.
    type2: AtomicU32,
    addr: AtomicU64,
    length: AtomicU64,
    ctl: Mutex<MwCtl>,
}

impl MwSlot {
    fn new() -> Self {
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
fn set_word(word: &AtomicU64, state: MrState, key: Key) {
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
/// Callers go through [`MemTable::block`], which also waits for the epoch readers.
fn block_and_drain(word: &AtomicU64, state: MrState, key: Key) {
    set_word(word, state, key);
    let mut i = 0u32;
    while word.load(Ordering::Acquire) & REF_MASK != 0 {
        spin_wait(i);
        i = i.saturating_add(1);
    }
}

/// First-fit allocator over the page-list arena (control path only).
struct Arena {
    /// Free ranges (start, len), sorted by start, coalesced.
    free: Vec<(u32, u32)>,
}

impl Arena {
    fn alloc(&mut self, n: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, l)| l >= n)?;
        let (s, l) = self.free[i];
        if l == n {
            self.free.remove(i);
        } else {
            self.free[i] = (s + n, l - n);
        }
        Some(s)
    }
    fn release(&mut self, s: u32, n: u32) {
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

    // ---- control path: MRs ---------------------------------------------------------------

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
        match ctl.kind {
            None => return Err(MemError::NoSuchKey),
            Some(MrKind::FastReg) => {}
            Some(_) => return Err(MemError::WrongMrType),
        }
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
        match ctl.kind {
            None => return Err(MemError::NoSuchKey),
            Some(MrKind::FastReg) => {}
            Some(_) => return Err(MemError::WrongMrType),
        }
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
        let owners = std::mem::take(&mut ctl.owners);
        drop(ctl);
        drop(owners); // may unmap: outside the slot lock
        lock(&self.free_mr).push(index);
        Ok(())
    }

    // ---- control path: MWs ---------------------------------------------------------------

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

    fn unbind_locked(&self, ctl: &mut MwCtl) {
        if let Some(mr) = ctl.bound_mr.take() {
            if let Some(s) = self.mr_slot(mr) {
                s.mw_bound.fetch_sub(1, Ordering::SeqCst);
            }
        }
        ctl.length = 0;
        // An unbound window belongs to no QP (the next bind, from any QP of the PD, sets it).
        ctl.qpn = 0;
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

    // ---- executed operations (send-queue order, exactly once each) ------------------------

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
        match ctl.kind {
            None => return Err(MemError::NoSuchKey),
            Some(MrKind::FastReg) => {}
            Some(_) => return Err(MemError::WrongMrType),
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
            match ctl.kind {
                None => return Err(MemError::NoSuchKey),
                Some(MrKind::FastReg) => {}
                Some(_) => return Err(MemError::WrongMrType), // A9
            }
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

    // ---- fast path ------------------------------------------------------------------------

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
    /// [`Reader`] instead (no RMW).
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
    #[inline]
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

fn check_iova_rewrite(meta: &Meta, iova: u64) -> Result<(), MemError> {
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

    /// Visit the process addresses backing `[iova, iova+len)` in order: `f(addr, done, n)`.
    #[inline]
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
            unsafe { core::ptr::copy_nonoverlapping(a as *const u8, d.add(done), n) }
        })
    }

    /// Copy `src` into the memory at `iova`.
    #[inline]
    pub fn copy_in(&self, iova: u64, src: &[u8]) -> Result<(), MemError> {
        let s = src.as_ptr();
        self.walk(iova, src.len() as u64, |a, done, n| {
            // SAFETY: as in `copy_out`, with the roles swapped.
            unsafe { core::ptr::copy_nonoverlapping(s.add(done), a as *mut u8, n) }
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
