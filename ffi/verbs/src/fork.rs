//! `ibv_fork_init` / `ibv_is_fork_initialized`: libibverbs' fork protection (rdma-core 44,
//! libibverbs/memory.c).
//!
//! Registered memory is shared with the service: every live segment ([`crate::mr`]) is a
//! `MAP_SHARED` mapping (our memfd over the application's former private pages, or the
//! application's own shared file). A fork therefore never breaks the parent's registrations
//! (shared pages are not copied on write) — but without protection the child shares those
//! pages with the parent. After `ibv_fork_init` (or with `RDMAV_FORK_SAFE` / `IBV_FORK_SAFE`
//! in the environment) libibverbs' semantics apply: every registered range is
//! `madvise(MADV_DONTFORK)` (absent from children) from the moment its segment is created
//! until the segment is released (then `MADV_DOFORK`). `ibv_dontfork_range` /
//! `ibv_dofork_range` (exported by libibverbs for providers and applications) count holders
//! per page together with the segments, as rdma-core's tree does: a page is advised
//! `MADV_DONTFORK` when its first holder comes and `MADV_DOFORK` when its last one goes.
//!
//! As rdma-core 44: `ibv_fork_init` after memory was registered (since the process started,
//! whether or not that MR still exists) is EINVAL and protection stays off; calling it again
//! once enabled is 0; `ibv_is_fork_initialized` is IBV_FORK_ENABLED (1) or IBV_FORK_DISABLED
//! (0) — never IBV_FORK_UNNEEDED, which the kernel's copy-on-fork of pinned pages earns and
//! shared pages do not (a child writing them writes the parent's buffer).
//!
//! Differences: the advised range is the segment, i.e. the registration's pages rounded out
//! to whole pages of the mapping (huge pages for hugetlb memory, as `RDMAV_HUGEPAGES_SAFE`
//! does in rdma-core) and, for memory that was already `MAP_SHARED`, the whole mapping the
//! segment covers. Released pages stay memfd-backed (`MAP_SHARED`) after `MADV_DOFORK`, so a
//! later child shares rather than copies them.
use crate::boundary::{ffi_boundary, Errno, Res};
use std::collections::BTreeMap;
use std::os::raw::{c_int, c_void};
use std::sync::{Mutex, Once};

const PAGE: u64 = 4096;

/// Disjoint page ranges `start -> (end, holders)`, holders > 0: the pages advised
/// `MADV_DONTFORK`.
#[derive(Debug, Default)]
struct Ranges(BTreeMap<u64, (u64, u32)>);

impl Ranges {
    /// Make `x` a range boundary.
    fn split(&mut self, x: u64) {
        if let Some((&s, &(e, c))) = self.0.range(..x).next_back() {
            if e > x {
                self.0.insert(s, (x, c));
                self.0.insert(x, (e, c));
            }
        }
    }

    /// One holder more (`inc`) or less for every page of `[lo, hi)`; returns the runs whose
    /// count went 0 -> 1 (`inc`) or 1 -> 0. Releasing pages nobody holds changes nothing.
    fn adjust(&mut self, lo: u64, hi: u64, inc: bool) -> Vec<(u64, u64)> {
        self.split(lo);
        self.split(hi);
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut push = |a: u64, b: u64| match out.last_mut() {
            Some(l) if l.1 == a => l.1 = b,
            _ => out.push((a, b)),
        };
        let inside: Vec<(u64, u64, u32)> = self.0.range(lo..hi).map(|(&s, &(e, c))| (s, e, c)).collect();
        let mut cur = lo;
        for (s, e, c) in inside {
            if inc && cur < s {
                self.0.insert(cur, (s, 1));
                push(cur, s);
            }
            if inc {
                self.0.insert(s, (e, c + 1));
            } else if c == 1 {
                self.0.remove(&s);
                push(s, e);
            } else {
                self.0.insert(s, (e, c - 1));
            }
            cur = e;
        }
        if inc && cur < hi {
            self.0.insert(cur, (hi, 1));
            push(cur, hi);
        }
        out
    }
}

/// `enum ibv_fork_status`.
pub const IBV_FORK_DISABLED: c_int = 0;
pub const IBV_FORK_ENABLED: c_int = 1;

#[derive(Debug, Default)]
struct State {
    /// Protection is on (rdma-core: `mm_root != NULL`).
    enabled: bool,
    /// Memory was registered while protection was off (rdma-core: `too_late`).
    too_late: bool,
    ranges: Ranges,
}

static STATE: Mutex<State> = Mutex::new(State { enabled: false, too_late: false, ranges: Ranges(BTreeMap::new()) });
static ENV: Once = Once::new();

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// `RDMAV_FORK_SAFE` / `IBV_FORK_SAFE` set: enable protection before the first registration
/// (libibverbs does it when it initialises, with this warning when that fails).
fn env_init() {
    ENV.call_once(|| {
        if std::env::var_os("RDMAV_FORK_SAFE").is_some() || std::env::var_os("IBV_FORK_SAFE").is_some() {
            if let Err(e) = state().init() {
                eprintln!("pmrxe: Warning: fork()-safety requested but init failed (errno {})", e.0);
            }
        }
    })
}

fn madvise(base: u64, len: u64, advice: c_int) -> Res<()> {
    // SAFETY: madvise with MADV_DONTFORK / MADV_DOFORK changes only whether the range is
    // inherited by children, never its contents or mapping in this process.
    if unsafe { libc::madvise(base as *mut c_void, len as usize, advice) } != 0 {
        return Err(Errno::last());
    }
    Ok(())
}

impl State {
    /// `ibv_fork_init`.
    fn init(&mut self) -> Res<()> {
        if self.enabled {
            return Ok(());
        }
        if self.too_late {
            return Err(Errno::INVAL);
        }
        // As rdma-core: check once that the kernel has MADV_DONTFORK / MADV_DOFORK (ENOSYS).
        let page = 4096;
        let probe = vec![0u8; 2 * page];
        let p = (probe.as_ptr() as u64).next_multiple_of(page as u64);
        if madvise(p, page as u64, libc::MADV_DONTFORK).and_then(|_| madvise(p, page as u64, libc::MADV_DOFORK)).is_err() {
            return Err(Errno::NOSYS);
        }
        self.enabled = true;
        Ok(())
    }

    /// `ibv_dontfork_range`: one holder more on the pages of `base..base+len`.
    fn added(&mut self, base: u64, len: u64) -> Res<()> {
        if !self.enabled {
            self.too_late = true;
            return Ok(());
        }
        let Some((lo, hi)) = pages(base, len) else { return Ok(()) };
        for (a, b) in self.ranges.adjust(lo, hi, true) {
            if let Err(e) = madvise(a, b - a, libc::MADV_DONTFORK) {
                // Roll back: the pages that just got their first holder lose it again.
                for (a, b) in self.ranges.adjust(lo, hi, false) {
                    let _ = madvise(a, b - a, libc::MADV_DOFORK);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// `ibv_dofork_range`: one holder less. Best effort (the application may have unmapped
    /// the pages already: ENOMEM, nothing to undo).
    fn released(&mut self, base: u64, len: u64) {
        if !self.enabled {
            self.too_late = true;
            return;
        }
        let Some((lo, hi)) = pages(base, len) else { return };
        for (a, b) in self.ranges.adjust(lo, hi, false) {
            let _ = madvise(a, b - a, libc::MADV_DOFORK);
        }
    }

    fn status(&self) -> c_int {
        if self.enabled {
            IBV_FORK_ENABLED
        } else {
            IBV_FORK_DISABLED
        }
    }
}

/// The whole pages of `base..base+len`; None if empty (or NULL, as rdma-core).
fn pages(base: u64, len: u64) -> Option<(u64, u64)> {
    if base == 0 || len == 0 {
        return None;
    }
    Some((base & !(PAGE - 1), base.checked_add(len)?.checked_next_multiple_of(PAGE)?))
}

/// A segment `base..base+len` (page aligned) now backs registered memory: with protection on,
/// children will not inherit it (the error of `madvise` otherwise, and the caller gives the
/// segment up); with protection off, `ibv_fork_init` comes too late from now on.
pub fn segment_added(base: u64, len: u64) -> Res<()> {
    env_init();
    state().added(base, len)
}

/// Segment `base..base+len` was released: children inherit those pages again. Best effort
/// (the application may have unmapped them already: ENOMEM, nothing to undo).
pub fn segment_released(base: u64, len: u64) {
    state().released(base, len)
}

/// `ibv_dontfork_range@IBVERBS_1.1`: with protection on, children do not inherit the pages of
/// `base..base+size` until as many `ibv_dofork_range` calls (0, or -1 with errno from
/// `madvise`); with it off, 0 and `ibv_fork_init` comes too late from now on (rdma-core).
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(base: *mut c_void, size: usize) -> c_int {
    ffi_boundary(-1, || {
        env_init();
        match state().added(base as u64, size as u64) {
            Ok(()) => 0,
            Err(Errno(e)) => {
                crate::boundary::set_errno(e);
                -1
            }
        }
    })
}

/// `ibv_dofork_range@IBVERBS_1.1`: undo one `ibv_dontfork_range` (always 0, as rdma-core
/// once protection is on).
#[no_mangle]
pub extern "C" fn ibv_dofork_range(base: *mut c_void, size: usize) -> c_int {
    ffi_boundary(-1, || {
        env_init();
        state().released(base as u64, size as u64);
        0
    })
}

/// `ibv_fork_init`: 0, or EINVAL when memory was already registered (rdma-core 44), ENOSYS
/// when the kernel lacks `MADV_DONTFORK`.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    ffi_boundary(libc::EIO, || {
        env_init();
        match state().init() {
            Ok(()) => 0,
            Err(Errno(e)) => e,
        }
    })
}

/// `ibv_is_fork_initialized`: IBV_FORK_ENABLED after a successful `ibv_fork_init` (or with
/// `RDMAV_FORK_SAFE` / `IBV_FORK_SAFE`), IBV_FORK_DISABLED before.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    ffi_boundary(IBV_FORK_DISABLED, || {
        env_init();
        state().status()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fork; in the child run `f` and exit with its code; return the child's exit code.
    fn in_child(f: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child only runs `f` (async-signal-safe reads and writes of memory)
        // and _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let c = f();
            // SAFETY: leave the child without running the parent's destructors.
            unsafe { libc::_exit(c) };
        }
        let mut st = 0;
        // SAFETY: waiting for our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(libc::WIFEXITED(st), "child status {st:#x}");
        libc::WEXITSTATUS(st)
    }

    /// Does the child have `addr` mapped? (mincore fails with ENOMEM on unmapped pages.)
    fn child_has_page(addr: u64) -> bool {
        in_child(|| {
            let mut v = 0u8;
            // SAFETY: mincore only inspects the mapping; `v` holds the one page's byte.
            let r = unsafe { libc::mincore(addr as *mut c_void, 4096, &mut v) };
            if r == 0 {
                0
            } else {
                1
            }
        }) == 0
    }

    /// A shared mapping of `pages` pages standing in for a segment.
    fn shared(pages: usize) -> u64 {
        // SAFETY: a fresh shared anonymous mapping.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), pages * 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        p as u64
    }

    // The process-wide state is left alone (other tests register memory meanwhile): each
    // case has its own State.
    #[test]
    fn ranges_count_holders_per_page() {
        let mut r = Ranges::default();
        assert_eq!(r.adjust(0x1000, 0x4000, true), vec![(0x1000, 0x4000)]);
        assert_eq!(r.adjust(0x3000, 0x6000, true), vec![(0x4000, 0x6000)], "only new pages");
        assert_eq!(r.adjust(0x1000, 0x4000, false), vec![(0x1000, 0x3000)], "0x3000 still held");
        assert_eq!(r.adjust(0x7000, 0x8000, false), vec![], "nobody held it");
        assert_eq!(r.adjust(0x2000, 0x7000, true), vec![(0x2000, 0x3000), (0x6000, 0x7000)]);
        assert_eq!(r.adjust(0x2000, 0x7000, false), vec![(0x2000, 0x3000), (0x6000, 0x7000)]);
        assert_eq!(r.adjust(0x3000, 0x6000, false), vec![(0x3000, 0x6000)]);
        assert!(r.0.is_empty(), "{r:?}");
    }

    #[test]
    fn registration_before_fork_init_makes_it_too_late() {
        let mut s = State::default();
        assert_eq!(s.status(), IBV_FORK_DISABLED);
        let a = shared(2);
        s.added(a, 8192).unwrap();
        assert!(child_has_page(a), "advised while protection is off");
        assert_eq!(s.init(), Err(Errno::INVAL));
        assert_eq!(s.status(), IBV_FORK_DISABLED);
        s.released(a, 8192);
        assert_eq!(s.init(), Err(Errno::INVAL), "too late even once the MR is gone (rdma-core)");
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(a as *mut c_void, 2 * 4096) };
    }

    #[test]
    fn after_fork_init_children_do_not_inherit_registered_pages() {
        let mut s = State::default();
        assert_eq!(s.init(), Ok(()));
        assert_eq!(s.init(), Ok(()), "again once enabled");
        assert_eq!(s.status(), IBV_FORK_ENABLED);
        let b = shared(3);
        // SAFETY: inside our mapping.
        unsafe { *(b as *mut u8) = 42 };
        s.added(b, 2 * 4096).unwrap();
        assert!(!child_has_page(b), "registered page inherited");
        assert!(!child_has_page(b + 4096), "registered page inherited");
        assert!(child_has_page(b + 2 * 4096), "unregistered neighbour not inherited");
        // The parent's memory is unaffected by the forks.
        // SAFETY: inside our mapping.
        assert_eq!(unsafe { *(b as *const u8) }, 42);
        // A second holder of the first page (an overlapping MR, ibv_dontfork_range) keeps it
        // out of children when the segment goes.
        s.added(b + 10, 100).unwrap();
        s.released(b, 2 * 4096);
        assert!(!child_has_page(b), "page still held");
        assert!(child_has_page(b + 4096), "released page still not inherited");
        s.released(b + 10, 100);
        assert!(child_has_page(b), "released segment still not inherited");
        assert_eq!(s.init(), Ok(()), "registrations after fork_init are not 'too late'");
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(b as *mut c_void, 3 * 4096) };
    }
}
