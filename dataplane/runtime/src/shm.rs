//! Service-side shared-memory segments: memfds the service creates (rings, the client page)
//! or receives (client memory), mapped `MAP_SHARED` into the service.
//!
//! # Client memory can never fault the service (issue 37)
//! * Only memory whose pages cannot block or vanish for good is accepted
//!   ([`client_memory_page`]): shmem (memfds, tmpfs files, SysV SHM, `MAP_SHARED|MAP_ANONYMOUS`
//!   memory, all `TMPFS_MAGIC`) and hugetlbfs files. A page fault in such a file never waits
//!   for I/O or for another process (FUSE, NFS, a disk), which an lcore must never do.
//! * Such pages can still disappear: a client truncates an unsealed file, or punches a hole
//!   (`fallocate(PUNCH_HOLE)`, which no seal but `F_SEAL_WRITE` forbids) in a hugetlb file and
//!   takes the free huge pages, so the next touch raises SIGBUS. Every service mapping of a
//!   file a client can reach — MR mappings and the segments the service creates and hands
//!   out — is therefore registered with a [`FaultGuard`]: a SIGBUS inside one replaces the
//!   faulting page with anonymous memory (reads give zeros, writes go nowhere) and the copy
//!   carries on — the Wayland `wl_shm` answer to the same problem.
//! * A rescued fault is reported, not only survived: the guard's slot carries a `tag` (the
//!   service's name for what it covers: an MR, a client's segment) and a `faulted` flag the
//!   handler sets; the handler also signals an eventfd. The service's fault watcher
//!   ([`wait_for_faults`], [`take_faulted`]) revokes what the tags name. Nothing of this is on
//!   the lcore's path.
//! * Registration populates the pages ([`MrMapping::assemble_at`]), so the lcore's first
//!   touch does not fault them in.
//!
//! The guard table grows in chunks that are never freed (the handler walks it without a
//! lock); it holds [`GUARD_CAPACITY`] ranges. One range covers a run of pieces with the same
//! page size, usually a whole MR.
use rustix::fs::SealFlags;
use rustix::mm::{self, MapFlags, ProtFlags};
use std::cell::Cell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::Duration;
use pmrxe_abi::client::Mapping;

/// `statfs.f_type` of hugetlbfs (linux/magic.h).
const HUGETLBFS_MAGIC: u32 = 0x9584_58f6;
/// `statfs.f_type` of tmpfs/shmem: memfds, SysV SHM, shared anonymous memory, /dev/shm.
const TMPFS_MAGIC: u32 = 0x0102_1994;
const SMALL_PAGE: u64 = 4096;

/// The page size the kernel maps `fd` with: the huge page size for a hugetlbfs file (hugetlb
/// memfds and SysV `SHM_HUGETLB` segments included), else 4096.
pub fn file_page_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let sfs = rustix::fs::fstatfs(fd)?;
    if sfs.f_type as u32 == HUGETLBFS_MAGIC {
        let bs = sfs.f_bsize as u64;
        if bs.is_power_of_two() && bs >= SMALL_PAGE {
            return Ok(bs);
        }
    }
    Ok(SMALL_PAGE)
}

/// A name for a filesystem magic (linux/magic.h), for refusals.
pub fn fs_name(magic: u32) -> &'static str {
    match magic {
        TMPFS_MAGIC => "tmpfs",
        HUGETLBFS_MAGIC => "hugetlbfs",
        0x0000_ef53 => "ext2/ext3/ext4",
        0x5846_5342 => "xfs",
        0x9123_683e => "btrfs",
        0x794c_7630 => "overlayfs",
        0x6573_5546 => "FUSE",
        0x0000_6969 => "NFS",
        0xff53_4d42 => "CIFS",
        0xfe53_4d42 => "SMB2",
        0x0102_1997 => "9p",
        0x0027_e0eb => "cgroup",
        0x8584_58f6 => "ramfs",
        0xf2f5_2010 => "f2fs",
        0x2fc1_2fc1 => "zfs",
        0x00c3_6400 => "ceph",
        0x7371_7368 => "squashfs",
        0x0000_4d44 => "vfat",
        0x2011_bab0 => "exfat",
        0xca45_1a4e => "bcachefs",
        0x6265_6572 => "sysfs",
        0x0000_9fa0 => "procfs",
        0x0000_1373 => "devfs",
        _ => "an unknown filesystem",
    }
}

/// Whether a client may register memory backed by `fd`, and its page size if so.
///
/// Accepted: shmem (`TMPFS_MAGIC`: memfds, tmpfs files, SysV SHM, shared anonymous memory;
/// 4096) and hugetlbfs files (their huge page size): their pages are in memory, a fault never
/// waits for I/O or another process. Everything else — FUSE, NFS, CIFS, ext4/xfs/btrfs/overlay
/// files — is refused, as the kernel refuses long-term pins of such mappings since 6.5: a
/// fault in them blocks the lcore (a FUSE server that never answers, a dead NFS server, a
/// failing disk). `Err` is a sentence naming the filesystem.
pub fn client_memory_page(fd: BorrowedFd<'_>) -> Result<u64, String> {
    let sfs = rustix::fs::fstatfs(fd).map_err(|e| format!("fstatfs on the memory's file failed: {e}"))?;
    let magic = sfs.f_type as u32;
    match magic {
        TMPFS_MAGIC => Ok(SMALL_PAGE),
        HUGETLBFS_MAGIC => file_page_size(fd).map_err(|e| format!("fstatfs on the hugetlbfs file failed: {e}")),
        _ => Err(format!(
            "memory backed by a file on {} (filesystem magic {magic:#x}) cannot be registered: only anonymous memory, memfd/tmpfs/shmem and hugetlbfs files can (a page fault in other files may block the data plane)",
            fs_name(magic)
        )),
    }
}

/// Whether `fd` is sealed against shrinking (a memfd with `F_SEAL_SHRINK`).
pub fn sealed_against_shrink(fd: BorrowedFd<'_>) -> bool {
    // EINVAL for files without seals.
    rustix::fs::fcntl_get_seals(fd).is_ok_and(|seals| seals.contains(SealFlags::SHRINK))
}

thread_local! {
    /// The guard tag given to segments this thread creates ([`set_segment_owner`]).
    static SEGMENT_OWNER: Cell<u64> = const { Cell::new(0) };
}

/// Tag the [`FaultGuard`]s of the segments this thread creates from now on with `tag` (a
/// session thread names its client once; [`Segment::create`] has no owner argument).
pub fn set_segment_owner(tag: u64) {
    SEGMENT_OWNER.with(|o| o.set(tag));
}

/// A mapped shared-memory segment (the client core's [`Mapping`] of its memfd), under a
/// [`FaultGuard`]: the client gets the fd and can punch holes in it (a hugetlb memfd's pages
/// then need free huge pages to come back). Unmapped on drop; the fd closes with it.
pub struct Segment {
    // Field order is drop order: the guard goes before the mapping is unmapped.
    guard: FaultGuard,
    fd: OwnedFd,
    map: Mapping,
}

impl Segment {
    /// Create a zero-filled memfd segment of `len` bytes (rounded up to a page), hugepage-backed
    /// when `len` is a multiple of 2 MiB and hugepages are free, else ordinary shared memory.
    /// Its guard is tagged with this thread's [`set_segment_owner`] tag.
    pub fn create(name: &str, len: usize) -> io::Result<Segment> {
        let len = (len.max(1) + 4095) & !4095;
        let cname = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // Huge pages when the length allows and some are free, else ordinary shared memory.
        // Clients get this fd: it is sealed against resizing (a client that shrank it would
        // make the lcore's next access to the mapping raise SIGBUS). Holes can still be
        // punched: the guard covers that.
        let huge = if len.is_multiple_of(2 << 20) { pmrxe_abi::client::memfd(&cname, len as u64, 2 << 20, true).ok() } else { None };
        let fd = match huge {
            Some(fd) => fd,
            None => pmrxe_abi::client::memfd(&cname, len as u64, 0, true)?,
        };
        Segment::map_populated(fd, len, true)
    }

    /// Map `len` bytes of a segment fd received from a client. The length is checked against
    /// the file size so a client cannot make us map past its end (SIGBUS).
    pub fn map(fd: OwnedFd, len: usize) -> io::Result<Segment> {
        Segment::map_populated(fd, len, false)
    }

    fn map_populated(fd: OwnedFd, len: usize, populate: bool) -> io::Result<Segment> {
        let st = rustix::fs::fstat(&fd)?;
        if len == 0 || (st.st_size as u64) < len as u64 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "segment shorter than declared"));
        }
        let page = file_page_size(fd.as_fd())? as usize;
        let map = Mapping::map(fd.as_raw_fd(), 0, len, populate)?;
        let tag = SEGMENT_OWNER.with(Cell::get);
        let guard = FaultGuard::new(map.ptr() as usize, len.next_multiple_of(page), page, tag)?;
        Ok(Segment { guard, fd, map })
    }

    /// Tag its guard (what a rescued fault in it is reported as; see [`take_faulted`]).
    pub fn set_tag(&self, tag: u64) {
        self.guard.set_tag(tag);
    }

    /// Base address in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.ptr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// Always false (segments are at least a page).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// The fd (to pass to a client).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// One piece of an [`MrMapping`]: `len` bytes of `fd` at file offset `offset`.
#[derive(Clone, Copy)]
pub struct MapPiece<'a> {
    pub fd: &'a OwnedFd,
    pub offset: u64,
    pub len: u64,
    /// The file's page size ([`file_page_size`]): 4096, or the huge page size.
    pub page: u64,
}

/// A contiguous service-side view of a client MR assembled from page-aligned pieces of
/// several segments (one map per MR), populated, every piece under a [`FaultGuard`] (one per
/// run of pieces with the same page size). Unmapped on drop.
pub struct MrMapping {
    /// The view: the first byte of the first piece.
    ptr: NonNull<u8>,
    len: usize,
    /// The whole reservation (the view plus alignment slack for huge pages).
    res: NonNull<u8>,
    res_len: usize,
    _guards: Vec<FaultGuard>,
}

// SAFETY: a plain shared mapping accessed only through raw copies by pmrxe-mem.
unsafe impl Send for MrMapping {}
// SAFETY: see Send.
unsafe impl Sync for MrMapping {}
impl pmrxe_mem::Backing for MrMapping {}

fn bad(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl MrMapping {
    /// Reserve `len` bytes of address space and map each `(fd, fd_offset, len)` piece of a 4 KiB
    /// page file at consecutive offsets. Every offset/length must be page aligned and inside its
    /// file.
    pub fn assemble(pieces: &[(&OwnedFd, u64, u64)]) -> io::Result<MrMapping> {
        let p: Vec<MapPiece<'_>> =
            pieces.iter().map(|&(fd, offset, len)| MapPiece { fd, offset, len, page: SMALL_PAGE }).collect();
        MrMapping::assemble_at(0, &p)
    }

    /// Map the pieces contiguously, the first one standing for client address `span_start`.
    ///
    /// A piece of a huge-page file can only be mapped whole huge pages at a huge-page aligned
    /// address, so the view is placed at an address congruent to `span_start` modulo the
    /// largest page size, and each huge piece must sit in the client's address space as it
    /// sits in its file (client address ≡ file offset modulo its page size, which holds for
    /// any range of a client's hugetlb mapping). Only the first piece may start and only the
    /// last piece may end inside a huge page; their mappings then extend to the huge page
    /// boundary, outside the view.
    pub fn assemble_at(span_start: u64, pieces: &[MapPiece<'_>]) -> io::Result<MrMapping> {
        let total: u64 = pieces.iter().map(|p| p.len).sum();
        if total == 0 || total > isize::MAX as u64 / 2 {
            return Err(bad("empty or huge mapping"));
        }
        let maxpg = pieces.iter().map(|p| p.page).max().unwrap_or(SMALL_PAGE);
        let mut at = 0u64;
        for (i, p) in pieces.iter().enumerate() {
            if !p.page.is_power_of_two() || p.page < SMALL_PAGE || p.page > 1 << 30 {
                return Err(bad("bad page size"));
            }
            if p.offset % SMALL_PAGE != 0 || p.len % SMALL_PAGE != 0 || p.len == 0 {
                return Err(bad("piece not page aligned"));
            }
            let head = p.offset % p.page;
            if span_start.wrapping_add(at) % p.page != head {
                return Err(bad("huge-page piece not at its file offset modulo the page size"));
            }
            let end_in_page = (p.offset + p.len) % p.page;
            if (head != 0 && i != 0) || (end_in_page != 0 && i + 1 != pieces.len()) {
                return Err(bad("huge-page piece starts or ends inside a huge page in the middle of the MR"));
            }
            let st = rustix::fs::fstat(p.fd)?;
            // Mapped bytes up to the end of the last (partial) page of the file are valid.
            let size = (st.st_size as u64).checked_next_multiple_of(p.page).unwrap_or(u64::MAX);
            let map_end = (p.offset + p.len).checked_next_multiple_of(p.page);
            if map_end.is_none_or(|e| e > size) {
                return Err(bad("piece beyond segment end"));
            }
            at += p.len;
        }
        // Reservation: the view plus slack to place it at the right huge-page phase.
        let slack = if maxpg > SMALL_PAGE { 3 * maxpg } else { 0 };
        let res_len = (total + slack) as usize;
        // SAFETY: anonymous PROT_NONE reservation at an address the kernel chooses (no
        // MAP_FIXED): no existing memory is touched.
        let base = unsafe { mm::mmap_anonymous(core::ptr::null_mut(), res_len, ProtFlags::empty(), MapFlags::PRIVATE | MapFlags::NORESERVE) }?;
        let res = NonNull::new(base.cast::<u8>()).expect("mmap returned null");
        let view = if maxpg > SMALL_PAGE {
            // A = first maxpg boundary in the reservation; the view starts at A + phase, so the
            // first piece's head (< maxpg, <= phase) and the last piece's tail (< maxpg) fit.
            (base as u64).next_multiple_of(maxpg) + span_start % maxpg
        } else {
            base as u64
        };
        let mut m = MrMapping {
            // SAFETY: `view` is inside the reservation (computed above).
            ptr: NonNull::new(view as *mut u8).expect("non-null"),
            len: total as usize,
            res,
            res_len,
            _guards: Vec::new(),
        };
        let mut at = 0u64;
        let mut runs = Vec::with_capacity(pieces.len());
        for p in pieces {
            let head = p.offset % p.page;
            let map_len = (head + p.len).next_multiple_of(p.page);
            let addr = view + at - head;
            // SAFETY: MAP_FIXED inside our own reservation: [addr, addr+map_len) lies in
            // [res, res+res_len) by the slack computation above and the checks on head/tail.
            let r = unsafe {
                mm::mmap(addr as *mut core::ffi::c_void, map_len as usize, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED | MapFlags::FIXED, p.fd, p.offset - head)
            };
            if let Err(e) = r {
                return Err(e.into()); // `m` drops and unmaps everything
            }
            runs.push((addr as usize, map_len as usize, p.page as usize));
            at += p.len;
        }
        // Guard first, then populate (a populate failure is an error return, not a signal, but
        // the mapping is client-reachable from the moment it exists).
        let mut merged: Vec<(usize, usize, usize)> = Vec::with_capacity(runs.len());
        for (a, l, pg) in runs {
            match merged.last_mut() {
                Some((ma, ml, mpg)) if *mpg == pg && *ma + *ml == a => *ml += l,
                _ => merged.push((a, l, pg)),
            }
        }
        for &(a, l, pg) in &merged {
            m._guards.push(FaultGuard::new(a, l, pg, 0)?);
        }
        for &(a, l, _) in &merged {
            populate(a, l)?;
        }
        Ok(m)
    }

    /// Tag its guards (what a rescued fault in it is reported as; see [`take_faulted`]).
    pub fn set_tag(&self, tag: u64) {
        for g in &self._guards {
            g.set_tag(tag);
        }
    }

    /// Base address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Fault in (for writing) every page of `[addr, addr+len)`, a fresh shared mapping of ours, so
/// the lcore's first touch finds them present. Kernels before 5.14 lack MADV_POPULATE_WRITE
/// (EINVAL): then nothing is done. A page that cannot be had (a hole in a hugetlb file with no
/// free huge page) is an error, as a pin would be.
fn populate(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: madvise on our own mapping; MADV_POPULATE_WRITE only faults pages in (it reports
    // what would be a SIGBUS as EFAULT instead of raising it).
    match unsafe { mm::madvise(addr as *mut core::ffi::c_void, len, mm::Advice::LinuxPopulateWrite) } {
        Ok(()) | Err(rustix::io::Errno::INVAL) => Ok(()),
        Err(e) => Err(io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("cannot populate the registered memory ({e}): a hole in its file that cannot be filled (no free huge pages?)"),
        )),
    }
}

impl Drop for MrMapping {
    fn drop(&mut self) {
        // The guards go first (field order would drop them after the unmap).
        self._guards.clear();
        // SAFETY: unmapping our own reservation (and the pieces mapped into it).
        let _ = unsafe { mm::munmap(self.res.as_ptr().cast(), self.res_len) };
    }
}

/// One range of this process under SIGBUS protection, read lock-free by the signal handler.
struct GuardSlot {
    /// 0: free. Published last (Release); the handler trusts the other fields after it.
    start: AtomicUsize,
    end: AtomicUsize,
    page: AtomicUsize,
    /// What the range covers, in the service's terms (0: nothing said).
    tag: AtomicU64,
    /// Set by the handler when it rescued a fault here; cleared by [`take_faulted`].
    faulted: AtomicBool,
}

impl GuardSlot {
    const fn new() -> GuardSlot {
        GuardSlot { start: AtomicUsize::new(0), end: AtomicUsize::new(0), page: AtomicUsize::new(0), tag: AtomicU64::new(0), faulted: AtomicBool::new(false) }
    }
}

/// Slots per chunk of the guard table.
const GUARD_CHUNK: usize = 4096;
/// Chunks the table can grow to.
const GUARD_CHUNKS: usize = 256;
/// Guarded ranges the process can hold at once (MR mappings, one per run of pieces with the
/// same page size, plus every segment the service creates or maps).
pub const GUARD_CAPACITY: usize = GUARD_CHUNK * GUARD_CHUNKS;

/// The table: chunk pointers, published with Release once their slots are initialised, never
/// freed or moved (the handler may be reading them at any moment).
static GUARDS: [AtomicPtr<GuardSlot>; GUARD_CHUNKS] = [const { AtomicPtr::new(core::ptr::null_mut()) }; GUARD_CHUNKS];

/// Slot allocation (control threads only; never taken in the handler).
struct GuardAlloc {
    free: Vec<usize>,
    chunks: usize,
}
static GUARD_ALLOC: Mutex<GuardAlloc> = Mutex::new(GuardAlloc { free: Vec::new(), chunks: 0 });
static GUARD_INSTALL: Once = Once::new();
static OLD_SIGBUS: OnceLock<OldAction> = OnceLock::new();
static RESCUED: AtomicU64 = AtomicU64::new(0);
/// The eventfd the handler signals after a rescue (-1 until installed).
static FAULT_EVENT: AtomicI32 = AtomicI32::new(-1);

/// Chunk `c` of the table, if allocated.
fn guard_chunk(c: usize) -> Option<&'static [GuardSlot]> {
    let p = GUARDS.get(c)?.load(Ordering::Acquire);
    // SAFETY: a non-null chunk pointer was published (Release, paired above) after its
    // GUARD_CHUNK slots were initialised, and chunks are leaked: valid for 'static.
    (!p.is_null()).then(|| unsafe { core::slice::from_raw_parts(p, GUARD_CHUNK) })
}

fn guard_slot(i: usize) -> &'static GuardSlot {
    &guard_chunk(i / GUARD_CHUNK).expect("slot of an allocated chunk")[i % GUARD_CHUNK]
}

struct OldAction(libc::sigaction);
// SAFETY: a plain C struct of integers and a function pointer, written once before use.
unsafe impl Sync for OldAction {}
// SAFETY: as above.
unsafe impl Send for OldAction {}

/// SIGBUS protection for `[start, start+len)`, a service mapping of a file a client can reach:
/// a fault there replaces the faulting page (`page` bytes, aligned) with anonymous memory,
/// marks the slot faulted and wakes [`wait_for_faults`]. Removed on drop, which must happen
/// before the range is unmapped.
pub struct FaultGuard {
    slot: usize,
}

impl FaultGuard {
    /// Protect a range, tagged `tag` (installs the process's SIGBUS handler on first use).
    pub fn new(start: usize, len: usize, page: usize, tag: u64) -> io::Result<FaultGuard> {
        GUARD_INSTALL.call_once(install_sigbus_handler);
        if OLD_SIGBUS.get().is_none() {
            return Err(io::Error::other("SIGBUS handler not installed"));
        }
        if start == 0 || len == 0 || !page.is_power_of_two() || start.checked_add(len).is_none() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad guarded range"));
        }
        let mut a = GUARD_ALLOC.lock().unwrap_or_else(|e| e.into_inner());
        if a.free.is_empty() {
            if a.chunks == GUARD_CHUNKS {
                return Err(io::Error::other(format!("too many guarded mappings of client memory (the limit is {GUARD_CAPACITY})")));
            }
            let chunk: Box<[GuardSlot]> = (0..GUARD_CHUNK).map(|_| GuardSlot::new()).collect();
            let p = Box::leak(chunk).as_mut_ptr();
            GUARDS[a.chunks].store(p, Ordering::Release);
            let base = a.chunks * GUARD_CHUNK;
            a.chunks += 1;
            a.free.extend((base..base + GUARD_CHUNK).rev());
        }
        let slot = a.free.pop().expect("refilled above");
        let s = guard_slot(slot);
        s.tag.store(tag, Ordering::Relaxed);
        s.faulted.store(false, Ordering::Relaxed);
        s.end.store(start + len, Ordering::Relaxed);
        s.page.store(page, Ordering::Relaxed);
        // Published last: the handler trusts end/page only after seeing start.
        s.start.store(start, Ordering::Release);
        Ok(FaultGuard { slot })
    }

    /// Set the tag a rescued fault in this range is reported with.
    pub fn set_tag(&self, tag: u64) {
        guard_slot(self.slot).tag.store(tag, Ordering::Relaxed);
    }

    /// Faults rescued so far in this process (pages replaced after a client shrank a file or
    /// punched a hole in it).
    pub fn rescued() -> u64 {
        RESCUED.load(Ordering::Relaxed)
    }
}

impl Drop for FaultGuard {
    fn drop(&mut self) {
        let s = guard_slot(self.slot);
        s.start.store(0, Ordering::Release);
        s.faulted.store(false, Ordering::Relaxed);
        GUARD_ALLOC.lock().unwrap_or_else(|e| e.into_inner()).free.push(self.slot);
    }
}

/// The tags of the ranges where a fault was rescued since the last call (each reported once;
/// a range dropped meanwhile is not reported). Control side: the service's fault watcher.
pub fn take_faulted() -> Vec<u64> {
    let mut out = Vec::new();
    for c in 0..GUARD_CHUNKS {
        let Some(chunk) = guard_chunk(c) else { break };
        for s in chunk {
            // Acquire pairs with the handler's Release store: the tag read after is current.
            if s.faulted.load(Ordering::Relaxed) && s.faulted.swap(false, Ordering::Acquire) && s.start.load(Ordering::Acquire) != 0 {
                out.push(s.tag.load(Ordering::Relaxed));
            }
        }
    }
    out
}

/// Wait up to `timeout` for the handler to rescue a fault; true if it did (then call
/// [`take_faulted`]). Returns at once when no guard was ever made.
pub fn wait_for_faults(timeout: Duration) -> bool {
    let fd = FAULT_EVENT.load(Ordering::Acquire);
    if fd < 0 {
        std::thread::sleep(timeout);
        return false;
    }
    // SAFETY: the eventfd is created once and never closed (a process-lifetime fd).
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut pfd = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
    let ts = rustix::event::Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: timeout.subsec_nanos() as i64 };
    if !matches!(rustix::event::poll(&mut pfd, Some(&ts)), Ok(n) if n > 0) {
        return false;
    }
    let mut b = [0u8; 8];
    matches!(rustix::io::read(fd, &mut b), Ok(8))
}

fn install_sigbus_handler() {
    // The eventfd first: the handler signals it after every rescue.
    match rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK) {
        Ok(fd) => FAULT_EVENT.store(fd.into_raw_fd(), Ordering::Release),
        Err(e) => tracing::warn!("fault guard eventfd: {e}; rescued faults will be noticed late"),
    }
    // Still libc: rustix has no safe sigaction (only its unsafe `runtime` module).
    // SAFETY: zeroed sigactions are valid "no handler, no flags, empty mask" values;
    // sigemptyset and sigaction get pointers to these locals; `on_sigbus` is async-signal-safe.
    let (ok, old) = unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        let mut old: libc::sigaction = core::mem::zeroed();
        libc::sigemptyset(&mut sa.sa_mask);
        (libc::sigaction(libc::SIGBUS, &sa, &mut old) == 0, old)
    };
    if ok {
        let _ = OLD_SIGBUS.set(OldAction(old));
    }
}

/// The SIGBUS handler: async-signal-safe (atomic loads and stores, and the raw mmap, write and
/// sigaction system calls; no lock, no allocation).
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    'chunks: for c in 0..GUARD_CHUNKS {
        let Some(chunk) = guard_chunk(c) else { break };
        for s in chunk {
            let start = s.start.load(Ordering::Acquire);
            if start == 0 || addr < start {
                continue;
            }
            let (end, page) = (s.end.load(Ordering::Relaxed), s.page.load(Ordering::Relaxed));
            if addr >= end || s.start.load(Ordering::Acquire) != start || page == 0 {
                continue;
            }
            let p = addr & !(page - 1);
            // SAFETY: replaces one page of a guarded service mapping of a client file (which
            // only raw copies access) with private anonymous memory; the range stays mapped
            // until its owner unmaps it (after dropping the guard).
            // (rustix issues the raw system call: async-signal-safe, errno untouched.)
            let r = unsafe { mm::mmap_anonymous(p as *mut core::ffi::c_void, page, ProtFlags::READ | ProtFlags::WRITE, MapFlags::PRIVATE | MapFlags::FIXED) };
            if r.is_ok() {
                RESCUED.fetch_add(1, Ordering::Relaxed);
                s.faulted.store(true, Ordering::Release);
                let efd = FAULT_EVENT.load(Ordering::Acquire);
                if efd >= 0 {
                    // SAFETY: the process-lifetime eventfd; a raw write(2), async-signal-safe.
                    let _ = rustix::io::write(unsafe { BorrowedFd::borrow_raw(efd) }, &1u64.to_ne_bytes());
                }
                return;
            }
            break 'chunks;
        }
    }
    // Not ours: hand over to whatever was installed before.
    let Some(OldAction(old)) = OLD_SIGBUS.get() else { return };
    if old.sa_flags & libc::SA_SIGINFO != 0 && old.sa_sigaction > 1 {
        // SAFETY: the previous handler was installed as an SA_SIGINFO handler with this type.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = unsafe { core::mem::transmute(old.sa_sigaction) };
        f(sig, info, uctx);
    } else if old.sa_sigaction > 1 {
        // SAFETY: a plain handler installed without SA_SIGINFO.
        let f: extern "C" fn(libc::c_int) = unsafe { core::mem::transmute(old.sa_sigaction) };
        f(sig);
    } else {
        // SIG_DFL / SIG_IGN: restore it; the faulting access repeats and gets it.
        // SAFETY: reinstalling the saved action.
        unsafe { libc::sigaction(libc::SIGBUS, old, core::ptr::null_mut()) };
    }
}

/// An eventfd (completion channels).
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new non-blocking, close-on-exec eventfd.
    pub fn new() -> io::Result<EventFd> {
        use rustix::event::EventfdFlags;
        Ok(EventFd(rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?))
    }
    /// Signal once (the completion-event path; the only syscall an lcore makes, and only for
    /// CQs the application armed).
    pub fn signal(&self) {
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }
    /// The fd (to pass to the client).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assembled_mapping_sees_both_segments_in_order() {
        let a = Segment::create("a", 8192).unwrap();
        let b = Segment::create("b", 4096).unwrap();
        // SAFETY: test writes into our own fresh mappings.
        unsafe {
            a.as_ptr().add(4096).write(0xaa);
            b.as_ptr().write(0xbb);
        }
        let fa = a.fd().try_clone_to_owned().unwrap();
        let fb = b.fd().try_clone_to_owned().unwrap();
        let m = MrMapping::assemble(&[(&fa, 4096, 4096), (&fb, 0, 4096)]).unwrap();
        // SAFETY: reading inside the 8 KiB mapping.
        unsafe {
            assert_eq!(m.as_ptr().read(), 0xaa);
            assert_eq!(m.as_ptr().add(4096).read(), 0xbb);
            m.as_ptr().add(4096).write(0xcc);
            assert_eq!(b.as_ptr().read(), 0xcc, "writes through the MR mapping reach the segment");
        }
        assert!(MrMapping::assemble(&[(&fb, 4096, 4096)]).is_err(), "beyond the end is refused");
        assert!(MrMapping::assemble(&[(&fb, 100, 4096)]).is_err(), "unaligned is refused");
    }

    #[test]
    fn short_client_segment_is_refused() {
        let a = Segment::create("a", 4096).unwrap();
        let fd = a.fd().try_clone_to_owned().unwrap();
        assert!(Segment::map(fd, 8192).is_err());
    }

    /// A plain (unsealed, 4 KiB page) memfd of `len` bytes, like a client's own memfd.
    fn plain_memfd(len: usize) -> OwnedFd {
        let fd = rustix::fs::memfd_create(c"client-file", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, len as u64).unwrap();
        fd
    }

    #[test]
    fn huge_page_pieces_are_placed_at_their_file_phase() {
        // The placement logic does not depend on the file being hugetlbfs (the kernel only
        // enforces the alignment there), so a plain memfd declared with 2 MiB pages checks it.
        const H: u64 = 2 << 20;
        let f = plain_memfd(4 * H as usize);
        let g = plain_memfd(4096);
        assert_eq!(rustix::io::pwrite(&f, &[0x77u8], H + 3 * 4096).unwrap(), 1);
        // Client span starts 3 pages into a huge page whose file offset is H; the piece ends
        // at the huge page end; then a 4 KiB piece of another file.
        let span = 0x7f00_0000_0000 + 3 * 4096;
        let pieces = [
            MapPiece { fd: &f, offset: H + 3 * 4096, len: H - 3 * 4096, page: H },
            MapPiece { fd: &g, offset: 0, len: 4096, page: 4096 },
        ];
        let m = MrMapping::assemble_at(span, &pieces).unwrap();
        assert_eq!(m.as_ptr() as u64 % H, span % H, "view not at the client's huge-page phase");
        assert_eq!(m.len() as u64, H - 3 * 4096 + 4096);
        // SAFETY: reads inside the view.
        unsafe {
            assert_eq!(m.as_ptr().read(), 0x77);
            m.as_ptr().add((H - 3 * 4096) as usize).write(0x55);
        }
        let mut b = [0u8];
        assert_eq!(rustix::io::pread(&g, &mut b, 0).unwrap(), 1);
        assert_eq!(b[0], 0x55);
        // A huge piece that starts inside a huge page is only possible first in the MR.
        let bad = [
            MapPiece { fd: &g, offset: 0, len: 4096, page: 4096 },
            MapPiece { fd: &f, offset: H + 4096, len: 4096, page: H },
        ];
        assert!(MrMapping::assemble_at(span - 4096, &bad).is_err());
        // ... and its client address must match its file offset modulo the page size.
        assert!(MrMapping::assemble_at(span + 4096, &pieces).is_err());
    }

    #[test]
    fn shrinking_a_guarded_file_does_not_kill_the_service() {
        let _g = FAULT_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let f = plain_memfd(4 * 4096);
        let m = MrMapping::assemble_at(0, &[MapPiece { fd: &f, offset: 0, len: 4 * 4096, page: 4096 }]).unwrap();
        // SAFETY: writes inside the view (file still full size).
        unsafe { m.as_ptr().add(3 * 4096).write(9) };
        // The client shrinks its file: the pages behind the view's tail are gone.
        rustix::fs::ftruncate(&f, 4096).unwrap();
        let before = FaultGuard::rescued();
        // SAFETY: raw accesses inside the view; the guard turns the SIGBUS into a fresh page.
        unsafe {
            assert_eq!(m.as_ptr().add(2 * 4096 + 5).read_volatile(), 0, "a rescued page reads zeros");
            m.as_ptr().add(3 * 4096).write_volatile(1);
            assert_eq!(m.as_ptr().add(3 * 4096).read_volatile(), 1);
            m.as_ptr().write_volatile(4); // still the file's page
        }
        assert!(FaultGuard::rescued() >= before + 2);
        assert_eq!(faulted_tags(), vec![0], "an untagged range reports tag 0");
        let mut b = [0u8];
        assert_eq!(rustix::io::pread(&f, &mut b, 0).unwrap(), 1);
        assert_eq!(b[0], 4);
    }

    /// Tests that fault, reserve huge pages or look at the process-wide faulted flags: one at
    /// a time.
    static FAULT_TESTS: Mutex<()> = Mutex::new(());
    const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";
    const H: usize = 2 << 20;

    fn meminfo(key: &str) -> u64 {
        let m = std::fs::read_to_string("/proc/meminfo").unwrap();
        m.lines().find_map(|l| l.strip_prefix(key).map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap())).unwrap()
    }

    /// `vm.nr_hugepages` set so that exactly `free` 2 MiB pages are free; the previous value
    /// is put back on drop. Fails (never skips) when the kernel will not give them.
    struct HugePool {
        prev: u64,
    }
    impl HugePool {
        fn with_free(free: u64) -> HugePool {
            assert_eq!(meminfo("Hugepagesize:"), 2048, "these tests need 2 MiB default huge pages");
            let prev: u64 = std::fs::read_to_string(NR_HUGEPAGES).unwrap().trim().parse().unwrap();
            let h = HugePool { prev };
            h.set_free(free);
            h
        }
        fn set_free(&self, free: u64) {
            let total = meminfo("HugePages_Total:");
            let in_use = total - meminfo("HugePages_Free:");
            std::fs::write(NR_HUGEPAGES, (in_use + free).to_string())
                .unwrap_or_else(|e| panic!("cannot write {NR_HUGEPAGES} (these tests need root): {e}"));
            assert_eq!(meminfo("HugePages_Free:"), free, "the kernel would not make exactly {free} huge pages free");
        }
    }
    impl Drop for HugePool {
        fn drop(&mut self) {
            let _ = std::fs::write(NR_HUGEPAGES, self.prev.to_string());
        }
    }

    fn punch(fd: BorrowedFd<'_>, offset: u64, len: u64) {
        use rustix::fs::FallocateFlags;
        rustix::fs::fallocate(fd, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, offset, len).unwrap();
    }

    /// Wait (briefly) for the handler's wake-up, then collect the faulted tags.
    fn faulted_tags() -> Vec<u64> {
        let _ = wait_for_faults(Duration::from_millis(200));
        take_faulted()
    }

    #[test]
    fn sealed_hugetlb_memfd_with_a_punched_hole_is_rescued_and_reported() {
        let _g = FAULT_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let pool = HugePool::with_free(2);
        // A client's MR memory: a hugetlb memfd sealed against shrinking and growing, which
        // the service used to map without a guard.
        let f = pmrxe_abi::client::memfd(c"client-huge", 2 * H as u64, H as u64, true).unwrap();
        assert!(sealed_against_shrink(f.as_fd()));
        assert_eq!(client_memory_page(f.as_fd()), Ok(H as u64));
        let m = MrMapping::assemble_at(0, &[MapPiece { fd: &f, offset: 0, len: 2 * H as u64, page: H as u64 }]).unwrap();
        const TAG: u64 = 0x5eed_0001;
        m.set_tag(TAG);
        // Populated at registration: both huge pages are taken now.
        assert_eq!(meminfo("HugePages_Free:"), 0, "registration did not populate the huge pages");
        // SAFETY: writes inside the view.
        unsafe {
            m.as_ptr().write_volatile(1);
            m.as_ptr().add(H).write_volatile(2);
        }
        // The attack: punch the second huge page out (it goes back to the pool), and take the
        // free page away (here by shrinking the pool: the same for the lcore).
        punch(f.as_fd(), H as u64, H as u64);
        pool.set_free(0);
        let before = FaultGuard::rescued();
        // SAFETY: raw accesses inside the view; the guard turns the SIGBUS into a fresh page.
        unsafe {
            assert_eq!(m.as_ptr().add(H + 100).read_volatile(), 0, "a rescued page reads zeros");
            m.as_ptr().add(H + 200).write_volatile(3);
            assert_eq!(m.as_ptr().read_volatile(), 1, "the page still in the file is untouched");
        }
        assert_eq!(FaultGuard::rescued(), before + 1, "one rescue replaces the whole huge page");
        assert_eq!(faulted_tags(), vec![TAG]);
        assert_eq!(take_faulted(), Vec::<u64>::new(), "reported once");
        drop(m);
        drop(pool);
    }

    #[test]
    fn service_segment_with_a_punched_hole_is_rescued_and_reported_with_its_owner() {
        let _g = FAULT_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let pool = HugePool::with_free(1);
        const OWNER: u64 = 0x5eed_0002;
        set_segment_owner(OWNER);
        // A ring the service creates and hands to a client: hugetlb when the length allows.
        let seg = Segment::create("ring", H).unwrap();
        set_segment_owner(0);
        assert_eq!(file_page_size(seg.fd()).unwrap(), H as u64, "the segment should be hugetlb-backed");
        // SAFETY: write inside the segment.
        unsafe { seg.as_ptr().write_volatile(7) };
        // The client (holding the fd) punches the page out; the pool has nothing to refill it.
        punch(seg.fd(), 0, H as u64);
        pool.set_free(0);
        // SAFETY: raw read inside the segment (the guard rescues it).
        assert_eq!(unsafe { seg.as_ptr().add(64).read_volatile() }, 0);
        assert_eq!(faulted_tags(), vec![OWNER]);
        // Re-tagging (the service names the client's object later) is what gets reported.
        seg.set_tag(OWNER + 1);
        punch(seg.fd(), 0, H as u64);
        // The rescued page is private now: touching it again does not fault.
        // SAFETY: as above.
        unsafe { seg.as_ptr().write_volatile(1) };
        assert_eq!(take_faulted(), Vec::<u64>::new());
        drop(seg);
        drop(pool);
    }

    #[test]
    fn only_shmem_and_hugetlbfs_files_are_client_memory() {
        let m = plain_memfd(4096);
        assert_eq!(client_memory_page(m.as_fd()), Ok(4096));
        // A file on the disk the tests run from (ext4/xfs/overlay here; never tmpfs).
        let dir = std::env::current_dir().unwrap();
        let path = dir.join(format!("target-shm-test-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let magic = rustix::fs::fstatfs(&file).unwrap().f_type as u32;
        assert_ne!(magic, TMPFS_MAGIC, "the test directory is on tmpfs: cannot test refusal here");
        let why = client_memory_page(file.as_fd()).unwrap_err();
        assert!(why.contains(fs_name(magic)) && why.contains("cannot be registered"), "{why}");
        // /dev/shm is tmpfs: accepted.
        if let Ok(shm) = std::fs::File::options().read(true).write(true).create(true).truncate(true).open("/dev/shm/pmrxe-shm-test") {
            let _ = std::fs::remove_file("/dev/shm/pmrxe-shm-test");
            assert_eq!(client_memory_page(shm.as_fd()), Ok(4096));
        }
    }

    #[test]
    fn guard_table_grows_past_one_chunk() {
        // Unmapped fake ranges: no other test may fault meanwhile.
        let _g = FAULT_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        // More live guards than one chunk holds (the old table's fixed limit was 4096).
        let n = GUARD_CHUNK + 10;
        let guards: Vec<FaultGuard> = (0..n).map(|i| FaultGuard::new(0x1000_0000 + i * 4096, 4096, 4096, i as u64).unwrap()).collect();
        assert!(GUARD_ALLOC.lock().unwrap().chunks >= 2);
        drop(guards);
    }
}
