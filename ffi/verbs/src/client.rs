//! The process's connection to the service: the client core ([`pmrxe_abi::client`]) made once,
//! lazily, by the first verb that needs it (`ibv_get_device_list`), living until the process
//! exits (objects stay valid across `ibv_free_device_list`). What is added here is only what
//! the C ABI needs: errno values, the once-per-process explanation of "No IB devices found",
//! a blocking async-event fd and the fatal-event latch.
use crate::boundary::{Errno, Res};
use pmrxe_abi::client::{Connection, Error};
use pmrxe_abi::ctrl::{self, Request, Response};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, OnceLock};

/// A live connection (the core's methods — page, ring, publish, service_down, liveness — are
/// reached through `Deref`).
pub struct Client {
    conn: Connection,
    /// IBV_EVENT_DEVICE_FATAL has been reported to the application.
    pub fatal_reported: std::sync::atomic::AtomicBool,
}

impl std::ops::Deref for Client {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl From<Error> for Errno {
    fn from(e: Error) -> Self {
        Errno(e.errno())
    }
}

/// The connection once made: read with one atomic load on every post and poll (a mutex here
/// was taken by every `ibv_post_send`).
static CLIENT: OnceLock<&'static Client> = OnceLock::new();
/// Serialises connection attempts (a failed attempt leaves `CLIENT` empty for the next one).
static CONNECTING: Mutex<()> = Mutex::new(());
/// Why the last connection attempt failed, when the client core said it in words (refused by
/// the service, an untrusted socket, a timeout): printed once instead of the bare errno.
static CONNECT_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// The process's connection, connecting on first use.
pub fn client() -> Res<&'static Client> {
    if let Some(c) = CLIENT.get() {
        return Ok(c);
    }
    let _g = CONNECTING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = CLIENT.get() {
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
                match CONNECT_ERROR.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    // Permission, trust or timeout: the core's own sentence says what to do.
                    Some(msg) => eprintln!("pmrxe: no pmrxe devices: {msg}"),
                    None => {
                        let why = std::io::Error::from_raw_os_error(e.0);
                        eprintln!("pmrxe: no pmrxe devices: cannot reach the service at {} ({why}); start `pmrxe serve` or set PMRXE_SOCKET", path.display());
                    }
                }
            });
            return Err(e);
        }
    };
    Ok(CLIENT.get_or_init(|| c))
}

/// The connection if one exists (verbs on objects imply one does).
#[inline]
pub fn existing() -> Res<&'static Client> {
    CLIENT.get().copied().ok_or(Errno::NODEV)
}

fn debug() -> bool {
    std::env::var_os("PMRXE_DEBUG").is_some()
}

impl Client {
    fn connect() -> Res<Client> {
        let path = ctrl::socket_path(ctrl::DEFAULT_SOCKET);
        let program = std::env::args().next().unwrap_or_default();
        let conn = Connection::connect(&path, program).map_err(|e| {
            if let (Error::Connect(_), true) = (&e, debug()) {
                eprintln!("pmrxe-verbs: cannot connect to the service at {}: errno {}", path.display(), e.errno());
            }
            if matches!(e, Error::Untrusted(_) | Error::Denied(_) | Error::Timeout(_) | Error::Service { .. }) {
                *CONNECT_ERROR.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            }
            Errno::from(e)
        })?;
        // The service creates it non-blocking; libibverbs' async_fd starts blocking (the
        // application may set O_NONBLOCK itself, which ibv_get_async_event honours).
        let efd = conn.events_fd.as_raw_fd();
        // SAFETY: fcntl on an fd the connection owns.
        unsafe {
            let fl = libc::fcntl(efd, libc::F_GETFL);
            libc::fcntl(efd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
        Ok(Client { conn, fatal_reported: Default::default() })
    }

    /// One request, one response. `Response::Err` becomes `Err(errno)`.
    pub fn call(&self, req: &Request, fds: &[RawFd]) -> Res<(Response, Vec<OwnedFd>)> {
        self.conn.call(req, fds).map_err(|e| {
            if let (Error::Service { errno, msg, .. }, true) = (&e, debug()) {
                eprintln!("pmrxe-verbs: {req:?} -> errno {errno}: {msg}");
            }
            Errno::from(e)
        })
    }

    /// A request whose only expected success is `Response::Ok`.
    pub fn call_ok(&self, req: &Request) -> Res<()> {
        match self.call(req, &[])?.0 {
            Response::Ok => Ok(()),
            _ => Err(Errno(libc::EPROTO)),
        }
    }
}
