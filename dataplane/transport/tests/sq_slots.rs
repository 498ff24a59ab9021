//! The SQ keeps each WQE's gather list, inline bytes and UD destination in side arrays at
//! slot `index % max_send_wr` (issue 15: compact SQ entries, no whole-WQE copies). These
//! tests wrap the slots many times, with inline and gathered WQEs interleaved and packets
//! lost so that retransmissions read the side arrays again after later WQEs were posted.
mod common;
use common::*;
use pmrxe_transport::sim::{gid_of, Fault, PairParams, Sim};
use pmrxe_transport::{AddressVector, QpCaps, QpType, SendOp, SendWqe, UdDest, WcStatus};

#[test]
fn rc_slots_wrap_with_inline_and_gathered_writes_under_loss() {
    let caps = QpCaps { max_send_wr: 3, max_recv_wr: 4, max_send_sge: 2, max_recv_sge: 1, max_inline_data: 64 };
    let p = PairParams { caps, ..Default::default() };
    let mut sim = pair_with(&p, 11);
    // Every fifth request packet is lost once: go-back-N re-reads the side arrays.
    let mut n = 0u32;
    sim.add_filter(move |i| {
        if i.from == A && i.is_request() {
            n += 1;
            return n.is_multiple_of(5).then_some(Fault::Drop);
        }
        None
    });
    let a = reg(&sim, A, 1 << 16, ALL);
    let b = reg(&sim, B, 1 << 16, ALL);
    let mut expect = vec![0u8; 1 << 16];
    for round in 0..12u64 {
        for k in 0..3u64 {
            let id = round * 3 + k;
            let dst = id * 1200;
            let w = match k {
                // Inline: the bytes are taken at post; the source is overwritten right after.
                0 => {
                    let d = pattern(60, id as u8);
                    expect[dst as usize..dst as usize + 60].copy_from_slice(&d);
                    SendWqe::new(id, SendOp::Write).flags(sig()).inline_data(&d).remote(b.addr + dst, b.rkey())
                }
                // Two gather entries, multi-packet (MTU 1024).
                _ => {
                    let (x, y) = (pattern(700, id as u8 ^ 0x55), pattern(400, id as u8 ^ 0xAA));
                    let src = 0x8000 + k * 0x1000;
                    a.write(src as usize, &x);
                    a.write(src as usize + 2048, &y);
                    expect[dst as usize..dst as usize + 700].copy_from_slice(&x);
                    expect[dst as usize + 700..dst as usize + 1100].copy_from_slice(&y);
                    SendWqe::new(id, SendOp::Write)
                        .sge(a.sge(src, 700))
                        .sge(a.sge(src + 2048, 400))
                        .remote(b.addr + dst, b.rkey())
                        .flags(sig())
                }
            };
            post(&mut sim, A, QA, w);
        }
        drive(&mut sim);
        let c = send_cqes(&mut sim, A, QA);
        assert_eq!(statuses(&c), vec![WcStatus::Success; 3], "round {round}");
        assert_eq!(ids(&c), (round * 3..round * 3 + 3).collect::<Vec<_>>());
    }
    let got = b.read(0, 36 * 1200);
    let bad = (0..36).find(|&m| got[m * 1200..m * 1200 + 1100] != expect[m * 1200..m * 1200 + 1100]);
    assert_eq!(bad, None, "first message whose bytes differ");
    assert!(sim.nodes[A].qp(QA).stats().retries > 0, "losses forced go-back-N");
}

#[test]
fn ud_destinations_follow_their_slot() {
    let caps = QpCaps { max_send_wr: 2, max_recv_wr: 64, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 32 };
    let p = PairParams { qp_type: QpType::Ud, caps, ..Default::default() };
    let mut sim = Sim::new(3, 1);
    const QC: u32 = 0x33;
    sim.connect(A, QA, B, QB, &p);
    sim.connect(A, QA + 1, 2, QC, &p);
    let b = reg(&sim, B, 1 << 14, ALL);
    let c = reg(&sim, 2, 1 << 14, ALL);
    for i in 0..16u64 {
        post_recv(&mut sim, B, QB, recv(i, &b, i * 256, 256));
        post_recv(&mut sim, 2, QC, recv(i, &c, i * 256, 256));
    }
    let to = |node: usize, qpn: u32, sim: &Sim| UdDest {
        av: AddressVector { dgid: gid_of(sim.nodes[node].ip), hop_limit: 64, port: 1, ..Default::default() },
        remote_qpn: qpn,
        remote_qkey: 0x1111_1111,
    };
    let (db, dc) = (to(B, QB, &sim), to(2, QC, &sim));
    // Alternate destinations through a 2-deep SQ, 16 times: each datagram goes where its own
    // WQE said, with its own inline bytes.
    for i in 0..16u64 {
        let d = if i % 2 == 0 { db } else { dc };
        post(&mut sim, A, QA, SendWqe::new(i, SendOp::Send).flags(sig()).inline_data(&[i as u8 + 1; 20]).ud(d));
        if i % 2 == 1 {
            drive(&mut sim);
        }
    }
    drive(&mut sim);
    assert_eq!(statuses(&send_cqes(&mut sim, A, QA)), vec![WcStatus::Success; 16]);
    let (rb, rc) = (recv_cqes(&mut sim, B, QB), recv_cqes(&mut sim, 2, QC));
    assert_eq!((rb.len(), rc.len()), (8, 8));
    for (k, cqe) in rb.iter().enumerate() {
        assert_eq!(b.read(k * 256 + 40, 20), vec![(2 * k + 1) as u8; 20], "B's datagram {k} ({cqe:?})");
    }
    for k in 0..8 {
        assert_eq!(c.read(k * 256 + 40, 20), vec![(2 * k + 2) as u8; 20], "C's datagram {k}");
    }
}
