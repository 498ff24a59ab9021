//! Connection to the service (the client core's [`Connection`]), protection domains.
use std::os::fd::{OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pmrxe_abi::client::Connection;
use pmrxe_abi::ctrl::{DeviceInfo, Request, Response};
use pmrxe_abi::Doorbell;

use super::{proto, Result};

pub(crate) struct Inner {
    pub conn: Connection,
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
        let program = std::env::args().next().unwrap_or_else(|| "pmrxe-native".into());
        let conn = Connection::connect(path, program)?;
        Ok(Context { inner: Arc::new(Inner { conn, next_seg: AtomicU64::new(1) }) })
    }

    /// Connect to `$PMRXE_SOCKET`, else the default socket.
    pub fn connect_default() -> Result<Context> {
        Context::connect(&pmrxe_abi::ctrl::socket_path(pmrxe_abi::ctrl::DEFAULT_SOCKET))
    }

    /// The devices the service announced (`pmrxe0`, `pmrxe1`, ...).
    pub fn devices(&self) -> &[DeviceInfo] {
        &self.inner.conn.devices
    }

    /// Index of the device called `name`.
    pub fn device_index(&self, name: &str) -> Option<u32> {
        self.devices().iter().find(|d| d.name == name).map(|d| d.index)
    }

    /// Our client id at the service.
    pub fn client_id(&self) -> u32 {
        self.inner.conn.client_id
    }

    /// The core connection (doorbells, publish, liveness).
    pub(crate) fn conn(&self) -> &Connection {
        &self.inner.conn
    }

    /// Ring a queue's doorbell (one `fetch_or`, release).
    #[inline]
    pub fn ring(&self, db: Doorbell) {
        self.conn().ring(db);
    }

    /// True once the service said it is going away.
    pub fn service_down(&self) -> bool {
        self.conn().service_down()
    }

    /// One request, one response; `Response::Err` becomes an `io::Error` with its errno.
    pub fn call(&self, req: &Request, fds: &[RawFd]) -> Result<(Response, Vec<OwnedFd>)> {
        Ok(self.conn().call(req, fds)?)
    }

    /// A request whose only success is `Response::Ok`.
    pub fn call_ok(&self, req: &Request) -> Result<()> {
        Ok(self.conn().call_ok(req)?)
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
