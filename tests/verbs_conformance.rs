//! Unmodified Debian verbs programs against the real service, one test per verbs behaviour
//! they depend on (each test self-contained: its own service, its own out-of-band port).
mod common;
use common::*;
use std::time::Duration;

/// Issue 13 item 5: UD QPs kept a 1024-byte path MTU, so a UD message above it (here 4096 B
/// on the loopback config's 4096-byte active MTU) "completed" SUCCESS with nothing sent and
/// the ping-pong never got its reply. Both sides on pmrxe0 (traffic loops back in the device).
#[test]
fn ibv_ud_pingpong_4096_bytes_at_port_mtu() {
    require_tool("ibv_ud_pingpong");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let port = port_for(130);
    let ps = port.to_string();
    let iters = 200u64;
    let n = iters.to_string();
    let out = run_pair(
        &svc,
        &["ibv_ud_pingpong", "-d", "pmrxe0", "-g", "1", "-s", "4096", "-n", &n, "-p", &ps],
        &["ibv_ud_pingpong", "-d", "pmrxe0", "-g", "1", "-s", "4096", "-n", &n, "-p", &ps, "127.0.0.1"],
        port,
        Duration::from_secs(60),
    );
    out.assert_ok();
    // "N bytes in S seconds": every iteration moved one 4096-byte message each way.
    for side in [&out.server, &out.client] {
        let want = format!("{} bytes in", 2 * 4096 * iters);
        assert!(side.output.contains(&want), "expected `{want}`: {}", side.describe());
    }
}

/// Issue 13 item 5: `ib_send_bw -c UD` at its default size (the port MTU, 4096 B here) got
/// no traffic through. Both sides on pmrxe0.
#[test]
fn ib_send_bw_ud_default_size() {
    require_tool("ib_send_bw");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let port = port_for(131);
    let ps = port.to_string();
    let out = run_pair(
        &svc,
        &["ib_send_bw", "-c", "UD", "-d", "pmrxe0", "-F", "-p", &ps],
        &["ib_send_bw", "-c", "UD", "-d", "pmrxe0", "-F", "-p", &ps, "127.0.0.1"],
        port,
        Duration::from_secs(90),
    );
    out.assert_ok();
    // One result row on each side: #bytes #iterations BW-peak BW-average MsgRate.
    for side in [&out.server, &out.client] {
        let rows = perftest_rows(&side.output);
        assert_eq!(rows.len(), 1, "one result row expected: {}", side.describe());
        let r = &rows[0];
        assert_eq!(r[0], 4096.0, "default UD size = the 4096-byte port MTU: {}", side.describe());
        assert!(r.len() >= 4 && r[3] > 0.0, "average bandwidth must be positive: {}", side.describe());
    }
}

/// Issue 13 item 6 through the shim: `tests/mw2_rebind.c` binds a type-2 MW on QP1,
/// invalidates it, binds it again with a new key from QP2 of the same PD (naming it by its
/// `ibv_mw`, as verbs does) and writes through it. The second bind used to fail with
/// MW_BIND_ERR ("memory management operation error").
#[test]
fn mw2_invalidated_can_be_rebound_from_another_qp() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let out = run_c_program(&svc, "mw2_rebind");
    assert!(out.ok() && out.output.contains("bind again on QP2: success"), "{}", out.describe());
}

/// CQ overflow through the shim (`tests/cq_overflow.c`): more signaled WRITEs than the send CQ
/// holds, nothing polled. The CQ reports IBV_EVENT_CQ_ERR, the QP goes to ERROR, and once the
/// consumer polls, every WR completes exactly once and in order (SUCCESS, then WR_FLUSH_ERR):
/// the completions the full CQ refused waited in their QP, in order, behind the ones the
/// engine had already staged into the ring.
#[test]
fn cq_overflow_reports_cq_err_and_loses_no_completion() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let out = run_c_program(&svc, "cq_overflow");
    assert!(out.ok() && out.output.contains("every WR completed once, in order"), "{}", out.describe());
    let stats = svc.stats_json();
    assert!(stats["lcores"][0]["counters"]["cq_full"].as_u64().is_some_and(|n| n >= 1), "cq_full counted: {stats}");
}

/// Inline capacity is sized from the send WQE's SGE space (`tests/inline_sizing.c`), as rxe and
/// mlx5 do: a QP created with `max_inline_data = 0` and one SGE reports ≥ 16 bytes back and
/// takes a 16-byte IBV_SEND_INLINE SEND (librdmacm programs rely on it); beyond the reported
/// capacity an inline post is EINVAL.
#[test]
fn inline_capacity_comes_from_the_sge_space() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let out = run_c_program(&svc, "inline_sizing");
    assert!(out.ok() && out.output.contains("OK inline_sizing") && out.output.contains("reported max_inline_data 16"), "{}", out.describe());
}

/// Compile `tests/NAME.c` (libibverbs) and run it on pmrxe0 of `svc`.
fn run_c_program(svc: &Service, name: &str) -> ProgOutput {
    let prog = svc.dir.join(name);
    compile_c(&format!("tests/{name}.c"), &prog, &require_tool("cc"), &["-libverbs"]);
    run_verbs(svc, &[prog.to_str().unwrap(), "pmrxe0"], Duration::from_secs(60))
}
