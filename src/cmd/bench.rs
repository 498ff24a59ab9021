//! `pmrxe bench`: the native harness (no shim).
use std::process::ExitCode;

/// Arguments of `pmrxe bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

pub fn run(_args: BenchArgs) -> ExitCode {
    eprintln!("pmrxe: bench: the native harness is not built yet; use scripts/bench.sh (perftest through the shim)");
    ExitCode::from(1)
}
