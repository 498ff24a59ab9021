//! The client core: everything a process needs to use the service, in one place, shared by
//! the verbs shim (`ffi/verbs`, which adds only the C-ABI translation), the native harness of
//! `pmrxe bench` (`pmrxe_service::native`) and the control tools (`pmrxe stats`).
//!
//! * [`Channel`]: the control socket, one request/response round trip at a time.
//! * [`Connection`]: a channel after `Hello` (ABI version checked), with the client page mapped
//!   and its magic checked: doorbells ([`Connection::ring`], [`Connection::publish`]), the
//!   service's going-away flag and a cheap liveness probe, the async-event eventfd, and
//!   [`Connection::call`], which turns `Response::Err` into an [`Error`] carrying the errno.
//! * [`Mapping`]: a shared mapping of a segment fd, unmapped on drop.
//! * [`QpSegment`], [`CqSegment`], [`SrqSegment`]: a QP/CQ/SRQ segment mapped and its rings
//!   attached after checking the layout the service sent; [`poll_cq`] drains a CQ ring.
use rustix::io::Errno;
use rustix::mm::{self, MapFlags, ProtFlags};
use rustix::net::RecvFlags;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

use crate::ctrl::{self, DeviceInfo, Request, Response};
use crate::ring::{Consumer, Pod, Producer, RingError};
use crate::{
    ClientPage, CqNotify, CqSegmentLayout, Doorbell, QpSegmentLayout, ShmCqe, ShmRecvWqe, ShmSendWqe, SrqSegmentLayout, ABI_VERSION,
    CLIENT_PAGE_LEN, CLIENT_PAGE_MAGIC,
};

/// Why a client operation failed.
#[derive(Debug)]
pub enum Error {
    /// The control socket could not be reached (path too long, no such file, refused, ...).
    Connect(io::Error),
    /// A local system call failed, or a message could not be encoded/decoded.
    Io(io::Error),
    /// The service closed the connection.
    Closed,
    /// The service answered `Response::Err` (`errno` is positive).
    Service { request: &'static str, errno: i32, msg: String },
    /// The reply did not fit the protocol (what was expected).
    Protocol(&'static str),
    /// The service speaks another ABI version.
    Abi { service: u32 },
    /// A shared ring failed validation.
    Ring(RingError),
    /// The socket or the process behind it is not to be trusted (why).
    Untrusted(String),
    /// The socket's permissions refuse this user (the message says what to do).
    Denied(String),
    /// A round trip took longer than [`call_timeout`] (which request).
    Timeout(&'static str),
}

impl Error {
    /// The errno a C caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Connect(e) => e.raw_os_error().unwrap_or(libc::ENAMETOOLONG),
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Closed => libc::ECONNRESET,
            Error::Service { errno, .. } => *errno,
            Error::Protocol(_) | Error::Abi { .. } | Error::Ring(_) => libc::EPROTO,
            Error::Untrusted(_) | Error::Denied(_) => libc::EACCES,
            Error::Timeout(_) => libc::ETIMEDOUT,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Connect(e) | Error::Io(e) => e.fmt(f),
            Error::Closed => f.write_str("service closed the connection"),
            Error::Service { request, errno, msg } => write!(f, "{request}: {msg} ({})", io::Error::from_raw_os_error(*errno)),
            Error::Protocol(what) => write!(f, "pmrxe: unexpected reply to {what}"),
            Error::Abi { service } => write!(f, "service ABI {service}, ours {ABI_VERSION}"),
            Error::Ring(e) => e.fmt(f),
            Error::Untrusted(why) | Error::Denied(why) => f.write_str(why),
            Error::Timeout(what) => write!(f, "the service did not answer {what} within {:?} (PMRXE_CALL_TIMEOUT_MS)", call_timeout()),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<RingError> for Error {
    fn from(e: RingError) -> Self {
        Error::Ring(e)
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match e {
            Error::Connect(inner) | Error::Io(inner) => return inner,
            Error::Closed => io::ErrorKind::UnexpectedEof,
            Error::Service { errno, .. } => io::Error::from_raw_os_error(errno).kind(),
            Error::Protocol(_) | Error::Ring(_) => io::ErrorKind::InvalidData,
            Error::Abi { .. } => io::ErrorKind::Unsupported,
            Error::Untrusted(_) | Error::Denied(_) => io::ErrorKind::PermissionDenied,
            Error::Timeout(_) => io::ErrorKind::TimedOut,
        };
        io::Error::new(kind, e.to_string())
    }
}

/// Result of the client core.
pub type Result<T> = std::result::Result<T, Error>;

/// The name of a request in error messages.
fn request_name(r: &Request) -> &'static str {
    match r {
        Request::Hello { .. } => "Hello",
        Request::AllocPd { .. } => "AllocPd",
        Request::CreateCq { .. } => "CreateCq",
        Request::CreateQp { .. } => "CreateQp",
        Request::ModifyQp { .. } => "ModifyQp",
        Request::AddSegment { .. } => "AddSegment",
        Request::AddSharedSegment { .. } => "AddSharedSegment",
        Request::RegMr { .. } => "RegMr",
        Request::DeregMr { .. } => "DeregMr",
        _ => "request",
    }
}

/// The control socket: one `SOCK_SEQPACKET` connection, one request in flight at a time.
/// Replies come back as they are (`Response::Err` included), which is what tools and
/// hostile-client tests want; applications use [`Connection`].
pub struct Channel {
    sock: OwnedFd,
    /// Serialises request/response pairs and holds the receive buffer.
    buf: Mutex<Vec<u8>>,
    /// A round trip timed out: replies may be out of step, so no further call is made.
    broken: AtomicBool,
}

/// How long one control round trip may take before it fails with [`Error::Timeout`]:
/// `PMRXE_CALL_TIMEOUT_MS`, default 30 s (a registration of many gigabytes populates its
/// pages inside the call).
pub fn call_timeout() -> std::time::Duration {
    let ms = std::env::var("PMRXE_CALL_TIMEOUT_MS").ok().and_then(|v| v.parse::<u64>().ok()).filter(|&v| v > 0).unwrap_or(30_000);
    std::time::Duration::from_millis(ms)
}

/// The uid a trusted service may run as besides root and the client's own: the user named by
/// `PMRXE_SERVICE_USER`, else a `pmrxe` user if the host has one.
pub fn service_uid() -> Option<u32> {
    let name = std::env::var("PMRXE_SERVICE_USER").unwrap_or_else(|_| "pmrxe".into());
    ctrl::user_uid(&name)
}

impl Channel {
    /// Connect to the service's socket at `path` (no `Hello`), authenticating the service:
    /// the socket's directory must not be writable by others nor belong to a stranger
    /// ([`ctrl::untrusted_socket_dir`]), and the process that listens must run as root, as
    /// this user, or as the service user ([`service_uid`]) — checked with `SO_PEERCRED` — so an
    /// unprivileged user's own `pmrxe serve` can never receive another user's memory. Every
    /// round trip then has a timeout ([`call_timeout`]).
    pub fn connect(path: &Path) -> Result<Channel> {
        let me = rustix::process::getuid().as_raw();
        let service = service_uid();
        if let Some(why) = ctrl::untrusted_socket_dir(path, me, service) {
            return Err(Error::Untrusted(format!("refusing the control socket {}: {why}", path.display())));
        }
        let sock = ctrl::seqpacket_connect(path).map_err(|e| match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => {
                // The socket's group is the one that admits users (service.group).
                use std::os::unix::fs::MetadataExt;
                let group = std::fs::metadata(path).ok().and_then(|m| ctrl::group_name(m.gid())).unwrap_or_else(|| "pmrxe".into());
                Error::Denied(format!(
                    "permission denied (not in group {group}): {} admits root and the members of group {group}; ask the operator to add you (usermod -aG {group} USER)",
                    path.display()
                ))
            }
            _ => Error::Connect(e),
        })?;
        let (_, uid, _) = ctrl::peer_cred(&sock)?;
        if uid != 0 && uid != me && Some(uid) != service {
            return Err(Error::Untrusted(format!(
                "refusing the service at {}: it runs as uid {uid}, neither root, you nor the service user",
                path.display()
            )));
        }
        ctrl::set_timeouts(&sock, call_timeout())?;
        Ok(Channel { sock, buf: Mutex::new(Vec::new()), broken: AtomicBool::new(false) })
    }

    /// One request/response round trip, the response as it came. A round trip that exceeds
    /// [`call_timeout`] fails with [`Error::Timeout`] and leaves the channel unusable (a late
    /// reply would answer the next request).
    pub fn call(&self, req: &Request, fds: &[RawFd]) -> Result<(Response, Vec<OwnedFd>)> {
        let mut buf = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        if self.broken.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        let timed_out = |e: io::Error| {
            if matches!(e.raw_os_error(), Some(libc::EAGAIN)) {
                self.broken.store(true, Ordering::Relaxed);
                Error::Timeout(request_name(req))
            } else {
                Error::Io(e)
            }
        };
        ctrl::send_msg(self.sock.as_raw_fd(), &ctrl::encode(req)?, fds).map_err(timed_out)?;
        let got = ctrl::recv_msg_fds(self.sock.as_raw_fd(), &mut buf, ctrl::MAX_REPLY_FDS).map_err(timed_out)?.ok_or(Error::Closed)?;
        Ok((ctrl::decode(&buf)?, got))
    }

    /// One round trip; `Response::Err` becomes [`Error::Service`] (errno 0 or negative: EIO).
    pub fn call_checked(&self, req: &Request, fds: &[RawFd]) -> Result<(Response, Vec<OwnedFd>)> {
        match self.call(req, fds)? {
            (Response::Err { errno, msg }, _) => Err(Error::Service { request: request_name(req), errno: if errno > 0 { errno } else { libc::EIO }, msg }),
            r => Ok(r),
        }
    }

    /// Has the service gone (end-of-file or an error on the socket)? One non-blocking peek.
    pub fn peer_gone(&self) -> bool {
        let mut b = [0u8; 1];
        match rustix::net::recv(&self.sock, &mut b, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            Ok((n, _)) => n == 0,
            Err(e) => e != Errno::AGAIN && e != Errno::INTR,
        }
    }
}

/// A shared read/write mapping of (part of) a file descriptor, unmapped on drop.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a Mapping is plain address-space ownership; who touches the bytes how is decided by
// its owner (atomics or single-owner rings).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// mmap `len` bytes of `fd` from its start, shared read/write.
    pub fn map_fd(fd: RawFd, len: usize) -> io::Result<Mapping> {
        Mapping::map(fd, 0, len, false)
    }

    /// mmap `len` bytes of `fd` at `offset`, shared read/write (`populate`: fault the pages in
    /// now). EINVAL for an empty mapping.
    pub fn map(fd: RawFd, offset: u64, len: usize, populate: bool) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let flags = MapFlags::SHARED | if populate { MapFlags::POPULATE } else { MapFlags::empty() };
        ctrl::with_borrowed(&[fd], |fd| {
            // SAFETY: a fresh mapping at a kernel-chosen address (null hint, no MAP_FIXED); no
            // existing memory is touched.
            let p = unsafe { mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, flags, fd[0], offset) }?;
            Ok(Mapping { ptr: p.cast(), len })
        })
    }

    /// Start of the mapping (page aligned).
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (an empty mapping is refused); for clippy.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping (made by `map`); nothing borrows it past its owner.
        let _ = unsafe { mm::munmap(self.ptr.cast(), self.len) };
    }
}

/// The one way pmrxe makes shared memory: a close-on-exec, sealable memfd of `len` bytes named
/// `name`, backed by huge pages of `huge_page` bytes (hugetlb; 0 = ordinary 4 KiB pages), and
/// with `seal_size` sealed against shrinking and growing for good (a peer that shrank it
/// would make the other side's next access raise SIGBUS). The service's segments, the shim's
/// registration copies and the native harness's buffers all come from here; callers that
/// want huge pages when free try `huge_page` first and 0 on failure.
pub fn memfd(name: &std::ffi::CStr, len: u64, huge_page: u64, seal_size: bool) -> io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    // MFD_HUGE_SHIFT (26): log2 of the huge page size in the flags.
    let huge = if huge_page > 4096 { MemfdFlags::HUGETLB | MemfdFlags::from_bits_retain(huge_page.trailing_zeros() << 26) } else { MemfdFlags::empty() };
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING | huge)?;
    rustix::fs::ftruncate(&fd, len)?;
    if seal_size {
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    }
    Ok(fd)
}

/// A connection after `Hello`: the client page mapped (doorbells), the device list, the
/// async-event eventfd.
pub struct Connection {
    chan: Channel,
    page: Mapping,
    /// The service's async-event eventfd (non-blocking, signalled for every queued event).
    pub events_fd: OwnedFd,
    /// The lcores' wake-up eventfds, by lcore index: a doorbell whose row says the lcore
    /// sleeps is followed by one write to its fd ([`Connection::ring`]).
    wake_fds: Vec<OwnedFd>,
    pub client_id: u32,
    pub devices: Vec<DeviceInfo>,
    /// Set once the service is known to be gone (orderly stop or crash).
    dead: AtomicBool,
    /// Empty CQ polls since the last liveness check.
    idle_polls: AtomicU32,
}

impl Connection {
    /// Connect to the socket at `path`, say `Hello` as `program` (ABI version checked), map the
    /// client page and check its magic.
    pub fn connect(path: &Path, program: String) -> Result<Connection> {
        let chan = Channel::connect(path)?;
        let pid = std::process::id();
        let (resp, fds) = chan.call_checked(&Request::Hello { abi_version: ABI_VERSION, pid, program }, &[])?;
        let Response::Hello { abi_version, client_id, devices } = resp else { return Err(Error::Protocol("Hello")) };
        if abi_version != ABI_VERSION {
            return Err(Error::Abi { service: abi_version });
        }
        let mut fds = fds.into_iter();
        let page_fd = fds.next().ok_or(Error::Protocol("Hello (no client page)"))?;
        let page = Mapping::map_fd(page_fd.as_raw_fd(), CLIENT_PAGE_LEN as usize)?;
        let events_fd = fds.next().ok_or(Error::Protocol("Hello (no event fd)"))?;
        let wake_fds = fds.collect();
        let c = Connection { chan, page, events_fd, wake_fds, client_id, devices, dead: AtomicBool::new(false), idle_polls: AtomicU32::new(0) };
        if c.page().magic != CLIENT_PAGE_MAGIC {
            return Err(Error::Protocol("Hello (client page magic)"));
        }
        Ok(c)
    }

    /// One request, one response; `Response::Err` becomes [`Error::Service`].
    pub fn call(&self, req: &Request, fds: &[RawFd]) -> Result<(Response, Vec<OwnedFd>)> {
        self.chan.call_checked(req, fds)
    }

    /// A request whose only success is `Response::Ok`.
    pub fn call_ok(&self, req: &Request) -> Result<()> {
        match self.call(req, &[])?.0 {
            Response::Ok => Ok(()),
            _ => Err(Error::Protocol("a request expecting Ok")),
        }
    }

    /// The client page.
    pub fn page(&self) -> &ClientPage {
        // SAFETY: the mapping is CLIENT_PAGE_LEN bytes, page aligned, lives as long as `self`,
        // and ClientPage fits (const-asserted in layout.rs); its shared fields are atomics.
        unsafe { &*self.page.ptr().cast::<ClientPage>() }
    }

    /// Ring a queue's doorbell (two `fetch_or`s, a fence and a load), and wake its lcore with
    /// one eventfd write only if the lcore said it sleeps ([`ClientPage::ring`]): no system
    /// call while it is awake.
    #[inline]
    pub fn ring(&self, db: Doorbell) {
        if self.page().ring(db) {
            self.wake(db.lcore as usize);
        }
    }

    #[cold]
    fn wake(&self, lcore: usize) {
        if let Some(fd) = self.wake_fds.get(lcore) {
            // Non-blocking eventfd: a full counter (never in practice) already means "awake".
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }

    /// Publish what is staged in `prod` (one release store) and ring `db`.
    #[inline]
    pub fn publish<T: Pod>(&self, prod: &mut Producer<T>, db: Doorbell) {
        prod.publish();
        self.ring(db);
    }

    /// After an empty CQ poll: if an lcore of this client's service sleeps — or was woken and
    /// has not run yet — give up the CPU once (`sched_yield`). On a CPU shared by a
    /// busy-polling application and an lcore in `wait` mode, the woken lcore otherwise waits
    /// for the application's time slice to end: milliseconds, for a reply the application is
    /// polling for. Costs nothing while the lcores are awake (one load per lcore); while they
    /// sleep, the application is waiting anyway. The flag is the need-wakeup bit of this
    /// client's own rows ([`crate::DoorbellRow::lcore_sleeping`]).
    #[inline]
    pub fn yield_to_waiting_lcore(&self) {
        let page = self.page();
        if (0..self.wake_fds.len()).any(|i| page.row(i).lcore_sleeping()) {
            rustix::thread::sched_yield();
        }
    }

    /// True once the service announced it is going away.
    pub fn service_down(&self) -> bool {
        self.page().service_down.load(Ordering::Relaxed) != 0
    }

    /// Is the service gone? Cheap on the data path: an atomic load, plus — only after many
    /// empty CQ polls (the application is waiting anyway) — one non-blocking peek at the
    /// control socket, which reads end-of-file once the service process has died (SIGKILL
    /// included).
    pub fn dead_after_empty_poll(&self) -> bool {
        if self.dead.load(Ordering::Relaxed) {
            return true;
        }
        if self.service_down() {
            self.dead.store(true, Ordering::Relaxed);
            return true;
        }
        if self.idle_polls.fetch_add(1, Ordering::Relaxed) & 0xffff != 0xffff {
            return false;
        }
        let gone = self.chan.peer_gone();
        if gone {
            self.dead.store(true, Ordering::Relaxed);
            eprintln!("pmrxe: the pmrxe service went away; completions fail from now on (IBV_EVENT_DEVICE_FATAL)");
        }
        gone
    }

    /// Known dead (no probing).
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }
}

/// The first fd of a reply, which carries the object's segment.
fn segment_fd<'a>(fds: &'a [OwnedFd], what: &'static str) -> Result<&'a OwnedFd> {
    fds.first().ok_or(Error::Protocol(what))
}

/// A QP segment, mapped, with its send ring and (without an SRQ) its receive ring attached.
pub struct QpSegment {
    pub sq: Producer<ShmSendWqe>,
    pub rq: Option<Producer<ShmRecvWqe>>,
    /// Starts with the [`crate::QpShared`] header; owns the rings' memory.
    pub map: Mapping,
}

impl QpSegment {
    /// Map the segment of a `Response::Qp` (`fds` as received) and attach its rings after
    /// checking `layout`; the receive ring only if `with_rq` (no SRQ) and it has capacity.
    pub fn attach(fds: &[OwnedFd], layout: &QpSegmentLayout, with_rq: bool) -> Result<QpSegment> {
        let fd = segment_fd(fds, "CreateQp (no fd)")?;
        let sq_end = if layout.rq_capacity > 0 { layout.rq_offset } else { layout.total_len };
        if sq_end > layout.total_len || layout.sq_offset < QpSegmentLayout::HEADER || layout.sq_offset >= sq_end || layout.rq_offset > layout.total_len {
            return Err(Error::Protocol("CreateQp (layout)"));
        }
        let map = Mapping::map_fd(fd.as_raw_fd(), layout.total_len as usize)?;
        // SAFETY: [sq_offset, sq_end) was checked to lie inside the mapping, which the
        // QpSegment owns for as long as the producer lives.
        let sq = unsafe { Producer::attach(map.ptr().add(layout.sq_offset as usize), (sq_end - layout.sq_offset) as usize, layout.sq_capacity) }?;
        let rq = if layout.rq_capacity > 0 && with_rq {
            // SAFETY: as above, [rq_offset, total_len) lies inside the mapping.
            Some(unsafe { Producer::attach(map.ptr().add(layout.rq_offset as usize), (layout.total_len - layout.rq_offset) as usize, layout.rq_capacity) }?)
        } else {
            None
        };
        Ok(QpSegment { sq, rq, map })
    }
}

/// A CQ segment, mapped, with its completion ring attached.
pub struct CqSegment {
    pub cons: Consumer<ShmCqe>,
    /// Starts with the [`CqNotify`] header; owns the ring's memory.
    pub map: Mapping,
}

impl CqSegment {
    /// Map the segment of a `Response::Cq` and attach its ring after checking `layout`.
    pub fn attach(fds: &[OwnedFd], layout: &CqSegmentLayout) -> Result<CqSegment> {
        let fd = segment_fd(fds, "CreateCq (no fd)")?;
        if layout.ring_offset >= layout.total_len || (layout.ring_offset as usize) < std::mem::size_of::<CqNotify>() {
            return Err(Error::Protocol("CreateCq (layout)"));
        }
        let map = Mapping::map_fd(fd.as_raw_fd(), layout.total_len as usize)?;
        // SAFETY: the ring lies inside the mapping (checked offset), which the CqSegment owns.
        let cons = unsafe { Consumer::attach(map.ptr().add(layout.ring_offset as usize), (layout.total_len - layout.ring_offset) as usize, layout.capacity) }?;
        Ok(CqSegment { cons, map })
    }

    /// The notification header at the start of the segment (all atomics).
    pub fn notify(&self) -> *const CqNotify {
        self.map.ptr().cast::<CqNotify>().cast_const()
    }
}

/// An SRQ segment, mapped, with its receive ring attached.
pub struct SrqSegment {
    pub rq: Producer<ShmRecvWqe>,
    pub map: Mapping,
}

impl SrqSegment {
    /// Map the segment of a `Response::Srq` and attach its ring (which starts the segment).
    pub fn attach(fds: &[OwnedFd], layout: &SrqSegmentLayout) -> Result<SrqSegment> {
        let fd = segment_fd(fds, "CreateSrq (no fd)")?;
        let map = Mapping::map_fd(fd.as_raw_fd(), layout.total_len as usize)?;
        // SAFETY: the ring starts the segment and spans the mapping, which the SrqSegment owns.
        let rq = unsafe { Producer::attach(map.ptr(), layout.total_len as usize, layout.capacity) }?;
        Ok(SrqSegment { rq, map })
    }
}

/// Drain up to `max` completions from `cons`, handing each to `each` with its index, then
/// release the slots (one store). No system call. How many were taken.
#[inline]
pub fn poll_cq(cons: &mut Consumer<ShmCqe>, max: usize, mut each: impl FnMut(usize, ShmCqe)) -> std::result::Result<usize, RingError> {
    let mut n = 0;
    while n < max {
        match cons.peek()? {
            Some(e) => {
                each(n, e);
                cons.advance();
                n += 1;
            }
            None => break,
        }
    }
    if n > 0 {
        cons.release();
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_of_each_error() {
        assert_eq!(Error::Connect(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long")).errno(), libc::ENAMETOOLONG);
        assert_eq!(Error::Connect(io::Error::from_raw_os_error(libc::ENOENT)).errno(), libc::ENOENT);
        assert_eq!(Error::Io(io::Error::new(io::ErrorKind::InvalidData, "bad")).errno(), libc::EIO);
        assert_eq!(Error::Closed.errno(), libc::ECONNRESET);
        assert_eq!(Error::Service { request: "AllocPd", errno: libc::EBUSY, msg: "x".into() }.errno(), libc::EBUSY);
        assert_eq!(Error::Protocol("Hello").errno(), libc::EPROTO);
        assert_eq!(Error::Abi { service: 0 }.errno(), libc::EPROTO);
        let e: io::Error = Error::Service { request: "RegMr", errno: libc::EINVAL, msg: "bad range".into() }.into();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().starts_with("RegMr: bad range ("), "{e}");
        let e: io::Error = Error::Closed.into();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let e: io::Error = Error::Io(io::Error::from_raw_os_error(libc::EAGAIN)).into();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
    }

    #[test]
    fn empty_mapping_is_einval() {
        assert_eq!(Mapping::map_fd(-1, 0).err().and_then(|e| e.raw_os_error()), Some(libc::EINVAL));
    }

    #[test]
    fn service_error_reply_becomes_errno() {
        // A socketpair stands in for the service: it answers one request with Err (errno 0 is
        // normalised to EIO) and the next with Ok.
        let (a, b) = ctrl::seqpacket_pair().unwrap();
        let chan = Channel { sock: a, buf: Mutex::new(Vec::new()), broken: AtomicBool::new(false) };
        let server = std::thread::spawn(move || {
            let mut buf = Vec::new();
            for resp in [Response::Err { errno: 0, msg: "nope".into() }, Response::Ok] {
                ctrl::recv_msg(b.as_raw_fd(), &mut buf).unwrap().unwrap();
                let _: Request = ctrl::decode(&buf).unwrap();
                ctrl::send_msg(b.as_raw_fd(), &ctrl::encode(&resp).unwrap(), &[]).unwrap();
            }
        });
        match chan.call_checked(&Request::AllocPd { device: 0 }, &[]) {
            Err(Error::Service { request: "AllocPd", errno, msg }) => assert_eq!((errno, msg.as_str()), (libc::EIO, "nope")),
            other => panic!("{:?}", other.map(|r| r.0)),
        }
        assert!(matches!(chan.call_checked(&Request::AllocPd { device: 0 }, &[]), Ok((Response::Ok, _))));
        server.join().unwrap();
        // The peer is gone: end of file.
        assert!(chan.peer_gone());
        assert!(matches!(chan.call(&Request::AllocPd { device: 0 }, &[]), Err(Error::Closed | Error::Io(_))));
    }
}
