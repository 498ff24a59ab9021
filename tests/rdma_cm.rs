//! librdmacm programs (rdmacm-utils, perftest -R), unmodified, through `pmrxe run --` on the
//! embedded loopback configuration: the shim's rdma_* API (ffi/verbs/src/cm) over the
//! service's connection manager (IBTA CM MADs on QP1). Every test starts its own private
//! service and holds the heavy-test lock. rdma_cm servers listen on no TCP port, so the
//! client starts once the server has had time to listen, and is retried (bounded) while it is
//! rejected because the listener is not there yet.
mod common;

use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(60);
const ADDR: &str = "198.18.0.1";

fn port(i: u16) -> String {
    port_for(300 + i).to_string()
}

#[test]
fn rping_verifies_data_both_ways() {
    require_tool("rping");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let p = port(0);
    let r = run_cm_pair(&svc, &["rping", "-s", "-a", ADDR, "-p", &p, "-C", "10", "-v"], &["rping", "-c", "-a", ADDR, "-p", &p, "-C", "10", "-v"], T);
    r.assert_ok();
    assert!(r.client.output.contains("ping data: rdma-ping-9: "), "{}", r.client.describe());
    assert!(r.server.output.contains("server ping data: rdma-ping-9: "), "{}", r.server.describe());
}

#[test]
fn rping_to_a_port_without_listener_is_rejected_fast() {
    require_tool("rping");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let t0 = Instant::now();
    let c = run_verbs(&svc, &["rping", "-c", "-a", ADDR, "-p", &port(1), "-C", "1", "-v"], Duration::from_secs(20));
    assert!(c.status.is_some(), "rping hung: {}", c.describe());
    assert!(!c.ok() && c.output.contains("RDMA_CM_EVENT_REJECTED"), "{}", c.describe());
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
}

#[test]
fn ucmatose_one_and_several_connections() {
    require_tool("ucmatose");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let p = port(2);
    let r = run_cm_pair(&svc, &["ucmatose", "-b", ADDR, "-p", &p], &["ucmatose", "-s", ADDR, "-p", &p], T);
    r.assert_ok();
    assert!(r.client.output.contains("data transfers complete"), "{}", r.client.describe());
    let p = port(3);
    let r = run_cm_pair(&svc, &["ucmatose", "-b", ADDR, "-p", &p, "-c", "4", "-C", "20"], &["ucmatose", "-s", ADDR, "-p", &p, "-c", "4", "-C", "20"], T);
    r.assert_ok();
    assert!(r.server.output.contains("disconnected"), "{}", r.server.describe());
}

#[test]
fn udaddy_ud_through_sidr() {
    require_tool("udaddy");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    // udaddy has no port option (7174); `-p` is its port space.
    let r = run_cm_pair(&svc, &["udaddy", "-b", ADDR], &["udaddy", "-s", ADDR], T);
    r.assert_ok();
    assert!(r.client.output.contains("data transfers complete"), "{}", r.client.describe());
}

#[test]
fn rdma_server_and_client_with_create_ep_and_get_request() {
    require_tool("rdma_server");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let p = port(4);
    let r = run_cm_pair(&svc, &["rdma_server", "-s", ADDR, "-p", &p], &["rdma_client", "-s", ADDR, "-p", &p], T);
    r.assert_ok();
    assert!(r.client.output.contains("rdma_client: end 0"), "{}", r.client.describe());
    assert!(r.server.output.contains("rdma_server: end 0"), "{}", r.server.describe());
}

#[test]
fn perftest_write_bw_and_ud_send_bw_over_rdma_cm() {
    require_tool("ib_write_bw");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let p = port(5);
    let r = run_cm_pair(&svc, &["ib_write_bw", "-R", "-d", "pmrxe0", "-p", &p, "-n", "2000"], &["ib_write_bw", "-R", "-d", "pmrxe0", "-p", &p, "-n", "2000", ADDR], T);
    r.assert_ok();
    assert!(!perftest_rows(&r.client.output).is_empty(), "{}", r.client.describe());
    let p = port(6);
    let r = run_cm_pair(
        &svc,
        &["ib_send_bw", "-R", "-c", "UD", "-d", "pmrxe0", "-p", &p, "-n", "1000"],
        &["ib_send_bw", "-R", "-c", "UD", "-d", "pmrxe0", "-p", &p, "-n", "1000", ADDR],
        T,
    );
    r.assert_ok();
    assert!(!perftest_rows(&r.client.output).is_empty(), "{}", r.client.describe());
}

#[test]
fn rsockets_rstream_and_riostream_run_on_the_shim() {
    require_tool("rstream");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    for (i, prog) in [(7, "rstream"), (8, "riostream")] {
        let p = port(i);
        let r = run_cm_pair(&svc, &[prog, "-b", ADDR, "-p", &p, "-S", "4096", "-C", "100"], &[prog, "-s", ADDR, "-p", &p, "-S", "4096", "-C", "100"], T);
        r.assert_ok();
        assert!(r.client.output.contains("custom    4k"), "{}", r.client.describe());
    }
}

#[test]
fn cmtime_reports_connection_setup() {
    require_tool("cmtime");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let p = port(9);
    // The cmtime server serves until killed.
    let so = svc.dir.join("cmtime-server.out");
    let mut s = spawn_cm_server(&svc, &["cmtime", "-b", ADDR, "-p", &p, "-c", "20"], &so);
    let c = run_verbs(&svc, &["cmtime", "-s", ADDR, "-p", &p, "-c", "20"], T);
    sigterm(s.id());
    let _ = wait_timeout(&mut s, Duration::from_secs(10)).or_else(|| {
        let _ = s.kill();
        s.wait().ok()
    });
    assert!(c.ok() && c.output.contains("connect") && c.output.contains("disconnect"), "{}\nserver: {}", c.describe(), read_to_string_lossy(&so));
}

