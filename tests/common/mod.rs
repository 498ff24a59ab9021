//! Helpers for the integration tests that start the REAL service (`pmrxe serve`) and drive
//! unmodified Debian verbs binaries (rdma-core's ibv_* examples, perftest) through the shim
//! with `pmrxe run --`.
//!
//! * [`Service`]: a private service (own `PMRXE_SOCKET` in a private temp dir, optionally
//!   inside a network namespace), ready once `pmrxe stats` answers; SIGTERM on drop, and the
//!   drop asserts a clean exit (status 0 within 5 s).
//! * [`run_pair`]: a verbs server/client pair, server first (the client is started only once
//!   the server listens on its TCP port, read from `/proc/<pid>/net/tcp*`), both bounded by a
//!   timeout, outputs captured.
//! * [`heavy_lock`]: an flock on `/tmp/pmrxe-itest.lock` that serialises the tests that start
//!   a service (2-core machine, cargo runs tests in parallel, and each service pins CPU 1).
//! * [`require_tool`]: a missing binary fails the test with a message naming its Debian package
//!   and `scripts/setup.sh` (which installs every one of them: CI never skips a test for a
//!   missing tool);
//! * [`icrc_check`]: the project's independent ICRC checker, `scripts/lib/icrc_check.py`.
#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub mod raw;

/// The `pmrxe` binary under test.
pub fn pmrxe_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pmrxe"))
}

/// The shim next to the binary (built by `cargo build --release --workspace`).
pub fn shim_path() -> PathBuf {
    let p = pmrxe_bin().parent().expect("binary dir").join("libpmrxe_verbs.so");
    assert!(
        p.exists(),
        "the verbs shim {} is missing: build the whole workspace first \
         (`cargo build --release --workspace`, as scripts/test.sh does)",
        p.display()
    );
    p
}

/// The repository root (configs/, scripts/).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Debian package of each program the tests spawn (scripts/setup.sh installs them all).
const TOOL_PACKAGES: &[(&str, &str)] = &[
    ("cc", "gcc"),
    ("ibv_", "ibverbs-utils"),
    ("ib_", "perftest"),
    ("run_perftest_loopback", "perftest"),
    ("rping", "rdmacm-utils"),
    ("ucmatose", "rdmacm-utils"),
    ("udaddy", "rdmacm-utils"),
    ("rdma_server", "rdmacm-utils"),
    ("rstream", "rdmacm-utils"),
    ("cmtime", "rdmacm-utils"),
    ("mckey", "rdmacm-utils"),
    ("qperf", "qperf"),
    ("ucx_", "ucx-utils"),
    ("fi_", "libfabric-bin"),
    ("mpicc", "libopenmpi-dev"),
    ("mpirun", "openmpi-bin"),
    ("tshark", "tshark"),
    ("python3", "python3"),
    ("ip", "iproute2"),
    ("tc", "iproute2"),
    ("strace", "strace"),
    ("setpriv", "util-linux"),
    ("userdel", "passwd"),
    ("groupdel", "passwd"),
    ("useradd", "passwd"),
    ("groupadd", "passwd"),
    ("systemd-analyze", "systemd"),
    ("fio", "fio"),
    ("iperf", "iperf"),
    ("sockperf", "sockperf"),
    ("mpicc.mpich", "libmpich-dev"),
    ("mpiexec.mpich", "mpich"),
    ("hpcc", "hpcc"),
    ("tgtd", "tgt"),
    ("tgtadm", "tgt"),
    ("iscsi-inq", "libiscsi-bin"),
    ("slurmctld", "slurm-wlm"),
    ("slurmd", "slurm-wlm"),
    ("srun", "slurm-wlm"),
    ("sinfo", "slurm-wlm"),
    ("munged", "munge"),
    ("unshare", "util-linux"),
];

/// The Debian package that provides `name` (exact name, or a prefix such as `ibv_`).
fn tool_package(name: &str) -> &'static str {
    TOOL_PACKAGES
        .iter()
        .find(|(t, _)| *t == name || (t.ends_with('_') && name.starts_with(t)))
        .map_or("(see scripts/setup.sh)", |(_, p)| p)
}

/// Compile the C program `src` (relative to the repository) into `out` with `compiler` (`cc`,
/// `mpicc`), `-O2 -Wall -Werror`, linking `libs`.
pub fn compile_c(src: &str, out: &Path, compiler: &Path, libs: &[&str]) {
    let o = Command::new(compiler).args(["-O2", "-Wall", "-Werror", "-o"]).arg(out).arg(repo_root().join(src)).args(libs).output().unwrap();
    assert!(o.status.success(), "{} {src}: {}", compiler.display(), String::from_utf8_lossy(&o.stderr));
}

/// Absolute path of a program in PATH, or a test failure naming its Debian package and
/// scripts/setup.sh.
pub fn require_tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path).chain(["/usr/sbin".into(), "/sbin".into()]) {
        let p = dir.join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!("required program `{name}` is not installed: Debian package {} (scripts/setup.sh installs it)", tool_package(name));
}

/// Run the project's own ICRC and header checker (`scripts/lib/icrc_check.py`, Python standard
/// library only, independent of pmrxe's code) on `pcap` with `args` (`-v`, `--strict-pad`,
/// `--check-ip-csum`); returns (exit status 0, stdout + stderr). Fails the test if python3 or
/// the checker is missing.
pub fn icrc_check(pcap: &Path, args: &[&str]) -> (bool, String) {
    let checker = repo_root().join("scripts/lib/icrc_check.py");
    assert!(checker.is_file(), "the ICRC checker {} is missing from the repository", checker.display());
    let o = Command::new(require_tool("python3")).arg(&checker).args(args).arg(pcap).output().expect("run python3");
    (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

/// Fail unless running as root (namespaces, strace of another process, /var/run/dpdk).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root (CI runs as root)");
}

/// Exclusive lock serialising the heavy tests across test binaries and threads.
pub struct HeavyLock(File);

pub fn heavy_lock() -> HeavyLock {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/tmp/pmrxe-itest.lock")
        .expect("open /tmp/pmrxe-itest.lock");
    // SAFETY: flock on a valid fd owned by `f`.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return HeavyLock(f);
    }
    let t0 = Instant::now();
    // SAFETY: flock on a valid fd owned by `f`.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(r, 0, "flock /tmp/pmrxe-itest.lock: {}", std::io::Error::last_os_error());
    eprintln!("waited {:.1} s for /tmp/pmrxe-itest.lock (another heavy test held it)", t0.elapsed().as_secs_f64());
    HeavyLock(f)
}

/// A private temporary directory, removed on drop (short path: it holds Unix sockets).
pub struct TempDir(PathBuf);

static SEQ: AtomicU32 = AtomicU32::new(0);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("pmrxe-it-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("PMRXE_KEEP_TMP").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Wait for `child` at most `limit`; on timeout SIGKILL it and return `None`.
pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return Some(s);
        }
        if t0.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run `work` while another thread calls `sample` every `period` (first at once), until `work`
/// returns: counters read from a service during a run.
pub fn sample_during<R>(period: Duration, mut sample: impl FnMut() + Send, work: impl FnOnce() -> R) -> R {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || loop {
            sample();
            if !matches!(stopped.recv_timeout(period), Err(std::sync::mpsc::RecvTimeoutError::Timeout)) {
                break;
            }
        });
        let r = work();
        drop(stop);
        r
    })
}

/// Poll `cond` until it holds; fails the test naming `what` if it does not within `limit`. The
/// one poll loop of the integration tests (a short pause between polls, never a fixed wait).
pub fn wait_until(limit: Duration, what: &str, cond: impl FnMut() -> bool) {
    assert!(poll_until(limit, cond), "{what}: not within {limit:?}");
}

/// Poll `cond` until it holds (true) or `limit` passes (false): for callers that explain a
/// failure with what they saw last.
pub fn poll_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while !cond() {
        if t0.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10)); // poll interval of a bounded condition wait
    }
    true
}

pub fn sigterm(pid: u32) {
    // SAFETY: kill(2) with a pid we spawned.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
}

/// Give a child SIGINT's default action back before exec, so [`sigint`] reaches it as Ctrl-C
/// from a terminal would, even when the test run was started in the background by a
/// non-interactive shell (which starts it with SIGINT ignored; an ignored signal stays
/// ignored across exec).
pub fn default_sigint(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only signal(2) runs, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        })
    }
}

pub fn sigint(pid: u32) {
    // SAFETY: kill(2) with a pid we spawned.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
}

pub fn read_to_string_lossy(p: &Path) -> String {
    let mut v = Vec::new();
    if let Ok(mut f) = File::open(p) {
        let _ = f.read_to_end(&mut v);
    }
    String::from_utf8_lossy(&v).into_owned()
}

/// Last `n` lines of a text, indented, for failure messages.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    let from = lines.len().saturating_sub(n);
    lines[from..].iter().map(|l| format!("    | {l}\n")).collect()
}

/// `HugePages_Free` from /proc/meminfo.
pub fn hugepages_free() -> u64 {
    let m = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    m.lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:").map(|v| v.trim().parse().unwrap_or(0)))
        .unwrap_or(0)
}

/// A running private `pmrxe serve`.
pub struct Service {
    pub child: Option<Child>,
    pub pid: u32,
    pub socket: PathBuf,
    pub log: PathBuf,
    pub dir: TempDir,
    /// Network namespace the service runs in (verbs programs run in the root namespace and
    /// reach it through the socket file, which is shared: only the mount of /sys differs).
    pub netns: Option<String>,
}

/// How long a service may take to answer `pmrxe stats` (EAL init on a loaded 2-core box).
const START_TIMEOUT: Duration = Duration::from_secs(30);

impl Service {
    /// Start `pmrxe serve` with the embedded loopback configuration.
    pub fn start_loopback() -> Service {
        Service::start(None, None)
    }

    /// Start `pmrxe serve [--config CONFIG]`, optionally inside `ip netns exec NETNS`.
    pub fn start(config: Option<&Path>, netns: Option<&str>) -> Service {
        let _ = shim_path();
        let dir = TempDir::new("svc");
        let socket = dir.join("pmrxe.sock");
        let log = dir.join("service.log");
        let logf = File::create(&log).expect("service log");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new(require_tool("ip"));
                c.args(["netns", "exec", ns]).arg(pmrxe_bin());
                c
            }
            None => Command::new(pmrxe_bin()),
        };
        cmd.arg("serve");
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        cmd.env("PMRXE_SOCKET", &socket)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf);
        let child = cmd.spawn().expect("spawn pmrxe serve");
        let pid = child.id(); // `ip netns exec` execs the program: same pid
        let mut s = Service { child: Some(child), pid, socket, log, dir, netns: netns.map(str::to_string) };
        let t0 = Instant::now();
        loop {
            if let Some(st) = s.child.as_mut().unwrap().try_wait().unwrap() {
                s.child = None;
                panic!(
                    "pmrxe serve {:?} exited during start-up ({st}); log:\n{}",
                    config,
                    tail(&read_to_string_lossy(&s.log), 30)
                );
            }
            if s.socket.exists() {
                let out = s.pmrxe().arg("stats").output().expect("pmrxe stats");
                if out.status.success() {
                    break;
                }
            }
            if t0.elapsed() > START_TIMEOUT {
                let l = read_to_string_lossy(&s.log);
                panic!("pmrxe serve {:?} not ready after {:?}; log:\n{}", config, START_TIMEOUT, tail(&l, 30));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("service pid {pid} ready after {:.1} s (socket {})", t0.elapsed().as_secs_f64(), s.socket.display());
        s
    }

    /// A `pmrxe` command aimed at this service (PMRXE_SOCKET set).
    pub fn pmrxe(&self) -> Command {
        pmrxe_at(&self.socket)
    }

    /// `pmrxe stats` (text).
    pub fn stats_text(&self) -> String {
        let o = self.pmrxe().arg("stats").output().expect("pmrxe stats");
        assert!(o.status.success(), "pmrxe stats failed: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `pmrxe stats --json`, parsed (panics with the text if it is not JSON).
    pub fn stats_json(&self) -> serde_json::Value {
        let o = self.pmrxe().args(["stats", "--json"]).output().expect("pmrxe stats --json");
        assert!(o.status.success(), "pmrxe stats --json failed: {}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8_lossy(&o.stdout);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("pmrxe stats --json is not JSON ({e}):\n{text}"))
    }

    pub fn log_text(&self) -> String {
        read_to_string_lossy(&self.log)
    }

    /// Start `pmrxe capture ARGS --out PCAP` (stderr to `cap.err` in the service's directory)
    /// and wait (10 s at most) until the service reports the capture active.
    pub fn capture(&self, args: &[&str], pcap: &Path) -> Child {
        let err = self.dir.join("cap.err");
        let mut cap = self
            .pmrxe()
            .arg("capture")
            .args(args)
            .arg("--out")
            .arg(pcap)
            .stdout(Stdio::null())
            .stderr(File::create(&err).unwrap())
            .spawn()
            .unwrap();
        wait_until(Duration::from_secs(10), "pmrxe capture becoming active", || {
            assert!(cap.try_wait().unwrap().is_none(), "pmrxe capture exited: {}", read_to_string_lossy(&err));
            self.stats_json()["capture"]["active"] == serde_json::json!(true)
        });
        cap
    }

    /// SIGTERM and wait up to `limit`; returns the exit status and the time it took, or
    /// panics (after SIGKILL) if the service outlived `limit`.
    pub fn stop_within(&mut self, limit: Duration) -> (ExitStatus, Duration) {
        let mut child = self.child.take().expect("service already stopped");
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the service had already exited ({st}) before SIGTERM; log:\n{}", tail(&self.log_text(), 30));
        }
        let t0 = Instant::now();
        sigterm(self.pid);
        match wait_timeout(&mut child, limit) {
            Some(st) => (st, t0.elapsed()),
            None => panic!(
                "the service (pid {}) ignored SIGTERM for {limit:?} and was killed; log:\n{}",
                self.pid,
                tail(&self.log_text(), 30)
            ),
        }
    }

    /// SIGTERM, wait up to 5 s, assert exit status 0.
    pub fn stop(&mut self) {
        let (st, _) = self.stop_within(Duration::from_secs(5));
        assert!(st.success(), "the service exited with {st} after SIGTERM; log:\n{}", tail(&self.log_text(), 30));
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        if std::thread::panicking() {
            // Already failing: just make sure nothing is left running.
            let mut c = self.child.take().unwrap();
            sigterm(self.pid);
            if wait_timeout(&mut c, Duration::from_secs(5)).is_none() {
                eprintln!("service pid {} needed SIGKILL", self.pid);
            }
            eprintln!("service log:\n{}", tail(&self.log_text(), 40));
            return;
        }
        self.stop();
    }
}

/// Where a verbs program runs: which service (socket) it talks to.
#[derive(Clone, Copy)]
pub struct Side<'a> {
    pub service: &'a Service,
}

/// Output of one finished verbs program.
#[derive(Debug)]
pub struct ProgOutput {
    pub cmdline: String,
    /// `None`: killed after the timeout.
    pub status: Option<ExitStatus>,
    pub output: String,
}

impl ProgOutput {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
    pub fn describe(&self) -> String {
        let st = match self.status {
            Some(s) => s.to_string(),
            None => "TIMED OUT (killed)".into(),
        };
        format!("`{}` -> {st}; output:\n{}", self.cmdline, tail(&self.output, 25))
    }
}

/// Output of a server/client pair.
#[derive(Debug)]
pub struct PairOutput {
    pub server: ProgOutput,
    pub client: ProgOutput,
}

impl PairOutput {
    /// Assert both sides exited 0.
    pub fn assert_ok(&self) -> &Self {
        assert!(
            self.server.ok() && self.client.ok(),
            "verbs pair failed\nSERVER {}\nCLIENT {}",
            self.server.describe(),
            self.client.describe()
        );
        self
    }
}

/// `pmrxe` talking to the service at `socket` (`PMRXE_SOCKET`), stdin from /dev/null.
pub fn pmrxe_at(socket: &Path) -> Command {
    let mut c = Command::new(pmrxe_bin());
    c.env("PMRXE_SOCKET", socket).stdin(Stdio::null());
    c
}

/// [`pmrxe_at`] run as `user` when given: `setpriv` switches to that user's uid, gid and
/// groups (no capabilities: what a login of that user has) and execs `pmrxe`, so the child's
/// pid is the program's; HOME points at a directory anyone may use.
pub fn pmrxe_as(socket: &Path, user: Option<&str>) -> Command {
    let Some(u) = user else { return pmrxe_at(socket) };
    let mut c = Command::new(require_tool("setpriv"));
    c.args(["--reuid", u, "--regid", u, "--init-groups", "--"]).arg(for_all_users().join("pmrxe"));
    c.env("PMRXE_SOCKET", socket).env("HOME", "/tmp").stdin(Stdio::null());
    c
}

/// Start `pmrxe run -- ARGS` against `svc` with output to `out` (stdout+stderr).
pub fn spawn_verbs(svc: &Service, args: &[&str], out: &Path) -> Child {
    spawn_verbs_at(&svc.socket, args, out)
}

/// [`spawn_verbs`] for the service at `socket` (from a thread that does not hold the [`Service`]).
pub fn spawn_verbs_at(socket: &Path, args: &[&str], out: &Path) -> Child {
    spawn_verbs_as(socket, None, args, out)
}

/// [`spawn_verbs_at`] as `user` ([`pmrxe_as`]).
pub fn spawn_verbs_as(socket: &Path, user: Option<&str>, args: &[&str], out: &Path) -> Child {
    let f = File::create(out).expect("output file");
    pmrxe_as(socket, user)
        .arg("run")
        .arg("--")
        .args(args)
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn pmrxe run -- {args:?}: {e}"))
}

/// Run a single verbs program under `pmrxe run --` to completion (bounded by `limit`).
pub fn run_verbs(svc: &Service, args: &[&str], limit: Duration) -> ProgOutput {
    let out = svc.dir.join(&format!("prog{}.out", SEQ.fetch_add(1, Ordering::Relaxed)));
    let mut c = spawn_verbs(svc, args, &out);
    let status = wait_timeout(&mut c, limit);
    ProgOutput { cmdline: args.join(" "), status, output: read_to_string_lossy(&out) }
}

/// Socket inodes of `pid` that listen on TCP `port` (any address), read from the process's
/// own network namespace view (/proc/PID/net/tcp and tcp6).
pub fn listens_on(pid: u32, port: u16) -> bool {
    let want = format!(":{port:04X}");
    for f in ["tcp", "tcp6"] {
        let text = read_to_string_lossy(Path::new(&format!("/proc/{pid}/net/{f}")));
        for l in text.lines().skip(1) {
            let cols: Vec<&str> = l.split_whitespace().collect();
            if cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A" {
                return true;
            }
        }
    }
    false
}

/// Distinct TCP ports for the out-of-band exchange of each test (perftest and
/// ibv_rc_pingpong both default to 18515).
pub fn port_for(test_index: u16) -> u16 {
    19000 + test_index
}

/// Run a verbs server/client pair: the server (under `pmrxe run --` against `server_svc`)
/// first; the client is started once the server listens on TCP `port`; each bounded by
/// `limit`. The caller's argument lists must already contain `-p PORT`.
pub fn run_pair_on(
    server_svc: &Service,
    server: &[&str],
    client_svc: &Service,
    client: &[&str],
    port: u16,
    limit: Duration,
) -> PairOutput {
    run_pair_as(server_svc, server, client_svc, client, None, port, limit)
}

/// [`run_pair_on`] with both programs run as `user` ([`pmrxe_as`]).
pub fn run_pair_as(
    server_svc: &Service,
    server: &[&str],
    client_svc: &Service,
    client: &[&str],
    user: Option<&str>,
    port: u16,
    limit: Duration,
) -> PairOutput {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let so = server_svc.dir.join(&format!("pair{n}.server.out"));
    let co = client_svc.dir.join(&format!("pair{n}.client.out"));
    let t0 = Instant::now();
    let mut s = spawn_verbs_as(&server_svc.socket, user, server, &so);
    // `pmrxe run` execs the program: the pid is the verbs server itself.
    let mut early = None;
    loop {
        if let Some(st) = s.try_wait().unwrap() {
            early = Some(st);
            break;
        }
        if listens_on(s.id(), port) {
            break;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            break; // start the client anyway; it will fail to connect and say so
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(st) = early {
        let server_out = ProgOutput { cmdline: server.join(" "), status: Some(st), output: read_to_string_lossy(&so) };
        panic!("the verbs server exited before listening on port {port}: {}", server_out.describe());
    }
    let mut c = spawn_verbs_as(&client_svc.socket, user, client, &co);
    let cs = wait_timeout(&mut c, limit);
    let left = limit.saturating_sub(t0.elapsed()).max(Duration::from_secs(5));
    let ss = wait_timeout(&mut s, left);
    PairOutput {
        server: ProgOutput { cmdline: server.join(" "), status: ss, output: read_to_string_lossy(&so) },
        client: ProgOutput { cmdline: client.join(" "), status: cs, output: read_to_string_lossy(&co) },
    }
}

/// [`run_pair_on`] with both sides on one (loopback) service.
pub fn run_pair(svc: &Service, server: &[&str], client: &[&str], port: u16, limit: Duration) -> PairOutput {
    run_pair_on(svc, server, svc, client, port, limit)
}

/// One HTTP request to 127.0.0.1:`port` (the metrics endpoint); returns (status line, headers+body as text).
pub fn http(port: u16, req: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connect 127.0.0.1:{port}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    (out.lines().next().unwrap_or("").to_string(), out)
}

/// The body of `GET /metrics` (asserting 200 and the Prometheus text content type).
pub fn scrape(port: u16) -> String {
    let (status, out) = http(port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK", "{out}");
    assert!(out.contains("Content-Type: text/plain; version=0.0.4"), "{out}");
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

/// Value of the first sample whose name and labels start with `prefix`
/// (`pmrxe_lcore_rx_packets_total{lcore="0"}`).
pub fn value(body: &str, prefix: &str) -> Option<f64> {
    body.lines().filter(|l| !l.starts_with('#')).find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// `ibv_rc_pingpong -n ITERS` between the devices of one service (server on pmrxe0, client on
/// pmrxe1 reaching it at 127.0.0.1, GID index 1) on TCP port `port`, bounded by `limit`.
pub fn loopback_pingpong(svc: &Service, iters: u32, port: u16, limit: Duration) -> PairOutput {
    let (n, ps) = (iters.to_string(), port.to_string());
    run_pair(
        svc,
        &["ibv_rc_pingpong", "-d", "pmrxe0", "-g", "1", "-n", &n, "-p", &ps],
        &["ibv_rc_pingpong", "-d", "pmrxe1", "-g", "1", "-n", &n, "-p", &ps, "127.0.0.1"],
        port,
        limit,
    )
}

/// ibv_rc_pingpong figures: (Mbit/sec, usec/iter) from
/// "N bytes in S seconds = X Mbit/sec" and "N iters in S seconds = Y usec/iter".
pub fn parse_pingpong(out: &str) -> Option<(f64, f64)> {
    let mut mbit = None;
    let mut usec = None;
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() >= 8 && w[1] == "bytes" && w[7] == "Mbit/sec" {
            mbit = w[6].parse().ok();
        }
        if w.len() >= 8 && w[1] == "iters" && w[7] == "usec/iter" {
            usec = w[6].parse().ok();
        }
    }
    Some((mbit?, usec?))
}

/// perftest result rows: lines whose columns are all numbers, starting with #bytes.
pub fn perftest_rows(out: &str) -> Vec<Vec<f64>> {
    out.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() < 4 {
                return None;
            }
            let v: Option<Vec<f64>> = w.iter().map(|x| x.parse::<f64>().ok()).collect();
            let v = v?;
            (v[0] >= 1.0 && v[0].fract() == 0.0 && v[1] >= 1.0).then_some(v)
        })
        .collect()
}

/// Find `needle` in the host's process table: the tids of `pid` whose comm is `comm`.
pub fn threads_named(pid: u32, comm: &str) -> Vec<u32> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in rd.flatten() {
            let c = read_to_string_lossy(&e.path().join("comm"));
            if c.trim_end() == comm {
                if let Ok(t) = e.file_name().to_string_lossy().parse() {
                    v.push(t);
                }
            }
        }
    }
    v
}

/// Sum of an lcore counter over all lcores in a `pmrxe stats --json` value.
pub fn sum_counter(j: &serde_json::Value, name: &str) -> u64 {
    j["lcores"].as_array().expect("lcores array").iter().map(|l| l["counters"][name].as_u64().unwrap_or(0)).sum()
}

/// Wait (polling, at most `limit`) until `server` listens on TCP `port`; fail if it exits.
pub fn wait_listening(server: &mut Child, port: u16, out: &Path, limit: Duration) {
    let t0 = Instant::now();
    while !listens_on(server.id(), port) {
        assert!(server.try_wait().unwrap().is_none(), "server exited before listening: {}", read_to_string_lossy(out));
        assert!(t0.elapsed() < limit, "server never listened on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait (polling, at most `limit`) until the service transmitted more than `min_tx` frames;
/// returns the stats snapshot that showed it. `ctx` is printed on timeout.
pub fn wait_for_traffic(svc: &Service, min_tx: u64, limit: Duration, ctx: &Path) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let j = svc.stats_json();
        if sum_counter(&j, "tx_packets") > min_tx {
            return j;
        }
        assert!(t0.elapsed() < limit, "no traffic within {limit:?}:\n{}", read_to_string_lossy(ctx));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// rdma_cm listeners the service holds (`pmrxe stats --json`: `cm.listeners`).
pub fn cm_listeners(svc: &Service) -> u64 {
    svc.stats_json()["cm"]["listeners"].as_u64().unwrap_or(0)
}

/// Start an rdma_cm server under `pmrxe run --` (output to `out`) and wait, bounded, until the
/// service holds one more listener than before: rdma_cm servers listen on no TCP port, so this
/// is the condition a client can connect on (instead of a fixed sleep).
pub fn spawn_cm_server(svc: &Service, args: &[&str], out: &Path) -> Child {
    let before = cm_listeners(svc);
    let mut c = spawn_verbs(svc, args, out);
    let t0 = Instant::now();
    while cm_listeners(svc) <= before {
        if let Some(st) = c.try_wait().unwrap() {
            panic!("`{}` exited ({st}) before it listened:\n{}", args.join(" "), tail(&read_to_string_lossy(out), 25));
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "`{}` not listening after 30 s", args.join(" "));
        std::thread::sleep(Duration::from_millis(20)); // poll interval of a bounded condition wait
    }
    c
}

/// An rdma_cm server/client pair: the server first (until it listens), then the client; each
/// bounded by `limit`.
pub fn run_cm_pair(svc: &Service, server: &[&str], client: &[&str], limit: Duration) -> PairOutput {
    run_cm_pair_across(svc, svc, server, client, limit)
}

/// The CM's listeners and the REQs it rejected because nothing listened
/// (`cm.ports[*].rej_no_listener`), from one `pmrxe stats`.
pub fn cm_listeners_and_no_listener_rejects(svc: &Service) -> (u64, u64) {
    let j = svc.stats_json();
    let rejected = j["cm"]["ports"].as_array().map_or(0, |ps| ps.iter().map(|p| p["rej_no_listener"].as_u64().unwrap_or(0)).sum());
    (j["cm"]["listeners"].as_u64().unwrap_or(0), rejected)
}

/// [`run_cm_pair`] with the server on `server_svc` and the client on `client_svc`.
///
/// perftest's `-R` (Debian's 4.5-0.17) connects twice: a control connection, then, after a
/// parameter exchange over it, the data connections. Its server destroys the control listener
/// and only then creates, binds and listens on the data one, while the client connects as soon
/// as the exchange is done: a client that is faster than the server gets its data REQ rejected
/// ("invalid service ID": nothing listens), and that perftest then crashes while its server
/// waits forever. With `-c UD` the data connection is a SIDR exchange, and the same race ends
/// in a SIDR REP with status UNSUPPORTED, which librdmacm reports as
/// `RDMA_CM_EVENT_UNREACHABLE` with status 1. A kernel RoCE device rejects the same way;
/// upstream perftest fixed it in the client (`rdma_cm_client_connection` retries "in case the
/// server is not ready"). So a perftest pair is run again (at most twice more) when, and only
/// when, its client reports exactly one of those two rejections and the server's CM counted a
/// REQ or SIDR REQ with no listener meanwhile.
pub fn run_cm_pair_across(server_svc: &Service, client_svc: &Service, server: &[&str], client: &[&str], limit: Duration) -> PairOutput {
    let perftest = server.first().is_some_and(|p| p.starts_with("ib_"));
    let mut attempt = 0;
    loop {
        attempt += 1;
        let t0 = Instant::now();
        let (listening, rejected) = cm_listeners_and_no_listener_rejects(server_svc);
        let so = server_svc.dir.join(&format!("cm{}.server.out", SEQ.fetch_add(1, Ordering::Relaxed)));
        let mut s = spawn_cm_server(server_svc, server, &so);
        let c = run_verbs(client_svc, client, limit.saturating_sub(t0.elapsed()).max(Duration::from_secs(5)));
        let raced = perftest
            && attempt < 3
            && !c.ok()
            && (c.output.contains("RDMA_CM_EVENT_REJECTED; error: 8") || c.output.contains("RDMA_CM_EVENT_UNREACHABLE; error: 1."))
            && cm_listeners_and_no_listener_rejects(server_svc).1 > rejected;
        if raced {
            eprintln!("perftest -R: the data REQ or SIDR REQ beat the server's listen (attempt {attempt}, refused: no listener); running the pair again");
            let _ = s.kill();
            let _ = s.wait();
            // Its listener goes when the service has seen the client go.
            let t1 = Instant::now();
            while cm_listeners(server_svc) > listening {
                assert!(t1.elapsed() < Duration::from_secs(10), "the killed perftest server's listener outlived it");
                std::thread::sleep(Duration::from_millis(20)); // poll interval of a bounded condition wait
            }
            continue;
        }
        let ss = wait_timeout(&mut s, limit.saturating_sub(t0.elapsed()).max(Duration::from_secs(5)));
        return PairOutput { server: ProgOutput { cmdline: server.join(" "), status: ss, output: read_to_string_lossy(&so) }, client: c };
    }
}

/// Two network namespaces joined by a veth (`scripts/netns.sh`), names unique per test process
/// and `tag`; taken down on drop. Services run in them with [`NetnsPair::config`]; programs
/// reach a service through its socket file from any namespace.
pub struct NetnsPair {
    pub a: String,
    pub b: String,
    pub if_a: String,
    pub if_b: String,
    tag: String,
}

impl NetnsPair {
    /// Create the pair (root only). `tag`: a few letters that keep tests apart.
    pub fn up(tag: &str) -> NetnsPair {
        require_root();
        require_tool("ip");
        let id = std::process::id() % 100_000;
        NetnsPair {
            a: format!("pmrxe-{tag}-a{id}"),
            b: format!("pmrxe-{tag}-b{id}"),
            if_a: format!("px{tag}{id}a"),
            if_b: format!("px{tag}{id}b"),
            tag: tag.to_string(),
        }
        .create()
    }
    /// A pair with fixed names (tests whose own configs name the interface), root only.
    pub fn named(a: &str, b: &str, if_a: &str, if_b: &str) -> NetnsPair {
        require_root();
        require_tool("ip");
        NetnsPair { a: a.to_string(), b: b.to_string(), if_a: if_a.to_string(), if_b: if_b.to_string(), tag: String::new() }.create()
    }
    fn create(self) -> NetnsPair {
        assert!(self.if_a.len() <= 15, "interface name {} too long", self.if_a);
        let o = self.script("up");
        assert!(o.status.success(), "netns.sh up: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        self
    }
    fn script(&self, cmd: &str) -> std::process::Output {
        Command::new("bash")
            .arg(repo_root().join("scripts/netns.sh"))
            .args([cmd, &self.a, &self.b])
            .env("IF_A", &self.if_a)
            .env("IF_B", &self.if_b)
            .output()
            .expect("run scripts/netns.sh")
    }
    /// configs/netns-{a,b}.toml with this pair's interface and a private EAL file prefix.
    pub fn config(&self, dir: &TempDir, which: char) -> PathBuf {
        let text = std::fs::read_to_string(repo_root().join(format!("configs/netns-{which}.toml"))).unwrap();
        let (iface, orig) = if which == 'a' { (&self.if_a, "pmrxe-va") } else { (&self.if_b, "pmrxe-vb") };
        let prefix = format!("pmrxe-netns-{which}");
        let text = text
            .replace(&format!("iface={orig}"), &format!("iface={iface}"))
            .replace(&format!("\"{prefix}\""), &format!("\"{prefix}-{}{}\"", self.tag, std::process::id()));
        let p = dir.join(&format!("netns-{which}.toml"));
        std::fs::write(&p, text).unwrap();
        p
    }
    /// Services on both ends (A: 10.77.0.1 in `a`, B: 10.77.0.2 in `b`).
    pub fn services(&self, dir: &TempDir) -> (Service, Service) {
        let (ca, cb) = (self.config(dir, 'a'), self.config(dir, 'b'));
        (Service::start(Some(&ca), Some(&self.a)), Service::start(Some(&cb), Some(&self.b)))
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        let _ = self.script("down");
    }
}

/// Wait (bounded by `limit`) until `svc` holds no rdma_cm id, channel, listener or connection,
/// no client but `pmrxe` itself, and no QP (`pmrxe stats --json`); panic with what is left.
pub fn assert_nothing_left(svc: &Service, limit: Duration, what: &str) {
    let t0 = Instant::now();
    let mut last = serde_json::Value::Null;
    let mut left = (0, 0, 0, 0, 0, 0);
    let gone = poll_until(limit, || {
        last = svc.stats_json();
        left = held(&last);
        left == (0, 0, 0, 0, 0, 0)
    });
    assert!(
        gone,
        "{what}: still (ids, channels, listeners, conns, clients, qps) = {left:?} after {limit:?}; cm {}\nclients {}",
        last["cm"],
        last["clients"]
    );
    eprintln!("{what}: nothing left after {:.1} s", t0.elapsed().as_secs_f64());
}

/// What a service holds, from `pmrxe stats --json`: (rdma_cm ids, channels, listeners,
/// connections, clients other than `pmrxe` itself, QPs).
pub fn held(j: &serde_json::Value) -> (u64, u64, u64, u64, usize, usize) {
    let cm = |k: &str| j["cm"][k].as_u64().unwrap_or_else(|| panic!("no cm.{k} in pmrxe stats --json: {}", j["cm"]));
    let qps = j["lcores"].as_array().into_iter().flatten().map(|l| l["qps"].as_array().map_or(0, Vec::len)).sum();
    let clients = j["clients"].as_array().map_or(0, |c| c.iter().filter(|c| c["program"] != "pmrxe").count());
    (cm("ids"), cm("channels"), cm("listeners"), cm("conns"), clients, qps)
}

/// A network namespace whose `lo` carries some addresses: for programs whose kernel TCP
/// control connection must reach the same address as their rdma_cm connection (qperf uses its
/// server name for both). Programs in it reach a service through the socket file.
pub struct LoNetns(pub String);

impl LoNetns {
    /// Create `pmrxe-TAG-PID` with `lo` up and `addrs` (`"198.18.0.1/32"`) on it (root only).
    pub fn new(tag: &str, addrs: &[&str]) -> LoNetns {
        require_root();
        let name = format!("pmrxe-{tag}-{}", std::process::id());
        let ip = require_tool("ip");
        let _ = Command::new(&ip).args(["netns", "del", &name]).status();
        let mut cmds = vec![vec!["netns", "add", &name], vec!["netns", "exec", &name, "ip", "link", "set", "lo", "up"]];
        for a in addrs {
            cmds.push(vec!["netns", "exec", &name, "ip", "addr", "add", a, "dev", "lo"]);
        }
        for args in cmds {
            let st = Command::new(&ip).args(&args).status().expect("ip");
            assert!(st.success(), "ip {args:?} failed");
        }
        LoNetns(name)
    }
    /// `ip netns exec NS pmrxe run -- ARGS` against `svc`, output to `out`; killed when
    /// dropped (a process inside the namespace outlives `ip netns del`, so a panicking test
    /// left its qperf server running).
    pub fn spawn(&self, svc: &Service, args: &[&str], out: &Path) -> KillOnDrop {
        let f = File::create(out).unwrap();
        KillOnDrop(Command::new(require_tool("ip"))
            .args(["netns", "exec", &self.0])
            .arg(pmrxe_bin())
            .args(["run", "--"])
            .args(args)
            .env("PMRXE_SOCKET", &svc.socket)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .expect("spawn ip netns exec"))
    }
}

/// A child process killed and reaped when dropped.
pub struct KillOnDrop(pub Child);

impl std::ops::Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for LoNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// qperf's result line `    bw  =  3.7 GB/sec` (→ MB/s) or `    latency  =  7.9 us` (→ µs).
pub fn qperf_value(out: &str, key: &str) -> Option<f64> {
    let l = out.lines().find(|l| l.trim_start().starts_with(key))?;
    let w: Vec<&str> = l.split_whitespace().collect();
    let v: f64 = w.get(2)?.parse().ok()?;
    Some(match *w.get(3)? {
        "GB/sec" => v * 1000.0,
        "MB/sec" => v,
        "KB/sec" => v / 1000.0,
        "ns" => v / 1000.0,
        "us" => v,
        "ms" => v * 1000.0,
        "sec" => v * 1e6,
        _ => return None,
    })
}


/// An innocent client pair for the security tests: an ibv_rc_pingpong pair (pmrxe0 <-> pmrxe1,
/// `iters` round trips) started before an attack and checked after it: the pair must complete
/// with its own data checks, `pmrxe stats` must answer within a second, and the service log
/// must stay bounded.
pub struct Bystander {
    server: Child,
    client: Child,
    so: PathBuf,
    co: PathBuf,
}

impl Bystander {
    /// Start the pair on `svc` with out-of-band TCP port `port` (it is running when this returns).
    pub fn start(svc: &Service, port: u16, iters: u32) -> Bystander {
        let (p, n) = (port.to_string(), iters.to_string());
        let so = svc.dir.join(&format!("bystander{port}.server.out"));
        let co = svc.dir.join(&format!("bystander{port}.client.out"));
        let server = spawn_verbs(svc, &["ibv_rc_pingpong", "-d", "pmrxe0", "-g", "1", "-n", &n, "-p", &p], &so);
        wait_until(Duration::from_secs(20), "the bystander's server listens", || listens_on(server.id(), port));
        let client = spawn_verbs(svc, &["ibv_rc_pingpong", "-d", "pmrxe1", "-g", "1", "-n", &n, "-p", &p, "127.0.0.1"], &co);
        Bystander { server, client, so, co }
    }

    /// After the attack: the pair completes (within `limit`), stats answer within 1 s, the log
    /// has fewer than `max_log_lines` lines.
    pub fn check(mut self, svc: &Service, limit: Duration, max_log_lines: usize) {
        let t0 = Instant::now();
        let o = svc.pmrxe().arg("stats").output().expect("pmrxe stats");
        assert!(o.status.success() && t0.elapsed() < Duration::from_secs(1), "pmrxe stats took {:?} after the attack", t0.elapsed());
        let cs = wait_timeout(&mut self.client, limit);
        let ss = wait_timeout(&mut self.server, Duration::from_secs(10));
        let (c, s) = (read_to_string_lossy(&self.co), read_to_string_lossy(&self.so));
        assert!(cs.is_some_and(|st| st.success()) && ss.is_some_and(|st| st.success()), "the bystander pair failed:\nclient {cs:?}: {}\nserver {ss:?}: {}", tail(&c, 10), tail(&s, 10));
        assert!(c.contains("iters in"), "bystander client output: {}", tail(&c, 10));
        let lines = svc.log_text().lines().count();
        assert!(lines < max_log_lines, "service log has {lines} lines (bounded: < {max_log_lines})");
    }
}

/// A directory in /tmp (0755) with the pmrxe binary, the shim next to it and
/// scripts/container.sh, for programs run as other users: a clean checkout may sit in a
/// directory only root can enter (`mktemp -d` makes 0700). Hard links where the filesystem
/// allows, else copies; made once per test process.
pub fn for_all_users() -> &'static Path {
    use std::os::unix::fs::PermissionsExt;
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("pmrxe-it-bin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("create the shared binary directory");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        for (src, name) in [(pmrxe_bin(), "pmrxe"), (shim_path(), "libpmrxe_verbs.so"), (repo_root().join("scripts/container.sh"), "container.sh")] {
            let dst = d.join(name);
            if std::fs::hard_link(&src, &dst).is_err() {
                std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("copy {} to {}: {e}", src.display(), dst.display()));
            }
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        d
    })
}

/// hpccinf.txt from hpcc's example with N 200, NB 40 and a 1x2 grid, written to `dir`.
pub fn hpcc_input(dir: &Path) {
    let inf = std::fs::read_to_string("/usr/share/doc/hpcc/examples/_hpccinf.txt").expect("hpcc's example hpccinf.txt");
    let inf = inf.replacen("1000         Ns", "200          Ns", 1).replacen("80           NBs", "40           NBs", 1).replacen("2            Ps", "1            Ps", 1);
    std::fs::write(dir.join("hpccinf.txt"), inf).unwrap();
}

/// hpcc's summary figures from hpccoutf.txt, after asserting its checks passed.
pub fn hpcc_checked(r: &str) -> String {
    assert!(r.contains("Success=1") && !r.contains("FAILED") && r.matches("PASSED").count() >= 4, "{}", tail(r, 80));
    let key = |k: &str| r.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).unwrap_or("?").to_string();
    format!(
        "PingPong latency avg {} us, bandwidth avg {} GB/s; RandomRing latency {} us, bandwidth {} GB/s; PTRANS {} GB/s",
        key("AvgPingPongLatency_usec"),
        key("AvgPingPongBandwidth_GBytes"),
        key("RandomlyOrderedRingLatency_usec"),
        key("RandomlyOrderedRingBandwidth_GBytes"),
        key("PTRANS_GBs")
    )
}

/// Run `prog args` (a set-up command) and fail the test unless it succeeds.
pub fn sh(prog: &str, args: &[&str]) {
    let o = Command::new(require_tool(prog)).args(args).output().unwrap_or_else(|e| panic!("{prog}: {e}"));
    assert!(o.status.success(), "{prog} {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// A group and a user in it (no home, no login shell), removed on drop: a non-root member of
/// the group a service admits with `service.group`.
pub struct Member {
    pub group: String,
    pub user: String,
}

impl Member {
    pub fn create(tag: &str) -> Member {
        require_root();
        let id = std::process::id() % 1_000_000;
        let m = Member { group: format!("pmrxe-dg{tag}{id}"), user: format!("pmrxe-d1{tag}{id}") };
        sh("groupadd", &[&m.group]);
        sh("useradd", &["-M", "-U", "-s", "/usr/sbin/nologin", "-G", &m.group, &m.user]);
        m
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // Whatever the user still runs (a failed test's stragglers) would make userdel refuse
        // and leave the user behind.
        let _ = Command::new("pkill").args(["-KILL", "-u", &self.user]).output();
        let _ = Command::new(require_tool("userdel")).arg(&self.user).output();
        let _ = Command::new(require_tool("groupdel")).arg(&self.group).output();
    }
}

/// The loopback config with `service.group = group`, written into `dir`.
pub fn config_with_group(dir: &Path, group: &str) -> std::path::PathBuf {
    let o = Command::new(pmrxe_bin()).args(["config", "default"]).output().unwrap();
    let text = String::from_utf8(o.stdout).unwrap().replacen("[service]\n", &format!("[service]\ngroup = \"{group}\"\n"), 1);
    let p = dir.join("service.toml");
    std::fs::write(&p, text).unwrap();
    p
}
