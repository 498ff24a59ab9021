//! `pmrxe serve`.
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

/// `--metrics`: `host:port`, or a bare port meaning `127.0.0.1:PORT` (loopback by default).
fn parse_metrics(s: &str) -> Option<SocketAddr> {
    s.parse::<SocketAddr>().ok().or_else(|| s.parse::<u16>().ok().map(|p| SocketAddr::from((Ipv4Addr::LOCALHOST, p))))
}

pub fn run(config: Option<PathBuf>, metrics: Option<String>) -> ExitCode {
    let mut cfg = match super::load_config(config.as_ref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(m) = metrics {
        match parse_metrics(&m) {
            Some(a) => cfg.service.metrics = Some(a),
            None => {
                eprintln!("pmrxe: --metrics: invalid address {m:?} (expected host:port or a port number)");
                return ExitCode::from(2);
            }
        }
    }
    super::init_logging(&cfg.service.log);
    match pmrxe_service::serve(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => super::fail("serve", e),
    }
}
