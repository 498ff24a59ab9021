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

