//! `pmrxe run -- PROGRAM ARGS`: exec the program with the shim preloaded.
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// File name of the shim next to the `pmrxe` binary.
const SHIM: &str = "libpmrxe_verbs.so";

/// Where the shim is: `$PMRXE_SHIM`, else next to this executable (the build tree), else in
/// `../lib` next to its directory (an install: /usr/local/bin/pmrxe, /usr/local/lib/...).
pub fn shim_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PMRXE_SHIM") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(SHIM), dir.join("../lib").join(SHIM)].into_iter().find(|p| p.exists())
}

pub fn run(socket: Option<PathBuf>, program: Vec<String>) -> ExitCode {
    let Some(shim) = shim_path() else {
        eprintln!("pmrxe: cannot find {SHIM} next to the pmrxe binary or in ../lib (build it with `cargo build --release`, or set PMRXE_SHIM)");
        return ExitCode::from(2);
    };
    let mut preload = shim.display().to_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD") {
        let old = old.to_string_lossy();
        if !old.is_empty() {
            preload = format!("{preload}:{old}");
        }
    }
    let mut cmd = Command::new(&program[0]);
    cmd.args(&program[1..]).env("LD_PRELOAD", preload);
    if let Some(s) = socket {
        cmd.env("PMRXE_SOCKET", s);
    }
    let err = cmd.exec();
    eprintln!("pmrxe: cannot run {}: {err}", program[0]);
    ExitCode::from(if err.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 })
}
