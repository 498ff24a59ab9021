//! One module per subcommand.
pub mod bench;
pub mod config;
pub mod port_test;
pub mod run;
pub mod serve;
pub mod stats;
pub mod wire;

use std::path::PathBuf;
use std::process::ExitCode;

use pmrxe_config::Config;

/// Load the config at `path` (or the embedded default). A bad config prints one line and
/// yields exit code 2.
pub fn load_config(path: Option<&PathBuf>) -> Result<Config, ExitCode> {
    let r = match path {
        Some(p) => Config::load(p),
        None => Config::default_loopback(),
    };
    r.map_err(|e| {
        eprintln!("pmrxe: {e}");
        ExitCode::from(2)
    })
}

/// Print a one-line runtime error and return exit code 1.
pub fn fail(what: &str, e: impl std::fmt::Display) -> ExitCode {
    eprintln!("pmrxe: {what}: {e}");
    ExitCode::from(1)
}

/// Set up tracing from `RUST_LOG`, else the given default filter (`service.log`). Logs go to
/// stderr; ANSI colours only when stderr is a terminal and `NO_COLOR` is unset (journald and
/// redirected logs stay plain text).
pub fn init_logging(default: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
}
