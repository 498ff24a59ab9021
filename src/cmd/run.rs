//! `pmrxe run [--rsocket] -- PROGRAM ARGS`: exec the program with the shim preloaded (and,
//! with `--rsocket`, librdmacm's rsockets preload library after it).
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

/// Where librdmacm installs its rsockets preload library (Debian/Ubuntu multiarch, then
/// Fedora/RHEL lib64, then plain lib).
const RSPRELOAD: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so",
    "/usr/lib64/rsocket/librspreload.so",
    "/usr/lib/rsocket/librspreload.so",
];

/// librspreload.so: `$PMRXE_RSPRELOAD`, else the first of [`RSPRELOAD`] that exists.
fn rspreload_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PMRXE_RSPRELOAD") {
        return Some(PathBuf::from(p));
    }
    RSPRELOAD.iter().map(PathBuf::from).find(|p| p.exists())
}

/// The LD_PRELOAD list: the shim first, then librspreload (with `--rsocket`), then whatever
/// the caller preloaded. The shim goes first so that its unversioned ibv_*/rdma_* definitions
/// are the first in the global lookup scope, ahead of librspreload's own dependencies
/// (librdmacm.so.1 and libibverbs.so.1, loaded after every preloaded object): rsockets' calls
/// into librdmacm (rdma_create_id, rdma_connect, ibv_post_send, ...) reach pmrxe. librspreload
/// defines only the socket calls (socket, connect, read, poll, close, ...), none of which the
/// shim defines, and it finds the real ones with dlsym(RTLD_NEXT), i.e. in libc after it; the
/// shim's own socket and file calls (its control connection) pass through librspreload's
/// wrappers, which hand fds that are not rsockets to libc.
pub fn preload_list(shim: &str, rspreload: Option<&str>, old: Option<&str>) -> String {
    let mut list = vec![shim];
    list.extend(rspreload);
    list.extend(old.filter(|o| !o.is_empty()));
    list.join(":")
}

pub fn run(socket: Option<PathBuf>, rsocket: bool, program: Vec<String>) -> ExitCode {
    let Some(shim) = shim_path() else {
        eprintln!("pmrxe: cannot find {SHIM} next to the pmrxe binary or in ../lib (build it with `cargo build --release`, or set PMRXE_SHIM)");
        return ExitCode::from(2);
    };
    let rs = if rsocket {
        match rspreload_path() {
            Some(p) => Some(p.display().to_string()),
            None => {
                eprintln!(
                    "pmrxe: --rsocket: librspreload.so not found in {} (Debian: apt install librdmacm1; or set PMRXE_RSPRELOAD)",
                    RSPRELOAD.join(", ")
                );
                return ExitCode::from(2);
            }
        }
    } else {
        None
    };
    let old = std::env::var_os("LD_PRELOAD").map(|o| o.to_string_lossy().into_owned());
    let preload = preload_list(&shim.display().to_string(), rs.as_deref(), old.as_deref());
    let mut cmd = Command::new(&program[0]);
    cmd.args(&program[1..]).env("LD_PRELOAD", preload);
    if let Some(s) = socket {
        cmd.env("PMRXE_SOCKET", s);
    }
    let err = cmd.exec();
    eprintln!("pmrxe: cannot run {}: {err}", program[0]);
    ExitCode::from(if err.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 })
}

#[cfg(test)]
mod tests {
    use super::preload_list;

    #[test]
    fn the_shim_comes_first_then_rsockets_then_the_callers_preloads() {
        assert_eq!(preload_list("/s.so", None, None), "/s.so");
        assert_eq!(preload_list("/s.so", Some("/rs.so"), None), "/s.so:/rs.so");
        assert_eq!(preload_list("/s.so", Some("/rs.so"), Some("/x.so")), "/s.so:/rs.so:/x.so");
        assert_eq!(preload_list("/s.so", None, Some("")), "/s.so");
    }
}
