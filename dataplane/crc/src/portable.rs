//! Portable kernel: slicing-by-8 (eight table lookups per 8 bytes), then at most one
//! slicing-by-4 step and 3 bytes, copying a word at a time with unaligned loads and stores (no
//! `memcpy` call).

use crate::gf::TABLES;

/// Fold `len` bytes at `src` into `crc` (zlib convention); with `COPY`, also store them at `dst`.
///
/// # Safety
/// `src` must be valid for reads of `len` bytes; with `COPY`, `dst` valid for writes of `len`
/// bytes and not overlapping `src`. Without `COPY`, `dst` is never used.
#[inline]
pub(crate) unsafe fn run<const COPY: bool>(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    let mut c = !crc;
    let mut i = 0;
    while i + 8 <= len {
        // SAFETY: `i + 8 <= len`: inside the caller's `src` range (unaligned read).
        let v = unsafe { core::ptr::read_unaligned(src.add(i).cast::<u64>()) };
        if COPY {
            // SAFETY: same range of `dst`, valid for writes and disjoint from `src` (caller).
            unsafe { core::ptr::write_unaligned(dst.add(i).cast::<u64>(), v) };
        }
        let w = u64::from_le(v) ^ u64::from(c);
        c = TABLES[7][(w & 0xFF) as usize]
            ^ TABLES[6][((w >> 8) & 0xFF) as usize]
            ^ TABLES[5][((w >> 16) & 0xFF) as usize]
            ^ TABLES[4][((w >> 24) & 0xFF) as usize]
            ^ TABLES[3][((w >> 32) & 0xFF) as usize]
            ^ TABLES[2][((w >> 40) & 0xFF) as usize]
            ^ TABLES[1][((w >> 48) & 0xFF) as usize]
            ^ TABLES[0][(w >> 56) as usize];
        i += 8;
    }
    if i + 4 <= len {
        // Slicing-by-4 for a 4..7-byte tail (header words such as an AETH): one step instead
        // of four dependent byte steps.
        // SAFETY: `i + 4 <= len`: inside the caller's `src` range (unaligned read).
        let v = unsafe { core::ptr::read_unaligned(src.add(i).cast::<u32>()) };
        if COPY {
            // SAFETY: same range of `dst`, valid for writes and disjoint from `src` (caller).
            unsafe { core::ptr::write_unaligned(dst.add(i).cast::<u32>(), v) };
        }
        let w = u32::from_le(v) ^ c;
        c = TABLES[3][(w & 0xFF) as usize]
            ^ TABLES[2][((w >> 8) & 0xFF) as usize]
            ^ TABLES[1][((w >> 16) & 0xFF) as usize]
            ^ TABLES[0][(w >> 24) as usize];
        i += 4;
    }
    while i < len {
        // SAFETY: `i < len`: inside `src`.
        let b = unsafe { *src.add(i) };
        if COPY {
            // SAFETY: inside `dst` (caller).
            unsafe { *dst.add(i) = b };
        }
        c = TABLES[0][((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8);
        i += 1;
    }
    !c
}

/// CRC of the bytes `src[i] | mask[i]` (the mask's 64 bytes little-endian in its lanes): the
/// masked head is hashed from a copy, the rest in place.
///
/// # Safety
/// `src` valid for reads of `len` bytes.
pub(crate) unsafe fn masked(crc: u32, src: *const u8, len: usize, mask: &crate::Mask) -> u32 {
    let mut head = [0u8; 64];
    let n = len.min(head.len());
    for (j, h) in head.iter_mut().enumerate().take(n) {
        // SAFETY: `j < n <= len`: inside `src`.
        *h = unsafe { *src.add(j) } | (mask[j / 16] >> (8 * (j % 16))) as u8;
    }
    // SAFETY: `head` holds `n` bytes; the rest is `src[n..len]`.
    unsafe { run::<false>(run::<false>(crc, core::ptr::null_mut(), head.as_ptr(), n), core::ptr::null_mut(), src.add(n), len - n) }
}
