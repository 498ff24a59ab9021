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
