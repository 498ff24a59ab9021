//! Connection establishment, rejection and teardown on the simulated wire.

mod common;
use common::*;

use pmrxe_cm::msg::attr;
use pmrxe_cm::sim::{Fault, Sim};
use pmrxe_cm::*;
use pmrxe_wire::Qpn;

#[test]
fn connect_accept_rtu_established_then_disconnect_and_timewait() {
    let mut sim = Sim::new(2, 1, cfg());
    sim.nodes[1].cm.listen(SID, 8).unwrap();
    let hdr = cma::Repr { src_ip: "10.0.0.1".parse().unwrap(), src_port: 0xC123, dst_ip: "10.0.0.2".parse().unwrap() };
    let mut p = params(&sim, 0, 1, 0x11);
    p.private_data = hdr.with_user_data(b"hello", msg::req::PRIVATE_DATA_LEN).unwrap();
    let now = sim.now;
    let a = sim.nodes[0].cm.connect(now, &p).unwrap();
    assert_eq!(sim.nodes[0].cm.state(a), Some(ConnState::ReqSent));

    // Passive: the request carries what the consumer needs for its QP.
    assert!(sim.drive_until(50, |s| !s.nodes[1].events.is_empty()));
    let ev = sim.nodes[1].events.pop_front().unwrap();
    let Event::ConnectRequest { id: b, req } = ev else { panic!("{ev:?}") };
    assert_eq!(req.req.service_id, SID);
    assert_eq!(req.req.local_qpn, Qpn::new(0x11));
    assert_eq!(req.req.starting_psn.value(), 0x11 * 7);
    assert_eq!(req.source.sgid, sim.nodes[0].gid());
    let (h, user) = req.cma().unwrap();
    assert_eq!(h, hdr);
    assert_eq!(&user[..5], b"hello");
    assert!(user[5..].iter().all(|&x| x == 0) && user.len() == 56);
    let now = sim.now;
    let mut ap = accept_params(0x22);
    ap.private_data = b"welcome".to_vec();
    sim.nodes[1].cm.accept(now, b, &ap).unwrap();
    let pa = sim.nodes[1].cm.qp_attrs(b).unwrap();
    assert_eq!((pa.remote_qpn, pa.rq_psn.value(), pa.sq_psn.value()), (Qpn::new(0x11), 0x11 * 7, 0x22 * 3));

    // Active: REP → ConnectResponse; QP attributes mirror the passive side's.
    assert!(sim.drive_until(50, |s| !s.nodes[0].events.is_empty()));
    let Event::ConnectResponse { id, rep } = sim.nodes[0].events.pop_front().unwrap() else { panic!() };
    assert_eq!(id, a);
    assert_eq!(&rep.private_data[..7], b"welcome");
    let qa = sim.nodes[0].cm.qp_attrs(a).unwrap();
    assert_eq!(qa.remote_qpn, Qpn::new(0x22));
    assert_eq!(qa.rq_psn, pa.sq_psn);
    assert_eq!(qa.sq_psn, pa.rq_psn);
    assert_eq!((qa.max_rd_atomic, qa.max_dest_rd_atomic), (pa.max_dest_rd_atomic, pa.max_rd_atomic));
    assert_eq!((qa.rnr_retry, qa.retry_cnt, qa.path_mtu), (6, 7, 3));
    assert_eq!(qa.path.dgid, sim.nodes[1].gid());
    assert_eq!(pa.path.dgid, sim.nodes[0].gid());
    let now = sim.now;
    sim.nodes[0].cm.rtu(now, a, b"go").unwrap();
    assert!(sim.nodes[0].events.pop_front().is_none(), "Established is queued only when polled");
    sim.flush();
    assert_eq!(sim.nodes[0].events.pop_front(), Some(Event::Established { id: a, private_data: vec![] }));
    assert!(sim.drive_until(50, |s| !s.nodes[1].events.is_empty()));
    let Event::Established { id, private_data } = sim.nodes[1].events.pop_front().unwrap() else { panic!() };
    assert_eq!(id, b);
    assert_eq!(&private_data[..2], b"go");
    assert_eq!(sim.nodes[1].cm.state(b), Some(ConnState::Established));

    // Disconnect from the passive side: DISCONNECTED on both, then TIMEWAIT exits.
    let now = sim.now;
    sim.nodes[1].cm.disconnect(now, b, b"bye").unwrap();
    sim.drive(200).unwrap();
    let e0 = sim.nodes[0].take_events();
    let e1 = sim.nodes[1].take_events();
    assert!(matches!(&e0[0], Event::Disconnected { id, timed_out: false, private_data } if *id == a && &private_data[..3] == b"bye"));
    assert_eq!(e0[1], Event::TimewaitExit { id: a });
    assert!(matches!(&e1[0], Event::Disconnected { id, timed_out: false, .. } if *id == b));
    assert_eq!(e1[1], Event::TimewaitExit { id: b });
    assert_empty(&sim);
    assert_eq!(sim.nodes[0].cm.stats().retransmits + sim.nodes[1].cm.stats().retransmits, 0);
    let names: Vec<u16> = sim.trace.iter().map(|t| t.attr_id).collect();
    assert_eq!(names, vec![attr::REQ, attr::REP, attr::RTU, attr::DREQ, attr::DREP]);
}

#[test]
fn consumer_reject_carries_reason_and_private_data() {
    let mut sim = Sim::new(2, 2, cfg());
    sim.nodes[1].cm.listen(SID, 8).unwrap();
    let a = connect(&mut sim, 0, 1, 5);
    assert!(sim.drive_until(50, |s| !s.nodes[1].events.is_empty()));
    let Event::ConnectRequest { id: b, .. } = sim.nodes[1].events.pop_front().unwrap() else { panic!() };
    let now = sim.now;
    assert_eq!(sim.nodes[1].cm.reject(now, b, RejReason::CONSUMER_DEFINED, &[], &[0; 149]), Err(CmError::PrivateDataTooLong));
    sim.nodes[1].cm.reject(now, b, RejReason::CONSUMER_DEFINED, &[], b"go away").unwrap();
    sim.drive(100).unwrap();
    let ev = sim.nodes[0].take_events();
    assert_eq!(ev.len(), 1);
    let Event::Rejected { id, reason, message, private_data, .. } = &ev[0] else { panic!("{ev:?}") };
    assert_eq!((*id, *reason, *message), (a, RejReason::CONSUMER_DEFINED, MsgCode::Req));
    assert_eq!(&private_data[..7], b"go away");
    assert_eq!(private_data.len(), 148);
    assert_empty(&sim);
}

#[test]
fn no_listener_is_rejected_fast_with_reason_8() {
    let mut sim = Sim::new(2, 3, cfg());
    let now = sim.now;
    let p = params(&sim, 0, 1, 5);
    let a = sim.nodes[0].cm.connect(now, &p).unwrap();
    sim.drive(100).unwrap();
    let ev = sim.nodes[0].take_events();
    assert!(
        matches!(&ev[..], [Event::Rejected { id, reason: RejReason::INVALID_SERVICE_ID, message: MsgCode::Req, .. }] if *id == a),
        "{ev:?}"
    );
    // One round trip, no retransmission.
    assert_eq!(sim.trace.len(), 2);
    assert!(sim.now.0 < iba_ns(12));
    assert_eq!(sim.nodes[1].cm.stats().rej_no_listener, 1);
    assert_empty(&sim);
}

/// Drop the first `n` MADs of attribute `attr_id`.
fn drop_first(sim: &mut Sim, attr_id: u16, n: usize) {
    let mut left = n;
    sim.add_filter(move |m| {
        if m.attr_id == attr_id && left > 0 {
            left -= 1;
            Some(Fault::Drop)
        } else {
            None
        }
    });
}

fn full_cycle(sim: &mut Sim, c: &mut Consumer) {
    sim.nodes[1].cm.listen(SID, 8).unwrap();
    let a = connect(sim, 0, 1, 9);
    assert!(c.run(sim, 2000, |c, _| c.has(0, is_established) && c.has(1, is_established)), "not established: {:?}", c.log);
    let now = sim.now;
    sim.nodes[0].cm.disconnect(now, a, &[]).unwrap();
    assert!(c.run(sim, 2000, |c, _| c.has(0, is_tw_exit) && c.has(1, is_tw_exit)), "no timewait exit: {:?}", c.log);
    assert!(c.has(0, is_disconnected) && c.has(1, is_disconnected));
    sim.drive(100).unwrap();
    assert_empty(sim);
}

#[test]
fn lost_req_rep_rtu_dreq_drep_are_recovered_by_retransmission() {
    for (attr_id, n) in [(attr::REQ, 3), (attr::REP, 2), (attr::RTU, 1), (attr::DREQ, 2), (attr::DREP, 1)] {
        let mut sim = Sim::new(2, 4, cfg());
        drop_first(&mut sim, attr_id, n);
        let mut c = Consumer::auto();
        full_cycle(&mut sim, &mut c);
        let rtx: u64 = sim.nodes.iter().map(|n| n.cm.stats().retransmits).sum();
        assert!(rtx >= 1, "attr {attr_id:#x}: no retransmission");
        assert_eq!(c.count(0, is_established), 1, "attr {attr_id:#x}");
        assert_eq!(c.count(1, is_established), 1, "attr {attr_id:#x}");
    }
}

#[test]
fn lost_rtu_is_covered_by_establish_when_data_arrives_first() {
    let mut sim = Sim::new(2, 5, cfg());
    sim.add_filter(|m| (m.attr_id == attr::RTU).then_some(Fault::Drop));
    sim.nodes[1].cm.listen(SID, 8).unwrap();
    let mut c = Consumer::auto();
    connect(&mut sim, 0, 1, 9);
    assert!(c.run(&mut sim, 100, |c, _| c.has(0, is_established)));
    let Some(Event::ConnectRequest { id: b, .. }) = c.log.iter().find(|(n, _)| *n == 1).map(|(_, e)| e.clone()) else { panic!() };
    assert_eq!(sim.nodes[1].cm.state(b), Some(ConnState::RepSent));
    let now = sim.now;
    sim.nodes[1].cm.establish(now, b).unwrap();
    c.pump(&mut sim);
    assert!(c.has(1, is_established));
    assert_eq!(sim.nodes[1].cm.poll_timeout(), None, "REP retransmission stopped");
}

#[test]
fn exhausted_req_retries_time_out() {
    let mut sim = Sim::new(2, 6, cfg());
    let mut p = params(&sim, 0, 1, 9);
    p.path.dgid = Gid::from_ip("10.9.9.9".parse().unwrap()); // nobody there
    p.max_cm_retries = 3;
    let now = sim.now;
    let a = sim.nodes[0].cm.connect(now, &p).unwrap();
    sim.drive(100).unwrap();
    let ev = sim.nodes[0].take_events();
    assert_eq!(ev, vec![Event::TimedOut { id: a, waiting_for: Waiting::Rep }]);
    // 1 + 3 REQs, then the REJ(timeout) that tells a (here absent) peer we gave up.
    let attrs: Vec<u16> = sim.trace.iter().map(|t| t.attr_id).collect();
    assert_eq!(attrs, vec![attr::REQ, attr::REQ, attr::REQ, attr::REQ, attr::REJ]);
    let per_try = 2 * iba_ns(8) + iba_ns(12);
    assert_eq!(sim.now.0, 4 * per_try);
    assert_eq!(sim.nodes[0].cm.stats().timeouts, 1);
    assert_empty(&sim);
}

#[test]
fn exhausted_rep_retries_time_out_and_the_active_side_hears_rej_timeout() {
    let mut sim = Sim::new(2, 7, cfg());
    sim.add_filter(|m| (m.attr_id == attr::RTU).then_some(Fault::Drop));
    sim.nodes[1].cm.listen(SID, 8).unwrap();
    let mut c = Consumer::auto();
    let now = sim.now;
    let mut p = params(&sim, 0, 1, 9);
    p.max_cm_retries = 2;
    let a = sim.nodes[0].cm.connect(now, &p).unwrap();
    assert!(c.run(&mut sim, 500, |c, _| c.has(1, |e| matches!(e, Event::TimedOut { waiting_for: Waiting::Rtu, .. }))));
    // The active side thought it was established; the REJ(timeout, ARI = passive CA GUID)
    // takes it down.
    assert!(c.run(&mut sim, 500, |c, _| c.has(0, |e| matches!(e, Event::Rejected { reason: RejReason::TIMEOUT, .. }))));
    assert!(c.has(0, |e| *e == Event::Established { id: a, private_data: vec![] }));
    sim.drive(1000).unwrap();
    assert_empty(&sim);
}

#[test]
fn mra_extends_the_wait_while_the_consumer_decides() {
    let mut sim = Sim::new(2, 8, cfg());
    sim.nodes[1].cm.listen(SID, 8).unwrap();
    let mut p = params(&sim, 0, 1, 9);
    p.max_cm_retries = 2;
    let now = sim.now;
    let a = sim.nodes[0].cm.connect(now, &p).unwrap();
    let per_try = 2 * iba_ns(8) + iba_ns(12);
    // Without an MRA the REQ would be given up after 3 attempts (at 3 · per_try). The consumer
    // on node 1 sits on the request past that; its CM MRAs the retransmitted REQ, and the
    // active side waits the MRA's service timeout (2^14 units) per attempt instead.
    sim.drive_until(10_000, |s| s.now.0 > 3 * per_try);
    assert!(sim.now.0 > 4 * per_try);
    assert!(sim.nodes[0].events.is_empty(), "no timeout while MRA'd: {:?} {:?} now {}", sim.nodes[0].events, sim.trace, sim.now.0);
    assert_eq!(sim.nodes[0].cm.state(a), Some(ConnState::MraReqRcvd));
    assert!(sim.trace.iter().any(|t| t.attr_id == attr::MRA));
    let Some(Event::ConnectRequest { id: b, .. }) = sim.nodes[1].events.pop_front() else { panic!() };
    assert_eq!(sim.nodes[1].events.len(), 0, "duplicate REQs are not new requests");
    let now = sim.now;
    sim.nodes[1].cm.accept(now, b, &accept_params(0x22)).unwrap();
    let mut c = Consumer::auto();
    assert!(c.run(&mut sim, 500, |c, _| c.has(0, is_established) && c.has(1, is_established)));
}

#[test]
fn duplicated_rep_gets_the_rtu_again_and_duplicated_req_the_rep() {
    let mut sim = Sim::new(2, 9, cfg());
    sim.add_filter(|m| matches!(m.attr_id, attr::REQ | attr::REP | attr::RTU).then_some(Fault::Duplicate));
    sim.nodes[1].cm.listen(SID, 8).unwrap();
    let mut c = Consumer::auto();
    connect(&mut sim, 0, 1, 9);
    assert!(c.run(&mut sim, 500, |c, _| c.has(0, is_established) && c.has(1, is_established)));
    sim.drive(500).unwrap();
    c.pump(&mut sim);
    assert_eq!(c.count(1, |e| matches!(e, Event::ConnectRequest { .. })), 1);
    assert_eq!(c.count(0, |e| matches!(e, Event::ConnectResponse { .. })), 1);
    assert_eq!(c.count(1, is_established), 1);
    let dups: u64 = sim.nodes.iter().map(|n| n.cm.stats().rx_duplicates).sum();
    assert!(dups >= 3, "{dups}");
}

#[test]
fn simultaneous_disconnect_ends_disconnected_on_both_sides() {
    let mut sim = Sim::new(2, 10, cfg());
    sim.nodes[1].cm.listen(SID, 8).unwrap();
    let mut c = Consumer::auto();
    let a = connect(&mut sim, 0, 1, 9);
    assert!(c.run(&mut sim, 500, |c, _| c.has(0, is_established) && c.has(1, is_established)));
    let b = c.log.iter().find_map(|(n, e)| (*n == 1).then(|| e.id())).unwrap();
    let now = sim.now;
    sim.nodes[0].cm.disconnect(now, a, &[]).unwrap();
    sim.nodes[1].cm.disconnect(now, b, &[]).unwrap();
    assert!(c.run(&mut sim, 500, |c, _| c.has(0, is_tw_exit) && c.has(1, is_tw_exit)));
    assert_eq!(c.count(0, is_disconnected), 1);
    assert_eq!(c.count(1, is_disconnected), 1);
    assert_eq!(sim.trace.iter().filter(|t| t.attr_id == attr::DREQ).count(), 2);
    sim.drive(100).unwrap();
    assert_empty(&sim);
}

#[test]
fn dreq_for_an_unknown_connection_gets_a_drep() {
    let mut sim = Sim::new(2, 11, cfg());
    let mut c = Consumer::auto();
    sim.nodes[1].cm.listen(SID, 8).unwrap();
    let a = connect(&mut sim, 0, 1, 9);
    assert!(c.run(&mut sim, 500, |c, _| c.has(1, is_established)));
    // Node 1 forgets everything (its service restarted): node 0's DREQ still completes.
    sim.nodes[1].cm = Cm::new(cfg());
    let now = sim.now;
    sim.nodes[0].cm.disconnect(now, a, &[]).unwrap();
    assert!(c.run(&mut sim, 500, |c, _| c.has(0, is_disconnected)));
    assert_eq!(sim.nodes[1].cm.stats().rx_stray, 1);
    assert_eq!(sim.nodes[0].cm.stats().retransmits, 0);
}

#[test]
fn destroy_mid_handshake_tells_the_peer() {
    // Active destroys while its REQ is unanswered (client killed): passive hears REJ(timeout).
    let mut sim = Sim::new(2, 12, cfg());
    sim.nodes[1].cm.listen(SID, 8).unwrap();
    let a = connect(&mut sim, 0, 1, 9);
    assert!(sim.drive_until(50, |s| !s.nodes[1].events.is_empty()));
    let now = sim.now;
    sim.nodes[0].cm.destroy(now, a).unwrap();
    sim.drive(100).unwrap();
    let ev = sim.nodes[1].take_events();
    assert!(matches!(&ev[..], [Event::ConnectRequest { .. }, Event::Rejected { reason: RejReason::TIMEOUT, .. }]), "{ev:?}");
    assert!(sim.nodes[0].take_events().is_empty());
    assert_empty(&sim);

    // Passive destroys an unanswered request (server killed): active hears REJ 28.
    let a = connect(&mut sim, 0, 1, 10);
    assert!(sim.drive_until(50, |s| !s.nodes[1].events.is_empty()));
    let b = sim.nodes[1].events.pop_front().unwrap().id();
    let now = sim.now;
    sim.nodes[1].cm.destroy(now, b).unwrap();
    sim.drive(100).unwrap();
    let ev = sim.nodes[0].take_events();
    assert!(matches!(&ev[..], [Event::Rejected { id, reason: RejReason::CONSUMER_DEFINED, .. }] if *id == a), "{ev:?}");
    assert_empty(&sim);

    // Destroying an established connection disconnects it silently on our side.
    let mut c = Consumer::auto();
    let a = connect(&mut sim, 0, 1, 11);
    assert!(c.run(&mut sim, 500, |c, _| c.has(1, is_established)));
    let now = sim.now;
    sim.nodes[0].cm.destroy(now, a).unwrap();
    assert_eq!(sim.nodes[0].cm.destroy(now, ConnId(12345)), Err(CmError::UnknownId));
    assert!(c.run(&mut sim, 500, |c, _| c.has(1, is_tw_exit)));
    sim.drive(100).unwrap();
    c.pump(&mut sim);
    assert!(!c.has(0, is_disconnected), "destroyed ids report nothing");
    assert!(c.has(1, is_disconnected));
    assert_empty(&sim);
}
