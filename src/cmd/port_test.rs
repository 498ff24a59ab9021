//! `pmrxe port-test --config F`: frames across a real DPDK port pair, verified.
use std::path::PathBuf;
use std::process::ExitCode;

pub fn run(config: Option<PathBuf>, frames: u64) -> ExitCode {
    let cfg = match super::load_config(config.as_ref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    super::init_logging("warn");
    match pmrxe_port::port_test::run(&cfg, frames) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => super::fail("port-test", e),
    }
}
