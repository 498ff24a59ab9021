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

pub fn capture(out: PathBuf, count: u64, qp: Option<u32>, socket_path: Option<PathBuf>) -> ExitCode {
    let path = socket(socket_path);
    let c = match connect(&path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (rd, wr) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        Ok(p) => p,
        Err(e) => return super::fail("pipe", std::io::Error::from(e)),
    };
    match c.call(&Request::Capture { count, qpn: qp }, &[wr.as_raw_fd()]) {
        Ok((Response::Ok, _)) => {}
        Ok((Response::Err { msg, .. }, _)) => return super::fail("capture", msg),
        Ok((other, _)) => return super::fail("capture", format!("unexpected reply {other:?}")),
        Err(e) => return super::fail("capture", e),
    }
    drop(wr);
    let file = match std::fs::File::create(&out) {
        Ok(f) => f,
        Err(e) => return super::fail(&format!("creating {}", out.display()), e),
    };
    match pmrxe_service::stats::copy_stream(std::fs::File::from(rd), std::io::BufWriter::new(file)) {
        Ok(n) => {
            eprintln!("pmrxe: capture: {n} bytes written to {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => super::fail("capture", e),
    }
}
