use super::*;
use pmrxe_abi::qp_table::qp_type::{RC as IBV_QPT_RC, UD as IBV_QPT_UD};
use pmrxe_wire::MacAddr;

const A: [u8; 4] = [198, 18, 0, 1];
const B: [u8; 4] = [198, 18, 0, 2];

fn port(i: u32, ip: [u8; 4]) -> CmPort {
    let ip = IpAddr::V4(Ipv4Addr::from(ip));
    CmPort { device: i, guid: 0x0200_00ff_fe00_0001 + u64::from(i), gids: vec![[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, i as u8], Gid::from_ip(ip).0], nets: vec![(ip, 24)], active_mtu: 5, lcore: 0 }
}

fn v4(ip: [u8; 4], port: u16) -> CmSockAddr {
    sock_addr(IpAddr::V4(Ipv4Addr::from(ip)), port)
}

/// Carry every MAD as a real RoCEv2 frame to the port that owns its destination.
fn wire(c: &mut CmCore) -> usize {
    let mut n = 0;
    loop {
        let t = c.take_transmits();
        if t.is_empty() {
            return n;
        }
        for (_, t) in t {
            let f = pmrxe_cm::gsi::build_mad_frame(&t.path, MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]), Psn::new(1), &t.mad).unwrap();
            let dst = t.path.dgid.to_ip();
            let dev = c.ports.iter().find(|p| p.cfg.owns(dst)).map(|p| p.cfg.device).expect("destination port");
            let now = c.now();
            c.on_frame(now, dev, &f);
            n += 1;
        }
    }
}

fn req(c: &mut CmCore, client: u32, r: Request) -> Response {
    let now = c.now();
    c.request(now, client, r).0
}

fn channel(c: &mut CmCore, client: u32) -> (u32, OwnedFd) {
    let now = c.now();
    match c.request(now, client, Request::CmOpenChannel) {
        (Response::CmChannel { channel }, Some(fd)) => (channel, fd),
        r => panic!("{r:?}"),
    }
}

fn id(c: &mut CmCore, client: u32, ch: u32, ps: u16, qpt: u32, ctx: u64) -> u32 {
    match req(c, client, Request::CmCreateId { channel: ch, ps, qp_type: qpt, context: ctx }) {
        Response::CmId { id } => id,
        r => panic!("{r:?}"),
    }
}

/// An RC listener of client 1 (event channel `ch`) on A:`port`.
fn rc_listener(c: &mut CmCore, ch: u32, port: u16, backlog: u32) -> u32 {
    let l = id(c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 0x11);
    assert!(matches!(req(c, 1, Request::CmBindAddr { id: l, addr: v4(A, port) }), Response::CmAddr { .. }));
    assert_eq!(req(c, 1, Request::CmListen { id: l, backlog }), Response::Ok);
    l
}

/// Client 2 (event channel `ch`) resolves A:`port` and connects QP `qpn` to it; the MADs
/// are carried. Returns the active id.
fn rc_connect(c: &mut CmCore, ch: u32, port: u16, qpn: u32) -> u32 {
    let a = id(c, 2, ch, PortSpace::TCP.0, IBV_QPT_RC, 0x22);
    assert!(matches!(req(c, 2, Request::CmResolveAddr { id: a, src: None, dst: v4(A, port), timeout_ms: 2000 }), Response::CmAddr { .. }));
    assert_eq!(req(c, 2, Request::CmResolveRoute { id: a, timeout_ms: 2000 }), Response::Ok);
    let conn = CmConnParam { responder_resources: 1, initiator_depth: 1, retry_count: 7, rnr_retry_count: 7, ..Default::default() };
    assert_eq!(req(c, 2, Request::CmConnect { id: a, qpn, conn }), Response::Ok);
    wire(c);
    a
}

fn events(fd: &OwnedFd) -> Vec<CmEventMsg> {
    let mut v = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        match rustix::net::recv(fd, &mut buf[..], RecvFlags::DONTWAIT) {
            Ok((n, _)) if n > 0 => v.push(ctrl::decode::<CmEventMsg>(&buf[..n]).unwrap()),
            _ => return v,
        }
    }
}

fn kinds(v: &[CmEventMsg]) -> Vec<u32> {
    v.iter().map(|e| e.event).collect()
}

/// `rdma_listen`'s backlog counts CONNECT_REQUESTs the client has not read (kernel ucma),
/// not requests waiting for `rdma_accept`: a slow acceptor that reads its events promptly
/// is never refused, one that does not read them is refused with REJ 28.
#[test]
fn listen_backlog_counts_unread_connect_requests() {
    let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
    let (sch, sfd) = channel(&mut c, 1);
    let (cch, cfd) = channel(&mut c, 2);
    rc_listener(&mut c, sch, 7472, 2);
    let connect = |c: &mut CmCore, qpn: u32| rc_connect(c, cch, 7472, qpn);
    let ack = |id: u32| {
        let b = ctrl::encode(&ctrl::CmEventAck { id }).unwrap();
        assert_eq!(rustix::net::send(&sfd, &b, SendFlags::empty()).unwrap(), b.len());
    };
    // Two requests fill the backlog while their events sit unread in the socket.
    connect(&mut c, 0x101);
    connect(&mut c, 0x102);
    let _ = events(&cfd);
    connect(&mut c, 0x103);
    let ev = events(&cfd);
    assert_eq!(kinds(&ev), [event::ADDR_RESOLVED, event::ROUTE_RESOLVED, event::REJECTED]);
    assert_eq!(ev[2].status, 28, "backlog overflow is REJ 28 (consumer defined), as the kernel's");
    assert_eq!(c.stats.rej_backlog, 1);
    // The client reads both requests (its shim acknowledges each one); it has accepted
    // neither, yet new requests are taken again.
    let reqs = events(&sfd);
    assert_eq!(kinds(&reqs), [event::CONNECT_REQUEST, event::CONNECT_REQUEST]);
    ack(reqs[0].id);
    ack(reqs[1].id);
    connect(&mut c, 0x104);
    connect(&mut c, 0x105);
    let more = events(&sfd);
    assert_eq!(kinds(&more), [event::CONNECT_REQUEST, event::CONNECT_REQUEST]);
    assert_eq!(c.stats.rej_backlog, 1);
    connect(&mut c, 0x106);
    let ev = events(&cfd);
    assert_eq!(ev.last().map(|e| (e.event, e.status)), Some((event::REJECTED, 28)));
    // Naming a child in a request counts as reading it too (a client whose ack was lost).
    assert!(matches!(req(&mut c, 1, Request::CmInitQpAttr { id: more[0].id, qp_state: 2 }), Response::CmQpAttr { .. }));
    connect(&mut c, 0x107);
    assert_eq!(kinds(&events(&sfd)), [event::CONNECT_REQUEST]);
    assert_eq!(c.stats.rej_backlog, 2);
    c.client_gone(c.now(), 1);
    c.client_gone(c.now(), 2);
    wire(&mut c);
    assert_eq!(c.id_count(), 0);
}

#[test]
fn request_to_a_listener_whose_client_has_no_ids_left_is_rej_no_resources() {
    let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
    let (sch, _sfd) = channel(&mut c, 1);
    let (cch, cfd) = channel(&mut c, 2);
    rc_listener(&mut c, sch, 7473, 0);
    // The listening client holds every id it may: a child id cannot be made for it.
    for k in 1..MAX_IDS_PER_CLIENT {
        id(&mut c, 1, sch, PortSpace::TCP.0, IBV_QPT_RC, k as u64);
    }
    rc_connect(&mut c, cch, 7473, 0x101);
    let ev = events(&cfd);
    assert_eq!(ev.last().map(|e| (e.event, e.status)), Some((event::REJECTED, 3)), "REJ 3: no resources");
    assert_eq!((c.stats.rej_resources, c.stats.rej_backlog), (1, 0));
    c.client_gone(c.now(), 1);
    c.client_gone(c.now(), 2);
    wire(&mut c);
    assert_eq!(c.id_count(), 0);
}

#[test]
fn rc_connect_accept_establish_disconnect() {
    let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
    let (sch, sfd) = channel(&mut c, 1);
    let (cch, cfd) = channel(&mut c, 2);
    let l = id(&mut c, 1, sch, PortSpace::TCP.0, IBV_QPT_RC, 0x11);
    assert!(matches!(req(&mut c, 1, Request::CmBindAddr { id: l, addr: v4(A, 7471) }), Response::CmAddr { device: Some(0), .. }));
    assert_eq!(req(&mut c, 1, Request::CmListen { id: l, backlog: 8 }), Response::Ok);
    // Another client cannot name the listener, nor take its port.
    assert!(matches!(req(&mut c, 2, Request::CmListen { id: l, backlog: 8 }), Response::Err { errno: libc::EINVAL, .. }));
    let a = id(&mut c, 2, cch, PortSpace::TCP.0, IBV_QPT_RC, 0x22);
    match req(&mut c, 2, Request::CmResolveAddr { id: a, src: None, dst: v4(A, 7471), timeout_ms: 2000 }) {
        Response::CmAddr { addr, device: Some(0) } => assert_eq!(sock_ip(&addr), IpAddr::V4(Ipv4Addr::from(A))),
        r => panic!("{r:?}"),
    }
    assert_eq!(req(&mut c, 2, Request::CmResolveRoute { id: a, timeout_ms: 2000 }), Response::Ok);
    assert_eq!(kinds(&events(&cfd)), [event::ADDR_RESOLVED, event::ROUTE_RESOLVED]);
    // RTR before the REP: no parameters yet.
    assert!(matches!(req(&mut c, 2, Request::CmInitQpAttr { id: a, qp_state: 2 }), Response::Err { .. }));
    let conn = CmConnParam { private_data: b"hello".to_vec(), responder_resources: 4, initiator_depth: 2, retry_count: 7, rnr_retry_count: 7, ..Default::default() };
    assert_eq!(req(&mut c, 2, Request::CmConnect { id: a, qpn: 0x123, conn }), Response::Ok);
    wire(&mut c);
    let ev = events(&sfd);
    assert_eq!(kinds(&ev), [event::CONNECT_REQUEST]);
    let cr = &ev[0];
    assert_eq!((cr.listen_id, cr.context), (Some(l), 0x11));
    assert_eq!(&cr.conn.private_data[..5], b"hello");
    assert_eq!(cr.conn.private_data.len(), cma::REQ_USER_DATA_LEN);
    assert_eq!((cr.conn.responder_resources, cr.conn.initiator_depth, cr.conn.qp_num), (2, 4, 0x123));
    assert_eq!(cr.dst.port, c.ids[&a].src.port);
    assert_eq!(sock_ip(&cr.dst), IpAddr::V4(Ipv4Addr::from(A)));
    let p = cr.id;
    // Passive QP attributes before the accept (librdmacm moves the QP first).
    match req(&mut c, 1, Request::CmInitQpAttr { id: p, qp_state: 2 }) {
        Response::CmQpAttr { attr, mask } => {
            assert_eq!(attr.dest_qp_num, 0x123);
            assert_eq!(attr.max_dest_rd_atomic, 2);
            // The kernel ib_cm's RNR NAK delay for rdma_cm QPs: code 0, 655.36 ms.
            assert_eq!(attr.min_rnr_timer, 0);
            assert_eq!(attr.path_mtu, 5);
            assert!(attr.ah_attr.is_global);
            assert_eq!(attr.ah_attr.dgid, Gid::from_ip(IpAddr::V4(Ipv4Addr::from(A))).0);
            assert_eq!(attr.ah_attr.sgid_index, 1);
            assert_eq!(mask, mask::STATE | mask::AV | mask::PATH_MTU | mask::DEST_QPN | mask::RQ_PSN | mask::MAX_DEST_RD_ATOMIC | mask::MIN_RNR_TIMER);
        }
        r => panic!("{r:?}"),
    }
    let rts_psn = match req(&mut c, 1, Request::CmInitQpAttr { id: p, qp_state: 3 }) {
        Response::CmQpAttr { attr, mask } => {
            assert_eq!(mask, mask::STATE | mask::SQ_PSN | mask::TIMEOUT | mask::RETRY_CNT | mask::RNR_RETRY | mask::MAX_QP_RD_ATOMIC);
            assert_eq!(attr.max_rd_atomic, 4);
            attr.sq_psn
        }
        r => panic!("{r:?}"),
    };
    let acc = CmConnParam { private_data: b"welcome".to_vec(), responder_resources: 2, initiator_depth: 4, rnr_retry_count: 6, ..Default::default() };
    assert_eq!(req(&mut c, 1, Request::CmAccept { id: p, qpn: 0x456, conn: acc }), Response::Ok);
    wire(&mut c);
    let ev = events(&cfd);
    assert_eq!(kinds(&ev), [ctrl::CM_EVENT_CONNECT_RESPONSE]);
    assert_eq!(ev[0].conn.qp_num, 0x456);
    assert_eq!(&ev[0].conn.private_data[..7], b"welcome");
    match req(&mut c, 2, Request::CmInitQpAttr { id: a, qp_state: 2 }) {
        Response::CmQpAttr { attr, .. } => {
            assert_eq!((attr.dest_qp_num, attr.rq_psn), (0x456, rts_psn));
            assert_eq!(attr.ah_attr.dgid, Gid::from_ip(IpAddr::V4(Ipv4Addr::from(A))).0);
        }
        r => panic!("{r:?}"),
    }
    match req(&mut c, 2, Request::CmInitQpAttr { id: a, qp_state: 3 }) {
        Response::CmQpAttr { attr, .. } => assert_eq!(attr.rnr_retry, 6),
        r => panic!("{r:?}"),
    }
    assert_eq!(req(&mut c, 2, Request::CmEstablish { id: a }), Response::Ok);
    wire(&mut c);
    assert_eq!(kinds(&events(&sfd)), [event::ESTABLISHED]);
    assert!(events(&cfd).is_empty(), "the active client reports ESTABLISHED itself");
    assert_eq!(req(&mut c, 2, Request::CmDisconnect { id: a }), Response::Ok);
    wire(&mut c);
    assert_eq!(kinds(&events(&sfd)), [event::DISCONNECTED]);
    assert_eq!(kinds(&events(&cfd)), [event::DISCONNECTED]);
    assert_eq!(req(&mut c, 1, Request::CmDisconnect { id: p }), Response::Ok, "already disconnected: fine");
    assert_eq!(req(&mut c, 2, Request::CmDestroyId { id: a }), Response::Ok);
    c.client_gone(c.now(), 1);
    c.client_gone(c.now(), 2);
    assert_eq!((c.id_count(), c.channel_count()), (0, 0));
}

#[test]
fn loopback_addresses_select_the_first_device_and_its_gid() {
    let lo4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let lo6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let ga = Gid::from_ip(IpAddr::V4(Ipv4Addr::from(A)));
    for ip in [lo4, IpAddr::V4(Ipv4Addr::new(127, 1, 2, 3)), lo6, IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped())] {
        assert!(is_loopback(ip), "{ip}");
    }
    for ip in [IpAddr::V4(Ipv4Addr::from(A)), IpAddr::V4(Ipv4Addr::UNSPECIFIED), IpAddr::V6(Ipv6Addr::UNSPECIFIED), "fe80::1".parse().unwrap()] {
        assert!(!is_loopback(ip), "{ip}");
    }
    let p0 = port(0, A);
    // On the wire a loopback address is the device's address of the same family...
    assert_eq!(p0.wire_gid(lo4), ga);
    assert_eq!(p0.sgid_index(p0.wire_gid(lo4)), 1);
    // ...or GID index 0 when the device has none of that family; other addresses are their own.
    assert_eq!(p0.wire_gid(lo6).0, p0.gids[0]);
    assert_eq!(p0.wire_gid(IpAddr::V4(Ipv4Addr::from(B))), Gid::from_ip(IpAddr::V4(Ipv4Addr::from(B))));
    assert_eq!(loopback_src(IpAddr::V4(Ipv4Addr::new(127, 9, 9, 9))), lo4);
    assert_eq!(loopback_src(lo6), lo6);

    let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
    let (ch, _fd) = channel(&mut c, 1);
    // Bind: 127.0.0.0/8 and ::1 attach to device 0 and keep their address; others still fail.
    for (ip, p) in [(lo4, 7000), (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), 7001), (lo6, 7002)] {
        let i = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 0);
        match req(&mut c, 1, Request::CmBindAddr { id: i, addr: sock_addr(ip, p) }) {
            Response::CmAddr { addr, device: Some(0) } => assert_eq!((sock_ip(&addr), addr.port), (ip, p)),
            r => panic!("{ip}: {r:?}"),
        }
    }
    let i = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 0);
    assert!(matches!(req(&mut c, 1, Request::CmBindAddr { id: i, addr: v4([10, 9, 9, 9], 7003) }), Response::Err { errno: libc::EADDRNOTAVAIL, .. }));
    // The loopback bind takes the port on device 0 (as a bind to A would), not on device 1.
    let i = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 0);
    assert!(matches!(req(&mut c, 1, Request::CmBindAddr { id: i, addr: v4(A, 7000) }), Response::Err { errno: libc::EADDRINUSE, .. }));
    assert!(matches!(req(&mut c, 1, Request::CmBindAddr { id: i, addr: v4(B, 7000) }), Response::CmAddr { device: Some(1), .. }));
    // Resolve with no source: device 0, source 127.0.0.1 (::1), destination kept.
    for (dst, src) in [(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 5)), lo4), (lo6, lo6)] {
        let i = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 0);
        match req(&mut c, 1, Request::CmResolveAddr { id: i, src: None, dst: sock_addr(dst, 7471), timeout_ms: 2000 }) {
            Response::CmAddr { addr, device: Some(0) } => assert_eq!(sock_ip(&addr), src),
            r => panic!("{dst}: {r:?}"),
        }
        assert_eq!(sock_ip(&c.ids[&i].dst), dst);
    }
    // A source bound to device 1's address keeps device 1: the loopback peer is that device.
    let i = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 0);
    assert!(matches!(req(&mut c, 1, Request::CmResolveAddr { id: i, src: Some(v4(B, 0)), dst: sock_addr(lo4, 7471), timeout_ms: 2000 }), Response::CmAddr { device: Some(1), .. }));
    assert_eq!(c.route(&c.ids[&i], 1).dgid, Gid::from_ip(IpAddr::V4(Ipv4Addr::from(B))));
}

#[test]
fn rc_connect_over_loopback_uses_the_device_gid_and_keeps_127_0_0_1() {
    let lo = [127, 0, 0, 1];
    let ga = Gid::from_ip(IpAddr::V4(Ipv4Addr::from(A)));
    let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
    let (sch, sfd) = channel(&mut c, 1);
    let (cch, cfd) = channel(&mut c, 2);
    // libfabric's verbs server: bind localhost, listen.
    let l = id(&mut c, 1, sch, PortSpace::TCP.0, IBV_QPT_RC, 0x11);
    assert!(matches!(req(&mut c, 1, Request::CmBindAddr { id: l, addr: v4(lo, 7471) }), Response::CmAddr { device: Some(0), .. }));
    assert_eq!(req(&mut c, 1, Request::CmListen { id: l, backlog: 8 }), Response::Ok);
    let a = id(&mut c, 2, cch, PortSpace::TCP.0, IBV_QPT_RC, 0x22);
    assert!(matches!(req(&mut c, 2, Request::CmResolveAddr { id: a, src: None, dst: v4(lo, 7471), timeout_ms: 2000 }), Response::CmAddr { device: Some(0), .. }));
    assert_eq!(req(&mut c, 2, Request::CmResolveRoute { id: a, timeout_ms: 2000 }), Response::Ok);
    assert_eq!(kinds(&events(&cfd)), [event::ADDR_RESOLVED, event::ROUTE_RESOLVED]);
    let conn = CmConnParam { responder_resources: 1, initiator_depth: 1, retry_count: 7, rnr_retry_count: 7, ..Default::default() };
    assert_eq!(req(&mut c, 2, Request::CmConnect { id: a, qpn: 0x123, conn }), Response::Ok);
    // The REQ goes from device 0's GID to device 0's GID, never to ::ffff:127.0.0.1.
    let t = c.take_transmits();
    assert_eq!(t.len(), 1);
    assert_eq!((t[0].1.path.sgid, t[0].1.path.dgid), (ga, ga));
    let f = pmrxe_cm::gsi::build_mad_frame(&t[0].1.path, MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]), Psn::new(1), &t[0].1.mad).unwrap();
    let now = c.now();
    c.on_frame(now, 0, &f);
    // The CMA header carried 127.0.0.1 both ways: the child's addresses are loopback.
    let ev = events(&sfd);
    assert_eq!(kinds(&ev), [event::CONNECT_REQUEST]);
    let cr = &ev[0];
    assert_eq!(cr.listen_id, Some(l));
    assert_eq!((sock_ip(&cr.src), sock_ip(&cr.dst)), (IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(Ipv4Addr::LOCALHOST)));
    assert_eq!((cr.src.port, cr.dst.port), (7471, c.ids[&a].src.port));
    // Both QPs' address vectors name device 0's GID (index 1 of its table).
    match req(&mut c, 1, Request::CmInitQpAttr { id: cr.id, qp_state: 2 }) {
        Response::CmQpAttr { attr, .. } => assert_eq!((attr.ah_attr.dgid, attr.ah_attr.sgid_index), (ga.0, 1)),
        r => panic!("{r:?}"),
    }
    let acc = CmConnParam { responder_resources: 1, initiator_depth: 1, rnr_retry_count: 7, ..Default::default() };
    assert_eq!(req(&mut c, 1, Request::CmAccept { id: cr.id, qpn: 0x456, conn: acc }), Response::Ok);
    wire(&mut c);
    assert_eq!(kinds(&events(&cfd)), [ctrl::CM_EVENT_CONNECT_RESPONSE]);
    match req(&mut c, 2, Request::CmInitQpAttr { id: a, qp_state: 2 }) {
        Response::CmQpAttr { attr, .. } => assert_eq!((attr.dest_qp_num, attr.ah_attr.dgid, attr.ah_attr.sgid_index), (0x456, ga.0, 1)),
        r => panic!("{r:?}"),
    }
    assert_eq!(req(&mut c, 2, Request::CmEstablish { id: a }), Response::Ok);
    wire(&mut c);
    assert_eq!(kinds(&events(&sfd)), [event::ESTABLISHED]);
    c.client_gone(c.now(), 1);
    c.client_gone(c.now(), 2);
    wire(&mut c);
    assert_eq!((c.id_count(), c.channel_count()), (0, 0));
}

#[test]
fn no_listener_is_rejected_and_reject_carries_private_data() {
    let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
    let (ch, fd) = channel(&mut c, 1);
    let a = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 1);
    req(&mut c, 1, Request::CmResolveAddr { id: a, src: Some(v4(B, 0)), dst: v4(A, 9999), timeout_ms: 100 });
    req(&mut c, 1, Request::CmResolveRoute { id: a, timeout_ms: 100 });
    assert_eq!(req(&mut c, 1, Request::CmConnect { id: a, qpn: 5, conn: CmConnParam::default() }), Response::Ok);
    wire(&mut c);
    let ev = events(&fd);
    assert_eq!(kinds(&ev), [event::ADDR_RESOLVED, event::ROUTE_RESOLVED, event::REJECTED]);
    assert_eq!(ev[2].status, 8);
    assert_eq!(ev[0].device, Some(1), "source 198.18.0.2 is pmrxe1");

    // A listener that rejects with private data.
    let l = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 2);
    req(&mut c, 1, Request::CmBindAddr { id: l, addr: CmSockAddr::default() });
    let lport = c.ids[&l].src.port;
    assert_eq!(req(&mut c, 1, Request::CmListen { id: l, backlog: 0 }), Response::Ok);
    let b = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 3);
    req(&mut c, 1, Request::CmResolveAddr { id: b, src: None, dst: v4(B, lport), timeout_ms: 100 });
    req(&mut c, 1, Request::CmResolveRoute { id: b, timeout_ms: 100 });
    req(&mut c, 1, Request::CmConnect { id: b, qpn: 6, conn: CmConnParam::default() });
    wire(&mut c);
    let ev = events(&fd);
    let cr = ev.iter().find(|e| e.event == event::CONNECT_REQUEST).expect("request on the wildcard listener");
    assert_eq!(cr.device, Some(1));
    assert_eq!(req(&mut c, 1, Request::CmReject { id: cr.id, private_data: b"go away".to_vec() }), Response::Ok);
    wire(&mut c);
    let ev = events(&fd);
    assert_eq!(kinds(&ev), [event::REJECTED]);
    assert_eq!(ev[0].status, 28);
    assert_eq!(&ev[0].conn.private_data[..7], b"go away");
}

#[test]
fn ud_sidr_resolves_to_established_with_qpn_and_qkey() {
    let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
    let (ch, fd) = channel(&mut c, 1);
    let l = id(&mut c, 1, ch, PortSpace::UDP.0, IBV_QPT_UD, 7);
    req(&mut c, 1, Request::CmBindAddr { id: l, addr: v4(A, 7174) });
    req(&mut c, 1, Request::CmListen { id: l, backlog: 4 });
    let a = id(&mut c, 1, ch, PortSpace::UDP.0, IBV_QPT_UD, 8);
    req(&mut c, 1, Request::CmResolveAddr { id: a, src: Some(v4(B, 0)), dst: v4(A, 7174), timeout_ms: 100 });
    match req(&mut c, 1, Request::CmInitQpAttr { id: a, qp_state: 1 }) {
        Response::CmQpAttr { attr, mask } => {
            assert_eq!(attr.qkey, cma::UDP_QKEY);
            assert_eq!(mask, mask::STATE | mask::PKEY_INDEX | mask::PORT | mask::QKEY);
        }
        r => panic!("{r:?}"),
    }
    req(&mut c, 1, Request::CmResolveRoute { id: a, timeout_ms: 100 });
    req(&mut c, 1, Request::CmConnect { id: a, qpn: 0x77, conn: CmConnParam { private_data: b"ud?".to_vec(), ..Default::default() } });
    wire(&mut c);
    let ev = events(&fd);
    let cr = ev.iter().find(|e| e.event == event::CONNECT_REQUEST).expect("SIDR_REQ → CONNECT_REQUEST");
    assert_eq!(&cr.ud.as_ref().unwrap().private_data[..3], b"ud?");
    assert_eq!(req(&mut c, 1, Request::CmAccept { id: cr.id, qpn: 0x99, conn: CmConnParam::default() }), Response::Ok);
    wire(&mut c);
    let ev = events(&fd);
    assert_eq!(kinds(&ev), [event::ESTABLISHED]);
    let ud = ev[0].ud.as_ref().unwrap();
    assert_eq!((ud.qp_num, ud.qkey), (0x99, cma::UDP_QKEY));
    assert_eq!(ud.ah_attr.dgid, Gid::from_ip(IpAddr::V4(Ipv4Addr::from(A))).0);
    assert!(ud.ah_attr.is_global);
}

#[test]
fn closed_channel_is_dropped_and_client_death_sends_dreq() {
    let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
    let (sch, sfd) = channel(&mut c, 1);
    let (cch, cfd) = channel(&mut c, 2);
    let l = id(&mut c, 1, sch, PortSpace::TCP.0, IBV_QPT_RC, 1);
    req(&mut c, 1, Request::CmBindAddr { id: l, addr: v4(A, 5000) });
    req(&mut c, 1, Request::CmListen { id: l, backlog: 4 });
    let a = id(&mut c, 2, cch, PortSpace::TCP.0, IBV_QPT_RC, 2);
    req(&mut c, 2, Request::CmResolveAddr { id: a, src: None, dst: v4(A, 5000), timeout_ms: 100 });
    req(&mut c, 2, Request::CmResolveRoute { id: a, timeout_ms: 100 });
    req(&mut c, 2, Request::CmConnect { id: a, qpn: 1, conn: CmConnParam::default() });
    wire(&mut c);
    let p = events(&sfd).iter().find(|e| e.event == event::CONNECT_REQUEST).unwrap().id;
    req(&mut c, 1, Request::CmAccept { id: p, qpn: 2, conn: CmConnParam::default() });
    wire(&mut c);
    req(&mut c, 2, Request::CmEstablish { id: a });
    wire(&mut c);
    assert_eq!(kinds(&events(&sfd)), [event::ESTABLISHED]);
    // The active client dies: its id is destroyed (DREQ), the passive side hears it.
    drop(cfd);
    c.housekeeping();
    assert_eq!(c.channel_count(), 1);
    c.client_gone(c.now(), 2);
    wire(&mut c);
    assert_eq!(kinds(&events(&sfd)), [event::DISCONNECTED]);
    assert_eq!(c.id_count(), 2);
}

/// A hostile client's numbers: an unknown port space, a QP type that is no RC/UC/UD, a QPN
/// with high bits set (it would truncate to another QP's number) are refused, never defaulted.
#[test]
fn unknown_port_space_qp_type_and_wide_qpn_are_refused() {
    let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
    let (ch, _fd) = channel(&mut c, 1);
    for ps in [0, 0x0107, 0xFFFF] {
        let r = req(&mut c, 1, Request::CmCreateId { channel: ch, ps, qp_type: IBV_QPT_RC, context: 0 });
        assert!(matches!(r, Response::Err { errno: libc::EPROTONOSUPPORT, .. }), "ps {ps:#x}: {r:?}");
    }
    for qp_type in [0, 1, 9, u32::MAX] {
        let r = req(&mut c, 1, Request::CmCreateId { channel: ch, ps: PortSpace::TCP.0, qp_type, context: 0 });
        assert!(matches!(r, Response::Err { errno: libc::EINVAL, .. }), "qp_type {qp_type}: {r:?}");
    }
    assert_eq!(c.id_count(), 0);
    let _l = rc_listener(&mut c, ch, 7480, 4);
    let (cch, _cfd) = channel(&mut c, 2);
    let a = id(&mut c, 2, cch, PortSpace::TCP.0, IBV_QPT_RC, 0x22);
    assert!(matches!(req(&mut c, 2, Request::CmResolveAddr { id: a, src: None, dst: v4(A, 7480), timeout_ms: 2000 }), Response::CmAddr { .. }));
    assert_eq!(req(&mut c, 2, Request::CmResolveRoute { id: a, timeout_ms: 2000 }), Response::Ok);
    let r = req(&mut c, 2, Request::CmConnect { id: a, qpn: 0x0100_0011, conn: CmConnParam::default() });
    assert!(matches!(r, Response::Err { errno: libc::EINVAL, .. }), "{r:?}");
    assert_eq!(c.conn_count(), 0, "nothing was sent for the refused connect");
    let r = req(&mut c, 1, Request::CmAccept { id: a, qpn: u32::MAX, conn: CmConnParam::default() });
    assert!(matches!(r, Response::Err { errno: libc::EINVAL, .. }), "{r:?}");
}

#[test]
fn multicast_join_and_leave_as_the_kernel_cma_does_on_roce() {
    let mut c = CmCore::new(vec![port(0, A), port(1, B)]);
    let (ch, fd) = channel(&mut c, 1);
    let g = [239, 1, 2, 3];
    let err = |r: Response| match r {
        Response::Err { errno, .. } => errno,
        r => panic!("{r:?}"),
    };
    // An id bound to no device, and an RC id, cannot join.
    let u = id(&mut c, 1, ch, PortSpace::UDP.0, IBV_QPT_UD, 5);
    assert_eq!(err(req(&mut c, 1, Request::CmJoinMulticast { id: u, addr: v4(g, 0) })), libc::EINVAL);
    let rc = id(&mut c, 1, ch, PortSpace::TCP.0, IBV_QPT_RC, 6);
    req(&mut c, 1, Request::CmBindAddr { id: rc, addr: v4(B, 0) });
    assert_eq!(err(req(&mut c, 1, Request::CmJoinMulticast { id: rc, addr: v4(g, 0) })), libc::EINVAL);
    // rdma_resolve_addr to the group from B (bound), then join: MULTICAST_JOIN at once.
    req(&mut c, 1, Request::CmResolveAddr { id: u, src: Some(v4(B, 0)), dst: v4(g, 0), timeout_ms: 100 });
    assert_eq!(kinds(&events(&fd)), [event::ADDR_RESOLVED]);
    assert_eq!(req(&mut c, 1, Request::CmJoinMulticast { id: u, addr: v4(g, 0) }), Response::Ok);
    let ev = events(&fd);
    assert_eq!(kinds(&ev), [event::MULTICAST_JOIN]);
    assert_eq!((ev[0].id, ev[0].context, ev[0].status), (u, 5, 0));
    assert_eq!(ev[0].dst.ip, Ipv4Addr::from(g).to_ipv6_mapped().octets(), "the event names the group");
    let ud = ev[0].ud.as_ref().expect("UD parameters");
    assert_eq!((ud.qp_num, ud.qkey), (pmrxe_abi::MULTICAST_QPN, cma::UDP_QKEY));
    assert_eq!(ud.ah_attr.dgid, Ipv4Addr::from(g).to_ipv6_mapped().octets(), "the group's GID is its IPv4-mapped address");
    assert!(ud.ah_attr.is_global);
    assert_eq!(ud.ah_attr.sgid_index, 1, "sent from B's IPv4 GID");
    // Twice: EADDRINUSE. A unicast address: EINVAL. An IPv6 group: EOPNOTSUPP (RoCEv2).
    assert_eq!(err(req(&mut c, 1, Request::CmJoinMulticast { id: u, addr: v4(g, 0) })), libc::EADDRINUSE);
    assert_eq!(err(req(&mut c, 1, Request::CmJoinMulticast { id: u, addr: v4(A, 0) })), libc::EINVAL);
    let v6 = CmSockAddr { ip: "ff0e::1".parse::<Ipv6Addr>().unwrap().octets(), v6: true, port: 0 };
    assert_eq!(err(req(&mut c, 1, Request::CmJoinMulticast { id: u, addr: v6 })), libc::EOPNOTSUPP);
    // Another client cannot join or leave through this id.
    assert_eq!(err(req(&mut c, 2, Request::CmLeaveMulticast { id: u, addr: v4(g, 0) })), libc::EINVAL);
    assert_eq!(req(&mut c, 1, Request::CmLeaveMulticast { id: u, addr: v4(g, 0) }), Response::Ok);
    assert_eq!(err(req(&mut c, 1, Request::CmLeaveMulticast { id: u, addr: v4(g, 0) })), libc::EADDRNOTAVAIL);
    // An unbound UD id resolving a group takes the first device with an IPv4 address.
    let w = id(&mut c, 1, ch, PortSpace::UDP.0, IBV_QPT_UD, 9);
    assert!(matches!(req(&mut c, 1, Request::CmResolveAddr { id: w, src: None, dst: v4(g, 0), timeout_ms: 100 }), Response::CmAddr { .. }));
    assert_eq!(c.ids[&w].device, Some(0));
    assert!(events(&fd).iter().all(|e| e.event == event::ADDR_RESOLVED));
}
