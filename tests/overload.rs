//! Issue 17 (first part): overload on one machine must not end connections.
//!
//! History: 16 QPs x 128 outstanding 64 KiB WRITEs on the loopback config ended in
//! RETRY_EXC_ERR (status 12) because the lcore's transmit pass always started at QP slot 0: on
//! a congested port the first QPs filled the burst every iteration and the last ones sent
//! nothing for longer than their retransmission timeout. The pass now starts where the previous
//! one was cut off, and the retransmission timer backs off (doubles per consecutive timeout).
//!
//! Acceptance (loopback, one lcore): `ib_write_bw -q 16` and `-q 64` at 64 KiB, tx depth 128,
//! complete 5 runs out of 5 (asserted) with data intact (perftest does not check data:
//! `tests/many_qp_write.c` writes 16 and 64 QPs x 128 outstanding 64 KiB WRITEs and compares
//! every byte, asserted); aggregate bandwidth within 10 % of the 1-QP figure (measured in the
//! same service and printed, not asserted: on the shared 2-core machine the figures move with
//! the other load by more than 10 %).
mod common;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;

/// Per-QP retransmission counters seen while the QPs existed: max per QPN over the samples.
type QpCounters = BTreeMap<u64, BTreeMap<&'static str, u64>>;

const QP_KEYS: [&str; 6] = ["retransmits", "retries", "timeouts", "backoff_ns", "seq_naks_received", "rnr_naks_received"];

fn sample_qps(svc: &Service, into: &Mutex<QpCounters>) {
    let Ok(o) = svc.pmrxe().args(["stats", "--json"]).output() else { return };
    let Ok(j) = serde_json::from_slice::<serde_json::Value>(&o.stdout) else { return };
    let mut m = into.lock().unwrap();
    for l in j["lcores"].as_array().into_iter().flatten() {
        for q in l["qps"].as_array().into_iter().flatten() {
            let e = m.entry(q["qpn"].as_u64().unwrap_or(0)).or_default();
            for k in QP_KEYS {
                let v = e.entry(k).or_default();
                *v = (*v).max(q[k].as_u64().unwrap_or(0));
            }
        }
    }
}

/// Lcore counters of interest, summed over lcores.
fn lcore_counters(svc: &Service) -> [u64; 3] {
    let j = svc.stats_json();
    ["tx_packets", "tx_backpressure", "tx_alloc_failures"].map(|k| sum_counter(&j, k))
}

/// `ib_write_bw -q QPS -t 128 -s 65536 -n ITERS` between pmrxe0 (client) and pmrxe1; asserts
/// that both sides succeed and returns the BW average (MB/s).
fn write_bw(svc: &Service, qps: u32, iters: u32, port_index: u16, what: &str) -> f64 {
    let port = port_for(port_index);
    let p = port.to_string();
    let (q, n) = (qps.to_string(), iters.to_string());
    let args = ["ib_write_bw", "-d", "pmrxe0", "-F", "-q", &q, "-t", "128", "-s", "65536", "-n", &n, "-p", &p];
    let mut client = args.to_vec();
    client.push("127.0.0.1");
    let mut server = args.to_vec();
    server[2] = "pmrxe1";
    let before = lcore_counters(svc);
    let counters = Mutex::new(QpCounters::new());
    let t0 = Instant::now();
    let r = sample_during(Duration::from_millis(100), || sample_qps(svc, &counters), || run_pair(svc, &server, &client, port, Duration::from_secs(60)));
    let wall = t0.elapsed().as_secs_f64();
    r.assert_ok();
    let rows = perftest_rows(&r.client.output);
    assert!(!rows.is_empty() && rows[0].len() >= 4, "{what}: no bandwidth row\n{}", r.client.describe());
    let bw = rows[0][3];
    let after = lcore_counters(svc);
    let m = counters.lock().unwrap();
    let sum = |k: &str| m.values().map(|c| c.get(k).copied().unwrap_or(0)).sum::<u64>();
    eprintln!(
        "{what}: {bw:.0} MB/s ({wall:.1} s wall) tx_packets {} tx_backpressure {} tx_alloc_failures {}; QPs seen {}: retransmits {} retries {} timeouts {} backoff {:.1} ms seq_naks_received {} rnr_naks_received {}",
        after[0] - before[0],
        after[1] - before[1],
        after[2] - before[2],
        m.len(),
        sum("retransmits"),
        sum("retries"),
        sum("timeouts"),
        sum("backoff_ns") as f64 / 1e6,
        sum("seq_naks_received"),
        sum("rnr_naks_received"),
    );
    // The lcore receives as many frames per pass as it can queue for transmit, so the loopback
    // ring never runs full. It used to, at 16 QPs and more: one receive burst per pass against
    // up to four bursts queued, about one refused frame in 33 (`tx_backpressure`) and every
    // frame read cache-cold. A structural bound, not a timing: it holds on a loaded machine.
    let (sent, refused) = (after[0] - before[0], after[1] - before[1]);
    assert!(refused * 1000 <= sent, "{what}: {refused} of {sent} frames refused by a full port ring (tx_backpressure)");
    bw
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[s.len() / 2]
}

/// Every configuration moves the same 512 MiB per run (tx depth 128 needs >= 128 iterations
/// per QP, so -q 64 sets the volume).
#[test]
fn ib_write_bw_16_and_64_qps_deep_queues_complete_five_of_five() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let t0 = Instant::now();
    // Interleaved rounds, so that the three figures see the same machine.
    let (mut one, mut q16, mut q64) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..5u16 {
        one.push(write_bw(&svc, 1, 8192, 210 + run, &format!("q1 run {}", run + 1)));
        q16.push(write_bw(&svc, 16, 512, 215 + run, &format!("q16 run {}", run + 1)));
        q64.push(write_bw(&svc, 64, 128, 220 + run, &format!("q64 run {}", run + 1)));
    }
    let base = median(&one);
    eprintln!(
        "ib_write_bw 64 KiB -t 128 (MB/s): q1 {one:.0?}; q16 {q16:.0?} (median {:.0}, {:.2} of q1); q64 {q64:.0?} (median {:.0}, {:.2} of q1); acceptance: within 10 % of q1 (medians of interleaved runs, printed, not asserted: single runs vary by +-40 % here); {:.0} s",
        median(&q16),
        median(&q16) / base,
        median(&q64),
        median(&q64) / base,
        t0.elapsed().as_secs_f64()
    );
}

/// 16 and 64 QPs x 128 outstanding 64 KiB WRITEs (128 and 512 MiB in flight), two rounds each,
/// every destination byte compared with what was written; plus 1 QP as the reference rate.
#[test]
fn many_qps_deep_write_queues_deliver_every_byte() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let prog = svc.dir.join("many_qp_write");
    compile_c("tests/many_qp_write.c", &prog, &require_tool("cc"), &["-libverbs"]);
    let mut rates = Vec::new();
    for (qps, rounds) in [(1, 8), (16, 2), (64, 2)] {
        let before = lcore_counters(&svc);
        let args = [prog.to_str().unwrap(), &qps.to_string(), "128", &rounds.to_string(), "65536"].map(str::to_string);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = run_verbs(&svc, &args, Duration::from_secs(60));
        let line = r.output.lines().find(|l| l.starts_with("OK "));
        assert!(r.ok() && line.is_some(), "{qps} QPs x 128 x 64 KiB: {}", r.describe());
        let after = lcore_counters(&svc);
        let mbs: f64 = line.unwrap().split_whitespace().last().unwrap().parse().unwrap();
        eprintln!(
            "many_qp_write {qps} QPs x 128 x 64 KiB x {rounds} rounds: every byte checked, {mbs:.0} MB/s; tx_packets {} tx_backpressure {}",
            after[0] - before[0],
            after[1] - before[1]
        );
        rates.push(mbs);
    }
    eprintln!("many_qp_write MB/s q1/q16/q64: {rates:.0?} (ratios {:.2} / {:.2}, printed, not asserted)", rates[1] / rates[0], rates[2] / rates[0]);
    let j = svc.stats_json();
    assert_eq!(sum_counter(&j, "tx_alloc_failures"), 0, "no transmit buffer ran out");
}
