//! UC and UD over the sim wire.
mod common;
use common::*;
use pmrxe_transport::sim::{gid_of, Fault, PairParams, Sim};
use pmrxe_transport::{AddressVector, AttrMask, PathMtu, Qp, QpAttr, QpState, QpType, SendOp, SendWqe, UdDest, WcFlags, WcStatus};

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
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 2]);
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

/// A UD QP as the service creates it: `Qp::new`, the port's active MTU, then INIT/RTR/RTS
/// with exactly the UD masks (no `PATH_MTU`: UD has no such modify attribute).
fn ud_qp_on_port(qpn: u32, port_mtu: PathMtu) -> Qp {
    let p = PairParams::default();
    let mut qp = Qp::new(qpn, QpType::Ud, PD, p.caps, None).expect("create QP");
    qp.set_port_mtu(port_mtu);
    let a = QpAttr { qp_state: QpState::Init, qkey: 0x1111_1111, port_num: 1, ..QpAttr::default() };
    qp.modify(&a, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY, &mut pmrxe_transport::Deferred).expect("INIT");
    qp.modify(&QpAttr { qp_state: QpState::Rtr, ..a }, AttrMask::STATE, &mut pmrxe_transport::Deferred).expect("RTR");
    qp.modify(&QpAttr { qp_state: QpState::Rts, ..a }, AttrMask::STATE | AttrMask::SQ_PSN, &mut pmrxe_transport::Deferred).expect("RTS");
    qp
}

fn ud_pair_on_port(port_mtu: PathMtu) -> (Sim, UdDest) {
    let mut sim = Sim::new(2, 3);
    sim.nodes[A].engine.add_qp(ud_qp_on_port(QA, port_mtu));
    sim.nodes[B].engine.add_qp(ud_qp_on_port(QB, port_mtu));
    let av = AddressVector { dgid: gid_of(sim.nodes[B].ip), hop_limit: 64, port: 1, ..Default::default() };
    (sim, UdDest { av, remote_qpn: QB, remote_qkey: 0x1111_1111 })
}

/// Issue 13 item 5: UD QPs kept a 1024-byte path MTU whatever the port's, so a 4096-byte
/// UD send on a 4096-MTU port never reached the wire.
#[test]
fn ud_send_uses_port_mtu() {
    let (mut sim, d) = ud_pair_on_port(PathMtu::Mtu4096);
    assert_eq!(sim.nodes[A].qp(QA).query().path_mtu, PathMtu::Mtu4096, "UD path MTU = port active MTU");
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 8192, ALL);
    a.write(0, &pattern(4096, 5));
    // The receive buffer holds the 40-byte GRH followed by a full-MTU payload.
    post_recv(&mut sim, B, QB, recv(7, &b, 0, 40 + 4096));
    post(&mut sim, A, QA, SendWqe::new(1, SendOp::Send).sge(a.sge(0, 4096)).ud(d).flags(sig()));
    drive(&mut sim);
    let s = send_cqes(&mut sim, A, QA);
    assert_eq!(statuses(&s), vec![WcStatus::Success]);
    assert_eq!(s[0].byte_len, 4096);
    let r = recv_cqes(&mut sim, B, QB);
    assert_eq!(statuses(&r), vec![WcStatus::Success]);
    assert_eq!(r[0].byte_len, 40 + 4096);
    assert_eq!(b.read(40, 4096), pattern(4096, 5));
    let sent: Vec<_> = sim.trace.iter().filter(|p| p.from == A).collect();
    assert_eq!(sent.len(), 1, "one UD_SEND_ONLY packet");
    // The port MTU survives RESET (the QP is re-created inside the engine).
    let qp = sim.nodes[A].engine.qp_mut(QA).expect("QP");
    qp.modify(&QpAttr { qp_state: QpState::Reset, ..QpAttr::default() }, AttrMask::STATE, &mut pmrxe_transport::Deferred).expect("RESET");
    assert_eq!(qp.query().path_mtu, PathMtu::Mtu4096);
}

/// Issue 13 item 5: a UD send above the path MTU completed SUCCESS with nothing sent.
#[test]
fn ud_send_above_path_mtu_completes_with_error() {
    let (mut sim, d) = ud_pair_on_port(PathMtu::Mtu4096);
    let a = reg(&sim, A, 8192, ALL);
    let b = reg(&sim, B, 16384, ALL);
    post_recv(&mut sim, B, QB, recv(7, &b, 0, 8192));
    post(&mut sim, A, QA, SendWqe::new(1, SendOp::Send).sge(a.sge(0, 4097)).ud(d).flags(sig()));
    drive(&mut sim);
    let s = send_cqes(&mut sim, A, QA);
    assert_eq!(statuses(&s), vec![WcStatus::LocLenErr]);
    assert!(sim.trace.iter().all(|p| p.from != A), "nothing transmitted");
    assert!(recv_cqes(&mut sim, B, QB).is_empty());
    // An unsignaled oversize send reports its error too.
    let (mut sim, d) = ud_pair_on_port(PathMtu::Mtu1024);
    let a = reg(&sim, A, 8192, ALL);
    post(&mut sim, A, QA, SendWqe::new(2, SendOp::Send).sge(a.sge(0, 1025)).ud(d));
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::LocLenErr]);
    assert!(sim.trace.iter().all(|p| p.from != A));
}
