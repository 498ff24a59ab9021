//! The shim's behaviour when the service is missing or dies (issue "shim", Errors):
//! no service → an empty device list and one log line saying why; a service killed under a
//! running program → the program's polls fail (no hang).
mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn missing_service_gives_no_devices_and_says_why() {
    require_tool("ibv_devices");
    let dir = TempDir::new("nosvc");
    let out = Command::new(pmrxe_bin())
        .args(["run", "--", "ibv_devices"])
        .env("PMRXE_SOCKET", dir.join("nobody.sock"))
        .output()
        .expect("run ibv_devices");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ibv_devices must succeed with an empty list: {stderr}");
    assert!(!stdout.contains("pmrxe0"), "no devices listed: {stdout}");
    assert_eq!(stderr.lines().filter(|l| l.contains("cannot reach the service")).count(), 1, "one line saying why: {stderr}");
}

#[test]
fn service_killed_under_a_running_program_makes_it_fail_not_hang() {
    require_tool("ib_write_bw");
    let _lock = heavy_lock();
    let mut svc = Service::start_loopback();
    let srv_out = svc.dir.join("srv.out");
    let cli_out = svc.dir.join("cli.out");
    let mut srv = spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe0", "-F", "-D", "30", "-p", "19091"], &srv_out);
    wait_listening(&mut srv, 19091, &srv_out, Duration::from_secs(15));
    let mut cli = spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe1", "-F", "-D", "30", "-p", "19091", "127.0.0.1"], &cli_out);
    // Kill the service only once WRITEs are flowing (mid-transfer).
    wait_for_traffic(&svc, 1000, Duration::from_secs(15), &cli_out);
    // SIGKILL: no orderly flush, the shim has to notice by itself.
    let mut child = svc.child.take().expect("service child");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(svc.pid as i32, libc::SIGKILL) };
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/pmrxe-{}", svc.pid));
    let st = wait_timeout(&mut cli, Duration::from_secs(20));
    let _ = wait_timeout(&mut srv, Duration::from_secs(20));
    let st = st.unwrap_or_else(|| panic!("client hung after the service died:\n{}", read_to_string_lossy(&cli_out)));
    assert!(!st.success(), "the client cannot have completed a 30 s run: {}", read_to_string_lossy(&cli_out));
}
