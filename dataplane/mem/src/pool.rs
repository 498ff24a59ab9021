//! Hugepage-backed memory pool for service-owned MR memory and rings.
//!
//! The pool is one memfd (so it can be passed to clients with SCM_RIGHTS) mapped shared.
//! It tries 1 GiB pages (when asked and when the pool is at least 1 GiB), then 2 MiB pages,
//! then falls back to normal 4 KiB pages with a `tracing::warn!`. Hugetlb pages are reserved
//! at mmap time, so a machine with `nr_hugepages = 0` fails the mmap and falls back cleanly.
//!
//! Chunks are handed out as [`Region`]s whose owner returns the chunk to the pool on drop;
//! the mapping lives until the pool and every chunk are gone.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use crate::region::{Backing, Region};

/// Which page size to try first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagePref {
    /// 1 GiB, then 2 MiB, then 4 KiB.
    Huge1G,
    /// 2 MiB, then 4 KiB.
    Huge2M,
    /// 4 KiB pages only (no hugepages wanted, e.g. `configs/loopback.toml`).
    Small,
}

const SIZE_4K: usize = 4096;
const SIZE_2M: usize = 2 << 20;
const SIZE_1G: usize = 1 << 30;

struct Mapping {
    ptr: *mut u8,
    len: usize,
    page_size: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is a plain shared memory range; the pointer is only used for raw copies
// and for munmap in Drop, which runs once.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr/len` is exactly the range returned by our mmap, unmapped once here.
        let rc = unsafe { libc::munmap(self.ptr.cast(), self.len) };
        if rc != 0 {
            tracing::warn!(err = %io::Error::last_os_error(), "munmap of hugepage pool failed");
        }
    }
}

impl Mapping {
    fn create(size: usize, page_size: usize) -> io::Result<Mapping> {
        let len = size
            .checked_next_multiple_of(page_size)
            .ok_or(io::ErrorKind::InvalidInput)?;
        let flags = libc::MFD_CLOEXEC
            | match page_size {
                SIZE_2M => libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
                SIZE_1G => libc::MFD_HUGETLB | libc::MFD_HUGE_1GB,
                _ => 0,
            };
        let name: &CStr = c"pmrxe-pool";
        // SAFETY: `name` is a valid NUL-terminated string; flags are valid memfd flags.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), flags) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: valid fd; length fits off_t for any size we can map.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh shared mapping of our own fd, no fixed address.
        let ptr = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
            page_size,
            fd,
        })
    }
}

struct PoolInner {
    map: Mapping,
    /// Free ranges (offset, len), sorted, coalesced.
    free: Mutex<Vec<(usize, usize)>>,
}
impl Backing for PoolInner {}

/// A hugepage-backed (when possible) shared-memory pool.
#[derive(Clone)]
pub struct HugePool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for HugePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HugePool({:#x} bytes, {} KiB pages)",
            self.inner.map.len,
            self.inner.map.page_size / 1024
        )
    }
}

impl HugePool {
    /// A pool of at least `size` bytes (rounded up to the page size obtained).
    pub fn new(size: usize, pref: PagePref) -> io::Result<HugePool> {
        if size == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty pool"));
        }
        let tries: &[usize] = match pref {
            PagePref::Huge1G if size >= SIZE_1G => &[SIZE_1G, SIZE_2M],
            PagePref::Huge1G | PagePref::Huge2M => &[SIZE_2M],
            PagePref::Small => &[],
        };
        let mut map = None;
        for &ps in tries {
            match Mapping::create(size, ps) {
                Ok(m) => {
                    map = Some(m);
                    break;
                }
                Err(e) => tracing::debug!(page_size = ps, err = %e, "hugepage mapping failed"),
            }
        }
        let map = match map {
            Some(m) => m,
            None => {
                if pref != PagePref::Small {
                    tracing::warn!(
                        size,
                        "no hugepages available; pool falls back to 4 KiB pages"
                    );
                }
                Mapping::create(size, SIZE_4K)?
            }
        };
        let len = map.len;
        Ok(HugePool {
            inner: Arc::new(PoolInner {
                map,
                free: Mutex::new(vec![(0, len)]),
            }),
        })
    }

    /// Page size obtained (4096 after a fallback).
    pub fn page_size(&self) -> usize {
        self.inner.map.page_size
    }
    /// Backed by hugepages.
    pub fn is_huge(&self) -> bool {
        self.inner.map.page_size > SIZE_4K
    }
    /// Total bytes.
    pub fn len(&self) -> usize {
        self.inner.map.len
    }
    /// Never true (a pool has at least one page).
    pub fn is_empty(&self) -> bool {
        self.inner.map.len == 0
    }
    /// The memfd, for passing the pool to a client (offsets of chunks are `offset_of`).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.map.fd.as_fd()
    }

    /// The whole pool as one region.
    pub fn region(&self) -> Region {
        let owner: Arc<dyn Backing> = self.inner.clone();
        // SAFETY: the mapping lives as long as `owner` (PoolInner owns it).
        unsafe { Region::new(owner, self.inner.map.ptr, self.inner.map.len) }
    }

    /// Offset of a region of this pool inside the memfd (`None` if it is not from this pool).
    pub fn offset_of(&self, r: &Region) -> Option<u64> {
        let base = self.inner.map.ptr as usize;
        let a = r.as_ptr() as usize;
        (a >= base && a + r.len() <= base + self.inner.map.len).then(|| (a - base) as u64)
    }

    /// A chunk of `len` bytes aligned to `align` (a power of two); returned to the pool when
    /// the last clone of the region is dropped. `None` when the pool is exhausted.
    pub fn alloc(&self, len: usize, align: usize) -> Option<Region> {
        if len == 0 || !align.is_power_of_two() {
            return None;
        }
        let mut free = self.inner.free.lock().unwrap_or_else(|p| p.into_inner());
        let base = self.inner.map.ptr as usize;
        // Align the address, not the offset (the mapping is only page-aligned).
        let (i, start) = free.iter().enumerate().find_map(|(i, &(o, l))| {
            let s = (base + o).checked_next_multiple_of(align)? - base;
            (s.checked_add(len)? <= o + l).then_some((i, s))
        })?;
        let (o, l) = free[i];
        free.remove(i);
        if start + len < o + l {
            free.insert(i, (start + len, o + l - start - len));
        }
        if start > o {
            free.insert(i, (o, start - o));
        }
        drop(free);
        let chunk: Arc<dyn Backing> = Arc::new(Chunk {
            pool: self.inner.clone(),
            off: start,
            len,
        });
        // SAFETY: `start..start+len` is inside the mapping and handed out exactly once (it is
        // off the free list until `Chunk` drops); `chunk` keeps the mapping alive.
        let ptr = unsafe { self.inner.map.ptr.add(start) };
        // SAFETY: see above.
        Some(unsafe { Region::new(chunk, ptr, len) })
    }
}

struct Chunk {
    pool: Arc<PoolInner>,
    off: usize,
    len: usize,
}
impl Backing for Chunk {}
impl Drop for Chunk {
    fn drop(&mut self) {
        let mut free = self.pool.free.lock().unwrap_or_else(|p| p.into_inner());
        let i = free.partition_point(|&(o, _)| o < self.off);
        free.insert(i, (self.off, self.len));
        if i + 1 < free.len() && free[i].0 + free[i].1 == free[i + 1].0 {
            free[i].1 += free[i + 1].1;
            free.remove(i + 1);
        }
        if i > 0 && free[i - 1].0 + free[i - 1].1 == free[i].0 {
            free[i - 1].1 += free[i].1;
            free.remove(i);
        }
    }
}
