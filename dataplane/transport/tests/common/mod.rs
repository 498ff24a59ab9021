//! Shared fixtures for the transport tests: the SEMANTICS.md §7 setup on the sim wire.
#![allow(dead_code)]

use pmrxe_mem::{Access, Key, Region, SgEntry, Sge};
use pmrxe_transport::sim::{PairParams, Sim};
use pmrxe_transport::{CqSide, Cqe, Instant, RecvWqe, SendFlags, SendOp, SendWqe, WcStatus};

pub const A: usize = 0;
pub const B: usize = 1;
pub const QA: u32 = 0x11;
pub const QB: u32 = 0x22;
pub const PD: u32 = 1;
pub const MS: u64 = 1_000_000;
pub const STEPS: usize = 200_000;

/// A registered buffer.
#[derive(Clone)]
pub struct Buf {
    pub region: Region,
    pub key: Key,
    pub addr: u64,
    pub len: usize,
}

impl Buf {
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.region.read(off, &mut v).unwrap();
        v
    }
    pub fn write(&self, off: usize, d: &[u8]) {
        self.region.write(off, d).unwrap();
    }
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge { addr: self.addr + off, len, lkey: self.key }
    }
    pub fn rkey(&self) -> u32 {
        self.key.0
    }
    pub fn u64_at(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.read(off, 8).try_into().unwrap())
    }
}

pub const ALL: Access = Access(1 | 2 | 4 | 8 | 16);

/// Register `len` zeroed bytes on `node` with `access`.
pub fn reg(sim: &Sim, node: usize, len: usize, access: Access) -> Buf {
    let region = Region::zeroed(len);
    let addr = region.addr();
    let key = sim.nodes[node].mem.table().reg_mr(PD, region.clone(), addr, access).expect("reg_mr");
    Buf { region, key, addr, len }
}

/// Pattern bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A fast-reg MR (alloc_mr) over `pages` 4 KiB pages of a fresh region, mapped with
/// `map_mr_sg` at first-element offset `first_off`, still FREE. Returns (region, key, iova).
pub struct Fmr {
    pub region: Region,
    pub base_off: usize,
    pub key: Key,
}

pub fn fmr(sim: &Sim, node: usize, pages: usize, first_off: usize) -> Fmr {
    let region = Region::zeroed((pages + 2) * 4096);
    let base_off = (4096 - (region.addr() % 4096) as usize) % 4096;
    let mem = sim.nodes[node].mem.table();
    let key = mem.alloc_mr(PD, 16).expect("alloc_mr");
    let sg = [SgEntry { region: &region, offset: base_off + first_off, len: pages * 4096 - first_off }];
    let n = mem.map_mr_sg(key, &sg, 0, 4096).expect("map_mr_sg");
    assert_eq!(n, 1);
    Fmr { region, base_off, key }
}

impl Fmr {
    pub fn iova(&self, sim: &Sim, node: usize) -> u64 {
        sim.nodes[node].mem.table().query(self.key).expect("mr").next_iova
    }
    pub fn read(&self, off_from_page0: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.region.read(self.base_off + off_from_page0, &mut v).unwrap();
        v
    }
}

/// The §7 pair: two RC QPs A↔B, MTU 1024, timeout 14, retry 3, rnr 3, rd_atomic 4.
pub fn pair() -> Sim {
    pair_with(&PairParams::default(), 7)
}

pub fn pair_with(p: &PairParams, seed: u64) -> Sim {
    let mut sim = Sim::new(2, seed);
    sim.connect(A, QA, B, QB, p);
    sim
}

pub fn post(sim: &mut Sim, node: usize, qpn: u32, w: SendWqe) {
    let now = sim.now;
    sim.nodes[node].post_send(qpn, now, w).expect("post_send");
}

pub fn post_recv(sim: &mut Sim, node: usize, qpn: u32, w: RecvWqe) {
    sim.nodes[node].post_recv(qpn, &w).expect("post_recv");
}

pub fn send_cqes(sim: &mut Sim, node: usize, qpn: u32) -> Vec<Cqe> {
    sim.nodes[node].take_cqes(qpn, CqSide::Send)
}
pub fn recv_cqes(sim: &mut Sim, node: usize, qpn: u32) -> Vec<Cqe> {
    sim.nodes[node].take_cqes(qpn, CqSide::Recv)
}
pub fn statuses(c: &[Cqe]) -> Vec<WcStatus> {
    c.iter().map(|c| c.status).collect()
}
pub fn ids(c: &[Cqe]) -> Vec<u64> {
    c.iter().map(|c| c.wr_id).collect()
}

pub fn sig() -> SendFlags {
    SendFlags::SIGNALED
}

pub fn write(id: u64, src: &Buf, off: u64, len: u32, dst_addr: u64, rkey: u32) -> SendWqe {
    SendWqe::new(id, SendOp::Write).sge(src.sge(off, len)).remote(dst_addr, rkey).flags(sig())
}
pub fn read(id: u64, dst: &Buf, off: u64, len: u32, src_addr: u64, rkey: u32) -> SendWqe {
    SendWqe::new(id, SendOp::Read).sge(dst.sge(off, len)).remote(src_addr, rkey).flags(sig())
}
pub fn send(id: u64, src: &Buf, off: u64, len: u32) -> SendWqe {
    SendWqe::new(id, SendOp::Send).sge(src.sge(off, len)).flags(sig())
}
pub fn recv(id: u64, dst: &Buf, off: u64, len: u32) -> RecvWqe {
    RecvWqe::new(id).sge(dst.sge(off, len))
}

pub fn drive(sim: &mut Sim) {
    sim.drive(STEPS).expect("livelock");
}

pub fn at(t: Instant) -> u64 {
    t.0
}
