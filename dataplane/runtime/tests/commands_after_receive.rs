//! A control command caused by a completion the lcore made visible sees every frame the lcore
//! had already sent to itself before that completion.
//!
//! The lcore ran commands before receive, so a command that arrived between passes (the lcore
//! preempted on a 2-core machine while two clients spin) could overtake an ACK the lcore had
//! already sent towards one of its own ports: a QP moved to ERR by its peer's disconnect
//! flushed (status 5) a SEND whose ACK was on the way. The lcore now receives before it runs
//! commands: the ACK retires the SEND before the QP leaves RTS.
//!
//! (This order was first suspected of a fi_pingpong `-e rdm` teardown failure. That failure
//! turned out to be libfabric's own, with no QP in ERR: see tests/ecosystem.rs. The overtaking
//! itself is real, and this test shows it.)
mod common;

use common::{client_page, rig, Rig};
use crossbeam::channel::bounded;
use pmrxe_abi::{Doorbell, ShmRecvWqe, ShmSge};
use pmrxe_runtime::lcore::Cmd;
use pmrxe_transport::attr::{AttrMask, QpAttr, QpState};
use pmrxe_transport::sim::{bring_up, PairParams};
use pmrxe_transport::{Instant, PathMtu};

#[test]
fn a_command_after_the_peer_completed_does_not_overtake_the_ack() {
    let common::Pair { mut lc, h, mem, ips: [ip0, ip1], to_dev0, to_dev1, .. } = common::lcore_pair(common::jumbo_buf);
    let p = PairParams { mtu: PathMtu::Mtu4096, access: 0x7, ..PairParams::default() };
    let Rig { page, events: _events, mut cq_rings, mut sqs, lkey, rkey, .. } = rig(&mut lc, &h, &mem, [ip0, ip1], &p, bring_up, None);
    let cpage = client_page(&page);

    // QP 0x12 has a receive posted (its own RQ, doorbell slot 1).
    let seg = sqs[1].0.clone();
    let mut rq = common::own_rq(&seg);
    let mut r = ShmRecvWqe { wr_id: 9, num_sge: 1, ..Default::default() };
    r.sge[0] = ShmSge { addr: 0x20_0000, length: 64, lkey: rkey.0 };
    rq.push(r).unwrap();
    cpage.ring(Doorbell { lcore: 0, slot: 1 });

    // Pass 1: QP 0x11's 8-byte SEND goes on the wire towards device 1.
    let now = Instant(1_000);
    common::send_8_bytes(&mut lc, cpage, &mut sqs[0].1, lkey, &to_dev1, now);

    // Pass 2: QP 0x12 receives it; its receive completion is visible and its ACK is sent.
    lc.poll_once(now);
    let c = cq_rings[1].1.pop().unwrap().expect("the receive completed");
    assert_eq!((c.wr_id, c.status, c.byte_len), (9, 0, 8));
    assert_eq!(common::lock(&to_dev0).len(), 1, "the ACK is on the wire");
    assert!(cq_rings[0].1.pop().unwrap().is_none(), "the SEND is not complete before its ACK is received");

    // What the receiver's completion caused (its program exits, the disconnect reaches the
    // sender) moves QP 0x11 to ERR before the lcore's next pass.
    let (tx, rx) = bounded(1);
    let attr = QpAttr { qp_state: QpState::Err, ..QpAttr::default() };
    h.cmds.send(Cmd::ModifyQp { qpn: 0x11, attr: Box::new(attr), mask: AttrMask::STATE, done: tx }).unwrap();
    lc.poll_once(now);
    rx.recv().unwrap().unwrap();
    let s = cq_rings[0].1.pop().unwrap().expect("the SEND completed");
    assert_eq!((s.wr_id, s.status), (7, 0), "the ACK sent before the command retired the SEND (status 5 = flushed)");
    assert!(cq_rings[0].1.pop().unwrap().is_none(), "nothing else completed");
    let flushed = || h.stats.snapshot().cqes_flushed;
    assert_eq!(flushed(), 0, "QP 0x11 went to ERR with nothing outstanding");

    // A receive posted on QP 0x12 is flushed when it goes to ERR, and counted.
    rq.push(ShmRecvWqe { wr_id: 10, ..r }).unwrap();
    cpage.ring(Doorbell { lcore: 0, slot: 1 });
    lc.poll_once(now);
    let (tx, rx) = bounded(1);
    h.cmds.send(Cmd::ModifyQp { qpn: 0x12, attr: Box::new(attr), mask: AttrMask::STATE, done: tx }).unwrap();
    lc.poll_once(now);
    rx.recv().unwrap().unwrap();
    let f = cq_rings[1].1.pop().unwrap().expect("the receive was flushed");
    assert_eq!((f.wr_id, f.status), (10, 5));
    assert_eq!(flushed(), 1, "the flushed receive is counted in cqes_flushed");
}
