//! Several application threads posting to one QP and polling one CQ at once through the shim
//! (`tests/shim_threads.c`): verbs lets them, the shim serialises each queue with a spinlock and
//! hands out shared handles only (issue 38, "a sound shim"). Every WR completes exactly once,
//! in send-queue order as each poller sees it, and every target slot holds its WR's value.
mod common;
use common::*;
use std::time::Duration;

#[test]
fn threads_post_and_poll_one_qp_and_one_cq_concurrently() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let prog = svc.dir.join("shim_threads");
    compile_c("tests/shim_threads.c", &prog, &require_tool("cc"), &["-libverbs", "-lpthread"]);
    let out = run_verbs(&svc, &[prog.to_str().unwrap(), "pmrxe0"], Duration::from_secs(90));
    assert!(out.ok() && out.output.contains("OK shim_threads"), "{}", out.describe());
}

/// The `ibv_wr_*` batch (tests/qpex_check.c): staged in the send ring's slots between
/// `ibv_wr_start` and `ibv_wr_complete`, published whole or not at all. A builder error, a
/// batch larger than the ring, `ibv_wr_abort` and a `wr_set_*` with no WQE each leave nothing
/// for the service to run (a marker WRITE posted after each is the next completion), inline data
/// is placed, and a full-ring batch works after them all.
#[test]
fn wr_batches_are_published_whole_or_not_at_all() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let prog = svc.dir.join("qpex_check");
    compile_c("tests/qpex_check.c", &prog, &require_tool("cc"), &["-libverbs"]);
    let out = run_verbs(&svc, &[prog.to_str().unwrap(), "pmrxe0"], Duration::from_secs(60));
    assert!(out.ok() && out.output.contains("OK qpex_check"), "{}", out.describe());
    assert_eq!(out.output.matches("\nok   ").count() + usize::from(out.output.starts_with("ok   ")), 8, "{}", out.describe());
}
