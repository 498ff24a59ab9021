//! Service-side shared-memory segments: memfds the service creates (rings) or receives
//! (client memory), mapped `MAP_SHARED` into the service.
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// A mapped shared-memory segment. Unmapped on drop; the fd closes with it.
pub struct Segment {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the segment is a plain shared mapping; every access goes through raw pointers with
// their own synchronisation (ring atomics) — the handle itself carries no thread affinity.
unsafe impl Send for Segment {}
// SAFETY: see Send; `&Segment` only exposes the base pointer, length and fd.
unsafe impl Sync for Segment {}

impl Segment {
    /// Create a zero-filled memfd segment of `len` bytes (rounded up to a page), hugepage-backed
    /// when `len` is a multiple of 2 MiB and hugepages are free, else ordinary shared memory.
    pub fn create(name: &str, len: usize) -> io::Result<Segment> {
        let len = (len.max(1) + 4095) & !4095;
        let cname = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let try_huge = len.is_multiple_of(2 << 20);
        let mut fd = -1;
        if try_huge {
            // SAFETY: valid NUL-terminated name; flags are constants.
            fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB) };
        }
        if fd < 0 {
            // SAFETY: as above.
            fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        }
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a fresh fd that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscall on our fd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // Clients get this fd: a client that shrinks it would make the lcore's next access to
        // the mapping raise SIGBUS and kill the service. Seal the size for good.
        // SAFETY: fcntl on our fd.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Segment::map(fd, len)
    }

    /// Map `len` bytes of a segment fd received from a client. The length is checked against
    /// the file size so a client cannot make us map past its end (SIGBUS).
    pub fn map(fd: OwnedFd, len: usize) -> io::Result<Segment> {
        // SAFETY: fstat into a zeroed stat buffer.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: valid fd and out-pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if len == 0 || (st.st_size as u64) < len as u64 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "segment shorter than declared"));
        }
        // SAFETY: a new shared mapping chosen by the kernel; the fd is valid.
        let p = unsafe {
            libc::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Segment { fd, ptr: NonNull::new(p.cast()).expect("mmap returned null"), len })
    }

    /// Base address in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false (segments are at least a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The fd (to pass to a client).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; nobody holds pointers into it anymore
        // (owners keep the Segment alive through Arc while they use it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A contiguous service-side view of a client MR assembled from page-aligned pieces of
/// several segments (one map per MR). Unmapped on drop.
pub struct MrMapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a plain shared mapping accessed only through raw copies by pmrxe-mem.
unsafe impl Send for MrMapping {}
// SAFETY: see Send.
unsafe impl Sync for MrMapping {}
impl pmrxe_mem::Backing for MrMapping {}

impl MrMapping {
    /// Reserve `len` bytes of address space and map each `(fd, fd_offset, len)` piece at
    /// consecutive offsets. Every offset/length must be page aligned and inside its file.
    pub fn assemble(pieces: &[(&OwnedFd, u64, u64)]) -> io::Result<MrMapping> {
        let total: u64 = pieces.iter().map(|p| p.2).sum();
        if total == 0 || total > isize::MAX as u64 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty or huge mapping"));
        }
        for &(fd, off, len) in pieces {
            if off % 4096 != 0 || len % 4096 != 0 || len == 0 {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "piece not page aligned"));
            }
            // SAFETY: fstat into a zeroed buffer on a valid fd.
            let mut st: libc::stat = unsafe { core::mem::zeroed() };
            // SAFETY: valid fd and out pointer.
            if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
                return Err(io::Error::last_os_error());
            }
            if off.checked_add(len).is_none_or(|end| end > st.st_size as u64) {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "piece beyond segment end"));
            }
        }
        let total = total as usize;
        // SAFETY: anonymous PROT_NONE reservation chosen by the kernel.
        let base = unsafe {
            libc::mmap(core::ptr::null_mut(), total, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let m = MrMapping { ptr: NonNull::new(base.cast()).expect("mmap returned null"), len: total };
        let mut at = 0usize;
        for &(fd, off, len) in pieces {
            // SAFETY: MAP_FIXED inside our own reservation [base, base+total); the piece fits
            // (sum of lengths == total).
            let p = unsafe {
                libc::mmap(
                    m.ptr.as_ptr().add(at).cast(),
                    len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd.as_raw_fd(),
                    off as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(io::Error::last_os_error()); // `m` drops and unmaps everything
            }
            at += len as usize;
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
        // SAFETY: unmapping our own reservation (and the pieces mapped into it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// An eventfd (completion channels).
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new non-blocking, close-on-exec eventfd.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fd we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
    /// Signal once (the completion-event path; the only syscall an lcore makes, and only for
    /// CQs the application armed).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a local to our eventfd.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
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
}
