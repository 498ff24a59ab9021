//! Service-side shared-memory segments: memfds the service creates (rings) or receives
//! (client memory), mapped `MAP_SHARED` into the service.
//!
//! Client memory arrives in two forms: memfds the shim made (sealed against shrinking) and
//! files that already backed the client's shared mappings (hugetlbfs, SysV SHM, memfds,
//! `MAP_SHARED` files), mapped as they are. Nobody can seal the second kind, so a client (or
//! anyone) that truncates such a file would make the lcore's next copy through it raise
//! SIGBUS. Mappings of unsealed files are therefore registered with a [`FaultGuard`]: a
//! SIGBUS inside one replaces the faulting page with anonymous memory (reads give zeros,
//! writes go nowhere) and the copy carries on — the Wayland `wl_shm` answer to the same
//! problem.
use rustix::fs::SealFlags;
use rustix::mm::{self, MapFlags, ProtFlags};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use pmrxe_abi::client::Mapping;

/// `statfs.f_type` of hugetlbfs (linux/magic.h).
const HUGETLBFS_MAGIC: u32 = 0x9584_58f6;
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

/// Whether `fd` is sealed against shrinking (a memfd with `F_SEAL_SHRINK`).
pub fn sealed_against_shrink(fd: BorrowedFd<'_>) -> bool {
    // EINVAL for files without seals.
    rustix::fs::fcntl_get_seals(fd).is_ok_and(|seals| seals.contains(SealFlags::SHRINK))
}

/// A mapped shared-memory segment (the client core's [`Mapping`] of its memfd). Unmapped on
/// drop; the fd closes with it.
pub struct Segment {
    fd: OwnedFd,
    map: Mapping,
}

impl Segment {
    /// Create a zero-filled memfd segment of `len` bytes (rounded up to a page), hugepage-backed
    /// when `len` is a multiple of 2 MiB and hugepages are free, else ordinary shared memory.
    pub fn create(name: &str, len: usize) -> io::Result<Segment> {
        let len = (len.max(1) + 4095) & !4095;
        let cname = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // Huge pages when the length allows and some are free, else ordinary shared memory.
        // Clients get this fd: it is sealed against resizing (a client that shrank it would
        // make the lcore's next access to the mapping raise SIGBUS and kill the service).
        let huge = if len.is_multiple_of(2 << 20) { pmrxe_abi::client::memfd(&cname, len as u64, 2 << 20, true).ok() } else { None };
        let fd = match huge {
            Some(fd) => fd,
            None => pmrxe_abi::client::memfd(&cname, len as u64, 0, true)?,
        };
        Segment::map(fd, len)
    }

    /// Map `len` bytes of a segment fd received from a client. The length is checked against
    /// the file size so a client cannot make us map past its end (SIGBUS).
    pub fn map(fd: OwnedFd, len: usize) -> io::Result<Segment> {
        let st = rustix::fs::fstat(&fd)?;
        if len == 0 || (st.st_size as u64) < len as u64 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "segment shorter than declared"));
        }
        let map = Mapping::map(fd.as_raw_fd(), 0, len, false)?;
        Ok(Segment { fd, map })
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
    /// The file can shrink under us (not sealed): map it under a [`FaultGuard`].
    pub guard: bool,
}

/// A contiguous service-side view of a client MR assembled from page-aligned pieces of
/// several segments (one map per MR). Unmapped on drop.
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
            pieces.iter().map(|&(fd, offset, len)| MapPiece { fd, offset, len, page: SMALL_PAGE, guard: false }).collect();
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
            if p.guard {
                m._guards.push(FaultGuard::new(addr as usize, map_len as usize, p.page as usize)?);
            }
            at += p.len;
        }
        Ok(m)
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

impl Drop for MrMapping {
    fn drop(&mut self) {
        // The guards go first (field order would drop them after the unmap).
        self._guards.clear();
        // SAFETY: unmapping our own reservation (and the pieces mapped into it).
        let _ = unsafe { mm::munmap(self.res.as_ptr().cast(), self.res_len) };
    }
}

/// Ranges of this process under SIGBUS protection, read lock-free by the signal handler.
struct GuardSlot {
    start: AtomicUsize,
    end: AtomicUsize,
    page: AtomicUsize,
}

const GUARD_SLOTS: usize = 4096;
static GUARDS: [GuardSlot; GUARD_SLOTS] =
    [const { GuardSlot { start: AtomicUsize::new(0), end: AtomicUsize::new(0), page: AtomicUsize::new(0) } }; GUARD_SLOTS];
/// Serialises slot allocation (control threads only; never taken in the handler).
static GUARD_ALLOC: Mutex<()> = Mutex::new(());
static GUARD_INSTALL: Once = Once::new();
static OLD_SIGBUS: OnceLock<OldAction> = OnceLock::new();
static RESCUED: AtomicU64 = AtomicU64::new(0);

struct OldAction(libc::sigaction);
// SAFETY: a plain C struct of integers and a function pointer, written once before use.
unsafe impl Sync for OldAction {}
// SAFETY: as above.
unsafe impl Send for OldAction {}

/// SIGBUS protection for `[start, start+len)`, a mapping of a file that may shrink: a fault
/// there replaces the faulting page (`page` bytes, aligned) with anonymous memory. Removed on
/// drop, which must happen before the range is unmapped.
pub struct FaultGuard {
    slot: usize,
}

impl FaultGuard {
    /// Protect a range (installs the process's SIGBUS handler on first use).
    pub fn new(start: usize, len: usize, page: usize) -> io::Result<FaultGuard> {
        GUARD_INSTALL.call_once(install_sigbus_handler);
        if OLD_SIGBUS.get().is_none() {
            return Err(io::Error::other("SIGBUS handler not installed"));
        }
        let _g = GUARD_ALLOC.lock().unwrap_or_else(|e| e.into_inner());
        let Some(slot) = GUARDS.iter().position(|s| s.start.load(Ordering::Relaxed) == 0) else {
            return Err(io::Error::other("too many guarded client mappings"));
        };
        let s = &GUARDS[slot];
        s.end.store(start + len, Ordering::Relaxed);
        s.page.store(page, Ordering::Relaxed);
        // Published last: the handler trusts end/page only after seeing start.
        s.start.store(start, Ordering::Release);
        Ok(FaultGuard { slot })
    }

    /// Faults rescued so far in this process (pages replaced after a client shrank a file).
    pub fn rescued() -> u64 {
        RESCUED.load(Ordering::Relaxed)
    }
}

impl Drop for FaultGuard {
    fn drop(&mut self) {
        GUARDS[self.slot].start.store(0, Ordering::Release);
    }
}

fn install_sigbus_handler() {
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

/// The SIGBUS handler: async-signal-safe (atomic loads, mmap, sigaction only).
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in GUARDS.iter() {
        let start = s.start.load(Ordering::Acquire);
        if start == 0 || addr < start {
            continue;
        }
        let (end, page) = (s.end.load(Ordering::Relaxed), s.page.load(Ordering::Relaxed));
        if addr >= end || s.start.load(Ordering::Acquire) != start || page == 0 {
            continue;
        }
        let p = addr & !(page - 1);
        // SAFETY: replaces one page of a guarded service mapping of a client file (which only
        // raw copies access) with private anonymous memory; the range stays mapped until its
        // MrMapping unmaps the whole reservation.
        // (rustix issues the raw system call: async-signal-safe, errno untouched.)
        let r = unsafe { mm::mmap_anonymous(p as *mut core::ffi::c_void, page, ProtFlags::READ | ProtFlags::WRITE, MapFlags::PRIVATE | MapFlags::FIXED) };
        if r.is_ok() {
            RESCUED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        break;
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
            MapPiece { fd: &f, offset: H + 3 * 4096, len: H - 3 * 4096, page: H, guard: false },
            MapPiece { fd: &g, offset: 0, len: 4096, page: 4096, guard: false },
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
            MapPiece { fd: &g, offset: 0, len: 4096, page: 4096, guard: false },
            MapPiece { fd: &f, offset: H + 4096, len: 4096, page: H, guard: false },
        ];
        assert!(MrMapping::assemble_at(span - 4096, &bad).is_err());
        // ... and its client address must match its file offset modulo the page size.
        assert!(MrMapping::assemble_at(span + 4096, &pieces).is_err());
    }

    #[test]
    fn shrinking_a_guarded_file_does_not_kill_the_service() {
        let f = plain_memfd(4 * 4096);
        let m = MrMapping::assemble_at(0, &[MapPiece { fd: &f, offset: 0, len: 4 * 4096, page: 4096, guard: true }]).unwrap();
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
        let mut b = [0u8];
        assert_eq!(rustix::io::pread(&f, &mut b, 0).unwrap(), 1);
        assert_eq!(b[0], 4);
    }
}
