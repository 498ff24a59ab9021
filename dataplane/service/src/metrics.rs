//! Prometheus endpoint: `GET /metrics` on `service.metrics` (or `pmrxe serve --metrics`).
//!
//! A deliberately tiny HTTP/1.1 server on its own thread (`pmrxe-metrics`): each scrape on a
//! short-lived thread (at most 8 at once; more get 503), `Connection: close`, 2 s for the
//! whole exchange, so a slow or stalled scraper delays nobody else. It is never on the fast
//! path: a scrape renders the same snapshot as `pmrxe stats --json` ([`StatsSource::render`])
//! — relaxed loads of the lcore counters plus one `QpStats` command per lcore — and turns it
//! into the Prometheus text exposition format (version 0.0.4). Every numeric counter that
//! `pmrxe stats` shows is exported, so the two can never disagree:
//!
//! | family | labels | source |
//! |---|---|---|
//! | `pmrxe_up`, `pmrxe_uptime_seconds`, `pmrxe_clients`, `pmrxe_devices` | | service |
//! | `pmrxe_lcore_<counter>_total` | `lcore` | `LcoreStats` (busy/idle iterations, rx/tx packets/bytes, ICRC errors, cq events, ...) |
//! | `pmrxe_lcore_load_ratio` | `lcore` | busy / (busy + idle) iterations |
//! | `pmrxe_lcore_drops_total` | `lcore`, `reason` | parser drops by `pmrxe_wire::Error` kind |
//! | `pmrxe_qp_<counter>_total` | `lcore`, `qpn` | `QpStats` (retransmits, NAKs, duplicates, rkey violations, ...) |
//! | `pmrxe_qp_completions_total` | `lcore`, `qpn`, `status` | completions by `ibv_wc_status` |
//! | `pmrxe_capture_*` | | live capture |
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::stats::StatsSource;

/// Lcore counters that are levels (exported as gauges without `_total`).
const LCORE_GAUGES: &[&str] = &["address_handles"];

/// The content type of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Bind `addr` and serve `/metrics` from `stats` on a new thread. Binding happens before this
/// returns, so a port in use is reported to the caller (and `pmrxe serve` fails fast).
pub fn spawn(addr: SocketAddr, stats: Arc<dyn StatsSource>) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    let h = std::thread::Builder::new().name("pmrxe-metrics".into()).spawn(move || {
        let busy = Arc::new(AtomicUsize::new(0));
        let mut backoff = Duration::from_millis(1);
        for conn in listener.incoming() {
            match conn {
                Ok(s) => {
                    backoff = Duration::from_millis(1);
                    // Each scrape on its own thread, at most MAX_CONNS at once, each bounded by
                    // DEADLINE overall: a client that sends its request a byte at a time (or
                    // never reads the answer) delays nobody else.
                    if busy.load(Ordering::Relaxed) >= MAX_CONNS {
                        let mut s = s;
                        let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
                        let _ = respond(&mut s, "503 Service Unavailable", "text/plain", b"too many scrapes at once\n", false);
                        continue;
                    }
                    busy.fetch_add(1, Ordering::Relaxed);
                    let (busy2, stats2) = (busy.clone(), stats.clone());
                    let spawned = std::thread::Builder::new().name("pmrxe-scrape".into()).spawn(move || {
                        if let Err(e) = handle(s, &*stats2) {
                            tracing::debug!("metrics client: {e}");
                        }
                        busy2.fetch_sub(1, Ordering::Relaxed);
                    });
                    if spawned.is_err() {
                        busy.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    // EMFILE and the like: back off (never spin), say it at debug level only.
                    tracing::debug!("metrics accept: {e}");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
            }
        }
    })?;
    tracing::info!(addr = %local, "metrics endpoint: http://{local}/metrics");
    Ok((local, h))
}

/// Scrapes served at once.
const MAX_CONNS: usize = 8;
/// The whole exchange with one scraper (request head in, answer out).
const DEADLINE: Duration = Duration::from_secs(2);

fn handle(mut s: TcpStream, stats: &dyn StatsSource) -> std::io::Result<()> {
    let t0 = Instant::now();
    let left = || DEADLINE.checked_sub(t0.elapsed()).filter(|d| !d.is_zero()).ok_or_else(|| std::io::Error::new(std::io::ErrorKind::TimedOut, "scrape deadline"));
    s.set_write_timeout(Some(DEADLINE))?;
    // Read the request head (up to the blank line, at most 8 KiB); bodies are ignored.
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        s.set_read_timeout(Some(left()?))?;
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > 8192 {
            return respond(&mut s, "431 Request Header Fields Too Large", "text/plain", b"request head too large\n", false);
        }
    }
    s.set_write_timeout(Some(left()?))?;
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let head_only = method == "HEAD";
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = render(stats);
            respond(&mut s, "200 OK", CONTENT_TYPE, body.as_bytes(), head_only)
        }
        ("GET" | "HEAD", "/") => respond(
            &mut s,
            "200 OK",
            "text/html; charset=utf-8",
            b"<html><body><h1>pmrxe</h1><p><a href=\"/metrics\">/metrics</a></p></body></html>\n",
            head_only,
        ),
        ("GET" | "HEAD", _) => respond(&mut s, "404 Not Found", "text/plain", b"not found: try /metrics\n", head_only),
        _ => respond(&mut s, "405 Method Not Allowed", "text/plain", b"only GET and HEAD\n", false),
    }
}

fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &[u8], head_only: bool) -> std::io::Result<()> {
    let hdr = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n",
        body.len(),
        if status.starts_with("405") { "Allow: GET, HEAD\r\n" } else { "" }
    );
    s.write_all(hdr.as_bytes())?;
    if !head_only {
        s.write_all(body)?;
    }
    s.flush()
}

/// Render the service's counters in the Prometheus text format.
pub fn render(stats: &dyn StatsSource) -> String {
    let v: Value = serde_json::from_str(&stats.render(true, crate::access::Viewer::Admin)).unwrap_or(Value::Null);
    from_stats_json(&v)
}

/// Families in first-seen order; all samples of a family are written together, as the text
/// format requires.
#[derive(Default)]
struct Families {
    order: Vec<String>,
    fams: std::collections::HashMap<String, (&'static str, String, Vec<String>)>,
}

impl Families {
    fn sample(&mut self, name: &str, kind: &'static str, help: &str, labels: &[(&str, &str)], value: f64) {
        let e = self.fams.entry(name.to_string()).or_insert_with(|| {
            self.order.push(name.to_string());
            (kind, help.to_string(), Vec::new())
        });
        let mut line = String::from(name);
        if !labels.is_empty() {
            line.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    line.push(',');
                }
                let _ = write!(line, "{k}=\"{}\"", escape_label(v));
            }
            line.push('}');
        }
        let _ = write!(line, " {}", fmt_value(value));
        e.2.push(line);
    }

    fn finish(self) -> String {
        let mut out = String::new();
        for n in &self.order {
            let (kind, help, lines) = &self.fams[n];
            let _ = writeln!(out, "# HELP {n} {}", help.replace('\\', "\\\\").replace('\n', "\\n"));
            let _ = writeln!(out, "# TYPE {n} {kind}");
            for l in lines {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Metric-name-safe version of a JSON key.
fn sanitize(k: &str) -> String {
    k.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c.to_ascii_lowercase() } else { '_' }).collect()
}

/// `ibv_wc_status` names (rdma-core `ibv_wc_status_str`, snake case).
pub fn wc_status_name(code: u64) -> &'static str {
    const NAMES: [&str; 24] = [
        "success", "loc_len_err", "loc_qp_op_err", "loc_eec_op_err", "loc_prot_err", "wr_flush_err", "mw_bind_err",
        "bad_resp_err", "loc_access_err", "rem_inv_req_err", "rem_access_err", "rem_op_err", "retry_exc_err",
        "rnr_retry_exc_err", "loc_rdd_viol_err", "rem_inv_rd_req_err", "rem_abort_err", "inv_eecn_err",
        "inv_eec_state_err", "fatal_err", "resp_timeout_err", "general_err", "tm_err", "tm_rndv_incomplete",
    ];
    NAMES.get(code as usize).copied().unwrap_or("unknown")
}

fn lcore_help(k: &str) -> &'static str {
    match k {
        "busy_iterations" => "Poll loop iterations that found work.",
        "idle_iterations" => "Poll loop iterations that found no work.",
        "busy_ns" => "Nanoseconds spent in poll loop iterations that found work.",
        "idle_sleeps" => "Idle sleeps taken (backoff idle mode).",
        "rx_packets" => "Frames received.",
        "rx_bytes" => "Bytes received.",
        "rx_loopback" => "Frames a device sent to its own address, looped back inside the device.",
        "address_handles" => "Address handles the lcore holds for its clients.",
        "rx_predicted" => "RoCE frames parsed by header prediction (MIDDLE packets like their QP's last one).",
        "tx_packets" => "Frames transmitted.",
        "tx_bytes" => "Bytes transmitted.",
        "rx_icrc_errors" => "RoCE frames dropped for a bad ICRC.",
        "rx_malformed" => "Frames dropped by the parser for any other reason.",
        "rx_not_for_us" => "Frames not for this host (other IP, not RoCE, not ARP/ND).",
        "rx_unknown_qp" => "RoCE frames for an unknown QPN (dropped).",
        "rx_ecn_ce" => "RoCE frames for our QPs marked ECN Congestion Experienced.",
        "rx_cnp" => "CNPs received and handed to their QP's DCQCN reaction point.",
        "tx_cnp" => "CNPs sent by the notification points of the lcore's QPs.",
        "arp_replies" => "ARP requests answered.",
        "tx_alloc_failures" => "Transmit buffer allocation failures.",
        "tx_no_neighbor" => "Frames not sent because no neighbour MAC is known.",
        "tx_neigh_hold" => "Transmit passes a QP was held (send state not advanced) while ARP/ND resolved its peer.",
        "tx_backpressure" => "Frames the port refused (retried next iteration).",
        "sq_wqes" => "Send WQEs taken from client rings.",
        "sq_inline_wqes" => "Send WQEs that carried their payload inline.",
        "rq_wqes" => "Receive WQEs taken from client rings.",
        "bad_wqes" => "Client WQEs rejected by validation.",
        "cqes" => "Completions written to client CQs.",
        "cq_full" => "Times a client CQ was full and a completion had to wait.",
        "cq_events" => "Completion events signalled (eventfd writes).",
        "ring_corrupt" => "Corrupt ring indices seen (client misbehaviour).",
        "commands" => "Control commands handled by the lcore.",
        "cm_rx" => "CM MADs received on QP1 and passed to the connection manager.",
        "cm_tx" => "CM MADs sent from QP1.",
        "cm_drops" => "QP1 frames dropped (CM queue full, oversize, no neighbour MAC, no buffer).",
        _ => "pmrxe lcore counter (see pmrxe stats).",
    }
}

fn qp_help(k: &str) -> &'static str {
    match k {
        "tx_packets" => "Request packets sent by the QP (first transmissions and retransmissions).",
        "tx_bytes" => "Payload bytes sent by the QP.",
        "rx_packets" => "Packets handled by the QP.",
        "tx_fast_path" => "MIDDLE packets the requester built in one step (fast path).",
        "rx_fast_path" => "WRITE MIDDLE packets the responder took in one step (fast path).",
        "retransmits" => "Packets retransmitted by go-back-N.",
        "retransmit_bytes" => "Payload bytes retransmitted by go-back-N.",
        "ecn_ce_received" => "ECN congestion-experienced (CE) packets received.",
        "cnp_sent" => "CNPs sent by the QP's notification point (at most one per CNP interval).",
        "cnp_received" => "CNPs received for the QP (reaction point).",
        "cc_rate_decreases" => "DCQCN rate decreases applied.",
        "cc_rate_mbps" => "Current DCQCN rate of the QP in Mb/s (line rate when not limited; 0 with DCQCN off).",
        "retries" => "Go-back-N retries started (timeout, sequence NAK, implicit NAK, RNR).",
        "timeouts" => "Local ACK timer expirations (each retries, or fails the QP once the retry count is spent).",
        "backoff_ns" => "Nanoseconds in retransmission back-off: from a local ACK timeout to the next forward progress.",
        "seq_naks_sent" => "PSN sequence NAKs sent by the responder.",
        "seq_naks_received" => "PSN sequence NAKs received by the requester.",
        "rnr_naks_sent" => "RNR NAKs sent.",
        "rnr_naks_received" => "RNR NAKs received.",
        "err_naks_sent" => "Error NAKs sent (invalid request, remote access, remote operation).",
        "err_naks_received" => "Error NAKs received.",
        "acks_sent" => "ACK packets sent.",
        "acks_received" => "ACK packets received.",
        "duplicates" => "Duplicate requests seen by the responder.",
        "read_replays" => "Duplicate READ requests replayed.",
        "atomic_replays" => "Duplicate atomics answered from the saved result.",
        "rkey_violations" => "rkey/range/access violations at the responder.",
        "local_op_executions" => "Local operations executed (REG_MR, LOCAL_INV, BIND_MW).",
        "local_op_reexecutions" => "Local operations executed a second time (invariant: always 0).",
        "dropped" => "Packets dropped by the QP (bad state, bad header, unexpected response).",
        _ => "pmrxe QP counter (see pmrxe stats).",
    }
}

/// The counters of a `[faults]` injector in `pmrxe stats --json` (`faults[]`), with their help.
const FAULT_COUNTERS: [(&str, &str); 5] = [
    ("seen", "Received frames that went through the [faults] injector."),
    ("dropped", "Received frames the [faults] injector dropped (loss)."),
    ("duplicated", "Received frames the [faults] injector delivered twice."),
    ("reordered", "Received frames the [faults] injector held back and delivered later."),
    ("corrupted", "Received frames the [faults] injector delivered with a flipped bit."),
];

/// Convert the JSON of `pmrxe stats --json` into the Prometheus text format.
pub fn from_stats_json(v: &Value) -> String {
    let mut f = Families::default();
    f.sample("pmrxe_up", "gauge", "1 while the pmrxe service answers.", &[], 1.0);
    f.sample(
        "pmrxe_build_info",
        "gauge",
        "pmrxe version (value is always 1).",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    f.sample("pmrxe_uptime_seconds", "gauge", "Seconds since the service started.", &[], v["uptime_s"].as_f64().unwrap_or(0.0));
    let ndev = v["devices"].as_array().map_or(0, Vec::len);
    f.sample("pmrxe_devices", "gauge", "Verbs devices served.", &[], ndev as f64);
    for d in v["devices"].as_array().into_iter().flatten() {
        if let Some(name) = d.as_str() {
            f.sample("pmrxe_device_info", "gauge", "A verbs device served (value is always 1).", &[("device", name)], 1.0);
        }
    }
    f.sample("pmrxe_clients", "gauge", "Connected clients (verbs processes, pmrxe tools).", &[], v["clients"].as_array().map_or(0, Vec::len) as f64);
    for l in v["lcores"].as_array().into_iter().flatten() {
        let lc = l["index"].as_u64().unwrap_or(0).to_string();
        f.sample("pmrxe_lcore_load_ratio", "gauge", "Time spent in iterations that found work / time since the service started.", &[("lcore", &lc)], l["load"].as_f64().unwrap_or(0.0));
        for (k, val) in l["counters"].as_object().into_iter().flatten() {
            if let Some(n) = val.as_u64() {
                if LCORE_GAUGES.contains(&k.as_str()) {
                    // A level, not a count of events.
                    f.sample(&format!("pmrxe_lcore_{}", sanitize(k)), "gauge", lcore_help(k), &[("lcore", &lc)], n as f64);
                } else {
                    f.sample(&format!("pmrxe_lcore_{}_total", sanitize(k)), "counter", lcore_help(k), &[("lcore", &lc)], n as f64);
                }
            }
        }
        for (reason, val) in l["drops_by_reason"].as_object().into_iter().flatten() {
            f.sample(
                "pmrxe_lcore_drops_total",
                "counter",
                "Received frames dropped by the parser, by reason.",
                &[("lcore", &lc), ("reason", reason)],
                val.as_u64().unwrap_or(0) as f64,
            );
        }
        f.sample("pmrxe_lcore_qps", "gauge", "QPs owned by the lcore.", &[("lcore", &lc)], l["qps"].as_array().map_or(0, Vec::len) as f64);
        for q in l["qps"].as_array().into_iter().flatten() {
            let qpn = format!("{:#08x}", q["qpn"].as_u64().unwrap_or(0));
            for (k, val) in q.as_object().into_iter().flatten() {
                if k == "qpn" {
                    continue;
                }
                if k == "completions_by_status" {
                    for (code, n) in val.as_object().into_iter().flatten() {
                        let c: u64 = code.parse().unwrap_or(u64::MAX);
                        f.sample(
                            "pmrxe_qp_completions_total",
                            "counter",
                            "Work completions by ibv_wc_status.",
                            &[("lcore", &lc), ("qpn", &qpn), ("status", wc_status_name(c))],
                            n.as_u64().unwrap_or(0) as f64,
                        );
                    }
                } else if k == "cc_rate_mbps" {
                    // A gauge, not a counter: the QP's current DCQCN rate.
                    let n = val.as_u64().unwrap_or(0) as f64;
                    f.sample("pmrxe_qp_cc_rate_mbps", "gauge", qp_help(k), &[("lcore", &lc), ("qpn", &qpn)], n);
                } else if let Some(n) = val.as_u64() {
                    f.sample(&format!("pmrxe_qp_{}_total", sanitize(k)), "counter", qp_help(k), &[("lcore", &lc), ("qpn", &qpn)], n as f64);
                }
            }
        }
    }
    let cap = &v["capture"];
    f.sample("pmrxe_capture_active", "gauge", "1 while a live capture runs.", &[], if cap["active"].as_bool().unwrap_or(false) { 1.0 } else { 0.0 });
    f.sample("pmrxe_capture_frames_total", "counter", "Frames written by live captures.", &[], cap["frames"].as_u64().unwrap_or(0) as f64);
    f.sample("pmrxe_capture_dropped_total", "counter", "Frames a live capture dropped because its writer fell behind.", &[], cap["dropped"].as_u64().unwrap_or(0) as f64);
    // The `[faults]` injectors (one per port and lcore; none without the table).
    for fi in v["faults"].as_array().into_iter().flatten() {
        let device = fi["device"].as_str().unwrap_or("");
        let lc = fi["lcore"].as_u64().unwrap_or(0).to_string();
        for (k, help) in FAULT_COUNTERS {
            f.sample(&format!("pmrxe_faults_{k}_total"), "counter", help, &[("device", device), ("lcore", &lc)], fi[k].as_u64().unwrap_or(0) as f64);
        }
    }
    f.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Fake;
    impl StatsSource for Fake {
        fn render(&self, _json: bool, _viewer: crate::access::Viewer) -> String {
            json!({
                "uptime_s": 1.5, "devices": ["pmrxe0", "pmrxe1"], "clients": [{"id": 1, "pid": 2, "program": "x"}],
                "lcores": [{"index": 0, "load": 0.25,
                    "counters": {"busy_iterations": 10, "idle_iterations": 30, "rx_icrc_errors": 0},
                    "drops_by_reason": {"BadIcrc": 3},
                    "qps": [{"qpn": 17, "retransmits": 2, "completions_by_status": {"0": 5, "5": 1}},
                            {"qpn": 18, "retransmits": 0, "completions_by_status": {}}]}],
                "capture": {"active": false, "frames": 0, "dropped": 0},
                "faults": [{"device": "pmrxe0", "lcore": 0, "seen": 100, "dropped": 4, "duplicated": 2, "reordered": 3, "corrupted": 1},
                           {"device": "pmrxe1", "lcore": 0, "seen": 90, "dropped": 5, "duplicated": 0, "reordered": 1, "corrupted": 0}],
            })
            .to_string()
        }
    }

    #[test]
    fn text_format() {
        let t = render(&Fake);
        assert!(t.contains("# TYPE pmrxe_lcore_busy_iterations_total counter\npmrxe_lcore_busy_iterations_total{lcore=\"0\"} 10\n"), "{t}");
        assert!(t.contains("pmrxe_lcore_rx_icrc_errors_total{lcore=\"0\"} 0\n"));
        assert!(t.contains("pmrxe_lcore_drops_total{lcore=\"0\",reason=\"BadIcrc\"} 3\n"));
        assert!(t.contains("pmrxe_qp_retransmits_total{lcore=\"0\",qpn=\"0x000011\"} 2\npmrxe_qp_retransmits_total{lcore=\"0\",qpn=\"0x000012\"} 0\n"), "{t}");
        assert!(t.contains("pmrxe_qp_completions_total{lcore=\"0\",qpn=\"0x000011\",status=\"wr_flush_err\"} 1\n"));
        assert!(t.contains("pmrxe_lcore_load_ratio{lcore=\"0\"} 0.25\n"));
        assert!(t.contains("pmrxe_clients 1\n"));
        assert!(
            t.contains("# TYPE pmrxe_faults_dropped_total counter\npmrxe_faults_dropped_total{device=\"pmrxe0\",lcore=\"0\"} 4\npmrxe_faults_dropped_total{device=\"pmrxe1\",lcore=\"0\"} 5\n"),
            "{t}"
        );
        for (k, v) in [("seen", 100), ("duplicated", 2), ("reordered", 3), ("corrupted", 1)] {
            assert!(t.contains(&format!("pmrxe_faults_{k}_total{{device=\"pmrxe0\",lcore=\"0\"}} {v}\n")), "{k}: {t}");
        }
        // Every family has exactly one HELP and one TYPE line, and its samples follow them.
        let mut seen = std::collections::HashSet::new();
        let mut cur = String::new();
        for line in t.lines() {
            if let Some(r) = line.strip_prefix("# TYPE ") {
                cur = r.split(' ').next().unwrap().to_string();
                assert!(seen.insert(cur.clone()), "family {cur} split");
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert_eq!(name, cur, "{line}");
            }
        }
    }

    #[test]
    fn http() {
        let (addr, _h) = spawn("127.0.0.1:0".parse().unwrap(), Arc::new(Fake)).unwrap();
        let get = |req: &str| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(req.as_bytes()).unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        let r = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains(CONTENT_TYPE));
        assert!(r.contains("pmrxe_up 1\n"));
        assert!(get("GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let h = get("HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(h.starts_with("HTTP/1.1 200") && h.ends_with("\r\n\r\n"), "{h}");
    }
}
