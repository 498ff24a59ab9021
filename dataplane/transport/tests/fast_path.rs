//! The fast paths of header prediction against the general paths: the responder's for WRITE
//! MIDDLE packets (`Qp::handle_packet`) and the requester's for the MIDDLE packets it sends
//! (`Qp::poll_transmit`). The same seeded traffic — RC and UC WRITEs of one to ninety-six
//! packets, WRITE with immediate and SEND between them, over a link that drops, duplicates,
//! reorders and corrupts, with the target MR deregistered in the middle of the stream on some
//! seeds and a source MR in the middle of a WRITE on others — runs once with the fast paths and
//! once without. Everything observable must be the same: every completion (id, status, opcode,
//! length, immediate), every QP's counters (but the fast paths' own), QP states, the bytes in
//! memory, and the simulated clock at the end. Both fast paths must also have taken packets.
//! A crafted MIDDLE that would run past its message's length (a non-conforming sender) is
//! refused alike.
mod common;
use common::*;
use pmrxe_transport::sim::{Impairments, PairParams, Sim};
use pmrxe_transport::{AttrMask, CqSide, PathMtu, QpState, QpType, RecvWqe, RxPacket, SendOp, SendWqe, WcStatus};
use pmrxe_transport::sim::Fault;
use pmrxe_wire::{build_frame_vec, parse_frame_deferred, BthRepr, L3Info, MacAddr, Opcode, Psn, Qpn, TransportHeaders};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const AREA: usize = 64 * 1024;
const RECV_SLOT: usize = 4096;
/// (requester QPN on A, responder QPN on B, transport)
const PAIRS: [(u32, u32, QpType); 2] = [(0x100, 0x200, QpType::Rc), (0x101, 0x201, QpType::Uc)];

/// What a run leaves behind, in a comparable form.
#[derive(Debug, PartialEq)]
struct Outcome {
    cqes: Vec<String>,
    stats: Vec<String>,
    states: Vec<String>,
    memory: Vec<Vec<u8>>,
    end: u64,
}

struct Run {
    outcome: Outcome,
    /// WRITE MIDDLE packets the responders took by the fast path.
    fast: u64,
    /// MIDDLE packets the requesters built by theirs.
    tx_fast: u64,
    /// The target MR was deregistered while messages were in flight.
    deregistered: bool,
    /// A source MR was deregistered in the middle of a WRITE, which then failed.
    src_failed: bool,
}

fn run(seed: u64, fast: bool) -> Run {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut sim = Sim::new(2, seed);
    sim.record = false;
    sim.impair = Impairments {
        drop: 0.01 * (seed % 4) as f64,
        duplicate: 0.02,
        reorder: 0.05,
        reorder_ns: 4000,
        corrupt: 0.01,
    };
    let mut bufs = vec![];
    for (i, &(qa, qb, t)) in PAIRS.iter().enumerate() {
        // Odd seeds: MTU 256, so long WRITEs have more than MAX_PKT_PER_ACK (64) packets and
        // some of their MIDDLE packets ask for an ACK.
        let mtu = if seed % 2 == 1 { PathMtu::Mtu256 } else { PathMtu::Mtu1024 };
        let p = PairParams { qp_type: t, mtu, timeout: 8, retry_cnt: 7, rnr_retry: 7, ..Default::default() };
        sim.connect(A, qa, B, qb, &p);
        for (node, q) in [(A, qa), (B, qb)] {
            sim.nodes[node].qp_mut(q).set_fast_paths(fast);
        }
        let src = reg(&sim, A, AREA, ALL);
        src.write(0, &pattern(AREA, seed as u8 ^ i as u8));
        bufs.push((src, reg(&sim, B, AREA, ALL), reg(&sim, B, RECV_SLOT * 64, ALL)));
    }
    let deregister_at = (seed % 3 == 2).then(|| rng.gen_range(20..120));
    let mut deregistered = false;
    // On other seeds a source MR goes away in the middle of a WRITE (the requester's carried
    // gather ends), late in the run: the pair's remaining WQEs fail or flush.
    let deregister_src_at = (seed % 3 == 1).then(|| rng.gen_range(130..150));
    let mut src_deregistered: Option<u64> = None;
    let mut recv_n = 0u64;
    for wr in 0..160u64 {
        if deregister_at == Some(wr) {
            // The RC pair's target goes away in the middle of a WRITE: once two of its packets
            // are placed, the rest meet a carried translation that has ended.
            let (src, dst, _) = &bufs[0];
            drive(&mut sim);
            let before = sim.nodes[B].qp(PAIRS[0].1).stats().resp_bytes_written;
            let now = sim.now;
            let w = SendWqe::new(1000 + wr, SendOp::Write).sge(src.sge(0, 16 * 1024)).remote(dst.addr, dst.rkey());
            if sim.nodes[A].post_send(PAIRS[0].0, now, w.flags(sig())).is_ok() {
                // Its packets after the first MIDDLE arrive 1 ms late: the deregistration
                // lands between.
                let mut n = 0;
                sim.add_filter(move |p| {
                    let middle = p.from == A && p.dst_qpn == PAIRS[0].1 && matches!(p.opcode, Opcode::RC_RDMA_WRITE_MIDDLE | Opcode::RC_RDMA_WRITE_LAST);
                    n += usize::from(middle);
                    (middle && n > 1).then_some(Fault::Delay(MS))
                });
                let mtu = sim.nodes[B].qp(PAIRS[0].1).query().path_mtu.bytes();
                sim.drive_until(STEPS, |s| s.nodes[B].qp(PAIRS[0].1).stats().resp_bytes_written >= before + 2 * u64::from(mtu));
            }
            sim.nodes[B].mem.table().dereg_mr(dst.key).expect("dereg_mr");
            sim.clear_filters();
            deregistered = true;
        }
        if deregister_src_at == Some(wr) {
            // A 16 KiB WRITE leaves one packet per step; once two of its MIDDLE packets are
            // out, its source MR is deregistered. The pair's next packet meets it.
            let pi = (seed as usize / 3) % PAIRS.len();
            let (qa, _, _) = PAIRS[pi];
            let (src, dst, _) = &bufs[pi];
            drive(&mut sim);
            let now = sim.now;
            let w = SendWqe::new(2000 + wr, SendOp::Write).sge(src.sge(0, 16 * 1024)).remote(dst.addr, dst.rkey());
            if sim.nodes[A].post_send(qa, now, w.flags(sig())).is_ok() {
                let burst = core::mem::replace(&mut sim.max_burst, 1);
                // (Counted alike with and without the fast path: the FIRST and two MIDDLEs.)
                let start = sim.nodes[A].qp(qa).stats().tx_packets;
                sim.drive_until(STEPS, |s| s.nodes[A].qp(qa).stats().tx_packets >= start + 3);
                sim.max_burst = burst;
            }
            sim.nodes[A].mem.table().dereg_mr(src.key).expect("dereg_mr");
            src_deregistered = Some(2000 + wr);
        }
        let pi = rng.gen_range(0..PAIRS.len());
        let (qa, qb, _) = PAIRS[pi];
        let (src, dst, rbuf) = &bufs[pi];
        let kind = rng.gen_range(0..10);
        let len = rng.gen_range(1..=24 * 1024usize);
        let so = rng.gen_range(0..AREA - len);
        let d = rng.gen_range(0..AREA - len);
        let post_recv = |sim: &mut Sim, n: &mut u64, cap: u32| {
            let slot = (*n % 64) * RECV_SLOT as u64;
            sim.nodes[B].post_recv(qb, &RecvWqe::new(*n).sge(rbuf.sge(slot, cap))).unwrap();
            *n += 1;
        };
        let w = match kind {
            0..=6 => SendWqe::new(wr, SendOp::Write).sge(src.sge(so as u64, len as u32)).remote(dst.addr + d as u64, dst.rkey()),
            7 | 8 => {
                post_recv(&mut sim, &mut recv_n, 0);
                SendWqe::new(wr, SendOp::WriteImm(wr as u32)).sge(src.sge(so as u64, len as u32)).remote(dst.addr + d as u64, dst.rkey())
            }
            _ => {
                let n = len.min(RECV_SLOT);
                post_recv(&mut sim, &mut recv_n, RECV_SLOT as u32);
                SendWqe::new(wr, SendOp::Send).sge(src.sge(so as u64, n as u32))
            }
        };
        let now = sim.now;
        // A QP in error refuses nothing here: its WQEs complete flushed.
        let _ = sim.nodes[A].post_send(qa, now, w.flags(sig()));
        for _ in 0..rng.gen_range(0..40) {
            sim.step();
        }
    }
    drive(&mut sim);
    let mut cqes = vec![];
    let mut stats = vec![];
    let mut states = vec![];
    let mut fast_packets = 0;
    let mut tx_fast = 0;
    for &(qa, qb, _) in &PAIRS {
        for (node, q) in [(A, qa), (B, qb)] {
            for side in [CqSide::Send, CqSide::Recv] {
                for c in sim.nodes[node].take_cqes(q, side) {
                    cqes.push(format!("{node}/{q:#x}/{side:?}: {} {:?} {:?} {} {:?}", c.wr_id, c.status, c.opcode, c.byte_len, c.imm_data));
                }
            }
            let qp = sim.nodes[node].qp(q);
            let mut s = qp.stats().clone();
            fast_packets += s.rx_fast_path;
            tx_fast += s.tx_fast_path;
            s.rx_fast_path = 0;
            s.tx_fast_path = 0;
            stats.push(format!("{node}/{q:#x}: {s:?}"));
            states.push(format!("{node}/{q:#x}: {:?}", qp.state()));
        }
    }
    let memory = bufs.iter().flat_map(|(_, d, r)| [d.read(0, AREA), r.read(0, r.len)]).collect();
    let src_failed = src_deregistered.is_some_and(|id| cqes.iter().any(|c| c.contains(&format!(": {id} LocProtErr"))));
    Run { outcome: Outcome { cqes, stats, states, memory, end: sim.now.0 }, fast: fast_packets, tx_fast, deregistered, src_failed }
}

#[test]
fn write_middle_fast_path_changes_nothing_observable() {
    let mut fast_total = 0;
    let mut deregistered = 0;
    let mut src_failed = 0;
    let mut tx_fast_total = 0;
    for seed in 0..12 {
        let with = run(seed, true);
        let without = run(seed, false);
        assert_eq!(without.fast + without.tx_fast, 0, "seed {seed}: the general-path run took a fast path");
        assert!(with.fast > 0, "seed {seed}: no packet took the receive fast path");
        assert!(with.tx_fast > 0, "seed {seed}: no packet took the transmit fast path");
        assert!(with.outcome.cqes.len() >= 160, "seed {seed}: completions missing");
        assert_eq!(with.outcome, without.outcome, "seed {seed}: the fast path changed what happens");
        fast_total += with.fast;
        deregistered += u64::from(with.deregistered);
        src_failed += u64::from(with.src_failed);
        tx_fast_total += with.tx_fast;
    }
    assert!(deregistered >= 3);
    assert!(src_failed >= 3, "only {src_failed} WRITEs met their source's deregistration");
    assert!(tx_fast_total > 1000, "only {tx_fast_total} packets took the transmit fast path");
    assert!(fast_total > 1000, "only {fast_total} packets took the fast path");
}

/// What a crafted delivery leaves behind.
#[derive(Debug, PartialEq)]
struct Crafted {
    /// A's completion statuses.
    status: Vec<WcStatus>,
    /// B's QP: bytes written, NAKs for errors sent, packets dropped, CE marks seen, state.
    written: u64,
    naks: u64,
    dropped: u64,
    ce: u64,
    state: QpState,
    /// B's target buffer.
    mem: Vec<u8>,
}

/// How the crafted packets differ from the sender's own.
#[derive(Clone, Copy, Default)]
struct Craft {
    /// Another source address.
    src: Option<std::net::Ipv4Addr>,
    /// B's QP loses REMOTE_WRITE access (modify QP in RTS) before they arrive.
    revoke_write: bool,
}

/// Crafted WRITE MIDDLE packets (a non-conforming sender) into a message in progress at B
/// (3 KiB, its first two packets placed, its LAST dropped): each (PSN, payload bytes, fill)
/// arrives CE-marked, after `how` took effect. Returns the outcome and how many packets the
/// fast path took.
fn crafted(fast: bool, how: Craft, packets: &[(u32, usize, u8)]) -> (Crafted, u64) {
    let mut sim = pair();
    sim.nodes[B].qp_mut(QB).set_fast_paths(fast);
    let a = reg(&sim, A, 4096, ALL);
    a.write(0, &pattern(4096, 3));
    let b = reg(&sim, B, 8192, ALL);
    sim.add_filter(|p| (p.from == A && p.opcode == Opcode::RC_RDMA_WRITE_LAST).then_some(Fault::Drop));
    post(&mut sim, A, QA, write(1, &a, 0, 3072, b.addr, b.rkey()));
    assert!(sim.drive_until(STEPS, |s| s.nodes[B].qp(QB).stats().resp_bytes_written >= 2048));
    if how.revoke_write {
        let qp = sim.nodes[B].qp_mut(QB);
        let mut attr = qp.query();
        attr.qp_access_flags = 0;
        qp.modify(&attr, AttrMask::ACCESS_FLAGS, &mut pmrxe_transport::Deferred).expect("modify access flags in RTS");
    }
    let l3 = L3Info {
        src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        src_ip: how.src.unwrap_or(sim.nodes[A].ip).into(),
        dst_ip: sim.nodes[B].ip.into(),
        tclass: 0x03, // ECN CE
        ttl: 64,
        flow_label: 0,
        udp_sport: 0xC000,
        ip_id: 0,
    };
    for &(psn, len, fill) in packets {
        let h = TransportHeaders::new(BthRepr::new(Opcode::RC_RDMA_WRITE_MIDDLE, Qpn::new(QB), Psn::new(psn)));
        let frame = build_frame_vec(&l3, &h, &vec![fill; len]).unwrap();
        let (f, check) = parse_frame_deferred(&frame).unwrap();
        let now = sim.now;
        let node = &mut sim.nodes[B];
        node.handle_packet(now, &RxPacket::of_frame(&f, Some(check)));
    }
    sim.clear_filters();
    drive(&mut sim);
    let s = sim.nodes[B].qp(QB).stats().clone();
    let status = statuses(&send_cqes(&mut sim, A, QA));
    let state = sim.nodes[B].qp(QB).state();
    let c = Crafted { status, written: s.resp_bytes_written, naks: s.err_naks_sent, dropped: s.dropped, ce: s.ecn_ce_received, state, mem: b.read(0, 8192) };
    (c, s.rx_fast_path)
}

/// The same outcome with and without the fast path; that outcome and the fast path's count.
fn crafted_alike(how: Craft, packets: &[(u32, usize, u8)]) -> (Crafted, u64) {
    let ((with, fast), (without, none)) = (crafted(true, how, packets), crafted(false, how, packets));
    assert_eq!(none, 0);
    assert_eq!(with, without, "{packets:?}");
    (with, fast)
}

/// A MIDDLE that ends exactly at the message's end is placed (by the fast path); the next one,
/// past the end its FIRST announced, is refused by the general path: Invalid Request NAK, QP
/// in error, nothing placed past the message. Both CE marks are seen.
#[test]
fn write_middle_past_the_message_end_is_refused_alike() {
    let (c, fast) = crafted_alike(Craft::default(), &[(102, 1024, 0xAA), (103, 1024, 0xBB)]);
    // (A never sent PSN 103, so it ignores the NAK; its retried LAST meets a QP in error.)
    assert_eq!(c.status, vec![WcStatus::RetryExcErr]);
    assert_eq!((c.written, c.naks, c.ce, c.state), (3072, 1, 2, QpState::Err), "the third packet placed, the fourth refused");
    assert_eq!(fast, 2, "the fast path takes the message's second packet and the crafted third");
    assert_eq!(&c.mem[..2048], &pattern(4096, 3)[..2048]);
    assert!(c.mem[2048..3072].iter().all(|&x| x == 0xAA));
    assert!(c.mem[3072..].iter().all(|&x| x == 0), "bytes landed past the message");
}

/// A MIDDLE shorter than the PMTU (C9-92) is refused, not placed, fast path or not.
#[test]
fn short_write_middle_is_refused_alike() {
    let (c, fast) = crafted_alike(Craft::default(), &[(102, 512, 0xAA)]);
    assert_eq!(c.status, vec![WcStatus::RemInvReqErr]);
    assert_eq!((c.written, c.naks, c.state), (2048, 1, QpState::Err));
    assert_eq!(fast, 1, "only the message's own second packet takes the fast path");
    assert!(c.mem[2048..].iter().all(|&x| x == 0));
}

/// A MIDDLE from an address that is not the QP's peer is dropped before anything (its CE mark
/// too), fast path or not; the real LAST then completes the message.
#[test]
fn write_middle_from_another_source_is_dropped_alike() {
    let (c, fast) = crafted_alike(Craft { src: Some([10, 9, 9, 9].into()), ..Craft::default() }, &[(102, 1024, 0xAA)]);
    assert_eq!(c.status, vec![WcStatus::Success]);
    assert_eq!((c.written, c.naks, c.dropped, c.ce, c.state), (3072, 0, 1, 0, QpState::Rts));
    assert_eq!(fast, 1, "only the message's own second packet takes the fast path");
    assert_eq!(&c.mem[..3072], &pattern(4096, 3)[..3072]);
}

/// The QP lost REMOTE_WRITE in the middle of the message: its next MIDDLE is refused.
#[test]
fn write_middle_after_write_access_is_revoked_is_refused_alike() {
    let (c, fast) = crafted_alike(Craft { revoke_write: true, ..Craft::default() }, &[(102, 1024, 0xAA)]);
    assert_eq!(c.status, vec![WcStatus::RemInvReqErr]);
    assert_eq!((c.written, c.naks, c.state), (2048, 1, QpState::Err));
    assert_eq!(fast, 1);
    assert!(c.mem[2048..].iter().all(|&x| x == 0));
}
