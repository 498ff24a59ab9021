//! Where the transmit path puts a packet in its buffer: the payload of a bare-BTH packet (the
//! MIDDLE and LAST packets of a long message) starts on a cache line, so the fused copy+CRC
//! kernel stores whole lines (`PacketBuf::open_aligned`). Checked on the frames an lcore
//! actually sends for a 64 KiB RDMA WRITE, which must then complete with its bytes placed.
mod common;

use common::{lock, poll_completion, post_write_64k, rig};
use pmrxe_transport::sim::{bring_up, PairParams};
use pmrxe_transport::{Instant, PathMtu};
use pmrxe_wire::{parse_frame, Opcode};

#[test]
fn write_middle_and_last_payloads_start_on_a_cache_line_and_the_write_completes() {
    let common::Pair { mut lc, h, mem, ips, to_dev1, .. } = common::lcore_pair(common::jumbo_buf);
    let p = PairParams { mtu: PathMtu::Mtu4096, access: 0x7, ..PairParams::default() };
    let mut r = rig(&mut lc, &h, &mem, ips, &p, bring_up, None);
    post_write_64k(&mut r, 5, 0, 0);
    let mut now = 1_000u64;
    lc.poll_once(Instant(now));

    // The pass put the message's 16 packets on device 0's wire (device 1 receives them on the
    // next pass): FIRST (BTH + RETH), 14 MIDDLE, LAST.
    let (mut aligned, mut others) = (0, Vec::new());
    for b in lock(&to_dev1).iter() {
        let f = parse_frame(pmrxe_port::PacketBuf::data(b)).expect("a valid RoCE frame");
        let op = f.headers.bth.opcode;
        assert_eq!(f.payload.len(), 4096, "{op:?} carries a full path MTU");
        if op == Opcode::RC_RDMA_WRITE_MIDDLE || op == Opcode::RC_RDMA_WRITE_LAST {
            assert_eq!(f.payload.as_ptr() as usize % 64, 0, "{op:?} payload at {:p}: not on a cache line", f.payload.as_ptr());
            aligned += 1;
        } else {
            others.push(op);
        }
    }
    assert_eq!((aligned, others), (15, vec![Opcode::RC_RDMA_WRITE_FIRST]), "the 64 KiB WRITE's packets, sent in one pass");

    // Delivered, acknowledged, completed; the bytes landed.
    let c = poll_completion(&mut lc, &h, &mut r.cq_rings[0].1, &mut now);
    assert_eq!((c.wr_id, c.status), (5, 0));
    let mut b = vec![0u8; 65536];
    r.dst.read(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0xab), "all 64 KiB placed");
}
