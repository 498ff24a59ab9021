//! SIDR, hostile peers (bounded tables) and a lossy soak on the simulated wire.

mod common;
use common::*;

use pmrxe_cm::msg::{attr, emit_mad, req, CmMsg};
use pmrxe_cm::sim::{Fault, Impairments, Sim};
use pmrxe_cm::*;
use pmrxe_wire::{Psn, Qpn};

const UDP_SID: u64 = 0x0000_0000_0111_1C06;

fn sidr_params(sim: &Sim) -> SidrParams {
    let mut path = sim.route(0, 1);
    path.packet_life_time = 8;
    SidrParams { path, service_id: UDP_SID, timeout: 12, max_cm_retries: 5, private_data: b"who".to_vec() }
}

#[test]
fn sidr_resolves_qpn_and_qkey_and_survives_a_lost_reply() {
    let mut sim = Sim::new(2, 21, cfg());
    sim.nodes[1].cm.listen(UDP_SID, 4).unwrap();
    let mut lost = false;
    sim.add_filter(move |m| {
        (m.attr_id == attr::SIDR_REP && !std::mem::replace(&mut lost, true)).then_some(Fault::Drop)
    });
    let mut c = Consumer::auto();
    let now = sim.now;
    let p = sidr_params(&sim);
    let a = sim.nodes[0].cm.sidr_resolve(now, &p).unwrap();
    assert!(c.run(&mut sim, 500, |c, _| c.has(0, |e| matches!(e, Event::SidrReply { .. }))));
    let Some((_, Event::SidrReply { id, rep })) = c.log.iter().find(|(n, _)| *n == 0) else { panic!() };
    assert_eq!(*id, a);
    assert_eq!((rep.status, rep.qpn, rep.qkey), (SidrStatus::SUCCESS, Qpn::new(0x77), cma::UDP_QKEY));
    assert_eq!(&rep.private_data[..7], b"sidr-ok");
    // The retransmitted SIDR_REQ was answered from the cache, not shown to the consumer again.
    assert_eq!(c.count(1, |e| matches!(e, Event::SidrRequest { .. })), 1);
    assert_eq!(sim.nodes[0].cm.stats().retransmits, 1);
    sim.drive(100).unwrap();
    assert_empty(&sim);
}

#[test]
fn sidr_without_listener_answers_unsupported_and_times_out_without_peer() {
    let mut sim = Sim::new(2, 22, cfg());
    let now = sim.now;
    let p = sidr_params(&sim);
    let a = sim.nodes[0].cm.sidr_resolve(now, &p).unwrap();
    sim.drive(100).unwrap();
    let ev = sim.nodes[0].take_events();
    assert!(matches!(&ev[..], [Event::SidrReply { id, rep }] if *id == a && rep.status == SidrStatus::UNSUPPORTED), "{ev:?}");
    let mut p = sidr_params(&sim);
    p.path.dgid = Gid::from_ip("10.9.9.9".parse().unwrap());
    let now = sim.now;
    let b = sim.nodes[0].cm.sidr_resolve(now, &p).unwrap();
    sim.drive(100).unwrap();
    assert_eq!(sim.nodes[0].take_events(), vec![Event::TimedOut { id: b, waiting_for: Waiting::SidrRep }]);
    assert_empty(&sim);
}

/// A hostile peer floods REQs with fresh comm IDs and QPNs, and DREQs/RTUs for IDs that do
/// not exist: the tables stay bounded, everything is counted.
#[test]
fn hostile_flood_is_bounded_and_counted() {
    let mut cm = Cm::new(CmConfig { max_conns: 8, ..cfg() });
    cm.listen(SID, 4).unwrap();
    let src = MadSource {
        sgid: Gid::from_ip("10.0.0.66".parse().unwrap()),
        dgid: Gid::from_ip("10.0.0.2".parse().unwrap()),
        src_qp: Qpn::GSI,
        pkey: 0xFFFF,
        traffic_class: 0,
        hop_limit: 64,
    };
    let now = Instant(0);
    for i in 0..1000u32 {
        let r = req::Repr {
            local_comm_id: i + 1,
            service_id: SID,
            local_ca_guid: 0x666,
            local_qpn: Qpn::new(i + 100),
            starting_psn: Psn::new(1),
            path_mtu: 3,
            private_data: vec![],
            ..req::Repr::default()
        };
        cm.handle_mad(now, &src, &emit_mad(i.into(), 0, &CmMsg::Req(r)).unwrap()).unwrap();
        let d = msg::dreq::Repr { local_comm_id: i, remote_comm_id: i ^ 0x5555, remote_qpn: Qpn::new(1), private_data: vec![] };
        cm.handle_mad(now, &src, &emit_mad(i.into(), 0, &CmMsg::Dreq(d)).unwrap()).unwrap();
        assert!(cm.len() <= 8);
        while cm.poll_transmit().is_some() {}
    }
    assert_eq!(cm.len(), 4, "the listener backlog bounds unanswered requests");
    let s = cm.stats();
    assert_eq!(s.rej_no_resources, 996);
    assert_eq!(s.rx_stray, 1000, "each unknown DREQ counted (and answered with a DREP)");
    let mut n = 0;
    while let Some(e) = cm.poll_event() {
        assert!(matches!(e, Event::ConnectRequest { .. }));
        n += 1;
    }
    assert_eq!(n, 4);
    // Truncated and foreign MADs are refused and counted, never panic.
    assert_eq!(cm.handle_mad(now, &src, &[1, 7, 2, 3]), Err(Error::Truncated));
    let mut perf = [0u8; 256];
    perf[..4].copy_from_slice(&[1, 4, 1, 1]);
    assert_eq!(cm.handle_mad(now, &src, &perf), Err(Error::NotCm(4)));
    assert_eq!((cm.stats().rx_malformed, cm.stats().rx_not_cm), (1, 1));
}

/// Many connect/disconnect cycles, several in flight at once, at 5% loss plus duplication and
/// reordering: every connection is established and torn down on both sides, and both tables
/// end empty.
#[test]
fn soak_connect_disconnect_cycles_at_5_percent_loss() {
    const CYCLES: u32 = 300;
    const PARALLEL: u32 = 6;
    let mut sim = Sim::new(2, 2024, cfg());
    sim.record = false;
    sim.impair = Impairments { drop: 0.05, duplicate: 0.02, reorder: 0.05, reorder_ns: 50_000, corrupt: 0.0 };
    sim.nodes[1].cm.listen(SID, 64).unwrap();
    let mut c = Consumer::auto();
    let mut started = 0u32;
    let mut active: Vec<ConnId> = Vec::new();
    let mut disconnecting: Vec<ConnId> = Vec::new();
    let mut steps = 0usize;
    loop {
        while started < CYCLES && (active.len() + disconnecting.len()) < PARALLEL as usize {
            started += 1;
            active.push(connect(&mut sim, 0, 1, 0x100 + started));
        }
        c.pump(&mut sim);
        // Disconnect established connections, alternating the side that starts it.
        let now = sim.now;
        let mut still = Vec::new();
        for id in active.drain(..) {
            if c.log.iter().any(|(n, e)| *n == 0 && *e == Event::Established { id, private_data: vec![] }) {
                if id.0 % 2 == 0 {
                    sim.nodes[0].cm.disconnect(now, id, &[]).unwrap();
                } else {
                    let q = sim.nodes[0].cm.qp_attrs(id).unwrap().remote_qpn;
                    let b = c.log.iter().find_map(|(n, e)| match e {
                        Event::ConnectRequest { id: b, .. } if *n == 1 && sim.nodes[1].cm.qp_attrs(*b).is_some_and(|a| a.local_qpn == q) => Some(*b),
                        _ => None,
                    });
                    match b {
                        Some(b) if sim.nodes[1].cm.state(b) == Some(ConnState::Established) => sim.nodes[1].cm.disconnect(now, b, &[]).unwrap(),
                        _ => sim.nodes[0].cm.disconnect(now, id, &[]).unwrap(),
                    }
                }
                disconnecting.push(id);
            } else {
                assert!(!c.log.iter().any(|(n, e)| *n == 0 && e.id() == id && matches!(e, Event::Rejected { .. } | Event::TimedOut { .. })), "connection {id:?} failed: {:?}", c.log.iter().filter(|(_, e)| e.id() == id).collect::<Vec<_>>());
                still.push(id);
            }
        }
        active = still;
        disconnecting.retain(|id| !c.log.iter().any(|(n, e)| *n == 0 && *e == Event::TimewaitExit { id: *id }));
        if started == CYCLES && active.is_empty() && disconnecting.is_empty() {
            break;
        }
        steps += 1;
        assert!(steps < 2_000_000, "soak livelocked");
        if !sim.step() {
            c.pump(&mut sim);
        }
    }
    sim.drive(100_000).unwrap();
    c.pump(&mut sim);
    for node in 0..2 {
        assert_eq!(c.count(node, is_established), CYCLES as usize, "node {node}");
        assert_eq!(c.count(node, |e| matches!(e, Event::Disconnected { .. })), CYCLES as usize, "node {node}");
        assert_eq!(c.count(node, is_tw_exit), CYCLES as usize, "node {node}");
        assert_eq!(c.count(node, |e| matches!(e, Event::Rejected { .. } | Event::TimedOut { .. })), 0, "node {node}");
    }
    assert_eq!(c.count(1, |e| matches!(e, Event::ConnectRequest { .. })), CYCLES as usize);
    assert_empty(&sim);
    let rtx: u64 = sim.nodes.iter().map(|n| n.cm.stats().retransmits).sum();
    assert!(rtx > 20, "5% loss must have cost retransmissions: {rtx}");
}
