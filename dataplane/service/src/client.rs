//! A minimal control-socket client (`pmrxe stats`, `pmrxe capture`, tests).
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use pmrxe_abi::ctrl::{self, Request, Response};

/// A connection to the service.
pub struct Client {
    fd: OwnedFd,
}

impl Client {
    /// Connect to the service's SEQPACKET socket.
    pub fn connect(path: &Path) -> io::Result<Client> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_os_str().as_bytes();
        // SAFETY: sockaddr_un is plain data.
        let mut addr: libc::sockaddr_un = unsafe { core::mem::zeroed() };
        if bytes.len() >= addr.sun_path.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"));
        }
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        // SAFETY: plain socket syscall.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let len = (core::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
        // SAFETY: valid sockaddr of `len` bytes.
        if unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Client { fd })
    }

    /// One request/response round trip.
    pub fn call(&self, req: &Request, fds: &[RawFd]) -> io::Result<(Response, Vec<OwnedFd>)> {
        ctrl::send_msg(self.fd.as_raw_fd(), &ctrl::encode(req)?, fds)?;
        let mut buf = Vec::new();
        let fds = ctrl::recv_msg(self.fd.as_raw_fd(), &mut buf)?.ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "service closed the connection"))?;
        Ok((ctrl::decode(&buf)?, fds))
    }
}
