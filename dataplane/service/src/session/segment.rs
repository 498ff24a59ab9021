//! Client memory segments: sealed memfds (AddSegment) and files already shared as they are
//! (AddSharedSegment); MRs map their pages.
//!
//! Only memory whose pages cannot block or vanish for good under an lcore is accepted
//! (`shm::client_memory_page`: shmem — memfds, tmpfs, SysV SHM, shared anonymous memory — and
//! hugetlbfs); a file on FUSE, NFS or a disk filesystem is refused with EFAULT and a message
//! naming the filesystem, as the kernel refuses a long-term pin of such a mapping. The check
//! comes first, before anything else asks the file's filesystem a question.

use rustix::fs::{FileType, OFlags, SealFlags};
use std::os::fd::{AsFd, OwnedFd};

use pmrxe_abi::ctrl::Response;
use pmrxe_runtime::shm;

use super::{err, Reply, SegRec, Session};

impl Session {
    pub(super) fn add_segment(&mut self, seg: u64, base: u64, len: u64, fds: Vec<OwnedFd>) -> Reply {
        let Some(fd) = fds.into_iter().next() else { return (err(libc::EINVAL, "AddSegment needs an fd"), vec![]) };
        let page = match shm::client_memory_page(fd.as_fd()) {
            Ok(p) => p,
            Err(why) => return (err(libc::EFAULT, &why), vec![]),
        };
        if len == 0 || !base.is_multiple_of(4096) || !len.is_multiple_of(4096) || self.objs.segs.contains_key(&seg) {
            return (err(libc::EINVAL, "bad segment"), vec![]);
        }
        if rustix::fs::fstat(&fd).map_or(true, |st| (st.st_size as u64) < len) {
            return (err(libc::EINVAL, "segment fd shorter than declared"), vec![]);
        }
        // A client that shrinks a segment the service maps would make the lcore fault
        // (SIGBUS) and kill the service: the segment must be sealed against shrinking.
        let sealed = rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK).is_ok()
            || rustix::fs::fcntl_get_seals(&fd).is_ok_and(|seals| seals.contains(SealFlags::SHRINK));
        if !sealed {
            return (err(libc::EPERM, "segment must be a memfd sealable against shrinking (MFD_ALLOW_SEALING)"), vec![]);
        }
        if !base.is_multiple_of(page) || !len.is_multiple_of(page) {
            return (err(libc::EINVAL, "huge-page segment not aligned to its page size"), vec![]);
        }
        self.objs.segs.insert(seg, SegRec { fd, base, len, offset: 0, page, region: None });
        (Response::Ok, vec![])
    }

    /// `AddSharedSegment`: a file that already backs a shared mapping of the client, mapped as
    /// it is (no seal: the client keeps using it; a shrink is survived by the SIGBUS guard and
    /// revokes the MRs over it).
    pub(super) fn add_shared_segment(&mut self, seg: u64, base: u64, len: u64, offset: u64, fds: Vec<OwnedFd>) -> Reply {
        let Some(fd) = fds.into_iter().next() else { return (err(libc::EINVAL, "AddSharedSegment needs an fd"), vec![]) };
        let page = match shm::client_memory_page(fd.as_fd()) {
            Ok(p) => p,
            Err(why) => return (err(libc::EFAULT, &why), vec![]),
        };
        if len == 0 || !base.is_multiple_of(4096) || !len.is_multiple_of(4096) || !offset.is_multiple_of(4096) || self.objs.segs.contains_key(&seg) {
            return (err(libc::EINVAL, "bad segment"), vec![]);
        }
        if base.checked_add(len).is_none() || offset.checked_add(len).is_none_or(|e| e > i64::MAX as u64) {
            return (err(libc::EINVAL, "segment wraps"), vec![]);
        }
        let Ok(st) = rustix::fs::fstat(&fd) else {
            return (err(libc::EINVAL, "fstat on the segment fd failed"), vec![]);
        };
        // Memory files only: never a device (its mmap could reach hardware).
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return (err(libc::EINVAL, "shared segment must be a regular, memfd, hugetlbfs or SysV SHM file"), vec![]);
        }
        if rustix::fs::fcntl_getfl(&fd).map_or(true, |fl| fl & OFlags::ACCMODE != OFlags::RDWR) {
            return (err(libc::EACCES, "shared segment fd must be open read-write"), vec![]);
        }
        if !base.is_multiple_of(page) || !len.is_multiple_of(page) || !offset.is_multiple_of(page) {
            return (err(libc::EINVAL, "shared segment not aligned to its file's page size"), vec![]);
        }
        if (offset + len).div_ceil(page) > (st.st_size as u64).div_ceil(page) {
            return (err(libc::EINVAL, "shared segment beyond the end of its file"), vec![]);
        }
        self.objs.segs.insert(seg, SegRec { fd, base, len, offset, page, region: None });
        (Response::Ok, vec![])
    }

    pub(super) fn release_segment(&mut self, seg: u64) -> Reply {
        match self.objs.segs.remove(&seg) {
            Some(_) => (Response::Ok, vec![]),
            None => (err(libc::EINVAL, "no such segment"), vec![]),
        }
    }
}
