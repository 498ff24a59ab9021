//! The clients' work requests as they lie in their shared rings — `ShmSendWqe`/`ShmRecvWqe`
//! entries in `pmrxe_abi` SPSC rings, what the shim writes — offered to the engine through the
//! production conversion (`convert::offer_send`/`offer_recv`, the code the lcore's
//! `RingSource` runs) and pulled by `Engine::pull` on the seeded simulated wire, under loss,
//! duplication and reordering. Every completion is converted back with `convert::cqe` and
//! checked as a client reads it (ibverbs opcode and status values). A client's malformed entry
//! or corrupt ring fails its own QP, and only that one.
use std::collections::{BTreeMap, HashMap};

use pmrxe_abi::ring::{init_ring, ring_bytes, Consumer, Producer, PRODUCER_INDEX_OFFSET};
use pmrxe_abi::{send_flags, wr_opcode, ShmCqe, ShmRecvWqe, ShmSendWqe, ShmSge};
use pmrxe_mem::{Access, Key, Region};
use pmrxe_runtime::convert::{self, ShmRecvWr, ShmSendWr};
use pmrxe_runtime::shm::Segment;
use pmrxe_transport::sim::{gid_of, ClientRings, Fault, Impairments, PairParams, Sim};
use pmrxe_transport::{AddressVector, CqSide, Offer, QpCaps, QpState, QpType, Queue, WorkSource};

const A: usize = 0;
const B: usize = 1;
const QA: u32 = 0x11;
const QB: u32 = 0x22;
const QA2: u32 = 0x13;
const QB2: u32 = 0x24;
const PD: u32 = 1;
const STEPS: usize = 200_000;
/// Entries per ring: fewer than a test rings in all, so the rings wrap.
const RING: u32 = 16;
const ALL: Access = Access(1 | 2 | 4 | 8 | 16);

// ibverbs values a client reads (enum ibv_wc_status, ibv_wc_opcode, ibv_wc_flags).
const WC_SUCCESS: u32 = 0;
const WC_WR_FLUSH_ERR: u32 = 5;
const WC_SEND: u32 = 0;
const WC_RDMA_WRITE: u32 = 1;
const WC_RDMA_READ: u32 = 2;
const WC_COMP_SWAP: u32 = 3;
const WC_FETCH_ADD: u32 = 4;
const WC_RECV: u32 = 128;
const WC_RECV_RDMA_WITH_IMM: u32 = 129;
const WC_GRH: u32 = 1;
const WC_WITH_IMM: u32 = 2;

/// One QP's send and receive rings in a shared-memory segment: the client's producers and the
/// service's consumers.
struct QpRings {
    sq_client: Producer<ShmSendWqe>,
    sq: Consumer<ShmSendWqe>,
    rq_client: Producer<ShmRecvWqe>,
    rq: Consumer<ShmRecvWqe>,
    is_ud: bool,
    /// Declared last: dropped after the ring handles that point into it.
    seg: Segment,
}

/// A node's clients' rings as the engine's work source: `next_send`/`next_recv` are the
/// lcore's (`convert::offer_send`/`offer_recv` over a scratch copy), `consume` advances,
/// `finish` publishes the consumer index, `reset` discards what the rings hold.
#[derive(Default)]
struct ShmRings {
    qps: BTreeMap<u32, QpRings>,
    /// Address handles by client handle (UD).
    ahs: HashMap<u32, AddressVector>,
    send: ShmSendWqe,
    recv: ShmRecvWqe,
}

impl ShmRings {
    fn open(&mut self, qpn: u32, is_ud: bool) {
        let (sq_len, rq_len) = (ring_bytes::<ShmSendWqe>(RING), ring_bytes::<ShmRecvWqe>(RING));
        let seg = Segment::create("client-wqes", sq_len + rq_len).expect("segment");
        // SAFETY: a fresh segment, 64-byte aligned (page-aligned mapping), long enough for
        // both rings (`sq_len` is a multiple of 64); nothing else uses it yet.
        let rings = unsafe {
            let (sq, rq) = (seg.as_ptr(), seg.as_ptr().add(sq_len));
            init_ring::<ShmSendWqe>(sq, RING).unwrap();
            init_ring::<ShmRecvWqe>(rq, RING).unwrap();
            (
                Producer::attach(sq, sq_len, RING).unwrap(),
                Consumer::attach(sq, sq_len, RING).unwrap(),
                Producer::attach(rq, rq_len, RING).unwrap(),
                Consumer::attach(rq, rq_len, RING).unwrap(),
            )
        };
        let (sq_client, sq, rq_client, rq) = rings;
        self.qps.insert(qpn, QpRings { sq_client, sq, rq_client, rq, is_ud, seg });
    }
    fn send(&mut self, qpn: u32, w: ShmSendWqe) {
        self.qps.get_mut(&qpn).expect("rings").sq_client.push(w).expect("send ring full");
    }
    fn recv(&mut self, qpn: u32, w: ShmRecvWqe) {
        self.qps.get_mut(&qpn).expect("rings").rq_client.push(w).expect("receive ring full");
    }
    /// What a hostile client does to its own send ring: a producer index past the capacity.
    fn corrupt_send_ring(&mut self, qpn: u32) {
        let q = self.qps.get_mut(&qpn).expect("rings");
        let bogus = q.sq_client.head().wrapping_add(RING * 3);
        // SAFETY: the producer index is a u32 at PRODUCER_INDEX_OFFSET of the ring header at
        // the segment's start; the segment is mapped; the rings use atomic/volatile accesses,
        // and this test's thread is the only one touching it.
        unsafe { q.seg.as_ptr().add(PRODUCER_INDEX_OFFSET).cast::<u32>().write_volatile(bogus) };
    }
    fn waiting(&self, qpn: u32) -> u32 {
        self.qps.get(&qpn).map_or(0, |q| q.sq_client.head().wrapping_sub(q.sq.tail()))
    }
}

impl WorkSource<()> for ShmRings {
    type Send<'a> = ShmSendWr<'a>;
    type Recv<'a> = ShmRecvWr<'a>;
    fn next_send(&mut self, qpn: u32, _: &mut ()) -> Offer<ShmSendWr<'_>> {
        let Some(q) = self.qps.get_mut(&qpn) else { return Offer::Empty };
        let ahs = &self.ahs;
        convert::offer_send(&mut q.sq, &mut self.send, |h| ahs.get(&h).copied(), q.is_ud)
    }
    fn next_recv(&mut self, qpn: u32, _: &mut ()) -> Offer<ShmRecvWr<'_>> {
        match self.qps.get_mut(&qpn) {
            Some(q) => convert::offer_recv(&mut q.rq, &mut self.recv),
            None => Offer::Empty,
        }
    }
    fn consume(&mut self, qpn: u32, _: &mut (), queue: Queue) {
        let q = self.qps.get_mut(&qpn).expect("offered from these rings");
        match queue {
            Queue::Send => q.sq.advance(),
            Queue::Recv => q.rq.advance(),
        }
    }
    fn finish(&mut self, qpn: u32, _: &mut (), queue: Queue) {
        if let Some(q) = self.qps.get_mut(&qpn) {
            match queue {
                Queue::Send => q.sq.release(),
                Queue::Recv => q.rq.release(),
            }
        }
    }
    fn reset(&mut self, qpn: u32, _: &mut ()) {
        if let Some(q) = self.qps.get_mut(&qpn) {
            let _ = q.sq.discard_all();
            let _ = q.rq.discard_all();
        }
    }
}

impl ClientRings for ShmRings {
    fn waiting_qps(&self, out: &mut Vec<u32>) {
        // The producers' published heads against the consumers' tails: what a doorbell says.
        out.extend(self.qps.iter().filter(|(_, q)| q.sq_client.head() != q.sq.tail() || q.rq_client.head() != q.rq.tail()).map(|(&n, _)| n));
    }
}

type ShmSim = Sim<ShmRings>;

/// A registered buffer (iova = its address).
struct Buf {
    region: Region,
    key: Key,
    addr: u64,
}

impl Buf {
    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.region.read(off, &mut v).unwrap();
        v
    }
    fn u64_at(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.read(off, 8).try_into().unwrap())
    }
    fn sge(&self, off: u64, len: u32) -> ShmSge {
        ShmSge { addr: self.addr + off, length: len, lkey: self.key.0 }
    }
}

fn reg(sim: &ShmSim, node: usize, len: usize) -> Buf {
    let region = Region::zeroed(len);
    let addr = region.addr();
    let key = sim.nodes[node].mem.table().reg_mr(PD, region.clone(), addr, ALL).expect("reg_mr");
    Buf { region, key, addr }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A signaled client send WQE with a gather list, as the shim fills one.
fn wqe(wr_id: u64, opcode: u32, sges: &[ShmSge]) -> ShmSendWqe {
    let mut w = ShmSendWqe { wr_id, opcode, send_flags: send_flags::SIGNALED, num_sge: sges.len() as u32, ..Default::default() };
    for (i, s) in sges.iter().enumerate() {
        w.set_sge(i, *s);
    }
    w
}

/// A signaled inline client send WQE.
fn inline(wr_id: u64, opcode: u32, data: &[u8]) -> ShmSendWqe {
    let mut w = ShmSendWqe { wr_id, opcode, send_flags: send_flags::SIGNALED | send_flags::INLINE, inline_len: data.len() as u32, ..Default::default() };
    w.data[..data.len()].copy_from_slice(data);
    w
}

fn rwqe(wr_id: u64, sges: &[ShmSge]) -> ShmRecvWqe {
    let mut w = ShmRecvWqe { wr_id, num_sge: sges.len() as u32, ..Default::default() };
    w.sge[..sges.len()].copy_from_slice(sges);
    w
}

fn remote(mut w: ShmSendWqe, addr: u64, rkey: Key) -> ShmSendWqe {
    w.remote_addr = addr;
    w.rkey = rkey.0;
    w
}

/// Two nodes, QA ↔ QB connected with `p`, each QP with client rings.
fn pair(p: &PairParams, seed: u64) -> ShmSim {
    let mut sim = ShmSim::with_rings(2, seed);
    sim.connect(A, QA, B, QB, p);
    let ud = p.qp_type == QpType::Ud;
    sim.nodes[A].rings.open(QA, ud);
    sim.nodes[B].rings.open(QB, ud);
    sim
}

fn drive(sim: &mut ShmSim) {
    sim.drive(STEPS).expect("livelock");
}

/// The node's completions of `qpn` on `side`, as the client reads them.
fn cqes(sim: &mut ShmSim, node: usize, qpn: u32, side: CqSide) -> Vec<ShmCqe> {
    sim.nodes[node].take_cqes(qpn, side).iter().map(convert::cqe).collect()
}

fn summary(c: &[ShmCqe]) -> Vec<(u64, u32, u32, u32)> {
    c.iter().map(|c| (c.wr_id, c.status, c.opcode, c.byte_len)).collect()
}

/// Every client opcode of an RC QP, gather lists of two entries, inline payloads, immediates
/// and atomics, rung 30 WRs deep into 16-entry rings (so they wrap) ahead of 4-deep queues (so
/// pulls stop at a full queue and resume): on every seed each completion arrives in ring order
/// with the ibverbs opcode, status and length a client expects, and every byte is where the
/// WRs put it.
#[test]
fn client_wqes_of_every_opcode_complete_in_order_with_bytes_placed_under_loss() {
    let mut faults = 0;
    for seed in 0..6u64 {
        let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, ..PairParams::default().caps };
        let p = PairParams { timeout: 8, retry_cnt: 7, rnr_retry: 7, min_rnr_timer: 1, caps, ..Default::default() };
        let mut sim = pair(&p, seed);
        sim.impair = Impairments { drop: 0.05, duplicate: 0.03, reorder: 0.05, reorder_ns: 3000, ..Default::default() };
        let src = reg(&sim, A, 8192);
        src.region.write(0, &pattern(8192, seed as u8)).unwrap();
        let back = reg(&sim, A, 4096);
        let dst = reg(&sim, B, 8192);
        let rbuf = reg(&sim, B, 16 * 512);
        let atomic = reg(&sim, B, 64);
        atomic.region.write(0, &0x100u64.to_le_bytes()).unwrap();
        let s = pattern(8192, seed as u8);

        // Phase 1 (14 send WRs, 6 receives).
        for i in 0..6 {
            sim.nodes[B].rings.recv(QB, rwqe(100 + i, &[rbuf.sge(i * 512, 100), rbuf.sge(i * 512 + 100, 412)]));
        }
        let ring = |sim: &mut ShmSim, w| sim.nodes[A].rings.send(QA, w);
        ring(&mut sim, remote(wqe(0, wr_opcode::RDMA_WRITE, &[src.sge(0, 500), src.sge(1000, 300)]), dst.addr, dst.key));
        ring(&mut sim, remote(inline(1, wr_opcode::RDMA_WRITE, b"forty bytes of inline write payload ...."), dst.addr + 1000, dst.key));
        ring(&mut sim, wqe(2, wr_opcode::SEND, &[src.sge(2000, 150), src.sge(3000, 150)]));
        ring(&mut sim, inline(3, wr_opcode::SEND, b"inline send, 24 bytes.."));
        let mut imm = wqe(4, wr_opcode::SEND_WITH_IMM, &[src.sge(4000, 64)]);
        imm.imm_or_inv = 0xabcd_0001;
        ring(&mut sim, imm);
        let mut wimm = remote(wqe(5, wr_opcode::RDMA_WRITE_WITH_IMM, &[src.sge(5000, 128)]), dst.addr + 2000, dst.key);
        wimm.imm_or_inv = 0x1234;
        ring(&mut sim, wimm);
        ring(&mut sim, remote(wqe(6, wr_opcode::RDMA_READ, &[back.sge(0, 256)]), dst.addr, dst.key));
        let mut fadd = remote(wqe(7, wr_opcode::ATOMIC_FETCH_AND_ADD, &[back.sge(512, 8)]), atomic.addr, atomic.key);
        fadd.compare_add = 5;
        ring(&mut sim, fadd);
        let mut cas = remote(wqe(8, wr_opcode::ATOMIC_CMP_AND_SWP, &[back.sge(520, 8)]), atomic.addr, atomic.key);
        (cas.compare_add, cas.swap) = (0x105, 0x777);
        ring(&mut sim, cas);
        for i in 9..14u64 {
            let off = 6000 + (i - 9) * 64;
            ring(&mut sim, remote(wqe(i, wr_opcode::RDMA_WRITE, &[src.sge(off, 64)]), dst.addr + off, dst.key));
        }
        drive(&mut sim);
        // Phase 2: 16 more of each kind through the wrapped rings.
        for i in 6..16 {
            sim.nodes[B].rings.recv(QB, rwqe(100 + i, &[rbuf.sge(i * 512, 512)]));
        }
        for i in 14..24u64 {
            let off = 6000 + (i - 9) * 64;
            let w = if i % 2 == 0 { wqe(i, wr_opcode::SEND, &[src.sge(off, 64)]) } else { inline(i, wr_opcode::SEND, &s[off as usize..off as usize + 64]) };
            sim.nodes[A].rings.send(QA, w);
        }
        for i in 24..30u64 {
            let off = 6000 + (i - 9) * 64;
            sim.nodes[A].rings.send(QA, remote(inline(i, wr_opcode::RDMA_WRITE, &s[off as usize..off as usize + 64]), dst.addr + off, dst.key));
        }
        drive(&mut sim);
        faults += sim.trace.iter().filter(|p| p.fault != Fault::Pass).count();

        let sc = cqes(&mut sim, A, QA, CqSide::Send);
        let mut want = vec![(0, WC_SUCCESS, WC_RDMA_WRITE, 0), (1, WC_SUCCESS, WC_RDMA_WRITE, 0), (2, WC_SUCCESS, WC_SEND, 0), (3, WC_SUCCESS, WC_SEND, 0), (4, WC_SUCCESS, WC_SEND, 0), (5, WC_SUCCESS, WC_RDMA_WRITE, 0), (6, WC_SUCCESS, WC_RDMA_READ, 256), (7, WC_SUCCESS, WC_FETCH_ADD, 8), (8, WC_SUCCESS, WC_COMP_SWAP, 8)];
        want.extend((9..14).map(|i| (i, WC_SUCCESS, WC_RDMA_WRITE, 0)));
        want.extend((14..24).map(|i| (i, WC_SUCCESS, WC_SEND, 0)));
        want.extend((24..30).map(|i| (i, WC_SUCCESS, WC_RDMA_WRITE, 0)));
        // A requester's byte_len is defined for READ and atomics only; compare the rest as 0.
        let got: Vec<_> = summary(&sc).into_iter().map(|(id, st, op, len)| (id, st, op, if op == WC_RDMA_READ || op == WC_FETCH_ADD || op == WC_COMP_SWAP { len } else { 0 })).collect();
        assert_eq!(got, want, "seed {seed}");
        assert!(sc.iter().all(|c| c.qp_num == QA), "seed {seed}");

        let rc = cqes(&mut sim, B, QB, CqSide::Recv);
        let mut want = vec![(100, WC_SUCCESS, WC_RECV, 300), (101, WC_SUCCESS, WC_RECV, 23), (102, WC_SUCCESS, WC_RECV, 64), (103, WC_SUCCESS, WC_RECV_RDMA_WITH_IMM, 128)];
        want.extend((104..114).map(|i| (i, WC_SUCCESS, WC_RECV, 64)));
        assert_eq!(summary(&rc), want, "seed {seed}");
        assert_eq!((rc[2].wc_flags & WC_WITH_IMM, rc[2].imm_or_inv), (WC_WITH_IMM, 0xabcd_0001), "seed {seed}");
        assert_eq!((rc[3].wc_flags & WC_WITH_IMM, rc[3].imm_or_inv), (WC_WITH_IMM, 0x1234), "seed {seed}");
        assert_eq!(rc[0].wc_flags & (WC_WITH_IMM | WC_GRH), 0, "seed {seed}");
        assert!(rc.iter().all(|c| c.qp_num == QB), "seed {seed}");

        let mut w0 = s[0..500].to_vec();
        w0.extend_from_slice(&s[1000..1300]);
        assert!(dst.read(0, 800) == w0, "seed {seed}: gather WRITE");
        assert_eq!(dst.read(1000, 40), b"forty bytes of inline write payload ....", "seed {seed}");
        assert!(dst.read(2000, 128) == s[5000..5128], "seed {seed}: WRITE with immediate");
        assert!(dst.read(6000, 5 * 64) == s[6000..6000 + 5 * 64], "seed {seed}: WRITEs 9..14");
        assert!(dst.read(6000 + 5 * 64, 10 * 64).iter().all(|&b| b == 0), "seed {seed}: SENDs wrote through");
        assert!(dst.read(6000 + 15 * 64, 6 * 64) == s[6000 + 15 * 64..6000 + 21 * 64], "seed {seed}: inline WRITEs 24..30");
        let mut sent = s[2000..2150].to_vec();
        sent.extend_from_slice(&s[3000..3150]);
        let mut got = rbuf.read(0, 100);
        got.extend(rbuf.read(100, 200));
        assert!(got == sent, "seed {seed}: gather SEND into a two-entry scatter list");
        assert_eq!(rbuf.read(512, 23), b"inline send, 24 bytes..".to_vec()[..23], "seed {seed}");
        assert!(rbuf.read(1024, 64) == s[4000..4064], "seed {seed}");
        for i in 14..24usize {
            let off = 6000 + (i - 9) * 64;
            assert!(rbuf.read((i - 10) * 512, 64) == s[off..off + 64], "seed {seed}: SEND {i}");
        }
        assert!(back.read(0, 256) == w0[..256], "seed {seed}: READ after WRITE on the same QP");
        assert_eq!((back.u64_at(512), back.u64_at(520), atomic.u64_at(0)), (0x100, 0x105, 0x777), "seed {seed}: atomics");
        assert_eq!((sim.nodes[A].pulled.moved, sim.nodes[B].pulled.moved), (30, 16), "seed {seed}");
        assert!(sim.nodes[A].pulled.full && sim.nodes[B].pulled.full, "seed {seed}: no queue was ever full");
        assert_eq!(sim.nodes[A].pulled.malformed + sim.nodes[A].pulled.corrupt, 0, "seed {seed}");
        assert_eq!(sim.nodes[A].rings.waiting(QA), 0, "seed {seed}");
        assert_eq!(sim.nodes[A].qp(QA).state(), QpState::Rts);
    }
    assert!(faults > 0, "no seed impaired a packet: not a scenario under loss");
}

/// Each way a client can write a send entry the shim would have refused (unknown opcode, a
/// gather list or inline payload beyond the limits) is consumed without a completion, the QP
/// goes to ERROR, the WR before it completes, the WR after it flushes and its bytes never move.
#[test]
fn a_malformed_client_send_entry_fails_the_qp_and_the_wrs_after_it_flush() {
    let bad_opcode = ShmSendWqe { wr_id: 1, opcode: 0xdead, send_flags: send_flags::SIGNALED, ..Default::default() };
    let too_many_sges = ShmSendWqe { wr_id: 1, opcode: wr_opcode::RDMA_WRITE, send_flags: send_flags::SIGNALED, num_sge: 99, ..Default::default() };
    let too_long_inline = ShmSendWqe { wr_id: 1, opcode: wr_opcode::SEND, send_flags: send_flags::SIGNALED | send_flags::INLINE, inline_len: 100_000, ..Default::default() };
    for (k, bad) in [bad_opcode, too_many_sges, too_long_inline].into_iter().enumerate() {
        let mut sim = pair(&PairParams::default(), 10 + k as u64);
        sim.impair = Impairments { drop: 0.05, reorder: 0.05, reorder_ns: 2000, ..Default::default() };
        let src = reg(&sim, A, 4096);
        src.region.write(0, &pattern(4096, 3)).unwrap();
        let dst = reg(&sim, B, 4096);
        sim.nodes[A].rings.send(QA, remote(wqe(0, wr_opcode::RDMA_WRITE, &[src.sge(0, 1024)]), dst.addr, dst.key));
        drive(&mut sim);
        sim.nodes[A].rings.send(QA, bad);
        sim.nodes[A].rings.send(QA, remote(wqe(2, wr_opcode::RDMA_WRITE, &[src.sge(1024, 1024)]), dst.addr + 1024, dst.key));
        drive(&mut sim);
        assert_eq!(sim.nodes[A].pulled.malformed, 1, "case {k}");
        assert_eq!(sim.nodes[A].qp(QA).state(), QpState::Err, "case {k}");
        let sc = summary(&cqes(&mut sim, A, QA, CqSide::Send));
        assert_eq!(sc.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>(), [(0, WC_SUCCESS), (2, WC_WR_FLUSH_ERR)], "case {k}");
        assert!(dst.read(0, 1024) == pattern(4096, 3)[..1024], "case {k}");
        assert!(dst.read(1024, 1024).iter().all(|&b| b == 0), "case {k}: the WR after the malformed entry moved bytes");
        assert_eq!(sim.nodes[A].rings.waiting(QA), 0, "case {k}");
        assert_eq!(sim.nodes[B].qp(QB).state(), QpState::Rts, "case {k}: the peer is not the client's to fail");
    }
}

/// A receive entry with too long a scatter list fails the receiving QP; the valid receive rung
/// after it flushes, and a SEND arriving afterwards completes nothing at the receiver.
#[test]
fn a_malformed_client_receive_entry_fails_the_qp() {
    let mut sim = pair(&PairParams::default(), 21);
    let buf = reg(&sim, B, 4096);
    sim.nodes[B].rings.recv(QB, ShmRecvWqe { wr_id: 50, num_sge: 99, ..Default::default() });
    sim.nodes[B].rings.recv(QB, rwqe(51, &[buf.sge(0, 4096)]));
    drive(&mut sim);
    assert_eq!(sim.nodes[B].pulled.malformed, 1);
    assert_eq!(sim.nodes[B].qp(QB).state(), QpState::Err);
    let rc = summary(&cqes(&mut sim, B, QB, CqSide::Recv));
    assert_eq!(rc.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>(), [(51, WC_WR_FLUSH_ERR)]);
}

/// A client that corrupts its send ring's producer index fails its own QP, which sends nothing;
/// its other QP on the same node, and the peer, carry on under loss as if nothing happened.
#[test]
fn a_corrupt_client_ring_fails_only_its_own_qp() {
    let p = PairParams::default();
    let mut sim = pair(&p, 31);
    sim.connect(A, QA2, B, QB2, &p);
    sim.nodes[A].rings.open(QA2, false);
    sim.impair = Impairments { drop: 0.05, duplicate: 0.03, reorder: 0.05, reorder_ns: 3000, ..Default::default() };
    let src = reg(&sim, A, 4096);
    src.region.write(0, &pattern(4096, 5)).unwrap();
    let dst = reg(&sim, B, 4096);
    sim.nodes[A].rings.send(QA, remote(wqe(0, wr_opcode::RDMA_WRITE, &[src.sge(0, 2048)]), dst.addr, dst.key));
    sim.nodes[A].rings.corrupt_send_ring(QA);
    for i in 0..8u64 {
        sim.nodes[A].rings.send(QA2, remote(wqe(i, wr_opcode::RDMA_WRITE, &[src.sge(2048 + i * 256, 256)]), dst.addr + 2048 + i * 256, dst.key));
    }
    drive(&mut sim);
    assert!(sim.nodes[A].pulled.corrupt >= 1);
    assert_eq!(sim.nodes[A].qp(QA).state(), QpState::Err);
    assert!(sim.trace.iter().all(|p| p.src_qpn != QA), "a packet left the QP whose ring is corrupt");
    assert!(dst.read(0, 2048).iter().all(|&b| b == 0));
    assert_eq!(sim.nodes[A].qp(QA2).state(), QpState::Rts);
    assert_eq!(sim.nodes[B].qp(QB).state(), QpState::Rts);
    let sc = summary(&cqes(&mut sim, A, QA2, CqSide::Send));
    assert_eq!(sc.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>(), (0..8).map(|i| (i, WC_SUCCESS)).collect::<Vec<_>>());
    assert!(dst.read(2048, 2048) == pattern(4096, 5)[2048..]);
}

/// UD: a client names its destination by address-handle number; the conversion resolves it,
/// keeps the 24-bit QPN of whatever the client wrote in the top byte, and carries the Q_Key.
/// An unknown handle is a malformed entry: the QP fails and the send after it flushes.
#[test]
fn ud_entries_resolve_their_address_handle_and_an_unknown_one_fails_the_qp() {
    let p = PairParams { qp_type: QpType::Ud, ..Default::default() };
    let mut sim = pair(&p, 41);
    let av = AddressVector { dgid: gid_of(sim.nodes[B].ip), hop_limit: 64, port: 1, ..Default::default() };
    sim.nodes[A].rings.ahs.insert(7, av);
    let src = reg(&sim, A, 4096);
    src.region.write(0, &pattern(4096, 6)).unwrap();
    let buf = reg(&sim, B, 4096);
    sim.nodes[B].rings.recv(QB, rwqe(60, &[buf.sge(0, 1064)]));
    sim.nodes[B].rings.recv(QB, rwqe(61, &[buf.sge(2048, 1064)]));
    let ud = |wr_id, ah, qkey| {
        let mut w = wqe(wr_id, wr_opcode::SEND, &[src.sge(0, 700)]);
        (w.ah, w.remote_qpn, w.remote_qkey) = (ah, 0xff00_0000 | QB, qkey);
        w
    };
    sim.nodes[A].rings.send(QA, ud(1, 7, 0x1111_1111));
    drive(&mut sim);
    sim.nodes[A].rings.send(QA, ud(2, 8, 0x1111_1111));
    sim.nodes[A].rings.send(QA, ud(3, 7, 0x1111_1111));
    drive(&mut sim);

    let rc = cqes(&mut sim, B, QB, CqSide::Recv);
    assert_eq!(summary(&rc), [(60, WC_SUCCESS, WC_RECV, 740)]);
    assert_eq!((rc[0].src_qp, rc[0].wc_flags & WC_GRH), (QA, WC_GRH));
    assert!(buf.read(40, 700) == pattern(4096, 6)[..700]);
    assert_eq!(sim.nodes[A].pulled.malformed, 1);
    assert_eq!(sim.nodes[A].qp(QA).state(), QpState::Err);
    let sc = summary(&cqes(&mut sim, A, QA, CqSide::Send));
    assert_eq!(sc.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>(), [(1, WC_SUCCESS), (3, WC_WR_FLUSH_ERR)]);
}
