//! What backs a range of this process's memory, from `/proc/self/maps` (control path only:
//! registration reads it, nothing on the data path does).
//!
//! Registration needs two facts per mapping: is it already shareable (a `MAP_SHARED` mapping
//! of a file: hugetlbfs, memfd, SysV SHM, a regular file, shared anonymous memory, all of which
//! are files in the kernel), and what page size does the kernel map it with (hugetlb mappings
//! can only be split, remapped and unmapped in whole huge pages).
use crate::boundary::{Errno, Res};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `statfs.f_type` of hugetlbfs (linux/magic.h).
const HUGETLBFS_MAGIC: u32 = 0x9584_58f6;
const SMALL_PAGE: u64 = 4096;

/// One line of `/proc/self/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub shared: bool,
    /// File offset mapped at `start`.
    pub offset: u64,
    /// (major, minor) of the backing file's device.
    pub dev: (u32, u32),
    pub ino: u64,
    /// Path or pseudo-name (`/SYSV0000002a (deleted)`, `/memfd:x (deleted)`, `[heap]`, "").
    pub path: String,
}

impl Vma {
    /// Parse one maps line: `start-end perms offset major:minor inode [path]`.
    pub fn parse(line: &str) -> Option<Vma> {
        let mut it = line.splitn(6, ' ');
        let (range, perms, offset, dev, ino) = (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
        let path = it.next().unwrap_or("").trim_start().to_string();
        let (s, e) = range.split_once('-')?;
        let (maj, min) = dev.split_once(':')?;
        Some(Vma {
            start: u64::from_str_radix(s, 16).ok()?,
            end: u64::from_str_radix(e, 16).ok()?,
            shared: perms.as_bytes().get(3) == Some(&b's'),
            offset: u64::from_str_radix(offset, 16).ok()?,
            dev: (u32::from_str_radix(maj, 16).ok()?, u32::from_str_radix(min, 16).ok()?),
            ino: ino.parse().ok()?,
            path,
        })
    }

    /// A file backs it (including the pseudo-files of memfds, SysV SHM and shared anonymous
    /// memory); private anonymous memory has inode 0.
    pub fn has_file(&self) -> bool {
        self.ino != 0
    }

    /// Anonymous `MAP_HUGETLB` memory (private or shared).
    pub fn is_anon_hugetlb(&self) -> bool {
        self.path.starts_with("/anon_hugepage")
    }
}

/// The mappings that intersect `[lo, hi)`, in address order.
///
/// Other threads may map and unmap while we read, and the kernel builds maps without a
/// consistent snapshot (since 6.16 under per-VMA locks it may even show a mapping that was
/// just removed). The answer is taken once two reads in a row agree on the range.
pub fn read(lo: u64, hi: u64) -> Res<Vec<Vma>> {
    let once = || -> Res<Vec<Vma>> {
        let text = std::fs::read_to_string("/proc/self/maps").map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?;
        let mut v: Vec<Vma> = text.lines().filter_map(Vma::parse).filter(|v| v.start < hi && v.end > lo).collect();
        v.sort_by_key(|m| m.start);
        v.dedup_by_key(|m| m.start);
        Ok(v)
    };
    let mut prev = once()?;
    for _ in 0..8 {
        let next = once()?;
        if next == prev {
            return Ok(next);
        }
        prev = next;
    }
    Ok(prev)
}

/// `statfs.f_type` of tmpfs/shmem (memfds, SysV SHM, shared anonymous memory, /dev/shm).
const TMPFS_MAGIC: u32 = 0x0102_1994;

/// Whether the service accepts memory backed by `fd` (issue 37): shmem and hugetlbfs files
/// only, whose pages never make a page fault wait for I/O or another process. Anything else
/// (FUSE, NFS, ext4/xfs/btrfs/overlay files ...) is refused, as the kernel refuses a
/// long-term pin of such a mapping since 6.5 (EFAULT). `Err`: a sentence naming the
/// filesystem. The service checks again (`AddSharedSegment`); checking here gives the
/// application the reason without a round trip.
pub fn registrable(fd: &OwnedFd) -> Result<(), String> {
    // SAFETY: fstatfs into a zeroed buffer.
    let mut sfs: libc::statfs = unsafe { core::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sfs) } != 0 {
        return Err(format!("fstatfs on the backing file failed: {}", std::io::Error::last_os_error()));
    }
    let magic = sfs.f_type as u32;
    let name = match magic {
        TMPFS_MAGIC | HUGETLBFS_MAGIC => return Ok(()),
        0xef53 => "ext2/ext3/ext4",
        0x5846_5342 => "xfs",
        0x9123_683e => "btrfs",
        0x794c_7630 => "overlayfs",
        0x6573_5546 => "FUSE",
        0x6969 => "NFS",
        0xff53_4d42 | 0xfe53_4d42 => "CIFS/SMB",
        0x0102_1997 => "9p",
        0x8584_58f6 => "ramfs",
        _ => "an unsupported filesystem",
    };
    Err(format!(
        "it is a shared mapping of a file on {name} (filesystem magic {magic:#x}); only anonymous memory, memfd/tmpfs/shmem and hugetlbfs files can be registered"
    ))
}

/// The page size the kernel maps `fd` with: the huge page size for hugetlbfs, else 4096.
pub fn fd_page_size(fd: &OwnedFd) -> Res<u64> {
    // SAFETY: fstatfs into a zeroed buffer.
    let mut sfs: libc::statfs = unsafe { core::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sfs) } != 0 {
        return Err(Errno::last());
    }
    Ok(statfs_page(&sfs))
}

fn statfs_page(sfs: &libc::statfs) -> u64 {
    let bs = sfs.f_bsize as u64;
    if sfs.f_type as u32 == HUGETLBFS_MAGIC && bs.is_power_of_two() && bs > SMALL_PAGE {
        bs
    } else {
        SMALL_PAGE
    }
}

/// The default huge page size (`Hugepagesize:` in /proc/meminfo), 2 MiB if unreadable.
fn default_huge_page() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find_map(|l| l.strip_prefix("Hugepagesize:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())))
        .map(|kb| kb * 1024)
        .filter(|p| p.is_power_of_two() && *p > SMALL_PAGE)
        .unwrap_or(2 << 20)
}

/// Page size of a mapping: the file's for file-backed ones (hugetlbfs files and
/// `MAP_HUGETLB` memory are hugetlbfs files), 4096 for ordinary anonymous memory.
pub fn page_size(v: &Vma) -> u64 {
    if !v.has_file() {
        return SMALL_PAGE;
    }
    if let Ok(fd) = open_map_file(v, libc::O_RDONLY) {
        if let Ok(p) = fd_page_size(&fd) {
            return p;
        }
    }
    if v.is_anon_hugetlb() {
        return default_huge_page();
    }
    if v.path.starts_with('/') && !v.path.ends_with(" (deleted)") {
        if let Ok(c) = CString::new(v.path.as_str()) {
            // SAFETY: statfs into a zeroed buffer with a valid C string.
            let mut sfs: libc::statfs = unsafe { core::mem::zeroed() };
            // SAFETY: valid path and out pointer.
            if unsafe { libc::statfs(c.as_ptr(), &mut sfs) } == 0 {
                return statfs_page(&sfs);
            }
        }
    }
    SMALL_PAGE
}

fn open_path(path: &str, flags: i32) -> Res<OwnedFd> {
    let c = CString::new(path).map_err(|_| Errno::INVAL)?;
    // SAFETY: open with a valid C string; the fd is ours.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The same file as the mapping (device and inode match)?
fn is_backing(v: &Vma, fd: &OwnedFd) -> bool {
    // SAFETY: fstat into a zeroed buffer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    (unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0)
        && st.st_ino == v.ino
        && (libc::major(st.st_dev), libc::minor(st.st_dev)) == v.dev
}

/// `/proc/self/map_files/START-END`: the mapping's own file, whatever it is (SysV SHM, memfd,
/// deleted files). Needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE).
fn open_map_file(v: &Vma, flags: i32) -> Res<OwnedFd> {
    let fd = open_path(&format!("/proc/self/map_files/{:x}-{:x}", v.start, v.end), flags)?;
    if is_backing(v, &fd) {
        Ok(fd)
    } else {
        Err(Errno(libc::ESTALE))
    }
}

/// A read-write fd of the file behind a shared mapping, opened anew (the service gets its own
/// open file; the application's fds are untouched). Tried in order: `/proc/self/map_files`
/// (root), an fd of this process that refers to the same file (memfds, open files), the path
/// (named files). SysV SHM and unlinked files nobody holds open need the first: EPERM without
/// CAP_SYS_ADMIN.
pub fn open_backing(v: &Vma) -> Res<OwnedFd> {
    let first = match open_map_file(v, libc::O_RDWR) {
        Ok(fd) => return Ok(fd),
        Err(e) => e,
    };
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        for e in dir.flatten() {
            let p = e.path();
            let Some(p) = p.to_str() else { continue };
            // Only files that match by stat are opened (never a device or a FIFO): reopening
            // /proc/self/fd/N opens the file itself, not a dup of the application's description.
            let Ok(c) = CString::new(p) else { continue };
            // SAFETY: stat into a zeroed buffer with a valid C string.
            let mut st: libc::stat = unsafe { core::mem::zeroed() };
            // SAFETY: valid path and out pointer.
            let same = unsafe { libc::stat(c.as_ptr(), &mut st) } == 0
                && st.st_mode & libc::S_IFMT == libc::S_IFREG
                && st.st_ino == v.ino
                && (libc::major(st.st_dev), libc::minor(st.st_dev)) == v.dev;
            if same {
                if let Ok(fd) = open_path(p, libc::O_RDWR) {
                    if is_backing(v, &fd) {
                        return Ok(fd);
                    }
                }
            }
        }
    }
    if v.path.starts_with('/') && !v.path.ends_with(" (deleted)") {
        if let Ok(fd) = open_path(&v.path, libc::O_RDWR) {
            if is_backing(v, &fd) {
                return Ok(fd);
            }
        }
    }
    Err(if first == Errno(libc::EACCES) || first == Errno(libc::ENOENT) { Errno(libc::EPERM) } else { first })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines() {
        let v = Vma::parse("7f2a40000000-7f2a40400000 rw-s 00200000 00:0f 32778                      /SYSV00000000 (deleted)").unwrap();
        assert_eq!((v.start, v.end, v.shared, v.offset, v.dev, v.ino), (0x7f2a_4000_0000, 0x7f2a_4040_0000, true, 0x200000, (0, 0xf), 32778));
        assert_eq!(v.path, "/SYSV00000000 (deleted)");
        let a = Vma::parse("55d0c2a1e000-55d0c2a3f000 rw-p 00000000 00:00 0                          [heap]").unwrap();
        assert!(!a.shared && !a.has_file() && a.path == "[heap]");
        let n = Vma::parse("7ffd1000-7ffd2000 rw-p 00000000 00:00 0").unwrap();
        assert_eq!(n.path, "");
        let h = Vma::parse("7f0000000000-7f0000200000 rw-p 00000000 00:10 1234 /anon_hugepage (deleted)").unwrap();
        assert!(h.is_anon_hugetlb() && !h.shared);
        assert!(Vma::parse("garbage").is_none());
    }

    #[test]
    fn finds_the_backing_of_a_shared_memfd_mapping() {
        // SAFETY: memfd_create with a static name.
        let raw = unsafe { libc::memfd_create(c"pmrxe-vma-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscalls on our fd / a fresh kernel-chosen mapping.
        let p = unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), 3 * 4096), 0);
            libc::mmap(std::ptr::null_mut(), 2 * 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 4096)
        };
        assert_ne!(p, libc::MAP_FAILED);
        let a = p as u64;
        let vs = read(a + 100, a + 200).unwrap();
        assert_eq!(vs.len(), 1, "{vs:?}");
        let v = &vs[0];
        assert!(v.shared && v.has_file() && v.offset == 4096 && v.path.starts_with("/memfd:pmrxe-vma-test"), "{v:?}");
        assert_eq!(page_size(v), 4096);
        let b = open_backing(v).unwrap();
        assert!(is_backing(v, &b));
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(p, 2 * 4096) };
    }
}
