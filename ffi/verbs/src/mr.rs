//! Memory registration, FreeFlow style.
//!
//! The service can only read and write application memory that it maps too. For every span of
//! the registration not already covered by a live segment of this process, what backs it
//! decides (`/proc/self/maps`, [`crate::vma`]):
//!
//! * **Already shareable** — a `MAP_SHARED` mapping of a file: hugetlbfs, memfd, SysV SHM
//!   (`/SYSV…`), a tmpfs file, shared anonymous memory. The file itself goes to the service
//!   (`AddSharedSegment`, with the file offset): no copy, the same pages, huge pages stay huge
//!   in the service's mapping. The segment is the whole mapping (clipped to its neighbours).
//!   A shared mapping of a file on any other filesystem (FUSE, NFS, a disk) is refused with
//!   EFAULT and a message on stderr, as the kernel refuses to pin it (issue 37: a page fault
//!   there could block the service's data plane).
//! * **Private** (anonymous, heap, stack, private file mappings): we create a memfd, copy the
//!   current bytes into it, and `mremap` its mapping over the application's pages
//!   (`MREMAP_FIXED` replaces the old private pages atomically). The application's pointer
//!   keeps working and keeps its contents; the memfd goes to the service (`AddSegment`). Private
//!   hugetlb memory (`MAP_HUGETLB`) is handled in whole huge pages, with a hugetlb memfd.
//!
//! `RegMr` then names the pieces.
//!
//! Invariants of [`Segments`]:
//! * segments never overlap and are page aligned (to the huge page size for hugetlb memory);
//! * `refs` counts the MRs (and fast-reg mappings) whose pieces use the segment; at 0 the
//!   segment is released to the service and forgotten (its pages stay memfd-backed, which is
//!   harmless; a later registration of those pages makes a fresh segment from the current
//!   contents).
use crate::boundary::{ffi_boundary, handle, ret_errno, ret_ptr, set_errno, Errno, Handle, Res};
use crate::client::{self, Client};
use crate::pd::ShimPd;
use crate::sys::*;
use pmrxe_abi::ctrl::{Piece, Request, Response};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::raw::{c_int, c_uint, c_void};
use std::sync::Mutex;

/// Page size assumed for segments.
pub const PAGE: u64 = 4096;
const HUGE: u64 = 2 << 20;

/// Where new segments are announced (the service, or a test double).
pub trait SegmentSink {
    /// `AddSegment` with the memfd as fd 0.
    fn add_segment(&self, seg: u64, base: u64, len: u64, fd: RawFd) -> Res<()>;
    /// `AddSharedSegment`: fd 0 backs `base..base+len` from file offset `offset`.
    fn add_shared_segment(&self, seg: u64, base: u64, len: u64, offset: u64, fd: RawFd) -> Res<()>;
    /// `ReleaseSegment`.
    fn release_segment(&self, seg: u64) -> Res<()>;
}

impl SegmentSink for Client {
    fn add_segment(&self, seg: u64, base: u64, len: u64, fd: RawFd) -> Res<()> {
        match self.call(&Request::AddSegment { seg, base, len }, &[fd])?.0 {
            Response::Ok => Ok(()),
            _ => Err(Errno(libc::EPROTO)),
        }
    }
    fn add_shared_segment(&self, seg: u64, base: u64, len: u64, offset: u64, fd: RawFd) -> Res<()> {
        match self.call(&Request::AddSharedSegment { seg, base, len, offset }, &[fd])?.0 {
            Response::Ok => Ok(()),
            _ => Err(Errno(libc::EPROTO)),
        }
    }
    fn release_segment(&self, seg: u64) -> Res<()> {
        self.call_ok(&Request::ReleaseSegment { seg })
    }
}

#[derive(Debug)]
struct Seg {
    id: u64,
    len: u64,
    refs: u32,
}

/// The live segments of this process, by base address.
#[derive(Debug, Default)]
pub struct Segments {
    by_base: BTreeMap<u64, Seg>,
    next_id: u64,
}

/// The process-wide segment table.
pub static SEGMENTS: Mutex<Segments> = Mutex::new(Segments { by_base: BTreeMap::new(), next_id: 1 });

/// The page-aligned span `[start, end)` of `addr..addr+len`; EINVAL on zero length or overflow.
pub fn page_span(addr: u64, len: u64) -> Res<(u64, u64)> {
    if len == 0 || addr == 0 {
        return Err(Errno::INVAL);
    }
    let end = addr.checked_add(len).ok_or(Errno::INVAL)?;
    let end = end.checked_add(PAGE - 1).ok_or(Errno::INVAL)? & !(PAGE - 1);
    Ok((addr & !(PAGE - 1), end))
}

impl Segments {
    /// Cover `addr..addr+len` with segments (creating and announcing the missing ones) and
    /// take one reference on each segment used. Returns the pieces in address order and the
    /// segment ids referenced (each once).
    pub fn cover(&mut self, sink: &dyn SegmentSink, addr: u64, len: u64) -> Res<(Vec<Piece>, Vec<u64>)> {
        let (start, end) = page_span(addr, len)?;
        let mut pieces = Vec::new();
        let mut ids: Vec<u64> = Vec::new();
        let mut cur = start;
        let r = (|| {
            while cur < end {
                // A segment containing `cur`?
                let hit = self.by_base.range(..=cur).next_back().filter(|(b, s)| **b + s.len > cur).map(|(b, s)| (*b, s.id, s.len));
                let (base, id, seg_len) = match hit {
                    Some(h) => h,
                    None => {
                        // A gap: up to the next segment or the end.
                        let gap_end = self.by_base.range(cur..).next().map(|(b, _)| (*b).min(end)).unwrap_or(end);
                        self.new_segment(sink, cur, gap_end)?
                    }
                };
                let piece_end = (base + seg_len).min(end);
                pieces.push(Piece { seg: id, seg_offset: cur - base, len: piece_end - cur });
                if !ids.contains(&id) {
                    ids.push(id);
                    let s = self.by_base.get_mut(&base).expect("segment just found");
                    s.refs += 1;
                    if s.refs == 1 {
                        // A new segment: fork protection (crate::fork) before it is used.
                        crate::fork::segment_added(base, s.len)?;
                    }
                }
                cur = piece_end;
            }
            Ok(())
        })();
        match r {
            Ok(()) => Ok((pieces, ids)),
            Err(e) => {
                self.release(sink, &ids);
                Err(e)
            }
        }
    }

    /// Create and announce the segment for the gap `[cur, gap_end)` (no live segment there)
    /// that contains `cur`; it may end before `gap_end` (where the kind of memory changes) or
    /// extend around the gap (a whole shared mapping, whole huge pages), never over another
    /// segment. Returns (base, id, len).
    fn new_segment(&mut self, sink: &dyn SegmentSink, cur: u64, gap_end: u64) -> Res<(u64, u64, u64)> {
        // Room the segment may take: between the neighbouring segments.
        let prev_end = self.by_base.range(..cur).next_back().map(|(b, s)| b + s.len).unwrap_or(0);
        let next_base = self.by_base.range(cur..).next().map(|(b, _)| *b).unwrap_or(u64::MAX);
        let vmas = crate::vma::read(cur, gap_end)?;
        let Some(first) = vmas.first().filter(|v| v.start <= cur) else { return Err(Errno(libc::EFAULT)) };
        let id = self.next_id;
        let backing = if first.shared && first.has_file() {
            match crate::vma::open_backing(first) {
                Ok(fd) => Some(fd),
                // Pages of one of our own released segments, whose memfd we no longer hold
                // (not root): nobody else shares them, so a fresh copy is as good.
                Err(_) if first.path.starts_with(OWN_MEMFD_PATH) => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let (base, len) = if let Some(fd) = backing {
            // Already shareable: hand over the file, no copy — if its pages can never block or
            // vanish under the service (issue 37); otherwise refuse, as the kernel refuses to
            // pin such a mapping, rather than copy (that would break the sharing).
            if let Err(why) = crate::vma::registrable(&fd) {
                eprintln!("pmrxe-verbs: ibv_reg_mr: cannot register {:#x}..{:#x} ({}): {why} (EFAULT)", first.start, first.end, first.path);
                return Err(Errno(libc::EFAULT));
            }
            let page = crate::vma::fd_page_size(&fd)?;
            let (lo, hi) = (first.start.max(prev_end), first.end.min(next_base));
            if lo % page != 0 || hi % page != 0 {
                return Err(Errno::INVAL);
            }
            let offset = first.offset + (lo - first.start);
            sink.add_shared_segment(id, lo, hi - lo, offset, fd.as_raw_fd())?;
            (lo, hi - lo)
        } else {
            // Private memory: a run of adjacent private mappings with the same page size.
            let page = crate::vma::page_size(first);
            let mut run_end = first.end;
            for v in &vmas[1..] {
                if v.start != run_end || v.shared || first.shared || crate::vma::page_size(v) != page {
                    break;
                }
                run_end = v.end;
            }
            let (mut lo, mut hi) = (cur, gap_end.min(run_end));
            if page > PAGE {
                // Whole huge pages (hugetlb mappings split only there); they cannot collide
                // with a neighbour, whose bounds in hugetlb memory are huge aligned too.
                lo &= !(page - 1);
                hi = hi.checked_next_multiple_of(page).ok_or(Errno::INVAL)?;
                if lo < prev_end || hi > next_base || lo < first.start || hi > run_end {
                    return Err(Errno::INVAL);
                }
            }
            let fd = share_pages(lo, hi - lo, page)?;
            sink.add_segment(id, lo, hi - lo, fd.as_raw_fd())?;
            (lo, hi - lo)
        };
        self.next_id += 1;
        self.by_base.insert(base, Seg { id, len, refs: 0 });
        Ok((base, id, len))
    }

    /// Drop one reference on each segment; release those that reach zero.
    pub fn release(&mut self, sink: &dyn SegmentSink, ids: &[u64]) {
        for id in ids {
            let Some((&base, s)) = self.by_base.iter_mut().find(|(_, s)| s.id == *id) else { continue };
            s.refs = s.refs.saturating_sub(1);
            if s.refs == 0 {
                crate::fork::segment_released(base, s.len);
                self.by_base.remove(&base);
                // Best effort: the service also drops segments when the client goes away.
                let _ = sink.release_segment(*id);
            }
        }
    }

    /// Live segments as (id, base, len, refs), for tests and debugging.
    pub fn snapshot(&self) -> Vec<(u64, u64, u64, u32)> {
        self.by_base.iter().map(|(b, s)| (s.id, *b, s.len, s.refs)).collect()
    }
}

/// How our own memfds appear in /proc/self/maps.
const OWN_MEMFD_PATH: &str = "/memfd:pmrxe-mr";

/// A memfd of `len` bytes; `huge`: a hugetlb memfd with pages of `huge` bytes (0: 4 KiB pages).
/// Sealable, not sealed: the service seals it against shrinking on `AddSegment`.
fn memfd(len: u64, huge: u64) -> Res<OwnedFd> {
    pmrxe_abi::client::memfd(c"pmrxe-mr", len, if huge > PAGE { huge } else { 0 }, false).map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::ENOMEM)))
}

/// Make the application pages `base..base+len` (aligned to `page`, the mapping's page size)
/// memfd-backed, keeping their contents, and return the memfd.
///
/// Huge pages first: a hugetlb memfd of the mapping's page size for hugetlb memory (the old
/// huge pages are freed by the remap, so the copy needs that many free ones for a moment),
/// 2 MiB ones for any 2 MiB aligned span; ordinary pages otherwise or when none are free
/// (a hugetlb range is replaced whole, so ordinary pages fit too).
fn share_pages(base: u64, len: u64, page: u64) -> Res<OwnedFd> {
    // The range must be mapped (msync fails with ENOMEM on holes); PROT_NONE pages are the
    // caller's bug (README: limits).
    // SAFETY: msync with MS_ASYNC only inspects the mappings.
    if unsafe { libc::msync(base as *mut c_void, len as usize, libc::MS_ASYNC) } != 0 {
        return Err(Errno(libc::EFAULT));
    }
    let huge = if page > PAGE { page } else if base & (HUGE - 1) == 0 && len & (HUGE - 1) == 0 { HUGE } else { 0 };
    let attempts: &[u64] = if huge != 0 { &[huge, 0] } else { &[0] };
    let mut last = Errno::NOMEM;
    for &h in attempts {
        let fd = match memfd(len, h) {
            Ok(fd) => fd,
            Err(e) => {
                last = e;
                continue;
            }
        };
        // SAFETY: a fresh shared mapping of our memfd at a kernel-chosen address.
        let tmp = unsafe {
            libc::mmap(std::ptr::null_mut(), len as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_POPULATE, fd.as_raw_fd(), 0)
        };
        if tmp == libc::MAP_FAILED {
            last = Errno::last();
            continue;
        }
        // SAFETY: `base..base+len` is mapped (msync above) and readable (README contract);
        // `tmp` is our fresh mapping of the same length; they cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(base as *const u8, tmp.cast::<u8>(), len as usize) };
        // The raw system call, not libc's mremap: a preloaded hook may intercept the libc symbol
        // (UCX 1.13's memory hooks do, and drop the 5th argument, so MREMAP_FIXED would move
        // our pages to a wrong address: PLATFORM.md §8).
        // SAFETY: moves our mapping over the application's pages; MREMAP_FIXED unmaps what
        // was there first. The contents are identical, so the application sees no change.
        let r = unsafe {
            libc::syscall(libc::SYS_mremap, tmp, len as usize, len as usize, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, base as *mut c_void)
        };
        if r == -1 {
            last = Errno::last();
            // SAFETY: `tmp` is still our mapping.
            unsafe { libc::munmap(tmp, len as usize) };
            continue;
        }
        // MREMAP_FIXED either moves to `base` or fails; anything else would be a kernel bug.
        debug_assert_eq!(r as u64, base, "mremap(MREMAP_FIXED) moved elsewhere");
        return Ok(fd);
    }
    Err(last)
}

/// An MR handle (also used by pmrxedv fast-registration MRs).
///
/// One MR may be used by several application threads at once (posting with its keys on one,
/// `pmrxedv_update_fast_reg_key` or `ibv_rereg_mr` on another), so the shim only holds
/// `&ShimMr`: what changes after creation is the C struct (keys, address, length: the
/// application reads them, so it lives in an `UnsafeCell`, copied out by [`ShimMr::mr`] and
/// rewritten only by [`ShimMr::update`]) and [`MrState`], behind a mutex.
#[repr(C)]
pub struct ShimMr {
    mr: std::cell::UnsafeCell<ibv_mr>,
    magic: u64,
    /// Fast-registration MR (pmrxedv_alloc_mr).
    pub fast: bool,
    pub max_num_sg: u32,
    state: Mutex<MrState>,
}
handle!(ShimMr, ibv_mr, 0x504d_5845_4d52_3031);

/// What an MR changes after creation besides its C struct (under [`ShimMr`]'s mutex, which
/// also serialises the shim's writes of the C struct).
#[derive(Debug, Default)]
pub struct MrState {
    /// Segment references held by this MR.
    pub segs: Vec<u64>,
    /// The access flags registered (ibv_mr does not carry them; ibv_rereg_mr needs them).
    pub access: u32,
}

impl ShimMr {
    /// An MR handle over `mr` holding `segs` (registered with `access`).
    pub fn new(mr: ibv_mr, fast: bool, max_num_sg: u32, segs: Vec<u64>, access: u32) -> Box<ShimMr> {
        Box::new(ShimMr { mr: std::cell::UnsafeCell::new(mr), magic: ShimMr::MAGIC, fast, max_num_sg, state: Mutex::new(MrState { segs, access }) })
    }

    /// A fast-registration MR (pmrxedv) with no segments yet.
    pub fn new_fast(mr: ibv_mr, max_num_sg: u32) -> Box<ShimMr> {
        ShimMr::new(mr, true, max_num_sg, Vec::new(), 0)
    }

    /// A copy of the C struct (keys, address, length as last set).
    pub fn mr(&self) -> ibv_mr {
        // SAFETY: our allocation inside the UnsafeCell, copied out through a raw pointer (no
        // reference to memory the application may write); the shim writes it only in
        // `update`, so a torn copy needs the application to race its own key update.
        unsafe { self.mr.get().read_volatile() }
    }

    /// Change the C struct and the state together, under the MR's mutex.
    pub fn update<R>(&self, f: impl FnOnce(&mut ibv_mr, &mut MrState) -> R) -> R {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut mr = self.mr();
        let r = f(&mut mr, &mut st);
        // SAFETY: as in `mr`: written back through the raw pointer, serialised with every
        // other shim write by the mutex held here.
        unsafe { self.mr.get().write_volatile(mr) };
        r
    }
}

/// Access bits the service is told about (the optional range may be ignored by a provider).
fn required_access(access: c_uint) -> u32 {
    // IBV_ACCESS_OPTIONAL_RANGE (verbs_api.h): bits 20..29.
    const OPTIONAL_RANGE: u32 = 0x3ff0_0000;
    access & !OPTIONAL_RANGE
}

/// Register `addr..addr+len` (a new MR, or `rereg`: the same key with a new description).
fn register(sink: &Client, pd: &ShimPd, addr: u64, len: u64, iova: u64, access: u32, rereg: Option<u32>) -> Res<(u32, Vec<u64>)> {
    if access & IBV_ACCESS_ON_DEMAND != 0 {
        return Err(Errno::OPNOTSUPP);
    }
    // Remote write/atomic require local write (IBTA o10-37).
    if access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0 && access & IBV_ACCESS_LOCAL_WRITE == 0 {
        return Err(Errno::INVAL);
    }
    let mut segs = SEGMENTS.lock().unwrap_or_else(|e| e.into_inner());
    let (pieces, ids) = segs.cover(sink, addr, len)?;
    let req = match rereg {
        None => Request::RegMr { pd: pd.pd.handle, addr, len, iova, access, pieces },
        Some(key) => Request::ReregMr { key, pd: pd.pd.handle, addr, len, iova, access, pieces },
    };
    let r = sink.call(&req, &[]);
    match r {
        Ok((Response::Mr { key }, _)) => Ok((key, ids)),
        Ok(_) => {
            segs.release(sink, &ids);
            Err(Errno(libc::EPROTO))
        }
        Err(e) => {
            segs.release(sink, &ids);
            Err(e)
        }
    }
}

fn reg(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_uint) -> Res<*mut ibv_mr> {
    // SAFETY: magic-checked.
    let p = unsafe { ShimPd::from_c(pd) }?;
    let c = client::existing()?;
    let access = required_access(access);
    let (key, segs) = register(c, p, addr as u64, length as u64, iova, access, None)?;
    let mr = ibv_mr { context: p.pd.context, pd, addr, length, handle: key, lkey: key, rkey: key };
    Ok(ShimMr::new(mr, false, 0, segs, access).into_c())
}

/// # Safety
/// `pd` is ours; `addr..addr+length` is mapped, readable application memory.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
    ffi_boundary(std::ptr::null_mut(), || ret_ptr(reg(pd, addr, length, addr as u64, access as c_uint)))
}

/// # Safety
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_uint) -> *mut ibv_mr {
    ffi_boundary(std::ptr::null_mut(), || ret_ptr(reg(pd, addr, length, iova, access)))
}

/// # Safety
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_int) -> *mut ibv_mr {
    ffi_boundary(std::ptr::null_mut(), || ret_ptr(reg(pd, addr, length, iova, access as c_uint)))
}

/// Release an MR's key and its segment references.
pub fn dereg(m: &ShimMr) -> Res<()> {
    let c = client::existing()?;
    // The key the MR was created with (a fast-reg MR's lkey changes with its key byte).
    c.call_ok(&Request::DeregMr { key: m.mr().handle })?;
    let ids = m.update(|_, st| std::mem::take(&mut st.segs));
    SEGMENTS.lock().unwrap_or_else(|e| e.into_inner()).release(c, &ids);
    Ok(())
}

/// # Safety
/// `mr` is ours; the application no longer uses it.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let m = unsafe { ShimMr::from_c(mr) }?;
            dereg(m)?;
            // SAFETY: validated above.
            drop(unsafe { ShimMr::take(mr) });
            Ok(())
        })())
    })
}

/// `ibv_rereg_mr`: supported as "register the new description, then drop the old one", all
/// three flags (translation, PD, access). The keys change (README). On failure the old MR is
/// untouched and `IBV_REREG_MR_ERR_CMD` is returned with errno set.
///
/// # Safety
/// `mr` is ours; `pd` is ours when `IBV_REREG_MR_CHANGE_PD`; the new range is mapped memory.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(mr: *mut ibv_mr, flags: c_int, pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> c_int {
    ffi_boundary(IBV_REREG_MR_ERR_INPUT, || {
        // SAFETY: magic-checked.
        let Ok(m) = (unsafe { ShimMr::from_c(mr) }) else {
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        };
        if flags as u32 & !IBV_REREG_MR_FLAGS_SUPPORTED != 0 || flags == 0 || m.fast {
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        }
        let cur = m.mr();
        let new_pd = if flags as u32 & IBV_REREG_MR_CHANGE_PD != 0 { pd } else { cur.pd };
        let (new_addr, new_len) =
            if flags as u32 & IBV_REREG_MR_CHANGE_TRANSLATION != 0 { (addr, length) } else { (cur.addr, cur.length) };
        let old_access = m.update(|_, st| st.access);
        let new_access = if flags as u32 & IBV_REREG_MR_CHANGE_ACCESS != 0 { required_access(access as c_uint) } else { old_access };
        // The keys stay (as mlx5; rxe for PD/access): the service changes the MR in place.
        // Segments of the new translation are referenced before the old ones are released.
        let r = (|| {
            // SAFETY: magic-checked.
            let p = unsafe { ShimPd::from_c(new_pd) }?;
            let c = client::existing()?;
            let key = cur.lkey;
            let iova = if flags as u32 & IBV_REREG_MR_CHANGE_TRANSLATION != 0 { new_addr as u64 } else { cur.addr as u64 };
            let (_, segs) = register(c, p, new_addr as u64, new_len as u64, iova, new_access, Some(key))?;
            let old = m.update(|mr, st| {
                *mr = ibv_mr { context: p.pd.context, pd: new_pd, addr: new_addr, length: new_len, handle: key, lkey: key, rkey: key };
                st.access = new_access;
                std::mem::replace(&mut st.segs, segs)
            });
            SEGMENTS.lock().unwrap_or_else(|e| e.into_inner()).release(c, &old);
            Ok(())
        })();
        match r {
            Ok(()) => 0,
            Err(Errno(e)) => {
                set_errno(e);
                IBV_REREG_MR_ERR_CMD
            }
        }
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::fd::FromRawFd;
    use crate::boundary::Mapping;
    use std::cell::RefCell;

    /// An in-process stand-in for the service side of AddSegment/ReleaseSegment: it maps every
    /// received memfd, exactly as the service does, so the test exercises our remap for real.
    #[derive(Default)]
    pub struct FakeService {
        pub maps: RefCell<BTreeMap<u64, (u64, Mapping)>>,
        pub released: RefCell<Vec<u64>>,
        /// Segments announced with AddSharedSegment (no copy).
        pub shared: RefCell<Vec<u64>>,
    }
    impl SegmentSink for FakeService {
        fn add_segment(&self, seg: u64, base: u64, len: u64, fd: RawFd) -> Res<()> {
            let m = Mapping::map_fd(fd, len as usize)?;
            self.maps.borrow_mut().insert(seg, (base, m));
            Ok(())
        }
        fn add_shared_segment(&self, seg: u64, base: u64, len: u64, offset: u64, fd: RawFd) -> Res<()> {
            let m = Mapping::map(fd, offset, len as usize, false)?;
            self.maps.borrow_mut().insert(seg, (base, m));
            self.shared.borrow_mut().push(seg);
            Ok(())
        }
        fn release_segment(&self, seg: u64) -> Res<()> {
            self.maps.borrow_mut().remove(&seg);
            self.released.borrow_mut().push(seg);
            Ok(())
        }
    }

    /// Service-side view of client address `a` through the segment mappings.
    fn peer_ptr(f: &FakeService, a: u64) -> *mut u8 {
        let maps = f.maps.borrow();
        let (_, (base, m)) = maps.iter().find(|(_, (b, m))| a >= *b && a < *b + m.len() as u64).expect("address not shared");
        // SAFETY: in range of the mapping (checked by find).
        unsafe { m.ptr().add((a - base) as usize) }
    }

    #[test]
    fn unaligned_malloc_buffer_keeps_contents_and_is_shared_both_ways() {
        let f = FakeService::default();
        let mut segs = Segments { by_base: BTreeMap::new(), next_id: 1 };
        let mut buf = vec![0u8; 10_000];
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let addr = buf.as_ptr() as u64 + 3;
        let (pieces, ids) = segs.cover(&f, addr, 9000).unwrap();
        let (start, end) = page_span(addr, 9000).unwrap();
        // One segment, or more when a test running beside this one registered heap pages next
        // to `buf` (then already shared, which the span reuses as is).
        assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), end - start, "{pieces:?}");
        assert!(ids.len() == 1 || !f.shared.borrow().is_empty(), "{pieces:?}");
        // Contents preserved, including bytes outside the registration on the same pages.
        for (i, b) in buf.iter().enumerate() {
            assert_eq!(*b, (i * 7) as u8, "byte {i}");
        }
        // The peer writes through its own mapping; the application sees it, and vice versa.
        // SAFETY: peer_ptr returns a pointer inside a live shared mapping.
        unsafe { *peer_ptr(&f, addr + 100) = 0xAB };
        assert_eq!(buf[103], 0xAB);
        buf[500] = 0xCD;
        // SAFETY: as above.
        assert_eq!(unsafe { *peer_ptr(&f, buf.as_ptr() as u64 + 500) }, 0xCD);
        segs.release(&f, &ids);
        assert_eq!(*f.released.borrow(), ids);
        // Pages stay usable after release.
        buf[0] = 1;
        assert_eq!(buf[103], 0xAB);
    }

    #[test]
    fn overlapping_registrations_reuse_segments_and_refcount() {
        let f = FakeService::default();
        let mut segs = Segments { by_base: BTreeMap::new(), next_id: 1 };
        let layout = std::alloc::Layout::from_size_align(16 * 4096, 4096).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) } as u64;
        // A: pages 2..6; B: pages 4..10 (overlaps A, extends past it); C: page 3 only.
        let (pa, ia) = segs.cover(&f, p + 2 * 4096, 4 * 4096).unwrap();
        assert_eq!(pa.len(), 1);
        let (pb, ib) = segs.cover(&f, p + 4 * 4096 + 10, 6 * 4096 - 10).unwrap();
        assert_eq!(pb.len(), 2, "{pb:?}");
        assert_eq!(pb[0], Piece { seg: ia[0], seg_offset: 2 * 4096, len: 2 * 4096 });
        assert_eq!(pb[1].seg_offset, 0);
        assert_eq!(pb[1].len, 4 * 4096);
        assert_eq!(ib.len(), 2);
        let (pc, ic) = segs.cover(&f, p + 3 * 4096, 1).unwrap();
        assert_eq!(pc, vec![Piece { seg: ia[0], seg_offset: 4096, len: 4096 }]);
        // A's segment: refs A, B, C.
        assert_eq!(segs.snapshot().iter().find(|s| s.0 == ia[0]).unwrap().3, 3);
        segs.release(&f, &ia);
        segs.release(&f, &ic);
        assert!(f.released.borrow().is_empty());
        segs.release(&f, &ib);
        assert_eq!(f.released.borrow().len(), 2);
        assert!(segs.snapshot().is_empty());
        // Re-registering the same pages makes a fresh segment from the current contents.
        // SAFETY: inside our allocation.
        unsafe { *((p + 2 * 4096) as *mut u8) = 42 };
        let (_, id2) = segs.cover(&f, p + 2 * 4096, 100).unwrap();
        // SAFETY: shared mapping pointer.
        assert_eq!(unsafe { *peer_ptr(&f, p + 2 * 4096) }, 42);
        segs.release(&f, &id2);
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(p as *mut u8, layout) };
    }

    #[test]
    fn bad_ranges_are_einval_or_efault() {
        let f = FakeService::default();
        let mut segs = Segments { by_base: BTreeMap::new(), next_id: 1 };
        assert_eq!(segs.cover(&f, 0x1000, 0).unwrap_err(), Errno::INVAL);
        assert_eq!(segs.cover(&f, 0, 10).unwrap_err(), Errno::INVAL);
        assert_eq!(segs.cover(&f, u64::MAX - 10, 100).unwrap_err(), Errno::INVAL);
        // An unmapped range (low addresses are never mapped).
        assert_eq!(segs.cover(&f, 0x10000, 4096).unwrap_err(), Errno(libc::EFAULT));
        assert!(segs.snapshot().is_empty());
    }

    /// The mapping (from /proc/self/maps) that contains `a`.
    fn vma_at(a: u64) -> crate::vma::Vma {
        crate::vma::read(a, a + 1).unwrap().into_iter().next().expect("mapped")
    }

    /// Register `len` bytes at `addr` of an already-shared mapping and check that it was handed
    /// over as it is: an AddSharedSegment for the whole mapping, the application's mapping
    /// untouched (same file, same offset), and the same pages on both sides.
    fn check_shared_as_is(map: u64, map_len: u64, addr: u64, len: u64) {
        let f = FakeService::default();
        let mut segs = Segments { by_base: BTreeMap::new(), next_id: 1 };
        let before = vma_at(addr);
        let (pieces, ids) = segs.cover(&f, addr, len).unwrap();
        assert_eq!(*f.shared.borrow(), ids, "not announced as a shared segment: {before:?} {:?}", crate::vma::open_backing(&before).map(|_| ()));
        assert_eq!(segs.snapshot(), vec![(ids[0], map, map_len, 1)], "the segment is the whole mapping");
        let (start, end) = page_span(addr, len).unwrap();
        assert_eq!(pieces, vec![Piece { seg: ids[0], seg_offset: start - map, len: end - start }]);
        assert_eq!(vma_at(addr), before, "the application's mapping was replaced");
        // SAFETY: `addr` is inside the live registered mapping; peer_ptr points into the fake
        // service's own mapping of the same file.
        unsafe {
            *(addr as *mut u8) = 0x5A;
            assert_eq!(*peer_ptr(&f, addr), 0x5A, "app write not seen by the service");
            *peer_ptr(&f, addr + len - 1) = 0xA5;
            assert_eq!(*((addr + len - 1) as *const u8), 0xA5, "service write not seen by the app");
        }
        segs.release(&f, &ids);
        assert_eq!(*f.released.borrow(), ids);
    }

    #[test]
    fn shared_memfd_mapping_is_shared_as_is_at_its_file_offset() {
        // SAFETY: memfd_create with a static name (no sealing allowed: like an app's memfd).
        let raw = unsafe { libc::memfd_create(c"app-memfd".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscalls on our fd; the mapping starts at file offset 2 pages.
        let p = unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), 8 * PAGE as i64), 0);
            libc::mmap(std::ptr::null_mut(), 4 * PAGE as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 2 * PAGE as i64)
        };
        assert_ne!(p, libc::MAP_FAILED);
        let a = p as u64;
        // Bytes written through a second view of the file at offset 2 pages + 100 show the
        // file offset was honoured.
        // SAFETY: inside our 4-page mapping.
        unsafe { *((a + 100) as *mut u8) = 7 };
        check_shared_as_is(a, 4 * PAGE, a + PAGE + 10, 2 * PAGE);
        let mut b = 0u8;
        // SAFETY: pread into a local byte from our fd.
        let n = unsafe { libc::pread(fd.as_raw_fd(), (&mut b as *mut u8).cast(), 1, 2 * PAGE as i64 + 100) };
        assert_eq!(n, 1);
        assert_eq!(b, 7);
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(p, 4 * PAGE as usize) };
    }

    #[test]
    fn shared_anonymous_and_shared_file_mappings_are_shared_as_is() {
        let len = 3 * PAGE as usize;
        // SAFETY: fresh shared anonymous mapping.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        // Shared anonymous memory is an unlinked shmem file: only /proc/self/map_files reaches
        // it, which needs CAP_SYS_ADMIN.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            check_shared_as_is(p as u64, len as u64, p as u64 + 5, 100);
        } else {
            let f = FakeService::default();
            let mut segs = Segments { by_base: BTreeMap::new(), next_id: 1 };
            assert_eq!(segs.cover(&f, p as u64 + 5, 100).unwrap_err(), Errno(libc::EPERM), "never copied away from its sharers");
        }
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(p, len) };

        // A tmpfs file mapped MAP_SHARED (found by path, or through map_files as root). A disk
        // file is refused since issue 37 (tests/security_memory.rs checks that end to end).
        let path = std::path::Path::new("/dev/shm").join(format!("pmrxe-mr-test-{}", std::process::id()));
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        file.set_len(len as u64 + 123).unwrap(); // the last page is partial
        // SAFETY: fresh shared mapping of our file.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len + PAGE as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        assert_ne!(p, libc::MAP_FAILED);
        check_shared_as_is(p as u64, len as u64 + PAGE, p as u64 + PAGE, 2 * PAGE);
        let _ = std::fs::remove_file(&path);
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(p, len + PAGE as usize) };
    }

    #[test]
    fn sysv_shm_is_shared_as_is() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("sysv_shm_is_shared_as_is: needs root (/proc/self/map_files); not run");
            return;
        }
        let len = 4 * PAGE as usize;
        // SAFETY: plain SysV calls; the segment is removed at once (freed on the last detach).
        let p = unsafe {
            let id = libc::shmget(libc::IPC_PRIVATE, len, libc::IPC_CREAT | 0o600);
            assert!(id >= 0);
            let p = libc::shmat(id, std::ptr::null(), 0);
            assert_eq!(libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()), 0);
            p
        };
        assert_ne!(p as isize, -1);
        assert!(vma_at(p as u64).path.starts_with("/SYSV"), "{:?}", vma_at(p as u64));
        check_shared_as_is(p as u64, len as u64, p as u64 + 2 * PAGE + 1, PAGE);
        // SAFETY: detaching our attachment.
        unsafe { libc::shmdt(p) };
    }

    #[test]
    fn registration_across_private_and_shared_mappings_splits_by_kind() {
        // One reservation: page 0..2 private anonymous, 2..4 a shared memfd, 4..6 private again.
        let total = 6 * PAGE as usize;
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), total, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) } as u64;
        assert_ne!(p as *mut c_void, libc::MAP_FAILED);
        // SAFETY: memfd_create with a static name.
        let raw = unsafe { libc::memfd_create(c"app-mid".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: MAP_FIXED over pages 2..4 of our own reservation.
        unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), 2 * PAGE as i64), 0);
            let q = libc::mmap((p + 2 * PAGE) as *mut c_void, 2 * PAGE as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_FIXED, fd.as_raw_fd(), 0);
            assert_eq!(q as u64, p + 2 * PAGE);
            *((p + 3) as *mut u8) = 3;
            *((p + 5 * PAGE) as *mut u8) = 5;
        }
        let f = FakeService::default();
        let mut segs = Segments { by_base: BTreeMap::new(), next_id: 1 };
        let (pieces, ids) = segs.cover(&f, p + 1, total as u64 - 2).unwrap();
        assert_eq!(ids.len(), 3, "{pieces:?}");
        assert_eq!(*f.shared.borrow(), vec![ids[1]], "only the memfd part is shared as is");
        assert_eq!(pieces.iter().map(|x| x.len).collect::<Vec<_>>(), vec![2 * PAGE; 3]);
        // Private pages were copied and keep their contents; all three are shared both ways.
        // SAFETY: inside our live reservation and the fake service's mappings.
        unsafe {
            assert_eq!(*((p + 3) as *const u8), 3);
            assert_eq!(*((p + 5 * PAGE) as *const u8), 5);
            for a in [p + 10, p + 2 * PAGE + 10, p + 5 * PAGE + 10] {
                *peer_ptr(&f, a) = 0xEE;
                assert_eq!(*(a as *const u8), 0xEE);
            }
        }
        assert!(vma_at(p + 2 * PAGE).path.starts_with("/memfd:app-mid"));
        assert!(vma_at(p).path.starts_with("/memfd:pmrxe-mr"));
        segs.release(&f, &ids);
        // SAFETY: unmapping our own reservation.
        unsafe { libc::munmap(p as *mut c_void, total) };
    }
}
