//! Limits, enforced and reported (issue 37), against the real service through the shim:
//!
//! * one client creating PDs/CQs/QPs/SRQs/MRs/MWs/AHs until refused is stopped at its
//!   `[limits.per_client]` cap with EAGAIN (not at fd exhaustion), `pmrxe stats` keeps answering
//!   within a second meanwhile, a second client still creates its objects and an
//!   ibv_rc_pingpong pair completes, and everything is released when the first one exits;
//! * the device-wide limits `ibv_query_device` reports are exact across two clients (ENOMEM
//!   when the device is full), from a small custom config;
//! * address handles of an exiting client are freed on the lcore (its `address_handles`
//!   gauge and the device's AH count return to 0, over repeated rounds);
//! * under EMFILE the accept loop backs off and logs at most a line per period, and serves
//!   again once the connections go;
//! * a hard RLIMIT_NOFILE below what the limits need refuses the start with one line.
mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// What one `sec_exhaust` run reported: kind → (created, errno).
type Report = HashMap<String, (u64, i32)>;

fn compile(svc: &Service) -> PathBuf {
    let prog = svc.dir.join("sec_exhaust");
    if !prog.exists() {
        compile_c("tests/sec_exhaust.c", &prog, &require_tool("cc"), &["-libverbs"]);
    }
    prog
}

/// A `sec_exhaust` client holding its objects until [`Holder::exit`] (stdin closed).
struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
    report: Report,
    lines: String,
}

impl Holder {
    fn exit(mut self) {
        drop(self.stdin.take());
        let st = wait_timeout(&mut self.child, Duration::from_secs(30));
        assert!(st.is_some_and(|s| s.success()), "sec_exhaust did not exit cleanly ({st:?}):\n{}", self.lines);
    }
}

/// Start `sec_exhaust DEVICE -1 SPECS...` against `svc` and wait for its report.
fn hold(svc: &Service, device: &str, specs: &[&str]) -> Holder {
    let prog = compile(svc);
    let mut child = svc
        .pmrxe()
        .arg("run")
        .arg("--")
        .arg(&prog)
        .args([device, "-1"])
        .args(specs)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn sec_exhaust");
    let stdin = child.stdin.take();
    let out = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut lines = String::new();
    let mut report = Report::new();
    let t0 = Instant::now();
    loop {
        let l = match rx.recv_timeout(Duration::from_secs(120).saturating_sub(t0.elapsed())) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                panic!("sec_exhaust {specs:?}: no HOLDING after {:?}; output:\n{lines}\nservice log:\n{}", t0.elapsed(), tail(&svc.log_text(), 20));
            }
        };
        lines.push_str(&l);
        lines.push('\n');
        if l == "HOLDING" {
            break;
        }
        let w: Vec<&str> = l.split_whitespace().collect();
        if let [kind, "created", n, "errno", e] = w.as_slice() {
            report.insert(kind.to_string(), (n.parse().unwrap(), e.parse().unwrap()));
        }
    }
    eprintln!("sec_exhaust {device} {specs:?} in {:.1} s:\n{lines}", t0.elapsed().as_secs_f64());
    Holder { child, stdin, report, lines }
}

/// `pmrxe stats --json` must answer within a second.
fn stats_fast(svc: &Service) -> serde_json::Value {
    let t0 = Instant::now();
    let v = svc.stats_json();
    let dt = t0.elapsed();
    assert!(dt < Duration::from_secs(1), "pmrxe stats took {dt:?}");
    v
}

fn in_use(v: &serde_json::Value, device: usize, kind: &str) -> u64 {
    v["limits"]["devices"][device]["in_use"][kind].as_u64().unwrap_or_else(|| panic!("no limits.devices[{device}].in_use.{kind} in {v}"))
}

fn live_ahs(v: &serde_json::Value) -> u64 {
    v["lcores"].as_array().expect("lcores").iter().map(|l| l["counters"]["address_handles"].as_u64().expect("address_handles gauge")).sum()
}

const KINDS: [&str; 7] = ["pd", "cq", "qp", "srq", "mr", "mw", "ah"];

/// The base PD and CQ every `sec_exhaust` allocates count against the same caps.
fn base(kind: &str) -> u64 {
    u64::from(matches!(kind, "pd" | "cq"))
}

#[test]
fn one_client_is_refused_at_its_caps_and_others_carry_on() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let d = pmrxe_config::Limits::default();
    let caps: HashMap<&str, u64> = KINDS
        .iter()
        .zip(pmrxe_config::LimitKind::ALL)
        .map(|(k, kind)| {
            assert_eq!(*k, kind.name());
            (*k, u64::from(d.client_cap(kind)))
        })
        .collect();
    // Ask for more than the cap of each kind: the service must stop it at the cap.
    let specs: Vec<String> = KINDS.iter().map(|k| format!("{k}:{}", caps[k] + 50)).collect();
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
    let a = hold(&svc, "pmrxe0", &specs);
    for k in KINDS {
        let (n, e) = a.report[k];
        assert_eq!((n, e), (caps[k] - base(k), libc::EAGAIN), "{k}: refused at the per-client cap {} with EAGAIN; output:\n{}", caps[k], a.lines);
    }
    // The service answers, counted each refusal, and shows the client's holdings.
    let v = stats_fast(&svc);
    for k in KINDS {
        assert_eq!(in_use(&v, 0, k), caps[k], "{k} in use on pmrxe0");
        assert!(v["limits"]["refused"]["client_cap"][k].as_u64().unwrap() >= 1, "{k} refusal counted: {}", v["limits"]);
        assert_eq!(v["limits"]["refused"]["device_limit"][k].as_u64(), Some(0));
    }
    let me = v["limits"]["per_client"].as_array().unwrap().iter().find(|c| c["held"]["qp"].as_u64() == Some(caps["qp"])).expect("the holder in per_client");
    assert!(me["held"]["fds"].as_u64().unwrap() >= caps["qp"] + caps["cq"] + caps["srq"], "fds counted per client: {me}");
    assert!(me["refused"].as_u64().unwrap() >= KINDS.len() as u64);
    let svc_log_lines = svc.log_text().lines().count();
    // Another client still creates its objects, and traffic flows.
    let specs_b: Vec<String> = KINDS.iter().map(|k| format!("{k}:8")).collect();
    let specs_b: Vec<&str> = specs_b.iter().map(String::as_str).collect();
    let b = hold(&svc, "pmrxe0", &specs_b);
    for k in KINDS {
        assert_eq!(b.report[k], (8, 0), "second client's {k}: {}", b.lines);
    }
    b.exit();
    loopback_pingpong(&svc, 200, port_for(370), Duration::from_secs(60)).assert_ok();
    stats_fast(&svc);
    // Everything is released when the first client goes.
    a.exit();
    wait_until(Duration::from_secs(10), "the holder's objects released", || {
        let v = svc.stats_json();
        KINDS.iter().all(|k| in_use(&v, 0, k) == 0) && v["limits"]["fds"]["in_use"].as_u64() == Some(0)
    });
    // Refusals are not logged one by one.
    let grown = svc.log_text().lines().count().saturating_sub(svc_log_lines);
    assert!(grown < 40, "the log grew by {grown} lines:\n{}", tail(&svc.log_text(), 40));
}

/// A loopback config with small device limits and per-client caps.
fn small_config(dir: &Path, limits: &str) -> PathBuf {
    let base = std::fs::read_to_string(repo_root().join("configs/loopback.toml")).unwrap();
    assert!(!base.contains("[limits"), "configs/loopback.toml gained a [limits] table: adapt this test");
    let p = dir.join("small-limits.toml");
    std::fs::write(&p, format!("{base}\n{limits}\n")).unwrap();
    p
}

#[test]
fn device_limits_are_exact_across_clients() {
    let _l = heavy_lock();
    let dir = TempDir::new("limits");
    let mut limits = String::from("[limits]\n");
    for k in KINDS {
        limits.push_str(&format!("max_{k} = 8\n"));
    }
    limits.push_str("[limits.per_client]\n");
    for k in KINDS {
        limits.push_str(&format!("max_{k} = 5\n"));
    }
    let cfg = small_config(dir.path(), &limits);
    let svc = Service::start(Some(&cfg), None);
    let specs: Vec<String> = KINDS.iter().map(|k| format!("{k}:20")).collect();
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
    let a = hold(&svc, "pmrxe0", &specs);
    for k in KINDS {
        assert_eq!(a.report[k], (5 - base(k), libc::EAGAIN), "{k}: first client stopped at its cap of 5: {}", a.lines);
    }
    let b = hold(&svc, "pmrxe0", &specs);
    for k in KINDS {
        assert_eq!(b.report[k], (8 - 5 - base(k), libc::ENOMEM), "{k}: second client stopped by the device limit of 8: {}", b.lines);
    }
    let v = stats_fast(&svc);
    for k in KINDS {
        assert_eq!(in_use(&v, 0, k), 8, "{k}: exactly the device limit in use");
        assert_eq!(in_use(&v, 1, k), 0, "{k}: the other device untouched");
        assert_eq!(v["limits"]["devices"][0]["max"][k].as_u64(), Some(8));
        assert!(v["limits"]["refused"]["device_limit"][k].as_u64().unwrap() >= 1);
    }
    // The other device has its own limits: a third client fills pmrxe1 to its caps.
    let c = hold(&svc, "pmrxe1", &specs);
    for k in KINDS {
        assert_eq!(c.report[k], (5 - base(k), libc::EAGAIN), "{k} on pmrxe1: {}", c.lines);
    }
    c.exit();
    // When one client goes, its share is free for the other.
    a.exit();
    wait_until(Duration::from_secs(10), "the first client's objects released", || in_use(&svc.stats_json(), 0, "qp") == 3);
    let a2 = hold(&svc, "pmrxe0", &specs);
    for k in KINDS {
        assert_eq!(a2.report[k], (5 - base(k), libc::EAGAIN), "{k}: a new client gets its cap again: {}", a2.lines);
    }
    a2.exit();
    b.exit();
    wait_until(Duration::from_secs(10), "all released", || {
        let v = svc.stats_json();
        KINDS.iter().all(|k| in_use(&v, 0, k) == 0)
    });
}

#[test]
fn address_handles_are_freed_when_their_client_exits() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    for round in 0..3 {
        let a = hold(&svc, "pmrxe0", &["ah:400"]);
        let b = hold(&svc, "pmrxe1", &["ah:300"]);
        assert_eq!(a.report["ah"], (400, 0));
        assert_eq!(b.report["ah"], (300, 0));
        let v = stats_fast(&svc);
        assert_eq!(live_ahs(&v), 700, "round {round}: the lcore holds both clients' AHs");
        assert_eq!(in_use(&v, 0, "ah") + in_use(&v, 1, "ah"), 700);
        a.exit();
        wait_until(Duration::from_secs(10), "the first client's AHs freed on the lcore", || live_ahs(&svc.stats_json()) == 300);
        b.exit();
        wait_until(Duration::from_secs(10), "every AH freed", || {
            let v = svc.stats_json();
            live_ahs(&v) == 0 && in_use(&v, 0, "ah") == 0 && in_use(&v, 1, "ah") == 0
        });
    }
}

/// Set `pid`'s soft RLIMIT_NOFILE (the hard limit stays: raising it needs CAP_SYS_RESOURCE).
fn set_soft_nofile(pid: u32, soft: u64) {
    let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: prlimit reading another process's limit into `old`.
    let r = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
    assert_eq!(r, 0, "prlimit({pid}): {}", std::io::Error::last_os_error());
    let new = libc::rlimit { rlim_cur: soft.min(old.rlim_max), rlim_max: old.rlim_max };
    // SAFETY: prlimit on another process with a valid new limit and no old-limit output.
    let r = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) };
    assert_eq!(r, 0, "prlimit({pid}): {}", std::io::Error::last_os_error());
}

fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as u64
}

#[test]
fn accept_under_emfile_backs_off_with_a_bounded_log() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let lines_before = svc.log_text().lines().count();
    // Leave the service room for 20 more fds, then connect far more clients than that and
    // keep them connected for a while: accept fails with EMFILE again and again.
    let open = open_fds(svc.pid);
    set_soft_nofile(svc.pid, open + 20);
    let mut conns: Vec<OwnedFd> = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(4) {
        if conns.len() < 120 {
            match pmrxe_abi::ctrl::seqpacket_connect(&svc.socket) {
                Ok(c) => conns.push(c),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        } else {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert!(conns.len() > 40, "only {} connections made", conns.len());
    // The control thread backs off instead of spinning: a few % of a CPU at most.
    let cpu = |pid: u32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/stat")).unwrap();
        let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let c0 = cpu(svc.pid);
    std::thread::sleep(Duration::from_secs(2));
    let ticks = cpu(svc.pid) - c0;
    assert!(ticks < 40, "the accept loop used {ticks} ticks in 2 s under EMFILE");
    drop(conns);
    set_soft_nofile(svc.pid, u64::MAX);
    // It serves again once the connections are gone.
    wait_until(Duration::from_secs(15), "the service answers after EMFILE", || svc.pmrxe().args(["stats", "--json"]).output().is_ok_and(|o| o.status.success()));
    let v = stats_fast(&svc);
    assert!(v["limits"]["accept_errors"].as_u64().unwrap() > 0, "accept errors counted: {}", v["limits"]);
    let log = svc.log_text();
    let new: Vec<&str> = log.lines().skip(lines_before).collect();
    let accept_lines = new.iter().filter(|l| l.contains("accept")).count();
    assert!((1..=2).contains(&accept_lines), "{accept_lines} accept lines in ~6 s (one per 10 s expected):\n{}", new.join("\n"));
    assert!(new.len() < 60, "the log grew by {} lines:\n{}", new.len(), tail(&log, 40));
    loopback_pingpong(&svc, 100, port_for(371), Duration::from_secs(60)).assert_ok();
}

#[test]
fn a_hard_fd_limit_below_the_limits_refuses_to_start() {
    let _l = heavy_lock();
    let dir = TempDir::new("nofile");
    let log = dir.join("serve.log");
    let mut cmd = Command::new(pmrxe_bin());
    cmd.arg("serve").env("PMRXE_SOCKET", dir.join("pmrxe.sock")).stdin(Stdio::null());
    cmd.stdout(std::fs::File::create(&log).unwrap()).stderr(std::fs::File::create(dir.join("serve.err")).unwrap());
    // SAFETY: only setrlimit (async-signal-safe) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let l = libc::rlimit { rlim_cur: 512, rlim_max: 512 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(60)).expect("pmrxe serve must exit");
    assert!(!st.success());
    let out = read_to_string_lossy(&log) + &read_to_string_lossy(&dir.join("serve.err"));
    let hits: Vec<&str> = out.lines().filter(|l| l.contains("RLIMIT_NOFILE hard limit 512 cannot cover the configured limits")).collect();
    assert_eq!(hits.len(), 1, "one line with the numbers:\n{out}");
    assert!(hits[0].contains("max_qp 1024") && hits[0].contains("2 devices"), "{}", hits[0]);
    let _ = std::io::stderr().flush();
}

fn call(c: &pmrxe_service::client::Client, req: pmrxe_abi::ctrl::Request) -> (pmrxe_abi::ctrl::Response, Vec<OwnedFd>) {
    c.call(&req, &[]).unwrap_or_else(|e| panic!("{req:?}: {e}"))
}

fn map_fd(fd: &OwnedFd, len: usize) -> *mut u8 {
    use std::os::fd::AsRawFd;
    // SAFETY: a shared mapping of a segment fd the service handed us, `len` bytes long.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    p.cast()
}

/// A UD send naming another client's AH handle fails (the lcore looks AHs up under the
/// posting QP's client): the WQE completes in error and is counted, while the same post
/// with the client's own AH succeeds.
#[test]
fn a_ud_post_naming_another_clients_ah_fails() {
    use pmrxe_abi::ctrl::{AhAttr, QpAttr, QpCap, Request, Response};
    use pmrxe_abi::ring::{Consumer, Producer};
    use pmrxe_abi::{send_flags, wr_opcode, ClientPage, ShmCqe, ShmSendWqe, ABI_VERSION, CLIENT_PAGE_LEN};
    use pmrxe_service::client::Client;
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let hello = |c: &Client| call(c, Request::Hello { abi_version: ABI_VERSION, pid: std::process::id(), program: "ah-probe".into() }).1;
    let gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1];
    let attr = AhAttr { is_global: true, sgid_index: 1, hop_limit: 64, port_num: 1, dgid: gid, ..Default::default() };
    let pd_of = |c: &Client| match call(c, Request::AllocPd { device: 0 }).0 {
        Response::Pd { pd } => pd,
        r => panic!("AllocPd: {r:?}"),
    };
    let ah_of = |c: &Client, pd: u32| match call(c, Request::CreateAh { pd, attr }).0 {
        Response::Ah { ah } => ah,
        r => panic!("CreateAh: {r:?}"),
    };
    // Client A: an AH, nothing else.
    let a = Client::connect(&svc.socket).unwrap();
    hello(&a);
    let ah_a = ah_of(&a, pd_of(&a));
    // Client B: a UD QP in RTS, its CQ and its own AH.
    let b = Client::connect(&svc.socket).unwrap();
    let pfds = hello(&b);
    let page = map_fd(&pfds[0], CLIENT_PAGE_LEN as usize) as *const ClientPage;
    let pd = pd_of(&b);
    let ah_b = ah_of(&b, pd);
    let (r, cfds) = call(&b, Request::CreateCq { device: 0, cqe: 64, channel: None });
    let Response::Cq { cq, layout: cl, .. } = r else { panic!("CreateCq: {r:?}") };
    let cap = QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 };
    let (r, qfds) = call(&b, Request::CreateQp { device: 0, pd, qp_type: 4, send_cq: cq, recv_cq: cq, srq: None, cap, sq_sig_all: true });
    let Response::Qp { qpn, layout: ql, doorbell, .. } = r else { panic!("CreateQp: {r:?}") };
    let qkey = 0x1111;
    for (attr, mask) in [
        (QpAttr { qp_state: 1, port_num: 1, qkey, ..Default::default() }, 1 | 16 | 32 | 64),
        (QpAttr { qp_state: 2, ..Default::default() }, 1),
        (QpAttr { qp_state: 3, ..Default::default() }, 1 | 65536),
    ] {
        assert_eq!(call(&b, Request::ModifyQp { qpn, attr, mask }).0, Response::Ok);
    }
    let qseg = map_fd(&qfds[0], ql.total_len as usize);
    let cseg = map_fd(&cfds[0], cl.total_len as usize);
    // SAFETY: the service laid both segments out as `ql`/`cl` say and initialised the rings.
    let (mut sq, mut cqr) = unsafe {
        (
            Producer::<ShmSendWqe>::attach(qseg.add(ql.sq_offset as usize), (ql.rq_offset - ql.sq_offset) as usize, ql.sq_capacity).unwrap(),
            Consumer::<ShmCqe>::attach(cseg.add(cl.ring_offset as usize), (cl.total_len - cl.ring_offset) as usize, cl.capacity).unwrap(),
        )
    };
    let bad_wqes = || -> u64 { svc.stats_json()["lcores"].as_array().unwrap().iter().map(|l| l["counters"]["bad_wqes"].as_u64().unwrap()).sum() };
    let mut post = |wr_id: u64, ah: u32, wait: Duration| -> Option<ShmCqe> {
        let w = ShmSendWqe { wr_id, opcode: wr_opcode::SEND, send_flags: send_flags::SIGNALED | send_flags::INLINE, inline_len: 8, length: 8, ah, remote_qpn: qpn, remote_qkey: qkey, ..Default::default() };
        assert!(sq.push(w).is_ok(), "SQ full");
        // SAFETY: `page` maps the client page the service handed us.
        unsafe { (*page).ring(doorbell) };
        let t0 = Instant::now();
        while t0.elapsed() < wait {
            if let Some(c) = cqr.pop().unwrap() {
                return Some(c);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    };
    let qp_state = || match call(&b, Request::QueryQp { qpn }).0 {
        Response::QpAttr { attr, .. } => attr.qp_state,
        r => panic!("QueryQp: {r:?}"),
    };
    let before = bad_wqes();
    let own = post(1, ah_b, Duration::from_secs(10)).expect("a completion for the send with the client's own AH");
    assert_eq!((own.wr_id, own.status), (1, 0), "a send with the client's own AH succeeds: {own:?}");
    assert_eq!(bad_wqes(), before);
    assert_eq!(qp_state(), 3, "RTS");
    // The same send naming client A's AH: refused as a bad WQE (never sent), the QP to ERROR.
    let foreign = post(2, ah_a, Duration::from_secs(2));
    assert!(foreign.is_none_or(|c| c.status != 0), "a send naming another client's AH must not succeed: {foreign:?}");
    wait_until(Duration::from_secs(5), "the foreign AH counted as a bad WQE", || bad_wqes() == before + 1);
    assert_eq!(qp_state(), 6, "the QP that named a foreign AH is in ERROR");
    drop((a, b));
}
