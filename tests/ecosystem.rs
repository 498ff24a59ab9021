//! The RDMA ecosystem through `pmrxe run --` on the loopback service (issue 14): unmodified
//! Debian UCX (ucx_info, ucx_perftest), Open MPI over UCX, libfabric's verbs provider, and the
//! verbs behaviour they rely on (async_fd readiness, /dev/infiniband device nodes).
//!
//! A missing tool fails the test, naming its Debian package (scripts/setup.sh installs them all).
mod common;

use common::*;
use std::path::PathBuf;
use std::time::Duration;

/// The program in PATH, or None after saying which package would provide it.
/// UCX's environment for an rc_verbs run on `dev` (ud_verbs only as the auxiliary transport
/// for UCP's wire-up: rc_verbs connects endpoint to endpoint and needs one, on any hardware).
fn ucx_env(dev: &str) -> Vec<String> {
    vec!["UCX_TLS=rc_verbs,ud_verbs:aux,self".into(), format!("UCX_NET_DEVICES={dev}:1")]
}

#[test]
fn async_fd_is_readable_when_an_event_is_pending() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let prog = svc.dir.join("async_fd");
    compile_c("tests/async_fd.c", &prog, &require_tool("cc"), &["-libverbs"]);
    let o = run_verbs(&svc, &[prog.to_str().unwrap()], Duration::from_secs(30));
    assert!(o.ok() && o.output.contains("OK async_fd"), "{}", o.describe());
}

/// pthread_cancel of a thread blocked in ibv_get_cq_event / ibv_get_async_event /
/// rdma_get_cm_event ends that thread (cleanup handlers run), as with libibverbs; the shim
/// aborted the process ("FATAL: exception not rethrown", rping -P after a failed accept).
#[test]
fn threads_blocked_in_event_calls_can_be_cancelled() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let prog = svc.dir.join("cancel_wait");
    compile_c("tests/cancel_wait.c", &prog, &require_tool("cc"), &["-libverbs", "-lrdmacm", "-lpthread"]);
    let o = run_verbs(&svc, &[prog.to_str().unwrap()], Duration::from_secs(30));
    assert!(o.ok() && o.output.contains("OK cancel"), "{}", o.describe());
}

#[test]
fn ucx_info_lists_pmrxe_devices_with_rc_and_ud_verbs() {
    let ucx_info = require_tool("ucx_info");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    // The service provides UCX's /dev/infiniband/<dev_name> probe itself.
    for i in 0..2 {
        let p = PathBuf::from(format!("/dev/infiniband/pmrxe_uverbs{i}"));
        use std::os::unix::fs::FileTypeExt;
        let m = std::fs::metadata(&p).unwrap_or_else(|e| panic!("{}: {e}; service log:\n{}", p.display(), svc.log_text()));
        assert!(m.file_type().is_char_device(), "{} is not a character device", p.display());
    }
    let o = run_verbs(&svc, &[ucx_info.to_str().unwrap(), "-d"], Duration::from_secs(60));
    assert!(o.ok(), "{}", o.describe());
    for dev in ["pmrxe0", "pmrxe1"] {
        assert!(o.output.contains(&format!("Memory domain: {dev}")), "no memory domain {dev}:\n{}", o.output);
        for tl in ["rc_verbs", "ud_verbs"] {
            let want = format!("Transport: {tl}\n#         Device: {dev}:1");
            assert!(o.output.contains(&want), "no {tl} on {dev}:\n{}", o.output);
        }
    }
}

/// `ucx_perftest` server on pmrxe0, client on pmrxe1, over rc_verbs; returns the client's
/// "Final:" row (iterations, 50%ile, avg, overall latency (us), avg/overall MB/s, msg/s).
fn ucx_perftest(svc: &Service, test: &str, size: &str, iters: &str, port: u16) -> Vec<f64> {
    let bin = require_tool("ucx_perftest");
    let bin = bin.to_str().unwrap();
    let p = port.to_string();
    let senv = ucx_env("pmrxe0");
    let cenv = ucx_env("pmrxe1");
    let mut server: Vec<&str> = vec!["env"];
    server.extend(senv.iter().map(String::as_str));
    server.extend([bin, "-p", &p]);
    let mut client: Vec<&str> = vec!["env"];
    client.extend(cenv.iter().map(String::as_str));
    client.extend([bin, "127.0.0.1", "-p", &p, "-t", test, "-s", size, "-n", iters]);
    let out = run_pair(svc, &server, &client, port, Duration::from_secs(90));
    out.assert_ok();
    let row = out.client.output.lines().find(|l| l.starts_with("Final:")).map(|l| {
        l.split_whitespace().skip(1).filter_map(|w| w.parse::<f64>().ok()).collect::<Vec<f64>>()
    });
    let row = row.unwrap_or_else(|| panic!("no Final: row\n{}", out.client.describe()));
    assert!(row.len() >= 7, "Final: row {row:?}");
    eprintln!("ucx_perftest {test} {size} B: {row:?}");
    row
}

#[test]
fn ucx_perftest_tag_bw_and_tag_lat_over_rc_verbs() {
    require_tool("ucx_perftest");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let bw = ucx_perftest(&svc, "tag_bw", "65536", "2000", port_for(140));
    assert_eq!(bw[0], 2000.0);
    assert!(bw[5] > 50.0, "tag_bw 64 KiB: {} MB/s", bw[5]);
    let lat = ucx_perftest(&svc, "tag_lat", "8", "2000", port_for(141));
    assert_eq!(lat[0], 2000.0);
    assert!(lat[2] > 0.0 && lat[2] < 5000.0, "tag_lat 8 B: {} us", lat[2]);
    // Data went through the pmrxe service (not some other transport).
    let j = svc.stats_json();
    assert!(sum_counter(&j, "tx_bytes") > 2000 * 65536, "service tx_bytes {}", sum_counter(&j, "tx_bytes"));
}

#[test]
fn mpi_pingpong_and_allreduce_over_ucx() {
    let (mpicc, mpirun) = (require_tool("mpicc"), require_tool("mpirun"));
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let prog = svc.dir.join("mpi_pingpong");
    compile_c("tests/mpi_pingpong.c", &prog, &mpicc, &[]);
    let mut args: Vec<String> = vec!["env".into()];
    args.extend(ucx_env("pmrxe0"));
    args.extend(
        [mpirun.to_str().unwrap(), "-np", "2", "--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ucx", "--mca", "btl", "self"]
            .map(String::from),
    );
    for v in ["UCX_TLS", "UCX_NET_DEVICES", "PMRXE_SOCKET", "LD_PRELOAD"] {
        args.extend(["-x".into(), v.into()]);
    }
    args.push(prog.to_str().unwrap().into());
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = run_verbs(&svc, &a, Duration::from_secs(180));
    assert!(o.ok() && o.output.contains("OK mpi"), "{}", o.describe());
    assert!(o.output.contains("allreduce of 100000 doubles checked"), "{}", o.describe());
    let j = svc.stats_json();
    // Both ranks use pmrxe0: same-device traffic is looped back inside the lcore (rx_loopback),
    // not counted as port tx. 2 x 100 x 5 sizes of messages at least went through send queues.
    let (wqes, lb) = (sum_counter(&j, "sq_wqes"), sum_counter(&j, "rx_loopback"));
    assert!(wqes >= 1000 && lb >= 1000, "MPI traffic did not go through pmrxe: sq_wqes {wqes} rx_loopback {lb}");
}

#[test]
fn fi_info_lists_the_verbs_devices() {
    let fi_info = require_tool("fi_info");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let o = run_verbs(&svc, &[fi_info.to_str().unwrap(), "-p", "verbs"], Duration::from_secs(60));
    assert!(o.ok(), "{}", o.describe());
    for d in ["domain: pmrxe0", "domain: pmrxe1", "domain: pmrxe0-dgram", "type: FI_EP_MSG", "type: FI_EP_RDM"] {
        assert!(o.output.contains(d), "fi_info -p verbs lacks `{d}`:\n{}", o.output);
    }
}

/// `fi_pingpong -p verbs -e <ep> -c` (data check) server and client (127.0.0.1) on the loopback
/// service, with `env` settings in front. With no address the verbs provider binds the server
/// to `localhost` through rdma_cm and the client resolves 127.0.0.1: as with the kernel CMA
/// (cma_bind_loopback / cma_resolve_loopback) both attach to the first device (pmrxe0), whose
/// GID is used on the wire while the ids keep 127.0.0.1. The control connection is kernel TCP.
fn fi_pingpong(svc: &Service, bin: &str, env: &[&str], ep: &str, port: u16) -> PairOutput {
    let p = port.to_string();
    let args = ["-p", "verbs", "-e", ep, "-c", "-I", "100", "-S", "65536"];
    let mut server: Vec<&str> = [&["env"], env, &[bin]].concat();
    server.extend(args);
    server.extend(["-B", &p]);
    let mut client: Vec<&str> = [&["env"], env, &[bin]].concat();
    client.extend(args);
    client.extend(["-P", &p, "127.0.0.1"]);
    run_pair(svc, &server, &client, port, Duration::from_secs(60))
}

#[test]
fn fi_pingpong_msg_with_data_check_over_loopback_rdma_cm() {
    let bin = require_tool("fi_pingpong");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let out = fi_pingpong(&svc, bin.to_str().unwrap(), &[], "msg", port_for(142));
    out.assert_ok();
    for o in [&out.server, &out.client] {
        assert!(o.output.contains("64k") && o.output.contains("=100"), "no 64k x 100 row:\n{}", o.describe());
    }
    let j = svc.stats_json();
    assert!(sum_counter(&j, "sq_wqes") >= 200, "fi_pingpong traffic did not go through pmrxe: sq_wqes {}", sum_counter(&j, "sq_wqes"));
}

/// `-e rdm` is libfabric's rxm over verbs MSG endpoints (rdma_cm, as `-e msg`), with
/// libfabric's defaults: rxm opens its MSG CQ with (tx size + rx size) x FI_UNIVERSE_SIZE (256)
/// entries, which needs a device `max_cqe` like a real NIC's (pmrxe reports 4194303, as
/// ConnectX does; it reported 65536 and fi_enable failed with -22 unless FI_UNIVERSE_SIZE=16).
#[test]
fn fi_pingpong_rdm_with_data_check_and_libfabric_defaults() {
    let bin = require_tool("fi_pingpong");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let out = fi_pingpong(&svc, bin.to_str().unwrap(), &["FI_LOG_LEVEL=warn"], "rdm", port_for(143));
    let j = svc.stats_json();
    // A teardown race inside libfabric, not in pmrxe: when the client finishes first and
    // closes, the server's rxm CM thread handles the disconnect while the server is still in
    // fi_pingpong's finalize, closes the MSG endpoint, and the verbs provider reports the
    // receives it had posted as flushed (vrb_ep_close -> vrb_cleanup_cq), which rxm passes to
    // the application: `cq_readerr: Work Request Flushed Error`, exit 125, after the 100
    // verified round trips. It needs the server to lag (a starved CPU: 5 times in 70 runs
    // with the server niced onto the lcore's CPU, and no QP went to ERR in any of them); the
    // same can happen on a NIC. It is tolerated only in that exact form, and only if pmrxe
    // itself flushed nothing (no QP went to ERR: `cqes_flushed` 0), which tells it from a data
    // path that flushed a WR it had already acknowledged.
    let rxm_teardown = !out.server.ok()
        && out.client.ok()
        && out.server.output.contains("cq_readerr: Work Request Flushed Error")
        && sum_counter(&j, "cqes_flushed") == 0;
    if rxm_teardown {
        eprintln!("fi_pingpong rdm: the server met rxm's teardown race (no WR flushed by pmrxe):\n{}", out.server.describe());
    } else {
        out.assert_ok();
    }
    for o in [&out.server, &out.client] {
        assert!(o.output.contains("64k") && o.output.contains("=100"), "no 64k x 100 row:\n{}", o.describe());
        assert!(!o.output.contains("Unable to create verbs CQ"), "{}", o.describe());
    }
    assert!(sum_counter(&j, "sq_wqes") >= 200, "fi_pingpong traffic did not go through pmrxe: sq_wqes {}", sum_counter(&j, "sq_wqes"));
}
