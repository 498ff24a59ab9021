//! Unmodified librdmacm programs between two services in two network namespaces (issue 14):
//! host A (10.77.0.1, `configs/netns-a.toml`) and host B (10.77.0.2) joined by a veth, DPDK
//! af_packet on each end, so every CM MAD and data packet crosses a real (virtual) link with
//! ARP-free static neighbours. Servers run against A, clients against B, all through
//! `pmrxe run --` (a program reaches its service through the socket file). The port MTU is
//! 1500, so the CM negotiates a 1024-byte path MTU (the loopback tests run at 4096).
//! Each test checks that both services end with no rdma_cm id, channel, listener,
//! connection, client or QP left.
mod common;

use std::time::{Duration, Instant};

use common::*;

const A: &str = "10.77.0.1";
const T: Duration = Duration::from_secs(60);

fn port(i: u16) -> String {
    port_for(500 + i).to_string()
}

/// A server on service `a` (until it listens), then its client on service `b`; each bounded.
fn across(a: &Service, b: &Service, server: &[&str], client: &[&str]) -> PairOutput {
    let t0 = Instant::now();
    let so = a.dir.join(&format!("{}-{}.server.out", server[0], t0.elapsed().as_nanos()));
    let mut s = spawn_cm_server(a, server, &so);
    let c = run_verbs(b, client, T);
    let st = wait_timeout(&mut s, T.saturating_sub(t0.elapsed()).max(Duration::from_secs(5)));
    PairOutput { server: ProgOutput { cmdline: server.join(" "), status: st, output: read_to_string_lossy(&so) }, client: c }
}

fn nothing_left(a: &Service, b: &Service, what: &str) {
    // A DREQ lost on the veth would be retransmitted after ~4.8 s, then TIMEWAIT (0.5 s).
    assert_nothing_left(a, Duration::from_secs(30), &format!("{what}, host A"));
    assert_nothing_left(b, Duration::from_secs(30), &format!("{what}, host B"));
}

#[test]
fn rdmacm_utils_and_perftest_r_between_two_namespaces() {
    for t in ["rping", "ucmatose", "udaddy", "rdma_server", "rdma_client", "ib_write_bw"] {
        require_tool(t);
    }
    let _l = heavy_lock();
    let ns = NetnsPair::up("rn");
    let dir = TempDir::new("cm-netns-utils");
    let (a, b) = ns.services(&dir);
    let t0 = Instant::now();

    // rping: 100 ping/pong rounds with data verification (-v prints each buffer; rping checks
    // the RDMA READ/WRITE contents against what it sent and fails otherwise).
    let p = port(0);
    let r = across(&a, &b, &["rping", "-s", "-a", A, "-p", &p, "-C", "100", "-v"], &["rping", "-c", "-a", A, "-p", &p, "-C", "100", "-v"]);
    r.assert_ok();
    let rounds = r.client.output.lines().filter(|l| l.starts_with("ping data: rdma-ping-")).count();
    assert_eq!(rounds, 100, "{}", r.client.describe());
    assert!(r.server.output.contains("server ping data: rdma-ping-99: "), "{}", r.server.describe());
    nothing_left(&a, &b, "rping -C 100");

    // ucmatose: one connection (the default), then `-c 4` connections with 20 messages each.
    let p = port(1);
    let r = across(&a, &b, &["ucmatose", "-b", A, "-p", &p], &["ucmatose", "-s", A, "-p", &p]);
    r.assert_ok();
    assert!(r.client.output.contains("data transfers complete"), "{}", r.client.describe());
    let p = port(2);
    let r = across(&a, &b, &["ucmatose", "-b", A, "-p", &p, "-c", "4", "-C", "20"], &["ucmatose", "-s", A, "-p", &p, "-c", "4", "-C", "20"]);
    r.assert_ok();
    assert!(r.client.output.contains("data transfers complete") && r.server.output.contains("disconnected"), "{}\n{}", r.client.describe(), r.server.describe());
    nothing_left(&a, &b, "ucmatose");

    // udaddy: UD through SIDR (udaddy has no port option: 7174).
    let r = across(&a, &b, &["udaddy", "-b", A], &["udaddy", "-s", A]);
    r.assert_ok();
    assert!(r.client.output.contains("data transfers complete"), "{}", r.client.describe());
    nothing_left(&a, &b, "udaddy");

    // rdma_server / rdma_client: rdma_getaddrinfo, rdma_create_ep, rdma_get_request, sync ids.
    let p = port(3);
    let r = across(&a, &b, &["rdma_server", "-s", A, "-p", &p], &["rdma_client", "-s", A, "-p", &p]);
    r.assert_ok();
    assert!(r.client.output.contains("rdma_client: end 0") && r.server.output.contains("rdma_server: end 0"), "{}\n{}", r.client.describe(), r.server.describe());
    nothing_left(&a, &b, "rdma_server/rdma_client");

    // perftest -R: the QP exchange through rdma_cm private data; 2000 x 64 KiB WRITEs at the
    // negotiated 1024-byte path MTU are 128 000 packets on the veth.
    let tx = |s: &Service| sum_counter(&s.stats_json(), "tx_packets");
    let before = tx(&b);
    let p = port(4);
    let r = across(&a, &b, &["ib_write_bw", "-R", "-d", "pmrxe0", "-p", &p, "-n", "2000"], &["ib_write_bw", "-R", "-d", "pmrxe0", "-p", &p, "-n", "2000", A]);
    r.assert_ok();
    let rows = perftest_rows(&r.client.output);
    assert!(!rows.is_empty(), "{}", r.client.describe());
    let sent = tx(&b) - before;
    assert!((128_000..160_000).contains(&sent), "{sent} frames from B for 2000 x 64 KiB WRITEs: path MTU not 1024?");
    eprintln!("ib_write_bw -R across namespaces: {:?} ({sent} frames); all programs in {:.1} s", rows.last().unwrap(), t0.elapsed().as_secs_f64());
    nothing_left(&a, &b, "ib_write_bw -R");
}

/// qperf -cm1: its client reaches the server's TCP control port and its rdma_cm address by
/// the same name, so both qperf processes run in a third namespace whose `lo` carries
/// 10.77.0.1 (kernel TCP) while their QPs live on services A and B (RDMA over the veth).
#[test]
fn qperf_cm1_between_two_namespaces() {
    require_tool("qperf");
    let _l = heavy_lock();
    let ns = NetnsPair::up("rq");
    let dir = TempDir::new("cm-netns-qperf");
    let (a, b) = ns.services(&dir);
    let tcp = LoNetns::new("rqtcp", &["10.77.0.1/32"]);
    let lp = port(5);
    let so = dir.join("qperf-server.out");
    let mut server = tcp.spawn(&a, &["qperf", "-lp", &lp], &so);
    wait_listening(&mut server, lp.parse().unwrap(), &so, Duration::from_secs(20));
    let mut figures = Vec::new();
    for (test, key) in [("rc_bw", "bw"), ("rc_lat", "latency")] {
        let out = dir.join(&format!("qperf-{test}.out"));
        let mut c = tcp.spawn(&b, &["qperf", A, "-lp", &lp, "-cm1", "-t", "1", test], &out);
        let st = wait_timeout(&mut c, Duration::from_secs(30));
        let text = read_to_string_lossy(&out);
        assert!(st.is_some_and(|s| s.success()), "qperf {test}: {st:?}\n{text}\nserver:\n{}", read_to_string_lossy(&so));
        let v = qperf_value(&text, key).unwrap_or_else(|| panic!("no {key} in qperf {test}:\n{text}"));
        assert!(v > 0.0, "qperf {test}: {v}");
        figures.push(format!("{test} {v:.1}"));
    }
    eprintln!("qperf -cm1 across namespaces (MB/s, us): {}", figures.join(", "));
    let _ = server.kill();
    let _ = server.wait();
    nothing_left(&a, &b, "qperf");
}
