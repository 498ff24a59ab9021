//! `pmrxe stats` and `pmrxe capture`.
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;

use pmrxe_abi::ctrl::{Request, Response};
use pmrxe_service::client::Client;

fn socket(explicit: Option<PathBuf>) -> PathBuf {
    explicit.unwrap_or_else(|| pmrxe_abi::ctrl::socket_path(pmrxe_abi::ctrl::DEFAULT_SOCKET))
}

fn connect(path: &std::path::Path) -> Result<Client, ExitCode> {
    Client::connect(path).map_err(|e| super::fail(&format!("cannot reach the service at {} (is `pmrxe serve` running? PMRXE_SOCKET?)", path.display()), e))
}

pub fn run(json: bool, watch: Option<f64>, socket_path: Option<PathBuf>) -> ExitCode {
    let path = socket(socket_path);
    loop {
        let c = match connect(&path) {
            Ok(c) => c,
            Err(code) => return code,
        };
        match c.call(&Request::Stats { json }, &[]) {
            Ok((Response::Stats(s), _)) => println!("{s}"),
            Ok((other, _)) => return super::fail("stats", format!("unexpected reply {other:?}")),
            Err(e) => return super::fail("stats", e),
        }
        match watch {
            Some(s) if s > 0.0 => std::thread::sleep(std::time::Duration::from_secs_f64(s)),
            _ => return ExitCode::SUCCESS,
        }
    }
}

/// Create the capture file: a new file of mode 0600 (captures hold payloads), never through a
/// symbolic link and never over an existing file (`O_EXCL|O_NOFOLLOW`) — a root `pmrxe
/// capture` must not be turned into a write to a file someone else chose. `force` removes an
/// existing entry first (the link itself, never its target).
fn create_capture_file(out: &std::path::Path, force: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    if force {
        match std::fs::remove_file(out) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(out).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            std::io::Error::new(e.kind(), "the file exists (pass --force to replace it)")
        } else {
            e
        }
    })
}

pub fn capture(out: PathBuf, count: u64, qp: Option<u32>, force: bool, socket_path: Option<PathBuf>) -> ExitCode {
    let file = match create_capture_file(&out, force) {
        Ok(f) => f,
        Err(e) => return super::fail(&format!("creating {}", out.display()), e),
    };
    let path = socket(socket_path);
    let c = match connect(&path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (rd, wr) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        Ok(p) => p,
        Err(e) => return super::fail("pipe", std::io::Error::from(e)),
    };
    let refused = match c.call(&Request::Capture { count, qpn: qp }, &[wr.as_raw_fd()]) {
        Ok((Response::Ok, _)) => None,
        Ok((Response::Err { msg, .. }, _)) => Some(msg),
        Ok((other, _)) => Some(format!("unexpected reply {other:?}")),
        Err(e) => Some(e.to_string()),
    };
    if let Some(why) = refused {
        drop(file);
        let _ = std::fs::remove_file(&out); // ours: created new above
        return super::fail("capture", why);
    }
    drop(wr);
    match pmrxe_service::stats::copy_stream(std::fs::File::from(rd), std::io::BufWriter::new(file)) {
        Ok(n) => {
            eprintln!("pmrxe: capture: {n} bytes written to {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => super::fail("capture", e),
    }
}
