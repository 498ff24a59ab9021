//! Fast-path cost: key lookup + range check + 4 KiB copy through a translation, beside a plain
//! 4 KiB memcpy measured in the same run (DESIGN: measure as a ratio against a local limit).
//! Lookups through the table (a counted reference: two locked RMWs on the slot word) beside
//! lookups through an lcore's epoch `Reader` (a load plus checks), for an 8-byte access (the
//! 8 B WRITE case, where the lookup is the cost) and a 4 KiB copy.
//!
//! `cargo bench -p pmrxe-mem --bench lookup` (short: ~1 s per case).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pmrxe_mem::*;

const PD: PdHandle = 1;
const N: usize = 4096;

fn aligned(len: usize, align: usize) -> Region {
    let big = Region::zeroed(len + align);
    let off = (align - big.addr() as usize % align) % align;
    big.slice(off, len).unwrap()
}

fn bench(c: &mut Criterion) {
    let t = std::sync::Arc::new(MemTable::new(MemLimits::default()));
    let mut reader = t.reader().unwrap();
    let mem = aligned(64 * N, N);
    mem.fill(0, 64 * N, 0x5a).unwrap();
    let user = t
        .reg_mr(
            PD,
            mem.clone(),
            0x1_0000,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let fr = t.alloc_mr(PD, 64).unwrap();
    t.map_mr_sg(
        fr,
        &[SgEntry {
            region: &mem,
            offset: 0,
            len: 64 * N,
        }],
        0,
        N as u64,
    )
    .unwrap();
    t.exec_reg_mr(
        PD,
        fr,
        Access::LOCAL_WRITE | Access::REMOTE_READ,
        None,
        None,
    )
    .unwrap();
    let fr_iova = t.query(fr).unwrap().iova;
    let mut dst = vec![0u8; N];
    let src = vec![0xa5u8; N];

    let mut g = c.benchmark_group("mem_4k");
    g.throughput(Throughput::Bytes(N as u64));
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);

    g.bench_function("memcpy_4k", |b| {
        b.iter(|| mem.read(black_box(8 * N), black_box(&mut dst)).unwrap());
    });
    g.bench_function("lookup_only", |b| {
        b.iter(|| {
            let m = t
                .lookup(
                    black_box(fr),
                    PD,
                    0,
                    black_box(fr_iova + 8 * N as u64),
                    N as u64,
                    Access::REMOTE_READ,
                )
                .unwrap();
            black_box(&m);
        });
    });
    g.bench_function("reader_lookup_only", |b| {
        b.iter(|| {
            let m = reader
                .lookup(
                    black_box(fr),
                    PD,
                    0,
                    black_box(fr_iova + 8 * N as u64),
                    N as u64,
                    Access::REMOTE_READ,
                )
                .unwrap();
            black_box(&m);
        });
    });
    // Counted lookup + 4 KiB copy out of `key` at `va`.
    let copy_out_4k = |key: Key, va: u64, dst: &mut [u8]| {
        let va = black_box(va);
        let m = t.lookup(key, PD, 0, va, N as u64, Access::REMOTE_READ).unwrap();
        m.copy_out(va, dst).unwrap();
    };
    for (name, key, va) in [
        ("lookup_copy_out_4k_user_mr", user, 0x1_0000 + 8 * N as u64),
        ("lookup_copy_out_4k_fastreg_aligned", fr, fr_iova + 8 * N as u64),
        ("lookup_copy_out_4k_fastreg_straddle", fr, fr_iova + 8 * N as u64 + 2048),
    ] {
        g.bench_function(name, |b| b.iter(|| copy_out_4k(key, va, &mut dst)));
    }
    g.bench_function("lookup_copy_in_4k_fastreg", |b| {
        b.iter(|| {
            let va = black_box(fr_iova + 9 * N as u64);
            let m = t
                .lookup(fr, PD, 0, va, N as u64, Access::LOCAL_WRITE)
                .unwrap();
            m.copy_in(va, &src).unwrap();
        });
    });
    g.bench_function("reader_lookup_copy_out_4k_fastreg_aligned", |b| {
        b.iter(|| {
            let va = black_box(fr_iova + 8 * N as u64);
            let m = reader
                .lookup(fr, PD, 0, va, N as u64, Access::REMOTE_READ)
                .unwrap();
            m.copy_out(va, &mut dst).unwrap();
        });
    });
    g.finish();

    // The 8 B WRITE case: one lookup and an 8-byte copy, with the lcore's quiescent point
    // every 32 accesses (about a burst per loop iteration).
    let mut g = c.benchmark_group("mem_8b");
    g.throughput(Throughput::Elements(32));
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    let src8 = [0xa5u8; 8];
    g.bench_function("counted_lookup_copy_in_8b_x32", |b| {
        b.iter(|| {
            for i in 0..32u64 {
                let va = black_box(0x1_0000 + 8 * i);
                let m = t.lookup(user, PD, 0, va, 8, Access::LOCAL_WRITE).unwrap();
                m.copy_in(va, &src8).unwrap();
            }
        });
    });
    g.bench_function("reader_lookup_copy_in_8b_x32", |b| {
        b.iter(|| {
            for i in 0..32u64 {
                let va = black_box(0x1_0000 + 8 * i);
                let m = reader.lookup(user, PD, 0, va, 8, Access::LOCAL_WRITE).unwrap();
                m.copy_in(va, &src8).unwrap();
            }
            reader.quiescent();
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
