//! Connection to the service, the client page, protection domains.
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pmrxe_abi::ctrl::{DeviceInfo, Request, Response};
use pmrxe_abi::{ClientPage, Doorbell, ABI_VERSION, CLIENT_PAGE_LEN, CLIENT_PAGE_MAGIC};

use super::{proto, Result};
use crate::client::Client;

/// A shared mapping of a segment fd, unmapped on drop.
pub(crate) struct Mapping {
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: the mapping is plain shared memory; who touches it how is decided by the owner.
unsafe impl Send for Mapping {}
// SAFETY: as above; shared access goes through atomics or single-owner rings.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub fn map_fd(fd: RawFd, len: usize, populate: bool) -> io::Result<Mapping> {
        let flags = libc::MAP_SHARED | if populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: a fresh mapping at a kernel-chosen address.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

pub(crate) struct Inner {
    client: Mutex<Client>,
    page: Mapping,
    pub client_id: u32,
    pub devices: Vec<DeviceInfo>,
    next_seg: AtomicU64,
}

/// A connection to the service (cheap to clone; every object holds one).
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<Inner>,
}

impl Context {
    /// Connect to the control socket at `path` and say hello.
    pub fn connect(path: &Path) -> Result<Context> {
        let client = Client::connect(path)?;
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        let program = std::env::args().next().unwrap_or_else(|| "pmrxe-native".into());
        let (resp, fds) = checked(&client, &Request::Hello { abi_version: ABI_VERSION, pid, program }, &[])?;
        let Response::Hello { abi_version, client_id, devices } = resp else { return Err(proto("Hello")) };
        if abi_version != ABI_VERSION {
            return Err(io::Error::new(io::ErrorKind::Unsupported, format!("service ABI {abi_version}, ours {ABI_VERSION}")));
        }
        let fd = fds.first().ok_or_else(|| proto("Hello (no client page)"))?;
        let page = Mapping::map_fd(fd.as_raw_fd(), CLIENT_PAGE_LEN as usize, false)?;
        let inner = Inner { client: Mutex::new(client), page, client_id, devices, next_seg: AtomicU64::new(1) };
        let ctx = Context { inner: Arc::new(inner) };
        if ctx.page().magic != CLIENT_PAGE_MAGIC {
            return Err(proto("Hello (client page magic)"));
        }
        Ok(ctx)
    }

    /// Connect to `$PMRXE_SOCKET`, else the default socket.
    pub fn connect_default() -> Result<Context> {
        Context::connect(&pmrxe_abi::ctrl::socket_path(pmrxe_abi::ctrl::DEFAULT_SOCKET))
    }

    /// The devices the service announced (`pmrxe0`, `pmrxe1`, ...).
    pub fn devices(&self) -> &[DeviceInfo] {
        &self.inner.devices
    }

    /// Index of the device called `name`.
    pub fn device_index(&self, name: &str) -> Option<u32> {
        self.inner.devices.iter().find(|d| d.name == name).map(|d| d.index)
    }

    /// Our client id at the service.
    pub fn client_id(&self) -> u32 {
        self.inner.client_id
    }

    pub(crate) fn page(&self) -> &ClientPage {
        // SAFETY: CLIENT_PAGE_LEN bytes mapped for the life of `inner`; ClientPage fits.
        unsafe { &*self.inner.page.ptr.cast::<ClientPage>() }
    }

    /// Ring a queue's doorbell (one `fetch_or`, release).
    #[inline]
    pub fn ring(&self, db: Doorbell) {
        self.page().ring(db);
    }

    /// True once the service said it is going away.
    pub fn service_down(&self) -> bool {
        self.page().service_down.load(Ordering::Relaxed) != 0
    }

    /// One request, one response; `Response::Err` becomes an `io::Error` with its errno.
    pub fn call(&self, req: &Request, fds: &[RawFd]) -> Result<(Response, Vec<OwnedFd>)> {
        let c = self.inner.client.lock().unwrap_or_else(|e| e.into_inner());
        checked(&c, req, fds)
    }

    /// A request whose only success is `Response::Ok`.
    pub fn call_ok(&self, req: &Request) -> Result<()> {
        match self.call(req, &[])?.0 {
            Response::Ok => Ok(()),
            _ => Err(proto("a request expecting Ok")),
        }
    }

    pub(crate) fn next_seg(&self) -> u64 {
        // Native segments use ids far from the shim's (which start at 1), in case both ever
        // share a process; each client has its own id space at the service anyway.
        (1 << 48) | self.inner.next_seg.fetch_add(1, Ordering::Relaxed)
    }

    /// Service statistics (text or JSON).
    pub fn stats(&self, json: bool) -> Result<String> {
        match self.call(&pmrxe_abi::ctrl::Request::Stats { json }, &[])?.0 {
            Response::Stats(s) => Ok(s),
            _ => Err(proto("Stats")),
        }
    }
}

fn checked(c: &Client, req: &Request, fds: &[RawFd]) -> Result<(Response, Vec<OwnedFd>)> {
    let (resp, fds) = c.call(req, fds)?;
    match resp {
        Response::Err { errno, msg } => {
            let e = io::Error::from_raw_os_error(if errno > 0 { errno } else { libc::EIO });
            Err(io::Error::new(e.kind(), format!("{}: {msg} ({e})", req_name(req))))
        }
        r => Ok((r, fds)),
    }
}

fn req_name(r: &Request) -> &'static str {
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

/// A protection domain on one device.
pub struct Pd {
    pub(crate) ctx: Context,
    pub device: u32,
    pub handle: u32,
}

impl Pd {
    /// Allocate a PD on device `device` (index into [`Context::devices`]).
    pub fn alloc(ctx: &Context, device: u32) -> Result<Pd> {
        match ctx.call(&Request::AllocPd { device }, &[])?.0 {
            Response::Pd { pd } => Ok(Pd { ctx: ctx.clone(), device, handle: pd }),
            _ => Err(proto("AllocPd")),
        }
    }

    /// The context this PD belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        let _ = self.ctx.call_ok(&Request::DeallocPd { pd: self.handle });
    }
}
