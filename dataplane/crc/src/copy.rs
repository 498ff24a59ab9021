//! Short copies without `memcpy`: the data path's small moves (inline data, an 8-byte payload
//! placed in a memory region, a header template) are a few overlapping loads and stores,
//! inlined. A `memcpy` call costs a call and a size dispatch per copy, which for 8 bytes is
//! more than the copy, and glibc's takes a slow `rep movsb` path for some sizes on some CPUs.

use core::ptr::{read_unaligned as rd, write_unaligned as wr};

/// Longest copy done inline; longer ones go to `copy_nonoverlapping` (the data path's long
/// copies are `copy_and_crc`'s).
pub const SHORT_MAX: usize = 256;

/// Copy `src` into `dst`.
///
/// # Panics
/// If the lengths differ.
#[inline(always)]
pub fn copy_short(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_short: length mismatch");
    // SAFETY: two distinct Rust slices of the same length (a `&mut` never aliases a `&`).
    unsafe { copy_short_raw(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
}

/// [`copy_short`] through raw pointers, for memory that must not be referenced as a Rust slice
/// (registered memory).
///
/// # Safety
/// As `core::ptr::copy_nonoverlapping(src, dst, len)`: `src` valid for reads and `dst` for
/// writes of `len` bytes, the two ranges disjoint. No alignment needed.
#[inline(always)]
pub unsafe fn copy_short_raw(dst: *mut u8, src: *const u8, len: usize) {
    // Each arm moves the first and the last word of its size (they overlap when `len` is not
    // a multiple): all loads of an arm come before its stores.
    // SAFETY: every offset read and written below lies in `0..len`, inside both ranges by the
    // caller's contract; the accesses are unaligned reads and writes, which need no alignment.
    unsafe {
        if len > SHORT_MAX {
            core::ptr::copy_nonoverlapping(src, dst, len);
        } else if len > 32 {
            // 33..=256: 32-byte steps, the last one ending exactly at `len`.
            let mut i = 0;
            while i + 32 < len {
                let a: [u128; 2] = rd(src.add(i).cast());
                wr(dst.add(i).cast(), a);
                i += 32;
            }
            let b: [u128; 2] = rd(src.add(len - 32).cast());
            wr(dst.add(len - 32).cast(), b);
        } else if len >= 16 {
            let a: u128 = rd(src.cast());
            let b: u128 = rd(src.add(len - 16).cast());
            wr(dst.cast(), a);
            wr(dst.add(len - 16).cast(), b);
        } else if len >= 8 {
            let a: u64 = rd(src.cast());
            let b: u64 = rd(src.add(len - 8).cast());
            wr(dst.cast(), a);
            wr(dst.add(len - 8).cast(), b);
        } else if len >= 4 {
            let a: u32 = rd(src.cast());
            let b: u32 = rd(src.add(len - 4).cast());
            wr(dst.cast(), a);
            wr(dst.add(len - 4).cast(), b);
        } else if len > 0 {
            // 1..=3: first, middle, last byte (some the same).
            let (a, m, b) = (*src, *src.add(len / 2), *src.add(len - 1));
            *dst = a;
            *dst.add(len / 2) = m;
            *dst.add(len - 1) = b;
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn every_length_and_offset_copies_exactly_its_bytes() {
        let src: Vec<u8> = (0..400u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in 0..=SHORT_MAX + 20 {
            for off in [0usize, 1, 3, 7, 15, 31] {
                let mut dst = vec![0xEEu8; len + 64];
                copy_short(&mut dst[off..off + len], &src[off..off + len]);
                assert_eq!(&dst[off..off + len], &src[off..off + len], "len {len} off {off}");
                assert!(dst[..off].iter().all(|&b| b == 0xEE), "wrote before: len {len} off {off}");
                assert!(dst[off + len..].iter().all(|&b| b == 0xEE), "wrote after: len {len} off {off}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "length mismatch")]
    fn unequal_lengths_panic() {
        copy_short(&mut [0u8; 4], &[0u8; 5]);
    }
}
