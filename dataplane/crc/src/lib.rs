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
//! Four implementations (tiers), each usable on its own through [`Kernel`], all bit-identical
//! (the tests check every one the CPU has against crc32fast and report those it lacks, see
//! [`Kernel::all_names`]):
//!
//! | name       | needs                                   | accumulators            | per step  |
//! |------------|-----------------------------------------|-------------------------|-----------|
//! | `avx512`   | AVX512F/BW/VL, VPCLMULQDQ (+ `pclmul`'s) | four 512-bit            | 256 bytes |
//! | `avx2`     | AVX2, VPCLMULQDQ (+ `pclmul`'s)          | four 256-bit            | 128 bytes |
//! | `pclmul`   | PCLMULQDQ, SSE4.1, SSSE3                 | eight 128-bit (four < 128 B) | 128 bytes |
//! | `portable` | —                                       | slicing-by-8 tables     | 8 bytes   |
//!
//! `avx512` hands inputs shorter than 256 bytes to `pclmul`, `avx2` those shorter than 128, and
//! every x86 kernel masks with `pclmul` ([`crc_update_masked`] hashes headers of at most a few
//! dozen bytes). With a copy, each block is stored from the register it is folded from, so the
//! copy rides on the loads the CRC makes anyway: where the multiplier is the bound (every x86
//! CPU so far) the fused kernel runs at the speed of the CRC alone.
//!
//! On AMD Zen 3 (no AVX-512) `avx2` is the fastest: its multiplier issues one VPCLMULQDQ every
//! two cycles whether 128 or 256 bits wide, so `pclmul` is bound at half `avx2`'s speed (about
//! 11 against 22 GB/s at 4 KiB; eight 128-bit accumulators instead of four change nothing there,
//! they pay on CPUs whose multiplier is pipelined one per cycle).
//!
//! The free functions ([`copy_and_crc`], [`crc_update`], [`crc_update_masked`]) use
//! [`Kernel::best`]: one relaxed atomic load picks the kernel per call. Until something installs
//! a choice it is the widest kernel the CPU has, detected on first use. Width is not speed on
//! every CPU (a wide multiplier may issue no faster than a narrow one), so a process can measure
//! instead: [`Kernel::calibrate`] times each available kernel's `copy_and_crc` at a frame size
//! for a few milliseconds and [`Calibration::install`] makes the fastest the process-wide best.
//! `PMRXE_CRC_KERNEL=portable|pclmul|avx2|avx512` (a kernel this CPU has) overrides both the
//! detection and any installed choice ([`Kernel::forced`]), for measurements.
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
use std::time::{Duration, Instant};

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
    Avx2 = 3,
    #[cfg(target_arch = "x86_64")]
    Avx512 = 4,
}

/// Which kernel [`Kernel::best`] returns (its `Kind` as a number): 0 until detected or set.
/// Every nonzero value names a kernel this CPU can run (only `detect` and `set_best` store, and
/// both store kernels that exist); on x86-64, 2 and above imply `pclmul`'s features.
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

    /// The AVX2 + VPCLMULQDQ kernel (256-bit accumulators), if this CPU has AVX2 and
    /// VPCLMULQDQ (and what [`Kernel::pclmul`] needs). No AVX-512 needed.
    pub fn avx2() -> Option<Kernel> {
        #[cfg(target_arch = "x86_64")]
        {
            if Self::pclmul().is_some() && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("vpclmulqdq") {
                return Some(Kernel(Kind::Avx2));
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

    /// Every kernel this CPU can run, narrowest first (the last is the default best).
    pub fn available() -> impl Iterator<Item = Kernel> {
        [Some(Self::PORTABLE), Self::pclmul(), Self::avx2(), Self::avx512()].into_iter().flatten()
    }

    /// The names of every kernel built for this architecture, narrowest first, whether or not
    /// this CPU can run them (compare with [`available`](Kernel::available) to report the
    /// kernels a test run could not exercise).
    pub fn all_names() -> &'static [&'static str] {
        #[cfg(target_arch = "x86_64")]
        {
            &["portable", "pclmul", "avx2", "avx512"]
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            &["portable"]
        }
    }

    /// A kernel by [`name`](Kernel::name), if this CPU can run it.
    pub fn by_name(name: &str) -> Option<Kernel> {
        Self::available().find(|k| k.name() == name)
    }

    /// The kernel the free functions use: the one [`set_best`](Kernel::set_best) (or
    /// [`Calibration::install`]) installed, else the widest this CPU has (detected on first
    /// use); in both cases the one `PMRXE_CRC_KERNEL` forces, if it names one this CPU has.
    #[inline]
    pub fn best() -> Kernel {
        match BEST.load(Ordering::Relaxed) {
            1 => Kernel(Kind::Portable),
            #[cfg(target_arch = "x86_64")]
            2 => Kernel(Kind::Pclmul),
            #[cfg(target_arch = "x86_64")]
            3 => Kernel(Kind::Avx2),
            #[cfg(target_arch = "x86_64")]
            4 => Kernel(Kind::Avx512),
            _ => Self::detect(),
        }
    }

    #[cold]
    fn detect() -> Kernel {
        let k = Self::forced().or_else(|| Self::available().last()).unwrap_or(Self::PORTABLE);
        BEST.store(k.0 as u8, Ordering::Relaxed);
        k
    }

    /// The kernel `PMRXE_CRC_KERNEL` names, if it names one this CPU has (a name it lacks, or
    /// an unknown one, is ignored: `None`). Read from the environment at each call.
    pub fn forced() -> Option<Kernel> {
        std::env::var("PMRXE_CRC_KERNEL").ok().and_then(|n| Self::by_name(n.trim()))
    }

    /// Make `k` the process-wide [`best`](Kernel::best) kernel, unless `PMRXE_CRC_KERNEL`
    /// forces another (the forced kernel wins). Returns the kernel now in effect. Calls running
    /// concurrently on other threads may still use the previous kernel for a moment: every
    /// kernel gives the same CRC, so this only moves speed.
    pub fn set_best(k: Kernel) -> Kernel {
        let k = Self::forced().unwrap_or(k);
        BEST.store(k.0 as u8, Ordering::Relaxed);
        k
    }

    /// Time each available kernel's [`copy_and_crc`](Kernel::copy_and_crc) on `frame`-byte
    /// inputs for about `budget` in all (interleaved rounds, each kernel's best round kept: a
    /// shared machine's interruptions only lower some rounds) and pick the fastest. The
    /// source is page-aligned and the destination on a cache line, 128 bytes into its buffer
    /// (as the transmit path's payloads). Installs nothing: see [`Calibration::install`]. A
    /// budget of 10–50 ms is plenty at frame sizes (thousands of calls per kernel).
    ///
    /// The fastest wins outright except that a wider kernel within 3 % of a narrower one's
    /// figure is preferred (the default order, kept against timing noise).
    pub fn calibrate(frame: usize, budget: Duration) -> Calibration {
        const ROUNDS: u32 = 8;
        let kernels: Vec<Kernel> = Self::available().collect();
        let src: Vec<u8> = (0..frame + 4096).map(|i| (i as u8).wrapping_mul(31).wrapping_add(7)).collect();
        let s0 = (4096 - src.as_ptr() as usize % 4096) % 4096;
        let src = &src[s0..s0 + frame];
        let mut dbuf = vec![0u8; frame + 256];
        let d0 = (64 - dbuf.as_ptr() as usize % 64) % 64 + 128;
        let dst = &mut dbuf[d0..d0 + frame];
        // Calls between clock reads: about 64 KiB of bytes.
        let batch = (65536 / frame.max(1)).max(1);
        let slice = budget / (ROUNDS * kernels.len() as u32);
        let mut best = vec![0f64; kernels.len()];
        let mut acc = 0u32;
        for &k in &kernels {
            acc ^= k.copy_and_crc(0, dst, src); // warm the code and the buffers
        }
        for _ in 0..ROUNDS {
            for (j, &k) in kernels.iter().enumerate() {
                let t0 = Instant::now();
                let mut n = 0usize;
                loop {
                    for _ in 0..batch {
                        acc ^= k.copy_and_crc(0, dst, core::hint::black_box(src));
                    }
                    n += batch;
                    if t0.elapsed() >= slice {
                        break;
                    }
                }
                let gbps = (n * frame) as f64 / t0.elapsed().as_secs_f64() / 1e9;
                best[j] = best[j].max(gbps);
            }
        }
        core::hint::black_box(acc);
        let mut fastest = 0;
        for j in 1..kernels.len() {
            if best[j] >= best[fastest] * 0.97 {
                fastest = j;
            }
        }
        Calibration {
            frame,
            gb_per_s: kernels.iter().copied().zip(best).collect(),
            fastest: kernels[fastest],
            forced: Self::forced(),
        }
    }

    /// `"portable"`, `"pclmul"`, `"avx2"` or `"avx512"`.
    pub fn name(self) -> &'static str {
        match self.0 {
            Kind::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Kind::Pclmul => "pclmul",
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2 => "avx2",
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

    /// [`crc_update_masked`] with this kernel (the AVX2 and AVX-512 ones mask with their
    /// PCLMUL part: masked inputs are headers, shorter than where wide lanes pay off).
    pub fn crc_update_masked(self, crc: u32, data: &[u8], mask: &Mask) -> u32 {
        match self.0 {
            // SAFETY: `data` is readable for its length.
            Kind::Portable => unsafe { portable::masked(crc, data.as_ptr(), data.len(), mask) },
            // SAFETY: a `Kernel(Pclmul)`, `Kernel(Avx2)` or `Kernel(Avx512)` exists only if
            // `pclmul()` detected the features; `data` is readable for its length.
            #[cfg(target_arch = "x86_64")]
            Kind::Pclmul | Kind::Avx2 | Kind::Avx512 => unsafe { x86::pclmul_masked(crc, data.as_ptr(), data.len(), mask) },
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
            // SAFETY: a `Kernel(Avx2)` exists only if `avx2()` detected the features.
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2 => unsafe { x86::avx2::<COPY>(crc, dst, src, len) },
            // SAFETY: a `Kernel(Avx512)` exists only if `avx512()` detected the features.
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => unsafe { x86::avx512::<COPY>(crc, dst, src, len) },
        }
    }
}

/// What [`Kernel::calibrate`] measured: each available kernel's `copy_and_crc` speed at one
/// frame size, the fastest, and the kernel `PMRXE_CRC_KERNEL` forces if any.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// The input length timed, in bytes.
    pub frame: usize,
    /// Each available kernel with its best round in GB/s (1e9 bytes of payload per second),
    /// in [`Kernel::available`] order.
    pub gb_per_s: Vec<(Kernel, f64)>,
    /// The fastest kernel by the figures.
    pub fastest: Kernel,
    /// The kernel `PMRXE_CRC_KERNEL` forces at calibration time (it wins over `fastest`).
    pub forced: Option<Kernel>,
}

impl Calibration {
    /// The kernel [`install`](Calibration::install) makes the best: the forced one, else the
    /// fastest.
    pub fn chosen(&self) -> Kernel {
        self.forced.unwrap_or(self.fastest)
    }

    /// Whether the choice was forced by `PMRXE_CRC_KERNEL` rather than measured.
    pub fn is_forced(&self) -> bool {
        self.forced.is_some()
    }

    /// The figure measured for `k`, if it was available.
    pub fn gb_per_s_of(&self, k: Kernel) -> Option<f64> {
        self.gb_per_s.iter().find(|(x, _)| *x == k).map(|&(_, g)| g)
    }

    /// Make the choice the process-wide [`Kernel::best`] ([`Kernel::set_best`]: a kernel
    /// `PMRXE_CRC_KERNEL` forces still wins); returns the kernel now in effect.
    pub fn install(&self) -> Kernel {
        Kernel::set_best(self.chosen())
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
        // SAFETY: BEST holds 2..=4 only for kernels whose detection includes `pclmul()`'s
        // (PCLMULQDQ, SSE4.1 and SSSE3); `data` is readable for its length.
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
        // SAFETY: BEST holds 4 only for a `Kernel(Avx512)`, which exists only after `avx512()`
        // detected its features; `data` is readable for its length and, without COPY, the
        // destination is never accessed.
        4 => return unsafe { x86::avx512::<false>(crc, core::ptr::null_mut(), data.as_ptr(), data.len()) },
        // SAFETY: as above, with 3 and `avx2()`.
        3 => return unsafe { x86::avx2::<false>(crc, core::ptr::null_mut(), data.as_ptr(), data.len()) },
        // SAFETY: as above, with 2 and `pclmul()`.
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

    #[test]
    fn names_list_every_kernel_built() {
        assert_eq!(Kernel::all_names()[0], "portable");
        for k in Kernel::available() {
            assert!(Kernel::all_names().contains(&k.name()), "{}", k.name());
        }
        // Each name once, and the available kernels in the same order.
        let avail: Vec<&str> = Kernel::available().map(Kernel::name).collect();
        let in_order: Vec<&str> = Kernel::all_names().iter().copied().filter(|n| avail.contains(n)).collect();
        assert_eq!(avail, in_order);
    }

    #[test]
    fn calibration_measures_every_available_kernel() {
        // Installs nothing: `best` stays as other tests of this process expect.
        let cal = Kernel::calibrate(512, std::time::Duration::from_millis(4));
        assert_eq!(cal.gb_per_s.len(), Kernel::available().count());
        assert!(cal.gb_per_s_of(cal.fastest).is_some());
        assert_eq!(cal.frame, 512);
    }
}
