//! Operating pmrxe: the Prometheus endpoint (`service.metrics`, `pmrxe serve --metrics`)
//! against a real private service carrying `ibv_rc_pingpong` traffic, and the systemd unit.
mod common;

use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A free TCP port on 127.0.0.1 (bound and released; the service binds it right after).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// configs/loopback.toml with `metrics = "127.0.0.1:PORT"` in [service].
fn loopback_with_metrics(dir: &TempDir, port: u16) -> std::path::PathBuf {
    let lb = std::fs::read_to_string(repo_root().join("configs/loopback.toml")).unwrap();
    assert!(lb.contains("[service]\n"));
    let f = dir.join("loopback-metrics.toml");
    std::fs::write(&f, lb.replacen("[service]\n", &format!("[service]\nmetrics = \"127.0.0.1:{port}\"\n"), 1)).unwrap();
    f
}

fn sum(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#') && (l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Text-format sanity: each family has one HELP and one TYPE, its samples directly follow,
/// and every sample line is `name{labels} number`.
fn assert_well_formed(body: &str) {
    let mut seen = std::collections::HashSet::new();
    let mut fam = String::new();
    for l in body.lines() {
        if let Some(r) = l.strip_prefix("# TYPE ") {
            let mut w = r.split(' ');
            fam = w.next().unwrap().to_string();
            assert!(matches!(w.next(), Some("counter" | "gauge")), "{l}");
            assert!(seen.insert(fam.clone()), "family {fam} appears twice");
        } else if l.starts_with("# HELP ") {
        } else {
            let name = l.split(['{', ' ']).next().unwrap();
            assert_eq!(name, fam, "sample outside its family: {l}");
            let v = l.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "bad value in {l}");
        }
    }
}

#[test]
fn metrics_endpoint_exports_the_stats_counters_after_pingpong() {
    require_tool("ibv_rc_pingpong");
    let _l = heavy_lock();
    let dir = TempDir::new("ops");
    let mport = free_port();
    let cfg = loopback_with_metrics(&dir, mport);
    let svc = Service::start(Some(&cfg), None);
    assert!(svc.log_text().contains(&format!("http://127.0.0.1:{mport}/metrics")), "{}", svc.log_text());

    let idle = scrape(mport);
    assert_well_formed(&idle);
    assert_eq!(value(&idle, "pmrxe_up "), Some(1.0));
    assert_eq!(value(&idle, "pmrxe_devices "), Some(2.0));
    assert!(value(&idle, "pmrxe_lcore_idle_iterations_total{lcore=\"0\"}").unwrap_or(0.0) > 0.0, "{idle}");

    // Traffic: an ibv_rc_pingpong pair; scrape while it runs to see its QPs. 20000 round trips:
    // at ~20 µs each (since the shim yields to a woken lcore) 400 were over in 10 ms, before
    // the first scrape.
    let port = port_for(90);
    let ps = port.to_string();
    let server = ["ibv_rc_pingpong", "-d", "pmrxe0", "-g", "1", "-n", "20000", "-p", &ps];
    let client = ["ibv_rc_pingpong", "-d", "pmrxe1", "-g", "1", "-n", "20000", "-p", &ps, "127.0.0.1"];
    let pair = std::thread::scope(|sc| {
        let h = sc.spawn(|| run_pair(&svc, &server, &client, port, Duration::from_secs(90)));
        let t0 = Instant::now();
        let mut during = None;
        while !h.is_finished() && t0.elapsed() < Duration::from_secs(90) {
            let b = scrape(mport);
            if sum(&b, "pmrxe_qp_completions_total") > 0.0 && sum(&b, "pmrxe_qp_tx_packets_total") > 0.0 {
                during = Some(b);
                break;
            }
            std::thread::sleep(Duration::from_millis(10)); // scrape interval while the pair runs
        }
        (h.join().unwrap(), during)
    });
    let (r, during) = pair;
    r.assert_ok();
    let during = during.expect("no scrape saw the pingpong QPs (pmrxe_qp_* with completions) while it ran");
    assert_well_formed(&during);
    for fam in [
        "pmrxe_qp_retransmits_total",
        "pmrxe_qp_seq_naks_sent_total",
        "pmrxe_qp_rnr_naks_received_total",
        "pmrxe_qp_duplicates_total",
        "pmrxe_qp_rkey_violations_total",
        "pmrxe_qp_acks_received_total",
    ] {
        assert!(during.contains(&format!("# TYPE {fam} counter")), "{fam} missing:\n{during}");
    }
    assert!(during.contains("status=\"success\""), "{during}");
    assert!(value(&during, "pmrxe_lcore_qps{lcore=\"0\"}").unwrap_or(0.0) >= 2.0, "{during}");
    assert_eq!(value(&during, "pmrxe_qp_local_op_reexecutions_total"), Some(0.0), "invariant 2");

    // After the traffic: the lcore counters moved, and they are the ones `pmrxe stats` shows.
    let after = scrape(mport);
    assert_well_formed(&after);
    for c in ["rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "busy_iterations", "idle_iterations", "sq_wqes", "rq_wqes", "cqes", "commands"] {
        let v = value(&after, &format!("pmrxe_lcore_{c}_total{{lcore=\"0\"}}")).unwrap_or_else(|| panic!("{c} missing:\n{after}"));
        assert!(v > 0.0, "pmrxe_lcore_{c}_total is 0 after traffic");
    }
    for c in ["rx_icrc_errors", "rx_malformed", "cq_events", "tx_no_neighbor"] {
        assert!(value(&after, &format!("pmrxe_lcore_{c}_total{{lcore=\"0\"}}")).is_some(), "{c} missing:\n{after}");
    }
    let j = svc.stats_json();
    let counters = &j["lcores"][0]["counters"];
    for c in ["rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "sq_wqes", "cqes", "rx_icrc_errors"] {
        let want = counters[c].as_u64().unwrap_or_else(|| panic!("stats --json has no {c}: {j}"));
        let got = value(&after, &format!("pmrxe_lcore_{c}_total{{lcore=\"0\"}}")).unwrap() as u64;
        assert_eq!(got, want, "{c}: metrics {got} vs pmrxe stats {want}");
    }

    // HTTP corner cases.
    assert!(http(mport, "GET /nope HTTP/1.1\r\n\r\n").0.starts_with("HTTP/1.1 404"));
    assert!(http(mport, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").0.starts_with("HTTP/1.1 405"));
    let (st, head) = http(mport, "HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(st.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"), "{head}");
    // A client that connects and says nothing does not wedge the endpoint (2 s timeout).
    let _silent = TcpStream::connect(("127.0.0.1", mport)).unwrap();
    let t0 = Instant::now();
    let _ = scrape(mport);
    assert!(t0.elapsed() < Duration::from_secs(5), "scrape blocked {:?} behind a silent client", t0.elapsed());
    drop(svc); // SIGTERM, asserts a clean exit
}

#[test]
fn serve_fails_fast_with_one_line_when_the_metrics_port_is_taken() {
    let _l = heavy_lock();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = TempDir::new("ops-taken");
    let t0 = Instant::now();
    let mut child = Command::new(pmrxe_bin())
        .args(["serve", "--metrics", &port.to_string()])
        .env("PMRXE_SOCKET", dir.join("s.sock"))
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("out")).unwrap())
        .stderr(std::fs::File::create(dir.join("err")).unwrap())
        .spawn()
        .unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(30)).expect("pmrxe serve kept running with its metrics port taken");
    let err = read_to_string_lossy(&dir.join("err"));
    assert_eq!(st.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "want one line on stderr:\n{err}");
    assert!(lines[0].contains(&format!("metrics endpoint 127.0.0.1:{port}")) && lines[0].contains("in use"), "{}", lines[0]);
    assert!(!dir.join("s.sock").exists(), "the control socket was left behind");
    eprintln!("rejected in {:?}: {}", t0.elapsed(), lines[0]);
}

#[test]
fn logs_are_plain_text_when_stderr_is_not_a_terminal() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let log = svc.log_text();
    assert!(log.contains("pmrxe serving"), "{log}");
    assert!(!log.contains('\u{1b}'), "ANSI escapes in a redirected log:\n{log}");
    drop(svc);
}

/// scripts/pmrxe.service: parses as an INI-style unit with the settings operators rely on;
/// `systemd-analyze verify` (with the binary path swapped for one that exists; Debian's systemd).
#[test]
fn systemd_unit_is_valid() {
    let unit = std::fs::read_to_string(repo_root().join("scripts/pmrxe.service")).unwrap();
    let mut section = String::new();
    let mut kv = Vec::new();
    for (i, l) in unit.lines().enumerate() {
        let t = l.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with(';') {
            continue;
        }
        if t.starts_with('[') {
            assert!(t.ends_with(']'), "line {}: {l}", i + 1);
            section = t[1..t.len() - 1].to_string();
            assert!(["Unit", "Service", "Install"].contains(&section.as_str()), "unknown section {section}");
            continue;
        }
        let (k, v) = t.split_once('=').unwrap_or_else(|| panic!("line {}: not key=value: {l}", i + 1));
        assert!(!section.is_empty(), "line {}: key outside a section", i + 1);
        kv.push((section.clone(), k.trim().to_string(), v.trim().to_string()));
    }
    let get = |s: &str, k: &str| kv.iter().find(|(a, b, _)| a == s && b == k).map(|x| x.2.clone());
    assert_eq!(get("Service", "ExecStart").as_deref(), Some("/usr/local/bin/pmrxe serve --config /etc/pmrxe/pmrxe.toml"));
    assert_eq!(get("Service", "Restart").as_deref(), Some("on-failure"));
    assert_eq!(get("Service", "RuntimeDirectory").as_deref(), Some("pmrxe"));
    assert_eq!(get("Service", "LimitMEMLOCK").as_deref(), Some("infinity"));
    assert!(get("Install", "WantedBy").is_some());

    let sa = require_tool("systemd-analyze");
    let dir = TempDir::new("unit");
    let u = dir.join("pmrxe.service");
    std::fs::write(&u, unit.replace("/usr/local/bin/pmrxe", pmrxe_bin().to_str().unwrap())).unwrap();
    let o = Command::new(sa).args(["verify", "--man=no"]).arg(&u).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // Only complaints about this unit count (the host's own units may be noisy).
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("pmrxe.service")).collect();
    assert!(o.status.success() && ours.is_empty(), "systemd-analyze verify: {}\n{err}", o.status);
}

/// scripts/install.sh is valid shell and has a dry-run mode that installs nothing.
#[test]
fn install_script_dry_run() {
    let s = repo_root().join("scripts/install.sh");
    let o = Command::new("bash").arg("-n").arg(&s).output().unwrap();
    assert!(o.status.success(), "bash -n: {}", String::from_utf8_lossy(&o.stderr));
    let dir = TempDir::new("install");
    let o = Command::new("bash")
        .arg(&s)
        .args(["--dry-run", "--prefix"])
        .arg(dir.join("usr"))
        .env("PMRXE_BIN_DIR", pmrxe_bin().parent().unwrap())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "install.sh --dry-run: {out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("pmrxe.service") && out.contains("/etc/pmrxe/pmrxe.toml"), "{out}");
    assert!(!dir.join("usr").exists(), "--dry-run created files");
}
