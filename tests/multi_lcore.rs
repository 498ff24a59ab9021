//! Two poll-mode lcores sharing both ports (each owns one RX/TX queue pair of every port):
//! clients, and with them their QPs, are spread over the lcores, and frames that arrive on the
//! lcore that does not own their QP are handed over. On this 2-CPU machine the second lcore
//! shares the main core (`allow_main_core`), which is why the config keeps idle back-off.
mod common;

use std::time::Duration;

use common::*;

#[test]
fn two_lcores_spread_qps_and_hand_frames_over() {
    require_tool("ibv_rc_pingpong");
    let _lock = heavy_lock();
    let dir = TempDir::new("twolc");
    let base = std::fs::read_to_string(repo_root().join("configs/loopback.toml")).unwrap();
    let cfg = base
        .replace("cores = [1]", "cores = [1, 0]")
        .replace("main_core = 0", "main_core = 0\nallow_main_core = true");
    assert_ne!(cfg, base, "loopback.toml layout changed: update this test");
    let path = dir.join("two.toml");
    std::fs::write(&path, cfg).unwrap();
    let svc = Service::start(Some(&path), None);
    run_pair(
        &svc,
        &["ibv_rc_pingpong", "-d", "pmrxe0", "-g", "1", "-c", "-n", "200", "-p", "19101"],
        &["ibv_rc_pingpong", "-d", "pmrxe1", "-g", "1", "-c", "-n", "200", "-p", "19101", "127.0.0.1"],
        19101,
        Duration::from_secs(60),
    )
    .assert_ok();
    run_pair(
        &svc,
        &["ib_write_bw", "-d", "pmrxe0", "-F", "-n", "500", "-p", "19102"],
        &["ib_write_bw", "-d", "pmrxe1", "-F", "-n", "500", "-p", "19102", "127.0.0.1"],
        19102,
        Duration::from_secs(60),
    )
    .assert_ok();
    let st = svc.stats_json();
    let lcores = st["lcores"].as_array().expect("lcores");
    assert_eq!(lcores.len(), 2, "two lcores: {st}");
    for l in lcores {
        let c = &l["counters"];
        assert!(c["handoff_in"].as_u64().unwrap_or(0) > 0, "every lcore received handed-over frames: {st}");
        assert!(c["handoff_out"].as_u64().unwrap_or(0) > 0, "every lcore handed frames over: {st}");
        assert_eq!(c["handoff_drops"].as_u64(), Some(0));
        assert_eq!(c["rx_unknown_qp"].as_u64(), Some(0));
    }
}
