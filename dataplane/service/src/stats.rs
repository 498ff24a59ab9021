//! `pmrxe stats` and `pmrxe capture`, service side.
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam::channel::{bounded, Receiver, Sender};
use pmrxe_port::FaultCounters;
use pmrxe_runtime::lcore::{Cmd, LcoreHandle, Tap};
use serde_json::json;

use crate::access::Viewer;

/// Something that can render the service's counters.
pub trait StatsSource: Send + Sync {
    /// Text table or JSON, as `viewer` may see it (an administrator sees every client; any
    /// other user only the clients and QPs of their own uid, plus service-wide totals).
    fn render(&self, json: bool, viewer: Viewer) -> String;
}

/// One connected client as `pmrxe stats` lists it.
#[derive(Clone, Debug)]
pub struct ClientInfo {
    /// Client id (the session's handle).
    pub id: u32,
    /// Process id (0: in a pid namespace the service cannot see).
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// argv[0] as the client reported it.
    pub program: String,
}

/// Counters from the lcores, their ports and QPs.
pub struct ServiceStats {
    /// Lcores.
    pub lcores: Vec<LcoreHandle>,
    /// Device names by index.
    pub devices: Vec<String>,
    /// Start time.
    pub started: Instant,
    /// Capture counters.
    pub capture: Arc<Capture>,
    /// Fault injectors (config `[faults]`; empty without): one per port and lcore.
    pub faults: Vec<FaultSource>,
    /// Connected clients.
    pub clients: Arc<dyn Fn() -> Vec<ClientInfo> + Send + Sync>,
    /// The connection manager thread (rdma_cm ids, channels, connections per port).
    pub cm: Option<crate::cm::CmHandle>,
    /// Limits in use and refusals ([`crate::limits`]).
    pub limits: Option<Arc<crate::limits::Budget>>,
    /// The ICRC kernel measurement made at start (the chosen kernel and every kernel's figure).
    pub crc: Option<pmrxe_crc::Calibration>,
}

fn cm_json(s: &crate::cm::CmSnapshot) -> serde_json::Value {
    json!({
        "ids": s.ids, "channels": s.channels, "listeners": s.listeners, "conns": s.conns, "backlog": s.backlog,
        "events": s.service.events, "events_dropped": s.service.events_dropped,
        "rx_bad": s.service.rx_bad, "tx_dropped": s.service.tx_dropped, "rej_backlog": s.service.rej_backlog,
        "rej_resources": s.service.rej_resources,
        "ports": s.ports.iter().map(|(dev, conns, c)| json!({
            "device": dev, "conns": conns,
            "rx_mads": c.rx_mads, "rx_malformed": c.rx_malformed, "rx_not_cm": c.rx_not_cm,
            "rx_unsupported": c.rx_unsupported, "rx_duplicates": c.rx_duplicates, "rx_stray": c.rx_stray,
            "rej_no_listener": c.rej_no_listener, "rej_no_resources": c.rej_no_resources, "rej_stale": c.rej_stale,
            "tx_mads": c.tx_mads, "retransmits": c.retransmits, "timeouts": c.timeouts, "tx_dropped": c.tx_dropped,
        })).collect::<Vec<_>>(),
    })
}

/// The injected-fault counters of one port's receive queue on one lcore.
pub struct FaultSource {
    /// Device name of the port.
    pub device: String,
    /// Lcore index.
    pub lcore: usize,
    /// Live counters.
    pub counters: Arc<FaultCounters>,
}

fn qp_json(qpn: u32, s: &pmrxe_transport::QpStats) -> serde_json::Value {
    json!({
        "qpn": qpn,
        "tx_packets": s.tx_packets, "tx_bytes": s.tx_bytes, "rx_packets": s.rx_packets,
        "tx_fast_path": s.tx_fast_path, "rx_fast_path": s.rx_fast_path,
        "retransmits": s.retransmits, "retries": s.retries, "timeouts": s.timeouts, "backoff_ns": s.backoff_ns,
        "seq_naks_sent": s.seq_naks_sent, "seq_naks_received": s.seq_naks_received,
        "rnr_naks_sent": s.rnr_naks_sent, "rnr_naks_received": s.rnr_naks_received,
        "err_naks_sent": s.err_naks_sent, "err_naks_received": s.err_naks_received,
        "acks_sent": s.acks_sent, "acks_received": s.acks_received,
        "duplicates": s.duplicates, "read_replays": s.read_replays, "atomic_replays": s.atomic_replays,
        "rkey_violations": s.rkey_violations, "local_op_executions": s.local_op_executions,
        "local_op_reexecutions": s.local_op_reexecutions, "dropped": s.dropped,
        "retransmit_bytes": s.retransmit_bytes, "ecn_ce_received": s.ecn_ce_received,
        "cnp_sent": s.cnp_sent, "cnp_received": s.cnp_received, "cc_rate_decreases": s.cc_rate_decreases,
        "cc_rate_mbps": s.cc_rate_mbps,
        "completions_by_status": s.completions.iter().enumerate().filter(|(_, &v)| v > 0)
            .map(|(i, v)| (i.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
    })
}

impl StatsSource for ServiceStats {
    fn render(&self, as_json: bool, viewer: Viewer) -> String {
        let clients: Vec<ClientInfo> = (self.clients)().into_iter().filter(|c| viewer.sees(c.uid)).collect();
        let mut lcores = Vec::new();
        for lc in &self.lcores {
            let mut qps = lc.call(|tx| Cmd::QpStats { done: tx }).unwrap_or_default();
            if viewer != Viewer::Admin {
                qps.retain(|(_, client, _)| clients.iter().any(|c| c.id == *client));
            }
            let snap = lc.stats.snapshot();
            // Busy time over the service's uptime: an idle iteration is far shorter than a busy
            // one, so the share of busy iterations understated a saturated lcore (67 %).
            let up_ns = (self.started.elapsed().as_nanos() as f64).max(1.0);
            let load = (snap.busy_ns as f64 / up_ns).min(1.0);
            lcores.push(json!({
                "index": lc.index,
                "load": load,
                "counters": serde_json::to_value(&snap).unwrap_or_default(),
                "drops_by_reason": lc.drops.snapshot().into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                "qps": qps.iter().map(|(q, _, s)| qp_json(*q, s)).collect::<Vec<_>>(),
            }));
        }
        let faults = crate::session::fault::counters();
        let v = json!({
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "devices": self.devices,
            "clients": clients.iter().map(|c| json!({"id": c.id, "pid": c.pid, "uid": c.uid, "program": c.program, "memory_faults": crate::session::fault::client_faults(c.id)})).collect::<Vec<_>>(),
            "memory_faults": {"rescued": faults.rescued, "revoked_mrs": faults.revoked_mrs, "disconnected": faults.disconnected, "unattributed": faults.unattributed},
            "lcores": lcores,
            "capture": { "active": self.capture.active(), "frames": self.capture.frames.load(Ordering::Relaxed), "dropped": self.capture.dropped.load(Ordering::Relaxed) },
            "faults": self.faults.iter().map(|f| {
                let s = f.counters.snapshot();
                json!({"device": f.device, "lcore": f.lcore, "seen": s.seen, "dropped": s.dropped,
                    "duplicated": s.duplicated, "reordered": s.reordered, "corrupted": s.corrupted})
            }).collect::<Vec<_>>(),
            "cm": self.cm.as_ref().and_then(|h| h.snapshot(Duration::from_secs(2))).map(|s| cm_json(&s)),
            "crc": self.crc.as_ref().map(|c| json!({
                "kernel": c.chosen().name(),
                "forced": c.is_forced(),
                "frame": c.frame,
                "gb_per_s": c.gb_per_s.iter().map(|(k, g)| (k.name().to_string(), json!(g))).collect::<serde_json::Map<_, _>>(),
            })),
            "limits": self.limits.as_ref().map(|l| l.json(&|id| clients.iter().any(|c| c.id == id))),
        });
        if as_json {
            return serde_json::to_string_pretty(&v).unwrap_or_default();
        }
        let mut out = String::new();
        out.push_str(&format!("pmrxe: up {:.1} s, devices {}\n", v["uptime_s"].as_f64().unwrap_or(0.0), self.devices.join(", ")));
        let f = &v["memory_faults"];
        if f["rescued"].as_u64().unwrap_or(0) > 0 {
            out.push_str(&format!(
                "client memory faults: rescued {} (MRs revoked {}, clients disconnected {}, unattributed {})\n",
                f["rescued"], f["revoked_mrs"], f["disconnected"], f["unattributed"]
            ));
        }
        if let Some(c) = &self.crc {
            let figures: Vec<String> = c.gb_per_s.iter().map(|(k, g)| format!("{} {g:.1}", k.name())).collect();
            out.push_str(&format!(
                "icrc kernel {}{} (GB/s at {} B, measured at start: {})\n",
                c.chosen().name(),
                if c.is_forced() { ", forced by PMRXE_CRC_KERNEL" } else { "" },
                c.frame,
                figures.join(", ")
            ));
        }
        let c = &v["cm"];
        if c.is_object() {
            out.push_str(&format!(
                "cm: ids {} channels {} listeners {} conns {} events {} (dropped {})\n",
                c["ids"], c["channels"], c["listeners"], c["conns"], c["events"], c["events_dropped"]
            ));
            for p in c["ports"].as_array().into_iter().flatten() {
                out.push_str(&format!(
                    "  cm port {}: conns {} rx {} tx {} retransmits {} duplicates {} timeouts {} rej-no-listener {}\n",
                    p["device"], p["conns"], p["rx_mads"], p["tx_mads"], p["retransmits"], p["rx_duplicates"], p["timeouts"], p["rej_no_listener"]
                ));
            }
        }
        for l in v["lcores"].as_array().into_iter().flatten() {
            out.push_str(&format!("lcore {} load {:.1}%\n", l["index"], l["load"].as_f64().unwrap_or(0.0) * 100.0));
            if let Some(c) = l["counters"].as_object() {
                for (k, val) in c {
                    if val.as_u64().unwrap_or(0) > 0 {
                        out.push_str(&format!("  {k:<20} {val}\n"));
                    }
                }
            }
            for (k, val) in l["drops_by_reason"].as_object().into_iter().flatten() {
                out.push_str(&format!("  drop {k:<15} {val}\n"));
            }
            for q in l["qps"].as_array().into_iter().flatten() {
                out.push_str(&format!(
                    "  qp {:#08x}: tx {} rx {} retransmits {} seq-naks {}/{} rnr-naks {}/{} dup {} rkey-viol {}\n",
                    q["qpn"].as_u64().unwrap_or(0), q["tx_packets"], q["rx_packets"], q["retransmits"], q["seq_naks_sent"],
                    q["seq_naks_received"], q["rnr_naks_sent"], q["rnr_naks_received"], q["duplicates"], q["rkey_violations"]
                ));
            }
        }
        if let Some(l) = &self.limits {
            out.push_str(&l.text());
        }
        out
    }
}

/// A captured frame: time since the capture origin, bytes.
type Frame = (Duration, Vec<u8>);

/// Live capture: lcores copy frames into a bounded queue only while a capture runs; a writer
/// thread turns them into pcap on the client's fd.
#[derive(Default)]
pub struct Capture {
    on: AtomicBool,
    qpn: AtomicU64, // u64::MAX = any
    tx: Mutex<Option<Sender<Frame>>>,
    /// Frames written.
    pub frames: AtomicU64,
    /// Frames dropped because the writer fell behind.
    pub dropped: AtomicU64,
    origin: std::sync::OnceLock<Instant>,
}

impl Capture {
    /// Is a capture running?
    pub fn active(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Start capturing `count` frames (0 = until the reader goes away) into `fd` as pcap.
    ///
    /// The capture ends when `count` frames are written, or when the reader goes away (the
    /// `pmrxe capture` client killed or closing its end): a write fails with EPIPE/ECONNRESET
    /// (SIGPIPE is ignored by the service, see `serve`), or, with no frames to write, the fd
    /// polls as hung up. Either way the capture is marked inactive and one line is logged;
    /// the service itself never notices beyond that.
    pub fn start(self: &Arc<Self>, fd: OwnedFd, count: u64, qpn: Option<u32>) -> Result<(), String> {
        let mut slot = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if self.active() {
            return Err("a capture is already running".into());
        }
        let (tx, rx): (Sender<Frame>, Receiver<_>) = bounded(4096);
        self.qpn.store(qpn.map_or(u64::MAX, u64::from), Ordering::Relaxed);
        let _ = self.origin.get_or_init(Instant::now);
        let me = self.clone();
        std::thread::Builder::new()
            .name("pmrxe-capture".into())
            .spawn(move || {
                let (n, why) = write_capture(fd, &rx, count, &me.frames);
                // Deactivate under the lock `start` holds, so a new capture cannot begin
                // between the flag and the sender being cleared.
                {
                    let mut slot = me.tx.lock().unwrap_or_else(|e| e.into_inner());
                    me.on.store(false, Ordering::Release);
                    *slot = None;
                }
                drop(rx);
                tracing::info!(frames = n, dropped_total = me.dropped.load(Ordering::Relaxed), "capture ended: {why}");
            })
            .map_err(|e| e.to_string())?;
        *slot = Some(tx);
        self.on.store(true, Ordering::Release);
        Ok(())
    }
}

/// How often an idle capture writer checks whether its reader is still there.
const READER_CHECK: Duration = Duration::from_millis(100);

/// Why a capture write failed, in words.
fn write_failure(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPIPE) | Some(libc::ECONNRESET) => "the reader went away".into(),
        _ => format!("write error: {e}"),
    }
}

/// Has the other end of `fd` gone away? (a pipe whose read end is closed polls POLLERR, a
/// socket whose peer closed polls POLLHUP; a regular file never does)
fn reader_gone(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut p = [PollFd::new(&fd, PollFlags::empty())];
    let r = rustix::event::poll(&mut p, Some(&Timespec { tv_sec: 0, tv_nsec: 0 }));
    r.is_ok_and(|n| n > 0) && p[0].revents().intersects(PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL)
}

/// The capture writer: pcap header, then frames from `rx` until `count` (0 = no limit) or the
/// reader goes away. Returns the frames written and why it stopped.
fn write_capture(fd: OwnedFd, rx: &Receiver<(Duration, Vec<u8>)>, count: u64, frames: &AtomicU64) -> (u64, String) {
    use std::os::fd::AsFd;
    let file = File::from(fd);
    let mut w = match pmrxe_wire::PcapWriter::new(std::io::BufWriter::new(&file), false) {
        Ok(w) => w,
        Err(e) => return (0, write_failure(&e)),
    };
    if let Err(e) = w.flush() {
        return (0, write_failure(&e));
    }
    let mut n = 0u64;
    let why = loop {
        match rx.recv_timeout(READER_CHECK) {
            Ok((ts, frame)) => {
                if let Err(e) = w.write_frame(ts, &frame) {
                    break write_failure(&e);
                }
                n += 1;
                frames.fetch_add(1, Ordering::Relaxed);
                if count > 0 && n >= count {
                    break format!("{n} frames written");
                }
                if rx.is_empty() {
                    if let Err(e) = w.flush() {
                        break write_failure(&e);
                    }
                }
            }
            Err(crossbeam::channel::RecvTimeoutError::Timeout) => {
                if let Err(e) = w.flush() {
                    break write_failure(&e);
                }
                if reader_gone(file.as_fd()) {
                    break "the reader went away".into();
                }
            }
            Err(crossbeam::channel::RecvTimeoutError::Disconnected) => break "stopped".into(),
        }
    };
    let complete = count > 0 && n >= count;
    match w.flush().and_then(|()| w.into_inner().flush()) {
        Err(e) if complete => (n, format!("{why}, then {}", write_failure(&e))),
        _ => (n, why),
    }
}

/// The lcore side of the capture.
pub struct CaptureTap(pub Arc<Capture>);

impl Tap for CaptureTap {
    fn active(&self) -> bool {
        self.0.active()
    }
    fn frame(&self, _tx: bool, local_qpn: Option<u32>, data: &[u8]) {
        let want = self.0.qpn.load(Ordering::Relaxed);
        if want != u64::MAX {
            // Either direction: sent by the QP (the lcore says which), or addressed to it —
            // also when the sender is a QP of this host (same-port frames are tapped once,
            // when sent).
            let ours = local_qpn.is_some_and(|q| u64::from(q) == want)
                || pmrxe_wire::parse_frame(data).is_ok_and(|f| u64::from(u32::from(f.headers.bth.dest_qp)) == want);
            if !ours {
                return;
            }
        }
        let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let guard = self.0.tx.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = guard.as_ref() {
            if tx.try_send((ts, data.to_vec())).is_err() {
                self.0.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Write the pcap stream from `src` to `dst` (the `pmrxe capture` client helper).
pub fn copy_stream(mut src: impl std::io::Read, mut dst: impl Write) -> std::io::Result<u64> {
    std::io::copy(&mut src, &mut dst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmrxe_runtime::lcore::Tap;
    use pmrxe_wire::sample::{random_headers, random_l3};
    use pmrxe_wire::{build_frame_vec, Opcode, Qpn};
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    /// `pmrxe capture --qp N` keeps the frames of QP N in either direction: sent by N (the lcore
    /// names the sender), addressed to N (received, or sent by another QP of this host: a
    /// same-port frame is tapped once, when sent), and nothing else.
    #[test]
    fn qp_filter_keeps_both_directions_of_one_qp() {
        let mut rng = SmallRng::seed_from_u64(16);
        let frame = |rng: &mut SmallRng, dest: u32| {
            let (mut h, p) = random_headers(rng, Opcode::RC_RDMA_WRITE_ONLY);
            h.bth.dest_qp = Qpn::new(dest);
            let l3 = random_l3(rng, false, Qpn::new(1), Qpn::new(dest));
            build_frame_vec(&l3, &h, &p).unwrap()
        };
        let dir = std::env::temp_dir().join(format!("pmrxe-capture-filter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cap.pcap");
        let cap = Arc::new(Capture::default());
        cap.start(File::create(&path).unwrap().into(), 3, Some(0x22)).unwrap();
        let tap = CaptureTap(cap.clone());
        tap.frame(true, Some(0x11), &frame(&mut rng, 0x22)); // A's request to B: kept
        tap.frame(true, Some(0x11), &frame(&mut rng, 0x33)); // A to C: not B's
        tap.frame(true, Some(0x22), &frame(&mut rng, 0x11)); // B's answer to A: kept
        tap.frame(false, None, &frame(&mut rng, 0x44)); // received for D: dropped
        tap.frame(false, None, &frame(&mut rng, 0x22)); // received for B: kept
        let t0 = Instant::now();
        while cap.active() {
            assert!(t0.elapsed() < Duration::from_secs(10), "the capture did not end after 3 frames");
            std::thread::yield_now();
        }
        let dests: Vec<u32> = pmrxe_wire::read_pcap(&path)
            .unwrap()
            .iter()
            .map(|r| u32::from(pmrxe_wire::parse_frame(&r.data).unwrap().headers.bth.dest_qp))
            .collect();
        assert_eq!(dests, vec![0x22, 0x11, 0x22]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
