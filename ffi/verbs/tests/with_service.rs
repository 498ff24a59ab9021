//! End-to-end checks of the shim against a running `pmrxe serve` (loopback config) with the
//! unmodified Debian tools. Each test starts its own service on a private socket.
//!
//! Needs the service binary — `$PMRXE_BIN`, else `<workspace>/target/release/pmrxe` (built by
//! `cargo build --release`, as scripts/test.sh does first) — and the Debian tools (scripts/setup.sh
//! installs them); a missing one fails the test with a message. The shim under test is the
//! `libpmrxe_verbs.so` cargo built next to this test binary (passed as `PMRXE_SHIM`).
//! The tests share 2 CPUs with a busy-polling lcore: run them one at a time
//! (`cargo test -p pmrxe-verbs --test with_service -- --test-threads=1`).
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn service_bin() -> PathBuf {
    let p = std::env::var_os("PMRXE_BIN").map(PathBuf::from).unwrap_or_else(|| workspace().join("target/release/pmrxe"));
    assert!(p.exists(), "no pmrxe service binary at {} (cargo build --release, or set PMRXE_BIN)", p.display());
    p
}

fn shim() -> PathBuf {
    // <target>/<profile>/deps/with_service-HASH → <target>/<profile>/libpmrxe_verbs.so
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("libpmrxe_verbs.so");
    assert!(p.exists(), "{} not built", p.display());
    p
}

/// Fail the test unless `tool` is on PATH (Debian's `package`; scripts/setup.sh installs it).
fn require(tool: &str, package: &str) {
    let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    assert!(found, "`{tool}` is not installed: Debian package {package} (scripts/setup.sh installs it)");
}

struct Service {
    child: Child,
    sock: PathBuf,
    dir: PathBuf,
    bin: PathBuf,
    // Tests in this file use the same perftest/pingpong TCP ports and both want CPU 1 for the
    // service lcore: run them one at a time even under cargo's parallel test threads.
    _serial: std::sync::MutexGuard<'static, ()>,
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Is some socket listening on TCP `port` (IPv4 or IPv6)? Reads /proc/net/tcp{,6}.
fn listening(port: u16) -> bool {
    let hex = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).unwrap_or_default().lines().skip(1).any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() > 3 && w[1].ends_with(&hex) && w[3] == "0A"
        })
    })
}

impl Service {
    fn start(tag: &str) -> Service {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let bin = service_bin();
        let dir = std::env::temp_dir().join(format!("pmrxe-verbs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s.sock");
        let log = std::fs::File::create(dir.join("service.log")).unwrap();
        let child = Command::new(&bin)
            .args(["serve", "--config"])
            .arg(workspace().join("configs/loopback.toml"))
            .env("PMRXE_SOCKET", &sock)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn pmrxe serve");
        let t0 = Instant::now();
        while !sock.exists() {
            assert!(t0.elapsed() < Duration::from_secs(20), "service did not create {}", sock.display());
            std::thread::sleep(Duration::from_millis(100));
        }
        Service { child, sock, dir, bin, _serial: serial }
    }

    fn run(&self, args: &[&str], timeout_s: u32) -> Command {
        let mut c = Command::new("timeout");
        c.arg(timeout_s.to_string()).arg(&self.bin).arg("run").arg("--").args(args);
        c.env("PMRXE_SOCKET", &self.sock).env("PMRXE_SHIM", shim());
        c
    }

    fn output(&self, args: &[&str]) -> Output {
        self.run(args, 30).output().unwrap()
    }

    /// Server and client of a TCP-rendezvous tool (ibv_rc_pingpong, perftest).
    fn pair(&self, server: &[&str], client: &[&str]) -> (Output, Output) {
        let srv = self.run(server, 90).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // The tools do not retry the TCP connect: wait until the server listens on the
        // default rendezvous port (18515 for both ibv_rc_pingpong and perftest).
        let t0 = Instant::now();
        while !listening(18515) {
            assert!(t0.elapsed() < Duration::from_secs(20), "{server:?} never listened on 18515");
            std::thread::sleep(Duration::from_millis(20));
        }
        let cli = self.run(client, 90).output().unwrap();
        let srv = srv.wait_with_output().unwrap();
        (srv, cli)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn assert_pair_ok(name: &str, (s, c): &(Output, Output)) {
    assert!(s.status.success() && c.status.success(), "{name}: server {:?}\n{}\nclient {:?}\n{}", s.status, text(s), c.status, text(c));
}

#[test]
fn ibv_devices_and_devinfo_show_pmrxe_devices_with_roce_v2_gids() {
    let svc = Service::start("devinfo");
    require("ibv_devices", "ibverbs-utils");
    let o = svc.output(&["ibv_devices"]);
    let t = text(&o);
    assert!(o.status.success() && t.contains("pmrxe0") && t.contains("pmrxe1"), "{t}");
    let o = svc.output(&["ibv_devinfo", "-v"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("PORT_ACTIVE"), "{t}");
    assert!(t.contains("link_layer:\t\tEthernet"), "{t}");
    assert!(t.contains("::ffff:198.18.0.1, RoCE v2"), "{t}");
}

#[test]
fn ibv_rc_pingpong_plain_events_and_new_api() {
    require("ibv_rc_pingpong", "ibverbs-utils");
    let svc = Service::start("pingpong");
    for extra in [&[][..], &["-e"][..], &["-N"][..], &["-e", "-N"][..]] {
        let mut s = vec!["ibv_rc_pingpong", "-d", "pmrxe0", "-g", "1", "-c"];
        s.extend_from_slice(extra);
        let mut c = vec!["ibv_rc_pingpong", "-d", "pmrxe1", "-g", "1", "-c"];
        c.extend_from_slice(extra);
        c.push("127.0.0.1");
        let r = svc.pair(&s, &c);
        assert_pair_ok(&format!("ibv_rc_pingpong {extra:?}"), &r);
        assert!(text(&r.1).contains("iters in"), "{}", text(&r.1));
    }
}

#[test]
fn perftest_write_read_send_bw_and_write_lat() {
    require("ib_write_bw", "perftest");
    let svc = Service::start("perftest");
    for t in ["ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_write_lat", "ib_atomic_bw"] {
        let r = svc.pair(&[t, "-d", "pmrxe0", "-F"], &[t, "-d", "pmrxe1", "-F", "127.0.0.1"]);
        assert_pair_ok(t, &r);
    }
}

#[test]
fn pmrxedv_fastreg_example_sees_exact_rights_and_data() {
    require("cc", "gcc");
    let svc = Service::start("fastreg");
    let lib = shim();
    let out = svc.dir.join("fastreg");
    let ws = workspace();
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-I"])
        .arg(ws.join("ffi/verbs/include"))
        .arg("-o")
        .arg(&out)
        .arg(ws.join("examples/pmrxedv/fastreg.c"))
        .arg(format!("-L{}", lib.parent().unwrap().display()))
        .arg(format!("-Wl,-rpath,{}", lib.parent().unwrap().display()))
        .arg("-lpmrxe_verbs")
        .status()
        .unwrap();
    assert!(st.success(), "fastreg.c does not compile");
    let o = svc.output(&[out.to_str().unwrap()]);
    assert!(o.status.success() && text(&o).contains("all checks passed"), "{}", text(&o));
}
