//! The security model's admission and trust half (docs/operations.md, "Security model"), each
//! attack run as a real program against the real service, as a non-root user where that is the
//! point. Users and groups are created for the test and removed when it ends (pass or fail).
//!
//! * A member of the service's group (not root) runs ibv_rc_pingpong, ib_write_bw, rping and
//!   `mpirun -np 2` over UCX (no --allow-run-as-root); a user outside the group is refused with
//!   "permission denied (not in group …)", promptly, not a hang.
//! * `pmrxe stats` shows a non-root user only their own clients and QPs; their `pmrxe capture`
//!   may only name a QP of their own; capture files are new, 0600 files, never followed links.
//! * Clients refuse a service they cannot trust: a socket in a directory others may write, or
//!   one owned by a stranger, or a listener running as another unprivileged user (a fake
//!   service that would receive the client's memory); the fake service never hears a byte.
//!   A silent service makes the shim fail with a timeout, not hang.
//! * A second `pmrxe serve` on a live service's socket refuses to start and leaves it alone.
//! * A client without CAP_NET_RAW cannot give a QP a privileged Q_Key, and a UD send with a
//!   privileged WR Q_Key to QP1 goes out with the QP's own Q_Key: the CM never sees it.
//! * The metrics endpoint answers while slow scrapers hold connections open.
mod common;

use common::*;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(120);

fn sh(prog: &str, args: &[&str]) {
    let o = Command::new(require_tool(prog)).args(args).output().unwrap_or_else(|e| panic!("{prog}: {e}"));
    assert!(o.status.success(), "{prog} {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// A group, a user in it and a user outside it, removed on drop.
struct Users {
    group: String,
    member: String,
    outsider: String,
}

impl Users {
    fn create(tag: &str) -> Users {
        require_root();
        let id = std::process::id() % 1_000_000;
        let u = Users { group: format!("pmrxe-tg{tag}{id}"), member: format!("pmrxe-t1{tag}{id}"), outsider: format!("pmrxe-t2{tag}{id}") };
        sh("groupadd", &[&u.group]);
        sh("useradd", &["-M", "-U", "-s", "/usr/sbin/nologin", "-G", &u.group, &u.member]);
        sh("useradd", &["-M", "-U", "-s", "/usr/sbin/nologin", &u.outsider]);
        u
    }

    fn uid(name: &str) -> u32 {
        let o = Command::new("id").args(["-u", name]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().parse().expect("uid")
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        for u in [&self.member, &self.outsider] {
            let _ = Command::new(require_tool("userdel")).arg(u).output();
        }
        let _ = Command::new(require_tool("groupdel")).arg(&self.group).output();
    }
}

/// The embedded loopback config with `service.group` (and optionally metrics) set, in `dir`.
fn config_with(dir: &Path, group: &str, metrics: Option<u16>) -> PathBuf {
    let o = Command::new(pmrxe_bin()).args(["config", "default"]).output().unwrap();
    let mut text = String::from_utf8(o.stdout).unwrap();
    let mut extra = format!("group = \"{group}\"\n");
    if let Some(p) = metrics {
        extra.push_str(&format!("metrics = \"127.0.0.1:{p}\"\n"));
    }
    text = text.replacen("[service]\n", &format!("[service]\n{extra}"), 1);
    let p = dir.join("service.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn start_with_group(users: &Users, cfg_dir: &TempDir, metrics: Option<u16>) -> Service {
    let cfg = config_with(cfg_dir.path(), &users.group, metrics);
    let svc = Service::start(Some(&cfg), None);
    // The socket belongs to the configured group, mode 0660.
    let md = std::fs::metadata(&svc.socket).unwrap();
    assert_eq!(md.mode() & 0o777, 0o660, "socket mode");
    let gid = Command::new("getent").args(["group", &users.group]).output().unwrap();
    let gid: u32 = String::from_utf8_lossy(&gid.stdout).split(':').nth(2).unwrap().trim().parse().unwrap();
    assert_eq!(md.gid(), gid, "socket group");
    // Everybody can traverse the test's directory; the socket's mode decides.
    std::fs::set_permissions(svc.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    svc
}

/// `pmrxe run -- ARGS` as `user`, to completion.
fn run_as(svc: &Service, user: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> ProgOutput {
    let out = svc.dir.join(&format!("as-{user}-{}.out", args[0].rsplit('/').next().unwrap()));
    let f = std::fs::File::create(&out).unwrap();
    let mut c = pmrxe_as(&svc.socket, Some(user));
    c.envs(env.iter().copied()).arg("run").arg("--").args(args).stdout(f.try_clone().unwrap()).stderr(f);
    let mut child = c.spawn().unwrap();
    let status = wait_timeout(&mut child, limit);
    ProgOutput { cmdline: format!("[{user}] {}", args.join(" ")), status, output: read_to_string_lossy(&out) }
}

#[test]
fn a_group_member_runs_verbs_programs_and_an_outsider_is_refused() {
    let users = Users::create("a");
    let _l = heavy_lock();
    let cfg_dir = TempDir::new("secacc-cfg");
    let svc = start_with_group(&users, &cfg_dir, None);

    // Outside the group: refused at once with the reason, not a hang; and a refused user
    // hammering the socket costs nobody else anything (and no log lines).
    let bystander = Bystander::start(&svc, port_for(216), 3000);
    for _ in 0..50 {
        let o = pmrxe_as(&svc.socket, Some(&users.outsider)).arg("stats").output().unwrap();
        assert!(!o.status.success());
    }
    // The same with the socket opened to everyone (a misconfigured mode): the service's own
    // SO_PEERGROUPS check refuses, with the reason, and logs nothing per attempt.
    std::fs::set_permissions(&svc.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    for i in 0..50 {
        let o = pmrxe_as(&svc.socket, Some(&users.outsider)).arg("stats").output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && (i > 0 || err.contains(&format!("not in group {}", users.group))), "{err}");
    }
    std::fs::set_permissions(&svc.socket, std::fs::Permissions::from_mode(0o660)).unwrap();
    bystander.check(&svc, T, 100);
    let t0 = Instant::now();
    let o = run_as(&svc, &users.outsider, &["ibv_devinfo"], &[], Duration::from_secs(30));
    assert!(o.status.is_some(), "ibv_devinfo of an outsider hung: {}", o.describe());
    assert!(t0.elapsed() < Duration::from_secs(10), "refusal took {:?}", t0.elapsed());
    assert!(!o.ok(), "an outsider listed devices: {}", o.describe());
    assert!(o.output.contains(&format!("permission denied (not in group {})", users.group)), "{}", o.describe());

    // In the group: the verbs utilities, perftest, rdma_cm and MPI.
    let m = users.member.as_str();
    let o = run_as(&svc, m, &["ibv_devinfo"], &[], Duration::from_secs(30));
    assert!(o.ok() && o.output.contains("pmrxe0") && o.output.contains("PORT_ACTIVE"), "{}", o.describe());

    let p = port_for(210).to_string();
    run_pair_as(&svc, &["ibv_rc_pingpong", "-d", "pmrxe0", "-g", "1", "-n", "200", "-p", &p], &svc,
        &["ibv_rc_pingpong", "-d", "pmrxe1", "-g", "1", "-n", "200", "-p", &p, "127.0.0.1"], Some(m), port_for(210), T)
        .assert_ok();
    let p = port_for(211).to_string();
    let r = run_pair_as(&svc, &["ib_write_bw", "-d", "pmrxe0", "-F", "-n", "1000", "-p", &p], &svc,
        &["ib_write_bw", "-d", "pmrxe1", "-F", "-n", "1000", "-p", &p, "127.0.0.1"], Some(m), port_for(211), T);
    r.assert_ok();
    assert!(!perftest_rows(&r.client.output).is_empty(), "{}", r.client.describe());

    // rping: the server listens through the service's CM, then the client connects; data checked (-v).
    let p = port_for(212).to_string();
    let so = svc.dir.join("rping-member.server.out");
    let before = cm_listeners(&svc);
    let mut s = spawn_verbs_as(&svc.socket, Some(m), &["rping", "-s", "-a", "198.18.0.1", "-p", &p, "-C", "10", "-v"], &so);
    wait_until(Duration::from_secs(30), "the member's rping server listens", || cm_listeners(&svc) > before);
    let c = run_as(&svc, m, &["rping", "-c", "-a", "198.18.0.1", "-p", &p, "-C", "10", "-v"], &[], T);
    let ss = wait_timeout(&mut s, Duration::from_secs(30));
    assert!(c.ok() && c.output.contains("ping data"), "{}", c.describe());
    assert!(ss.is_some_and(|st| st.success()), "rping server: {}", read_to_string_lossy(&so));

    // mpirun -np 2 over UCX, no --allow-run-as-root.
    let mpicc = require_tool("mpicc");
    let mpirun = require_tool("mpirun");
    let prog = svc.dir.join("mpi_pingpong");
    compile_c("tests/mpi_pingpong.c", &prog, &mpicc, &[]);
    let before = svc.stats_json();
    let mut args: Vec<&str> = vec!["env", "UCX_TLS=rc_verbs,ud_verbs:aux,self", "UCX_NET_DEVICES=pmrxe0:1"];
    args.extend([mpirun.to_str().unwrap(), "-np", "2", "--oversubscribe", "--mca", "pml", "ucx", "--mca", "btl", "self"]);
    for v in ["UCX_TLS", "UCX_NET_DEVICES", "PMRXE_SOCKET", "LD_PRELOAD"] {
        args.extend(["-x", v]);
    }
    args.push(prog.to_str().unwrap());
    let o = run_as(&svc, m, &args, &[], Duration::from_secs(180));
    assert!(o.ok() && o.output.contains("OK mpi"), "{}", o.describe());
    let after = svc.stats_json();
    let wqes = |j: &serde_json::Value| j["lcores"].as_array().unwrap().iter().map(|l| l["counters"]["sq_wqes"].as_u64().unwrap_or(0)).sum::<u64>();
    assert!(wqes(&after) >= wqes(&before) + 1000, "MPI traffic did not go through pmrxe");
    assert!(svc.log_text().lines().count() < 2000, "log not bounded");
}

#[test]
fn stats_and_capture_show_a_user_only_their_own() {
    let users = Users::create("b");
    let _l = heavy_lock();
    let cfg_dir = TempDir::new("secacc-cfg");
    let svc = start_with_group(&users, &cfg_dir, None);
    // Root's traffic: a long ibv_rc_pingpong pair.
    let p = port_for(213).to_string();
    let so = svc.dir.join("root-pp.server.out");
    let co = svc.dir.join("root-pp.client.out");
    let mut s = spawn_verbs(&svc, &["ibv_rc_pingpong", "-d", "pmrxe0", "-g", "1", "-n", "100000000", "-p", &p], &so);
    wait_until(Duration::from_secs(20), "root's pingpong server listens", || listens_on(s.id(), port_for(213)));
    let mut c = spawn_verbs(&svc, &["ibv_rc_pingpong", "-d", "pmrxe1", "-g", "1", "-n", "100000000", "-p", &p, "127.0.0.1"], &co);
    let qps = |j: &serde_json::Value| -> Vec<u64> {
        j["lcores"].as_array().unwrap().iter().flat_map(|l| l["qps"].as_array().unwrap().iter().map(|q| q["qpn"].as_u64().unwrap())).collect()
    };
    wait_until(Duration::from_secs(20), "root's QPs appear", || qps(&svc.stats_json()).len() >= 2);
    let root_view = svc.stats_json();
    let root_qpn = qps(&root_view)[0];
    assert!(root_view["clients"].as_array().unwrap().len() >= 2);

    let member_stats = |args: &[&str]| {
        let o = pmrxe_as(&svc.socket, Some(&users.member)).args(args).output().unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (ok, out, err) = member_stats(&["stats", "--json"]);
    assert!(ok, "member's pmrxe stats: {err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(qps(&j).is_empty(), "a non-root user sees root's QPs: {:?}", qps(&j));
    assert!(j["clients"].as_array().unwrap().is_empty(), "a non-root user sees root's clients: {}", j["clients"]);
    assert!(j["lcores"][0]["counters"]["rx_packets"].as_u64().unwrap_or(0) > 0, "service-wide totals stay visible");

    // Capture: a whole port, or another user's QP, is refused; nothing is written.
    let out_dir = TempDir::new("secacc-cap");
    std::fs::set_permissions(out_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let f = out_dir.join("m.pcap");
    let (ok, _, err) = member_stats(&["capture", "--out", f.to_str().unwrap(), "-c", "1"]);
    assert!(!ok && err.contains("capturing a whole port is for root"), "{err}");
    assert!(!f.exists(), "a refused capture left its file");
    let q = root_qpn.to_string();
    let (ok, _, err) = member_stats(&["capture", "--out", f.to_str().unwrap(), "-c", "1", "--qp", &q]);
    assert!(!ok && err.contains("is not one of yours"), "{err}");
    assert!(!f.exists(), "a refused capture left its file");

    // Root's capture file: new, 0600; an existing file or a symbolic link is refused.
    let rf = out_dir.join("root.pcap");
    let o = svc.pmrxe().args(["capture", "--out", rf.to_str().unwrap(), "-c", "4"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::metadata(&rf).unwrap().mode() & 0o777, 0o600);
    assert!(std::fs::metadata(&rf).unwrap().len() > 24);
    let o = svc.pmrxe().args(["capture", "--out", rf.to_str().unwrap(), "-c", "1"]).output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--force"), "existing file overwritten");
    let target = out_dir.join("victim");
    std::fs::write(&target, b"keep me").unwrap();
    let link = out_dir.join("link.pcap");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let o = svc.pmrxe().args(["capture", "--out", link.to_str().unwrap(), "-c", "1"]).output().unwrap();
    assert!(!o.status.success(), "capture followed a symbolic link");
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    let o = svc.pmrxe().args(["capture", "--out", link.to_str().unwrap(), "-c", "1", "--force"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me", "--force replaced the link, not its target");
    assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    let _ = c.kill();
    let _ = s.kill();
    let _ = c.wait();
    let _ = s.wait();
}

/// A fake "service" (python3, SOCK_SEQPACKET) listening at `sock` as `user` (or root), which
/// logs the bytes of every connection's first message to `log`; `answer`: reply nothing.
fn fake_service(user: Option<&str>, sock: &Path, log: &Path) -> std::process::Child {
    let script = r#"
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o666); s.listen(8)
log = open(sys.argv[2], "a", buffering=1)
log.write("listening\n")
while True:
    c, _ = s.accept()
    c.settimeout(3)
    try:
        d = c.recv(65536)
    except Exception:
        d = b""
    log.write("conn %d\n" % len(d))
    if d:
        import time; time.sleep(30)   # a service that never answers
    c.close()
"#;
    let mut c = match user {
        Some(u) => {
            let mut c = Command::new(require_tool("setpriv"));
            c.args(["--reuid", u, "--regid", u, "--init-groups", "--", "/usr/bin/python3"]);
            c
        }
        None => Command::new("/usr/bin/python3"),
    };
    let child = c.arg("-c").arg(script).arg(sock).arg(log).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_until(Duration::from_secs(10), "the fake service listens", || read_to_string_lossy(log).contains("listening"));
    child
}

#[test]
fn clients_refuse_a_service_they_cannot_trust() {
    let users = Users::create("c");
    let m = users.member.as_str();
    let devinfo = |sock: &Path, extra: &[(&str, &str)]| {
        let o = pmrxe_at(sock).envs(extra.iter().copied()).args(["run", "--", "ibv_devinfo"]).output().unwrap();
        String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout)
    };
    // 1. A member's own directory: a root client does not trust it.
    let mine = PathBuf::from(format!("/tmp/pmrxe-it-fake-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&mine);
    std::fs::create_dir(&mine).unwrap();
    sh("chown", &[&format!("{m}:{m}"), mine.to_str().unwrap()]);
    let sock = mine.join("s.sock");
    let log = mine.join("fake.log");
    std::fs::write(&log, b"").unwrap();
    sh("chown", &[&format!("{m}:{m}"), log.to_str().unwrap()]);
    let mut fake = fake_service(Some(m), &sock, &log);
    let out = devinfo(&sock, &[]);
    assert!(out.contains(&format!("belongs to uid {}", Users::uid(m))), "{out}");
    // 2. The same listener moved into a root-owned directory: SO_PEERCRED names the stranger.
    let rootdir = TempDir::new("secacc-root");
    let moved = rootdir.join("s.sock");
    std::fs::rename(&sock, &moved).unwrap();
    let out = devinfo(&moved, &[]);
    assert!(out.contains(&format!("runs as uid {}", Users::uid(m))), "{out}");
    // The fake service accepted connections but never received a byte (no Hello, no memory).
    let l = read_to_string_lossy(&log);
    assert!(l.contains("conn 0") && !l.lines().any(|x| x.starts_with("conn ") && x != "conn 0"), "the fake service heard: {l}");
    let _ = fake.kill();
    let _ = fake.wait();
    // 3. A socket in a directory anyone may write (/tmp): refused before connecting.
    let tmp_sock = PathBuf::from(format!("/tmp/pmrxe-it-{}.sock", std::process::id()));
    let out = devinfo(&tmp_sock, &[]);
    assert!(out.contains("writable by others"), "{out}");
    // 4. A root service that never answers: the shim gives up with a timeout, it does not hang.
    let quiet = TempDir::new("secacc-quiet");
    let qlog = quiet.join("fake.log");
    let mut fake = fake_service(None, &quiet.join("s.sock"), &qlog);
    let t0 = Instant::now();
    let out = devinfo(&quiet.join("s.sock"), &[("PMRXE_CALL_TIMEOUT_MS", "700")]);
    assert!(t0.elapsed() < Duration::from_secs(15), "the shim waited {:?}", t0.elapsed());
    assert!(out.contains("did not answer Hello within"), "{out}");
    let _ = fake.kill();
    let _ = fake.wait();
    let _ = std::fs::remove_dir_all(&mine);
}

#[test]
fn a_second_service_never_takes_a_live_socket() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let ino = std::fs::metadata(&svc.socket).unwrap().ino();
    let t0 = Instant::now();
    let o = svc.pmrxe().arg("serve").stdout(Stdio::piped()).stderr(Stdio::piped()).output().unwrap();
    let text = String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success() && text.contains("another pmrxe service is running there"), "{text}");
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert_eq!(std::fs::metadata(&svc.socket).unwrap().ino(), ino, "the live socket was replaced");
    svc.stats_text();
}

#[test]
fn no_privileged_q_key_without_cap_net_raw() {
    let users = Users::create("d");
    let _l = heavy_lock();
    let cfg_dir = TempDir::new("secacc-cfg");
    let svc = start_with_group(&users, &cfg_dir, None);
    let prog = svc.dir.join("sec_qkey");
    compile_c("tests/sec_qkey.c", &prog, &require_tool("cc"), &["-libverbs"]);
    let bystander = Bystander::start(&svc, port_for(215), 3000);
    let rx_mads = |j: &serde_json::Value| j["cm"]["ports"].as_array().unwrap().iter().map(|p| p["rx_mads"].as_u64().unwrap()).sum::<u64>();
    let unknown = |j: &serde_json::Value| j["lcores"].as_array().unwrap().iter().map(|l| l["counters"]["rx_unknown_qp"].as_u64().unwrap_or(0)).sum::<u64>();
    let before = svc.stats_json();
    let o = run_as(&svc, &users.member, &[prog.to_str().unwrap()], &[], Duration::from_secs(30));
    assert!(o.ok() && o.output.contains("OK sec_qkey"), "{}", o.describe());
    assert!(o.output.contains(&format!("modify_privileged errno {}", libc::EPERM)), "a non-root client set a privileged Q_Key: {}", o.describe());
    assert!(o.output.contains("send_status 0"), "{}", o.describe());
    // Root (CAP_NET_RAW) may set it, like the kernel allows.
    let r = run_verbs(&svc, &[prog.to_str().unwrap()], Duration::from_secs(30));
    assert!(r.ok() && r.output.contains("modify_privileged errno 0"), "{}", r.describe());
    // Neither forged MAD reached the CM: they went out with Q_Key 0x11111111, and QP1 dropped them.
    let after = svc.stats_json();
    assert_eq!(rx_mads(&after), rx_mads(&before), "the CM received a MAD from a client's UD QP");
    assert!(unknown(&after) >= unknown(&before) + 2, "the forged sends were not dropped at QP1");
    bystander.check(&svc, T, 200);
}

#[test]
fn metrics_answer_while_slow_scrapers_hang_on() {
    let users = Users::create("e");
    let _l = heavy_lock();
    let cfg_dir = TempDir::new("secacc-cfg");
    let port = port_for(214);
    let svc = start_with_group(&users, &cfg_dir, Some(port));
    // Three scrapers that send half a request and stall, one that trickles a byte at a time.
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /metr").unwrap();
        stalled.push(s);
    }
    let trickle = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        for b in b"GET /metrics HTTP/1.1\r\n".iter().cycle().take(40) {
            if s.write_all(&[*b]).is_err() {
                return true; // cut off by the deadline
            }
            std::thread::sleep(Duration::from_millis(150));
        }
        false
    });
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let (status, body) = http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("pmrxe_up 1"), "{body}");
    assert!(t0.elapsed() < Duration::from_secs(1), "a scrape waited {:?} behind slow clients", t0.elapsed());
    assert!(trickle.join().unwrap(), "a trickling scraper kept its connection past the deadline");
    drop(stalled);
    svc.stats_text();
}
