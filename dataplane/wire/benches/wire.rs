//! parse+ICRC-check and build+ICRC for 64 B, 1 KiB and 4 KiB payloads, beside memcpy of the
//! same sizes. Throughput is in bytes of payload (GB/s); Mpps = GB/s / size.
//!
//! `cargo bench -p pmrxe-wire --bench wire -- --warm-up-time 1 --measurement-time 2`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pmrxe_wire::{
    build_frame, emit_frame_headers, finish_frame, frame_header_len, frame_len, parse_frame, BthRepr,
    L3Info, MacAddr, Opcode, Psn, Qpn, RethRepr, TransportHeaders,
};

fn setup(size: usize) -> (L3Info, TransportHeaders, Vec<u8>) {
    let l3 = L3Info {
        src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        src_ip: "192.0.2.1".parse().unwrap(),
        dst_ip: "192.0.2.2".parse().unwrap(),
        ..L3Info::default()
    };
    let h = TransportHeaders {
        reth: Some(RethRepr { va: 0x1000, rkey: 0x42, len: size as u32 }),
        ..TransportHeaders::new(BthRepr::new(Opcode::RC_RDMA_WRITE_ONLY, Qpn::new(0x11), Psn::new(1)))
    };
    (l3, h, (0..size).map(|i| i as u8).collect())
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("wire");
    for size in [64usize, 1024, 4096] {
        let (l3, h, payload) = setup(size);
        let mut frame = vec![0u8; frame_len(false, h.header_len(), size)];
        build_frame(&mut frame, &l3, &h, &payload).unwrap();
        g.throughput(Throughput::Bytes(size as u64));

        g.bench_with_input(BenchmarkId::new("parse_icrc", size), &frame, |b, f| {
            b.iter(|| parse_frame(black_box(f)).unwrap().payload.len())
        });

        // The data-path build: headers + payload copy straight into the final buffer + ICRC.
        let mut out = vec![0u8; frame.len()];
        g.bench_with_input(BenchmarkId::new("build_icrc", size), &payload, |b, p| {
            b.iter(|| {
                let hl = frame_header_len(false);
                let n = h.emit(&mut out[hl..]).unwrap();
                out[hl + n..hl + n + p.len()].copy_from_slice(black_box(p));
                emit_frame_headers(&mut out, &l3, n + p.len()).unwrap();
                finish_frame(&mut out).unwrap();
                out[out.len() - 1]
            })
        });

        let mut dst = vec![0u8; size];
        g.bench_with_input(BenchmarkId::new("memcpy", size), &payload, |b, p| {
            b.iter(|| {
                dst.copy_from_slice(black_box(p));
                dst[size - 1]
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
