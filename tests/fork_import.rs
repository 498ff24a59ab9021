//! `ibv_fork_init` and the import verbs (issue 13 item 3) against the real service:
//! `tests/fork_import.c` (compiled here with cc against libibverbs, run through the shim)
//! checks in forked children which registered pages they inherit (none after `ibv_fork_init`
//! or with `RDMAV_FORK_SAFE`; shared ones when `ibv_fork_init` came too late: EINVAL), and
//! imports a context, PD and MR through a dup of `cmd_fd` (plus the clean errors of foreign
//! fds, another process's fd and unknown handles).
mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn build_prog(dir: &Path) -> PathBuf {
    let cc = require_tool("cc");
    let out = dir.join("fork_import");
    let src = repo_root().join("tests/fork_import.c");
    let o = Command::new(cc).arg("-O1").arg("-Wall").arg("-Werror").arg("-o").arg(&out).arg(&src).arg("-libverbs").output().unwrap();
    assert!(o.status.success(), "cc {}: {}", src.display(), String::from_utf8_lossy(&o.stderr));
    out
}

fn run(svc: &Service, prog: &Path, mode: &str, env: &[(&str, &str)]) {
    let out = svc.dir.join(&format!("fork_import.{mode}.out"));
    let f = std::fs::File::create(&out).unwrap();
    let mut c = svc.pmrxe();
    c.arg("run").arg("--").arg(prog).arg(mode).env_remove("RDMAV_FORK_SAFE").env_remove("IBV_FORK_SAFE");
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.stdout(f.try_clone().unwrap()).stderr(f).spawn().unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(60));
    let text = read_to_string_lossy(&out);
    assert!(st.is_some_and(|s| s.success()) && text.contains(&format!("OK {mode}")), "{mode}: exit {st:?}:\n{text}");
}

#[test]
fn fork_init_and_import_through_the_shim() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let prog = build_prog(svc.dir.path());
    run(&svc, &prog, "early", &[]);
    run(&svc, &prog, "late", &[]);
    run(&svc, &prog, "env", &[("RDMAV_FORK_SAFE", "1")]);
    run(&svc, &prog, "env", &[("IBV_FORK_SAFE", "1")]);
    run(&svc, &prog, "import", &[]);
}
