//! `idle = { mode = "wait" }` (issue 39), the embedded default: an idle lcore blocks until
//! there is work, and every source of work wakes it — a client's post (the need-wakeup flag in
//! the client page), a QP timer, a control command — without losing a wake-up.
//!
//! Each test starts its own private service and holds the heavy-test lock. Waits are bounded
//! generously (a lost wake-up shows as the lcore's 1 s safety cap, far above every bound).
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(90);

/// The default config with `extra` appended (a `[faults]` table, say), written under `dir`.
fn default_config_with(dir: &Path, extra: &str) -> PathBuf {
    let base = std::fs::read_to_string(repo_root().join("configs/loopback.toml")).expect("configs/loopback.toml");
    let p = dir.join("wait.toml");
    std::fs::write(&p, format!("{base}\n{extra}")).unwrap();
    p
}

/// Sum of an lcore counter over every lcore in `pmrxe stats --json`.
fn lcore_counter(svc: &Service, name: &str) -> u64 {
    let v = svc.stats_json();
    let lcores = v["lcores"].as_array().cloned().unwrap_or_default();
    lcores.iter().map(|l| l[name].as_u64().or_else(|| l["counters"][name].as_u64()).unwrap_or(0)).sum()
}

/// `pmrxe bench --socket` (the native harness, no shim) against `svc`: part `wake` (`wakes`
/// WRITE round trips, each after `gap_ms` of silence). Returns the JSON it wrote.
fn bench_wake(svc: &Service, dir: &TempDir, wakes: u32, gap_ms: u32) -> serde_json::Value {
    let json = dir.join("wake.json");
    let out = Command::new(pmrxe_bin())
        .args(["bench", "--suite", "quick", "--only", "wake", "--socket"])
        .arg(&svc.socket)
        .args(["--wakes", &wakes.to_string(), "--wake-gap-ms", &gap_ms.to_string(), "--json"])
        .arg(&json)
        .output()
        .expect("pmrxe bench");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "pmrxe bench --only wake failed:\n{text}\nservice log:\n{}", tail(&svc.log_text(), 30));
    eprintln!("{text}");
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

#[test]
fn wait_is_the_default_and_the_loopback_passes_pingpong_and_perftest() {
    let out = Command::new(pmrxe_bin()).args(["config", "default"]).output().expect("pmrxe config default");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with("idle = { mode = \"wait\"")), "the embedded default is not in wait mode:\n{text}");
    require_tool("ibv_rc_pingpong");
    require_tool("ib_write_lat");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let port = port_for(90).to_string();
    let s = ["ibv_rc_pingpong", "-d", "pmrxe0", "-g", "1", "-p", &port, "-n", "500"];
    let mut c = s.to_vec();
    c[2] = "pmrxe1";
    c.push("127.0.0.1");
    run_pair(&svc, &s, &c, port_for(90), T).assert_ok();
    let port = port_for(91).to_string();
    let s = ["ib_write_lat", "-d", "pmrxe0", "-p", &port, "-n", "2000"];
    let mut c = s.to_vec();
    c[2] = "pmrxe1";
    c.push("127.0.0.1");
    let r = run_pair(&svc, &s, &c, port_for(91), T);
    r.assert_ok();
    assert!(r.client.output.contains("#bytes"), "ib_write_lat printed no results: {}", r.client.describe());
    // The lcore slept between the programs (it is in wait mode) and woke for each of them.
    assert!(lcore_counter(&svc, "idle_sleeps") > 0, "the lcore never slept: {}", svc.stats_text());
}

#[test]
fn a_post_to_a_sleeping_lcore_wakes_it() {
    let _l = heavy_lock();
    let dir = TempDir::new("idle-wake");
    let svc = Service::start_loopback();
    let sleeps0 = lcore_counter(&svc, "idle_sleeps");
    // Every measured WRITE is posted after 300 ms of silence: the lcore blocked long before
    // (after spin_us = 100 µs). Only the need-wakeup flag wakes it in microseconds; a lost
    // wake-up costs the rest of its 1 s safety cap.
    let v = bench_wake(&svc, &dir, 5, 300);
    let sleeps = lcore_counter(&svc, "idle_sleeps") - sleeps0;
    assert!(sleeps >= 5, "the lcore slept {sleeps} times over 5 silences: {}", svc.stats_text());
    let max = v["wake"]["max_us"].as_f64().unwrap();
    eprintln!("wake-up after 300 ms: p50 {:.1} us, max {max:.1} us (one-way, RTT/2); {sleeps} sleeps", v["wake"]["p50_us"].as_f64().unwrap());
    assert!(max < 100_000.0, "a post to a sleeping lcore took {max} us (one-way): the wake-up was lost");
}

#[test]
fn a_retransmit_timer_fires_while_the_lcore_sleeps() {
    let _l = heavy_lock();
    let dir = TempDir::new("idle-timer");
    // 30 % of received frames lost: most round trips lose a WRITE or its ACK, and nothing but
    // the requester's retransmit timer (timeout 14: 67 ms) brings them back — while the lcore
    // sleeps with that deadline as its timeout.
    let cfg = default_config_with(dir.path(), "[faults]\nloss = 0.3\nseed = 39\n");
    let svc = Service::start(Some(&cfg), None);
    let v = bench_wake(&svc, &dir, 8, 200);
    let max = v["wake"]["max_us"].as_f64().unwrap();
    // The injector's drops: every one of them was recovered (the round trips completed), and
    // only the requester's retransmit timer recovers a lost WRITE or ACK.
    let stats = svc.stats_json();
    let dropped: u64 = stats["faults"].as_array().into_iter().flatten().map(|f| f["dropped"].as_u64().unwrap_or(0)).sum();
    eprintln!("lossy wake-ups: max {max:.0} us one-way, {dropped} frames dropped and recovered");
    assert!(dropped > 0, "no frame dropped at 30 % loss: {stats}");
    // A timer that did not wake the lcore would leave it asleep until its 1 s cap.
    assert!(max < 400_000.0, "a lost frame took {max} us (one-way) to recover: the timer did not wake the lcore");
}

#[test]
fn an_idle_service_uses_little_cpu() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    std::thread::sleep(Duration::from_secs(1));
    let ticks = || -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", svc.pid)).unwrap();
        // Fields after the ")" of the command: utime and stime are the 12th and 13th.
        let f: Vec<&str> = s[s.rfind(')').unwrap() + 2..].split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    // SAFETY: sysconf is thread-safe.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (a, t0) = (ticks(), std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let (b, dt) = (ticks(), t0.elapsed().as_secs_f64());
    let pct = (b - a) as f64 / hz / dt * 100.0;
    eprintln!("idle service (no client, wait mode): {pct:.2} % of a core over {dt:.1} s");
    assert!(pct < 5.0, "the idle service used {pct:.1} % of a core");
}

/// The lcore thread of `svc` named `pmrxe-lcore0`: its /proc/PID/task/TID/stat fields after
/// the command's ")".
fn lcore_thread_stat(svc: &Service) -> Vec<String> {
    let task = format!("/proc/{}/task", svc.pid);
    for e in std::fs::read_dir(&task).unwrap() {
        let dir = e.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() == "pmrxe-lcore0" {
            let s = std::fs::read_to_string(dir.join("stat")).unwrap();
            return s[s.rfind(')').unwrap() + 2..].split_whitespace().map(str::to_string).collect();
        }
    }
    panic!("no pmrxe-lcore0 thread in {task}");
}

/// On a CPU it shares with a busy thread, the lcore runs at `lcores.nice` (-5 here) and finds
/// the competition (`cpu_contended`): it then gives the CPU back as soon as it finds
/// nothing instead of spinning `spin_us`, which on a shared CPU only delays the thread that
/// must run to answer. The traffic completes either way.
#[test]
fn an_lcore_that_shares_its_cpu_finds_the_competition_and_runs_at_its_niceness() {
    let _l = heavy_lock();
    let dir = TempDir::new("idle-shared");
    let base = std::fs::read_to_string(repo_root().join("configs/loopback.toml")).expect("configs/loopback.toml");
    assert!(base.contains("\n[lcores]\n"), "configs/loopback.toml has no [lcores] table");
    let cfg = dir.join("shared.toml");
    std::fs::write(&cfg, base.replacen("\n[lcores]\n", "\n[lcores]\nnice = -5\n", 1)).unwrap();
    let svc = Service::start(Some(&cfg), None);
    // Field 19 of stat is the nice value (the 17th after the command).
    assert_eq!(lcore_thread_stat(&svc)[16], "-5", "the lcore runs at lcores.nice");
    let contended0 = lcore_counter(&svc, "cpu_contended");
    // A busy nice-0 thread on the lcore's CPU (configs/loopback.toml: CPU 1) while a
    // ping-pong keeps the lcore working and spinning.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // SAFETY: a zeroed cpu_set_t with one CPU set, applied to this thread only.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(1, &mut set);
                assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
            }
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n = n.wrapping_add(1);
                std::hint::spin_loop();
            }
            n
        })
    };
    let json = dir.join("lat.json");
    let out = Command::new(pmrxe_bin())
        .args(["bench", "--suite", "quick", "--only", "lat", "--ops", "write", "--sizes", "8", "--iters", "20000", "--cpu", "0", "--socket"])
        .arg(&svc.socket)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("pmrxe bench");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.join().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "pmrxe bench against a shared lcore: {text}");
    let contended = lcore_counter(&svc, "cpu_contended") - contended0;
    eprintln!("lcore sharing CPU 1 with a busy thread: competition found {contended} times\n{text}");
    assert!(contended > 0, "the lcore never found the busy thread on its CPU: {}", svc.stats_text());
}
