//! rdma_cm through the real service, driven with the control protocol directly (what the
//! shim's librdmacm does underneath): listen on pmrxe0, connect from pmrxe1, the CM messages
//! on the wire between the two ports (REQ/REP/RTU/DREQ/DREP), a capture of the exchange
//! checked with tshark and icrc_check.py, and a connect to a port with no listener that fails
//! fast with REJECTED.
mod common;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use pmrxe_abi::ctrl::{self, CmConnParam, CmEventMsg, CmSockAddr, Request, Response};

const PS_TCP: u16 = 0x0106;
const QPT_RC: u32 = 2;
const ADDR_RESOLVED: u32 = 0;
const ROUTE_RESOLVED: u32 = 2;
const CONNECT_REQUEST: u32 = 4;
const REJECTED: u32 = 8;
const ESTABLISHED: u32 = 9;
const DISCONNECTED: u32 = 10;
const TIMEWAIT_EXIT: u32 = 15;

struct Client {
    sock: OwnedFd,
    _page: Vec<OwnedFd>,
}

impl Client {
    fn connect(svc: &Service) -> Client {
        let sock = ctrl::seqpacket_connect(&svc.socket).expect("connect to the service");
        let hello = Request::Hello { abi_version: pmrxe_abi::ABI_VERSION, pid: std::process::id(), program: "cm-test".into() };
        let (r, page) = call(&sock, &hello);
        assert!(matches!(r, Response::Hello { .. }), "{r:?}");
        Client { sock, _page: page }
    }
    fn call(&self, req: Request) -> (Response, Vec<OwnedFd>) {
        call(&self.sock, &req)
    }
    fn ok(&self, req: Request) {
        let (r, _) = self.call(req.clone());
        assert_eq!(r, Response::Ok, "{req:?}");
    }
    fn channel(&self) -> (u32, OwnedFd) {
        match self.call(Request::CmOpenChannel) {
            (Response::CmChannel { channel }, mut fds) if fds.len() == 1 => (channel, fds.remove(0)),
            r => panic!("CmOpenChannel: {r:?}"),
        }
    }
    fn id(&self, channel: u32, context: u64) -> u32 {
        match self.call(Request::CmCreateId { channel, ps: PS_TCP, qp_type: QPT_RC, context }).0 {
            Response::CmId { id } => id,
            r => panic!("CmCreateId: {r:?}"),
        }
    }
}

fn call(sock: &OwnedFd, req: &Request) -> (Response, Vec<OwnedFd>) {
    ctrl::send_msg(sock.as_raw_fd(), &ctrl::encode(req).unwrap(), &[]).expect("send");
    let mut buf = Vec::new();
    let fds = ctrl::recv_msg(sock.as_raw_fd(), &mut buf).expect("recv").expect("service closed the socket");
    (ctrl::decode(&buf).expect("decode"), fds)
}

fn v4(ip: [u8; 4], port: u16) -> CmSockAddr {
    CmSockAddr { ip: std::net::Ipv4Addr::from(ip).to_ipv6_mapped().octets(), v6: false, port }
}

/// The next event on a channel (poll, bounded).
fn next_event(fd: &OwnedFd, limit: Duration) -> CmEventMsg {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, limit.as_millis() as i32) };
    assert_eq!(n, 1, "no rdma_cm event within {limit:?}");
    let mut buf = vec![0u8; 65536];
    // SAFETY: recv into a live buffer of its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    assert!(n > 0, "event socket closed");
    ctrl::decode(&buf[..n as usize]).expect("decode CmEventMsg")
}

fn expect_event(fd: &OwnedFd, want: u32) -> CmEventMsg {
    let e = next_event(fd, Duration::from_secs(10));
    assert_eq!(e.event, want, "{e:?}");
    e
}

fn no_event(fd: &OwnedFd, within: Duration) {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, within.as_millis() as i32) };
    assert_eq!(n, 0, "unexpected event: {:?}", next_event(fd, Duration::from_millis(1)));
}

#[test]
fn rdma_cm_connect_accept_disconnect_over_the_wire_and_reject_without_listener() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let port = port_for(60);

    // Capture the 5 MADs of the exchange: each is seen sent (pmrxe1 or pmrxe0) and received.
    let pcap = svc.dir.join("cm.pcap");
    let mut cap = svc.capture(&["--count", "10"], &pcap);

    let server = Client::connect(&svc);
    let client = Client::connect(&svc);
    let (sch, sfd) = server.channel();
    let (cch, cfd) = client.channel();
    let listen = server.id(sch, 0x5e);
    match server.call(Request::CmBindAddr { id: listen, addr: v4([198, 18, 0, 1], port) }).0 {
        Response::CmAddr { device: Some(0), addr } => assert_eq!(addr.port, port),
        r => panic!("bind: {r:?}"),
    }
    server.ok(Request::CmListen { id: listen, backlog: 4 });

    let active = client.id(cch, 0xc1);
    match client.call(Request::CmResolveAddr { id: active, src: Some(v4([198, 18, 0, 2], 0)), dst: v4([198, 18, 0, 1], port), timeout_ms: 2000 }).0 {
        Response::CmAddr { device: Some(1), .. } => {}
        r => panic!("resolve_addr: {r:?}"),
    }
    expect_event(&cfd, ADDR_RESOLVED);
    client.ok(Request::CmResolveRoute { id: active, timeout_ms: 2000 });
    expect_event(&cfd, ROUTE_RESOLVED);
    let conn = CmConnParam { private_data: b"pmrxe-cm".to_vec(), responder_resources: 1, initiator_depth: 1, retry_count: 7, rnr_retry_count: 7, ..Default::default() };
    client.ok(Request::CmConnect { id: active, qpn: 0x4242, conn });

    let req = expect_event(&sfd, CONNECT_REQUEST);
    assert_eq!((req.listen_id, req.context, req.device), (Some(listen), 0x5e, Some(0)));
    assert_eq!(&req.conn.private_data[..8], b"pmrxe-cm");
    assert_eq!(req.conn.qp_num, 0x4242);
    assert_eq!(req.dst.ip, v4([198, 18, 0, 2], 0).ip, "the peer's address from the cma_hdr");
    let passive = req.id;
    match server.call(Request::CmInitQpAttr { id: passive, qp_state: 2 }).0 {
        Response::CmQpAttr { attr, .. } => assert_eq!(attr.dest_qp_num, 0x4242),
        r => panic!("init_qp_attr: {r:?}"),
    }
    server.ok(Request::CmAccept { id: passive, qpn: 0x4343, conn: CmConnParam { private_data: b"ok".to_vec(), ..Default::default() } });

    let rep = expect_event(&cfd, ctrl::CM_EVENT_CONNECT_RESPONSE);
    assert_eq!(rep.conn.qp_num, 0x4343);
    assert_eq!(&rep.conn.private_data[..2], b"ok");
    match client.call(Request::CmInitQpAttr { id: active, qp_state: 3 }).0 {
        Response::CmQpAttr { mask, .. } => assert_ne!(mask & (1 << 16), 0, "RTS carries the SQ PSN"),
        r => panic!("init_qp_attr: {r:?}"),
    }
    client.ok(Request::CmEstablish { id: active });
    expect_event(&sfd, ESTABLISHED);

    client.ok(Request::CmDisconnect { id: active });
    expect_event(&sfd, DISCONNECTED);
    expect_event(&cfd, DISCONNECTED);

    let st = wait_timeout(&mut cap, Duration::from_secs(20)).expect("pmrxe capture --count 10 still running after the exchange");
    assert!(st.success(), "pmrxe capture: {st}: {}", read_to_string_lossy(&svc.dir.join("cap.err")));
    check_capture(&pcap, port);
    // TIMEWAIT (4.096 µs · 2^17 ≈ 0.5 s) ends on both sides.
    assert_eq!(expect_event(&cfd, TIMEWAIT_EXIT).id, active);
    assert_eq!(expect_event(&sfd, TIMEWAIT_EXIT).id, passive);

    // No listener on this port: REJECTED (reason 8, invalid service ID) at once, no retries.
    let lone = client.id(cch, 0xdead);
    client.call(Request::CmResolveAddr { id: lone, src: None, dst: v4([198, 18, 0, 1], port + 1), timeout_ms: 2000 });
    expect_event(&cfd, ADDR_RESOLVED);
    client.ok(Request::CmResolveRoute { id: lone, timeout_ms: 2000 });
    expect_event(&cfd, ROUTE_RESOLVED);
    let t0 = Instant::now();
    client.ok(Request::CmConnect { id: lone, qpn: 0x4444, conn: CmConnParam::default() });
    let rej = next_event(&cfd, Duration::from_secs(2));
    assert_eq!((rej.event, rej.status, rej.id), (REJECTED, 8, lone), "{rej:?}");
    assert!(t0.elapsed() < Duration::from_secs(1), "REJECTED took {:?}", t0.elapsed());

    // Counters: the lcore carried MADs both ways, dropped none.
    let j = svc.stats_json();
    assert!(sum_counter(&j, "cm_rx") >= 7 && sum_counter(&j, "cm_tx") >= 7, "{j:#}");
    assert_eq!(sum_counter(&j, "cm_drops"), 0, "{j:#}");

    // A client that goes away: its ids are destroyed, the peer is told.
    server.ok(Request::CmDestroyId { id: passive });
    no_event(&cfd, Duration::from_millis(200));
    drop(client);
    drop(cfd);
    server.ok(Request::CmDestroyId { id: listen });
    drop(server);
}

fn check_capture(pcap: &Path, port: u16) {
    let tshark = require_tool("tshark");
    let o = Command::new(&tshark)
        .arg("-r")
        .arg(pcap)
        .args(["-T", "fields", "-E", "separator=|", "-e", "infiniband.mad.mgmtclass", "-e", "infiniband.mad.attributeid", "-e", "_ws.malformed", "-e", "infiniband.cm.req.serviceid"])
        .output()
        .expect("tshark");
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "tshark: {}", String::from_utf8_lossy(&o.stderr));
    let mut attrs = Vec::new();
    for l in text.lines() {
        let c: Vec<&str> = l.split('|').collect();
        assert_eq!(c[0], "0x07", "not a CM MAD: {l}\n{text}");
        assert!(c[2].is_empty(), "malformed: {l}");
        attrs.push(c[1].to_string());
        if c[1] == "0x0010" {
            assert_eq!(c[3], format!("0x000000000106{port:04x}"), "RDMA_PS_TCP service ID of the port: {l}");
        }
    }
    for (a, name) in [("0x0010", "REQ"), ("0x0013", "REP"), ("0x0014", "RTU"), ("0x0015", "DREQ"), ("0x0016", "DREP")] {
        assert!(attrs.iter().any(|x| x == a), "no {name} in the capture:\n{text}");
    }
    // The project's independent ICRC checker (scripts/lib/icrc_check.py).
    let (ok, text) = icrc_check(pcap, &["--strict-pad", "--check-ip-csum"]);
    assert!(ok && text.contains(" 0 bad ICRC, 0 malformed"), "icrc_check: {text}");
}

#[test]
fn rdma_cm_between_two_services_in_two_namespaces() {
    let _l = heavy_lock();
    let ns = NetnsPair::up("cm");
    let dir = TempDir::new("cm-netns");
    let (a, b) = ns.services(&dir);
    let port = port_for(62);
    let server = Client::connect(&a);
    let client = Client::connect(&b);
    let (sch, sfd) = server.channel();
    let (cch, cfd) = client.channel();
    // A wildcard listener on a service-chosen port, and one on 10.77.0.1:port.
    let wild = server.id(sch, 1);
    match server.call(Request::CmBindAddr { id: wild, addr: CmSockAddr::default() }).0 {
        Response::CmAddr { addr, device: None } => assert!(addr.port >= 32768, "ephemeral port: {addr:?}"),
        r => panic!("wildcard bind: {r:?}"),
    }
    assert!(matches!(server.call(Request::CmBindAddr { id: wild, addr: CmSockAddr::default() }).0, Response::Err { .. }), "bound twice");
    server.ok(Request::CmListen { id: wild, backlog: 8 });
    let listen2 = server.id(sch, 2);
    let lport = match server.call(Request::CmBindAddr { id: listen2, addr: v4([10, 77, 0, 1], port) }).0 {
        Response::CmAddr { addr, device: Some(0) } => addr.port,
        r => panic!("bind: {r:?}"),
    };
    server.ok(Request::CmListen { id: listen2, backlog: 8 });

    let active = client.id(cch, 3);
    match client.call(Request::CmResolveAddr { id: active, src: None, dst: v4([10, 77, 0, 1], lport), timeout_ms: 2000 }).0 {
        Response::CmAddr { addr, device: Some(0) } => assert_eq!(addr.ip, v4([10, 77, 0, 2], 0).ip, "source chosen by the subnet"),
        r => panic!("resolve_addr: {r:?}"),
    }
    expect_event(&cfd, ADDR_RESOLVED);
    client.ok(Request::CmResolveRoute { id: active, timeout_ms: 2000 });
    expect_event(&cfd, ROUTE_RESOLVED);
    client.ok(Request::CmConnect { id: active, qpn: 0x51, conn: CmConnParam { private_data: b"across".to_vec(), ..Default::default() } });
    let req = expect_event(&sfd, CONNECT_REQUEST);
    assert_eq!(req.listen_id, Some(listen2));
    assert_eq!(&req.conn.private_data[..6], b"across");
    server.ok(Request::CmAccept { id: req.id, qpn: 0x52, conn: CmConnParam::default() });
    assert_eq!(expect_event(&cfd, ctrl::CM_EVENT_CONNECT_RESPONSE).conn.qp_num, 0x52);
    client.ok(Request::CmEstablish { id: active });
    expect_event(&sfd, ESTABLISHED);
    // The passive side disconnects this time.
    server.ok(Request::CmDisconnect { id: req.id });
    expect_event(&cfd, DISCONNECTED);
    expect_event(&sfd, DISCONNECTED);
    drop(client);
    drop(server);
    drop(b);
    drop(a);
}
