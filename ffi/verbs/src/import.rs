//! Shared objects within a process: `ibv_import_device`, `ibv_import_pd`, `ibv_import_mr`
//! and their `unimport` verbs (rdma-core's "shared PD" API, pyverbs' test_shared_pd).
//!
//! In rdma-core a context's `cmd_fd` is the uverbs file; a dup of it names the same kernel
//! object table, so `ibv_import_device(dup)` gives a second context onto the same objects and
//! the import verbs wrap objects of that table by their `handle`. Here the object table is the
//! process's client session with the service (one per process), so:
//!
//! * every context's `cmd_fd` is a small sealed memfd whose contents name the process, the
//!   client session and the device (`pmrxe-verbs-context 1 pid=P client=C device=D`). It is
//!   inert towards the real libibverbs (writes fail with EPERM: sealed; ioctls with ENOTTY)
//!   and closed by `ibv_close_device`;
//! * `ibv_import_device(fd)` reads that description and opens a new context on device D over
//!   the same session; the new context owns `fd` (closed by `ibv_close_device`, as rdma-core);
//! * `ibv_import_pd` / `ibv_import_mr` return a new wrapper around a live service PD / MR of
//!   this process, found by its service handle (the `handle` field), with no service call:
//!   nothing new is created. `ibv_unimport_*` frees only the wrapper; the object belongs to
//!   whoever created it (destroying it through an imported wrapper destroys it, as in
//!   rdma-core).
//!
//! Errors: a `cmd_fd` that is not open, or is not a pmrxe context description, is EINVAL (what
//! rdma-core answers for an fd that is not a uverbs device); the description of another
//! process or another client session (passed with `SCM_RIGHTS`, or inherited across `fork`)
//! is EOPNOTSUPP: that session's objects cannot be named from this one. An unknown PD handle,
//! or a PD of another device, is EINVAL; an unknown MR handle, or an MR of another PD, is
//! EINVAL.
use crate::boundary::{ffi_boundary, ret_ptr, set_errno, Errno, Handle, Res};
use crate::client;
use crate::device::ShimContext;
use crate::mr::ShimMr;
use crate::pd::ShimPd;
use crate::sys::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::raw::c_int;

/// Seals of a context description: nothing can change it any more.
const SEALS: c_int = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
/// The first word of a description.
const TAG: &str = "pmrxe-verbs-context";
/// Longest description read back.
const MAX_DESC: usize = 128;

/// Who a context belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    pub client: u32,
    pub device: u32,
}

impl Owner {
    fn describe(&self) -> String {
        format!("{TAG} 1 pid={} client={} device={}\n", self.pid, self.client, self.device)
    }

    fn parse(s: &str) -> Option<Owner> {
        let mut w = s.strip_suffix('\n')?.split(' ');
        if w.next()? != TAG || w.next()? != "1" {
            return None;
        }
        let mut field = |name: &str| w.next()?.strip_prefix(name)?.strip_prefix('=')?.parse::<u32>().ok();
        let o = Owner { pid: field("pid")?, client: field("client")?, device: field("device")? };
        w.next().is_none().then_some(o)
    }
}

/// A sealed memfd holding `owner`'s description (close-on-exec, as libibverbs opens uverbs).
pub fn description_fd(owner: Owner) -> Res<OwnedFd> {
    // SAFETY: plain memfd_create with a static NUL-terminated name.
    let raw = unsafe { libc::memfd_create(c"pmrxe-ctx".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(Errno::last());
    }
    // SAFETY: a fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let d = owner.describe();
    // SAFETY: writes `d.len()` bytes from a live buffer to our fd.
    let n = unsafe { libc::write(fd.as_raw_fd(), d.as_ptr().cast(), d.len()) };
    if n != d.len() as isize {
        return Err(if n < 0 { Errno::last() } else { Errno::IO });
    }
    // SAFETY: fcntl on our fd.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
        return Err(Errno::last());
    }
    Ok(fd)
}

/// The `cmd_fd` of a new context on client device `device` of this process's session.
pub fn context_fd(device: u32) -> Res<OwnedFd> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    description_fd(Owner { pid, client: client::existing()?.client_id, device })
}

/// Read the description behind `fd` without changing or blocking on it: only a regular file
/// with exactly our seals (a memfd nobody can write) is read, with `pread`. EINVAL otherwise.
pub fn read_description(fd: RawFd) -> Res<Owner> {
    // SAFETY: plain C data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a local struct; a bad fd is an error return.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size as usize > MAX_DESC {
        return Err(Errno::INVAL);
    }
    // SAFETY: fcntl F_GET_SEALS only reads (EINVAL on files without sealing).
    if unsafe { libc::fcntl(fd, libc::F_GET_SEALS) } != SEALS {
        return Err(Errno::INVAL);
    }
    let mut buf = [0u8; MAX_DESC];
    // SAFETY: reads at most MAX_DESC bytes into our buffer; a regular file never blocks.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), MAX_DESC, 0) };
    if n <= 0 {
        return Err(Errno::INVAL);
    }
    std::str::from_utf8(&buf[..n as usize]).ok().and_then(Owner::parse).ok_or(Errno::INVAL)
}

/// The device of a context description made by this process's session (see the module doc
/// for the errors).
pub fn own_device(o: Owner, pid: u32, client: u32) -> Res<u32> {
    if o.pid != pid || o.client != client {
        return Err(Errno::OPNOTSUPP);
    }
    Ok(o.device)
}

fn import_device(cmd_fd: c_int) -> Res<*mut ibv_context> {
    let o = read_description(cmd_fd)?;
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    // No session in this process: the description cannot be ours.
    let c = client::existing().map_err(|_| Errno::OPNOTSUPP)?;
    let device = own_device(o, pid, c.client_id)?;
    let dev = crate::device::device_ptr(device)?;
    crate::device::open_with(dev, device, || {
        // SAFETY: the caller hands `cmd_fd` to the new context (rdma-core contract: closed by
        // ibv_close_device); this runs only once nothing else can fail.
        Ok(unsafe { OwnedFd::from_raw_fd(cmd_fd) })
    })
}

/// `ibv_import_device@IBVERBS_1.10`: a new context on the device and session `cmd_fd` (a dup
/// of some context's `cmd_fd`) describes; the context owns `cmd_fd` from then on.
///
/// # Safety
/// `cmd_fd` is an fd the caller gives up on success.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    ffi_boundary(std::ptr::null_mut(), || ret_ptr(import_device(cmd_fd)))
}

fn import_pd(context: *mut ibv_context, pd_handle: u32) -> Res<*mut ibv_pd> {
    // SAFETY: magic-checked.
    let c = unsafe { ShimContext::from_ctx(context) }?;
    let dev = c.dev;
    ShimPd::find_live(|p| p.pd.handle == pd_handle && p.dev == dev).ok_or(Errno::INVAL)?;
    Ok(ShimPd::wrap(ibv_pd { context, handle: pd_handle }, dev).into_c())
}

/// `ibv_import_pd@IBVERBS_1.10`: another handle on this process's live PD `pd_handle`, in
/// `context` (same device). EINVAL if there is none.
///
/// # Safety
/// `context` is ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(context: *mut ibv_context, pd_handle: u32) -> *mut ibv_pd {
    ffi_boundary(std::ptr::null_mut(), || ret_ptr(import_pd(context, pd_handle)))
}

/// `ibv_unimport_pd@IBVERBS_1.10`: free the handle only (the PD stays; its creator
/// deallocates it).
///
/// # Safety
/// `pd` is ours and no longer used.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(pd: *mut ibv_pd) {
    ffi_boundary((), || {
        // SAFETY: magic-checked.
        match unsafe { ShimPd::from_c(pd) } {
            // SAFETY: validated just above; the application gives the handle up.
            Ok(_) => drop(unsafe { ShimPd::take(pd) }),
            Err(Errno(e)) => set_errno(e),
        }
    })
}

fn import_mr(pd: *mut ibv_pd, mr_handle: u32) -> Res<*mut ibv_mr> {
    // SAFETY: magic-checked.
    let p = unsafe { ShimPd::from_c(pd) }?;
    let (pd_handle, dev) = (p.pd.handle, p.dev);
    // Wrappers of MR `mr_handle`: their PD pointers (compared by address below, never
    // dereferenced: a wrapper may outlive an unimported PD handle) and what the import copies.
    let mut found: Vec<(usize, u32, u32, usize, bool, u32)> = Vec::new();
    ShimMr::find_live(|m| {
        let r = m.mr();
        if r.handle == mr_handle {
            found.push((r.pd as usize, r.lkey, r.rkey, r.length, m.fast, m.max_num_sg));
        }
        false
    });
    // The MR must be in PD `pd_handle`: one of its wrappers' PD handles is a live one of it.
    let (_, lkey, rkey, length, fast, max_num_sg) = *found
        .iter()
        .find(|f| ShimPd::find_live(|q| q as *const ShimPd as usize == f.0 && q.pd.handle == pd_handle && q.dev == dev).is_some())
        .ok_or(Errno::INVAL)?;
    // As rdma-core (ibv_cmd_query_mr): keys and length of the MR, address NULL.
    let mr = ibv_mr { context: p.pd.context, pd, addr: std::ptr::null_mut(), length, handle: mr_handle, lkey, rkey };
    Ok(ShimMr::new(mr, fast, max_num_sg, Vec::new(), 0).into_c())
}

/// `ibv_import_mr@IBVERBS_1.10`: another handle on this process's live MR `mr_handle` of PD
/// `pd` (keys and length copied, `addr` NULL as in rdma-core). It holds no memory of its own:
/// the MR's creator keeps the pages registered until it deregisters. EINVAL if there is none.
///
/// # Safety
/// `pd` is ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    ffi_boundary(std::ptr::null_mut(), || ret_ptr(import_mr(pd, mr_handle)))
}

/// `ibv_unimport_mr@IBVERBS_1.10`: free the handle only (the MR stays registered; its
/// creator deregisters it).
///
/// # Safety
/// `mr` is ours and no longer used.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(mr: *mut ibv_mr) {
    ffi_boundary((), || {
        // SAFETY: magic-checked.
        match unsafe { ShimMr::from_c(mr) } {
            // SAFETY: validated just above; the application gives the handle up. Segment
            // references of an original unimported by mistake are not released: the service
            // MR still uses those pages.
            Ok(_) => drop(unsafe { ShimMr::take(mr) }),
            Err(Errno(e)) => set_errno(e),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> u32 {
        // SAFETY: getpid has no preconditions.
        unsafe { libc::getpid() as u32 }
    }

    #[test]
    fn description_round_trips_through_a_dup_and_is_sealed() {
        let o = Owner { pid: me(), client: 7, device: 1 };
        let fd = description_fd(o).unwrap();
        // SAFETY: dup of our fd.
        let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(fd.as_raw_fd())) };
        assert_eq!(read_description(dup.as_raw_fd()), Ok(o));
        assert_eq!(own_device(o, me(), 7), Ok(1));
        // The real libibverbs writing commands to it gets EPERM, not a changed description.
        // SAFETY: write of 4 bytes from a static buffer to our fd.
        let n = unsafe { libc::pwrite(fd.as_raw_fd(), b"junk".as_ptr().cast(), 4, 0) };
        assert_eq!((n, Errno::last()), (-1, Errno(libc::EPERM)));
        assert_eq!(read_description(fd.as_raw_fd()), Ok(o));
    }

    #[test]
    fn another_session_or_process_is_eopnotsupp() {
        let o = Owner { pid: me(), client: 7, device: 0 };
        assert_eq!(own_device(o, me(), 8), Err(Errno::OPNOTSUPP));
        assert_eq!(own_device(o, me() + 1, 7), Err(Errno::OPNOTSUPP));
    }

    #[test]
    fn foreign_fds_are_einval() {
        // Closed / never opened.
        assert_eq!(read_description(-1), Err(Errno::INVAL));
        assert_eq!(read_description(999_999), Err(Errno::INVAL));
        // A character device, a pipe (must not block), an unsealed memfd with our text.
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(read_description(null.as_raw_fd()), Err(Errno::INVAL));
        let mut p = [0 as c_int; 2];
        // SAFETY: pipe into a local array.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: fresh fds we own.
        let (r, _w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        assert_eq!(read_description(r.as_raw_fd()), Err(Errno::INVAL));
        // SAFETY: plain memfd_create.
        let m = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC)) };
        let d = Owner { pid: me(), client: 1, device: 0 }.describe();
        // SAFETY: write from a live buffer to our fd.
        assert_eq!(unsafe { libc::write(m.as_raw_fd(), d.as_ptr().cast(), d.len()) }, d.len() as isize);
        assert_eq!(read_description(m.as_raw_fd()), Err(Errno::INVAL));
    }

    #[test]
    fn malformed_descriptions_do_not_parse() {
        for s in ["", "pmrxe-verbs-context 1 pid=1 client=2 device=3", "pmrxe-verbs-context 2 pid=1 client=2 device=3\n", "pmrxe-verbs-context 1 pid=1 client=2\n", "pmrxe-verbs-context 1 pid=1 client=2 device=3 x=4\n", "pmrxe-verbs-context 1 client=2 pid=1 device=3\n"] {
            assert_eq!(Owner::parse(s), None, "{s:?}");
        }
        assert_eq!(Owner::parse("pmrxe-verbs-context 1 pid=1 client=2 device=3\n"), Some(Owner { pid: 1, client: 2, device: 3 }));
    }
}
