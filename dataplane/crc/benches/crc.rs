//! The byte-work limits of one core at frame sizes: fused copy+CRC (every kernel this CPU has),
//! CRC alone (every kernel, and crc32fast), plain memcpy, and the two-pass memcpy + crc32fast
//! that the fused kernel replaces. The destination sits at a frame's payload offset (70 bytes:
//! Eth 14 + IPv4 20 + UDP 8 + BTH 12 + RETH 16) in a 64-byte aligned buffer, the source at a
//! page-aligned address, as on the send side of the data path.
//!
//! `cargo bench -p pmrxe-crc --bench crc -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pmrxe_crc::Kernel;

/// A buffer of `len` bytes starting `off` bytes past a 4096-aligned address.
struct Buf {
    v: Vec<u8>,
    start: usize,
    len: usize,
}

impl Buf {
    fn new(len: usize, off: usize) -> Buf {
        let v: Vec<u8> = (0..len + off + 4096).map(|i| (i * 31 + 7) as u8).collect();
        let start = (4096 - v.as_ptr() as usize % 4096) % 4096 + off;
        Buf { v, start, len }
    }
    fn get(&self) -> &[u8] {
        &self.v[self.start..self.start + self.len]
    }
    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.start..self.start + self.len]
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc");
    for size in [1024usize, 4096, 65536] {
        let src = Buf::new(size, 0);
        let mut dst = Buf::new(size, 70);
        g.throughput(Throughput::Bytes(size as u64));
        for k in Kernel::available() {
            g.bench_with_input(BenchmarkId::new(format!("copy_and_crc/{}", k.name()), size), &size, |b, _| {
                b.iter(|| k.copy_and_crc(0, dst.get_mut(), black_box(src.get())))
            });
            g.bench_with_input(BenchmarkId::new(format!("crc/{}", k.name()), size), &size, |b, _| {
                b.iter(|| k.crc_update(0, black_box(src.get())))
            });
        }
        g.bench_with_input(BenchmarkId::new("crc/crc32fast", size), &size, |b, _| {
            b.iter(|| crc32fast::hash(black_box(src.get())))
        });
        g.bench_with_input(BenchmarkId::new("memcpy", size), &size, |b, _| {
            b.iter(|| {
                dst.get_mut().copy_from_slice(black_box(src.get()));
                black_box(dst.get()[0])
            })
        });
        g.bench_with_input(BenchmarkId::new("memcpy+crc32fast", size), &size, |b, _| {
            b.iter(|| {
                dst.get_mut().copy_from_slice(black_box(src.get()));
                crc32fast::hash(dst.get())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
