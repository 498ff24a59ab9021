//! `pmrxe bench`: the native harness (no shim).
//!
//! Spawns `pmrxe serve` (this executable) on the loopback configuration with the idle back-off
//! switched off (`idle = { mode = "busy" }`) and a private control socket, pins itself (the
//! driver) to CPU 0 — the service's poll-mode lcore is on CPU 1 — and measures between
//! `pmrxe0` and `pmrxe1` with [`pmrxe_service::native`]:
//!
//! * message rate: 8 B and 64 B SEND and WRITE (inline), batches of posts, a window of
//!   outstanding WQEs, every Nth signaled;
//! * bandwidth: WRITE, READ and SEND from 4 KiB to 4 MiB;
//! * latency: 8 B WRITE ping-pong (polling the last byte, like `ib_write_lat`) and 8 B SEND
//!   ping-pong; one-way = round trip / 2, as perftest reports it.
//!
//! One driver thread plays both sides (the passive side of WRITE/READ does nothing; for SEND
//! it re-posts receives; for ping-pong it answers), so the driver needs one core and the
//! service the other. `--memcpy` measures the single-core memcpy limit at the same sizes;
//! `--crc` the byte-work limits at 4 KiB frames (every fused copy+CRC kernel, the one
//! calibration picks, crc32fast, memcpy) and at the smaller `--crc-frames`.
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pmrxe_service::native::{self, wqe, Buffer, Context, Cq, Mr, Pd, Qp, QpOptions, ShmCqe};
use serde_json::{json, Value};

/// Arguments of `pmrxe bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// `quick` (a few seconds, 3 bandwidth sizes, used by tests) or `full` (4 KiB..4 MiB).
    #[arg(long, value_enum, default_value_t = Suite::Full)]
    pub suite: Suite,
    /// Seconds per measured point (default: quick 0.15, full 1.5).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Bandwidth message sizes, comma separated, with K/M suffixes (e.g. 4K,64K,1M).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<String>>,
    /// Operations of the message-rate and bandwidth tests, comma separated (default: all;
    /// the message-rate test has no READ).
    #[arg(long, value_delimiter = ',', value_parser = ["send", "write", "read"])]
    pub ops: Option<Vec<String>>,
    /// Message sizes of the message-rate test, comma separated (default: 8,64; at most 4096;
    /// inline up to 64 B).
    #[arg(long, value_delimiter = ',')]
    pub rate_sizes: Option<Vec<usize>>,
    /// Seconds to stay connected and idle before measuring (a profiler attached to the service
    /// can measure what an empty lcore pass costs with this client present).
    #[arg(long, default_value_t = 0.0)]
    pub settle: f64,
    /// Latency iterations per test (default: quick 2000, full 100000).
    #[arg(long)]
    pub iters: Option<u64>,
    /// Which parts: rate, bw, lat, qps (comma separated; default all), and wake (only when
    /// named): the first 8 B WRITE ping-pong after `--wake-gap-ms` of silence, `--wakes` times
    /// (what a sleeping lcore costs a first message: run against a service in `wait` mode).
    #[arg(long, value_delimiter = ',')]
    pub only: Option<Vec<String>>,
    /// Part `wake`: milliseconds of silence before each measured round trip.
    #[arg(long, default_value_t = 1000)]
    pub wake_gap_ms: u64,
    /// Part `wake`: round trips measured (default: quick 5, full 50).
    #[arg(long)]
    pub wakes: Option<u64>,
    /// Only measure the single-core copy limit at the bandwidth sizes (no service): glibc's
    /// memcpy and, where the CPU has AVX2, a plain AVX2 load/store loop.
    #[arg(long)]
    pub memcpy: bool,
    /// Only measure the byte-work limits of one core at 4 KiB frames: the fused copy+CRC kernel
    /// (each one this CPU has, side by side, and the one `pmrxe_crc::Kernel::calibrate` picks,
    /// which is installed as the best), crc32fast, memcpy (no service). The loopback ceiling is
    /// the chosen kernel's figure ÷ 2 (one lcore makes one pass per side).
    #[arg(long)]
    pub crc: bool,
    /// With `--crc`: frame sizes measured besides 4 KiB (comma separated, bytes, at most 4096;
    /// an empty value for none).
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 256, 1024])]
    pub crc_frames: Vec<usize>,
    /// Only measure what a hand-off between two CPUs costs (no service): one cache line
    /// bounced between the driver's CPU (`--cpu`) and `--peer-cpu` (an atomic ping-pong), and
    /// the shape of a posted operation's round trip through the shared rings (a one-SGE send
    /// WQE staged and published by one side, consumed by the other, which answers with a
    /// 64-byte completion on a second ring). A floor under the loopback latency, whose every
    /// operation crosses between the client's CPU and the lcore's twice.
    #[arg(long)]
    pub c2c: bool,
    /// With `--c2c`: the other CPU (the loopback configuration's lcore runs on CPU 1).
    #[arg(long, default_value_t = 1)]
    pub peer_cpu: usize,
    /// Use a running service at this socket instead of spawning one.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Configuration for the spawned service (default: the embedded loopback, idle = busy).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// CPU the driver pins itself to.
    #[arg(long, default_value_t = 0)]
    pub cpu: usize,
    /// Outstanding WQEs in message-rate and bandwidth tests (bandwidth: at most 16 MiB in flight).
    #[arg(long, default_value_t = 128)]
    pub window: u32,
    /// Signal every Nth WQE in message-rate tests.
    #[arg(long, default_value_t = 16)]
    pub signal_every: u32,
    /// WQEs per post (one publish + one doorbell per batch) in message-rate tests.
    #[arg(long, default_value_t = 16)]
    pub batch: u32,
    /// QP counts for the many-QP test (part `qps`): 64 KiB WRITEs spread over that many
    /// connected QPs, each with `--window` outstanding (at most 128) and its own 64 KiB of
    /// source and target memory, as `ib_write_bw -q N -t 128` does. The aggregate is reported
    /// as a ratio to the 1-QP figure of the same run.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 16, 64])]
    pub qps: Vec<u32>,
    /// Open side 1 (the target: its PD, memory, CQs and QPs) through a second client
    /// connection. The service places each client on one lcore, round-robin, so with two or
    /// more lcores the sides live on different lcores and every frame arrives on the lcore that
    /// does not own its QP: that lcore checks its outer headers, routes it on BTH.DestQP and
    /// hands it over (the hand-off's cost is what this measures: scripts/instructions.sh
    /// --handoff).
    #[arg(long)]
    pub two_clients: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Suite {
    Quick,
    Full,
}

/// Largest message of the message-rate test (one frame at the 4096-byte path MTU).
const RATE_MAX_SIZE: usize = 4096;
/// Most QPs the many-QP test connects (each pair has four CQs).
const MAX_BENCH_QPS: u32 = 256;
/// Message size of the many-QP test (the acceptance figure of `ib_write_bw -q N`).
const QPS_SIZE: usize = 65536;

const QUICK_SIZES: &[usize] = &[4096, 65536, 1 << 20];
const FULL_SIZES: &[usize] = &[4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1 << 20, 2 << 20, 4 << 20];

pub fn run(args: BenchArgs) -> ExitCode {
    match bench(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => super::fail("bench", e),
    }
}

struct Plan {
    dur: Duration,
    sizes: Vec<usize>,
    iters: u64,
    rate: bool,
    bw: bool,
    lat: bool,
    /// Message sizes of the message-rate test (inline up to the harness's 64 B).
    rate_sizes: Vec<usize>,
    /// Part `qps`: the QP counts of the many-QP test (empty: not run).
    qps: Vec<u32>,
    /// Part `wake`: (round trips, silence before each); `None`: not run.
    wake: Option<(u64, Duration)>,
}

fn plan(args: &BenchArgs) -> io::Result<Plan> {
    let quick = args.suite == Suite::Quick;
    let dur = Duration::from_secs_f64(args.duration.unwrap_or(if quick { 0.15 } else { 1.5 }).clamp(0.01, 600.0));
    let sizes = match &args.sizes {
        Some(v) => v.iter().map(|s| parse_size(s)).collect::<io::Result<Vec<_>>>()?,
        None => if quick { QUICK_SIZES } else { FULL_SIZES }.to_vec(),
    };
    let only = |k: &str| args.only.as_ref().is_none_or(|v| v.iter().any(|x| x == k));
    let qps = if only("qps") { args.qps.clone() } else { Vec::new() };
    if qps.iter().any(|&q| q == 0 || q > MAX_BENCH_QPS) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("--qps: each count must be 1..={MAX_BENCH_QPS}")));
    }
    let rate_sizes = args.rate_sizes.clone().unwrap_or_else(|| vec![8, 64]);
    if rate_sizes.iter().any(|&n| n == 0 || n > RATE_MAX_SIZE) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("--rate-sizes: each size must be 1..={RATE_MAX_SIZE}")));
    }
    let wake = args.only.as_ref().is_some_and(|v| v.iter().any(|x| x == "wake")).then(|| {
        (args.wakes.unwrap_or(if quick { 5 } else { 50 }).max(1), Duration::from_millis(args.wake_gap_ms.min(60_000)))
    });
    Ok(Plan { dur, sizes, rate_sizes, iters: args.iters.unwrap_or(if quick { 2000 } else { 100_000 }), rate: only("rate"), bw: only("bw"), lat: only("lat"), qps, wake })
}

fn parse_size(s: &str) -> io::Result<usize> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1024),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    let n: usize = num.parse().map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("bad size {s:?}")))?;
    if n == 0 || n * mul > 64 << 20 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("size {s:?} must be 1..=64M")));
    }
    Ok(n * mul)
}

fn bench(args: &BenchArgs) -> io::Result<()> {
    let plan = plan(args)?;
    let mut out = json!({
        "schema": 1,
        "suite": if args.suite == Suite::Quick { "quick" } else { "full" },
        "duration_s": plan.dur.as_secs_f64(),
        "machine": machine(),
        "units": { "mops": "million operations per second", "gb_per_s": "1e9 bytes per second", "latency": "microseconds, one-way = round trip / 2" },
    });
    let limits_only = args.crc || args.c2c || args.memcpy;
    // A service this run spawns starts before the driver pins itself: it inherits neither the
    // driver's CPU nor, through it, a CPU shared with the driver's spinning thread.
    let spawned = if limits_only || args.socket.is_some() { None } else { Some(Service::spawn(args.config.as_deref())?) };
    if core_affinity::set_for_current(core_affinity::CoreId { id: args.cpu }) {
        out["driver_cpu"] = json!(args.cpu);
    } else {
        eprintln!("pmrxe: bench: could not pin the driver to CPU {}", args.cpu);
        out["driver_cpu"] = Value::Null;
    }
    if args.crc {
        let c = crc_limits(plan.dur, &args.crc_frames);
        print_crc(&c);
        out["crc"] = c;
        return write_json(args, &out);
    }
    if args.c2c {
        let c = c2c_limits(args.cpu, args.peer_cpu, plan.dur)?;
        print_c2c(&c);
        out["c2c"] = c;
        return write_json(args, &out);
    }
    if args.memcpy {
        let m = memcpy_limits(&plan.sizes, plan.dur);
        print_memcpy(&m);
        out["memcpy"] = Value::Array(m);
        return write_json(args, &out);
    }
    let (mut service, socket) = match (&args.socket, spawned) {
        (Some(s), _) => (None, s.clone()),
        (None, Some(s)) => {
            let p = s.socket.clone();
            (Some(s), p)
        }
        (None, None) => unreachable!("spawned above unless a socket was given"),
    };
    out["service"] = json!({ "socket": socket, "spawned": service.is_some(), "idle": if args.config.is_none() && service.is_some() { "busy" } else { "as configured" } });
    let ctx = connect_retry(&socket, service.as_mut(), Duration::from_secs(30))?;
    let target = if args.two_clients { connect_retry(&socket, service.as_mut(), Duration::from_secs(30))? } else { ctx.clone() };
    out["two_clients"] = json!(args.two_clients);
    let h = Harness::new([&ctx, &target], &plan)?;
    out["service"]["path_mtu"] = json!(256u32 << h.path_mtu.saturating_sub(1));
    out["service"]["devices"] = json!([ctx.devices()[h.dev[0] as usize].name, ctx.devices()[h.dev[1] as usize].name]);
    println!("pmrxe bench ({}): {} <-> {}, path MTU {}, driver on CPU {}, {:.2} s per point",
        out["suite"].as_str().unwrap_or(""), ctx.devices()[h.dev[0] as usize].name, ctx.devices()[h.dev[1] as usize].name,
        out["service"]["path_mtu"], args.cpu, plan.dur.as_secs_f64());
    if args.settle > 0.0 {
        // Connected, nothing in flight: a profiler watching for this line measures empty passes.
        println!("settling: connected and idle for {:.2} s", args.settle.min(600.0));
        std::thread::sleep(Duration::from_secs_f64(args.settle.min(600.0)));
    }
    let mut rate = Vec::new();
    if plan.rate {
        println!("\nmessage rate (window {}, batch {}, signal every {})", args.window, args.batch, args.signal_every);
        // The lcores' busy time per send WQE over the whole point (warm-up included): what an
        // operation costs the data path, apart from the pipeline's idle gaps and the driver.
        println!("  {:<6} {:>8} {:>12} {:>10} {:>13}", "op", "size", "Mops/s", "GB/s", "lcore ns/op");
        for op in [Op::Send, Op::Write].into_iter().filter(|&o| wanted(args, o)) {
            for &size in &plan.rate_sizes {
                let before = lcore_work(&ctx);
                let r = h.stream(op, size, 1, args.window, args.signal_every, args.batch, true, plan.dur)?;
                let ns_per_op = match (before, lcore_work(&ctx)) {
                    (Some(a), Some(b)) if b.1 > a.1 => Some((b.0 - a.0) as f64 / (b.1 - a.1) as f64),
                    _ => None,
                };
                println!("  {:<6} {:>8} {:>12.3} {:>10.4} {:>13}", op.name(), size, r.mops(), r.gbps(), ns_per_op.map_or("-".into(), |x| format!("{x:.0}")));
                rate.push(json!({"op": op.name(), "size": size, "inline": size <= h.opts.cap.max_inline_data as usize, "mops": r.mops(), "gb_per_s": r.gbps(), "ops": r.ops, "seconds": r.secs,
                    "window": args.window, "batch": args.batch, "signal_every": args.signal_every, "lcore_ns_per_op": ns_per_op}));
            }
        }
    }
    out["msg_rate"] = Value::Array(rate);
    let mut bw = Vec::new();
    if plan.bw {
        println!("\nbandwidth");
        println!("  {:<6} {:>8} {:>10} {:>12} {:>7}", "op", "size", "GB/s", "Mops/s", "window");
        for op in [Op::Write, Op::Read, Op::Send].into_iter().filter(|&o| wanted(args, o)) {
            for &size in &plan.sizes {
                let window = bw_window(args.window, size);
                let sig = (window / 4).max(1);
                let r = h.stream(op, size, 1, window, sig, sig.min(args.batch), false, plan.dur)?;
                println!("  {:<6} {:>8} {:>10.3} {:>12.4} {:>7}", op.name(), size, r.gbps(), r.mops(), window);
                bw.push(json!({"op": op.name(), "size": size, "gb_per_s": r.gbps(), "mops": r.mops(), "ops": r.ops, "seconds": r.secs, "window": window, "signal_every": sig}));
            }
        }
    }
    out["bandwidth"] = Value::Array(bw);
    let mut many = Vec::new();
    if !plan.qps.is_empty() {
        let window = args.window.min(128);
        let sig = (window / 4).max(1);
        println!("\nmany QPs (WRITE {} KiB, {window} outstanding per QP)", QPS_SIZE >> 10);
        println!("  {:>5} {:>10} {:>12} {:>9}", "QPs", "GB/s", "Mops/s", "vs 1 QP");
        let mut one = None::<f64>;
        for &q in &plan.qps {
            let r = h.stream(Op::Write, QPS_SIZE, q as usize, window, sig, sig.min(args.batch), false, plan.dur)?;
            if q == 1 {
                one = Some(r.gbps());
            }
            let ratio = one.map(|o| r.gbps() / o);
            println!("  {:>5} {:>10.3} {:>12.4} {:>9}", q, r.gbps(), r.mops(), ratio.map_or("-".into(), |x| format!("{x:.2}")));
            many.push(json!({"qps": q, "size": QPS_SIZE, "window_per_qp": window, "gb_per_s": r.gbps(), "mops": r.mops(), "ops": r.ops, "seconds": r.secs, "vs_one_qp": ratio}));
        }
    }
    out["many_qps"] = Value::Array(many);
    let mut lat = Vec::new();
    if plan.lat {
        println!("\nlatency (8 B, one-way = RTT/2, {} iterations)", plan.iters);
        println!("  {:<6} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}", "op", "size", "min us", "p50 us", "p99 us", "p99.9 us", "mean us");
        for op in [Op::Write, Op::Send] {
            let s = h.ping_pong(op, 8, plan.iters, None)?;
            println!("  {:<6} {:>8} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}", op.name(), 8, s.min, s.p50, s.p99, s.p999, s.mean);
            lat.push(json!({"op": op.name(), "size": 8, "iters": plan.iters, "min_us": s.min, "p50_us": s.p50, "p99_us": s.p99, "p999_us": s.p999, "mean_us": s.mean, "max_us": s.max}));
        }
    }
    out["latency"] = Value::Array(lat);
    if let Some((n, gap)) = plan.wake {
        println!("\nwake-up (8 B WRITE, first round trip after {} ms of silence, one-way = RTT/2, {n} times)", gap.as_millis());
        println!("  {:>9} {:>9} {:>9} {:>9} {:>9}", "min us", "p50 us", "p99 us", "max us", "mean us");
        let s = h.ping_pong(Op::Write, 8, n, Some(gap))?;
        println!("  {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}", s.min, s.p50, s.p99, s.max, s.mean);
        out["wake"] = json!({"op": "write", "size": 8, "wakes": n, "gap_ms": gap.as_millis() as u64, "min_us": s.min, "p50_us": s.p50, "p99_us": s.p99, "max_us": s.max, "mean_us": s.mean});
    }
    if let Ok(s) = ctx.stats(true) {
        out["service_stats"] = serde_json::from_str(&s).unwrap_or(Value::String(s));
    }
    drop(h);
    drop(ctx);
    drop(service);
    write_json(args, &out)
}

/// Whether `--ops` asks for `op` (no `--ops`: every one).
fn wanted(args: &BenchArgs, op: Op) -> bool {
    args.ops.as_ref().is_none_or(|v| v.iter().any(|x| x.eq_ignore_ascii_case(op.name())))
}

fn bw_window(max: u32, size: usize) -> u32 {
    ((16usize << 20) / size).clamp(2, max.max(2) as usize) as u32
}

fn write_json(args: &BenchArgs, out: &Value) -> io::Result<()> {
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(out).map_err(io::Error::other)? + "\n")?;
        println!("\nJSON: {}", p.display());
    }
    Ok(())
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).ok();
    let load = std::fs::read_to_string("/proc/loadavg").map(|s| s.trim().to_string()).ok();
    json!({ "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), "cpu_model": model, "kernel": kernel, "loadavg_at_start": load })
}

// ---------------------------------------------------------------------------------------------
// The service child.

struct Service {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Service {
    fn spawn(config: Option<&Path>) -> io::Result<Service> {
        let dir = std::env::temp_dir().join(format!("pmrxe-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("pmrxe.sock");
        let cfg = match config {
            Some(p) => p.to_path_buf(),
            None => {
                let text: String = pmrxe_config::DEFAULT_LOOPBACK
                    .lines()
                    .map(|l| if l.trim_start().starts_with("idle") { "idle = { mode = \"busy\" }" } else { l })
                    .collect::<Vec<_>>()
                    .join("\n");
                let p = dir.join("loopback-busy.toml");
                std::fs::write(&p, text + "\n")?;
                p
            }
        };
        let exe = std::env::current_exe()?;
        let log = std::fs::File::create(dir.join("serve.log"))?;
        let child = Command::new(exe)
            .arg("serve")
            .arg("--config")
            .arg(&cfg)
            .env("PMRXE_SOCKET", &socket)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        Ok(Service { child, dir, socket })
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(rustix::process::Pid::from_child(&self.child), rustix::process::Signal::TERM);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if self.exited().is_some() {
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Connects to the service at `socket`, retrying until `limit`; with the spawned `service`,
/// fails at once (with its log) when it has exited.
fn connect_retry(socket: &Path, mut service: Option<&mut Service>, limit: Duration) -> io::Result<Context> {
    let t0 = Instant::now();
    loop {
        match Context::connect(socket) {
            Ok(c) => return Ok(c),
            Err(e) => {
                if let Some(s) = service.as_deref_mut() {
                    if let Some(st) = s.exited() {
                        let log = std::fs::read_to_string(s.dir.join("serve.log")).unwrap_or_default();
                        return Err(io::Error::other(format!("pmrxe serve exited ({st}) before answering: {}", log.trim())));
                    }
                }
                if t0.elapsed() > limit {
                    return Err(io::Error::new(e.kind(), format!("no service at {}: {e}", socket.display())));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The harness.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Send,
    Write,
    Read,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Send => "SEND",
            Op::Write => "WRITE",
            Op::Read => "READ",
        }
    }
}

struct StreamResult {
    ops: u64,
    bytes: u64,
    secs: f64,
}

impl StreamResult {
    fn mops(&self) -> f64 {
        self.ops as f64 / self.secs / 1e6
    }
    fn gbps(&self) -> f64 {
        self.bytes as f64 / self.secs / 1e9
    }
}

struct LatStats {
    min: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    mean: f64,
    max: f64,
}

/// Per-device objects kept across tests.
struct Side {
    mr: Mr,
    buf: Buffer,
    pd: Pd,
}

/// One connected QP pair with its CQs (fresh per test). Field order = drop order: QPs first.
struct Conn {
    qp: [Qp; 2],
    scq: [Cq; 2],
    rcq: [Cq; 2],
    /// Receives posted and not yet consumed, per side.
    recv_posted: [u32; 2],
}

const RQ_DEPTH: u32 = 1024;
const CQ_DEPTH: u32 = 4096;

/// The service's lcores together: busy nanoseconds and send WQEs taken (`busy_ns`, `sq_wqes`).
fn lcore_work(ctx: &Context) -> Option<(u64, u64)> {
    let v: Value = serde_json::from_str(&ctx.stats(true).ok()?).ok()?;
    let mut sum = (0u64, 0u64);
    for l in v["lcores"].as_array()? {
        sum.0 += l["counters"]["busy_ns"].as_u64()?;
        sum.1 += l["counters"]["sq_wqes"].as_u64()?;
    }
    Some(sum)
}

struct Harness {
    /// The client each side's objects belong to (one client twice, or two: `--two-clients`).
    ctx: [Context; 2],
    sides: [Side; 2],
    dev: [u32; 2],
    path_mtu: u32,
    rd_atomic: u8,
    opts: QpOptions,
    buf_len: usize,
}

impl Harness {
    fn new(ctxs: [&Context; 2], plan: &Plan) -> io::Result<Harness> {
        let ctx = ctxs[0];
        let find = |name: &str, fallback: u32| ctx.device_index(name).unwrap_or(fallback);
        let dev = [find("pmrxe0", 0), find("pmrxe1", 1)];
        if ctx.devices().len() < 2 {
            return Err(io::Error::other("the service has fewer than two devices"));
        }
        let d0 = &ctx.devices()[dev[0] as usize];
        let path_mtu = d0.port.active_mtu.clamp(1, 5);
        let rd_atomic = d0.attr.max_qp_rd_atom.clamp(1, 16) as u8;
        let mut opts = QpOptions::default();
        opts.cap.max_send_wr = d0.attr.max_qp_wr.min(1024);
        opts.cap.max_recv_wr = d0.attr.max_qp_wr.min(RQ_DEPTH);
        opts.cap.max_inline_data = d0.attr.max_inline_data.min(64);
        let most_qps = plan.qps.iter().copied().max().unwrap_or(1) as usize;
        let buf_len = plan.sizes.iter().copied().max().unwrap_or(4096).max(1 << 16).max(QPS_SIZE * most_qps);
        let mk = |ctx: &Context, d: u32| -> io::Result<Side> {
            let pd = Pd::alloc(ctx, d)?;
            let buf = Buffer::new(ctx, buf_len)?;
            let mr = Mr::register(&pd, &buf, native::access::ALL)?;
            Ok(Side { mr, buf, pd })
        };
        let sides = [mk(ctxs[0], dev[0])?, mk(ctxs[1], dev[1])?];
        Ok(Harness { ctx: [ctxs[0].clone(), ctxs[1].clone()], sides, dev, path_mtu, rd_atomic, opts, buf_len })
    }

    fn connect(&self) -> io::Result<Conn> {
        let cq = |i: usize| Cq::create(&self.ctx[i], self.dev[i], CQ_DEPTH.min(self.ctx[i].devices()[self.dev[i] as usize].attr.max_cqe));
        let scq = [cq(0)?, cq(1)?];
        let rcq = [cq(0)?, cq(1)?];
        let qa = Qp::create(&self.sides[0].pd, &scq[0], &rcq[0], self.opts)?;
        let qb = Qp::create(&self.sides[1].pd, &scq[1], &rcq[1], self.opts)?;
        qa.connect(qb.qpn, qa.av_to(self.dev[1])?, self.path_mtu, self.rd_atomic)?;
        qb.connect(qa.qpn, qb.av_to(self.dev[0])?, self.path_mtu, self.rd_atomic)?;
        Ok(Conn { qp: [qa, qb], scq, rcq, recv_posted: [0, 0] })
    }

    /// Top up side `i`'s receive queue to RQ_DEPTH receives of `len` bytes each.
    fn fill_rq(&self, c: &mut Conn, i: usize, len: u32) -> io::Result<()> {
        let want = self.opts.cap.max_recv_wr.min(RQ_DEPTH) - c.recv_posted[i];
        if want == 0 {
            return Ok(());
        }
        let sge = self.sides[i].mr.sge(0, len);
        let wqes: Vec<_> = (0..want).map(|_| wqe::recv(0, sge)).collect();
        c.qp[i].post_recv(&wqes)?;
        c.recv_posted[i] += want;
        Ok(())
    }

    /// Reap receive completions on side `i` (checking status) and re-post that many.
    fn reap_recv(&self, c: &mut Conn, i: usize, len: u32, cqes: &mut [ShmCqe]) -> io::Result<usize> {
        let n = c.rcq[i].poll(cqes)?;
        for e in &cqes[..n] {
            check(e, "receive")?;
        }
        c.recv_posted[i] -= n as u32;
        // Re-post in batches (one publish + doorbell per refill), keeping at least 3/4 posted.
        if c.recv_posted[i] < self.opts.cap.max_recv_wr.min(RQ_DEPTH) * 3 / 4 || c.recv_posted[i] < 4 {
            self.fill_rq(c, i, len)?;
        }
        Ok(n)
    }

    /// Stream `op` of `size` bytes from side 0 to side 1 for `dur` over `qps` connected QPs
    /// (QP k reads and writes its own `size` bytes at offset k × size): at most `window`
    /// outstanding per QP, every `sig`th signaled, `batch` WQEs per publish.
    #[allow(clippy::too_many_arguments)]
    fn stream(&self, op: Op, size: usize, qps: usize, window: u32, sig: u32, batch: u32, inline: bool, dur: Duration) -> io::Result<StreamResult> {
        if qps == 0 || qps * size > self.buf_len {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{qps} QPs x {size} B exceed the {} B buffer", self.buf_len)));
        }
        let mut conns = (0..qps).map(|_| self.connect()).collect::<io::Result<Vec<_>>>()?;
        let window = window.min(self.opts.cap.max_send_wr).max(1);
        let sig = sig.clamp(1, window);
        // Keep the window a multiple of the signal interval so posting can stop on a boundary.
        let window = (window / sig).max(1) * sig;
        let batch = batch.clamp(1, window);
        let inline = inline && size <= self.opts.cap.max_inline_data as usize;
        if op == Op::Send {
            for c in &mut conns {
                self.fill_rq(c, 1, size.max(1) as u32)?;
            }
        }
        let (a, b) = (&self.sides[0], &self.sides[1]);
        let payload = vec![0x5au8; size.min(256)];
        let make = |k: usize, n: u64| -> native::ShmSendWqe {
            let signaled = (n + 1).is_multiple_of(sig as u64);
            let wr_id = sig as u64;
            let off = (k * size) as u64;
            let local = a.mr.sge(off, size as u32);
            let remote = b.mr.addr + off;
            match op {
                Op::Send if inline => wqe::send_inline(wr_id, &payload, signaled),
                Op::Send => wqe::send(wr_id, local, signaled),
                Op::Write if inline => wqe::write_inline(wr_id, &payload, remote, b.mr.key, signaled),
                Op::Write => wqe::write(wr_id, local, remote, b.mr.key, signaled),
                Op::Read => wqe::read(wr_id, local, remote, b.mr.key, signaled),
            }
        };
        let mut cqes = vec![ShmCqe::default(); 64];
        // Per QP: posted and completed WQEs.
        let mut posted = vec![0u64; qps];
        let mut done = vec![0u64; qps];
        let total = |v: &[u64]| v.iter().sum::<u64>();
        // Warm-up: one window's worth per QP, drained.
        let warm = window as u64 * qps as u64;
        let t0 = Instant::now();
        let mut deadline = None::<Instant>;
        let mut start = (t0, 0u64);
        let mut last_done_at = t0;
        loop {
            let now_posting = deadline.is_none_or(|d| Instant::now() < d);
            let mut idle = true;
            for (k, c) in conns.iter_mut().enumerate() {
                if now_posting || !posted[k].is_multiple_of(sig as u64) {
                    idle = false;
                    let mut n = 0;
                    while n < batch && posted[k] - done[k] < window as u64 {
                        if !c.qp[0].stage_send(make(k, posted[k])) {
                            break;
                        }
                        posted[k] += 1;
                        n += 1;
                        if !now_posting && posted[k].is_multiple_of(sig as u64) {
                            break;
                        }
                    }
                    if n > 0 {
                        c.qp[0].flush_send();
                    }
                } else if done[k] != posted[k] {
                    idle = false;
                }
                let got = c.scq[0].poll(&mut cqes)?;
                if got > 0 {
                    for e in &cqes[..got] {
                        check(e, op.name())?;
                        done[k] += e.wr_id;
                    }
                    last_done_at = Instant::now();
                }
                if op == Op::Send {
                    self.reap_recv(c, 1, size.max(1) as u32, &mut cqes)?;
                }
            }
            if idle {
                break;
            }
            if deadline.is_none() && total(&done) >= warm {
                start = (last_done_at, total(&done));
                deadline = Some(last_done_at + dur);
            }
            if t0.elapsed() > dur * 4 + Duration::from_secs(20) {
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("{} {size} B x {qps} QPs: stuck ({} posted, {} completed)", op.name(), total(&posted), total(&done))));
            }
        }
        let ops = total(&done) - start.1;
        let secs = last_done_at.duration_since(start.0).as_secs_f64().max(1e-9);
        Ok(StreamResult { ops, bytes: ops * size as u64, secs })
    }

    /// `iters` round trips of `size` bytes; returns one-way latency statistics (RTT/2). With
    /// `gap`, each measured round trip follows `gap` of silence (no warm-up: every one is a
    /// first message to a service that may sleep).
    fn ping_pong(&self, op: Op, size: usize, iters: u64, gap: Option<Duration>) -> io::Result<LatStats> {
        let mut c = self.connect()?;
        let size = size.clamp(1, self.opts.cap.max_inline_data.max(1) as usize);
        if op == Op::Send {
            self.fill_rq(&mut c, 0, size as u32)?;
            self.fill_rq(&mut c, 1, size as u32)?;
        }
        const SIG: u64 = 16;
        let warm = if gap.is_some() { 1 } else { (iters / 10).clamp(10, 10_000) };
        let mut samples = Vec::with_capacity(iters as usize);
        let mut cqes = vec![ShmCqe::default(); 64];
        let mut outstanding = [0u64; 2];
        let mut posted = [0u64; 2];
        // The latency slot is the buffer's last 64 bytes, away from the bandwidth area's head.
        let off = (self.buf_len - 64) as u64;
        let last = off as usize + size - 1;
        for s in &self.sides {
            s.buf.write_volatile(last, 0);
        }
        let t_limit = Instant::now() + Duration::from_secs(60 + iters / 10_000) + gap.unwrap_or_default() * (iters as u32 + 1);
        for i in 0..warm + iters {
            let val = (i % 255 + 1) as u8;
            let mut msg = [0u8; 64];
            msg[..size].fill(val);
            if let Some(g) = gap {
                std::thread::sleep(g);
            }
            let t0 = Instant::now();
            for from in 0..2usize {
                let to = 1 - from;
                // Send from `from` to `to`.
                while outstanding[from] + SIG >= self.opts.cap.max_send_wr as u64 {
                    self.reap_send(&mut c, from, &mut outstanding, &mut cqes)?;
                }
                let signaled = (posted[from] + 1) % SIG == 0;
                let w = match op {
                    Op::Write => wqe::write_inline(SIG, &msg[..size], self.sides[to].mr.addr + off, self.sides[to].mr.key, signaled),
                    _ => wqe::send_inline(SIG, &msg[..size], signaled),
                };
                c.qp[from].post_send(&[w])?;
                posted[from] += 1;
                outstanding[from] += 1;
                // Wait at `to`.
                match op {
                    Op::Write => {
                        while self.sides[to].buf.read_volatile(last) != val {
                            if Instant::now() > t_limit {
                                return Err(io::Error::new(io::ErrorKind::TimedOut, "WRITE ping-pong: the last byte never arrived"));
                            }
                            std::hint::spin_loop();
                        }
                    }
                    _ => loop {
                        if self.reap_recv(&mut c, to, size as u32, &mut cqes[..1])? == 1 {
                            break;
                        }
                        if Instant::now() > t_limit {
                            return Err(io::Error::new(io::ErrorKind::TimedOut, "SEND ping-pong: no receive completion"));
                        }
                    },
                }
                self.reap_send(&mut c, from, &mut outstanding, &mut cqes)?;
            }
            let rtt = t0.elapsed();
            if i >= warm {
                samples.push(rtt.as_secs_f64() * 1e6 / 2.0);
            }
        }
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let q = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        Ok(LatStats { min: samples[0], p50: q(0.5), p99: q(0.99), p999: q(0.999), mean, max: *samples.last().unwrap() })
    }

    fn reap_send(&self, c: &mut Conn, i: usize, outstanding: &mut [u64; 2], cqes: &mut [ShmCqe]) -> io::Result<()> {
        let n = c.scq[i].poll(cqes)?;
        for e in &cqes[..n] {
            check(e, "send")?;
            outstanding[i] = outstanding[i].saturating_sub(e.wr_id);
        }
        Ok(())
    }
}

fn check(e: &ShmCqe, what: &str) -> io::Result<()> {
    if e.status != 0 {
        return Err(io::Error::other(format!("{what}: completion status {} (vendor_err {}, opcode {})", e.status, e.vendor_err, e.opcode)));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// memcpy limit.

fn memcpy_limits(sizes: &[usize], dur: Duration) -> Vec<Value> {
    let mut v = Vec::new();
    for &size in sizes {
        let src = vec![0xa5u8; size];
        let mut dst = vec![0u8; size];
        // Warm up (fault the pages in).
        dst.copy_from_slice(&src);
        let time = |copy: &mut dyn FnMut(&[u8], &mut [u8])| {
            let mut dst = dst.clone();
            let t0 = Instant::now();
            let mut n = 0u64;
            while t0.elapsed() < dur {
                for _ in 0..(((1 << 22) / size).max(1)) {
                    copy(std::hint::black_box(&src), &mut dst);
                    std::hint::black_box(&mut dst);
                    n += 1;
                }
            }
            let secs = t0.elapsed().as_secs_f64();
            ((n * size as u64) as f64 / secs / 1e9, n, secs)
        };
        let (gb, n, secs) = time(&mut |s, d| {
            // SAFETY: distinct allocations of `size` bytes each.
            unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), d.as_mut_ptr(), s.len()) }
        });
        let mut m = json!({"size": size, "gb_per_s": gb, "copies": n, "seconds": secs});
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let (gb, _, _) = time(&mut |s, d| {
                // SAFETY: AVX2 is present (checked above); equal lengths.
                unsafe { copy_avx2(s, d) }
            });
            m["avx2_loop_gb_per_s"] = json!(gb);
        }
        v.push(m);
    }
    v
}

/// A plain copy in 32-byte AVX2 loads and stores (four per iteration): the single-core copy
/// rate of the machine without glibc's size-dependent strategy (glibc 2.36's memcpy takes
/// `rep movsb` from some sizes on, which on AMD Zen runs at 1-2 GB/s between page-aligned
/// buffers of 16 and 64 KiB, where 32 KiB runs at 30+). The figure `--memcpy` reports beside
/// glibc's; the report's copy limit is the better of the two.
///
/// # Safety
/// The CPU has AVX2; `src` and `dst` have the same length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_avx2(src: &[u8], dst: &mut [u8]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};
    let n = src.len().min(dst.len());
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    while i + 128 <= n {
        // SAFETY: `i + 128 <= n`: the four 32-byte lanes are inside both slices; unaligned
        // loads and stores.
        unsafe {
            let a = _mm256_loadu_si256(s.add(i).cast::<__m256i>());
            let b = _mm256_loadu_si256(s.add(i + 32).cast::<__m256i>());
            let c = _mm256_loadu_si256(s.add(i + 64).cast::<__m256i>());
            let e = _mm256_loadu_si256(s.add(i + 96).cast::<__m256i>());
            _mm256_storeu_si256(d.add(i).cast::<__m256i>(), a);
            _mm256_storeu_si256(d.add(i + 32).cast::<__m256i>(), b);
            _mm256_storeu_si256(d.add(i + 64).cast::<__m256i>(), c);
            _mm256_storeu_si256(d.add(i + 96).cast::<__m256i>(), e);
        }
        i += 128;
    }
    dst[i..n].copy_from_slice(&src[i..n]);
}

// ---------------------------------------------------------------------------------------------
// Cross-CPU hand-off limits.

/// 64-byte aligned, zeroed memory for the rings of [`c2c_limits`], freed on drop.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len.max(64), 64).expect("ring layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Aligned { ptr, layout }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Round trips between this thread (on `cpu`) and a peer thread (on `peer`), in batches of
/// `BATCH`: `step(i)` runs here and spins until the peer's answer to round `i` is visible;
/// `answer(i)` runs on the peer and answers round `i` if its request is visible (true) or
/// returns false at once. Returns one round trip's ns per batch (the batch's mean), sorted.
fn ping_pong(cpu: usize, peer: usize, dur: Duration, mut step: impl FnMut(u32) + Send, answer: impl FnMut(u32) -> bool + Send) -> io::Result<Vec<f64>> {
    const BATCH: u32 = 100;
    let stop = std::sync::atomic::AtomicU32::new(u32::MAX);
    let pinned = std::sync::atomic::AtomicBool::new(true);
    let mut per = Vec::new();
    std::thread::scope(|sc| {
        let (stop, pinned) = (&stop, &pinned);
        // The peer inherits this thread's CPU set: make it the peer's CPU before the spawn, so
        // the peer never has to run on this thread's CPU to move itself (under SCHED_FIFO, as
        // scripts/bench.sh's BENCH_RT=1 runs it, this thread's spin would never let it).
        if !core_affinity::set_for_current(core_affinity::CoreId { id: peer }) {
            pinned.store(false, Ordering::Relaxed);
        }
        sc.spawn(move || {
            let mut answer = answer;
            let mut i = 0u32;
            while i != stop.load(Ordering::Relaxed) {
                if answer(i) {
                    i = i.wrapping_add(1);
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
            pinned.store(false, Ordering::Relaxed);
        }
        let t0 = Instant::now();
        let mut i = 0u32;
        // Warm-up batches, then measured ones until the duration is spent.
        while t0.elapsed() < dur || per.len() < 20 {
            let b0 = Instant::now();
            for _ in 0..BATCH {
                step(i);
                i = i.wrapping_add(1);
            }
            if i > 10 * BATCH {
                per.push(b0.elapsed().as_nanos() as f64 / f64::from(BATCH));
            }
        }
        // Every round before `i` is answered; the peer stops when it gets to round `i`.
        stop.store(i, Ordering::Relaxed);
    });
    if !pinned.load(Ordering::Relaxed) {
        return Err(io::Error::other(format!("could not pin the ping-pong threads to CPUs {cpu} and {peer}")));
    }
    per.sort_by(f64::total_cmp);
    Ok(per)
}

/// The cross-CPU limits: a cache line's round trip between `cpu` and `peer`, and a post +
/// completion round trip through two shared rings of the client ABI's entry types.
fn c2c_limits(cpu: usize, peer: usize, dur: Duration) -> io::Result<Value> {
    use pmrxe_abi::ring::{init_ring, ring_bytes, Consumer, Producer};
    use pmrxe_abi::ShmSendWqe;
    use std::sync::atomic::AtomicU32;
    let stats = |v: &[f64]| {
        let q = |f: f64| v[((v.len() - 1) as f64 * f).round() as usize];
        json!({ "min_ns": v[0], "p50_ns": q(0.5), "p99_ns": q(0.99), "batches": v.len() })
    };
    // 1. One cache line each way: `ping` written here, `pong` by the peer.
    #[repr(C, align(64))]
    struct Line(AtomicU32);
    let (ping, pong) = (Line(AtomicU32::new(u32::MAX)), Line(AtomicU32::new(u32::MAX)));
    let line = ping_pong(
        cpu,
        peer,
        dur,
        |i| {
            ping.0.store(i, Ordering::Release);
            while pong.0.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
        },
        |i| {
            if ping.0.load(Ordering::Acquire) != i {
                return false;
            }
            pong.0.store(i, Ordering::Release);
            true
        },
    )?;
    // 2. The rings: a one-SGE send WQE one way (its head and SGE: two lines, plus the
    // producer index), a completion back (one line, plus the index); each side releases the
    // slots it consumed, as the shim and the lcore do.
    const CAP: u32 = 64;
    let (sq_len, cq_len) = (ring_bytes::<ShmSendWqe>(CAP), ring_bytes::<ShmCqe>(CAP));
    let (sq_mem, cq_mem) = (Aligned::new(sq_len), Aligned::new(cq_len));
    // SAFETY: fresh, 64-byte aligned allocations of the sizes the rings need, not yet shared.
    unsafe {
        init_ring::<ShmSendWqe>(sq_mem.ptr, CAP).map_err(|e| io::Error::other(e.to_string()))?;
        init_ring::<ShmCqe>(cq_mem.ptr, CAP).map_err(|e| io::Error::other(e.to_string()))?;
    }
    // SAFETY: the allocations outlive the handles (dropped at the end of this function, after
    // the scope in `ping_pong` joined the peer); one producer and one consumer per ring.
    let (mut sq_p, mut sq_c, mut cq_p, mut cq_c) = unsafe {
        let e = |e: pmrxe_abi::ring::RingError| io::Error::other(e.to_string());
        (
            Producer::<ShmSendWqe>::attach(sq_mem.ptr, sq_len, CAP).map_err(e)?,
            Consumer::<ShmSendWqe>::attach(sq_mem.ptr, sq_len, CAP).map_err(e)?,
            Producer::<ShmCqe>::attach(cq_mem.ptr, cq_len, CAP).map_err(e)?,
            Consumer::<ShmCqe>::attach(cq_mem.ptr, cq_len, CAP).map_err(e)?,
        )
    };
    // The doorbell the shim rings after publishing (slot 5 of one lcore's row), and the
    // lcore's side of it: the summary word polled, then swapped, then the word swapped.
    let row_mem = Aligned::new(std::mem::size_of::<pmrxe_abi::DoorbellRow>());
    // SAFETY: 64-byte aligned, zeroed memory of the row's size; all-zero atomics are valid
    // values, and the row is only used through atomics while `row_mem` lives.
    let row = unsafe { &*row_mem.ptr.cast::<pmrxe_abi::DoorbellRow>() };
    let mut wqe = ShmSendWqe { num_sge: 1, length: 8, ..Default::default() };
    let mut seen = ShmSendWqe::default();
    let mut post_round_trip = |doorbell: bool| {
        let (sq_p, sq_c, cq_p, cq_c, wqe, seen) = (&mut sq_p, &mut sq_c, &mut cq_p, &mut cq_c, &mut wqe, &mut seen);
        ping_pong(
            cpu,
            peer,
            dur,
            move |i| {
                wqe.wr_id = u64::from(i);
                while sq_p.stage_prefixed(wqe).is_err() {
                    std::hint::spin_loop();
                }
                sq_p.publish();
                if doorbell {
                    row.ring(5);
                }
                loop {
                    match cq_c.pop() {
                        Ok(Some(c)) if c.wr_id == u64::from(i) => break,
                        Ok(Some(c)) => panic!("c2c: completion {} for round {i}", c.wr_id),
                        Ok(None) => std::hint::spin_loop(),
                        Err(e) => panic!("c2c: completion ring: {e}"),
                    }
                }
            },
            move |i| {
                if doorbell {
                    if row.summary.load(Ordering::Relaxed) == 0 {
                        return false;
                    }
                    let words = row.summary.swap(0, Ordering::Acquire);
                    if words & 1 == 0 || row.words[0].swap(0, Ordering::Acquire) & (1 << 5) == 0 {
                        panic!("c2c: doorbell 5 not rung (summary {words:#x})");
                    }
                }
                if !sq_c.peek_into(seen).expect("c2c: send ring") {
                    assert!(!doorbell, "c2c: doorbell rung before the WQE was published");
                    return false;
                }
                assert_eq!(seen.wr_id, u64::from(i), "c2c: WQE out of order");
                sq_c.advance();
                sq_c.release();
                let c = ShmCqe { wr_id: seen.wr_id, byte_len: 8, ..Default::default() };
                while cq_p.stage_words(c.to_words()).is_err() {
                    std::hint::spin_loop();
                }
                cq_p.publish();
                true
            },
        )
    };
    let rings = post_round_trip(false)?;
    let doorbell = post_round_trip(true)?;
    let (l50, r50) = (stats(&line)["p50_ns"].as_f64().unwrap_or(0.0), stats(&rings)["p50_ns"].as_f64().unwrap_or(0.0));
    Ok(json!({
        "cpus": [cpu, peer],
        "line_round_trip": stats(&line),
        "ring_round_trip": stats(&rings),
        "doorbell_round_trip": stats(&doorbell),
        "ring_over_line": if l50 > 0.0 { r50 / l50 } else { 0.0 },
    }))
}

fn print_c2c(v: &Value) {
    let g = |p: &str, k: &str| v[p][k].as_f64().unwrap_or(0.0);
    println!("cross-CPU hand-offs between CPU {} and CPU {} (ns per round trip, means of 100-round batches)", v["cpus"][0], v["cpus"][1]);
    println!("  {:<46} {:>8} {:>8} {:>8}", "", "min", "p50", "p99");
    for (k, label) in [
        ("line_round_trip", "one cache line each way (atomic ping-pong)"),
        ("ring_round_trip", "send WQE + completion through shared rings"),
        ("doorbell_round_trip", "the same with the doorbell rung and polled"),
    ] {
        println!("  {label:<46} {:>8.0} {:>8.0} {:>8.0}", g(k, "min_ns"), g(k, "p50_ns"), g(k, "p99_ns"));
    }
    println!("  a ring round trip costs {:.1} cache-line round trips (p50)", v["ring_over_line"].as_f64().unwrap_or(0.0));
}

// ---------------------------------------------------------------------------------------------
// Byte-work limits at frame size: what one lcore's passes over the payload can reach.

/// The byte-work limits: first [`pmrxe_crc::Kernel::calibrate`] at 4 KiB (40 ms) picks the
/// kernel and installs it as the best (as the service does at start; `PMRXE_CRC_KERNEL` still
/// forces one), then [`crc_point`] at 4 KiB, whose figures are the top-level keys (the chosen
/// kernel's as `fused_gb_per_s`, every kernel's under `fused_by_kernel_gb_per_s`), and at each of
/// `frames` (under `by_frame`, the 4 KiB point included).
fn crc_limits(dur: Duration, frames: &[usize]) -> Value {
    const FRAME: usize = 4096;
    let cal = pmrxe_crc::Kernel::calibrate(FRAME, Duration::from_millis(40));
    let chosen = cal.install();
    let mut main = crc_point(FRAME, dur, chosen);
    let mut by_frame: Vec<Value> = frames.iter().filter(|&&f| f > 0 && f < FRAME).map(|&f| crc_point(f, dur, chosen)).collect();
    by_frame.push(main.clone());
    let available: Vec<&str> = pmrxe_crc::Kernel::available().map(|k| k.name()).collect();
    let lacking: Vec<&str> = pmrxe_crc::Kernel::all_names().iter().copied().filter(|n| !available.contains(n)).collect();
    main["calibration"] = json!({
        "frame": cal.frame,
        "budget_ms": 40,
        "gb_per_s": cal.gb_per_s.iter().map(|(k, g)| (k.name().to_string(), json!(g))).collect::<serde_json::Map<_, _>>(),
        "fastest": cal.fastest.name(),
        "forced": cal.forced.map(|k| k.name()),
        "chosen": chosen.name(),
    });
    main["kernels_available"] = json!(available);
    main["kernels_not_on_this_cpu"] = json!(lacking);
    main["by_frame"] = Value::Array(by_frame);
    main
}

/// `frame`-byte payloads as the data path moves them: sources are the consecutive pieces of a
/// 256 KiB message (page-aligned, like a registered buffer), destinations the payload offsets
/// of 32 frame buffers 9 KiB apart (where the transmit path puts the payload of a MIDDLE or
/// LAST packet, the bulk of a long message: on a cache line, 128 bytes into the buffer; see
/// `PacketBuf::open_aligned`), so the figures include the alignment and the cache footprint of
/// the real copies. The variants run interleaved in 25 short rounds; each figure is the best
/// round (what one undisturbed core does: the machine may be shared) with the median beside it.
/// GB/s of payload. `best` is the kernel whose figures are `fused_gb_per_s` and `crc_only_gb_per_s`.
fn crc_point(frame: usize, dur: Duration, best: pmrxe_crc::Kernel) -> Value {
    const MSG: usize = 256 * 1024;
    const BUFS: usize = 32;
    const STRIDE: usize = 9216;
    const OFF: usize = 128;
    const ROUNDS: u32 = 25;
    type Op<'a> = Box<dyn FnMut(&[u8], &mut [u8]) -> u32 + 'a>;
    let mut src = vec![0u8; MSG + 4096];
    let s0 = (4096 - src.as_ptr() as usize % 4096) % 4096;
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(7);
    }
    let mut dst = vec![0u8; BUFS * STRIDE + 64];
    let d0 = (64 - dst.as_ptr() as usize % 64) % 64;
    let slice = dur / ROUNDS;
    let mut ops: Vec<(String, Op)> = Vec::new();
    for k in pmrxe_crc::Kernel::available() {
        ops.push((format!("fused/{}", k.name()), Box::new(move |s: &[u8], d: &mut [u8]| k.copy_and_crc(0, d, s))));
        ops.push((format!("crc/{}", k.name()), Box::new(move |s: &[u8], _: &mut [u8]| k.crc_update(0, s))));
    }
    ops.push(("crc32fast".into(), Box::new(|s, _| crc32fast::hash(s))));
    // glibc's memcpy itself (`copy_from_slice` may be inlined for a constant length).
    ops.push(("memcpy".into(), Box::new(move |s, d| {
        // SAFETY: `s` and `d` are distinct slices of `frame` bytes each.
        unsafe { std::ptr::copy_nonoverlapping(std::hint::black_box(s.as_ptr()), d.as_mut_ptr(), frame) };
        u32::from(d[0])
    })));
    ops.push(("memcpy_then_crc32fast".into(), Box::new(|s, d| {
        d.copy_from_slice(s);
        crc32fast::hash(d)
    })));
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); ops.len()];
    let mut acc = 0u32;
    for _ in 0..ROUNDS {
        for (i, (_, f)) in ops.iter_mut().enumerate() {
            let mut n = 0usize;
            let t0 = Instant::now();
            while t0.elapsed() < slice {
                for k in 0..BUFS * 4 {
                    let s = &src[s0 + (k * frame) % MSG..][..frame];
                    let d = &mut dst[d0 + (k % BUFS) * STRIDE + OFF..][..frame];
                    acc ^= f(std::hint::black_box(s), d);
                }
                n += BUFS * 4;
            }
            samples[i].push((n * frame) as f64 / t0.elapsed().as_secs_f64() / 1e9);
        }
    }
    std::hint::black_box(acc);
    let stat = |i: usize| {
        let mut v = samples[i].clone();
        v.sort_by(f64::total_cmp);
        (v[v.len() - 1], v[v.len() / 2])
    };
    let by = |name: &str| ops.iter().position(|(n, _)| n == name).map(stat).unwrap_or((0.0, 0.0));
    let (mut fused_by, mut fused_med_by, mut crc_by) = (serde_json::Map::new(), serde_json::Map::new(), serde_json::Map::new());
    for (i, (n, _)) in ops.iter().enumerate() {
        if let Some(k) = n.strip_prefix("fused/") {
            fused_by.insert(k.to_string(), json!(stat(i).0));
            fused_med_by.insert(k.to_string(), json!(stat(i).1));
        } else if let Some(k) = n.strip_prefix("crc/") {
            crc_by.insert(k.to_string(), json!(stat(i).0));
        }
    }
    let (fused, fused_med) = by(&format!("fused/{}", best.name()));
    json!({
        "frame": frame,
        "kernel": best.name(),
        "rounds": ROUNDS,
        "fused_gb_per_s": fused,
        "fused_median_gb_per_s": fused_med,
        "fused_by_kernel_gb_per_s": fused_by,
        "fused_median_by_kernel_gb_per_s": fused_med_by,
        "crc_only_gb_per_s": by(&format!("crc/{}", best.name())).0,
        "crc_only_by_kernel_gb_per_s": crc_by,
        "crc32fast_gb_per_s": by("crc32fast").0,
        "crc32fast_median_gb_per_s": by("crc32fast").1,
        "memcpy_gb_per_s": by("memcpy").0,
        "memcpy_median_gb_per_s": by("memcpy").1,
        "memcpy_then_crc32fast_gb_per_s": by("memcpy_then_crc32fast").0,
        "memcpy_then_crc32fast_median_gb_per_s": by("memcpy_then_crc32fast").1,
        "loopback_ceiling_gb_per_s": fused / 2.0,
    })
}

fn print_crc(v: &Value) {
    let g = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let cal = &v["calibration"];
    println!("CRC kernels built: {}; on this CPU: {}", pmrxe_crc::Kernel::all_names().join(" "), v["kernels_available"].as_array().into_iter().flatten().filter_map(Value::as_str).collect::<Vec<_>>().join(" "));
    print!("calibration at {} B ({} ms), copy_and_crc GB/s:", cal["frame"], cal["budget_ms"]);
    for (k, x) in cal["gb_per_s"].as_object().into_iter().flatten() {
        print!("  {k} {:.2}", x.as_f64().unwrap_or(0.0));
    }
    println!();
    println!("  fastest {}; chosen {}{}", cal["fastest"].as_str().unwrap_or("?"), cal["chosen"].as_str().unwrap_or("?"), match cal["forced"].as_str() {
        Some(f) => format!(" (forced by PMRXE_CRC_KERNEL={f})"),
        None => String::new(),
    });
    println!("byte-work limits, one core (GB/s of payload), best of {} interleaved rounds (median in brackets)", v["rounds"]);
    let points: Vec<&Value> = v["by_frame"].as_array().map(|a| a.iter().collect()).unwrap_or_else(|| vec![v]);
    print!("  {:<28}", "frame (bytes)");
    for p in &points {
        print!(" {:>16}", p["frame"].as_u64().unwrap_or(0));
    }
    println!();
    let row = |label: &str, f: &dyn Fn(&Value) -> String| {
        print!("  {label:<28}");
        for p in &points {
            print!(" {:>16}", f(p));
        }
        println!();
    };
    let pair = |a: f64, b: f64| format!("{a:.2} ({b:.2})");
    for k in v["fused_by_kernel_gb_per_s"].as_object().into_iter().flatten().map(|(k, _)| k) {
        let mark = if Some(k.as_str()) == v["kernel"].as_str() { "*" } else { " " };
        row(&format!("fused copy+CRC {k}{mark}"), &|p| pair(g(&p["fused_by_kernel_gb_per_s"], k), g(&p["fused_median_by_kernel_gb_per_s"], k)));
    }
    for k in v["crc_only_by_kernel_gb_per_s"].as_object().into_iter().flatten().map(|(k, _)| k) {
        row(&format!("CRC only {k}"), &|p| format!("{:.2}", g(&p["crc_only_by_kernel_gb_per_s"], k)));
    }
    row("crc32fast", &|p| pair(g(p, "crc32fast_gb_per_s"), g(p, "crc32fast_median_gb_per_s")));
    row("memcpy", &|p| pair(g(p, "memcpy_gb_per_s"), g(p, "memcpy_median_gb_per_s")));
    row("memcpy, then crc32fast", &|p| pair(g(p, "memcpy_then_crc32fast_gb_per_s"), g(p, "memcpy_then_crc32fast_median_gb_per_s")));
    println!("  (* the chosen kernel) fused at 4 KiB ({}) {:.2}; loopback ceiling (fused / 2) {:.2}", v["kernel"].as_str().unwrap_or("?"), g(v, "fused_gb_per_s"), g(v, "loopback_ceiling_gb_per_s"));
}

fn print_memcpy(v: &[Value]) {
    println!("copy limits, one core (GB/s): glibc memcpy, and an AVX2 load/store loop where the CPU has AVX2");
    println!("  {:>8} {:>10} {:>10}", "size", "memcpy", "avx2 loop");
    for m in v {
        let avx = m["avx2_loop_gb_per_s"].as_f64().map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
        println!("  {:>8} {:>10.3} {:>10}", m["size"], m["gb_per_s"].as_f64().unwrap_or(0.0), avx);
    }
}
