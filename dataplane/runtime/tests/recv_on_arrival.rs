//! A receive WQE posted before a SEND arrives is found by that SEND, even when the lcore has
//! not read the receive queue's doorbell yet (an lcore pass receives before it reads
//! doorbells). A NIC reads the receive queue when a message arrives; so does the lcore. Before
//! the fix an RC responder answered such a SEND with an RNR NAK (the sender then waited out
//! the RNR timer) and a UD responder dropped the datagram: udaddy's server, which posts its
//! receives and then accepts, hung in one CI run of many.
mod common;

use common::{client_page, rig, Rig};
use pmrxe_abi::{Doorbell, ShmRecvWqe, ShmSge};
use pmrxe_transport::sim::{bring_up, PairParams};
use pmrxe_transport::{Instant, PathMtu};

#[test]
fn send_finds_a_receive_posted_before_its_doorbell_was_read() {
    send_meets_unread_doorbell(false);
}

#[test]
fn send_finds_an_srq_receive_posted_before_its_doorbell_was_read() {
    send_meets_unread_doorbell(true);
}

/// QP 0x11 sends 8 bytes to QP 0x12 (which receives from its own RQ, or from SRQ 5); the
/// receive is posted and its doorbell rung after the SEND is on the wire, so the lcore pass
/// that receives the SEND has not read that doorbell.
fn send_meets_unread_doorbell(on_srq: bool) {
    let common::Pair { mut lc, h, mem, ips: [ip0, ip1], to_dev1: q1, .. } = common::lcore_pair(common::jumbo_buf);
    let p = PairParams { mtu: PathMtu::Mtu4096, access: 0x7, ..PairParams::default() };
    let Rig { page, events: _events, mut cq_rings, mut sqs, lkey, rkey, dst, srq } =
        rig(&mut lc, &h, &mem, [ip0, ip1], &p, bring_up, on_srq.then_some(5));
    let cpage = client_page(&page);

    // Where 0x12's receives go: the SRQ's ring (doorbell slot 2), or its own receive ring
    // (slot 1; the rig only hands out the send rings).
    let (_seg, mut rq, slot) = match srq {
        Some((seg, prod)) => (seg, prod, 2),
        None => {
            let seg = sqs[1].0.clone();
            let prod = common::own_rq(&seg);
            (seg, prod, 1)
        }
    };

    // 0x11 sends 8 bytes of the source MR (0xab); the frame is on the wire to device 1.
    let now = Instant(1_000);
    common::send_8_bytes(&mut lc, cpage, &mut sqs[0].1, lkey, &q1, now);

    // Now 0x12's client posts a receive and rings: the next pass receives the SEND before it
    // reads that doorbell.
    let mut r = ShmRecvWqe { wr_id: 9, num_sge: 1, ..Default::default() };
    r.sge[0] = ShmSge { addr: 0x20_0100, length: 64, lkey: rkey.0 };
    rq.push(r).unwrap();
    cpage.ring(Doorbell { lcore: 0, slot });

    // The clock does not move: a SEND answered with an RNR NAK would wait for its RNR timer
    // and never complete here.
    let (mut send_done, mut recv_done) = (None, None);
    for _ in 0..8 {
        lc.poll_once(now);
        if let Some(c) = cq_rings[0].1.pop().unwrap() {
            send_done = Some(c);
        }
        if let Some(c) = cq_rings[1].1.pop().unwrap() {
            recv_done = Some(c);
        }
    }
    let s = send_done.unwrap_or_else(|| panic!("the SEND completed without waiting for an RNR timer: {:?}", h.stats.snapshot()));
    assert_eq!((s.wr_id, s.status), (7, 0));
    let r = recv_done.expect("the receive completed");
    assert_eq!((r.wr_id, r.status, r.byte_len), (9, 0, 8));
    let mut b = [0u8; 9];
    dst.read(0x100, &mut b).unwrap();
    assert_eq!(b, [0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0], "the 8 bytes landed in the receive buffer");
}
