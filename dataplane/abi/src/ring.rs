//! A single-producer/single-consumer ring in shared memory.
//!
//! Layout (all offsets from the segment base, which must be 64-byte aligned):
//!
//! ```text
//!   0   RingHeader: magic, entry_size, capacity (power of two), flags
//!  64   producer index  (own cache line; written only by the producer)
//! 128   consumer index  (own cache line; written only by the consumer)
//! 192   slots[capacity] of `entry_size` bytes each
//! ```
//!
//! Indices run freely over `u32` and wrap; a slot is `index & (capacity - 1)`. The ring is empty
//! when `producer == consumer` and full when `producer - consumer == capacity`, so no slot is
//! wasted (the rtrb scheme with wrapping arithmetic). Each side keeps a cached copy of the other
//! side's index and reloads it only when the cache says "maybe full" / "maybe empty".
//!
//! Ordering: the producer writes a slot and then release-stores the producer index; the
//! consumer acquire-loads the producer index before reading slots, and release-stores the
//! consumer index after it has copied a slot out. That is the whole protocol.
//!
//! Trust: the two sides live in different processes and the service must not trust the
//! client. Every slot access is masked, so no index value can reach outside the slot array;
//! an index that is inconsistent (`producer - consumer > capacity`) is reported as
//! [`RingError::Corrupt`] and the caller tears the object down. Entries are `Pod` (every bit
//! pattern valid) and are copied out before use, so a client scribbling over a slot while the
//! service reads it can only produce garbage *values*, which the service validates.
//!
//! Under `cfg(loom)` (model checking only, see `tests/loom.rs`) each slot is a
//! `loom::cell::UnsafeCell<T>` instead of a plain `T`, so loom sees every slot write and read
//! and reports a payload hand-off that the index protocol does not order. The slot stride then
//! differs from the ABI; the normal build is unaffected (`Slot<T>` is `T`).
use crate::sync::{AtomicU32, Ordering};
use core::marker::PhantomData;
use core::ptr::NonNull;

/// Magic at the start of every ring header ("PMRR").
pub const RING_MAGIC: u32 = 0x504d_5252;
/// Bytes before the first slot.
pub const RING_HEADER_LEN: usize = 192;

/// Marker for plain-old-data entries: `repr(C)`, no padding-dependent invariants, every bit
/// pattern a valid value.
///
/// # Safety
/// Implementors must be `repr(C)` structs of integers/arrays of integers (no bool, enum,
/// reference or pointer fields), so that any bytes written by another process form a valid
/// value.
pub unsafe trait Pod: Copy + 'static {}

/// A ring entry whose tail is only partly used (a send WQE's SGE/inline area): the consumer
/// copies the head, asks it how many tail bytes are live, and copies only those
/// ([`Consumer::peek_into`]). A one-SGE send WQE is then two or three cache lines pulled from
/// the producer's core (352-byte slots: every other one starts mid-line) instead of six.
///
/// # Safety
/// `HEAD` is a multiple of 8 and at most `size_of::<Self>()`, `size_of::<Self>()` is a multiple
/// of 8 and `align_of::<Self>() >= 8`.
pub unsafe trait Prefixed: Pod {
    /// Bytes always copied.
    const HEAD: usize;
    /// Bytes after `HEAD` that matter, judged from the copied head alone (the ring clamps it to
    /// the entry).
    fn live_tail(&self) -> usize;
}

#[repr(C, align(64))]
struct CacheLine(AtomicU32);

/// What one slot of the array holds: the entry itself (the ABI).
#[cfg(not(loom))]
type Slot<T> = T;
/// Under loom: the entry in a tracked cell, so loom checks the slot hand-off.
#[cfg(loom)]
type Slot<T> = loom::cell::UnsafeCell<T>;

/// The ring header as it lies in shared memory.
#[repr(C)]
pub struct RingHeader {
    magic: u32,
    entry_size: u32,
    capacity: u32,
    flags: u32,
    _reserved: [u32; 12],
    producer: CacheLine,
    consumer: CacheLine,
}

const _: () = assert!(core::mem::size_of::<RingHeader>() == RING_HEADER_LEN);

/// Where the producer index (a `u32`) lies in the ring header: what a client that corrupts its
/// own ring overwrites (the service's hostile-client tests write it directly).
pub const PRODUCER_INDEX_OFFSET: usize = core::mem::offset_of!(RingHeader, producer);

/// Why a ring could not be attached or used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    /// The segment is too small for the header and slots it declares.
    TooSmall,
    /// Misaligned base pointer.
    Misaligned,
    /// Header magic, entry size or capacity do not match what the caller expects.
    BadHeader,
    /// The peer left the indices in an impossible state (`producer - consumer > capacity`).
    Corrupt,
}

impl core::fmt::Display for RingError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            RingError::TooSmall => "ring segment too small",
            RingError::Misaligned => "ring segment misaligned",
            RingError::BadHeader => "ring header does not match",
            RingError::Corrupt => "ring indices corrupt",
        })
    }
}
impl std::error::Error for RingError {}

/// Bytes a ring of `capacity` entries of `T` occupies (header + slots), rounded to 64.
pub const fn ring_bytes<T>(capacity: u32) -> usize {
    let n = RING_HEADER_LEN + capacity as usize * core::mem::size_of::<Slot<T>>();
    (n + 63) & !63
}

/// Initialise a ring header in place (done once by the side that creates the segment).
///
/// # Safety
/// `base` must point to at least `ring_bytes::<T>(capacity)` writable bytes, 64-byte aligned,
/// that nobody else uses concurrently during initialisation.
pub unsafe fn init_ring<T: Pod>(base: *mut u8, capacity: u32) -> Result<(), RingError> {
    if !capacity.is_power_of_two() {
        return Err(RingError::BadHeader);
    }
    if !(base as usize).is_multiple_of(64) {
        return Err(RingError::Misaligned);
    }
    let hdr = base.cast::<RingHeader>();
    // SAFETY: the caller guarantees `base` is valid, aligned and exclusively ours; we write a
    // fresh header value (atomics are plain u32 in memory).
    unsafe {
        hdr.write(RingHeader {
            magic: RING_MAGIC,
            entry_size: core::mem::size_of::<T>() as u32,
            capacity,
            flags: 0,
            _reserved: [0; 12],
            producer: CacheLine(AtomicU32::new(0)),
            consumer: CacheLine(AtomicU32::new(0)),
        })
    };
    #[cfg(loom)]
    for i in 0..capacity as usize {
        // SAFETY: the slot array lies inside the `ring_bytes` the caller guarantees; a zeroed
        // `T` is valid because `T: Pod`.
        unsafe {
            base.add(RING_HEADER_LEN)
                .cast::<Slot<T>>()
                .add(i)
                .write(loom::cell::UnsafeCell::new(core::mem::zeroed::<T>()))
        };
    }
    Ok(())
}

struct Raw<T> {
    hdr: NonNull<RingHeader>,
    slots: NonNull<Slot<T>>,
    mask: u32,
}

impl<T: Pod> Raw<T> {
    /// # Safety
    /// `base..base+len` must stay mapped and readable/writable for the lifetime of the ring
    /// handle, and hold a ring initialised by [`init_ring`] (possibly by another process).
    unsafe fn attach(base: *mut u8, len: usize, capacity: u32) -> Result<Self, RingError> {
        if base.is_null() || !(base as usize).is_multiple_of(64) {
            return Err(RingError::Misaligned);
        }
        if len < RING_HEADER_LEN {
            return Err(RingError::TooSmall);
        }
        let hdr = base.cast::<RingHeader>();
        // SAFETY: `base` is valid for `len >= RING_HEADER_LEN` bytes (caller); these fields are
        // written only at init time, a volatile read tolerates a hostile writer.
        let (magic, esz, cap) = unsafe {
            (
                core::ptr::addr_of!((*hdr).magic).read_volatile(),
                core::ptr::addr_of!((*hdr).entry_size).read_volatile(),
                core::ptr::addr_of!((*hdr).capacity).read_volatile(),
            )
        };
        if magic != RING_MAGIC || esz as usize != core::mem::size_of::<T>() || cap != capacity || !cap.is_power_of_two() {
            return Err(RingError::BadHeader);
        }
        if len < ring_bytes::<T>(capacity) {
            return Err(RingError::TooSmall);
        }
        // SAFETY: checked above that the slot array fits inside the segment.
        let slots = unsafe { base.add(RING_HEADER_LEN) }.cast::<Slot<T>>();
        Ok(Raw {
            // SAFETY: non-null checked above.
            hdr: unsafe { NonNull::new_unchecked(hdr) },
            // SAFETY: derived from a non-null base by an in-bounds offset.
            slots: unsafe { NonNull::new_unchecked(slots) },
            mask: capacity - 1,
        })
    }
    fn hdr(&self) -> &RingHeader {
        // SAFETY: attach() validated the header; the mapping outlives the handle (attach contract).
        unsafe { self.hdr.as_ref() }
    }
    fn slot(&self, idx: u32) -> *mut Slot<T> {
        // SAFETY: `idx & mask < capacity`, inside the slot array validated by attach().
        unsafe { self.slots.as_ptr().add((idx & self.mask) as usize) }
    }
    /// Write `item` into slot `idx`.
    ///
    /// # Safety
    /// The caller is the producer and the slot is outside `[tail, head)` (no consumer reads it).
    #[inline]
    unsafe fn write_slot(&self, idx: u32, item: T) {
        // SAFETY: forwarded contract; volatile because another process maps the page.
        #[cfg(not(loom))]
        unsafe {
            self.slot(idx).write_volatile(item)
        };
        // SAFETY: as above; the cell was created by init_ring() and lives in the segment.
        #[cfg(loom)]
        unsafe {
            (*self.slot(idx)).with_mut(|p| p.write_volatile(item))
        };
    }
    /// Write only the head and the live tail of `item` into slot `idx` ([`Prefixed`]): the
    /// bytes past the live tail keep whatever the slot held (a consumer reads them with
    /// [`Raw::read_slot_prefix`], which stops at the live tail too).
    ///
    /// # Safety
    /// As [`Raw::write_slot`].
    #[cfg(not(loom))]
    #[inline]
    unsafe fn write_slot_prefix(&self, idx: u32, item: &T)
    where
        T: Prefixed,
    {
        const { assert!(T::HEAD.is_multiple_of(8) && T::HEAD <= core::mem::size_of::<T>()) };
        const { assert!(core::mem::size_of::<T>().is_multiple_of(8) && core::mem::align_of::<T>() >= 8) };
        let live = item.live_tail().min(core::mem::size_of::<T>() - T::HEAD);
        let end = (T::HEAD + live).div_ceil(8);
        let src = (item as *const T).cast::<u64>();
        let dst = self.slot(idx).cast::<u64>();
        // SAFETY: `dst` is the slot (in bounds, 8-aligned by the trait contract and the ring
        // layout), `src` is `item`; both span size_of::<T>() bytes and `end` <= size_of::<T>()
        // / 8. Volatile because another process maps the page.
        unsafe {
            for w in 0..end {
                dst.add(w).write_volatile(src.add(w).read());
            }
        }
    }

    /// Ask the CPU to start pulling the head of slot `idx` (`T::HEAD` bytes) into this core's
    /// cache. The producer wrote it from another core, so the first read of each slot is a
    /// cross-core miss; prefetching the next few slots lets those misses overlap instead of
    /// paying one after another. A hint only: it reads nothing the program sees.
    #[cfg(not(loom))]
    #[inline]
    fn prefetch_head(&self, idx: u32)
    where
        T: Prefixed,
    {
        #[cfg(target_arch = "x86_64")]
        {
            let p = self.slot(idx).cast::<u8>().cast_const();
            let mut off = 0;
            while off < T::HEAD {
                // SAFETY: a prefetch is a hint that never faults or changes memory; the address
                // is inside slot `idx` of the mapped slot array anyway (`off < T::HEAD <=
                // size_of::<T>()`).
                unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.add(off).cast()) };
                off += 64;
            }
            // The head's last line (the slot need not start on a line).
            // SAFETY: as above, `T::HEAD - 1 < size_of::<T>()`.
            unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.add(T::HEAD - 1).cast()) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = idx;
    }

    /// Copy slot `idx` out.
    ///
    /// # Safety
    /// The caller is the consumer and the slot is inside `[tail, head)` (published).
    #[inline]
    unsafe fn read_slot(&self, idx: u32) -> T {
        // SAFETY: forwarded contract; Pod makes any bytes a valid T.
        #[cfg(not(loom))]
        unsafe {
            self.slot(idx).read_volatile()
        }
        // SAFETY: as above; the cell was created by init_ring() and lives in the segment.
        #[cfg(loom)]
        unsafe {
            (*self.slot(idx)).with(|p| p.read_volatile())
        }
    }

    /// Copy the head of slot `idx`, then the live part of its tail, into `out`, word by word
    /// (volatile: another process maps the page; each word is read exactly once).
    ///
    /// # Safety
    /// As [`Raw::read_slot`].
    #[cfg(not(loom))]
    #[inline]
    unsafe fn read_slot_prefix(&self, idx: u32, out: &mut T)
    where
        T: Prefixed,
    {
        const { assert!(T::HEAD.is_multiple_of(8) && T::HEAD <= core::mem::size_of::<T>()) };
        const { assert!(core::mem::size_of::<T>().is_multiple_of(8) && core::mem::align_of::<T>() >= 8) };
        let src = self.slot(idx).cast::<u64>().cast_const();
        let dst = (out as *mut T).cast::<u64>();
        let head = T::HEAD / 8;
        // SAFETY: `src` is the slot (in bounds, 8-aligned by the trait contract and the ring
        // layout), `dst` is `out`; both span size_of::<T>() bytes and every index is below
        // size_of::<T>() / 8.
        unsafe {
            for w in 0..head {
                dst.add(w).write(src.add(w).read_volatile());
            }
        }
        let live = out.live_tail().min(core::mem::size_of::<T>() - T::HEAD);
        let end = (T::HEAD + live).div_ceil(8);
        // SAFETY: as above, `end <= size_of::<T>() / 8`.
        unsafe {
            for w in head..end {
                dst.add(w).write(src.add(w).read_volatile());
            }
        }
    }
}

/// The producing side of a shared ring.
pub struct Producer<T: Pod> {
    raw: Raw<T>,
    head: u32,
    /// The producer index as last published (the consumer reads `[tail, published)`).
    published: u32,
    cached_tail: u32,
    _t: PhantomData<T>,
}

// SAFETY: a Producer is the only writer of its side; moving it to another thread moves that
// role with it. The shared header is accessed only through atomics and masked slots.
unsafe impl<T: Pod> Send for Producer<T> {}

impl<T: Pod> Producer<T> {
    /// Attach the producer side of the ring at `base`.
    ///
    /// # Safety
    /// See [`Consumer::attach`]; additionally, at most one `Producer` may exist for a ring.
    pub unsafe fn attach(base: *mut u8, len: usize, capacity: u32) -> Result<Self, RingError> {
        // SAFETY: forwarded contract.
        let raw = unsafe { Raw::attach(base, len, capacity)? };
        let head = raw.hdr().producer.0.load(Ordering::Relaxed);
        let tail = raw.hdr().consumer.0.load(Ordering::Acquire);
        Ok(Producer { raw, head, published: head, cached_tail: tail, _t: PhantomData })
    }

    /// Capacity of the ring.
    pub fn capacity(&self) -> u32 {
        self.raw.mask + 1
    }

    /// Free slots, refreshing the consumer index. `Err(Corrupt)` if the consumer index is
    /// impossible (a hostile or broken peer).
    pub fn free(&mut self) -> Result<u32, RingError> {
        self.cached_tail = self.raw.hdr().consumer.0.load(Ordering::Acquire);
        let used = self.head.wrapping_sub(self.cached_tail);
        if used > self.capacity() {
            return Err(RingError::Corrupt);
        }
        Ok(self.capacity() - used)
    }

    /// Is there a free slot at `head`? Refreshes the consumer index only when the cached one
    /// says full; a consumer index that claims more than the capacity is `Corrupt`.
    fn room(&mut self) -> Result<(), PushError<()>> {
        let cap = self.capacity();
        let mut used = self.head.wrapping_sub(self.cached_tail);
        if used >= cap {
            // Possibly full: refresh the consumer index and check again.
            self.cached_tail = self.raw.hdr().consumer.0.load(Ordering::Acquire);
            used = self.head.wrapping_sub(self.cached_tail);
            if used > cap {
                return Err(PushError::Corrupt(()));
            }
            if used == cap {
                return Err(PushError::Full(()));
            }
        }
        Ok(())
    }

    /// Write `item` into the next slot without publishing it. Returns the item back when full.
    /// Call [`Producer::publish`] to make staged items visible (one release store per batch).
    pub fn stage(&mut self, item: T) -> Result<(), PushError<T>> {
        if let Err(e) = self.room() {
            return Err(e.map(|()| item));
        }
        // SAFETY: the slot is outside [tail, head) so the consumer does not read it until the
        // release store in publish(); volatile because another process maps the page.
        unsafe { self.raw.write_slot(self.head, item) };
        self.head = self.head.wrapping_add(1);
        Ok(())
    }

    /// [`Producer::stage`] writing only the head and the live tail of `item` ([`Prefixed`]):
    /// a one-SGE send WQE is 112 of its 352 bytes, two cache lines of the shared slot instead
    /// of six. The consumer reads it with [`Consumer::peek_into`].
    pub fn stage_prefixed(&mut self, item: &T) -> Result<(), PushError<()>>
    where
        T: Prefixed,
    {
        self.room()?;
        // SAFETY: as in stage(): the slot is outside [tail, head) until publish().
        #[cfg(not(loom))]
        unsafe {
            self.raw.write_slot_prefix(self.head, item)
        };
        // SAFETY: as above (the model checks the whole-entry write).
        #[cfg(loom)]
        unsafe {
            self.raw.write_slot(self.head, *item)
        };
        self.head = self.head.wrapping_add(1);
        Ok(())
    }

    /// Build the next entry in place: `fill` gets the free slot at `head` and writes the entry
    /// there (a send WQE is 352 bytes: built on the stack and copied, it cost a second pass
    /// over every byte it wrote). `Ok` stages the entry (publish it with
    /// [`Producer::publish`]); an error from `fill` leaves the ring as it was (the slot is
    /// outside `[tail, head)`, so nobody reads what `fill` wrote there). A full ring or
    /// impossible consumer index is `E::from(PushError)`, and `fill` is not called.
    ///
    /// The slot holds whatever an earlier entry left (any bytes: `T` is [`Pod`]). `fill` must
    /// write every field the consumer reads: all of a plain entry, or the head and live tail
    /// of a [`Prefixed`] one (the consumer's [`Consumer::peek_into`] reads no further).
    ///
    /// The `&mut T` covers shared memory the consumer (another process) maps: the index
    /// protocol gives it to the producer alone until the release store in `publish`, so a
    /// consumer that keeps to the protocol neither reads nor writes it meanwhile. Use it on
    /// rings whose consumer is trusted to keep to it (the shim's send and receive queues,
    /// consumed by the service); a producer facing an untrusted consumer (the service's
    /// completion rings) writes with [`Producer::stage_words`] instead.
    #[inline]
    pub fn stage_with<E>(&mut self, fill: impl FnOnce(&mut T) -> Result<(), E>) -> Result<(), E>
    where
        E: From<PushError<()>>,
    {
        self.room()?;
        // SAFETY: the slot is outside [tail, head) until publish() (as in stage()), so the
        // consumer neither reads nor writes it: this `&mut` is the only access for as long as
        // `fill` runs. It is in bounds (masked) and aligned for `T` (the ring lays slots out as
        // an array of `T` after a 64-byte-aligned header); its bytes are a valid `T` (Pod).
        #[cfg(not(loom))]
        let r = fill(unsafe { &mut *self.raw.slot(self.head) });
        // SAFETY: as above; the cell was created by init_ring() and lives in the segment (the
        // model checks the slot write against the consumer's reads).
        #[cfg(loom)]
        let r = unsafe { (*self.raw.slot(self.head)).with_mut(|p| fill(&mut *p)) };
        r?;
        self.head = self.head.wrapping_add(1);
        Ok(())
    }

    /// Items ever staged (wrapping): the client's count of posted WQEs.
    pub fn head(&self) -> u32 {
        self.head
    }

    /// [`Producer::stage`] of an item given as its 64-bit words (`T` is exactly `N` words, as
    /// [`crate::ShmCqe::to_words`] gives them): each word is one store into the slot straight
    /// from a register. (`stage` of a 64-byte completion built it on the stack and copied it
    /// into the slot field by field: twice the instructions.)
    #[inline]
    pub fn stage_words<const N: usize>(&mut self, words: [u64; N]) -> Result<(), PushError<()>> {
        const { assert!(core::mem::size_of::<T>() == 8 * N && core::mem::align_of::<T>() >= 8) };
        self.room()?;
        #[cfg(not(loom))]
        {
            let dst = self.raw.slot(self.head).cast::<u64>();
            // SAFETY: the slot is outside [tail, head) until publish() (as in stage()); it is
            // size_of::<T>() = 8 * N bytes, 8-aligned (asserted above; the ring aligns slots to
            // T). Volatile because another process maps the page.
            unsafe {
                for (i, w) in words.iter().enumerate() {
                    dst.add(i).write_volatile(*w);
                }
            }
        }
        // The model checks the whole-entry write of the same bytes.
        #[cfg(loom)]
        {
            // SAFETY: `words` spans size_of::<T>() bytes and T is Pod (any bytes are a value).
            let item = unsafe { words.as_ptr().cast::<T>().read_unaligned() };
            // SAFETY: as in stage().
            unsafe { self.raw.write_slot(self.head, item) };
        }
        self.head = self.head.wrapping_add(1);
        Ok(())
    }

    /// Publish every staged item.
    pub fn publish(&mut self) {
        self.raw.hdr().producer.0.store(self.head, Ordering::Release);
        self.published = self.head;
    }

    /// Items staged since the last [`Producer::publish`].
    pub fn staged(&self) -> u32 {
        self.head.wrapping_sub(self.published)
    }

    /// Drop every item staged since the last [`Producer::publish`]: the consumer never saw
    /// them, and their slots are free again.
    pub fn unstage(&mut self) {
        self.head = self.published;
    }

    /// Let `f` read or change staged item `i` (0 = the oldest not yet published); `None` if
    /// fewer than `i + 1` are staged. A batch built entry by entry (`ibv_wr_*`) completes its
    /// newest entry this way, in its slot.
    ///
    /// Like [`Producer::stage_with`], the `&mut T` covers shared memory: use it only on rings
    /// whose consumer is trusted to keep to the index protocol (the shim's send and receive
    /// queues), never on the service's completion rings.
    pub fn with_staged<R>(&mut self, i: u32, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        if i >= self.staged() {
            return None;
        }
        let idx = self.published.wrapping_add(i);
        // SAFETY: `idx` is in `[published, head)`, outside what the consumer may read
        // (`[tail, published)`) until the next release store in publish(): as in stage_with(),
        // this `&mut` is the only access while `f` runs; masked, aligned, and any bytes are a
        // valid `T` (Pod).
        #[cfg(not(loom))]
        let r = f(unsafe { &mut *self.raw.slot(idx) });
        // SAFETY: as above (the model checks the access against the consumer's reads).
        #[cfg(loom)]
        let r = unsafe { (*self.raw.slot(idx)).with_mut(|p| f(&mut *p)) };
        Some(r)
    }

    /// Stage and publish one item.
    pub fn push(&mut self, item: T) -> Result<(), PushError<T>> {
        self.stage(item)?;
        self.publish();
        Ok(())
    }
}

/// Push failure; the item is handed back so nothing is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError<T> {
    /// No free slot.
    Full(T),
    /// The consumer left an impossible index.
    Corrupt(T),
}

impl<T> PushError<T> {
    /// The same error carrying `f` of its item.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> PushError<U> {
        match self {
            PushError::Full(t) => PushError::Full(f(t)),
            PushError::Corrupt(t) => PushError::Corrupt(f(t)),
        }
    }
}

/// How many slots ahead of the one being read [`Consumer::peek_into`] prefetches (not under
/// loom, which models no prefetch).
#[cfg(not(loom))]
const PREFETCH_AHEAD: u32 = 4;

/// The consuming side of a shared ring.
pub struct Consumer<T: Pod> {
    raw: Raw<T>,
    tail: u32,
    cached_head: u32,
    _t: PhantomData<T>,
}

// SAFETY: a Consumer is the only reader of its side; see Producer.
unsafe impl<T: Pod> Send for Consumer<T> {}

impl<T: Pod> Consumer<T> {
    /// Attach the consumer side of the ring at `base`.
    ///
    /// # Safety
    /// `base` must be 64-byte aligned and `base..base+len` must stay mapped read/write for the
    /// life of the handle. The contents may be written concurrently by another process: that
    /// cannot cause undefined behaviour here (masked slots, Pod entries, volatile access), only
    /// garbage values or [`RingError::Corrupt`]. At most one `Consumer` may exist for a ring.
    pub unsafe fn attach(base: *mut u8, len: usize, capacity: u32) -> Result<Self, RingError> {
        // SAFETY: forwarded contract.
        let raw = unsafe { Raw::attach(base, len, capacity)? };
        let tail = raw.hdr().consumer.0.load(Ordering::Relaxed);
        Ok(Consumer { raw, tail, cached_head: tail, _t: PhantomData })
    }

    /// Capacity of the ring.
    pub fn capacity(&self) -> u32 {
        self.raw.mask + 1
    }

    /// Entries ready to be consumed (refreshes the producer index).
    pub fn available(&mut self) -> Result<u32, RingError> {
        self.cached_head = self.raw.hdr().producer.0.load(Ordering::Acquire);
        let n = self.cached_head.wrapping_sub(self.tail);
        if n > self.capacity() {
            return Err(RingError::Corrupt);
        }
        Ok(n)
    }

    /// Copy the next entry out without releasing its slot; `Ok(None)` when empty.
    pub fn peek(&mut self) -> Result<Option<T>, RingError> {
        if self.tail == self.cached_head && self.available()? == 0 {
            return Ok(None);
        }
        // SAFETY: the slot is inside [tail, head): published by the producer (acquire above);
        // Pod makes any bytes a valid T; volatile because another process maps the page.
        Ok(Some(unsafe { self.raw.read_slot(self.tail) }))
    }

    /// [`Consumer::peek`] into `out`, copying only the head and the live tail of the entry
    /// ([`Prefixed`]); bytes of `out` past the live tail keep older values. `Ok(false)` when
    /// empty. Inlined: it runs once per WQE on the lcore.
    #[inline]
    pub fn peek_into(&mut self, out: &mut T) -> Result<bool, RingError>
    where
        T: Prefixed,
    {
        if self.tail == self.cached_head {
            let n = self.available()?;
            if n == 0 {
                return Ok(false);
            }
            // New entries: start the misses on the ones after this (the loop below keeps
            // PREFETCH_AHEAD in flight).
            #[cfg(not(loom))]
            for k in 1..n.min(PREFETCH_AHEAD) {
                self.raw.prefetch_head(self.tail.wrapping_add(k));
            }
        }
        #[cfg(not(loom))]
        if self.cached_head.wrapping_sub(self.tail) > PREFETCH_AHEAD {
            self.raw.prefetch_head(self.tail.wrapping_add(PREFETCH_AHEAD));
        }
        // SAFETY: the slot is inside [tail, head): published by the producer (acquire above);
        // Pod makes any bytes a valid T.
        #[cfg(not(loom))]
        unsafe {
            self.raw.read_slot_prefix(self.tail, out)
        };
        // SAFETY: as above (the model checks the whole-entry read).
        #[cfg(loom)]
        {
            *out = unsafe { self.raw.read_slot(self.tail) };
        }
        Ok(true)
    }

    /// Advance past the entry returned by the last `peek`, without publishing.
    pub fn advance(&mut self) {
        debug_assert!(self.tail != self.cached_head);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Publish the consumer index (frees the slots consumed so far).
    pub fn release(&mut self) {
        self.release_inner();
    }

    /// Items ever consumed (wrapping).
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Remove the published, unconsumed entries for which `keep` is false, keeping the order
    /// of the others (a CQ purge when a QP is reset, as mlx5 cleans its CQs). The kept entries
    /// are compacted toward the producer's end and the consumer index moves past the removed
    /// ones: the producer never writes inside `[tail, head)`, so only this side touches them.
    /// Returns how many were removed; `Err(Corrupt)` if the producer index is impossible.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) -> Result<u32, RingError> {
        let n = self.available()?;
        let head = self.tail.wrapping_add(n);
        let mut w = head;
        let mut r = head;
        while r != self.tail {
            r = r.wrapping_sub(1);
            // SAFETY: r is inside [tail, head): published by the producer and not released.
            let item = unsafe { self.raw.read_slot(r) };
            if keep(&item) {
                w = w.wrapping_sub(1);
                if w != r {
                    // SAFETY: w is inside [r, head), also ours until the release below.
                    unsafe { self.raw.write_slot(w, item) };
                }
            }
        }
        let removed = w.wrapping_sub(self.tail);
        self.tail = w;
        self.release_inner();
        Ok(removed)
    }

    /// Consume everything published so far without reading it (a queue reset); returns the
    /// new tail. `Err(Corrupt)` if the producer index is impossible.
    pub fn discard_all(&mut self) -> Result<u32, RingError> {
        self.available()?;
        self.tail = self.cached_head;
        self.release_inner();
        Ok(self.tail)
    }

    fn release_inner(&mut self) {
        self.raw.hdr().consumer.0.store(self.tail, Ordering::Release);
    }

    /// Pop one entry and release its slot.
    pub fn pop(&mut self) -> Result<Option<T>, RingError> {
        let item = self.peek()?;
        if item.is_some() {
            self.advance();
            self.release();
        }
        Ok(item)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct E {
        a: u64,
        b: u64,
    }
    // SAFETY: repr(C) of integers.
    unsafe impl Pod for E {}

    #[repr(C, align(64))]
    struct Seg([u8; 4096]);

    fn seg() -> Box<Seg> {
        Box::new(Seg([0; 4096]))
    }

    #[test]
    fn push_pop_wraps_and_reports_full() {
        let mut s = seg();
        let base = s.0.as_mut_ptr();
        // SAFETY: `s` outlives the handles, is aligned and large enough.
        let (mut p, mut c) = unsafe {
            init_ring::<E>(base, 8).unwrap();
            (Producer::<E>::attach(base, 4096, 8).unwrap(), Consumer::<E>::attach(base, 4096, 8).unwrap())
        };
        for round in 0..10u64 {
            for i in 0..8 {
                p.push(E { a: round, b: i }).unwrap();
            }
            assert_eq!(p.push(E { a: 99, b: 99 }), Err(PushError::Full(E { a: 99, b: 99 })));
            for i in 0..8 {
                assert_eq!(c.pop().unwrap(), Some(E { a: round, b: i }));
            }
            assert_eq!(c.pop().unwrap(), None);
        }
    }

    /// A batch staged entry by entry: the consumer sees nothing until publish; staged entries
    /// can be read back and changed in their slots; unstage gives their slots back, and the
    /// next batch reuses them (as `ibv_wr_start` .. `ibv_wr_abort`/`ibv_wr_complete` do).
    #[test]
    fn staged_entries_are_changed_in_place_published_or_dropped() {
        let mut s = seg();
        let base = s.0.as_mut_ptr();
        // SAFETY: `s` outlives the handles, is aligned and large enough.
        let (mut p, mut c) = unsafe {
            init_ring::<E>(base, 4).unwrap();
            (Producer::<E>::attach(base, 4096, 4).unwrap(), Consumer::<E>::attach(base, 4096, 4).unwrap())
        };
        for round in 0..6u64 {
            assert_eq!((p.staged(), p.with_staged(0, |e| e.a)), (0, None));
            p.stage(E { a: round, b: 1 }).unwrap();
            p.stage(E { a: round, b: 2 }).unwrap();
            assert_eq!(p.staged(), 2);
            assert_eq!(p.with_staged(1, |e| std::mem::replace(&mut e.b, 20)), Some(2));
            assert_eq!(p.with_staged(2, |_| ()), None);
            assert_eq!(c.pop().unwrap(), None, "staged entries are not visible");
            if round % 2 == 0 {
                p.unstage();
                assert_eq!(p.staged(), 0);
                // The two slots are free again: four fit.
                for i in 0..4 {
                    p.stage(E { a: round, b: 100 + i }).unwrap();
                }
                assert_eq!(p.stage(E { a: 9, b: 9 }), Err(PushError::Full(E { a: 9, b: 9 })));
                p.unstage();
                assert_eq!(c.pop().unwrap(), None, "dropped entries are never seen");
            } else {
                p.publish();
                assert_eq!(p.staged(), 0);
                assert_eq!(c.pop().unwrap(), Some(E { a: round, b: 1 }));
                assert_eq!(c.pop().unwrap(), Some(E { a: round, b: 20 }));
                assert_eq!(c.pop().unwrap(), None);
            }
        }
    }

    #[repr(C, align(64))]
    struct Big([u8; 8192]);

    /// A ring of `n` WQE-sized entries over `seg`, both ends attached.
    ///
    /// # Safety
    /// `seg` must outlive the returned handles (they hold raw pointers into it).
    unsafe fn wqe_ring<T: Pod>(seg: &mut Big, n: u32) -> (Producer<T>, Consumer<T>) {
        let base = seg.0.as_mut_ptr();
        let len = seg.0.len();
        // SAFETY: `seg` is 64-aligned and, for the sizes the tests use, large enough for `n`
        // entries; the caller keeps it alive.
        unsafe {
            init_ring::<T>(base, n).unwrap();
            (Producer::<T>::attach(base, len, n).unwrap(), Consumer::<T>::attach(base, len, n).unwrap())
        }
    }

    /// `stage_words` writes the item the words encode, slot by slot, wraps, and refuses when
    /// full (the consumer reads whole completions, as the shim's poll does).
    #[test]
    fn stage_words_writes_whole_completions() {
        use crate::layout::ShmCqe;
        let mut s = Box::new(Big([0; 8192]));
        // SAFETY: `s` outlives the handles.
        let (mut p, mut c) = unsafe { wqe_ring::<ShmCqe>(&mut s, 4) };
        let cqe = |i: u32| ShmCqe { wr_id: u64::from(i) << 40 | 7, status: i, opcode: 128, byte_len: 8 * i, qp_num: 17, pkey_index: 3, sl: 1, ..Default::default() };
        for round in 0..3u32 {
            for i in 0..4 {
                p.stage_words(cqe(round * 4 + i).to_words()).unwrap();
            }
            assert!(matches!(p.stage_words(cqe(99).to_words()), Err(PushError::Full(()))));
            p.publish();
            for i in 0..4 {
                assert_eq!(c.pop().unwrap(), Some(cqe(round * 4 + i)));
            }
            assert_eq!(c.pop().unwrap(), None);
        }
    }

    /// `peek_into` copies the head and exactly the live tail: what a WQE says it uses arrives
    /// intact, bytes past it are not read from the slot (the scratch keeps its old values).
    #[test]
    fn peek_into_copies_head_and_live_tail_only() {
        use crate::layout::{send_flags, ShmSendWqe, ShmSge};
        let mut s = Box::new(Big([0; 8192]));
        // SAFETY: `s` outlives the handles.
        let (mut p, mut c) = unsafe { wqe_ring::<ShmSendWqe>(&mut s, 16) };
        let mut w = ShmSendWqe { wr_id: 7, opcode: 4, num_sge: 2, remote_addr: 0x1234, rkey: 9, ..Default::default() };
        w.set_sge(0, ShmSge { addr: 1, length: 2, lkey: 3 });
        w.set_sge(1, ShmSge { addr: 4, length: 5, lkey: 6 });
        w.data[32..].fill(0xEE); // written by the producer, dead by num_sge
        p.push(w).unwrap();
        let mut i = ShmSendWqe { wr_id: 8, send_flags: send_flags::INLINE, inline_len: 13, ..Default::default() };
        i.data[..13].copy_from_slice(b"hello, inline");
        i.data[13..].fill(0xEE);
        p.push(i).unwrap();
        let mut out = ShmSendWqe::default();
        out.data.fill(0x55);
        assert!(c.peek_into(&mut out).unwrap());
        assert_eq!((out.wr_id, out.opcode, out.num_sge, out.remote_addr, out.rkey), (7, 4, 2, 0x1234, 9));
        assert_eq!((out.sge(0).addr, out.sge(1).lkey), (1, 6));
        assert!(out.data[32..].iter().all(|&b| b == 0x55), "the dead tail was not copied");
        c.advance();
        out.data.fill(0x55);
        assert!(c.peek_into(&mut out).unwrap());
        assert_eq!(&out.data[..13], b"hello, inline");
        // Copied in whole words: the rest of the 16-byte word, then untouched scratch.
        assert!(out.data[16..].iter().all(|&b| b == 0x55));
        c.advance();
        assert!(!c.peek_into(&mut out).unwrap());
    }

    /// `stage_prefixed` writes the head and the live tail only: a WQE staged into a slot that
    /// held a longer one arrives intact through `peek_into`, the slot's bytes past the new live
    /// tail are the old WQE's (not written), and a full ring is refused as with `stage`.
    #[test]
    fn stage_prefixed_writes_head_and_live_tail_only() {
        use crate::layout::{ShmSendWqe, ShmSge};
        let mut s = Box::new(Big([0; 8192]));
        // SAFETY: `s` outlives the handles.
        let (mut p, mut c) = unsafe { wqe_ring::<ShmSendWqe>(&mut s, 4) };
        let mut long = ShmSendWqe { wr_id: 1, num_sge: 8, ..Default::default() };
        long.data.fill(0xAA);
        for _ in 0..4 {
            p.push(long).unwrap();
        }
        p.publish();
        let mut out = ShmSendWqe::default();
        for _ in 0..4 {
            assert!(c.peek_into(&mut out).unwrap());
            c.advance();
        }
        c.release();
        // The same slots again, now with one-SGE WQEs staged by prefix.
        for k in 0..4u64 {
            let mut w = ShmSendWqe { wr_id: 10 + k, opcode: 4, num_sge: 1, remote_addr: 0x1000 * k, rkey: 7, ..Default::default() };
            w.set_sge(0, ShmSge { addr: k, length: 8, lkey: 3 });
            p.stage_prefixed(&w).unwrap();
        }
        let w = ShmSendWqe::default();
        assert_eq!(p.stage_prefixed(&w), Err(PushError::Full(())));
        p.publish();
        // The slot's bytes past the 16-byte SGE are the old WQE's: not written.
        // SAFETY: slot 0 lies inside `s` (alive), published and not being written.
        let slot = unsafe { core::slice::from_raw_parts(p.raw.slot(0).cast::<u8>(), core::mem::size_of::<ShmSendWqe>()) };
        let tail = ShmSendWqe::HEAD + 16;
        assert!(slot[tail..].iter().all(|&b| b == 0xAA), "only head + live tail written");
        for k in 0..4u64 {
            out.data.fill(0);
            assert!(c.peek_into(&mut out).unwrap());
            assert_eq!((out.wr_id, out.opcode, out.num_sge, out.remote_addr, out.rkey), (10 + k, 4, 1, 0x1000 * k, 7));
            assert_eq!((out.sge(0).addr, out.sge(0).length, out.sge(0).lkey), (k, 8, 3));
            c.advance();
        }
    }

    /// `stage_with` builds the entry in the slot itself: what `fill` writes arrives through
    /// `peek_into`/`pop` once published; an error from `fill` stages nothing (the next entry
    /// takes the same slot, and the consumer never sees the abandoned bytes); a full ring is
    /// refused before `fill` runs; entries wrap the slot array in order.
    #[test]
    fn stage_with_builds_in_the_slot_and_abandons_on_error() {
        use crate::layout::{ShmSendWqe, ShmSge};
        #[derive(Debug, PartialEq)]
        enum E {
            Ring(PushError<()>),
            Bad,
        }
        impl From<PushError<()>> for E {
            fn from(e: PushError<()>) -> Self {
                E::Ring(e)
            }
        }
        let mut s = Box::new(Big([0; 8192]));
        // SAFETY: `s` outlives the handles.
        let (mut p, mut c) = unsafe { wqe_ring::<ShmSendWqe>(&mut s, 4) };
        let mut out = ShmSendWqe::default();
        let mut next = 0u64;
        for round in 0..3u64 {
            // An abandoned fill first: it scribbles over the slot, then fails.
            let r = p.stage_with(|w: &mut ShmSendWqe| {
                w.wr_id = 0xbad;
                w.num_sge = 99;
                w.data.fill(0xCC);
                Err(E::Bad)
            });
            assert_eq!(r, Err(E::Bad));
            for k in 0..4u64 {
                let id = round * 4 + k;
                p.stage_with(|w: &mut ShmSendWqe| {
                    // The head in full, then the live tail (the slot holds older bytes).
                    *w = ShmSendWqe { data: w.data, ..Default::default() };
                    (w.wr_id, w.opcode, w.num_sge, w.remote_addr) = (id, 4, 1, 0x1000 + id);
                    w.set_sge(0, ShmSge { addr: id, length: 8, lkey: 3 });
                    Ok::<(), E>(())
                })
                .unwrap();
            }
            let mut called = false;
            let full = p.stage_with(|_: &mut ShmSendWqe| {
                called = true;
                Ok::<(), E>(())
            });
            assert_eq!(full, Err(E::Ring(PushError::Full(()))));
            assert!(!called, "fill must not run on a full ring");
            assert!(!c.peek_into(&mut out).unwrap(), "nothing visible before publish");
            p.publish();
            for _ in 0..4 {
                assert!(c.peek_into(&mut out).unwrap());
                assert_eq!((out.wr_id, out.opcode, out.num_sge, out.remote_addr), (next, 4, 1, 0x1000 + next));
                assert_eq!(out.sge(0), ShmSge { addr: next, length: 8, lkey: 3 });
                c.advance();
                next += 1;
            }
            c.release();
            assert!(!c.peek_into(&mut out).unwrap());
        }
    }

    /// Issue 13 item 8: resetting a QP removes its completions from a CQ (shared with other
    /// QPs) without losing or reordering the others, across the ring's wrap, and the producer
    /// sees the freed slots.
    #[test]
    fn retain_removes_entries_keeps_order_and_frees_slots() {
        let mut s = seg();
        let base = s.0.as_mut_ptr();
        // SAFETY: `s` outlives the handles, is aligned and large enough.
        let (mut p, mut c) = unsafe {
            init_ring::<E>(base, 8).unwrap();
            (Producer::<E>::attach(base, 4096, 8).unwrap(), Consumer::<E>::attach(base, 4096, 8).unwrap())
        };
        // Move the indices so the live window wraps the end of the slot array.
        for i in 0..5 {
            p.push(E { a: 0, b: i }).unwrap();
        }
        for _ in 0..5 {
            c.pop().unwrap().unwrap();
        }
        // qp a=1 and a=2 interleaved; purge a=1.
        let items: Vec<E> = (0..7).map(|i| E { a: 1 + (i % 2), b: i }).collect();
        for e in &items {
            p.push(*e).unwrap();
        }
        assert_eq!(c.retain(|e| e.a != 1).unwrap(), 4);
        assert_eq!(p.free().unwrap(), 8 - 3);
        let left: Vec<E> = std::iter::from_fn(|| c.pop().unwrap()).collect();
        assert_eq!(left, items.iter().copied().filter(|e| e.a == 2).collect::<Vec<_>>());
        // Nothing to keep, nothing kept: empty afterwards; retain on empty is a no-op.
        p.push(E { a: 1, b: 9 }).unwrap();
        assert_eq!(c.retain(|e| e.a != 1).unwrap(), 1);
        assert_eq!(c.retain(|_| true).unwrap(), 0);
        assert_eq!(c.pop().unwrap(), None);
    }

    #[test]
    fn corrupt_producer_index_is_detected_not_trusted() {
        let mut s = seg();
        let base = s.0.as_mut_ptr();
        // SAFETY: as above.
        let mut c = unsafe {
            init_ring::<E>(base, 8).unwrap();
            Consumer::<E>::attach(base, 4096, 8).unwrap()
        };
        // A hostile producer writes an impossible index.
        // SAFETY: the header lies at `base`; we only write the producer index word.
        unsafe { (*base.cast::<RingHeader>()).producer.0.store(1000, Ordering::Release) };
        assert_eq!(c.pop(), Err(RingError::Corrupt));
    }

    #[test]
    fn attach_rejects_bad_header_and_short_segment() {
        let mut s = seg();
        let base = s.0.as_mut_ptr();
        // SAFETY: as above.
        unsafe {
            init_ring::<E>(base, 8).unwrap();
            assert_eq!(Consumer::<E>::attach(base, 4096, 16).err(), Some(RingError::BadHeader));
            assert_eq!(Consumer::<E>::attach(base, 200, 8).err(), Some(RingError::TooSmall));
            assert_eq!(init_ring::<E>(base, 6), Err(RingError::BadHeader));
        }
    }

    #[test]
    fn threads_transfer_every_item_in_order() {
        let mut s = seg();
        let base = s.0.as_mut_ptr();
        // SAFETY: as above.
        let (mut p, mut c) = unsafe {
            init_ring::<E>(base, 16).unwrap();
            (Producer::<E>::attach(base, 4096, 16).unwrap(), Consumer::<E>::attach(base, 4096, 16).unwrap())
        };
        // Miri interprets every step: fewer items there, still many wraps of the 16 slots.
        const N: u64 = if cfg!(miri) { 2_000 } else { 200_000 };
        std::thread::scope(|sc| {
            sc.spawn(move || {
                let mut i = 0;
                while i < N {
                    if p.push(E { a: i, b: !i }).is_ok() {
                        i += 1;
                    } else {
                        std::hint::spin_loop();
                    }
                }
            });
            let mut want = 0;
            while want < N {
                if let Some(e) = c.pop().unwrap() {
                    assert_eq!(e, E { a: want, b: !want });
                    want += 1;
                }
            }
        });
        drop(s);
    }
}
