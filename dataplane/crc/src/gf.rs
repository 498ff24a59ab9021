//! Arithmetic modulo the CRC-32 polynomial, in the reflected representation the CRC uses:
//! a `u32` whose bit 31 is the coefficient of x^0 and bit 0 that of x^31 (so `0x8000_0000` is
//! 1 and `0xEDB8_8320` is P(x) − x^32).
//!
//! Everything the kernels need is derived here at compile time: the byte tables of the portable
//! kernel, the folding constants of the carry-less kernels (checked against the published
//! values in the tests) and the powers x^(8·2^k) that [`crc32_combine`](crate::crc32_combine)
//! multiplies together.

/// The reflected polynomial (without the x^32 term).
pub(crate) const POLY: u32 = 0xEDB8_8320;

/// Barrett constant μ = floor(x^64 / P), reflected to 33 bits (checked by a test).
pub(crate) const MU: u64 = 0x1_F701_1641;
/// P itself, reflected to 33 bits (with the x^32 term).
pub(crate) const P33: u64 = ((POLY as u64) << 1) | 1;

/// `a · b mod P` (compile-time version: one bit of `a` per step).
pub(crate) const fn mul_slow(a: u32, mut b: u32) -> u32 {
    let mut p = 0u32;
    let mut i = 0;
    while i < 32 {
        if (a >> (31 - i)) & 1 != 0 {
            p ^= b;
        }
        // b := b · x mod P.
        b = (b >> 1) ^ if b & 1 != 0 { POLY } else { 0 };
        i += 1;
    }
    p
}

/// `x^n mod P`, one multiplication by x at a time (compile time only; `n` is small).
pub(crate) const fn x_pow(n: u32) -> u32 {
    let mut p = 0x8000_0000; // x^0
    let mut i = 0;
    while i < n {
        p = mul_slow(0x4000_0000, p); // · x
        i += 1;
    }
    p
}

/// A folding constant: `x^n mod P` as the 33-bit value the carry-less multiplier wants
/// (the reflected 32-bit value shifted left by one).
pub(crate) const fn fold_const(n: u32) -> u64 {
    (x_pow(n) as u64) << 1
}

/// Slicing-by-8 tables: `TABLES[k][b]` is the CRC register after byte `b` followed by `k` zero
/// bytes, starting from a zero register.
pub(crate) static TABLES: [[u32; 256]; 8] = tables();

const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut b = 0;
    while b < 256 {
        let mut c = b as u32;
        let mut i = 0;
        while i < 8 {
            c = (c >> 1) ^ if c & 1 != 0 { POLY } else { 0 };
            i += 1;
        }
        t[0][b] = c;
        b += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut b = 0;
        while b < 256 {
            let prev = t[k - 1][b];
            t[k][b] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            b += 1;
        }
        k += 1;
    }
    t
}

/// `POW8[k] = x^(8·2^k) mod P`: appending 2^k zero bytes multiplies a CRC by it.
static POW8: [u32; 64] = pow8();

const fn pow8() -> [u32; 64] {
    let mut t = [0u32; 64];
    t[0] = 0x0080_0000; // x^8
    let mut k = 1;
    while k < 64 {
        t[k] = mul_slow(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
}

/// `h · x^32 mod P`: the register after four zero bytes (slicing-by-4 on a zero word).
#[inline]
fn times_x32(h: u32) -> u32 {
    TABLES[3][(h & 0xFF) as usize]
        ^ TABLES[2][((h >> 8) & 0xFF) as usize]
        ^ TABLES[1][((h >> 16) & 0xFF) as usize]
        ^ TABLES[0][(h >> 24) as usize]
}

/// Reduce the 63-bit carry-less product of two reflected values (as `clmul` returns it) mod P.
///
/// Product bit k is the coefficient of x^(62−k); shifted left by one, the low word holds the
/// x^63..x^32 part (as a reflected H with H·x^32) and the high word the x^31..x^0 part.
#[inline]
pub(crate) fn reduce_product(prod: u64) -> u32 {
    let w = prod << 1;
    times_x32(w as u32) ^ (w >> 32) as u32
}

/// Portable carry-less 32×32 multiply.
#[inline]
fn clmul_portable(a: u32, b: u32) -> u64 {
    let mut p = 0u64;
    let mut a = a;
    let b = u64::from(b);
    while a != 0 {
        let i = a.trailing_zeros();
        p ^= b << i;
        a &= a - 1;
    }
    p
}

/// `a · b mod P`, portable.
#[inline]
pub(crate) fn mul_portable(a: u32, b: u32) -> u32 {
    reduce_product(clmul_portable(a, b))
}

/// `a · b mod P` with the fastest multiplier this CPU has.
#[inline]
pub(crate) fn mul(a: u32, b: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::Kernel::best().0 != crate::Kind::Portable {
            // SAFETY: a best kernel other than Portable means PCLMULQDQ was detected.
            return reduce_product(unsafe { crate::x86::clmul32(a, b) });
        }
    }
    mul_portable(a, b)
}

/// `x^(8·len) mod P`: one multiplication per set bit of `len` after the lowest, and one loop
/// step per set bit (not per bit: an MTU-sized length, 4096 + a few bytes, is one or two steps
/// instead of thirteen).
#[inline]
pub(crate) fn x8n(len: u64, mul: impl Fn(u32, u32) -> u32) -> u32 {
    if len == 0 {
        return 0x8000_0000; // 1
    }
    let mut p = POW8[len.trailing_zeros() as usize];
    let mut n = len & (len - 1);
    while n != 0 {
        p = mul(p, POW8[n.trailing_zeros() as usize]);
        n &= n - 1;
    }
    p
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn folding_constants_are_the_published_ones() {
        // Gopal et al., "Fast CRC computation for generic polynomials using PCLMULQDQ" (Intel,
        // 2009), for the reflected CRC-32: k1..k5 as also used by Linux and zlib-ng.
        assert_eq!(fold_const(4 * 128 + 32), 0x1_5444_2bd4);
        assert_eq!(fold_const(4 * 128 - 32), 0x1_c6e4_1596);
        assert_eq!(fold_const(128 + 32), 0x1_7519_97d0);
        assert_eq!(fold_const(128 - 32), 0x0_ccaa_009e);
        assert_eq!(fold_const(64), 0x1_63cd_6124);
    }

    #[test]
    fn table_matches_the_bitwise_crc() {
        assert_eq!(TABLES[0][1], 0x7707_3096);
        assert_eq!(TABLES[0][255], 0x2D02_EF8D);
    }

    #[test]
    fn barrett_constant_is_floor_x64_over_p() {
        // μ = floor(x^64 / P(x)) in the normal representation, then reflected to 33 bits.
        let p: u128 = (1 << 32) | u128::from(POLY.reverse_bits());
        let (mut rem, mut q) = (1u128 << 64, 0u128);
        for d in (0..=32).rev() {
            if rem >> (d + 32) & 1 != 0 {
                rem ^= p << d;
                q |= 1 << d;
            }
        }
        let refl33 = (q as u64).reverse_bits() >> 31;
        assert_eq!(refl33, MU);
        assert_eq!(((POLY as u64) << 1) | 1, P33);
    }

    #[test]
    fn fast_multiply_agrees_with_the_bitwise_one() {
        let mut s = 0x1234_5678u32;
        for _ in 0..10_000 {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let a = s;
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let b = s;
            assert_eq!(mul_portable(a, b), mul_slow(a, b));
            assert_eq!(mul(a, b), mul_slow(a, b));
        }
        assert_eq!(x8n(3, mul_portable), x_pow(24));
        assert_eq!(x8n(1000, mul_portable), x8n(1000, mul_slow));
        assert_eq!(x8n(0, mul_portable), 0x8000_0000);
        for n in [1u64, 2, 4096, 4097, 4100, 65535, 1 << 40, u64::MAX] {
            let mut slow = 0x8000_0000u32;
            for (k, &p) in POW8.iter().enumerate() {
                if n >> k & 1 != 0 {
                    slow = mul_slow(slow, p);
                }
            }
            assert_eq!(x8n(n, mul), slow, "x^(8·{n})");
        }
    }
}
