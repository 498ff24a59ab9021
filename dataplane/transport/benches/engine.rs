//! Engine throughput on the sim wire (real frames with ICRC both ways), beside memcpy of the
//! same bytes. Short runs: `cargo bench -p pmrxe-transport --bench engine`.
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pmrxe_mem::{Access, Region, Sge};
use pmrxe_transport::sim::{PairParams, Sim};
use pmrxe_transport::{RecvWqe, SendOp, SendWqe};

const A: usize = 0;
const B: usize = 1;

fn setup(len: usize) -> (Sim, Sge, u64, u32, Region, Region) {
    let mut sim = Sim::new(2, 1);
    sim.record = false;
    sim.latency_ns = 0;
    let p = PairParams { caps: pmrxe_transport::QpCaps { max_send_wr: 4096, max_recv_wr: 4096, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 }, max_rd_atomic: 16, max_dest_rd_atomic: 16, mtu: pmrxe_transport::PathMtu::Mtu4096, ..Default::default() };
    sim.connect(A, 1, B, 2, &p);
    let acc = Access(1 | 2 | 4 | 8);
    let ra = Region::zeroed(len.max(64));
    let rb = Region::zeroed(len.max(64));
    let ka = sim.nodes[A].mem.table().reg_mr(1, ra.clone(), ra.addr(), acc).unwrap();
    let kb = sim.nodes[B].mem.table().reg_mr(1, rb.clone(), rb.addr(), acc).unwrap();
    (sim, Sge { addr: ra.addr(), len: len as u32, lkey: ka }, rb.addr(), kb.0, ra, rb)
}

fn run_ops(sim: &mut Sim, n: usize, mk: &dyn Fn(u64) -> SendWqe) {
    let now = sim.now;
    for i in 0..n {
        let flags = if i + 1 == n { pmrxe_transport::SendFlags::SIGNALED } else { pmrxe_transport::SendFlags::NONE };
        sim.nodes[A].post_send(1, now, mk(i as u64).flags(flags)).unwrap();
    }
    sim.drive(10_000_000).unwrap();
    sim.nodes[A].collect();
    sim.nodes[A].cqes.clear();
    sim.nodes[B].cqes.clear();
}

fn small(c: &mut Criterion) {
    let mut g = c.benchmark_group("wqe_8B");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let n = 512;
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("send", |bch| {
        let (mut sim, sge, rb, _rk, _a, b) = setup(8);
        let _ = rb;
        bch.iter(|| {
            let k = sim.nodes[B].mem.table().reg_mr(1, b.clone(), b.addr(), Access(1)).unwrap();
            for i in 0..n {
                sim.nodes[B].post_recv(2, &RecvWqe::new(i as u64).sge(Sge { addr: b.addr(), len: 8, lkey: k })).unwrap();
            }
            run_ops(&mut sim, n, &|i| SendWqe::new(i, SendOp::Send).sge(sge));
            sim.nodes[B].mem.table().dereg_mr(k).unwrap();
        })
    });
    g.bench_function("write", |bch| {
        let (mut sim, sge, rb, rk, _a, _b) = setup(8);
        bch.iter(|| run_ops(&mut sim, n, &|i| SendWqe::new(i, SendOp::Write).sge(sge).remote(rb, rk)))
    });
    g.finish();
}

fn large(c: &mut Criterion) {
    let len = 64 * 1024;
    let n = 64;
    let mut g = c.benchmark_group("bytes_64KiB");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Bytes((len * n) as u64));
    g.bench_function(BenchmarkId::new("write", len), |bch| {
        let (mut sim, sge, rb, rk, _a, _b) = setup(len);
        bch.iter(|| run_ops(&mut sim, n, &|i| SendWqe::new(i, SendOp::Write).sge(sge).remote(rb, rk)))
    });
    g.bench_function(BenchmarkId::new("read", len), |bch| {
        let (mut sim, sge, rb, rk, _a, _b) = setup(len);
        bch.iter(|| run_ops(&mut sim, n, &|i| SendWqe::new(i, SendOp::Read).sge(sge).remote(rb, rk)))
    });
    g.bench_function(BenchmarkId::new("memcpy", len), |bch| {
        let src = vec![1u8; len];
        let mut dst = vec![0u8; len];
        bch.iter(|| {
            for _ in 0..n {
                dst.copy_from_slice(std::hint::black_box(&src));
            }
            std::hint::black_box(&dst);
        })
    });
    g.finish();
}

criterion_group!(benches, small, large);
criterion_main!(benches);
