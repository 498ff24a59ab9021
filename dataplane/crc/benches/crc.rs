//! The byte-work limits of one core at frame sizes: fused copy+CRC (every kernel this CPU has),
//! CRC alone (every kernel, and crc32fast), plain memcpy, and the two-pass memcpy + crc32fast
//! that the fused kernel replaces. The destination sits at a frame's payload offset (70 bytes:
//! Eth 14 + IPv4 20 + UDP 8 + BTH 12 + RETH 16) in a 64-byte aligned buffer, the source at a
//! page-aligned address, as on the send side of the data path.
//!
//! The `header` group: the masked update over a frame's headers at the lengths the data path
//! hashes them (a BTH 12, an ACK's IP..AETH 44, an 8 B SEND's IP..payload 48, an 8 B WRITE's
//! 64, a FIRST packet's IP..RETH 56), sixteen in a chain, each one's bytes found through the
//! last one's result: the latency a frame pays.
//!
//! `cargo bench -p pmrxe-crc --bench crc -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pmrxe_crc::{crc_update_masked, Kernel, Mask};

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
    // The ICRC's masks of an IPv4 header (ToS, TTL, checksum), its UDP checksum and BTH byte 4
    // after them.
    const MASK: Mask = [0xFF << 8 | 0xFF << 64 | 0xFFFF << 80, 0xFFFF << 80, 0xFF, 0];
    let mut g = c.benchmark_group("header");
    let src = Buf::new(128, 14);
    for len in [12usize, 44, 48, 56, 64] {
        g.throughput(Throughput::Elements(16));
        g.bench_with_input(BenchmarkId::new("masked_chain16", len), &len, |b, &len| {
            b.iter(|| {
                let buf = black_box(src.get());
                // The next header's address depends on the last result (offset 0 or 1): the
                // chain measures loads, folds and reduction, as a frame waits for them.
                (0..16).fold(0u32, |c, _| {
                    let o = (c >> 31) as usize;
                    crc_update_masked(0, &buf[o..o + len], &MASK)
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
