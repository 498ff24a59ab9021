//! Bad clients of the control socket and of the shared rings: garbage messages, wrong ABI, no
//! Hello, huge counts, unknown and foreign handles, scribbled SQ rings, a shrunk shared
//! segment, a foreign uid, and a verbs program SIGKILLed mid-transfer. After each, the service
//! must still answer, release what the client owned, and serve a fresh ibv_rc_pingpong pair.
mod common;

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::*;
use pmrxe_abi::ctrl::{self, QpCap, Request, Response};
use pmrxe_abi::{ClientPage, ABI_VERSION, CLIENT_PAGE_LEN};
use pmrxe_service::client::Client;

fn hello(c: &Client) -> (u32, Vec<OwnedFd>) {
    let (r, fds) = c.call(&Request::Hello { abi_version: ABI_VERSION, pid: std::process::id(), program: "bad-client".into() }, &[]).unwrap();
    let Response::Hello { client_id, .. } = r else { panic!("Hello: {r:?}") };
    (client_id, fds)
}

fn errno(r: &Response) -> Option<i32> {
    match r {
        Response::Err { errno, .. } => Some(*errno),
        _ => None,
    }
}

fn raw_seqpacket(path: &std::path::Path) -> OwnedFd {
    ctrl::seqpacket_connect(path).expect("connect")
}

fn send_raw(fd: RawFd, bytes: &[u8]) -> Option<Response> {
    ctrl::send_msg(fd, bytes, &[]).ok()?;
    let mut buf = Vec::new();
    ctrl::recv_msg(fd, &mut buf).ok()??;
    ctrl::decode(&buf).ok()
}

fn map(fd: RawFd, len: usize) -> *mut u8 {
    // SAFETY: shared mapping of a segment fd the service handed us.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    p.cast()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn alive(svc: &Service, what: &str) -> serde_json::Value {
    let o = svc.pmrxe().args(["stats", "--json"]).output().unwrap();
    assert!(o.status.success(), "after {what}: the service does not answer; log:\n{}", tail(&svc.log_text(), 30));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn pingpong_ok(svc: &Service, port: u16, what: &str) {
    let p = port.to_string();
    run_pair(
        svc,
        &["ibv_rc_pingpong", "-d", "pmrxe0", "-g", "1", "-c", "-n", "200", "-p", &p],
        &["ibv_rc_pingpong", "-d", "pmrxe1", "-g", "1", "-c", "-n", "200", "-p", &p, "127.0.0.1"],
        port,
        Duration::from_secs(30),
    )
    .assert_ok();
    eprintln!("bad clients: fresh ibv_rc_pingpong pair ok after {what}");
}

fn clients(v: &serde_json::Value) -> usize {
    v["clients"].as_array().map_or(0, |a| a.len())
}

#[test]
fn bad_clients() {
    require_root();
    let _lock = heavy_lock();
    require_tool("ibv_rc_pingpong");
    require_tool("ib_write_bw");
    let svc = Service::start_loopback();

    // Socket permissions and SO_PEERCRED.
    let mode = std::fs::metadata(&svc.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "control socket mode {mode:o}");
    std::fs::set_permissions(&svc.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = std::process::Command::new(require_tool("setpriv"))
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(pmrxe_bin())
        .arg("stats")
        .env("PMRXE_SOCKET", &svc.socket)
        .output()
        .unwrap();
    std::fs::set_permissions(&svc.socket, std::fs::Permissions::from_mode(0o660)).unwrap();
    assert!(!o.status.success(), "a client of another uid was served: {}", String::from_utf8_lossy(&o.stdout));
    eprintln!("bad clients: socket 0660; uid 65534 refused (SO_PEERCRED): {}", String::from_utf8_lossy(&o.stderr).trim());

    // Garbage, empty, oversized and truncated messages on one connection.
    let fd = raw_seqpacket(&svc.socket);
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let mut answered = 0;
    for i in 0..300 {
        let len = match i % 5 {
            0 => 1,
            1 => (rng.next() % 64) as usize,
            2 => (rng.next() % 4096) as usize,
            3 => ctrl::MAX_MSG,
            _ => 8,
        };
        let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if i % 7 == 0 && b.len() >= 12 {
            // A valid variant tag followed by a huge length prefix.
            b[..4].copy_from_slice(&((i % 33) as u32).to_le_bytes());
            b[4..12].copy_from_slice(&u64::MAX.to_le_bytes());
        }
        if b.is_empty() {
            continue;
        }
        match send_raw(fd.as_raw_fd(), &b) {
            Some(r) => {
                assert!(errno(&r).is_some() || matches!(r, Response::Stats(_)), "garbage accepted: {r:?}");
                answered += 1;
            }
            None => break,
        }
    }
    drop(fd);
    alive(&svc, "garbage");
    eprintln!("bad clients: 300 garbage messages, {answered} answered with an error");

    // No Hello; wrong ABI; double Hello.
    let c = Client::connect(&svc.socket).unwrap();
    let (r, _) = c.call(&Request::AllocPd { device: 0 }, &[]).unwrap();
    assert_eq!(errno(&r), Some(libc::EPROTO), "request before Hello: {r:?}");
    let (r, _) = c.call(&Request::Hello { abi_version: ABI_VERSION + 1000, pid: 1, program: "x".into() }, &[]).unwrap();
    assert_eq!(errno(&r), Some(libc::EPROTONOSUPPORT), "wrong ABI: {r:?}");
    let _ = hello(&c);
    let (r, _) = c.call(&Request::Hello { abi_version: ABI_VERSION, pid: 1, program: "x".into() }, &[]).unwrap();
    assert!(errno(&r).is_some(), "second Hello accepted: {r:?}");

    // Huge counts and unknown handles.
    let pd = match c.call(&Request::AllocPd { device: 0 }, &[]).unwrap().0 {
        Response::Pd { pd } => pd,
        r => panic!("AllocPd: {r:?}"),
    };
    let big = QpCap { max_send_wr: u32::MAX, max_recv_wr: u32::MAX, max_send_sge: u32::MAX, max_recv_sge: u32::MAX, max_inline_data: u32::MAX };
    let huge: Vec<(&str, Request)> = vec![
        ("AllocPd device 999", Request::AllocPd { device: 999 }),
        ("CreateCq cqe=u32::MAX", Request::CreateCq { device: 0, cqe: u32::MAX, channel: None }),
        ("CreateCq unknown channel", Request::CreateCq { device: 0, cqe: 16, channel: Some(777_777) }),
        ("AllocMr max_num_sg=u32::MAX", Request::AllocMr { pd, max_num_sg: u32::MAX }),
        ("RegMr len=u64::MAX", Request::RegMr { pd, addr: 0x1000, len: u64::MAX, iova: 0, access: 7, pieces: vec![] }),
        ("RegMr addr+len wraps", Request::RegMr { pd, addr: u64::MAX - 4095, len: 8192, iova: 0, access: 7, pieces: vec![] }),
        ("RegMr unknown segment", Request::RegMr { pd, addr: 0x10000, len: 4096, iova: 0x10000, access: 7, pieces: vec![ctrl::Piece { seg: 42, seg_offset: 0, len: 4096 }] }),
        ("MapMrSg unknown key", Request::MapMrSg { key: 0xdead, sg: vec![(0, u64::MAX); 1000], sg_offset: u64::MAX, page_size: 0 }),
        ("AddSegment without fd", Request::AddSegment { seg: 1, base: 0, len: 1 << 40 }),
        ("AddSharedSegment without fd", Request::AddSharedSegment { seg: 2, base: 0, len: 1 << 40, offset: u64::MAX }),
        ("CreateSrq max_wr=u32::MAX", Request::CreateSrq { device: 0, pd, max_wr: u32::MAX, max_sge: u32::MAX, srq_limit: 0 }),
        ("DeallocPd unknown", Request::DeallocPd { pd: 0xffff_fff0 }),
        ("DestroyCq unknown", Request::DestroyCq { cq: 123_456 }),
        ("DestroyQp unknown", Request::DestroyQp { qpn: 0xff_ffff }),
        ("ModifyQp unknown", Request::ModifyQp { qpn: 0x11, attr: Default::default(), mask: u32::MAX }),
        ("QueryQp unknown", Request::QueryQp { qpn: 0 }),
        ("DeregMr unknown", Request::DeregMr { key: 0x1234_5678 }),
        ("DeallocMw unknown", Request::DeallocMw { key: 0 }),
        ("DestroyAh unknown", Request::DestroyAh { ah: 5 }),
        ("DestroySrq unknown", Request::DestroySrq { srq: 5 }),
        ("ReleaseSegment unknown", Request::ReleaseSegment { seg: u64::MAX }),
        ("DestroyCompChannel unknown", Request::DestroyCompChannel { channel: 9 }),
    ];
    for (name, req) in huge {
        let (r, _) = c.call(&req, &[]).unwrap_or_else(|e| panic!("{name}: connection dropped ({e})"));
        assert!(errno(&r).is_some(), "{name}: accepted: {r:?}");
    }
    // CreateQp with absurd caps on a real CQ.
    let cq = match c.call(&Request::CreateCq { device: 0, cqe: 64, channel: None }, &[]).unwrap().0 {
        Response::Cq { cq, .. } => cq,
        r => panic!("CreateCq: {r:?}"),
    };
    let (r, _) = c.call(&Request::CreateQp { device: 0, pd, qp_type: 2, send_cq: cq, recv_cq: cq, srq: None, cap: big, sq_sig_all: false }, &[]).unwrap();
    assert!(errno(&r).is_some(), "CreateQp with u32::MAX caps accepted: {r:?}");
    let (r, _) = c.call(&Request::CreateQp { device: 0, pd, qp_type: 99, send_cq: cq, recv_cq: cq, srq: None, cap: QpCap::default(), sq_sig_all: false }, &[]).unwrap();
    assert!(errno(&r).is_some(), "CreateQp type 99 accepted: {r:?}");
    // Enum values that are no member of their verbs enum are EINVAL through the real control
    // socket, never a default (an unknown qp_state once meant RESET, an unknown MTU 1024).
    let (r, _qfds) = c.call(&Request::CreateQp { device: 0, pd, qp_type: 2, send_cq: cq, recv_cq: cq, srq: None, cap: QpCap::default(), sq_sig_all: false }, &[]).unwrap();
    let Response::Qp { qpn, .. } = r else { panic!("CreateQp: {r:?}") };
    let init = ctrl::QpAttr { qp_state: 1, port_num: 1, qp_access_flags: 15, ..Default::default() };
    assert_eq!(c.call(&Request::ModifyQp { qpn, attr: init, mask: 1 | 16 | 32 | 8 }, &[]).unwrap().0, Response::Ok, "RESET→INIT");
    let mut rtr = ctrl::QpAttr { qp_state: 2, path_mtu: 3, dest_qp_num: qpn, max_dest_rd_atomic: 1, min_rnr_timer: 1, ..Default::default() };
    rtr.ah_attr = ctrl::AhAttr { is_global: true, sgid_index: 1, hop_limit: 64, port_num: 1, dgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1], ..Default::default() };
    let rtr_mask = 1 | 128 | 256 | 1048576 | 4096 | 131072 | 32768;
    for (name, attr, mask) in [
        ("qp_state 42", ctrl::QpAttr { qp_state: 42, ..Default::default() }, 1),
        ("cur_qp_state 9", ctrl::QpAttr { qp_state: 6, cur_qp_state: 9, ..Default::default() }, 1 | 2),
        ("path_mtu 9", ctrl::QpAttr { path_mtu: 9, ..rtr }, rtr_mask),
        ("path_mtu 0", ctrl::QpAttr { path_mtu: 0, ..rtr }, rtr_mask),
        ("dest_qp_num with bit 24", ctrl::QpAttr { dest_qp_num: qpn | 1 << 24, ..rtr }, rtr_mask),
    ] {
        let (r, _) = c.call(&Request::ModifyQp { qpn, attr, mask }, &[]).unwrap();
        assert_eq!(errno(&r), Some(libc::EINVAL), "ModifyQp {name}: {r:?}");
    }
    match c.call(&Request::QueryQp { qpn }, &[]).unwrap().0 {
        Response::QpAttr { attr, .. } => assert_eq!(attr.qp_state, 1, "refused modifies left the QP in INIT"),
        r => panic!("QueryQp: {r:?}"),
    }
    // The same QP takes the valid RTR.
    assert_eq!(c.call(&Request::ModifyQp { qpn, attr: rtr, mask: rtr_mask }, &[]).unwrap().0, Response::Ok, "INIT→RTR");
    let (r, _) = c.call(&Request::CreateQp { device: 0, pd, qp_type: 0, send_cq: cq, recv_cq: cq, srq: None, cap: QpCap::default(), sq_sig_all: false }, &[]).unwrap();
    assert_eq!(errno(&r), Some(libc::EINVAL), "CreateQp type 0: {r:?}");
    // Multicast: an RC QP or a unicast/garbage GID is refused; a UD QP attaches.
    let group: [u8; 16] = std::net::Ipv4Addr::new(239, 5, 5, 5).to_ipv6_mapped().octets();
    let (r, _) = c.call(&Request::AttachMcast { qpn, gid: group }, &[]).unwrap();
    assert_eq!(errno(&r), Some(libc::EINVAL), "AttachMcast of an RC QP: {r:?}");
    assert_eq!(c.call(&Request::DestroyQp { qpn }, &[]).unwrap().0, Response::Ok);
    let (r, _udfds) = c.call(&Request::CreateQp { device: 0, pd, qp_type: 4, send_cq: cq, recv_cq: cq, srq: None, cap: QpCap::default(), sq_sig_all: false }, &[]).unwrap();
    let Response::Qp { qpn: ud, .. } = r else { panic!("UD QP: {r:?}") };
    for gid in [[0u8; 16], [0xaa; 16], std::net::Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped().octets()] {
        let (r, _) = c.call(&Request::AttachMcast { qpn: ud, gid }, &[]).unwrap();
        assert_eq!(errno(&r), Some(libc::EINVAL), "AttachMcast {gid:?}: {r:?}");
    }
    assert_eq!(c.call(&Request::AttachMcast { qpn: ud, gid: group }, &[]).unwrap().0, Response::Ok);
    let (r, _) = c.call(&Request::AttachMcast { qpn: 0xff_ffff, gid: group }, &[]).unwrap();
    assert_eq!(errno(&r), Some(libc::EINVAL), "AttachMcast of QPN 0xFFFFFF: {r:?}");
    alive(&svc, "huge counts");
    eprintln!("bad clients: no-Hello, wrong ABI, double Hello, 23 huge/unknown-handle requests: all refused with an errno");

    // Another client's handles.
    let c2 = Client::connect(&svc.socket).unwrap();
    let _ = hello(&c2);
    for (name, req) in [
        ("DeallocPd(foreign)", Request::DeallocPd { pd }),
        ("DestroyCq(foreign)", Request::DestroyCq { cq }),
        ("CreateQp(foreign pd, cq)", Request::CreateQp { device: 0, pd, qp_type: 2, send_cq: cq, recv_cq: cq, srq: None, cap: QpCap::default(), sq_sig_all: false }),
        ("AllocMr(foreign pd)", Request::AllocMr { pd, max_num_sg: 4 }),
        ("AttachMcast(foreign qp)", Request::AttachMcast { qpn: ud, gid: group }),
        ("DetachMcast(foreign qp)", Request::DetachMcast { qpn: ud, gid: group }),
    ] {
        let (r, _) = c2.call(&req, &[]).unwrap();
        assert!(errno(&r).is_some(), "{name} accepted: {r:?}");
    }
    // c still owns them (its UD QP goes while attached: the service detaches it).
    assert_eq!(c.call(&Request::DestroyQp { qpn: ud }, &[]).unwrap().0, Response::Ok, "owner's DestroyQp of an attached QP");
    let (r, _) = c.call(&Request::DestroyCq { cq }, &[]).unwrap();
    assert_eq!(r, Response::Ok, "owner's DestroyCq");

    // Scribbled SQ ring: garbage header indices, garbage WQEs, doorbell.
    let c3 = Client::connect(&svc.socket).unwrap();
    let (_, pfds) = hello(&c3);
    let page = map(pfds[0].as_raw_fd(), CLIENT_PAGE_LEN as usize) as *const ClientPage;
    let pd3 = match c3.call(&Request::AllocPd { device: 0 }, &[]).unwrap().0 {
        Response::Pd { pd } => pd,
        r => panic!("{r:?}"),
    };
    let cq3 = match c3.call(&Request::CreateCq { device: 0, cqe: 64, channel: None }, &[]).unwrap().0 {
        Response::Cq { cq, .. } => cq,
        r => panic!("{r:?}"),
    };
    let before = alive(&svc, "setup");
    let mut scribbles = 0;
    for pass in 0..12u64 {
        let cap = QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 64 };
        let (r, qfds) = c3.call(&Request::CreateQp { device: 0, pd: pd3, qp_type: 2 + (pass % 2) as u32, send_cq: cq3, recv_cq: cq3, srq: None, cap, sq_sig_all: true }, &[]).unwrap();
        let Response::Qp { qpn, layout, doorbell, .. } = r else { panic!("CreateQp: {r:?}") };
        // Move it to RTS (to itself) so the lcore executes what it finds.
        let mut a = ctrl::QpAttr { qp_state: 1, port_num: 1, qp_access_flags: 15, ..Default::default() };
        let _ = c3.call(&Request::ModifyQp { qpn, attr: a, mask: 1 | 16 | 32 | 8 }, &[]);
        a = ctrl::QpAttr { qp_state: 2, path_mtu: 3, dest_qp_num: qpn, max_dest_rd_atomic: 1, min_rnr_timer: 1, ..Default::default() };
        a.ah_attr = pmrxe_abi::ctrl::AhAttr { is_global: true, sgid_index: 1, hop_limit: 64, port_num: 1, dgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1], ..Default::default() };
        let _ = c3.call(&Request::ModifyQp { qpn, attr: a, mask: 1 | 128 | 256 | 1048576 | 4096 | 131072 | 32768 }, &[]);
        a = ctrl::QpAttr { qp_state: 3, timeout: 10, retry_cnt: 1, rnr_retry: 1, max_rd_atomic: 1, ..Default::default() };
        let _ = c3.call(&Request::ModifyQp { qpn, attr: a, mask: 1 | 512 | 1024 | 2048 | 65536 | 8192 }, &[]);
        let seg = map(qfds[0].as_raw_fd(), layout.total_len as usize);
        // SAFETY: the service's layout puts the SQ ring inside the `total_len` bytes mapped.
        let sq = unsafe { seg.add(layout.sq_offset as usize) };
        let sq_len = if layout.rq_capacity > 0 { layout.rq_offset - layout.sq_offset } else { layout.total_len - layout.sq_offset } as usize;
        let mut rng = Rng(0x1234_5678 + pass);
        // SAFETY: all writes stay inside the mapping of `total_len` bytes.
        unsafe {
            let w32 = |off: usize, v: u32| (sq.add(off) as *mut u32).write_volatile(v);
            match pass % 4 {
                0 => {
                    // Valid header, garbage WQEs: producer = consumer + 8.
                    for i in 192..sq_len {
                        *sq.add(i) = rng.next() as u8;
                    }
                    w32(64, 8);
                }
                1 => w32(64, 0xffff_fff0), // producer far ahead of capacity
                2 => {
                    w32(0, rng.next() as u32); // magic
                    w32(4, 1); // entry size
                    w32(8, 0x8000_0000); // capacity
                    w32(64, 3);
                }
                _ => {
                    for i in 0..sq_len {
                        *sq.add(i) = rng.next() as u8;
                    }
                    // and the RQ header too
                    for i in layout.rq_offset as usize..(layout.rq_offset as usize + 256).min(layout.total_len as usize) {
                        *seg.add(i) = rng.next() as u8;
                    }
                }
            }
            (*page).ring(doorbell);
        }
        scribbles += 1;
        std::thread::sleep(Duration::from_millis(50));
        alive(&svc, &format!("scribble pass {pass}"));
        let _ = c3.call(&Request::DestroyQp { qpn }, &[]);
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(seg.cast(), layout.total_len as usize) };
    }
    let after = alive(&svc, "scribbles");
    let ctr = |v: &serde_json::Value, n: &str| -> u64 { v["lcores"].as_array().into_iter().flatten().map(|l| l["counters"][n].as_u64().unwrap_or(0)).sum() };
    let (rc, bw) = (ctr(&after, "ring_corrupt") - ctr(&before, "ring_corrupt"), ctr(&after, "bad_wqes") - ctr(&before, "bad_wqes"));
    eprintln!("bad clients: {scribbles} scribbled SQ rings + doorbells: service alive; ring_corrupt +{rc}, bad_wqes +{bw}");
    assert!(rc + bw > 0, "scribbled rings went unnoticed (ring_corrupt/bad_wqes unchanged)");
    drop((c, c2, c3));

    // All those clients disconnected: their objects are gone.
    let t0 = Instant::now();
    while clients(&alive(&svc, "disconnects")) > 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(clients(&alive(&svc, "disconnects")), 0, "clients left after disconnect");
    pingpong_ok(&svc, 19460, "control-socket abuse and scribbled rings");

    // A verbs program SIGKILLed mid-transfer (ib_write_bw for 20 s, killed after ~1.5 s).
    let so = svc.dir.join("kill.server");
    let co = svc.dir.join("kill.client");
    let mut s = spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe0", "-F", "-D", "20", "-p", "19461"], &so);
    let t0 = Instant::now();
    while !listens_on(s.id(), 19461) && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut c = spawn_verbs(&svc, &["ib_write_bw", "-d", "pmrxe1", "-F", "-D", "20", "-p", "19461", "127.0.0.1"], &co);
    let mut saw_qps = false;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        let v = alive(&svc, "write_bw start");
        let qps: usize = v["lcores"].as_array().into_iter().flatten().map(|l| l["qps"].as_array().map_or(0, |q| q.len())).sum();
        let tx = ctr(&v, "tx_packets");
        if qps >= 2 && tx > 1000 {
            saw_qps = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(saw_qps, "ib_write_bw never got going:\n{}\n{}", read_to_string_lossy(&so), read_to_string_lossy(&co));
    // SAFETY: SIGKILL to the client we spawned (pmrxe run execs ib_write_bw: same pid).
    unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
    let _ = c.wait();
    // The server side's peer is gone; kill it too (it would wait for the full duration).
    let _ = wait_timeout(&mut s, Duration::from_secs(3));
    let _ = s.kill();
    let _ = s.wait();
    let t0 = Instant::now();
    let mut v = alive(&svc, "SIGKILL");
    while (clients(&v) > 0 || v["lcores"][0]["qps"].as_array().is_some_and(|q| !q.is_empty())) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        v = alive(&svc, "SIGKILL");
    }
    assert_eq!(clients(&v), 0, "killed client still listed: {}", v["clients"]);
    assert!(v["lcores"][0]["qps"].as_array().is_some_and(|q| q.is_empty()), "killed client's QPs remain: {}", v["lcores"][0]["qps"]);
    eprintln!("bad clients: ib_write_bw SIGKILLed mid-transfer: clients and QPs released in {:.2} s", t0.elapsed().as_secs_f64());
    pingpong_ok(&svc, 19462, "SIGKILL mid-transfer");
}

/// A client shrinks (ftruncate) a memfd segment after registering it, then makes the service
/// write into it with an RDMA WRITE from another QP. Touching a shared mapping beyond the end
/// of its file raises SIGBUS in whoever touches it: here the service's lcore. Segments are
/// therefore sealed against shrinking (F_SEAL_SHRINK) when they enter the service.
#[test]
fn shrunk_segment() {
    use pmrxe_service::native::{self, access, Buffer, Context, Cq, Mr, Pd, Qp, QpOptions};
    require_root();
    let _lock = heavy_lock();
    let svc = Service::start_loopback();
    let ctx = Context::connect(&svc.socket).unwrap();
    let pd0 = Pd::alloc(&ctx, 0).unwrap();
    let pd1 = Pd::alloc(&ctx, 1).unwrap();
    let cq0 = Cq::create(&ctx, 0, 64).unwrap();
    let mut cq1 = Cq::create(&ctx, 1, 64).unwrap();
    let src = Buffer::new(&ctx, 4096).unwrap();
    let dst = Buffer::new(&ctx, 5 * 4096).unwrap();
    let src_mr = Mr::register(&pd1, &src, access::ALL).unwrap();
    let dst_mr = Mr::register(&pd0, &dst, access::ALL).unwrap();
    let qa = Qp::create(&pd0, &cq0, &cq0, QpOptions::default()).unwrap();
    let mut qb = Qp::create(&pd1, &cq1, &cq1, QpOptions::default()).unwrap();
    qa.connect(qb.qpn, qa.av_to(1).unwrap(), 3, 1).unwrap();
    qb.connect(qa.qpn, qb.av_to(0).unwrap(), 3, 1).unwrap();
    // Try to shrink every memfd this client holds: its own segments (dst, src) and the ones
    // the service handed it (client page, CQ and QP rings). All must be sealed.
    let (mut tried, mut shrunk) = (Vec::new(), Vec::new());
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(l) = std::fs::read_link(e.path()) else { continue };
        let name = l.to_string_lossy().into_owned();
        if !name.starts_with("/memfd:pmrxe") {
            continue;
        }
        // SAFETY: ftruncate on an fd of this process.
        if unsafe { libc::ftruncate(fd, 0) } == 0 {
            shrunk.push(name.clone());
        }
        tried.push(name);
    }
    assert!(tried.len() >= 2, "expected the client's memfds, found {tried:?}");
    // The service's own segments, as a raw client receives them (the native library closes
    // them after mapping): client page, CQ ring, QP rings.
    {
        let c = Client::connect(&svc.socket).unwrap();
        let (_, mut fds) = hello(&c);
        let pd = match c.call(&Request::AllocPd { device: 0 }, &[]).unwrap().0 {
            Response::Pd { pd } => pd,
            r => panic!("{r:?}"),
        };
        let (r, f) = c.call(&Request::CreateCq { device: 0, cqe: 16, channel: None }, &[]).unwrap();
        let Response::Cq { cq, .. } = r else { panic!("{r:?}") };
        fds.extend(f);
        let (r, f) = c
            .call(&Request::CreateQp { device: 0, pd, qp_type: 2, send_cq: cq, recv_cq: cq, srq: None, cap: QpCap { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 }, sq_sig_all: false }, &[])
            .unwrap();
        assert!(matches!(r, Response::Qp { .. }), "{r:?}");
        fds.extend(f);
        for (i, fd) in fds.iter().enumerate() {
            // SAFETY: ftruncate on an fd we own.
            if unsafe { libc::ftruncate(fd.as_raw_fd(), 0) } == 0 {
                shrunk.push(format!("service segment #{i}"));
            }
            tried.push(format!("service segment #{i}"));
        }
    }
    qb.post_send(&[native::wqe::write(1, src_mr.sge(0, 4096), dst_mr.addr + 4096, dst_mr.key, true)]).unwrap();
    let t0 = Instant::now();
    let mut done = None;
    while t0.elapsed() < Duration::from_secs(3) && done.is_none() {
        done = cq1.poll_one().ok().flatten();
    }
    let o = svc.pmrxe().arg("stats").output().unwrap();
    assert!(
        o.status.success(),
        "the service died after a client shrank a registered segment (completion: {done:?}); log:\n{}",
        tail(&svc.log_text(), 15)
    );
    assert!(shrunk.is_empty(), "memfds a client could shrink (SIGBUS in the service): {shrunk:?}");
    assert!(done.is_some_and(|c| c.status == 0), "WRITE into the sealed segment did not complete: {done:?}");
    eprintln!("shrunk segment: {} memfds ({tried:?}) all refuse ftruncate; service alive; WRITE ok", tried.len());
}
