//! Every kernel this CPU has, checked against crc32fast and the portable kernel: CRC and copied
//! bytes for every length 0..=8 KiB at shifting source/destination alignments, every length
//! 0..=600 at a grid of alignments, random contents, lengths, offsets and initial CRCs
//! (proptest), the bytes around the destination untouched, masked updates, and combination of
//! a masked header prefix with a payload's CRC. A kernel this CPU lacks is reported on stderr
//! (`kernel avx512: not tested on this CPU`), never passed silently.

use pmrxe_crc::{copy_and_crc, crc32, crc32_combine, crc_update, crc_update_masked, CrcShift, Kernel, Mask};
use proptest::prelude::*;

fn reference(crc: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(data);
    h.finalize()
}

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s as u8
        })
        .collect()
}

const MAX: usize = 8192;
const GUARD: usize = 80;

/// `copy_and_crc` of `src[so..so+len]` into `dst[GUARD+do..]` and `crc_update` of the same
/// bytes, for kernel `k`; asserts CRCs, copied bytes and untouched guard bytes.
fn check(k: Kernel, src: &[u8], so: usize, doff: usize, len: usize, init: u32) {
    let data = &src[so..so + len];
    let want = reference(init, data);
    assert_eq!(Kernel::PORTABLE.crc_update(init, data), want, "portable update len {len}");
    assert_eq!(k.crc_update(init, data), want, "{} update len {len} off {so}", k.name());
    let mut dst = vec![0xA5u8; GUARD + doff + len + GUARD];
    let got = k.copy_and_crc(init, &mut dst[GUARD + doff..GUARD + doff + len], data);
    assert_eq!(got, want, "{} copy len {len} src off {so} dst off {doff}", k.name());
    assert_eq!(&dst[GUARD + doff..GUARD + doff + len], data, "{} copied bytes len {len}", k.name());
    assert!(dst[..GUARD + doff].iter().all(|&b| b == 0xA5), "{} wrote before dst (len {len})", k.name());
    assert!(dst[GUARD + doff + len..].iter().all(|&b| b == 0xA5), "{} wrote past dst (len {len})", k.name());
}

#[test]
fn every_length_to_8k_every_kernel() {
    let src = pattern(MAX + 64, 7);
    let kernels: Vec<Kernel> = Kernel::available().collect();
    assert!(!kernels.is_empty());
    for len in 0..=MAX {
        // Source and destination offsets cycle through all 64 residues (cache-line positions).
        let so = len % 64;
        let doff = (len * 7 + 3) % 64;
        let init = (len as u32).wrapping_mul(0x9E37_79B9);
        for &k in &kernels {
            check(k, &src, so, doff, len, init);
        }
    }
}

#[test]
fn every_kernel_is_tested_or_reported() {
    let available: Vec<&str> = Kernel::available().map(Kernel::name).collect();
    for n in &available {
        assert!(Kernel::all_names().contains(n), "{n} missing from all_names");
        assert_eq!(Kernel::by_name(n).map(Kernel::name), Some(*n));
    }
    for n in Kernel::all_names() {
        if available.contains(n) {
            eprintln!("kernel {n}: tested");
        } else {
            eprintln!("kernel {n}: not tested on this CPU");
            assert_eq!(Kernel::by_name(n), None);
        }
    }
}

#[test]
fn every_length_to_600_at_many_alignments() {
    let src = pattern(600 + 64, 23);
    for len in 0..=600 {
        for so in [0usize, 1, 3, 8, 15, 16, 31, 32, 63] {
            for doff in [0usize, 1, 7, 16, 31, 32, 33, 63] {
                let init = (len as u32 ^ (so << 12) as u32 ^ (doff << 20) as u32).wrapping_mul(0x9E37_79B9);
                for k in Kernel::available() {
                    check(k, &src, so, doff, len, init);
                }
            }
        }
    }
}

#[test]
fn raw_pointer_entry_points_agree() {
    let src = pattern(5000, 3);
    for k in Kernel::available() {
        for len in [0usize, 1, 15, 16, 63, 64, 255, 256, 4096, 4999] {
            let mut dst = vec![0u8; len];
            // SAFETY: `src` readable and `dst` writable for `len` bytes, distinct vectors.
            let c = unsafe { k.copy_and_crc_raw(1, dst.as_mut_ptr(), src.as_ptr(), len) };
            assert_eq!(c, reference(1, &src[..len]));
            assert_eq!(dst, src[..len]);
            // SAFETY: `src` readable for `len` bytes.
            assert_eq!(unsafe { k.crc_update_raw(2, src.as_ptr(), len) }, reference(2, &src[..len]));
        }
    }
}

#[test]
fn free_functions_use_a_correct_kernel() {
    let src = pattern(4096, 11);
    let mut dst = vec![0u8; 4096];
    assert_eq!(copy_and_crc(5, &mut dst, &src), reference(5, &src));
    assert_eq!(dst, src);
    assert_eq!(crc_update(9, &src), reference(9, &src));
    assert_eq!(crc32(&src), crc32fast::hash(&src));
}

#[test]
#[should_panic(expected = "length mismatch")]
fn copy_with_unequal_lengths_panics() {
    let mut d = [0u8; 3];
    copy_and_crc(0, &mut d, &[1, 2]);
}

#[test]
fn combine_of_zero_runs_matches_hashing_the_zeros() {
    let a = pattern(100, 5);
    let zeros = vec![0u8; 1 << 20];
    for n in [0usize, 1, 3, 4, 7, 64, 4096, 9000, 65536, (1 << 20) - 1, 1 << 20] {
        let whole = {
            let mut h = crc32fast::Hasher::new();
            h.update(&a);
            h.update(&zeros[..n]);
            h.finalize()
        };
        assert_eq!(crc32_combine(crc32fast::hash(&a), crc32fast::hash(&zeros[..n]), n as u64), whole, "n {n}");
    }
}

/// The masked update against crc32fast of an explicitly masked copy, for kernel `k` and the
/// free function.
fn check_masked(k: Kernel, data: &[u8], mask: &Mask, init: u32) {
    let masked: Vec<u8> = data.iter().enumerate().map(|(j, &b)| b | if j < 64 { (mask[j / 16] >> (8 * (j % 16))) as u8 } else { 0 }).collect();
    let want = reference(init, &masked);
    assert_eq!(k.crc_update_masked(init, data, mask), want, "{} masked len {}", k.name(), data.len());
    assert_eq!(crc_update_masked(init, data, mask), want, "free masked len {}", data.len());
}

#[test]
fn masked_update_every_length_every_kernel() {
    let data = pattern(300, 11);
    // Every byte of every lane set once (the lane boundaries and partial tails included), and
    // the ICRC's own IPv4 mask shape.
    let mut masks: Vec<Mask> = (0..64).map(|j| { let mut m = [0u128; 4]; m[j / 16] = 0xA5 << (8 * (j % 16)); m }).collect();
    masks.push([(0xFF << 8) | (0xFF << 64) | (0xFFFF << 80), 0xFFFF << 80, 0xFF, 0]);
    masks.push([u128::MAX; 4]);
    for len in 0..=300 {
        for (i, m) in masks.iter().enumerate() {
            if i % 7 == len % 7 || i >= 64 {
                for k in Kernel::available() {
                    check_masked(k, &data[..len], m, (len as u32).wrapping_mul(0x9E37_79B9));
                }
            }
        }
    }
}

/// The ICRC's way of hashing a frame: the masked header prefix with `crc_update_masked`, the
/// payload from zero with `copy_and_crc` as it is gathered, joined with `crc32_combine` (and
/// `CrcShift`): equal to crc32fast over the masked header followed by the payload.
fn check_prefix_combine(k: Kernel, head: &[u8], mask: &Mask, payload: &[u8], init: u32) {
    let masked: Vec<u8> = head.iter().enumerate().map(|(j, &b)| b | if j < 64 { (mask[j / 16] >> (8 * (j % 16))) as u8 } else { 0 }).collect();
    let mut h = crc32fast::Hasher::new_with_initial(init);
    h.update(&masked);
    h.update(payload);
    let want = h.finalize();
    let ch = k.crc_update_masked(init, head, mask);
    let mut out = vec![0u8; payload.len()];
    let cp = k.copy_and_crc(0, &mut out, payload);
    assert_eq!(out, payload, "{} copy", k.name());
    assert_eq!(crc32_combine(ch, cp, payload.len() as u64), want, "{} head {} payload {}", k.name(), head.len(), payload.len());
    assert_eq!(CrcShift::new(payload.len() as u64).combine(ch, cp), want, "{} shift", k.name());
}

#[test]
fn header_prefix_combines_with_payload_every_kernel() {
    // IPv4/UDP/BTH (+RETH) masks as the ICRC's, heads of the data path's lengths.
    const MASK: Mask = [(0xFF << 8) | (0xFF << 64) | (0xFFFF << 80), 0xFFFF << 80, 0xFF, 0];
    let bytes = pattern(64 + 5000, 41);
    for k in Kernel::available() {
        for hl in [12usize, 40, 44, 48, 56, 64] {
            for pl in [0usize, 1, 8, 63, 64, 255, 256, 1024, 4096, 4999] {
                check_prefix_combine(k, &bytes[..hl], &MASK, &bytes[64..64 + pl], (hl * pl) as u32);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn header_prefix_combine_matches(head in proptest::collection::vec(any::<u8>(), 0..80), mask: [u128; 4], payload in proptest::collection::vec(any::<u8>(), 0..5000), init: u32) {
        for k in Kernel::available() {
            check_prefix_combine(k, &head, &mask, &payload, init);
        }
    }

    #[test]
    fn masked_update_matches_a_masked_copy(data in proptest::collection::vec(any::<u8>(), 0..400), mask: [u128; 4], init: u32) {
        for k in Kernel::available() {
            check_masked(k, &data, &mask, init);
        }
    }

    #[test]
    fn kernels_match_crc32fast(len in 0usize..=MAX, so in 0usize..64, doff in 0usize..64, init: u32, seed: u32) {
        let src = pattern(len + 64, seed);
        for k in Kernel::available() {
            check(k, &src, so, doff, len, init);
        }
    }

    #[test]
    fn chunked_updates_compose(data in proptest::collection::vec(any::<u8>(), 0..3000), cuts in proptest::collection::vec(0usize..3000, 0..6), init: u32) {
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
        cuts.sort_unstable();
        for k in Kernel::available() {
            let mut crc = init;
            let mut at = 0;
            let mut out = vec![0u8; data.len()];
            for &c in cuts.iter().chain(std::iter::once(&data.len())) {
                crc = k.copy_and_crc(crc, &mut out[at..c], &data[at..c]);
                at = c;
            }
            prop_assert_eq!(crc, reference(init, &data));
            prop_assert_eq!(&out, &data);
        }
    }

    #[test]
    fn combine_matches_crc32fast(a in proptest::collection::vec(any::<u8>(), 0..2000), b in proptest::collection::vec(any::<u8>(), 0..9000)) {
        let (ca, cb) = (crc32fast::hash(&a), crc32fast::hash(&b));
        let mut h = crc32fast::Hasher::new();
        h.update(&a);
        h.update(&b);
        let whole = h.finalize();
        prop_assert_eq!(crc32_combine(ca, cb, b.len() as u64), whole);
        prop_assert_eq!(CrcShift::new(b.len() as u64).combine(ca, cb), whole);
        let mut hc = crc32fast::Hasher::new();
        hc.update(&a);
        let mut hb = crc32fast::Hasher::new();
        hb.update(&b);
        hc.combine(&hb);
        prop_assert_eq!(hc.finalize(), whole);
    }

    #[test]
    fn combine_is_associative_for_huge_lengths(a: u32, b: u32, c: u32, nb in 0u64..(1 << 40), nc in 0u64..(1 << 40)) {
        // Any u32 is the CRC of some message of any length ≥ 4, so these are real CRCs.
        let left = crc32_combine(crc32_combine(a, b, nb), c, nc);
        let right = crc32_combine(a, crc32_combine(b, c, nc), nb + nc);
        prop_assert_eq!(left, right);
    }
}

#[test]
fn detection_finds_what_the_cpu_reports() {
    // The kernels are only trusted if they are actually exercised: on a CPU whose flags list
    // the features, the corresponding kernel must be available (and so tested above).
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return };
    let Some(flags) = info.lines().find(|l| l.starts_with("flags")) else { return };
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    if has("pclmulqdq") && has("sse4_1") && has("ssse3") {
        assert!(Kernel::pclmul().is_some());
    }
    if has("pclmulqdq") && has("sse4_1") && has("ssse3") && has("avx2") && has("vpclmulqdq") {
        assert!(Kernel::avx2().is_some());
    }
    if has("pclmulqdq") && has("avx512f") && has("avx512bw") && has("avx512vl") && has("vpclmulqdq") {
        assert!(Kernel::avx512().is_some());
    }
}
