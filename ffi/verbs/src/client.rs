//! The per-process connection to the service: one `SOCK_SEQPACKET` socket, one request in
//! flight at a time (a mutex), the client page (doorbells) and the device list from `Hello`.
//!
//! The connection is made lazily by the first verb that needs it (`ibv_get_device_list`) and
//! lives until the process exits (objects stay valid across `ibv_free_device_list`).
use crate::boundary::{Errno, Mapping, Res};
use pmrxe_abi::ctrl::{self, DeviceInfo, Request, Response};
use pmrxe_abi::{ClientPage, Doorbell, ABI_VERSION, CLIENT_PAGE_LEN, CLIENT_PAGE_MAGIC};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

/// A live connection.
pub struct Client {
    sock: OwnedFd,
    /// Serialises request/response pairs and holds the receive buffer.
    io: Mutex<Vec<u8>>,
    page: Mapping,
    /// The service's async-event eventfd (signalled for every queued event); each context's
    /// `async_fd` is a duplicate of it.
    pub events_fd: OwnedFd,
    pub client_id: u32,
    pub devices: Vec<DeviceInfo>,
    /// Set once the service is known to be gone (orderly stop or crash).
    dead: std::sync::atomic::AtomicBool,
    /// Empty CQ polls since the last liveness check.
    idle_polls: std::sync::atomic::AtomicU32,
    /// IBV_EVENT_DEVICE_FATAL has been reported to the application.
    pub fatal_reported: std::sync::atomic::AtomicBool,
}

static CLIENT: Mutex<Option<&'static Client>> = Mutex::new(None);

/// The process's connection, connecting on first use.
pub fn client() -> Res<&'static Client> {
    let mut g = CLIENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = *g {
        return Ok(c);
    }
    let c: &'static Client = match Client::connect() {
        Ok(c) => Box::leak(Box::new(c)),
        Err(e) => {
            // Say why there are no devices, once per process: a verbs program only prints
            // "No IB devices found".
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let path = ctrl::socket_path(ctrl::DEFAULT_SOCKET);
                let why = std::io::Error::from_raw_os_error(e.0);
                eprintln!("pmrxe: no pmrxe devices: cannot reach the service at {} ({why}); start `pmrxe serve` or set PMRXE_SOCKET", path.display());
            });
            return Err(e);
        }
    };
    *g = Some(c);
    Ok(c)
}

/// The connection if one exists (verbs on objects imply one does).
pub fn existing() -> Res<&'static Client> {
    let g = CLIENT.lock().unwrap_or_else(|e| e.into_inner());
    (*g).ok_or(Errno::NODEV)
}

impl Client {
    fn connect() -> Res<Client> {
        let path = ctrl::socket_path(ctrl::DEFAULT_SOCKET);
        let sock = ctrl::seqpacket_connect(&path).map_err(|e| {
            let e = Errno(e.raw_os_error().unwrap_or(libc::ENAMETOOLONG));
            if std::env::var_os("PMRXE_DEBUG").is_some() {
                eprintln!("pmrxe-verbs: cannot connect to the service at {}: errno {}", path.display(), e.0);
            }
            e
        })?;
        let program = std::env::args().next().unwrap_or_default();
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        let mut buf = Vec::new();
        let (resp, fds) = roundtrip(sock.as_raw_fd(), &mut buf, &Request::Hello { abi_version: ABI_VERSION, pid, program }, &[])?;
        let (client_id, devices) = match resp {
            Response::Hello { abi_version, client_id, devices } if abi_version == ABI_VERSION => (client_id, devices),
            Response::Hello { .. } => return Err(Errno(libc::EPROTO)),
            _ => return Err(Errno(libc::EPROTO)),
        };
        let page_fd = fds.first().ok_or(Errno(libc::EPROTO))?;
        let page = Mapping::map_fd(page_fd.as_raw_fd(), CLIENT_PAGE_LEN as usize)?;
        let mut fds = fds.into_iter();
        let events_fd = fds.nth(1).ok_or(Errno(libc::EPROTO))?;
        // The service creates it non-blocking; libibverbs' async_fd starts blocking (the
        // application may set O_NONBLOCK itself, which ibv_get_async_event honours).
        // SAFETY: fcntl on an fd we own.
        unsafe {
            let fl = libc::fcntl(events_fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(events_fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
        let c = Client {
            sock,
            io: Mutex::new(buf),
            page,
            events_fd,
            client_id,
            devices,
            dead: Default::default(),
            idle_polls: Default::default(),
            fatal_reported: Default::default(),
        };
        if c.page().magic != CLIENT_PAGE_MAGIC {
            return Err(Errno(libc::EPROTO));
        }
        Ok(c)
    }

    /// The client page.
    pub fn page(&self) -> &ClientPage {
        // SAFETY: the mapping is CLIENT_PAGE_LEN bytes, page aligned, lives as long as `self`,
        // and ClientPage fits (const-asserted in the abi crate); its shared fields are atomics.
        unsafe { &*self.page.ptr.cast::<ClientPage>() }
    }

    /// Ring a queue's doorbell.
    pub fn ring(&self, db: Doorbell) {
        self.page().ring(db);
    }

    /// True once the service announced it is going away.
    pub fn service_down(&self) -> bool {
        self.page().service_down.load(std::sync::atomic::Ordering::Relaxed) != 0
    }

    /// Is the service gone? Cheap on the data path: an atomic load, plus — only after many
    /// empty CQ polls (the application is waiting anyway) — one non-blocking peek at the
    /// control socket, which reads end-of-file once the service process has died (SIGKILL
    /// included).
    pub fn dead_after_empty_poll(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if self.dead.load(Relaxed) {
            return true;
        }
        if self.service_down() {
            self.dead.store(true, Relaxed);
            return true;
        }
        if self.idle_polls.fetch_add(1, Relaxed) & 0xffff != 0xffff {
            return false;
        }
        let mut b = [0u8; 1];
        // SAFETY: non-blocking peek into a local one-byte buffer on our socket.
        let n = unsafe { libc::recv(self.sock.as_raw_fd(), b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        let gone = n == 0 || (n < 0 && !matches!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)));
        if gone {
            self.dead.store(true, Relaxed);
            eprintln!("pmrxe: the pmrxe service went away; completions fail from now on (IBV_EVENT_DEVICE_FATAL)");
        }
        gone
    }

    /// Known dead (no probing).
    pub fn is_dead(&self) -> bool {
        self.dead.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One request, one response. `Response::Err` becomes `Err(errno)`.
    pub fn call(&self, req: &Request, fds: &[RawFd]) -> Res<(Response, Vec<OwnedFd>)> {
        let mut buf = self.io.lock().unwrap_or_else(|e| e.into_inner());
        roundtrip(self.sock.as_raw_fd(), &mut buf, req, fds)
    }

    /// A request whose only expected success is `Response::Ok`.
    pub fn call_ok(&self, req: &Request) -> Res<()> {
        match self.call(req, &[])?.0 {
            Response::Ok => Ok(()),
            _ => Err(Errno(libc::EPROTO)),
        }
    }
}

fn roundtrip(sock: RawFd, buf: &mut Vec<u8>, req: &Request, fds: &[RawFd]) -> Res<(Response, Vec<OwnedFd>)> {
    let bytes = ctrl::encode(req)?;
    ctrl::send_msg(sock, &bytes, fds)?;
    let got = ctrl::recv_msg(sock, buf)?.ok_or(Errno(libc::ECONNRESET))?;
    let resp: Response = ctrl::decode(buf)?;
    match resp {
        Response::Err { errno, msg } => {
            if std::env::var_os("PMRXE_DEBUG").is_some() {
                eprintln!("pmrxe-verbs: {req:?} -> errno {errno}: {msg}");
            }
            Err(Errno(if errno > 0 { errno } else { libc::EIO }))
        }
        r => Ok((r, got)),
    }
}
