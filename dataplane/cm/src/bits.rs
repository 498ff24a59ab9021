//! Byte and bit-field accessors shared by every wire file of this crate.
//!
//! IBTA numbers bits from the most significant bit of a byte (bit 0 = 0x80), exactly like the
//! kernel's `IBA_FIELD_BLOC(byte, bit_offset, width)`; [`Bits`] follows that convention so each
//! field reads like the spec table it comes from.

/// Byte ranges and the big-endian accessors are pmrxe-wire's (the same smoltcp-style fields).
pub(crate) use pmrxe_wire::field::{rd16, rd32, rd64, wr16, wr32, wr64, Field};

/// A bit field inside one byte: `off` bits from the MSB, `width` bits wide.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bits {
    pub byte: usize,
    pub off: u8,
    pub width: u8,
}

impl Bits {
    pub(crate) const fn new(byte: usize, off: u8, width: u8) -> Bits {
        Bits { byte, off, width }
    }
    const fn shift(self) -> u8 {
        8 - self.off - self.width
    }
    const fn mask(self) -> u8 {
        (((1u16 << self.width) - 1) as u8) << self.shift()
    }
}

#[inline]
pub(crate) fn get_bits(b: &[u8], f: Bits) -> u8 {
    (b[f.byte] & f.mask()) >> f.shift()
}
#[inline]
pub(crate) fn set_bits(b: &mut [u8], f: Bits, v: u8) {
    let m = f.mask();
    b[f.byte] = (b[f.byte] & !m) | ((v << f.shift()) & m);
}
#[inline]
pub(crate) fn rd24(b: &[u8], f: Field) -> u32 {
    let s = &b[f];
    (u32::from(s[0]) << 16) | (u32::from(s[1]) << 8) | u32::from(s[2])
}
#[inline]
pub(crate) fn wr24(b: &mut [u8], f: Field, v: u32) {
    b[f].copy_from_slice(&v.to_be_bytes()[1..])
}
#[inline]
pub(crate) fn rd_gid(b: &[u8], f: Field) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[f]);
    g
}

/// Copy `data` into the private-data field `f` and zero the rest of it.
/// `Err(PrivateDataTooLong)` if it does not fit.
pub(crate) fn wr_private(b: &mut [u8], f: Field, data: &[u8]) -> crate::Result<()> {
    let dst = &mut b[f];
    if data.len() > dst.len() {
        return Err(crate::Error::PrivateDataTooLong);
    }
    dst[..data.len()].copy_from_slice(data);
    dst[data.len()..].fill(0);
    Ok(())
}

/// `Packet` boilerplate for a CM message view over the 232-byte MAD data area (offsets in the
/// `field` modules are the IBTA table offsets, i.e. relative to the end of the MAD header):
/// pmrxe-wire's `fixed_packet!` with this crate's error.
macro_rules! cm_packet {
    ($len:expr) => {
        pmrxe_wire::fixed_packet!(
            $len,
            $crate::Error,
            $crate::Error::Truncated,
            "A read/write view of this message over the MAD data area (the bytes after the 24-byte common MAD header)."
        );
    };
}
pub(crate) use cm_packet;

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn bits_are_numbered_from_the_msb() {
        let mut b = [0u8; 1];
        set_bits(&mut b, Bits::new(0, 0, 5), 0x1F);
        assert_eq!(b[0], 0xF8);
        set_bits(&mut b, Bits::new(0, 5, 2), 2);
        assert_eq!(b[0], 0xFC);
        set_bits(&mut b, Bits::new(0, 7, 1), 1);
        assert_eq!(b[0], 0xFD);
        assert_eq!(get_bits(&b, Bits::new(0, 5, 2)), 2);
        assert_eq!(get_bits(&b, Bits::new(0, 0, 5)), 0x1F);
        set_bits(&mut b, Bits::new(0, 0, 5), 0);
        assert_eq!(b[0], 0x05);
    }
    #[test]
    fn private_data_pads_and_rejects_overflow() {
        let mut b = [0xAAu8; 8];
        wr_private(&mut b, 2..6, &[1, 2]).unwrap();
        assert_eq!(b, [0xAA, 0xAA, 1, 2, 0, 0, 0xAA, 0xAA]);
        assert_eq!(wr_private(&mut b, 2..6, &[0; 5]), Err(crate::Error::PrivateDataTooLong));
    }
}
