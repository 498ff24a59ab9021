//! 24-bit sequence numbers: [`Psn`] (packet sequence number) and [`Msn`] (message sequence
//! number). Arithmetic wraps modulo 2^24; ordering is by signed distance, valid within
//! ±2^23 (like smoltcp's `SeqNumber`, and rxe's `psn_compare`).

use core::cmp::Ordering;
use core::fmt;
use core::ops::{Add, AddAssign, Sub};

/// The mask of a 24-bit field. The only place such a mask is spelled (with `qpn.rs`).
pub(crate) const MASK24: u32 = 0x00FF_FFFF;

/// A value that does not fit a 24-bit field (a PSN, MSN or QPN a peer or a client gave with
/// high bits set): the checked constructions (`TryFrom<u32>`) refuse it instead of truncating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Not24Bits(pub u32);

impl fmt::Display for Not24Bits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x} does not fit 24 bits", self.0)
    }
}

impl std::error::Error for Not24Bits {}

/// Read a 24-bit big-endian value. `b` must be 3 bytes long.
#[inline]
pub(crate) fn read_be24(b: &[u8]) -> u32 {
    (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2])
}

macro_rules! seq24 {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(u32);

        impl $name {
            /// Largest value.
            pub const MAX: $name = $name(MASK24);
            /// Construct, truncating to 24 bits.
            #[inline]
            pub const fn new(v: u32) -> Self { $name(v & MASK24) }
            /// The 24-bit value.
            #[inline]
            pub const fn value(self) -> u32 { self.0 }
            /// Read 3 big-endian bytes.
            #[inline]
            pub fn from_be24(b: &[u8]) -> Self { $name(read_be24(b)) }
            /// The 3 big-endian bytes.
            #[inline]
            pub const fn to_be24(self) -> [u8; 3] {
                [(self.0 >> 16) as u8, (self.0 >> 8) as u8, self.0 as u8]
            }
            /// `self + n` modulo 2^24.
            #[inline]
            pub const fn wrapping_add(self, n: u32) -> Self { $name(self.0.wrapping_add(n) & MASK24) }
            /// `self - n` modulo 2^24.
            #[inline]
            pub const fn wrapping_sub(self, n: u32) -> Self { $name(self.0.wrapping_sub(n) & MASK24) }
            /// Signed distance `self - other` in `-2^23 .. 2^23`.
            #[inline]
            pub const fn distance(self, other: Self) -> i32 {
                ((self.0.wrapping_sub(other.0)) << 8) as i32 >> 8
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
                Some(self.distance(*other).cmp(&0))
            }
        }

        /// Adds `n` modulo 2^24. Panics if `n >= 2^23` (such a step has no meaning in a
        /// window compared by signed distance).
        impl Add<u32> for $name {
            type Output = $name;
            #[inline]
            fn add(self, n: u32) -> $name {
                assert!(n < (1 << 23), concat!(stringify!($name), " + n: n out of range"));
                self.wrapping_add(n)
            }
        }
        impl AddAssign<u32> for $name {
            #[inline]
            fn add_assign(&mut self, n: u32) { *self = *self + n }
        }
        /// Signed distance.
        impl Sub for $name {
            type Output = i32;
            #[inline]
            fn sub(self, other: $name) -> i32 { self.distance(other) }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#08x})"), self.0)
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { write!(f, "{}", self.0) }
        }
        impl From<$name> for u32 {
            fn from(v: $name) -> u32 { v.0 }
        }
        /// Checked construction: a value with any of bits 24..32 set is refused.
        impl TryFrom<u32> for $name {
            type Error = Not24Bits;
            #[inline]
            fn try_from(v: u32) -> Result<Self, Not24Bits> {
                if v & !MASK24 == 0 { Ok($name(v)) } else { Err(Not24Bits(v)) }
            }
        }
    };
}

seq24!(
    /// BTH packet sequence number (24 bits, wrapping).
    Psn
);
seq24!(
    /// AETH message sequence number (24 bits, wrapping).
    Msn
);

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn f5_psn_wraps() {
        let p = Psn::new(0xFF_FFFE);
        let seq: Vec<u32> = (0..4).map(|i| (p + i).value()).collect();
        assert_eq!(seq, [0xFF_FFFE, 0xFF_FFFF, 0, 1]);
        assert!(Psn::new(1) > Psn::new(0xFF_FFFE));
        assert!(Psn::new(0xFF_FFFE) < Psn::new(1));
        assert_eq!(Psn::new(1) - Psn::new(0xFF_FFFE), 3);
        assert_eq!(Psn::new(0xFF_FFFE) - Psn::new(1), -3);
        assert_eq!(Psn::new(5).wrapping_sub(6), Psn::MAX);
        assert_eq!(Psn::new(0x0123_4567).value(), 0x23_4567);
        assert_eq!(Psn::from_be24(&Psn::new(0xABCDEF).to_be24()), Psn::new(0xABCDEF));
    }

    #[test]
    fn checked_construction_refuses_high_bits() {
        assert_eq!(Psn::try_from(0xFF_FFFF), Ok(Psn::MAX));
        assert_eq!(Psn::try_from(0x100_0000), Err(Not24Bits(0x100_0000)));
        assert_eq!(Msn::try_from(u32::MAX), Err(Not24Bits(u32::MAX)));
        assert_eq!(Psn::try_from(7).map(Psn::value), Ok(7));
    }

    #[test]
    #[should_panic]
    fn psn_add_nonsense_panics() {
        let _ = Psn::new(0) + (1 << 23);
    }
}
