//! `map_mr_sg` page-list construction (`ib_sg_to_pages` semantics, §2.3), as a pure function so
//! property tests can drive it against a byte-level reference model.
//!
//! Rules:
//! * the first element may start at an offset (`sg_offset` is added to it);
//! * every later element must start and end on page boundaries, or continue exactly where the
//!   previous one ended (virtually contiguous); mapping stops at the first gap;
//! * the last element may be short;
//! * at most `max_pages` pages; an element whose pages do not all fit is not mapped (if that is
//!   the first element the call fails with [`MemError::TooManyPages`]);
//! * the result says how many elements were mapped, the iova (first element address +
//!   `sg_offset`), the byte length, and how many page addresses were emitted.

use crate::MemError;

/// Smallest supported page size (4 KiB).
pub const MIN_PAGE_SHIFT: u32 = 12;
/// Largest supported page size (1 GiB).
pub const MAX_PAGE_SHIFT: u32 = 30;

/// Result of a successful mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SgMapping {
    /// SG elements mapped (callers compare with the number passed).
    pub entries: usize,
    /// Address of the first mapped byte.
    pub iova: u64,
    /// Bytes mapped.
    pub length: u64,
    /// Page addresses emitted.
    pub npages: usize,
    /// log2(page size).
    pub page_shift: u32,
}

/// `page_size` → shift, if supported (power of two in 4 KiB ..= 1 GiB).
pub fn page_shift(page_size: u64) -> Result<u32, MemError> {
    if !page_size.is_power_of_two() {
        return Err(MemError::BadPageSize);
    }
    let s = page_size.trailing_zeros();
    if (MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&s) {
        Ok(s)
    } else {
        Err(MemError::BadPageSize)
    }
}

/// Build the page list for `elems` (address, length) and hand each page address to `emit(i, addr)`.
pub fn sg_to_pages(
    elems: impl IntoIterator<Item = (u64, u64)>,
    sg_offset: u64,
    page_size: u64,
    max_pages: usize,
    mut emit: impl FnMut(usize, u64),
) -> Result<SgMapping, MemError> {
    let shift = page_shift(page_size)?;
    let mask = page_size - 1;
    let mut m = SgMapping {
        entries: 0,
        iova: 0,
        length: 0,
        npages: 0,
        page_shift: shift,
    };
    let mut prev_end = 0u64;
    for (i, (addr, len)) in elems.into_iter().enumerate() {
        let (start, len) = if i == 0 {
            if sg_offset >= len {
                return Err(if len == 0 {
                    MemError::ZeroLength
                } else {
                    MemError::OutOfRange
                });
            }
            (
                addr.checked_add(sg_offset).ok_or(MemError::Overflow)?,
                len - sg_offset,
            )
        } else {
            (addr, len)
        };
        if len == 0 {
            break; // an empty later element maps nothing; treat it as the end of the list
        }
        let end = start.checked_add(len).ok_or(MemError::Overflow)?;
        // Start of the first page this element needs that is not already in the list.
        let first_new = if i == 0 {
            start & !mask
        } else if prev_end & mask != 0 || start & mask != 0 {
            if start != prev_end {
                break; // gap: neither page-aligned nor virtually contiguous
            }
            // Continues inside the last listed page; new pages begin at the next boundary.
            prev_end.checked_add(mask).ok_or(MemError::Overflow)? & !mask
        } else {
            start
        };
        let need = if end > first_new {
            (((end - 1) >> shift) - (first_new >> shift) + 1) as usize
        } else {
            0
        };
        if need > max_pages - m.npages {
            if i == 0 {
                return Err(MemError::TooManyPages);
            }
            break;
        }
        for k in 0..need {
            emit(m.npages + k, first_new + ((k as u64) << shift));
        }
        if i == 0 {
            m.iova = start;
        }
        m.npages += need;
        m.length += len;
        m.entries += 1;
        prev_end = end;
    }
    Ok(m)
}
