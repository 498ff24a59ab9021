//! UC and UD over the sim wire.
mod common;
use common::*;
use pmrxe_transport::sim::{gid_of, Fault, PairParams, Sim};
use pmrxe_transport::{AddressVector, QpType, SendOp, SendWqe, UdDest, WcFlags, WcStatus};

#[test]
fn uc_write_and_send_complete_without_acks_and_drop_on_gap() {
    let p = PairParams { qp_type: QpType::Uc, ..Default::default() };
    let mut sim = pair_with(&p, 1);
    let a = reg(&sim, A, 16384, ALL);
    let b = reg(&sim, B, 16384, ALL);
    a.write(0, &pattern(4000, 2));
    post_recv(&mut sim, B, QB, recv(1, &b, 8192, 4096));
    post_recv(&mut sim, B, QB, recv(2, &b, 12288, 4096));
    post(&mut sim, A, QA, write(1, &a, 0, 4000, b.addr, b.rkey()));
    // The first SEND loses its middle packet: the message is dropped, the next one lands.
    let mut once = true;
    sim.add_filter(move |p| (p.opcode == pmrxe_wire::Opcode::UC_SEND_MIDDLE && std::mem::take(&mut once)).then_some(Fault::Drop));
    post(&mut sim, A, QA, send(2, &a, 0, 3000));
    post(&mut sim, A, QA, send(3, &a, 0, 100));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 3]);
    assert_eq!(b.read(0, 4000), pattern(4000, 2));
    let r = recv_cqes(&mut sim, B, QB);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].byte_len, 100);
    assert!(sim.trace.iter().all(|p| p.opcode != pmrxe_wire::Opcode::RC_ACKNOWLEDGE));
}

#[test]
fn ud_send_writes_grh_and_source_qp() {
    let p = PairParams { qp_type: QpType::Ud, ..Default::default() };
    let mut sim = Sim::new(2, 1);
    sim.connect(A, QA, B, QB, &p);
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 4096, ALL);
    a.write(0, &pattern(500, 1));
    post_recv(&mut sim, B, QB, recv(9, &b, 0, 1000));
    let av = AddressVector { dgid: gid_of(sim.nodes[B].ip), hop_limit: 64, port: 1, ..Default::default() };
    let d = UdDest { av, remote_qpn: QB, remote_qkey: 0x1111_1111 };
    post(&mut sim, A, QA, SendWqe::new(1, SendOp::SendImm(77)).sge(a.sge(0, 500)).ud(d).flags(sig()));
    // Wrong Q_Key: silently dropped.
    post(&mut sim, A, QA, SendWqe::new(2, SendOp::Send).sge(a.sge(0, 10)).ud(UdDest { remote_qkey: 5, ..d }).flags(sig()));
    // Larger than the MTU: completes without sending (C10-93.1.1).
    let big = reg(&sim, A, 4096, ALL);
    post(&mut sim, A, QA, SendWqe::new(3, SendOp::Send).sge(big.sge(0, 2000)).ud(d).flags(sig()));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 3]);
    let r = recv_cqes(&mut sim, B, QB);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].src_qp, QA);
    assert_eq!(r[0].byte_len, 540);
    assert_eq!(r[0].imm_data, Some(77));
    assert!(r[0].wc_flags.contains(WcFlags::GRH));
    assert_eq!(b.read(40, 500), pattern(500, 1));
    assert_eq!(b.read(8, 16), sim.nodes[A].gid().to_vec(), "GRH source GID");
    assert_eq!(sim.trace.iter().filter(|p| p.from == A).count(), 2);
}

#[test]
fn srq_shared_by_two_qps_with_limit_event() {
    use pmrxe_transport::{AsyncEvent, Srq, SrqAttr};
    let mut sim = Sim::new(2, 1);
    let p = PairParams::default();
    sim.nodes[B].engine.add_srq(Srq::new(7, SrqAttr { max_wr: 16, max_sge: 1, srq_limit: 0 }).unwrap());
    sim.connect_with_srq(A, QA, None, B, QB, Some(7), &p);
    sim.connect_with_srq(A, QA + 1, None, B, QB + 1, Some(7), &p);
    let a = reg(&sim, A, 4096, ALL);
    let b = reg(&sim, B, 8192, ALL);
    {
        let srq = sim.nodes[B].engine.srq_mut(7).unwrap();
        for i in 0..4 {
            srq.post_recv(recv(i, &b, i * 1024, 1024)).unwrap();
        }
        srq.arm_limit(2);
    }
    post(&mut sim, A, QA, send(1, &a, 0, 10));
    post(&mut sim, A, QA + 1, send(2, &a, 0, 20));
    post(&mut sim, A, QA, send(3, &a, 0, 30));
    drive(&mut sim);
    let got = recv_cqes(&mut sim, B, QB).len() + recv_cqes(&mut sim, B, QB + 1).len();
    assert_eq!(got, 3);
    assert!(sim.nodes[B].events.iter().any(|(_, e)| matches!(e, AsyncEvent::SrqLimitReached { srqn: 7 })));
}
