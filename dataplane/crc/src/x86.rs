//! x86-64 kernels: PCLMULQDQ (eight 128-bit accumulators), AVX2 + VPCLMULQDQ (four 256-bit
//! accumulators, i.e. eight 128-bit lanes) and AVX-512 + VPCLMULQDQ (four 512-bit accumulators,
//! i.e. sixteen 128-bit lanes), after Gopal et al., "Fast CRC computation for
//! generic polynomials using PCLMULQDQ instruction" (Intel, 2009): each accumulator holds 128
//! bits of the message; folding it forward by D bits is two carry-less multiplies by
//! x^(D±32) mod P, XORed into the block D bits later; at the end the accumulators are folded
//! into one and reduced to 32 bits (Barrett).
//!
//! Each accumulator's chain is one multiply (latency 4–7 cycles by CPU) and two XORs per
//! step; the steps of different accumulators are independent, so with enough of them the loop
//! runs at the multiplier's throughput, not its latency. Eight 128-bit accumulators cover the
//! latency on every CPU with PCLMULQDQ (a multiply per cycle, latency 7: 16 multiplies per 9-cycle
//! chain); where the multiplier issues one every two cycles (AMD Zen 2/3) the 128-bit kernel is
//! bound at 4 bytes per cycle whatever the pipelining, and only the 256-bit multiply (two lanes
//! per instruction, same issue rate) goes further: 8 bytes per cycle.
//!
//! With `COPY` every block is stored to the destination from the register it was loaded into
//! and folded from, so the CRC always describes exactly the bytes written, even if the source
//! changes meanwhile (registered memory is written by clients at any time). No `memcpy` call:
//! the copy is the kernel's own loads and stores (glibc's `rep movsb` path is slow on some
//! sizes and CPUs).

use core::arch::x86_64::*;

use crate::gf::{fold_const, MU, P33};

/// (low, high) folding constants for a fold by `bits`: x^(bits+32) and x^(bits−32) mod P.
const fn keys(bits: u32) -> (i64, i64) {
    (fold_const(bits + 32) as i64, fold_const(bits - 32) as i64)
}
const K128: (i64, i64) = keys(128);
const K256: (i64, i64) = keys(256);
const K384: (i64, i64) = keys(384);
const K512: (i64, i64) = keys(512);
const K768: (i64, i64) = keys(768);
const K1024: (i64, i64) = keys(1024);
const K2048: (i64, i64) = keys(2048);
const K64: i64 = fold_const(64) as i64;
/// Below this length the AVX-512 kernel hands over to the PCLMUL one: measured on a Sapphire
/// Rapids core, a 64..255-byte update is 5–15 % slower with four 512-bit lanes to set up and
/// fold together than with four 128-bit ones (equal at 256, the 512-bit kernel ahead from 384).
const AVX512_MIN: usize = 256;
/// Below this length the AVX2 kernel hands over to the PCLMUL one. Measured on a Zen 3 core
/// (interleaved, best of 15): at 128..=224 bytes the four 256-bit accumulators were 20–50 %
/// ahead of the eight 128-bit ones (half the multiplies for the same bytes), so they start as
/// soon as there are 128 bytes to load.
const AVX2_MIN: usize = 128;
/// From this length the PCLMUL kernel starts with eight accumulators (128 bytes per step).
const PCLMUL8_MIN: usize = 128;
/// From this length on, the AVX-512 copy aligns its stores to the destination's cache lines.
const ALIGN_MIN: usize = 512;

#[inline]
#[target_feature(enable = "sse2")]
fn keys128(k: (i64, i64)) -> __m128i {
    _mm_set_epi64x(k.1, k.0)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn keys512(k: (i64, i64)) -> __m512i {
    _mm512_set_epi64(k.1, k.0, k.1, k.0, k.1, k.0, k.1, k.0)
}

/// `a` folded forward by the distance of `k`, XOR `b`.
#[inline]
#[target_feature(enable = "pclmulqdq")]
fn fold128(a: __m128i, b: __m128i, k: __m128i) -> __m128i {
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11)), b)
}

#[inline]
#[target_feature(enable = "avx")]
fn keys256(k: (i64, i64)) -> __m256i {
    _mm256_set_epi64x(k.1, k.0, k.1, k.0)
}

/// Both 128-bit lanes of `a` folded forward by the distance of `k`, XOR `b`.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn fold256(a: __m256i, b: __m256i, k: __m256i) -> __m256i {
    _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(a, k, 0x00), _mm256_clmulepi64_epi128(a, k, 0x11)), b)
}

#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn fold512(a: __m512i, b: __m512i, k: __m512i) -> __m512i {
    _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00), _mm512_clmulepi64_epi128(a, k, 0x11), b, 0x96)
}

/// Load 16 bytes at `s`; with `COPY` store them at `d`.
///
/// # Safety
/// `s` readable for 16 bytes; with `COPY`, `d` writable for 16 bytes.
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn mv128<const COPY: bool>(s: *const u8, d: *mut u8) -> __m128i {
    // SAFETY: caller: 16 readable bytes at `s` (unaligned load).
    let v = unsafe { _mm_loadu_si128(s.cast()) };
    if COPY {
        // SAFETY: caller: 16 writable bytes at `d`.
        unsafe { _mm_storeu_si128(d.cast(), v) };
    }
    v
}

/// Load 32 bytes at `s`; with `COPY` store them at `d`.
///
/// # Safety
/// `s` readable for 32 bytes; with `COPY`, `d` writable for 32 bytes.
#[inline]
#[target_feature(enable = "avx")]
unsafe fn mv256<const COPY: bool>(s: *const u8, d: *mut u8) -> __m256i {
    // SAFETY: caller: 32 readable bytes at `s` (unaligned load).
    let v = unsafe { _mm256_loadu_si256(s.cast()) };
    if COPY {
        // SAFETY: caller: 32 writable bytes at `d`.
        unsafe { _mm256_storeu_si256(d.cast(), v) };
    }
    v
}

/// Load 64 bytes at `s`; with `COPY` store them at `d`.
///
/// # Safety
/// `s` readable for 64 bytes; with `COPY`, `d` writable for 64 bytes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn mv512<const COPY: bool>(s: *const u8, d: *mut u8) -> __m512i {
    // SAFETY: caller: 64 readable bytes at `s`.
    let v = unsafe { _mm512_loadu_si512(s.cast()) };
    if COPY {
        // SAFETY: caller: 64 writable bytes at `d`.
        unsafe { _mm512_storeu_si512(d.cast(), v) };
    }
    v
}

/// The last `n` (1..=15) bytes: each source byte is read once, the register holds exactly the
/// bytes stored (zero-padded above `n`).
///
/// # Safety
/// `s` readable for `n` bytes; with `COPY`, `d` writable for `n` bytes, disjoint from `s`.
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn mv_partial<const COPY: bool>(s: *const u8, d: *mut u8, n: usize) -> __m128i {
    use core::ptr::{read_unaligned as rd, write_unaligned as wr};
    debug_assert!(n > 0 && n < 16);
    let (lo, hi): (u64, u64) = if n >= 8 {
        // Two overlapping words; the register takes bytes 0..8 from `a` and 8..n from `b`, and
        // `b` is stored before `a` so that the overlap in `d` holds `a`'s bytes too.
        // SAFETY: `0..8` and `n-8..n` lie inside the `n` readable / writable bytes.
        unsafe {
            let a = rd(s.cast::<u64>());
            let b = rd(s.add(n - 8).cast::<u64>());
            if COPY {
                wr(d.add(n - 8).cast::<u64>(), b);
                wr(d.cast::<u64>(), a);
            }
            (a, if n == 8 { 0 } else { b >> (8 * (16 - n)) })
        }
    } else if n >= 4 {
        // SAFETY: as above with 4-byte words.
        unsafe {
            let a = rd(s.cast::<u32>());
            let b = rd(s.add(n - 4).cast::<u32>());
            if COPY {
                wr(d.add(n - 4).cast::<u32>(), b);
                wr(d.cast::<u32>(), a);
            }
            let top = if n == 4 { 0 } else { u64::from(b >> (8 * (8 - n))) << 32 };
            (u64::from(a) | top, 0)
        }
    } else {
        // 1..=3 bytes, unrolled (a byte loop could be turned into a `memcpy` call).
        let mut v = 0u64;
        for j in [0, 1, 2] {
            if j < n {
                // SAFETY: `j < n`: inside both ranges.
                unsafe {
                    let b = *s.add(j);
                    if COPY {
                        *d.add(j) = b;
                    }
                    v |= u64::from(b) << (8 * j);
                }
            }
        }
        (v, 0)
    };
    _mm_set_epi64x(hi as i64, lo as i64)
}

/// Byte indices 0..16.
#[inline]
#[target_feature(enable = "sse2")]
fn seq128() -> __m128i {
    _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
}

/// Shuffle indices that move bytes 0..n of a register to 16 − n .. 16 and zero the bytes
/// below (negative indices select zero).
#[inline]
#[target_feature(enable = "sse2")]
fn shift_up(n: usize) -> __m128i {
    _mm_add_epi8(seq128(), _mm_set1_epi8(n as i8 - 16))
}

/// Append the `n` (1..=15) bytes in the low bytes of `part` to the accumulator `x`.
#[inline]
#[target_feature(enable = "pclmulqdq,ssse3")]
fn fold_partial(x: __m128i, part: __m128i, n: usize) -> __m128i {
    fold_top(x, _mm_shuffle_epi8(part, shift_up(n)), n)
}

/// Append `n` (1..=15) bytes to the accumulator `x`, given in the top `n` bytes of `top` (the
/// bytes below zero).
#[inline]
#[target_feature(enable = "pclmulqdq,ssse3")]
fn fold_top(x: __m128i, top: __m128i, n: usize) -> __m128i {
    // The stream `x ‖ part` is re-cut as `0^(16-n) ‖ x[..n]` (folded by 128 bits) and
    // `x[n..] ‖ part`: two byte shuffles of `x` with indices built from n (negative → zero).
    let shl = shift_up(n);
    let shr = _mm_xor_si128(shl, _mm_set1_epi8(-128));
    let overflow = _mm_shuffle_epi8(x, shl);
    let rest = _mm_xor_si128(_mm_shuffle_epi8(x, shr), top);
    fold128(overflow, rest, keys128(K128))
}

/// 128-bit accumulator → CRC (zlib convention).
#[inline]
#[target_feature(enable = "pclmulqdq,sse4.1")]
fn reduce(x: __m128i) -> u32 {
    let mask32 = _mm_set_epi32(0, 0, 0, -1);
    // 128 → 96 → 64 bits, then Barrett: T1 = low32 · μ, T2 = low32(T1) · P, CRC = (x ^ T2)[32..64].
    let x = _mm_xor_si128(_mm_clmulepi64_si128(x, keys128(K128), 0x10), _mm_srli_si128(x, 8));
    let x = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x, mask32), _mm_set_epi64x(0, K64), 0x00), _mm_srli_si128(x, 4));
    let pu = _mm_set_epi64x(MU as i64, P33 as i64);
    let t1 = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), pu, 0x10);
    let t2 = _mm_clmulepi64_si128(_mm_and_si128(t1, mask32), pu, 0x00);
    !(_mm_extract_epi32(_mm_xor_si128(x, t2), 1) as u32)
}

/// The initial value `ncrc` (= !crc, 4 bytes little-endian) placed at byte `o` (1..=63) of a
/// 128-byte stream of two 64-byte blocks, as two vectors (the second is zero unless `o > 60`).
#[inline]
#[target_feature(enable = "avx512f")]
fn init_at(ncrc: u32, o: usize) -> (__m512i, __m512i) {
    let (lane, off) = (o / 16, o % 16);
    let x = u128::from(ncrc) << (8 * off);
    // The bytes that fall past this 16-byte lane, into the next one.
    let spill = if off > 12 { u128::from(ncrc) >> (8 * (16 - off)) } else { 0 };
    let v = |a: u128| _mm_set_epi64x((a >> 64) as i64, a as i64);
    let i0 = _mm512_maskz_broadcast_i32x4(0xF << (4 * lane), v(x));
    if spill == 0 {
        (i0, _mm512_setzero_si512())
    } else if lane < 3 {
        (_mm512_or_si512(i0, _mm512_maskz_broadcast_i32x4(0xF << (4 * (lane + 1)), v(spill))), _mm512_setzero_si512())
    } else {
        (i0, _mm512_maskz_broadcast_i32x4(0xF, v(spill)))
    }
}

/// Carry-less 32×32 → 63-bit product.
///
/// # Safety
/// The CPU must have PCLMULQDQ.
#[target_feature(enable = "pclmulqdq")]
pub(crate) unsafe fn clmul32(a: u32, b: u32) -> u64 {
    _mm_cvtsi128_si64(_mm_clmulepi64_si128(_mm_cvtsi32_si128(a as i32), _mm_cvtsi32_si128(b as i32), 0x00)) as u64
}

/// PCLMULQDQ kernel: fold (and with `COPY` copy) `len` bytes.
///
/// # Safety
/// The CPU must have PCLMULQDQ, SSE4.1 and SSSE3. `src` readable for `len` bytes; with `COPY`,
/// `dst` writable for `len` bytes and disjoint from `src` (without, `dst` is never accessed).
#[target_feature(enable = "pclmulqdq,sse4.1,ssse3")]
pub(crate) unsafe fn pclmul<const COPY: bool>(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    // SAFETY: forwarded contract; MASK is off, so the mask is never read.
    unsafe { pclmul_with::<COPY, false>(crc, dst, src, len, &crate::NO_MASK) }
}

/// PCLMULQDQ kernel over the bytes `src[i] | mask[i]` (the mask's 64 bytes little-endian in its
/// lanes, zero past them): the ICRC's masked header bytes are ORed in registers as they are
/// loaded, with no masked copy of the headers to hash (and no store-forwarding stall on one).
///
/// # Safety
/// As [`pclmul`] without a destination.
#[target_feature(enable = "pclmulqdq,sse4.1,ssse3")]
pub(crate) unsafe fn pclmul_masked(crc: u32, src: *const u8, len: usize, mask: &crate::Mask) -> u32 {
    // SAFETY: forwarded contract; without COPY the destination is never accessed.
    unsafe { pclmul_with::<false, true>(crc, core::ptr::null_mut(), src, len, mask) }
}

/// The body of [`pclmul`] and [`pclmul_masked`]; with `MASK`, lane `j` of `mask` is ORed into
/// the 16 bytes at offset 16·j as they are loaded (only the first four blocks have lanes).
///
/// # Safety
/// As [`pclmul`]; with `MASK`, not `COPY`.
#[inline]
#[target_feature(enable = "pclmulqdq,sse4.1,ssse3")]
unsafe fn pclmul_with<const COPY: bool, const MASK: bool>(crc: u32, dst: *mut u8, src: *const u8, len: usize, mask: &crate::Mask) -> u32 {
    debug_assert!(!(COPY && MASK));
    // Only the first `r` (1..=15) bytes of mask lane `j`: a partial block's register is zero
    // above them.
    // A mask word as a register (lane byte 0 = the block's first byte).
    let reg = |w: u128| -> __m128i { _mm_set_epi64x((w >> 64) as i64, w as i64) };
    let lane_head = |j: usize, r: usize| -> __m128i { reg(mask[j] & (u128::MAX >> (8 * (16 - r)))) };
    if len < 16 {
        if !COPY && len >= 4 {
            // One block: the `len` bytes, the initial CRC folded into their first four,
            // moved to the top of the register above 16 − len zero bytes (leading zeros
            // leave the remainder as it is), then reduced. A BTH (12 bytes) costs a shuffle
            // and the reduction, not twelve table steps.
            // SAFETY: `src` readable for `len` bytes (caller); no destination without COPY.
            let mut v = unsafe { mv_partial::<false>(src, core::ptr::null_mut(), len) };
            if MASK {
                v = _mm_or_si128(v, lane_head(0, len));
            }
            return reduce(_mm_shuffle_epi8(_mm_xor_si128(v, _mm_cvtsi32_si128(!crc as i32)), shift_up(len)));
        }
        if MASK && len > 0 {
            // 1..=3 bytes: the masked bytes made in a register and stored whole (the portable
            // kernel's loads from them are forwarded from that one store).
            // SAFETY: `src` readable for `len` bytes (caller); no destination without COPY.
            let v = _mm_or_si128(unsafe { mv_partial::<false>(src, core::ptr::null_mut(), len) }, lane_head(0, len));
            let mut b = [0u8; 16];
            // SAFETY: `b` is 16 writable bytes.
            unsafe { _mm_storeu_si128(b.as_mut_ptr().cast(), v) };
            // SAFETY: `b` holds `len` readable bytes.
            return unsafe { crate::portable::run::<false>(crc, core::ptr::null_mut(), b.as_ptr(), len) };
        }
        // SAFETY: the caller's contract is the portable kernel's.
        return unsafe { crate::portable::run::<COPY>(crc, dst, src, len) };
    }
    macro_rules! ld {
        ($o:expr) => {
            // SAFETY: every use below has `$o + 16 <= len`: inside both ranges.
            unsafe { mv128::<COPY>(src.add($o), dst.wrapping_add($o)) }
        };
    }
    // The mask lane for the block at byte `o` (zero past the lanes, or without MASK).
    let lane = |o: usize| -> __m128i {
        match mask.get(o / 16) {
            Some(&w) if MASK => reg(w),
            _ => _mm_setzero_si128(),
        }
    };
    let init = _mm_cvtsi32_si128(!crc as i32);
    let mut i;
    let mut x;
    if len >= 64 {
        let (mut x0, mut x1, mut x2, mut x3) = if MASK {
            (_mm_xor_si128(_mm_or_si128(ld!(0), lane(0)), init), _mm_or_si128(ld!(16), lane(16)), _mm_or_si128(ld!(32), lane(32)), _mm_or_si128(ld!(48), lane(48)))
        } else {
            (_mm_xor_si128(ld!(0), init), ld!(16), ld!(32), ld!(48))
        };
        i = 64;
        let k = keys128(K512);
        if len >= PCLMUL8_MIN {
            // Eight accumulators, 128 bytes per step (the mask has no lanes past byte 64).
            let (mut x4, mut x5, mut x6, mut x7) = (ld!(64), ld!(80), ld!(96), ld!(112));
            i = 128;
            let k8 = keys128(K1024);
            while len - i >= 128 {
                x0 = fold128(x0, ld!(i), k8);
                x1 = fold128(x1, ld!(i + 16), k8);
                x2 = fold128(x2, ld!(i + 32), k8);
                x3 = fold128(x3, ld!(i + 48), k8);
                x4 = fold128(x4, ld!(i + 64), k8);
                x5 = fold128(x5, ld!(i + 80), k8);
                x6 = fold128(x6, ld!(i + 96), k8);
                x7 = fold128(x7, ld!(i + 112), k8);
                i += 128;
            }
            // Eight → four: accumulator j folded by 512 bits lands on j + 4 (independent).
            (x0, x1, x2, x3) = (fold128(x0, x4, k), fold128(x1, x5, k), fold128(x2, x6, k), fold128(x3, x7, k));
        }
        while len - i >= 64 {
            x0 = fold128(x0, ld!(i), k);
            x1 = fold128(x1, ld!(i + 16), k);
            x2 = fold128(x2, ld!(i + 32), k);
            x3 = fold128(x3, ld!(i + 48), k);
            i += 64;
        }
        // (A chain, but only its XORs wait: every multiply's input is at hand. A tree of
        // three independent folds measured no faster on a 64-byte header.)
        x = fold128(x0, fold128(x1, fold128(x2, x3, keys128(K128)), keys128(K256)), keys128(K384));
    } else {
        x = if MASK { _mm_xor_si128(_mm_or_si128(ld!(0), lane(0)), init) } else { _mm_xor_si128(ld!(0), init) };
        i = 16;
    }
    let k = keys128(K128);
    while len - i >= 16 {
        let v = if MASK { _mm_or_si128(ld!(i), lane(i)) } else { ld!(i) };
        x = fold128(x, v, k);
        i += 16;
    }
    let r = len - i;
    if r > 0 && !COPY {
        // The last 16 bytes in one load (they overlap bytes already folded, which are dropped:
        // the register keeps its top `r` bytes, those `fold_partial` wants there). A copy
        // cannot do this: it would store source bytes read twice, which a client may change
        // between the reads.
        // SAFETY: `len >= 16` here (`i >= 16`): bytes len − 16 .. len lie inside `src`.
        let mut last = unsafe { _mm_loadu_si128(src.add(len - 16).cast()) };
        if MASK && len <= 64 {
            // The mask's bytes at the same offsets, from its 64 bytes in memory (lanes are
            // little-endian u128s: byte `j` of the mask is byte j % 16 of lane j / 16).
            // SAFETY: `len - 16 + 16 <= 64`: inside the mask's 64 bytes.
            last = _mm_or_si128(last, unsafe { _mm_loadu_si128(mask.as_ptr().cast::<u8>().add(len - 16).cast()) });
        }
        let top = _mm_cmpgt_epi8(_mm_add_epi8(seq128(), _mm_set1_epi8(r as i8 - 16)), _mm_set1_epi8(-1));
        return reduce(fold_top(x, _mm_and_si128(last, top), r));
    }
    if r > 0 {
        // SAFETY: the last `r` bytes of both ranges.
        let mut part = unsafe { mv_partial::<COPY>(src.add(i), dst.wrapping_add(i), r) };
        if MASK && i / 16 < mask.len() {
            part = _mm_or_si128(part, lane_head(i / 16, r));
        }
        x = fold_partial(x, part, r);
    }
    reduce(x)
}

/// AVX2 + VPCLMULQDQ kernel: fold (and with `COPY` copy) `len` bytes, 128 per iteration in
/// four 256-bit accumulators (no AVX-512 needed: AMD Zen 3, Intel Alder Lake and later cores).
///
/// # Safety
/// The CPU must have AVX2, VPCLMULQDQ, PCLMULQDQ, SSE4.1 and SSSE3. Pointer contract as
/// [`pclmul`].
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.1,ssse3")]
pub(crate) unsafe fn avx2<const COPY: bool>(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    if len < AVX2_MIN {
        // SAFETY: same contract, subset of the features.
        return unsafe { pclmul::<COPY>(crc, dst, src, len) };
    }
    macro_rules! ld {
        ($o:expr) => {
            // SAFETY: every use below has `$o + 32 <= len`: inside both ranges.
            unsafe { mv256::<COPY>(src.add($o), dst.wrapping_add($o)) }
        };
    }
    let init = _mm256_zextsi128_si256(_mm_cvtsi32_si128(!crc as i32));
    let (mut v0, mut v1, mut v2, mut v3) = (_mm256_xor_si256(ld!(0), init), ld!(32), ld!(64), ld!(96));
    let mut i = 128;
    let k = keys256(K1024);
    while len - i >= 128 {
        v0 = fold256(v0, ld!(i), k);
        v1 = fold256(v1, ld!(i + 32), k);
        v2 = fold256(v2, ld!(i + 64), k);
        v3 = fold256(v3, ld!(i + 96), k);
        i += 128;
    }
    // Four → one: accumulator j folded by (3 − j)·256 bits, the three multiplies independent.
    let t = _mm256_xor_si256(fold256(v0, v3, keys256(K768)), fold256(v1, _mm256_setzero_si256(), keys256(K512)));
    let k256 = keys256(K256);
    let mut v = fold256(v2, t, k256);
    while len - i >= 32 {
        v = fold256(v, ld!(i), k256);
        i += 32;
    }
    // Two lanes → one: the low (earlier) lane folded by 128 bits onto the high one.
    let k = keys128(K128);
    let mut x = fold128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1), k);
    if len - i >= 16 {
        // SAFETY: `i + 16 <= len`.
        x = fold128(x, unsafe { mv128::<COPY>(src.add(i), dst.wrapping_add(i)) }, k);
        i += 16;
    }
    let r = len - i;
    if r > 0 {
        if COPY {
            // SAFETY: the last `r` bytes of both ranges; each source byte read once.
            let part = unsafe { mv_partial::<COPY>(src.add(i), dst.wrapping_add(i), r) };
            x = fold_partial(x, part, r);
        } else {
            // The last 16 bytes in one load, the ones already folded dropped (as in `pclmul`).
            // SAFETY: `len >= 16`: bytes len − 16 .. len lie inside `src`.
            let last = unsafe { _mm_loadu_si128(src.add(len - 16).cast()) };
            let top = _mm_cmpgt_epi8(_mm_add_epi8(seq128(), _mm_set1_epi8(r as i8 - 16)), _mm_set1_epi8(-1));
            x = fold_top(x, _mm_and_si128(last, top), r);
        }
    }
    reduce(x)
}

/// AVX-512 + VPCLMULQDQ kernel: fold (and with `COPY` copy) `len` bytes, 256 per iteration.
///
/// # Safety
/// The CPU must have AVX512F, AVX512BW, AVX512VL, VPCLMULQDQ, PCLMULQDQ, SSE4.1 and SSSE3.
/// Pointer contract as [`pclmul`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vpclmulqdq,pclmulqdq,sse4.1,ssse3")]
pub(crate) unsafe fn avx512<const COPY: bool>(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    if len < AVX512_MIN {
        // SAFETY: same contract, subset of the features.
        return unsafe { pclmul::<COPY>(crc, dst, src, len) };
    }
    macro_rules! ld {
        ($o:expr) => {
            // SAFETY: every use below has `$o + 64 <= len`: inside both ranges.
            unsafe { mv512::<COPY>(src.add($o), dst.wrapping_add($o)) }
        };
    }
    // The first 64-byte block, the value to XOR into the block after it, and where that block
    // starts. Normally src[0..64] with the initial CRC folded into its first 4 bytes. A copy
    // whose destination is not 64-byte aligned starts instead with a virtual block of
    // 64 − head zero bytes followed by the `head` bytes up to the next aligned destination
    // (one masked load and store), so that every later 64-byte store is aligned (a store across
    // two cache lines costs two). Leading zeros do not change the CRC: the initial CRC is folded
    // in at the first real byte, which may straddle into the next block.
    let head = if COPY && len >= ALIGN_MIN { (dst as usize).wrapping_neg() & 63 } else { 0 };
    let zero = _mm512_setzero_si512();
    let (first, carry, start) = if head == 0 {
        (_mm512_xor_si512(ld!(0), _mm512_zextsi128_si512(_mm_cvtsi32_si128(!crc as i32))), zero, 64)
    } else {
        let m: __mmask64 = !0u64 << (64 - head);
        // SAFETY: only the lanes selected by `m` are accessed (masked-off lanes neither read,
        // write nor fault): bytes 64 − head .. 64 of the block, i.e. src[0..head] and
        // dst[0..head], inside both ranges (`head < 64 <= len`).
        let p = unsafe { _mm512_maskz_loadu_epi8(m, src.wrapping_sub(64 - head).cast()) };
        // SAFETY: as above.
        unsafe { _mm512_mask_storeu_epi8(dst.wrapping_sub(64 - head).cast(), m, p) };
        let (i0, i1) = init_at(!crc, 64 - head);
        (_mm512_xor_si512(p, i0), i1, head)
    };
    let k512 = keys512(K512);
    let mut i;
    let mut v;
    if len - start >= 192 {
        let (mut v0, mut v1, mut v2, mut v3) = (first, _mm512_xor_si512(ld!(start), carry), ld!(start + 64), ld!(start + 128));
        i = start + 192;
        let k = keys512(K2048);
        while len - i >= 256 {
            v0 = fold512(v0, ld!(i), k);
            v1 = fold512(v1, ld!(i + 64), k);
            v2 = fold512(v2, ld!(i + 128), k);
            v3 = fold512(v3, ld!(i + 192), k);
            i += 256;
        }
        v = fold512(fold512(fold512(v0, v1, k512), v2, k512), v3, k512);
    } else {
        // Only without a head (ALIGN_MIN leaves a headed copy ≥ 4 blocks): nothing to carry.
        debug_assert_eq!(head, 0);
        v = first;
        i = start;
    }
    while len - i >= 64 {
        v = fold512(v, ld!(i), k512);
        i += 64;
    }
    // Four lanes → one: lane j folded by (3 − j)·128 bits, lane 3 as is, all XORed.
    let kl = _mm512_set_epi64(0, 0, K128.1, K128.0, K256.1, K256.0, K384.1, K384.0);
    let t = _mm512_xor_si512(_mm512_clmulepi64_epi128(v, kl, 0x00), _mm512_clmulepi64_epi128(v, kl, 0x11));
    let t = _mm512_mask_blend_epi64(0xC0, t, v);
    let y = _mm256_xor_si256(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
    let mut x = _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
    let k = keys128(K128);
    while len - i >= 16 {
        // SAFETY: `i + 16 <= len`.
        x = fold128(x, unsafe { mv128::<COPY>(src.add(i), dst.wrapping_add(i)) }, k);
        i += 16;
    }
    let r = len - i;
    if r > 0 {
        let m: __mmask16 = (1u16 << r) - 1;
        // SAFETY: the masked load reads only the last `r` bytes of `src` (masked-off bytes are
        // not accessed and cannot fault); the masked store writes only the last `r` of `dst`.
        let part = unsafe { _mm_maskz_loadu_epi8(m, src.add(i).cast()) };
        if COPY {
            // SAFETY: see above.
            unsafe { _mm_mask_storeu_epi8(dst.wrapping_add(i).cast(), m, part) };
        }
        x = fold_partial(x, part, r);
    }
    reduce(x)
}
