//! Client memory segments: sealed memfds (AddSegment) and files already shared as they are
//! (AddSharedSegment); MRs map their pages.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use pmrxe_abi::ctrl::Response;
use pmrxe_runtime::shm;

use super::{err, Reply, SegRec, Session};

impl Session {
    pub(super) fn add_segment(&mut self, seg: u64, base: u64, len: u64, fds: Vec<OwnedFd>) -> Reply {
        let Some(fd) = fds.into_iter().next() else { return (err(libc::EINVAL, "AddSegment needs an fd"), vec![]) };
        if len == 0 || !base.is_multiple_of(4096) || !len.is_multiple_of(4096) || self.objs.segs.contains_key(&seg) {
            return (err(libc::EINVAL, "bad segment"), vec![]);
        }
        // SAFETY: fstat into a zeroed buffer on a valid fd.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: valid fd and out pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 || (st.st_size as u64) < len {
            return (err(libc::EINVAL, "segment fd shorter than declared"), vec![]);
        }
        // A client that shrinks a segment the service maps would make the lcore fault
        // (SIGBUS) and kill the service: the segment must be sealed against shrinking.
        // SAFETY: fcntl on a valid fd.
        let sealed = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } == 0
            // SAFETY: as above.
            || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) } & libc::F_SEAL_SHRINK != 0;
        if !sealed {
            return (err(libc::EPERM, "segment must be a memfd sealable against shrinking (MFD_ALLOW_SEALING)"), vec![]);
        }
        let page = match shm::file_page_size(fd.as_fd()) {
            Ok(p) => p,
            Err(e) => return (err(libc::EINVAL, &e.to_string()), vec![]),
        };
        if !base.is_multiple_of(page) || !len.is_multiple_of(page) {
            return (err(libc::EINVAL, "huge-page segment not aligned to its page size"), vec![]);
        }
        self.objs.segs.insert(seg, SegRec { fd, base, len, offset: 0, page, guard: false, region: None });
        (Response::Ok, vec![])
    }

    /// `AddSharedSegment`: a file that already backs a shared mapping of the client, mapped as
    /// it is (no seal: the client keeps using it; a shrink is survived by the SIGBUS guard).
    pub(super) fn add_shared_segment(&mut self, seg: u64, base: u64, len: u64, offset: u64, fds: Vec<OwnedFd>) -> Reply {
        let Some(fd) = fds.into_iter().next() else { return (err(libc::EINVAL, "AddSharedSegment needs an fd"), vec![]) };
        if len == 0 || !base.is_multiple_of(4096) || !len.is_multiple_of(4096) || !offset.is_multiple_of(4096) || self.objs.segs.contains_key(&seg) {
            return (err(libc::EINVAL, "bad segment"), vec![]);
        }
        if base.checked_add(len).is_none() || offset.checked_add(len).is_none_or(|e| e > i64::MAX as u64) {
            return (err(libc::EINVAL, "segment wraps"), vec![]);
        }
        // SAFETY: fstat into a zeroed buffer on a valid fd.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: valid fd and out pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return (err(libc::EINVAL, "fstat on the segment fd failed"), vec![]);
        }
        // Memory files only: never a device (its mmap could reach hardware).
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return (err(libc::EINVAL, "shared segment must be a regular, memfd, hugetlbfs or SysV SHM file"), vec![]);
        }
        // SAFETY: fcntl F_GETFL on a valid fd.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) } & libc::O_ACCMODE != libc::O_RDWR {
            return (err(libc::EACCES, "shared segment fd must be open read-write"), vec![]);
        }
        let page = match shm::file_page_size(fd.as_fd()) {
            Ok(p) => p,
            Err(e) => return (err(libc::EINVAL, &e.to_string()), vec![]),
        };
        if !base.is_multiple_of(page) || !len.is_multiple_of(page) || !offset.is_multiple_of(page) {
            return (err(libc::EINVAL, "shared segment not aligned to its file's page size"), vec![]);
        }
        if (offset + len).div_ceil(page) > (st.st_size as u64).div_ceil(page) {
            return (err(libc::EINVAL, "shared segment beyond the end of its file"), vec![]);
        }
        let guard = !shm::sealed_against_shrink(fd.as_fd());
        self.objs.segs.insert(seg, SegRec { fd, base, len, offset, page, guard, region: None });
        (Response::Ok, vec![])
    }

    pub(super) fn release_segment(&mut self, seg: u64) -> Reply {
        match self.objs.segs.remove(&seg) {
            Some(_) => (Response::Ok, vec![]),
            None => (err(libc::EINVAL, "no such segment"), vec![]),
        }
    }
}
