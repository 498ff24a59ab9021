//! pmrxe-crc: the CRC-32 of the RoCEv2 ICRC (the Ethernet/zlib CRC: reflected polynomial
//! 0xEDB88320, initial value and final XOR 0xFFFFFFFF) with the operations a software RoCE data
//! path needs to touch each payload byte once per side:
//!
//! * [`copy_and_crc`] copies `src` to `dst` while folding the CRC of the bytes (gather into the
//!   frame on send, scatter into the memory region on receive). It never calls `memcpy`: the
//!   copy is the kernel's own vector loads and stores, and the CRC is of the bytes stored;
//! * [`crc_update`] folds bytes without copying; [`crc_update_masked`] folds them with some
//!   bytes of the first 64 ORed with ones as they are loaded (the ICRC's masked header fields,
//!   with no masked copy to make);
//! * [`copy_short`] copies a few bytes without `memcpy` (inline loads and stores);
//! * [`crc32_combine`] gives CRC(A ‖ B) from CRC(A), CRC(B) and |B|, so the CRC of a frame
//!   prefix (masked IP/UDP headers) can be joined with that of the rest computed earlier.
//!
//! CRC values follow zlib (and `crc32fast::Hasher::new_with_initial`): the CRC of nothing is 0,
//! and `crc_update(crc_update(0, a), b)` is the CRC of `a ‖ b`.
//!
//! # Kernels and dispatch
//! Three implementations, each usable on its own through [`Kernel`] (the tests check every one
//! the CPU has): [`Kernel::AVX512`] (AVX-512 + VPCLMULQDQ: four 512-bit accumulators, 256 bytes
//! per iteration), [`Kernel::PCLMUL`] (four 128-bit accumulators) and the portable
//! slicing-by-8 kernel. The free functions use [`Kernel::best`], detected once per process
//! (`PMRXE_CRC_KERNEL=portable|pclmul|avx512` forces a slower one, for measurements).
//!
//! # Safety
//! The only `unsafe` is in the SIMD kernels (intrinsics behind runtime feature detection), the
//! short copy's unaligned loads and stores, and in [`Kernel::copy_and_crc_raw`] and
//! [`copy_short_raw`], whose pointer contract is that of `ptr::copy_nonoverlapping`.
#![warn(missing_docs, missing_debug_implementations)]

mod copy;
mod gf;
mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use core::sync::atomic::{AtomicU8, Ordering};

pub use copy::{copy_short, copy_short_raw, SHORT_MAX};

/// One CRC-32 implementation the CPU can run. Only constructible for implementations the running
/// CPU supports, so every method is safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel(Kind);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Portable = 1,
    #[cfg(target_arch = "x86_64")]
    Pclmul = 2,
    #[cfg(target_arch = "x86_64")]
    Avx512 = 3,
}

/// Which kernel [`Kernel::best`] returns: 0 until detected.
static BEST: AtomicU8 = AtomicU8::new(0);

impl Kernel {
    /// The portable slicing-by-8 kernel (always available).
    pub const PORTABLE: Kernel = Kernel(Kind::Portable);

    /// The PCLMULQDQ kernel, if this CPU has PCLMULQDQ, SSE4.1 and SSSE3.
    pub fn pclmul() -> Option<Kernel> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("pclmulqdq")
                && std::is_x86_feature_detected!("sse4.1")
                && std::is_x86_feature_detected!("ssse3")
            {
                return Some(Kernel(Kind::Pclmul));
            }
        }
        None
    }

    /// The AVX-512 kernel, if this CPU has AVX512F/BW/VL and VPCLMULQDQ (and what
    /// [`Kernel::pclmul`] needs).
    pub fn avx512() -> Option<Kernel> {
        #[cfg(target_arch = "x86_64")]
        {
            if Self::pclmul().is_some()
                && std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vl")
                && std::is_x86_feature_detected!("vpclmulqdq")
            {
                return Some(Kernel(Kind::Avx512));
            }
        }
        None
    }

    /// Every kernel this CPU can run, slowest first.
    pub fn available() -> impl Iterator<Item = Kernel> {
        [Some(Self::PORTABLE), Self::pclmul(), Self::avx512()].into_iter().flatten()
    }

    /// A kernel by [`name`](Kernel::name), if this CPU can run it.
    pub fn by_name(name: &str) -> Option<Kernel> {
        Self::available().find(|k| k.name() == name)
    }

    /// The fastest kernel this CPU has (detected once; `PMRXE_CRC_KERNEL` may name a slower one).
    #[inline]
    pub fn best() -> Kernel {
        match BEST.load(Ordering::Relaxed) {
            1 => Kernel(Kind::Portable),
            #[cfg(target_arch = "x86_64")]
            2 => Kernel(Kind::Pclmul),
            #[cfg(target_arch = "x86_64")]
            3 => Kernel(Kind::Avx512),
            _ => Self::detect(),
        }
    }

    #[cold]
    fn detect() -> Kernel {
        let forced = std::env::var("PMRXE_CRC_KERNEL").ok().and_then(|n| Self::by_name(&n));
        let k = forced.or_else(|| Self::available().last()).unwrap_or(Self::PORTABLE);
        BEST.store(k.0 as u8, Ordering::Relaxed);
        k
    }

    /// `"portable"`, `"pclmul"` or `"avx512"`.
    pub fn name(self) -> &'static str {
        match self.0 {
            Kind::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Kind::Pclmul => "pclmul",
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => "avx512",
        }
    }

    /// Fold `data` into `crc`.
    #[inline]
    pub fn crc_update(self, crc: u32, data: &[u8]) -> u32 {
        // SAFETY: `data` is readable for its length; without COPY the destination is unused.
        unsafe { self.run::<false>(crc, core::ptr::null_mut(), data.as_ptr(), data.len()) }
    }

    /// [`crc_update_masked`] with this kernel (the AVX-512 one masks with its PCLMUL part:
    /// masked inputs are headers, shorter than where its wide lanes pay off).
    pub fn crc_update_masked(self, crc: u32, data: &[u8], mask: &Mask) -> u32 {
        match self.0 {
            // SAFETY: `data` is readable for its length.
            Kind::Portable => unsafe { portable::masked(crc, data.as_ptr(), data.len(), mask) },
            // SAFETY: a `Kernel(Pclmul)` or `Kernel(Avx512)` exists only if `pclmul()` detected
            // the features; `data` is readable for its length.
            #[cfg(target_arch = "x86_64")]
            Kind::Pclmul | Kind::Avx512 => unsafe { x86::pclmul_masked(crc, data.as_ptr(), data.len(), mask) },
        }
    }

    /// Copy `src` into `dst` while folding the bytes into `crc`; returns the new CRC.
    ///
    /// # Panics
    /// If the lengths differ.
    #[inline]
    pub fn copy_and_crc(self, crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
        assert_eq!(dst.len(), src.len(), "copy_and_crc: length mismatch");
        // SAFETY: two distinct Rust slices of the same length (a `&mut` never aliases a `&`).
        unsafe { self.run::<true>(crc, dst.as_mut_ptr(), src.as_ptr(), src.len()) }
    }

    /// [`copy_and_crc`](Kernel::copy_and_crc) through raw pointers, for memory that must not be
    /// referenced as a Rust slice (registered memory written concurrently by clients). The CRC
    /// is of the bytes stored at `dst`, each source byte being read once.
    ///
    /// # Safety
    /// As `core::ptr::copy_nonoverlapping(src, dst, len)`: `src` valid for reads and `dst` for
    /// writes of `len` bytes, the two ranges disjoint. No alignment needed.
    #[inline]
    pub unsafe fn copy_and_crc_raw(self, crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
        // SAFETY: forwarded contract.
        unsafe { self.run::<true>(crc, dst, src, len) }
    }

    /// [`crc_update`](Kernel::crc_update) through a raw pointer.
    ///
    /// # Safety
    /// `src` valid for reads of `len` bytes.
    #[inline]
    pub unsafe fn crc_update_raw(self, crc: u32, src: *const u8, len: usize) -> u32 {
        // SAFETY: forwarded contract; no destination.
        unsafe { self.run::<false>(crc, core::ptr::null_mut(), src, len) }
    }

    /// # Safety
    /// `src` readable for `len`; with COPY, `dst` writable for `len` and disjoint from `src`.
    #[inline]
    unsafe fn run<const COPY: bool>(self, crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
        match self.0 {
            // SAFETY: forwarded pointer contract.
            Kind::Portable => unsafe { portable::run::<COPY>(crc, dst, src, len) },
            // SAFETY: a `Kernel(Pclmul)` exists only if `pclmul()` detected the features.
            #[cfg(target_arch = "x86_64")]
            Kind::Pclmul => unsafe { x86::pclmul::<COPY>(crc, dst, src, len) },
            // SAFETY: a `Kernel(Avx512)` exists only if `avx512()` detected the features.
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => unsafe { x86::avx512::<COPY>(crc, dst, src, len) },
        }
    }
}

/// Bytes to OR into the first 64 bytes of a [`crc_update_masked`] input: byte `j` is
/// `mask[j / 16] >> (8 · (j % 16))` (16-byte little-endian lanes).
pub type Mask = [u128; 4];

/// The empty mask.
pub(crate) const NO_MASK: Mask = [0; 4];

/// Fold into `crc` the bytes of `data` with `mask` ORed into its first 64 (the RoCE ICRC
/// hashes some header bytes as ones): no masked copy of the bytes is made.
#[inline]
pub fn crc_update_masked(crc: u32, data: &[u8], mask: &Mask) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if BEST.load(Ordering::Relaxed) >= 2 {
        // SAFETY: BEST holds 2 or 3 only after `pclmul()` detected PCLMULQDQ, SSE4.1 and
        // SSSE3; `data` is readable for its length.
        return unsafe { x86::pclmul_masked(crc, data.as_ptr(), data.len(), mask) };
    }
    Kernel::best().crc_update_masked(crc, data, mask)
}

/// Fold `data` into `crc` with the best kernel.
#[inline]
pub fn crc_update(crc: u32, data: &[u8]) -> u32 {
    // The detected kernel's entry point straight from the one load (a tail call: short
    // updates, the frames' headers, paid a stack frame here for the detection path).
    #[cfg(target_arch = "x86_64")]
    match BEST.load(Ordering::Relaxed) {
        // SAFETY: BEST holds 3 only after `avx512()` detected its features; `data` is readable
        // for its length and, without COPY, the destination is never accessed.
        3 => return unsafe { x86::avx512::<false>(crc, core::ptr::null_mut(), data.as_ptr(), data.len()) },
        // SAFETY: as above, with `pclmul()`.
        2 => return unsafe { x86::pclmul::<false>(crc, core::ptr::null_mut(), data.as_ptr(), data.len()) },
        _ => {}
    }
    crc_update_detect(crc, data)
}

/// [`crc_update`] through [`Kernel::best`] (first call, or the portable kernel).
#[inline(never)]
fn crc_update_detect(crc: u32, data: &[u8]) -> u32 {
    Kernel::best().crc_update(crc, data)
}

/// Copy `src` into `dst` while folding the bytes into `crc`, with the best kernel.
///
/// # Panics
/// If the lengths differ.
#[inline]
pub fn copy_and_crc(crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    Kernel::best().copy_and_crc(crc, dst, src)
}

/// The CRC of `data` (zlib's `crc32(0, data)`).
#[inline]
pub fn crc32(data: &[u8]) -> u32 {
    crc_update(0, data)
}

/// CRC(A ‖ B) from `crc_a` = CRC(A), `crc_b` = CRC(B) and `len_b` = |B| in bytes (zlib's
/// `crc32_combine`): `crc_a · x^(8·len_b) ⊕ crc_b` mod P, one multiplication per set bit of
/// `len_b`. For a fixed length, [`CrcShift`] precomputes the power.
#[inline]
pub fn crc32_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    CrcShift::new(len_b).combine(crc_a, crc_b)
}

/// x^(8·len) mod P for one length: combining with it costs one multiplication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrcShift(u32);

impl CrcShift {
    /// The shift for appending `len` bytes.
    #[inline]
    pub fn new(len: u64) -> CrcShift {
        CrcShift(gf::x8n(len, gf::mul))
    }

    /// CRC(A ‖ B) from CRC(A) and CRC(B), where |B| is this shift's length.
    #[inline]
    pub fn combine(self, crc_a: u32, crc_b: u32) -> u32 {
        if crc_a == 0 {
            return crc_b;
        }
        gf::mul(crc_a, self.0) ^ crc_b
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn check_value() {
        // The CRC-32 check value (CRC catalogue: "123456789" → 0xCBF43926), every kernel.
        for k in Kernel::available() {
            assert_eq!(k.crc_update(0, b"123456789"), 0xCBF4_3926, "{}", k.name());
        }
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn best_is_the_widest_available() {
        if std::env::var_os("PMRXE_CRC_KERNEL").is_none() {
            assert_eq!(Some(Kernel::best()), Kernel::available().last());
        }
        assert_eq!(Kernel::by_name("portable"), Some(Kernel::PORTABLE));
        assert_eq!(Kernel::by_name("nonsense"), None);
    }
}
