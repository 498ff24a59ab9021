//! Fault injection on the real path: `pmrxe serve` with a `[faults]` table (every DPDK port
//! wrapped in a seeded `FaultyPort`: loss, duplication, reordering, bit flips on receive),
//! driven by unmodified verbs programs. At 0.1 %, 1 % and 5 % loss (plus reordering,
//! duplication and corruption) `ibv_rc_pingpong -c` completes with its buffers verified,
//! `ib_write_bw` and `ib_read_bw` complete, go-back-N retransmits are counted (≥ 1 %), every
//! corrupted frame that reaches the transport is dropped and counted as an ICRC error, and no
//! counted drop exceeds what was injected.
mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// `configs/loopback.toml` with the Prometheus endpoint on 127.0.0.1:`metrics` and a
/// `[faults]` table appended.
fn faulty_config(dir: &Path, loss: f64, reorder: f64, duplicate: f64, corrupt: f64, seed: u64, metrics: u16) -> PathBuf {
    let base = std::fs::read_to_string(repo_root().join("configs/loopback.toml")).expect("configs/loopback.toml");
    assert!(base.contains("[service]\n"));
    let base = base.replacen("[service]\n", &format!("[service]\nmetrics = \"127.0.0.1:{metrics}\"\n"), 1);
    let p = dir.join("faults.toml");
    std::fs::write(
        &p,
        format!("{base}\n[faults]\nloss = {loss}\nreorder = {reorder}\nduplicate = {duplicate}\ncorrupt = {corrupt}\nseed = {seed}\n"),
    )
    .unwrap();
    p
}

/// Samples `pmrxe stats --json` every 100 ms while a workload runs and keeps, per QP number,
/// the largest `retransmits` seen (QPs disappear from the stats when their program exits).
struct Sampler {
    stop: Arc<AtomicBool>,
    max: Arc<Mutex<std::collections::HashMap<u64, u64>>>,
    t: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(socket: &Path) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max: Arc<Mutex<std::collections::HashMap<u64, u64>>> = Default::default();
        let (s, m, sock) = (stop.clone(), max.clone(), socket.to_path_buf());
        let t = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let o = std::process::Command::new(pmrxe_bin()).env("PMRXE_SOCKET", &sock).args(["stats", "--json"]).output();
                if let Ok(o) = o {
                    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&o.stdout) {
                        for lc in v["lcores"].as_array().into_iter().flatten() {
                            for q in lc["qps"].as_array().into_iter().flatten() {
                                let (qpn, r) = (q["qpn"].as_u64().unwrap_or(0), q["retransmits"].as_u64().unwrap_or(0));
                                let mut g = m.lock().unwrap();
                                let e = g.entry(qpn).or_insert(0);
                                *e = (*e).max(r);
                            }
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Sampler { stop, max, t: Some(t) }
    }
    /// Total retransmits over every QP seen.
    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.t.take().unwrap().join().unwrap();
        let g = self.max.lock().unwrap();
        g.values().sum()
    }
}

fn lcore_counter(v: &serde_json::Value, name: &str) -> u64 {
    v["lcores"].as_array().into_iter().flatten().map(|l| l["counters"][name].as_u64().unwrap_or(0)).sum()
}

/// Sum of one injected-fault counter over every fault injector in `pmrxe stats --json`
/// (`faults`: one entry per port and lcore).
fn injected(v: &serde_json::Value, field: &str) -> u64 {
    v["faults"].as_array().into_iter().flatten().map(|f| f[field].as_u64().unwrap_or(0)).sum()
}

struct Level {
    name: &'static str,
    loss: f64,
    reorder: f64,
    duplicate: f64,
    corrupt: f64,
    port: u16,
}

fn run_level(l: &Level) {
    let _lock = heavy_lock();
    require_tool("ibv_rc_pingpong");
    require_tool("ib_write_bw");
    require_tool("ib_read_bw");
    let dir = TempDir::new(&format!("faults-{}", l.name));
    let cfg = faulty_config(dir.path(), l.loss, l.reorder, l.duplicate, l.corrupt, 0x5eed + l.port as u64, l.port + 3);
    let mut svc = Service::start(Some(&cfg), None);
    let t0 = Instant::now();
    let sampler = Sampler::start(&svc.socket);
    let limit = Duration::from_secs(40);

    // rc_pingpong -c: every received buffer is checked against the expected pattern.
    let p = l.port.to_string();
    let pp = run_pair(
        &svc,
        &["ibv_rc_pingpong", "-d", "pmrxe0", "-g", "1", "-c", "-n", "500", "-p", &p],
        &["ibv_rc_pingpong", "-d", "pmrxe1", "-g", "1", "-c", "-n", "500", "-p", &p, "127.0.0.1"],
        l.port,
        limit,
    );
    // ibv_rc_pingpong's end-of-run race: a side finishes once it has *received* the last
    // message and destroys its QP at once; if the ACK for that message is lost (likely at 5 %),
    // the other side retransmits into a QP that no longer exists and ends with RETRY_EXC_ERR.
    // Either side can be the one left retransmitting (the last message of either direction
    // can lose its ACK; a CI run saw the server fail on its last SEND after the client had
    // finished all 500 iterations). Real RC hardware behaves the same way. Accept exactly that
    // case — one side completed with all buffers checked, the other failed only with the retry
    // error, and the service counted the retransmissions that arrived for the destroyed QP —
    // and fail on anything else.
    let lost_last_ack = |done: &ProgOutput, left: &ProgOutput| {
        done.ok() && parse_pingpong(&done.output).is_some() && !left.ok() && left.output.contains("transport retry counter exceeded")
    };
    let end_race = (lost_last_ack(&pp.server, &pp.client) || lost_last_ack(&pp.client, &pp.server))
        && svc.stats_json()["lcores"].as_array().is_some_and(|ls| ls.iter().any(|l| l["counters"]["rx_unknown_qp"].as_u64().unwrap_or(0) > 0));
    if end_race {
        eprintln!("faults {}: rc_pingpong hit the end-of-run lost-last-ACK race (one side done, the other RETRY_EXC_ERR into the destroyed QP); counted as delivered", l.name);
    } else {
        pp.assert_ok();
        assert!(parse_pingpong(&pp.client.output).is_some(), "no pingpong summary: {}", pp.client.describe());
    }
    assert!(!pp.client.output.contains("mismatch") && !pp.server.output.contains("mismatch"), "{}", pp.client.describe());

    let wp = (l.port + 1).to_string();
    run_pair(
        &svc,
        &["ib_write_bw", "-d", "pmrxe0", "-F", "-n", "500", "-p", &wp],
        &["ib_write_bw", "-d", "pmrxe1", "-F", "-n", "500", "-p", &wp, "127.0.0.1"],
        l.port + 1,
        limit,
    )
    .assert_ok();
    let rp = (l.port + 2).to_string();
    run_pair(
        &svc,
        &["ib_read_bw", "-d", "pmrxe0", "-F", "-n", "200", "-p", &rp],
        &["ib_read_bw", "-d", "pmrxe1", "-F", "-n", "200", "-p", &rp, "127.0.0.1"],
        l.port + 2,
        limit,
    )
    .assert_ok();

    let retransmits = sampler.finish();
    // The programs have exited; their sessions end as the service reads the sockets' EOF.
    let mut st = serde_json::Value::Null;
    let gone = poll_until(Duration::from_secs(10), || {
        st = svc.stats_json();
        st["clients"].as_array().is_some_and(|c| c.is_empty())
    });
    assert!(gone, "clients left behind: {}", st["clients"]);
    let icrc = lcore_counter(&st, "rx_icrc_errors");
    let rx = lcore_counter(&st, "rx_packets");
    // One injector per port (one lcore, two devices).
    assert_eq!(st["faults"].as_array().map(Vec::len), Some(2), "fault injectors in stats: {}", st["faults"]);
    let (seen, dropped, dup, reord, corr) = (
        injected(&st, "seen"),
        injected(&st, "dropped"),
        injected(&st, "duplicated"),
        injected(&st, "reordered"),
        injected(&st, "corrupted"),
    );
    // The Prometheus endpoint exports the same injector counters, per device and lcore:
    // between what `pmrxe stats --json` said before the scrape and after it (they only grow).
    let metrics = scrape(l.port + 3);
    let st2 = svc.stats_json();
    for (f, f2) in st["faults"].as_array().unwrap().iter().zip(st2["faults"].as_array().unwrap()) {
        let labels = format!("{{device=\"{}\",lcore=\"{}\"}}", f["device"].as_str().unwrap(), f["lcore"]);
        for k in ["seen", "dropped", "duplicated", "reordered", "corrupted"] {
            let name = format!("pmrxe_faults_{k}_total{labels}");
            let m = value(&metrics, &name).unwrap_or_else(|| panic!("{name} missing from /metrics:\n{metrics}")) as u64;
            let (lo, hi) = (f[k].as_u64().unwrap(), f2[k].as_u64().unwrap());
            assert!(lo <= m && m <= hi, "{name} = {m}, pmrxe stats --json said {lo} then {hi}");
        }
    }
    svc.stop();
    eprintln!(
        "faults {}: {:.1} s; frames seen {seen}, dropped {dropped}, duplicated {dup}, reordered {reord}, corrupted {corr}; \
         service rx {rx}, ICRC errors {icrc}, retransmits {retransmits}",
        l.name,
        t0.elapsed().as_secs_f64()
    );
    // The lcore receives only what the injectors deliver (seen - dropped + duplicated; a frame
    // held back for reordering comes later). The stats read the lcore counters before the
    // injectors' and both only grow, so this holds even if a frame arrives in between.
    assert!(seen > 0, "no frame went through the fault injectors: {}", st["faults"]);
    assert!(rx <= seen - dropped + dup, "the lcore received {rx} frames, the injectors delivered at most {}", seen - dropped + dup);
    if l.loss >= 0.01 {
        assert!(dropped > 0, "{seen} frames at {} loss but none dropped", l.loss);
    }
    assert!(icrc <= corr, "more ICRC errors ({icrc}) than corrupted frames ({corr})");
    if l.corrupt > 0.0 && corr >= 20 {
        assert!(icrc > 0, "{corr} frames corrupted but no ICRC error counted");
    }
    if l.loss >= 0.01 {
        assert!(retransmits > 0, "{dropped} frames dropped but no retransmit counted");
    }
}

#[test]
fn faults_0_1_percent() {
    run_level(&Level { name: "0.1%", loss: 0.001, reorder: 0.001, duplicate: 0.001, corrupt: 0.001, port: 19410 });
}

#[test]
fn faults_1_percent() {
    run_level(&Level { name: "1%", loss: 0.01, reorder: 0.01, duplicate: 0.005, corrupt: 0.005, port: 19420 });
}

#[test]
fn faults_5_percent() {
    run_level(&Level { name: "5%", loss: 0.05, reorder: 0.03, duplicate: 0.01, corrupt: 0.01, port: 19430 });
}
