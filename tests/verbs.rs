//! The shim with unmodified Debian verbs binaries (rdma-core ibverbs-utils, perftest) through
//! `pmrxe run --` on the embedded loopback configuration (pmrxe0 <-> pmrxe1 in one service).
//! Every test starts its own private service and holds the heavy-test lock.
mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(90);

// Iteration counts: ibv_*_pingpong without -e busy-polls its CQ in both processes, so on a
// 2-vCPU machine two spinning programs and the spinning lcore share 2 CPUs and a round trip
// often costs a scheduler time slice (ms). The plain test keeps the default 1000 iterations;
// the variants use fewer to keep the suite inside its CI budget.

fn pingpong(port_idx: u16, extra: &[&str]) -> PairOutput {
    pingpong_prog("ibv_rc_pingpong", port_idx, extra)
}

fn pingpong_prog(prog: &str, port_idx: u16, extra: &[&str]) -> PairOutput {
    require_tool(prog);
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let port = port_for(port_idx).to_string();
    let mut s = vec![prog, "-d", "pmrxe0", "-g", "1", "-p", &port];
    s.extend_from_slice(extra);
    let mut c = vec![prog, "-d", "pmrxe1", "-g", "1", "-p", &port];
    c.extend_from_slice(extra);
    c.push("127.0.0.1");
    let r = run_pair(&svc, &s, &c, port_for(port_idx), T);
    r.assert_ok();
    for (side, o) in [("server", &r.server), ("client", &r.client)] {
        let (mbit, usec) = parse_pingpong(&o.output)
            .unwrap_or_else(|| panic!("{side}: no Mbit/sec and usec/iter figures: {}", o.describe()));
        assert!(mbit > 0.0 && usec > 0.0, "{side}: figures {mbit} Mbit/s {usec} us/iter");
        eprintln!("{prog} {extra:?} {side}: {mbit} Mbit/sec, {usec} usec/iter");
    }
    r
}

#[test]
fn ibv_devices_lists_pmrxe0_and_pmrxe1() {
    require_tool("ibv_devices");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let o = run_verbs(&svc, &["ibv_devices"], Duration::from_secs(20));
    assert!(o.ok(), "{}", o.describe());
    for d in ["pmrxe0", "pmrxe1"] {
        assert!(
            o.output.lines().any(|l| l.split_whitespace().next() == Some(d)),
            "ibv_devices does not list {d}: {}",
            o.describe()
        );
    }
}

#[test]
fn ibv_devinfo_shows_active_ethernet_port_with_roce_v2_gid() {
    require_tool("ibv_devinfo");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let o = run_verbs(&svc, &["ibv_devinfo", "-v", "-d", "pmrxe0"], Duration::from_secs(20));
    assert!(o.ok(), "{}", o.describe());
    let t = &o.output;
    assert!(t.contains("PORT_ACTIVE"), "no PORT_ACTIVE: {}", o.describe());
    assert!(
        t.lines().any(|l| l.contains("link_layer:") && l.contains("Ethernet")),
        "link_layer is not Ethernet: {}",
        o.describe()
    );
    // e.g. "GID[  1]:		::ffff:198.18.0.1, RoCE v2"
    assert!(
        t.lines().any(|l| {
            let l = l.replace(' ', "");
            l.contains("GID[1]:") && l.contains("::ffff:198.18.0.1") && l.contains("RoCEv2")
        }),
        "no GID[1] ::ffff:198.18.0.1 with RoCE v2: {}",
        o.describe()
    );
    // Both devices are there.
    let o1 = run_verbs(&svc, &["ibv_devinfo", "-v", "-d", "pmrxe1"], Duration::from_secs(20));
    assert!(o1.ok() && o1.output.contains("::ffff:198.18.0.2"), "pmrxe1: {}", o1.describe());
}

#[test]
fn rc_pingpong_plain() {
    pingpong(1, &[]);
}

#[test]
fn rc_pingpong_buffer_check() {
    pingpong(2, &["-c", "-n", "300"]);
}

#[test]
fn rc_pingpong_completion_events() {
    pingpong(3, &["-e", "-n", "300"]);
}

#[test]
fn rc_pingpong_new_send_api_wr() {
    pingpong(4, &["-N", "-n", "300"]);
}

#[test]
fn rc_pingpong_64k_messages_checked() {
    pingpong(5, &["-s", "65536", "-n", "300", "-c"]);
}

#[test]
fn rc_pingpong_1m_messages_checked() {
    pingpong(6, &["-s", "1048576", "-n", "50", "-c"]);
}

#[test]
fn uc_pingpong() {
    pingpong_prog("ibv_uc_pingpong", 7, &["-n", "200"]);
}

#[test]
fn ud_pingpong() {
    pingpong_prog("ibv_ud_pingpong", 8, &["-n", "200"]);
}

#[test]
fn srq_pingpong_16_qps() {
    // ibv_srq_pingpong: 16 QPs sharing one SRQ per side (its default -q 16).
    pingpong_prog("ibv_srq_pingpong", 9, &["-n", "200"]);
}

/// Run a perftest pair; `lat` selects the latency table. Returns the client output.
fn perftest(port_idx: u16, prog: &str, extra: &[&str], lat: bool) -> String {
    require_tool(prog);
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let port = port_for(port_idx).to_string();
    let mut s = vec![prog, "-d", "pmrxe0", "-p", &port];
    s.extend_from_slice(extra);
    let mut c = s.clone();
    c[2] = "pmrxe1";
    c.push("127.0.0.1");
    let r = run_pair(&svc, &s, &c, port_for(port_idx), T);
    r.assert_ok();
    // The client prints the table for bw tests; for latency tests too (server prints it
    // for some); require figures from the client, and > 0 everywhere they appear.
    let rows = perftest_rows(&r.client.output);
    assert!(!rows.is_empty(), "{prog}: no result rows in the client output: {}", r.client.describe());
    let all = extra.contains(&"-a");
    if all {
        // -a: every power of two from 2 B up to 8 MiB (atomic tests: 8 B only).
        assert!(rows.len() >= 20, "{prog} -a: only {} rows: {}", rows.len(), r.client.describe());
    }
    for row in &rows {
        if lat {
            // #bytes #iterations t_min t_max t_typical t_avg ...
            assert!(row.len() >= 6 && row[2] > 0.0 && row[5] > 0.0, "{prog}: bad latency row {row:?}");
        } else {
            // #bytes #iterations BW peak BW average MsgRate
            assert!(row.len() >= 5 && row[3] > 0.0, "{prog}: BW average not > 0 in row {row:?}");
        }
    }
    let last = rows.last().unwrap();
    if lat {
        eprintln!("{prog} {extra:?}: {} B t_typical {} us t_avg {} us", last[0], last[4], last[5]);
    } else {
        eprintln!("{prog} {extra:?}: {} B BW average {} MB/sec ({} rows)", last[0], last[3], rows.len());
    }
    r.client.output.clone()
}

#[test]
fn perftest_ib_write_bw_default_size() {
    perftest(10, "ib_write_bw", &["-F"], false);
}

#[test]
fn perftest_ib_write_bw_all_sizes() {
    perftest(11, "ib_write_bw", &["-F", "-a", "-n", "100"], false);
}

#[test]
fn perftest_ib_read_bw_default_size() {
    perftest(12, "ib_read_bw", &["-F"], false);
}

#[test]
fn perftest_ib_read_bw_all_sizes() {
    perftest(13, "ib_read_bw", &["-F", "-a", "-n", "100"], false);
}

#[test]
fn perftest_ib_send_bw_default_size() {
    perftest(14, "ib_send_bw", &["-F"], false);
}

#[test]
fn perftest_ib_send_bw_all_sizes() {
    perftest(15, "ib_send_bw", &["-F", "-a", "-n", "100"], false);
}

#[test]
fn perftest_ib_write_lat() {
    perftest(16, "ib_write_lat", &["-F"], true);
}

#[test]
fn perftest_ib_read_lat() {
    perftest(17, "ib_read_lat", &["-F"], true);
}

#[test]
fn perftest_ib_send_lat() {
    perftest(18, "ib_send_lat", &["-F"], true);
}

#[test]
fn perftest_ib_atomic_bw() {
    perftest(19, "ib_atomic_bw", &["-F"], false);
}

/// Four programs, two QP pairs, one service: ib_write_bw and ib_read_bw run at the same time
/// (two clients per device) and both complete with figures.
#[test]
fn two_perftest_pairs_at_once_on_one_service() {
    require_tool("ib_write_bw");
    require_tool("ib_read_bw");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let (pw, pr) = (port_for(20), port_for(21));
    let (sw, sr) = (pw.to_string(), pr.to_string());
    let (w, r) = std::thread::scope(|s| {
        let svc = &svc;
        let (sw, sr) = (&sw, &sr);
        let w = s.spawn(move || {
            run_pair(
                svc,
                &["ib_write_bw", "-d", "pmrxe0", "-F", "-n", "2000", "-p", sw],
                &["ib_write_bw", "-d", "pmrxe1", "-F", "-n", "2000", "-p", sw, "127.0.0.1"],
                pw,
                T,
            )
        });
        let r = s.spawn(move || {
            run_pair(
                svc,
                &["ib_read_bw", "-d", "pmrxe1", "-F", "-n", "2000", "-p", sr],
                &["ib_read_bw", "-d", "pmrxe0", "-F", "-n", "2000", "-p", sr, "127.0.0.1"],
                pr,
                T,
            )
        });
        (w.join().unwrap(), r.join().unwrap())
    });
    for (name, p) in [("ib_write_bw", &w), ("ib_read_bw", &r)] {
        p.assert_ok();
        let rows = perftest_rows(&p.client.output);
        assert!(!rows.is_empty() && rows.iter().all(|x| x.len() >= 5 && x[3] > 0.0), "{name}: {}", p.client.describe());
        eprintln!("{name} concurrently: BW average {} MB/sec", rows[0][3]);
    }
}
