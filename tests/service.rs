//! `pmrxe serve` itself: configuration errors, clean stop under traffic, `pmrxe stats --json`,
//! `pmrxe capture`, and the syscall-free fast path. Each test starts its own private service.
mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// `pmrxe serve --config FILE` must fail fast: status (2 for a config error, non-zero for a
/// runtime error), in under 1 s, exactly one line on stderr, no panic.
fn assert_rejected(toml: &str, want_status: Option<i32>) -> String {
    let dir = TempDir::new("badcfg");
    let f = dir.join("bad.toml");
    std::fs::write(&f, toml).unwrap();
    let t0 = Instant::now();
    let mut child = Command::new(pmrxe_bin())
        .arg("serve")
        .arg("--config")
        .arg(&f)
        .env("PMRXE_SOCKET", dir.join("s.sock"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("out")).unwrap())
        .stderr(std::fs::File::create(dir.join("err")).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let st = wait_timeout(&mut child, Duration::from_secs(10));
    let took = t0.elapsed();
    // A failed start must not leave the EAL runtime dir (default file prefix pmrxe-<pid>).
    let rundir = dpdk_runtime_dir(pid);
    let left_behind = rundir.exists();
    if left_behind {
        let _ = std::fs::remove_dir_all(&rundir); // do not litter the machine; fail below
    }
    let err = read_to_string_lossy(&dir.join("err"));
    let out = read_to_string_lossy(&dir.join("out"));
    let st = st.unwrap_or_else(|| panic!("pmrxe serve with a bad config still running after 10 s; stderr:\n{err}"));
    assert!(!st.success(), "pmrxe serve accepted a bad config ({toml:?})");
    if let Some(code) = want_status {
        assert_eq!(st.code(), Some(code), "exit status for {toml:?}; stderr:\n{err}");
    }
    assert!(st.code().is_some(), "killed by a signal ({st}); stderr:\n{err}");
    assert!(!err.contains("panicked") && !out.contains("panicked"), "panic:\n{err}");
    assert!(took < Duration::from_secs(1), "rejecting {toml:?} took {took:?}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "want exactly one line on stderr for {toml:?}, got:\n{err}");
    assert!(!left_behind, "the failed start left the EAL runtime dir {} behind", rundir.display());
    eprintln!("rejected in {took:?} with {st}: {}", lines[0]);
    lines[0].to_string()
}

#[test]
fn serve_rejects_unknown_config_key_with_status_2_and_one_line() {
    let line = assert_rejected("no_such_key = 1\n", Some(2));
    assert!(line.contains("no_such_key"), "the error does not name the key: {line}");
}

#[test]
fn serve_rejects_unknown_pmd_devargs_fast_with_one_line() {
    // The acceptance check's minimal file (no name, no address).
    assert_rejected("[[ports]]\ndevargs = \"net_nosuchpmd0\"\n", None);
}

#[test]
fn serve_rejects_unknown_pmd_in_an_otherwise_valid_config_fast_with_one_line() {
    // A complete port, so that only the driver name is wrong: this reaches EAL (or a driver
    // check before it); it must still be one line, fast, no panic.
    let _l = heavy_lock(); // may start EAL
    let toml = "[eal]\nhugepages = false\nmemory_mb = 256\n\n[lcores]\ncores = [1]\nmain_core = 0\n\n\
                [[ports]]\nname = \"pmrxe0\"\nkind = \"vdev\"\ndevargs = \"net_nosuchpmd0\"\n\
                mac = \"02:00:c6:12:00:01\"\nipv4 = \"198.18.0.1/24\"\n";
    let line = assert_rejected(toml, None);
    assert!(line.contains("net_nosuchpmd0") || line.contains("ports[0]"), "the error names neither the port nor the driver: {line}");
}

fn dpdk_runtime_dir(pid: u32) -> std::path::PathBuf {
    Path::new("/var/run/dpdk").join(format!("pmrxe-{pid}"))
}

#[test]
fn sigterm_during_ib_write_bw_exits_0_within_5s_and_leaves_nothing_behind() {
    require_tool("ib_write_bw");
    let _l = heavy_lock();
    let hp_before = hugepages_free();
    let mut svc = Service::start_loopback();
    let pid = svc.pid;
    assert!(dpdk_runtime_dir(pid).exists(), "expected the EAL runtime dir {} while running", dpdk_runtime_dir(pid).display());
    let port = port_for(40);
    let ps = port.to_string();
    let so = svc.dir.join("srv.out");
    let co = svc.dir.join("cli.out");
    let mut server = spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe0", "-F", "-D", "5", "-p", &ps], &so);
    wait_listening(&mut server, port, &so, Duration::from_secs(20));
    let mut client =
        spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe1", "-F", "-D", "5", "-p", &ps, "127.0.0.1"], &co);
    // Wait until traffic flows (tx counters move), at most 10 s.
    wait_for_traffic(&svc, 1000, Duration::from_secs(10), &co);
    assert!(client.try_wait().unwrap().is_none(), "client finished before SIGTERM; test timing is wrong");
    let (st, took) = svc.stop_within(Duration::from_secs(5));
    eprintln!("service stopped in {took:?} with {st}");
    // The verbs programs lose their device; whatever they do, they must not be left behind.
    let mut hung = Vec::new();
    for (c, n, o) in [(&mut client, "client", &co), (&mut server, "server", &so)] {
        match wait_timeout(c, Duration::from_secs(10)) {
            Some(st) => eprintln!("ib_write_bw {n} after the service stopped: {st}; output:\n{}", tail(&read_to_string_lossy(o), 4)),
            None => hung.push(n),
        }
    }
    assert!(
        st.success(),
        "service exited with {st} after SIGTERM during traffic; log:\n{}",
        tail(&svc.log_text(), 30)
    );
    assert!(!dpdk_runtime_dir(pid).exists(), "EAL runtime dir {} left behind", dpdk_runtime_dir(pid).display());
    assert!(!svc.socket.exists(), "control socket {} left behind", svc.socket.display());
    assert_eq!(hugepages_free(), hp_before, "HugePages_Free changed");
    // A verbs program whose service went away must fail, not hang (killed after 10 s).
    assert!(hung.is_empty(), "ib_write_bw {hung:?} still running 10 s after the service stopped");
}


#[test]
fn stats_json_parses_and_counts_rx_tx_after_traffic() {
    require_tool("ibv_rc_pingpong");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let before = svc.stats_json();
    assert_eq!(before["devices"], serde_json::json!(["pmrxe0", "pmrxe1"]), "devices: {before}");
    assert!(!before["lcores"].as_array().unwrap().is_empty(), "no lcores in {before}");
    let (rx0, tx0) = (sum_counter(&before, "rx_packets"), sum_counter(&before, "tx_packets"));
    let port = port_for(41);
    loopback_pingpong(&svc, 200, port, Duration::from_secs(60))
    .assert_ok();
    let after = svc.stats_json();
    let (rx, tx) = (sum_counter(&after, "rx_packets") - rx0, sum_counter(&after, "tx_packets") - tx0);
    eprintln!("ping-pong of 200 iterations: rx_packets +{rx}, tx_packets +{tx}");
    // 200 round trips = 400 SENDs (+ ACKs), every frame both transmitted and received in one
    // service (pmrxe0 -> pmrxe1 and back).
    assert!(tx >= 400 && rx >= 400, "rx +{rx} tx +{tx} after 200 ping-pong iterations:\n{after:#}");
    assert_eq!(tx, rx, "loopback: every transmitted frame must be received (no drops expected)\n{after:#}");
    assert!(sum_counter(&after, "sq_wqes") >= 400, "sq_wqes: {after:#}");
    // The text form answers too.
    assert!(svc.stats_text().contains("pmrxe0"), "text stats");
}

#[test]
fn capture_during_pingpong_writes_20_infiniband_frames_with_valid_icrc() {
    require_tool("ibv_rc_pingpong");
    let tshark = require_tool("tshark");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let pcap = svc.dir.join("cap.pcap");
    let mut cap = svc.capture(&["--count", "20"], &pcap);
    let port = port_for(42);
    loopback_pingpong(&svc, 100, port, Duration::from_secs(60))
    .assert_ok();
    let st = wait_timeout(&mut cap, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("pmrxe capture --count 20 still running 20 s after 100 ping-pongs"));
    let cap_err = read_to_string_lossy(&svc.dir.join("cap.err"));
    assert!(st.success(), "pmrxe capture: {st}: {cap_err}");

    // Our own parser: 20 Ethernet records, each a RoCEv2 frame whose ICRC verifies.
    let recs = pmrxe_wire::read_pcap(&pcap).expect("read pcap");
    assert_eq!(recs.len(), 20, "records in the capture");
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r.orig_len as usize, r.data.len(), "frame {i} truncated in the capture");
        let f = pmrxe_wire::parse_frame(&r.data).unwrap_or_else(|e| panic!("frame {i}: {e:?} ({} bytes)", r.data.len()));
        assert_eq!(pmrxe_wire::ROCE_PORT, 4791);
        let _ = f.icrc;
    }

    // Wireshark: every frame dissected as InfiniBand (RRoCE), none malformed.
    let o = Command::new(&tshark)
        .arg("-r")
        .arg(&pcap)
        .args(["--disable-heuristic", "rpcrdma_infiniband", "-T", "fields", "-e", "frame.protocols", "-e", "_ws.malformed"])
        .output()
        .expect("tshark");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "tshark failed: {}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 20, "tshark frames:\n{text}");
    for (i, l) in lines.iter().enumerate() {
        let mut cols = l.split('\t');
        let protos = cols.next().unwrap_or("");
        let malformed = cols.next().unwrap_or("");
        assert!(protos.contains("udp:infiniband"), "frame {i} not dissected as InfiniBand over UDP: {l}");
        assert!(malformed.is_empty() && !protos.contains("malformed"), "frame {i} malformed: {l}");
    }
}

/// The lcore fast path (post -> wire -> completion) makes no syscalls (DESIGN.md rule 9).
///
/// The service runs with `idle = { mode = "busy" }` (the default back-off mode sleeps with
/// nanosleep when idle, which is allowed there and would be counted). strace attaches to the
/// lcore thread only (`-p TID` without `-f`: the control thread, client sessions and the
/// capture writer are other threads and may do syscalls) once `ib_write_bw -D 4` between
/// pmrxe0 and pmrxe1 is moving data, and detaches while it still runs: the window is pure
/// steady-state data path. Allowed in the window: nothing.
///
/// Not in the window, on purpose: QP/CQ/MR set-up and teardown, which the lcore executes as
/// control commands (the teardown munmaps/closes the client's ring segments and wakes the
/// control thread with a futex) — control path, not fast path. No `pmrxe stats` is asked in
/// the window either (a stats request is a control command answered over a channel, i.e. a
/// futex wake from the lcore). And the one syscall the fast path may make by design, the
/// eventfd write of a completion event, only happens for CQs armed with ibv_req_notify_cq,
/// which ib_write_bw without `-e` never arms.
#[test]
fn lcore_fast_path_makes_no_syscalls_during_ib_write_bw() {
    require_tool("ib_write_bw");
    let strace = require_tool("strace");
    require_root();
    let _l = heavy_lock();
    let dir = TempDir::new("busy");
    let cfg = dir.join("busy.toml");
    let base = std::fs::read_to_string(repo_root().join("configs/loopback.toml")).unwrap();
    let mut replaced = 0;
    let busy: String = base
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("idle") {
                replaced += 1;
                "idle = { mode = \"busy\", spin_iterations = 1000, max_sleep_us = 200 }".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(replaced, 1, "configs/loopback.toml has no idle line to replace");
    std::fs::write(&cfg, busy + "\n").unwrap();
    let svc = Service::start(Some(&cfg), None);
    let tids = threads_named(svc.pid, "pmrxe-lcore0");
    assert_eq!(tids.len(), 1, "threads named pmrxe-lcore0 in pid {}: {tids:?}", svc.pid);
    let tid = tids[0];

    // The pair, in the background.
    let port = port_for(43);
    let ps = port.to_string();
    let (so, co) = (dir.join("srv.out"), dir.join("cli.out"));
    let mut server = spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe0", "-F", "-D", "4", "-p", &ps], &so);
    wait_listening(&mut server, port, &so, Duration::from_secs(20));
    let mut client =
        spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe1", "-F", "-D", "4", "-p", &ps, "127.0.0.1"], &co);
    let t1 = Instant::now();
    let mut before;
    loop {
        before = svc.stats_json();
        if sum_counter(&before, "tx_packets") > 1000 {
            break;
        }
        assert!(t1.elapsed() < Duration::from_secs(10), "no traffic 10 s after the client started:\n{}", read_to_string_lossy(&co));
        std::thread::sleep(Duration::from_millis(100));
    }

    let trace = dir.join("lcore.strace");
    let serr = dir.join("strace.err");
    let mut st = default_sigint(&mut Command::new(&strace))
        .args(["-e", "trace=all", "-o"])
        .arg(&trace)
        .args(["-p", &tid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&serr).unwrap())
        .spawn()
        .unwrap();
    let t2 = Instant::now();
    while !read_to_string_lossy(&serr).contains("attached") {
        assert!(st.try_wait().unwrap().is_none(), "strace exited: {}", read_to_string_lossy(&serr));
        assert!(t2.elapsed() < Duration::from_secs(10), "strace did not attach: {}", read_to_string_lossy(&serr));
        std::thread::sleep(Duration::from_millis(20));
    }
    // The observation window itself (a duration by design, not a wait for a condition): asking
    // the service for stats inside it would make the lcore run a control command.
    std::thread::sleep(Duration::from_millis(1200));
    let still_running = client.try_wait().unwrap().is_none() && server.try_wait().unwrap().is_none();
    sigint(st.id());
    let sst = wait_timeout(&mut st, Duration::from_secs(10));
    let after = svc.stats_json();
    let cs = wait_timeout(&mut client, Duration::from_secs(60));
    let ss = wait_timeout(&mut server, Duration::from_secs(10));
    assert!(sst.is_some(), "strace did not detach");
    assert!(
        cs.is_some_and(|s| s.success()) && ss.is_some_and(|s| s.success()),
        "ib_write_bw failed: server {ss:?}:\n{}\nclient {cs:?}:\n{}",
        tail(&read_to_string_lossy(&so), 20),
        tail(&read_to_string_lossy(&co), 20)
    );
    assert!(still_running, "ib_write_bw -D 4 ended inside the strace window: the window was not steady state");
    let tx = sum_counter(&after, "tx_packets") - sum_counter(&before, "tx_packets");
    let wqes = sum_counter(&after, "sq_wqes") - sum_counter(&before, "sq_wqes");
    assert!(tx > 1000 && wqes > 100, "the lcore moved too little traffic to prove anything: tx +{tx}, sq_wqes +{wqes}");
    let text = read_to_string_lossy(&trace);
    let syscalls: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("---") && !l.starts_with("+++"))
        .collect();
    eprintln!("lcore tid {tid}: {} syscalls in the window while moving {tx} frames / {wqes} send WQEs", syscalls.len());
    assert!(
        syscalls.is_empty(),
        "the lcore thread made {} syscalls during steady-state ib_write_bw (allowed: none); first ones:\n{}",
        syscalls.len(),
        syscalls.iter().take(20).map(|l| format!("    {l}\n")).collect::<String>()
    );
}

/// `pmrxe stats --watch` whose reader goes away (`pmrxe stats --watch 1 | head -1`) must end
/// quietly (like any Unix filter on EPIPE/SIGPIPE), not panic with a backtrace.
#[test]
fn stats_watch_into_a_closed_pipe_ends_without_a_panic() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let mut c = svc
        .pmrxe()
        .args(["stats", "--watch", "0.2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = c.stdout.take().unwrap();
    let mut buf = [0u8; 64];
    let n = std::io::Read::read(&mut out, &mut buf).unwrap();
    assert!(n > 0, "no output from pmrxe stats --watch");
    drop(out); // the reader goes away
    let st = wait_timeout(&mut c, Duration::from_secs(10)).expect("pmrxe stats --watch kept running after its reader went away");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!err.contains("panicked"), "pmrxe stats panicked on a closed pipe ({st}):\n{}", tail(&err, 8));
}

/// A verbs program killed with SIGKILL in the middle of traffic: the service releases its
/// QPs/CQs/MRs (no QP left in `pmrxe stats --json`), keeps running, and the next pair works.
#[test]
fn sigkilled_client_mid_traffic_is_cleaned_up_and_service_keeps_serving() {
    require_tool("ib_write_bw");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let port = port_for(44);
    let ps = port.to_string();
    let (so, co) = (svc.dir.join("k.srv.out"), svc.dir.join("k.cli.out"));
    let mut server = spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe0", "-F", "-D", "10", "-p", &ps], &so);
    let t0 = Instant::now();
    while !listens_on(server.id(), port) {
        assert!(server.try_wait().unwrap().is_none(), "server exited: {}", read_to_string_lossy(&so));
        assert!(t0.elapsed() < Duration::from_secs(20), "server never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut client = spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe1", "-F", "-D", "10", "-p", &ps, "127.0.0.1"], &co);
    let t1 = Instant::now();
    loop {
        let j = svc.stats_json();
        let qps: usize = j["lcores"].as_array().unwrap().iter().map(|l| l["qps"].as_array().map_or(0, |q| q.len())).sum();
        if qps >= 2 && sum_counter(&j, "tx_packets") > 1000 {
            break;
        }
        assert!(t1.elapsed() < Duration::from_secs(15), "no traffic: {}", read_to_string_lossy(&co));
        std::thread::sleep(Duration::from_millis(100));
    }
    client.kill().unwrap(); // SIGKILL: no destroy calls, only the socket closing
    client.wait().unwrap();
    // The server is left talking to nobody; stop it too (SIGKILL, same path).
    server.kill().unwrap();
    server.wait().unwrap();
    let t2 = Instant::now();
    loop {
        let j = svc.stats_json();
        let qps: usize = j["lcores"].as_array().unwrap().iter().map(|l| l["qps"].as_array().map_or(0, |q| q.len())).sum();
        let clients = j["clients"].as_array().map_or(0, |c| c.len());
        if qps == 0 && clients == 0 {
            break;
        }
        assert!(t2.elapsed() < Duration::from_secs(10), "10 s after SIGKILL: {qps} QPs and {clients} clients left:\n{j:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let port = port_for(45);
    let ps = port.to_string();
    run_pair(
        &svc,
        &["ibv_rc_pingpong", "-d", "pmrxe0", "-g", "1", "-c", "-n", "100", "-p", &ps],
        &["ibv_rc_pingpong", "-d", "pmrxe1", "-g", "1", "-c", "-n", "100", "-p", &ps, "127.0.0.1"],
        port,
        Duration::from_secs(60),
    )
    .assert_ok();
}

/// Started under a real-time policy on a single CPU (`taskset -c 0 chrt -f 10 pmrxe serve`,
/// what an operator who wants a real-time data path types): the service comes up and serves,
/// its lcore runs SCHED_FIFO at the priority it was given, and every other thread runs
/// SCHED_OTHER. (When every thread kept FIFO, EAL's start-up waited forever for a control
/// thread that could not run on the CPU its creator held.)
#[test]
fn started_under_sched_fifo_on_one_cpu_only_the_lcores_keep_it() {
    require_root();
    let chrt = require_tool("chrt");
    let taskset = require_tool("taskset");
    let _l = heavy_lock();
    let dir = TempDir::new("svc-fifo");
    let socket = dir.join("pmrxe.sock");
    let log = dir.join("service.log");
    let logf = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(taskset)
        .args(["-c", "0"])
        .arg(chrt)
        .args(["-f", "10"])
        .arg(pmrxe_bin())
        .arg("serve")
        .env("PMRXE_SOCKET", &socket)
        .stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .expect("spawn pmrxe serve");
    let pid = child.id();
    let ready = poll_until(Duration::from_secs(30), || socket.exists() && pmrxe_at(&socket).arg("stats").output().is_ok_and(|o| o.status.success()));
    // Thread name, policy and real-time priority of every thread (/proc/PID/task/TID/stat fields
    // 2, 41, 40).
    let threads: Vec<(String, u32, u32)> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|t| {
                let stat = std::fs::read_to_string(t.ok()?.path().join("stat")).ok()?;
                let (name, rest) = (stat[stat.find('(')? + 1..stat.rfind(')')?].to_string(), &stat[stat.rfind(')')? + 2..]);
                let f: Vec<&str> = rest.split(' ').collect();
                // `rest` starts at field 3 (state): field n is f[n - 3].
                Some((name, f.get(38)?.parse().ok()?, f.get(37)?.parse().ok()?))
            })
            .collect()
        })
        .unwrap_or_default();
    sigterm(pid);
    let st = wait_timeout(&mut child, Duration::from_secs(10));
    if st.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let text = read_to_string_lossy(&log);
    assert!(ready, "the service did not come up within 30 s; log:\n{}", tail(&text, 20));
    assert!(st.is_some_and(|s| s.success()), "no clean exit after SIGTERM ({st:?}); log:\n{}", tail(&text, 20));
    let lcores: Vec<_> = threads.iter().filter(|t| t.0.starts_with("pmrxe-lcore")).collect();
    assert!(!lcores.is_empty(), "no lcore thread among {threads:?}");
    for (name, policy, prio) in &threads {
        if name.starts_with("pmrxe-lcore") {
            assert_eq!((*policy, *prio), (1, 10), "{name}: not SCHED_FIFO at priority 10: {threads:?}");
        } else {
            assert_eq!(*policy, 0, "{name}: a control thread kept the real-time policy: {threads:?}");
        }
    }
    assert!(text.contains("started under a real-time policy"), "the service did not say what it did; log:\n{}", tail(&text, 20));
}
