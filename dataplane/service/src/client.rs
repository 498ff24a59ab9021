//! A minimal control-socket client (`pmrxe stats`, `pmrxe capture`, tests).
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use pmrxe_abi::ctrl::{self, Request, Response};

/// A connection to the service.
pub struct Client {
    fd: OwnedFd,
}

impl Client {
    /// Connect to the service's SEQPACKET socket.
    pub fn connect(path: &Path) -> io::Result<Client> {
        Ok(Client { fd: ctrl::seqpacket_connect(path)? })
    }

    /// One request/response round trip.
    pub fn call(&self, req: &Request, fds: &[RawFd]) -> io::Result<(Response, Vec<OwnedFd>)> {
        ctrl::send_msg(self.fd.as_raw_fd(), &ctrl::encode(req)?, fds)?;
        let mut buf = Vec::new();
        let fds = ctrl::recv_msg(self.fd.as_raw_fd(), &mut buf)?.ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "service closed the connection"))?;
        Ok((ctrl::decode(&buf)?, fds))
    }
}
