//! DPDK tests. EAL can initialise only once per process, so every test re-executes this test
//! binary as a child process (`child_entry`, selected by `PMRXE_PORT_CHILD`) with its own
//! `--file-prefix`, `--no-huge` and `-m 256`. Works under `cargo test` and `cargo nextest`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pmrxe_config::{Config, MacAddr, SystemInfo, DEFAULT_LOOPBACK};
use pmrxe_port::{
    open_ports, port_test, ArrayVec, Burst, Eal, EalConfig, Mbuf, Port, PortError,
};

const CHILD_ENV: &str = "PMRXE_PORT_CHILD";
const CFG_ENV: &str = "PMRXE_PORT_CHILD_CFG";
const FRAMES: u64 = 20_000;

fn sys() -> SystemInfo {
    SystemInfo::probe()
}

/// The loopback config with a unique file prefix.
fn loopback_cfg(tag: &str) -> String {
    DEFAULT_LOOPBACK.replacen(
        "in_memory = false",
        &format!("in_memory = false\nfile_prefix = \"pmrxe-t{}-{tag}\"", std::process::id()),
        1,
    )
}

/// Runs `child_entry` in a fresh process with `mode` and config text; returns the child.
fn spawn(mode: &str, cfg: &str, stdin: Stdio) -> Child {
    Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .env(CFG_ENV, cfg)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child test process")
}

/// Waits for `child` (killing it after `limit`), returns (success, stdout, stderr).
fn finish(mut child: Child, limit: Duration) -> (bool, String, String) {
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (status.is_some_and(|s| s.success()), out, err)
}

fn assert_child_ok(name: &str, (ok, out, err): (bool, String, String)) -> String {
    assert!(ok && out.contains("CHILD-OK"), "{name} child failed\n--- stdout\n{out}\n--- stderr\n{err}");
    out
}

// ---------------------------------------------------------------------------------------
// Child side
// ---------------------------------------------------------------------------------------

/// Entry point of child processes; a no-op in the parent test run.
#[test]
fn child_entry() {
    let Ok(mode) = std::env::var(CHILD_ENV) else { return };
    let text = std::env::var(CFG_ENV).expect("child config");
    let cfg = Config::parse_with(&text, &sys()).unwrap_or_else(|e| panic!("{e}"));
    match mode.as_str() {
        "ring" => child_ring(&cfg),
        "run" => {
            let r = port_test::run(&cfg, FRAMES).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(r.frames, FRAMES);
            assert_eq!(r.errors, 0);
            assert_eq!(r.bytes, FRAMES * 1024);
            println!("CHILD-OK {r}");
        }
        "rx" => {
            // Receiver: ready as soon as its port is up; exits after checking every frame.
            let r = port_test::run_receiver(&cfg, FRAMES).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(r.frames, FRAMES);
            println!("CHILD-OK {r}");
        }
        "tx" => child_tx(&cfg),
        other => panic!("unknown child mode {other}"),
    }
}

fn child_ring(cfg: &Config) {
    let eal = Eal::init(&EalConfig::from_config(cfg)).unwrap_or_else(|e| panic!("{e}"));
    // (1) A second init in the same process is a clear error.
    let again = Eal::init(&EalConfig::from_config(cfg)).unwrap_err();
    assert!(matches!(again, PortError::EalAlreadyInitialized), "{again}");
    assert!(again.to_string().contains("only once per process"));
    let runtime_dir = eal.runtime_dir().map(Path::to_path_buf).expect("file-prefix runtime dir");
    assert!(runtime_dir.exists());

    // (2) Both ring ports come up with the configured MACs and MTU.
    let mut ports = open_ports(cfg, &eal).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ports.len(), 2);
    let mut b = ports.pop().unwrap();
    let mut a = ports.pop().unwrap();
    assert_eq!(a.name(), "pmrxe0");
    assert_eq!(Port::mac(&a), cfg.ports[0].mac.unwrap());
    assert_eq!(Port::mac(&b), cfg.ports[1].mac.unwrap());
    assert_eq!(Port::mtu(&a), cfg.ports[0].mtu);
    assert!(a.link().up && b.link().up);
    assert!(a.for_queues(0, 0).is_none(), "queue 0 is owned by `a`");

    // (3) Mbuf primitives on real mbufs.
    let pool = a.mempool().clone();
    let mut m: Mbuf = pool.alloc().expect("mbuf");
    let head = m.headroom();
    assert!(m.is_empty() && head > 0);
    m.append(100).unwrap().fill(0xab);
    m.prepend(14).unwrap().fill(0x01);
    assert_eq!(m.len(), 114);
    assert_eq!(m.pkt_len(), 114);
    assert!(m.trim(4));
    assert!(m.adj(14));
    assert_eq!(m.data(), &[0xab; 96][..]);
    assert!(!m.trim(97));
    assert!(m.append(usize::from(u16::MAX)).is_none());
    // The single-segment fast paths keep DPDK's bounds: exactly the tailroom fits, one more
    // byte does not; the headroom likewise; pkt_len follows data_len.
    let room = m.tailroom();
    assert_eq!(m.append(room).map(|s| s.len()), Some(room));
    assert_eq!(m.tailroom(), 0);
    assert!(m.append(1).is_none());
    assert!(m.prepend(m.headroom() + 1).is_none());
    let hr = m.headroom();
    assert_eq!(m.prepend(hr).map(|s| s.len()), Some(hr));
    assert_eq!((m.headroom(), m.len(), m.pkt_len()), (0, 96 + room + hr, 96 + room + hr));
    assert!(m.trim(room + hr));
    assert_eq!(m.pkt_len(), 96);
    // open_aligned: a fresh mbuf opens with data byte 12 on a cache line, its start moved back
    // into the headroom (never past `keep`), all of its room as data; a non-empty one is
    // refused; one whose headroom cannot spare the move opens where it starts.
    let mut f: Mbuf = pool.alloc().expect("mbuf");
    let (head0, room0) = (f.headroom(), f.tailroom());
    let n = f.open_aligned(12, 62).map(|d| (d.as_ptr() as usize + 12) % 64);
    assert_eq!(n, Some(0));
    assert!(f.headroom() >= 62 && f.headroom() <= head0 && head0 - f.headroom() < 64);
    assert_eq!((f.tailroom(), f.len(), f.pkt_len()), (0, room0 + head0 - f.headroom(), room0 + head0 - f.headroom()));
    assert!(f.open_aligned(12, 62).is_none(), "not empty");
    assert!(f.trim(f.len()));
    let at = f.headroom();
    assert_eq!(f.open_aligned(12, at).map(|d| d.len()), Some(room0 + head0 - at), "no headroom to spare: start stays");
    assert_eq!(f.headroom(), at);
    drop(f);
    let raw = m.into_raw();
    // SAFETY: `raw` came from into_raw just above and is owned by nobody else.
    let m = unsafe { Mbuf::from_raw(raw) };
    drop(m);

    // (4) A registered non-EAL thread gets an lcore id and can allocate and send.
    let in_use_before = pool.in_use();
    let eal2 = eal.clone();
    let pool2 = pool.clone();
    std::thread::spawn(move || {
        let g = eal2.register_thread().unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(g.lcore_id(), u32::MAX);
        assert_eq!(pmrxe_port::eal::lcore_id(), g.lcore_id());
        let mut v: ArrayVec<Mbuf, 8> = ArrayVec::new();
        assert_eq!(pool2.alloc_bulk(&mut v), 8);
    })
    .join()
    .unwrap();
    assert_eq!(pool.in_use(), in_use_before, "mbufs allocated by the thread were freed");

    // (5) Real frames through the ring pair, every byte checked, both directions.
    let r = port_test::run_pair(&mut a, "pmrxe0", &mut b, "pmrxe1", FRAMES, 1024).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((r.frames, r.bytes, r.errors), (FRAMES, FRAMES * 1024, 0));
    let r2 = port_test::run_pair(&mut b, "pmrxe1", &mut a, "pmrxe0", 1000, 1514).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r2.frames, 1000);
    let (sa, sb) = (a.stats().unwrap(), b.stats().unwrap());
    assert_eq!(sa.opackets, FRAMES);
    assert_eq!(sb.ipackets, FRAMES);
    assert_eq!(sb.opackets, 1000);
    assert_eq!(sa.ipackets, 1000);

    // (6) tx_burst on a full ring returns the unsent mbufs; none leak.
    let mut burst: Burst<Mbuf> = Burst::new();
    let mut sent = 0;
    loop {
        while !burst.is_full() {
            let mut m = pool.alloc().expect("pool sized for ring + burst");
            m.append(60).unwrap();
            burst.push(m);
        }
        let n = a.tx_burst(&mut burst);
        sent += n;
        if n < 32 {
            break;
        }
    }
    assert!(!burst.is_empty(), "ring filled up");
    let unsent = burst.len();
    drop(burst);
    let mut rx: Burst<Mbuf> = Burst::new();
    let mut got = 0;
    while b.rx_burst(&mut rx) > 0 {
        got += rx.len();
        rx.clear();
    }
    assert_eq!(got, sent, "every accepted frame arrives ({unsent} were returned unsent)");
    assert_eq!(pool.in_use(), 0, "no mbuf leaked");

    drop((a, b, pool));
    drop(eal);
    assert!(!runtime_dir.exists(), "runtime dir {} removed on cleanup", runtime_dir.display());
    // (7) Still an error after cleanup: EAL never re-initialises.
    assert!(matches!(Eal::init(&EalConfig::from_config(cfg)), Err(PortError::EalAlreadyInitialized)));
    println!("CHILD-OK {r}");
}

fn child_tx(cfg: &Config) {
    let eal = Eal::init(&EalConfig::from_config(cfg)).unwrap_or_else(|e| panic!("{e}"));
    let mut ports = open_ports(cfg, &eal).unwrap_or_else(|e| panic!("{e}"));
    let mut p = ports.remove(0);
    port_test::wait_link_up(&p, Duration::from_secs(15)).unwrap_or_else(|e| panic!("{e}"));
    let r = port_test::send(&mut p, "tx", MacAddr::BROADCAST, FRAMES, 1024).unwrap_or_else(|e| panic!("{e}"));
    println!("SENT {r}");
    // Keep the memif region alive until the parent says the receiver is done (stdin EOF):
    // a memif peer must not disconnect while the other side is still polling.
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(p);
    drop(ports);
    drop(eal);
    println!("CHILD-OK {r}");
}

// ---------------------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------------------

/// (a) Two ring-pair ports in one EAL move real frames; bytes, order, stats, mbuf
/// accounting, thread registration, once-only init and cleanup are all checked.
#[test]
fn ring_pair_moves_real_frames() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let out = assert_child_ok("ring", finish(spawn("ring", &loopback_cfg("ring"), Stdio::null()), Duration::from_secs(60)));
    assert!(out.contains("frames/s"), "{out}");
}

/// `port_test::run` on the loopback config (what `pmrxe port-test` runs).
#[test]
fn port_test_run_on_loopback() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let out = assert_child_ok("run", finish(spawn("run", &loopback_cfg("run"), Stdio::null()), Duration::from_secs(60)));
    assert!(out.contains(&format!("{FRAMES} frames of 1024 B")), "{out}");
}

fn memif_cfg(role: &str, socket: &Path, main_core: u32) -> String {
    let other = 1 - main_core.min(1);
    format!(
        r#"
[eal]
memory_mb = 256
file_prefix = "pmrxe-t{pid}-memif-{role}"
[lcores]
cores = [{other}]
main_core = {main_core}
[[ports]]
name = "pmrxe0"
devargs = "net_memif0,role={role},socket={sock},socket-abstract=no,id=0"
mac = "02:00:00:00:aa:{mac}"
"#,
        pid = std::process::id(),
        sock = socket.display(),
        mac = if role == "server" { "01" } else { "02" },
    )
}

/// (b) Two processes over net_memif: the server receives and verifies every frame, the
/// client sends. Shutdown order: the server finishes and exits first, then the client is
/// released (a memif server can crash if its client vanishes mid-poll, PLATFORM.md §2).
#[test]
fn memif_two_processes() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    if SystemInfo::probe().cpus < 2 {
        println!("skipped: memif test needs 2 CPUs");
        return;
    }
    let dir = PathBuf::from(format!("/tmp/pmrxe-port-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("memif.sock");
    let server = spawn("rx", &memif_cfg("server", &sock, 0), Stdio::null());
    // The client needs the server's socket to exist before it starts.
    let start = Instant::now();
    while !sock.exists() && start.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut client = spawn("tx", &memif_cfg("client", &sock, 1), Stdio::piped());
    let client_stdin = client.stdin.take();
    let server_result = finish(server, Duration::from_secs(30));
    drop(client_stdin); // EOF: the client may now disconnect and exit
    let client_result = finish(client, Duration::from_secs(15));
    let _ = std::fs::remove_dir_all(&dir);
    let out = assert_child_ok("memif server (rx)", server_result);
    assert!(out.contains(&format!("{FRAMES} frames")), "{out}");
    let cout = assert_child_ok("memif client (tx)", client_result);
    assert!(cout.contains("SENT"), "{cout}");
}
