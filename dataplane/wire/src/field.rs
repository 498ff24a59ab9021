//! Big-endian field accessors and the `Packet` view boilerplate shared by every header of this
//! crate and by pmrxe-cm's MAD messages (smoltcp style: a field is a byte range of the buffer).

/// A byte range inside a header (smoltcp's `Field`).
pub type Field = core::ops::Range<usize>;

/// The 16-bit big-endian value at `f` (2 bytes).
#[inline]
pub fn rd16(b: &[u8], f: Field) -> u16 {
    let s = &b[f];
    u16::from_be_bytes([s[0], s[1]])
}
/// The 32-bit big-endian value at `f` (4 bytes).
#[inline]
pub fn rd32(b: &[u8], f: Field) -> u32 {
    let s = &b[f];
    u32::from_be_bytes([s[0], s[1], s[2], s[3]])
}
/// The 64-bit big-endian value at `f` (8 bytes).
#[inline]
pub fn rd64(b: &[u8], f: Field) -> u64 {
    let s = &b[f];
    u64::from_be_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]])
}
/// Store `v` big-endian at `f` (2 bytes).
#[inline]
pub fn wr16(b: &mut [u8], f: Field, v: u16) {
    b[f].copy_from_slice(&v.to_be_bytes())
}
/// Store `v` big-endian at `f` (4 bytes).
#[inline]
pub fn wr32(b: &mut [u8], f: Field, v: u32) {
    b[f].copy_from_slice(&v.to_be_bytes())
}
/// Store `v` big-endian at `f` (8 bytes).
#[inline]
pub fn wr64(b: &mut [u8], f: Field, v: u64) {
    b[f].copy_from_slice(&v.to_be_bytes())
}

/// Common `Packet` boilerplate: wrapper, constructors, `check_len` against a fixed length.
///
/// `fixed_packet!(LEN)` in this crate (errors are [`crate::Error`]); another crate names its
/// error type, the value for a short buffer and the wrapper's doc:
/// `pmrxe_wire::fixed_packet!(LEN, crate::Error, crate::Error::Truncated, "A view of …")`.
#[doc(hidden)]
#[macro_export]
macro_rules! fixed_packet {
    ($len:expr) => {
        $crate::fixed_packet!($len, $crate::Error, $crate::Error::Truncated, "A read/write view of this header over a buffer.");
    };
    ($len:expr, $error:ty, $truncated:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }
        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wrap without checking the length (accessors may panic on a short buffer).
            #[inline]
            pub const fn new_unchecked(buffer: T) -> Packet<T> {
                Packet { buffer }
            }
            /// Wrap and [`check_len`](Self::check_len).
            #[inline]
            pub fn new_checked(buffer: T) -> ::core::result::Result<Packet<T>, $error> {
                let p = Packet::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }
            /// `Err(Truncated)` if the buffer is shorter than the header (message). After
            /// `Ok`, no accessor panics.
            #[inline]
            pub fn check_len(&self) -> ::core::result::Result<(), $error> {
                if self.buffer.as_ref().len() < $len {
                    Err($truncated)
                } else {
                    Ok(())
                }
            }
            /// The underlying buffer.
            #[inline]
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}
