//! Fuzz the transport engine with arbitrary packets against an RC QP in RTS (responder and
//! completer paths): no panic, no out-of-bounds access (ASan), and memory of another PD is
//! never written.
//!
//! Input: records `[flags u8][len u16 LE][len bytes: BTH + extension headers + payload]`.
//! flags bit 0: aim at the QP (dest QPN); bit 1: use the expected PSN; bit 2: aim RETH/AtomicETH
//! into the MR (va = MR base + va % 8192, rkey = MR key); bit 3: let 50 ms pass (timers).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmrxe_mem::{Access, MemLimits, MemTable, Region, Sge};
use pmrxe_transport::sim::{bring_up, gid_of, Collect, PairParams};
use pmrxe_transport::{CqSide, Cqe, Engine, Instant, Qp, QpType, RecvWqe, RxPacket};
use std::collections::VecDeque;
use pmrxe_wire::{Psn, Qpn, TransportHeaders};

const QPN: u32 = 0x11;
const PEER: u32 = 0x22;

fuzz_target!(|data: &[u8]| {
    let mem = MemTable::new(MemLimits { max_mr: 8, max_mw: 8, max_fast_reg_pages: 8, page_slots: 64, ..MemLimits::default() });
    let mr = Region::zeroed(8192);
    let key = mem.reg_mr(1, mr.clone(), mr.addr(), Access(1 | 2 | 4 | 8)).expect("reg_mr");
    let other = Region::zeroed(4096);
    let other_key = mem.reg_mr(2, other.clone(), other.addr(), Access(1 | 2 | 4 | 8)).expect("reg_mr 2");
    let p = PairParams { sq_psn: 0, ..PairParams::default() };
    let mut qp = Qp::new(QPN, QpType::Rc, 1, p.caps, None).expect("qp");
    bring_up(&mut qp, PEER, gid_of([10, 0, 0, 2].into()), &p);
    let mut eng = Engine::new();
    eng.add_qp(qp);
    // The QP's CQ (the simulator's: every completion is kept, in order).
    let mut cq: VecDeque<(u32, CqSide, Cqe)> = VecDeque::new();
    for i in 0..4u64 {
        let s = Sge { addr: mr.addr() + i * 2048, len: 2048, lkey: key };
        let _ = eng.post_recv(QPN, &RecvWqe::new(i).sge(s), &mut cq);
    }
    let mut now = Instant(1_000_000);
    let mut out = Collect::default();
    let mut psn = 0u32;
    let mut rest = data;
    while rest.len() >= 3 {
        let flags = rest[0];
        let len = (u16::from_le_bytes([rest[1], rest[2]]) as usize).min(rest.len() - 3);
        let rec = &rest[3..3 + len];
        rest = &rest[3 + len..];
        let Ok((mut hdr, hlen)) = TransportHeaders::parse(rec) else { continue };
        let payload = &rec[hlen..];
        if flags & 1 != 0 {
            hdr.bth.dest_qp = Qpn::new(QPN);
        }
        if flags & 2 != 0 {
            hdr.bth.psn = Psn::new(psn);
            psn = psn.wrapping_add(1);
        }
        if flags & 4 != 0 {
            let k = if flags & 0x10 != 0 { other_key.0 } else { key.0 };
            if let Some(r) = hdr.reth.as_mut() {
                r.va = mr.addr().wrapping_add(r.va % 8192);
                r.rkey = k;
            }
            if let Some(a) = hdr.atomic_eth.as_mut() {
                a.va = mr.addr().wrapping_add(a.va % 8192);
                a.rkey = k;
            }
        }
        if flags & 8 != 0 {
            now = Instant(now.0 + 50_000_000);
        }
        let mut pkt = RxPacket::new(hdr, payload);
        pkt.frame.src_gid = gid_of([10, 0, 0, 2].into());
        pkt.frame.dst_gid = gid_of([10, 0, 0, 1].into());
        eng.handle_packet(now, &pkt, &mem, &mut cq);
        eng.transmit(now, &mem, &mut out, &mut cq, 64);
        out.out.clear();
    }
    let mut b = vec![0u8; 4096];
    other.read(0, &mut b).expect("read");
    assert!(b.iter().all(|&x| x == 0), "memory of another PD was written");
    // Each of the four receive WQEs completes at most once, in posting order; nothing else
    // completes (the QP posted no send WQE).
    let ids: Vec<u64> = cq.iter().map(|(q, side, c)| {
        assert_eq!((*q, *side), (QPN, CqSide::Recv), "a completion of another QP or side");
        c.wr_id
    }).collect();
    assert!(ids.len() <= 4 && ids.iter().enumerate().all(|(i, &w)| w == i as u64), "receive completions {ids:?}");
});
