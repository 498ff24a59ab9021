//! RC data path over the sim wire: SEND, WRITE, READ, atomics, with and without loss.
mod common;
use common::*;
use pmrxe_transport::{QpState, SendOp, SendWqe, WcOpcode, WcStatus};

#[test]
fn rc_send_write_read_atomics() {
    let mut sim = pair();
    let a = reg(&sim, A, 64 * 1024, ALL);
    let b = reg(&sim, B, 64 * 1024, ALL);
    let data = pattern(5000, 3);
    a.write(0, &data);
    post_recv(&mut sim, B, QB, recv(900, &b, 40000, 8000));
    post(&mut sim, A, QA, send(1, &a, 0, 3000));
    post(&mut sim, A, QA, write(2, &a, 0, 5000, b.addr + 8192, b.rkey()));
    b.write(20000, &pattern(4000, 9));
    post(&mut sim, A, QA, read(3, &a, 30000, 4000, b.addr + 20000, b.rkey()));
    b.write(60000, &7u64.to_le_bytes());
    post(&mut sim, A, QA, SendWqe::new(4, SendOp::FetchAdd { add: 5 }).sge(a.sge(50000, 8)).remote(b.addr + 60000, b.rkey()).flags(sig()));
    post(&mut sim, A, QA, SendWqe::new(5, SendOp::CmpSwap { compare: 12, swap: 99 }).sge(a.sge(50008, 8)).remote(b.addr + 60000, b.rkey()).flags(sig()));
    drive(&mut sim);
    let c = send_cqes(&mut sim, A, QA);
    assert_eq!(ids(&c), vec![1, 2, 3, 4, 5]);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    assert_eq!(c[2].opcode, WcOpcode::RdmaRead);
    let r = recv_cqes(&mut sim, B, QB);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].byte_len, 3000);
    assert_eq!(b.read(40000, 3000), data[..3000]);
    assert_eq!(b.read(8192, 5000), data);
    assert_eq!(a.read(30000, 4000), pattern(4000, 9));
    assert_eq!(a.u64_at(50000), 7);
    assert_eq!(a.u64_at(50008), 12);
    assert_eq!(b.u64_at(60000), 99);
    assert_eq!(sim.nodes[A].qp(QA).state(), QpState::Rts);
}

#[test]
fn rc_survives_loss_reorder_duplication() {
    for seed in 0..6 {
        let mut sim = pair_with(&Default::default(), seed);
        sim.impair = pmrxe_transport::sim::Impairments { drop: 0.05, duplicate: 0.03, reorder: 0.05, reorder_ns: 5000, corrupt: 0.01 };
        let a = reg(&sim, A, 256 * 1024, ALL);
        let b = reg(&sim, B, 256 * 1024, ALL);
        let data = pattern(100_000, seed as u8);
        a.write(0, &data);
        b.write(128 * 1024, &pattern(60_000, 77));
        for i in 0..10u64 {
            post_recv(&mut sim, B, QB, recv(100 + i, &b, 200_000 + i * 2000, 2000));
        }
        post(&mut sim, A, QA, write(1, &a, 0, 100_000, b.addr, b.rkey()));
        post(&mut sim, A, QA, read(2, &a, 128 * 1024, 60_000, b.addr + 128 * 1024, b.rkey()));
        for i in 0..10u64 {
            post(&mut sim, A, QA, send(10 + i, &a, i * 100, 1500));
        }
        drive(&mut sim);
        let c = send_cqes(&mut sim, A, QA);
        assert_eq!(c.len(), 12, "seed {seed}: {c:?}");
        assert!(c.iter().all(|c| c.status == WcStatus::Success), "seed {seed}: {c:?}");
        assert_eq!(b.read(0, 100_000), data, "seed {seed}");
        assert_eq!(a.read(128 * 1024, 60_000), pattern(60_000, 77), "seed {seed}");
        let r = recv_cqes(&mut sim, B, QB);
        assert_eq!(r.len(), 10);
        for (i, rc) in r.iter().enumerate() {
            assert_eq!(rc.wr_id, 100 + i as u64);
            assert_eq!(b.read(200_000 + i * 2000, 1500), data[i * 100..i * 100 + 1500]);
        }
    }
}
