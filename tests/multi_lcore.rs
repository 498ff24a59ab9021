//! Two poll-mode lcores sharing both ports (each owns one RX/TX queue pair of every port):
//! clients, and with them their QPs, are spread over the lcores, and frames that arrive on the
//! lcore that does not own their QP are handed over. On this 2-CPU machine the second lcore
//! shares the main core (`allow_main_core`), which is why the config keeps idle back-off.
//!
//! Eight lcores (issue 15): with 4 doorbell rows per client page, lcores 4..7 never saw their
//! queues' doorbells and programs on them hung. They share the two CPUs here
//! (`allow_shared_cores`, idle back-off).
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

/// Eight lcores on the two CPUs. Eight verbs processes connect (four `ibv_rc_pingpong` pairs at
/// once), so clients are placed on lcores 0..7, one each: every pair runs to completion, and
/// every lcore, 4..7 included, drained send and receive WQEs its clients rang doorbells for.
/// Then `ib_write_bw` pairs land on lcores (0,1), (2,3), (4,5), (6,7) in turn.
#[test]
fn eight_lcores_every_lcore_serves_its_clients() {
    require_tool("ibv_rc_pingpong");
    require_tool("ib_write_bw");
    let _lock = heavy_lock();
    let dir = TempDir::new("eightlc");
    let base = std::fs::read_to_string(repo_root().join("configs/loopback.toml")).unwrap();
    let cfg = base
        .replace("cores = [1]", "cores = [1, 0, 1, 0, 1, 0, 1, 0]")
        .replace("main_core = 0", "main_core = 0\nallow_main_core = true\nallow_shared_cores = true");
    assert_ne!(cfg, base, "loopback.toml layout changed: update this test");
    assert!(cfg.contains("mode = \"wait\"") || cfg.contains("mode = \"backoff\""), "eight lcores on two CPUs need an idle mode that sleeps");
    let path = dir.join("eight.toml");
    std::fs::write(&path, cfg).unwrap();
    let svc = Service::start(Some(&path), None);
    let lcores = || svc.stats_json()["lcores"].as_array().expect("lcores").clone();
    assert_eq!(lcores().len(), 8);

    // Four pairs at once: eight Hellos, homes 0..7 (one client per lcore, whatever the order).
    std::thread::scope(|sc| {
        let runs: Vec<_> = (0..4u16)
            .map(|i| {
                let svc = &svc;
                sc.spawn(move || {
                    loopback_pingpong(svc, 200, 19111 + i, Duration::from_secs(120))
                })
            })
            .collect();
        for r in runs {
            r.join().unwrap().assert_ok();
        }
    });
    for (i, l) in lcores().iter().enumerate() {
        let c = &l["counters"];
        assert_eq!(l["index"].as_u64(), Some(i as u64));
        for k in ["sq_wqes", "rq_wqes", "cqes"] {
            assert!(c[k].as_u64().unwrap_or(0) > 0, "lcore {i} never served its client ({k} = 0): {l}");
        }
        assert_eq!(c["rx_unknown_qp"].as_u64(), Some(0), "lcore {i}: {l}");
        assert_eq!(c["bad_wqes"].as_u64(), Some(0), "lcore {i}: {l}");
    }
    let before: Vec<u64> = lcores().iter().map(|l| l["counters"]["sq_wqes"].as_u64().unwrap_or(0)).collect();
    // ib_write_bw pairs, one after the other: clients 8..15 land on lcores (0,1) .. (6,7).
    for i in 0..4u16 {
        let port = (19121 + i).to_string();
        run_pair(
            &svc,
            &["ib_write_bw", "-d", "pmrxe0", "-F", "-n", "300", "-p", &port],
            &["ib_write_bw", "-d", "pmrxe1", "-F", "-n", "300", "-p", &port, "127.0.0.1"],
            19121 + i,
            Duration::from_secs(120),
        )
        .assert_ok();
    }
    let after = lcores();
    for (i, l) in after.iter().enumerate() {
        let wqes = l["counters"]["sq_wqes"].as_u64().unwrap_or(0);
        // The client side posts the 300 WRITEs; the server side posts nothing but its setup.
        if i % 2 == 1 {
            assert!(wqes >= before[i] + 300, "lcore {i} did not carry its ib_write_bw client's WRITEs ({} -> {wqes}): {l}", before[i]);
        }
        assert_eq!(l["counters"]["rx_unknown_qp"].as_u64(), Some(0), "lcore {i}: {l}");
    }
}

/// `pmrxe bench --two-clients` on two lcores: the harness opens its two sides through two
/// client connections, which the service places on different lcores, so every frame of the
/// run (requests one way, ACKs and READ responses the other) arrives on the lcore that does
/// not own its QP and is handed over. The harness checks every completion's status; the
/// counters show both directions crossed and nothing was dropped or misrouted.
#[test]
fn bench_two_clients_hands_every_frame_over() {
    let _lock = heavy_lock();
    let dir = TempDir::new("benchtwo");
    let base = std::fs::read_to_string(repo_root().join("configs/loopback.toml")).unwrap();
    let cfg = base.replace("cores = [1]", "cores = [1, 0]").replace("main_core = 0", "main_core = 0\nallow_main_core = true");
    assert_ne!(cfg, base, "loopback.toml layout changed: update this test");
    let path = dir.join("two.toml");
    std::fs::write(&path, cfg).unwrap();
    let svc = Service::start(Some(&path), None);
    let out = std::process::Command::new(pmrxe_bin())
        .args(["bench", "--suite", "quick", "--duration", "0.2", "--only", "rate,bw", "--rate-sizes", "8", "--sizes", "64K", "--two-clients", "--socket"])
        .arg(&svc.socket)
        .output()
        .expect("run pmrxe bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pmrxe bench --two-clients failed ({}):\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    for row in ["WRITE         8", "SEND          8", "READ      65536"] {
        assert!(stdout.contains(row), "no `{row}` row:\n{stdout}");
    }
    let st = svc.stats_json();
    let lcores = st["lcores"].as_array().expect("lcores");
    assert_eq!(lcores.len(), 2);
    let c = |i: usize, k: &str| lcores[i]["counters"][k].as_u64().unwrap_or(0);
    // Side 0 (the requester) and side 1 (the target) are on different lcores: one of them took
    // the send WQEs, and all but a handful of the frames each lcore consumed were handed to it.
    let (req, tgt) = if c(0, "sq_wqes") > c(1, "sq_wqes") { (0, 1) } else { (1, 0) };
    assert!(c(req, "sq_wqes") > 1000, "the requester's lcore took the WQEs: {st}");
    assert!(c(tgt, "handoff_in") > 1000 && c(req, "handoff_in") > 100, "frames crossed both ways: {st}");
    for i in 0..2 {
        assert_eq!(c(i, "handoff_drops"), 0, "lcore {i}: {st}");
        assert_eq!(c(i, "rx_unknown_qp"), 0, "lcore {i}: {st}");
        assert_eq!(c(i, "rx_icrc_errors"), 0, "lcore {i}: {st}");
        assert_eq!(c(i, "handoff_out"), c(1 - i, "handoff_in"), "what lcore {i} handed over, the other took in: {st}");
    }
}
