//! Issue 13 item 9: a `pmrxe capture` that dies (Ctrl-C, SIGTERM, SIGKILL) must never take
//! the service down. Before the fix, the service ran with the default SIGPIPE action: the next
//! frame the capture writer wrote into the dead client's pipe killed `pmrxe serve` (exit 141,
//! no log line) and every verbs client saw IBV_EVENT_DEVICE_FATAL.
mod common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn capture_json(svc: &Service) -> serde_json::Value {
    svc.stats_json()["capture"].clone()
}

/// Start `pmrxe capture --count 1000000` and wait until the service reports it active and has
/// written at least one frame more than `frames_before` into it (so the pipe is in use).
fn start_capture(svc: &Service, tag: &str, frames_before: u64, need_frames: bool) -> Child {
    let out = svc.dir.join(&format!("{tag}.pcap"));
    let err = svc.dir.join(&format!("{tag}.err"));
    let mut cmd = svc.pmrxe();
    cmd.args(["capture", "--out"]).arg(&out).args(["--count", "1000000"]).stdout(Stdio::null()).stderr(std::fs::File::create(&err).unwrap());
    default_sigint(&mut cmd);
    let mut cap = cmd.spawn().expect("spawn pmrxe capture");
    let t0 = Instant::now();
    loop {
        let c = capture_json(svc);
        let frames = c["frames"].as_u64().unwrap_or(0);
        if c["active"] == serde_json::json!(true) && (!need_frames || frames > frames_before) {
            break;
        }
        assert!(cap.try_wait().unwrap().is_none(), "{tag}: pmrxe capture exited early: {}", read_to_string_lossy(&err));
        assert!(t0.elapsed() < Duration::from_secs(15), "{tag}: capture never became active with frames flowing: {c}");
        std::thread::sleep(Duration::from_millis(50));
    }
    cap
}

/// Assert the service process is still running (not killed by SIGPIPE or anything else).
fn assert_alive(svc: &mut Service, when: &str) {
    let child = svc.child.as_mut().expect("service child");
    if let Some(st) = child.try_wait().unwrap() {
        svc.child = None;
        panic!("the service died {when} ({st}); log:\n{}", tail(&read_to_string_lossy(&svc.log), 30));
    }
}

/// Wait until the service reports no capture running; the service must stay alive meanwhile.
fn wait_capture_inactive(svc: &mut Service, when: &str) {
    let t0 = Instant::now();
    loop {
        assert_alive(svc, when);
        let c = capture_json(svc);
        if c["active"] == serde_json::json!(false) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{when}: the capture is still marked active 10 s later: {c}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn capture_killed_by_sigint_sigterm_sigkill_leaves_service_running() {
    require_tool("ib_write_bw");
    require_tool("ibv_rc_pingpong");
    let _l = heavy_lock();
    let mut svc = Service::start_loopback();

    // Traffic for the whole kill sequence: ib_write_bw for a fixed duration, which must still
    // complete successfully afterwards.
    let port = port_for(70);
    let ps = port.to_string();
    let (so, co) = (svc.dir.join("bw.srv.out"), svc.dir.join("bw.cli.out"));
    let mut server = spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe0", "-F", "-D", "12", "-p", &ps], &so);
    wait_listening(&mut server, port, &so, Duration::from_secs(20));
    let mut client = spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe1", "-F", "-D", "12", "-p", &ps, "127.0.0.1"], &co);
    wait_for_traffic(&svc, 1000, Duration::from_secs(20), &co);

    for (name, sig) in [("sigint", libc::SIGINT), ("sigterm", libc::SIGTERM), ("sigkill", libc::SIGKILL)] {
        let before = capture_json(&svc)["frames"].as_u64().unwrap_or(0);
        let mut cap = start_capture(&svc, name, before, true);
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
        assert_eq!(unsafe { libc::kill(cap.id() as i32, sig) }, 0, "kill {name}");
        let st = wait_timeout(&mut cap, Duration::from_secs(10)).unwrap_or_else(|| panic!("pmrxe capture outlived {name}"));
        assert!(!st.success(), "pmrxe capture exited 0 after {name}");
        // Frames keep flowing: the writer hits the closed pipe and must end the capture, not
        // the service.
        wait_capture_inactive(&mut svc, &format!("after pmrxe capture got {name}"));
        if let Some(s) = client.try_wait().unwrap() {
            assert!(s.success(), "ib_write_bw client failed ({s}) after {name}: {}", read_to_string_lossy(&co));
        }
    }

    // The traffic that ran through all three kills completes normally.
    let cs = wait_timeout(&mut client, Duration::from_secs(40));
    let ss = wait_timeout(&mut server, Duration::from_secs(10));
    assert!(
        cs.is_some_and(|s| s.success()) && ss.is_some_and(|s| s.success()),
        "ib_write_bw across the capture kills: client {cs:?} server {ss:?}\nCLIENT:\n{}\nSERVER:\n{}\nSERVICE LOG:\n{}",
        tail(&read_to_string_lossy(&co), 20),
        tail(&read_to_string_lossy(&so), 20),
        tail(&svc.log_text(), 20)
    );
    assert!(!read_to_string_lossy(&co).contains("DEVICE_FATAL"), "client saw a fatal device event");

    // A capture killed while nothing is sent still ends: the service notices the reader is gone
    // without waiting for a frame to write.
    let mut idle_cap = start_capture(&svc, "idle", 0, false);
    idle_cap.kill().unwrap();
    idle_cap.wait().unwrap();
    wait_capture_inactive(&mut svc, "after an idle pmrxe capture got SIGKILL");

    // The service still serves: new traffic, stats, and a fresh capture that finishes.
    let port = port_for(71);
    loopback_pingpong(&svc, 200, port, Duration::from_secs(60))
    .assert_ok();
    assert_alive(&mut svc, "after the final ping-pong");
    let j = svc.stats_json();
    assert_eq!(j["capture"]["active"], serde_json::json!(false), "capture still active: {j:#}");
    assert!(svc.stats_text().contains("pmrxe0"), "text stats");
    // One log line per ended capture, naming why it ended.
    let log = svc.log_text();
    let ended = log.lines().filter(|l| l.contains("capture ended")).count();
    assert!(ended >= 4, "expected a `capture ended` log line for each of the 4 killed captures, found {ended}:\n{}", tail(&log, 30));
    // Drop: SIGTERM, clean exit 0 within 5 s.
}
