//! A queue whose ring holds more WQEs than its engine queue takes is retried every pass, but a
//! retry that moves nothing is not work: the pass reports idle, so an lcore in `wait` mode
//! can sleep. Before the fix every retry counted as work, the lcore never slept, and on a CPU
//! shared with the program that posted (UCX keeps more receives posted than its QP's receive
//! queue holds) it held the CPU for whole time slices: ucx_perftest tag_lat averaged 555 µs
//! on the loopback config (9.3 M busy passes in 3 s), 105 µs after.
mod common;

use common::{client_page, rig, Rig};
use pmrxe_abi::{Doorbell, ShmRecvWqe, ShmSge};
use pmrxe_transport::sim::{bring_up, PairParams};
use pmrxe_transport::{Instant, PathMtu, QpCaps};

#[test]
fn a_full_receive_queue_retried_is_not_work() {
    let common::Pair { mut lc, h, mem, ips: [ip0, ip1], .. } = common::lcore_pair(common::jumbo_buf);
    // QP 0x12's engine receive queue holds 4; its ring (256) gets 10.
    let caps = QpCaps { max_send_wr: 16, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let p = PairParams { mtu: PathMtu::Mtu4096, access: 0x7, caps, ..PairParams::default() };
    let Rig { page, events: _events, cq_rings: _cq, sqs, lkey: _, rkey, dst: _, srq: _ } = rig(&mut lc, &h, &mem, [ip0, ip1], &p, bring_up, None);
    let cpage = client_page(&page);
    let mut rq = common::own_rq(&sqs[1].0);
    for i in 0..10u64 {
        let mut r = ShmRecvWqe { wr_id: i, num_sge: 1, ..Default::default() };
        r.sge[0] = ShmSge { addr: 0x20_0000 + i * 64, length: 64, lkey: rkey.0 };
        rq.push(r).unwrap();
    }
    cpage.ring(Doorbell { lcore: 0, slot: 1 });
    let now = Instant(1_000);
    assert!(lc.poll_once(now), "the pass that moves 4 WQEs did work");
    let moved = h.stats.snapshot().rq_wqes;
    assert_eq!(moved, 4, "the engine queue took 4 of 10");
    for pass in 0..5 {
        assert!(!lc.poll_once(now), "pass {pass}: retrying a full queue is not work");
    }
    assert_eq!(h.stats.snapshot().rq_wqes, 4, "the other 6 stay in the ring, nothing lost");
}
