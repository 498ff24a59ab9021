//! `pmrxe serve`.
use std::path::PathBuf;
use std::process::ExitCode;

pub fn run(config: Option<PathBuf>) -> ExitCode {
    let cfg = match super::load_config(config.as_ref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    super::init_logging(&cfg.service.log);
    match pmrxe_service::serve(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => super::fail("serve", e),
    }
}
