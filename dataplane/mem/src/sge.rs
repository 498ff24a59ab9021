//! Scatter/gather through SGE lists (requester gathers payload, responder/completer scatters).

use crate::access::{Access, Key, PdHandle};
use crate::reader::MemAccess;
use crate::MemError;

/// A work-request scatter/gather element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Start address in the lkey's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key.
    pub lkey: Key,
}

/// Total bytes of an SGE list (u64: cannot overflow for any list that fits in memory).
pub fn sge_total_len(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| s.len as u64).sum()
}

/// Walk the part of `sges` covering message bytes `[offset, offset+total)` and hand each piece
/// (sge, address, bytes done so far, piece length) to `f`.
pub(crate) fn walk(
    sges: &[Sge],
    offset: u64,
    total: usize,
    mut f: impl FnMut(&Sge, u64, usize, usize) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let mut skip = offset;
    let mut done = 0usize;
    for s in sges {
        if done == total {
            break;
        }
        let l = s.len as u64;
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = ((l - skip) as usize).min(total - done);
        let addr = s.addr.checked_add(skip).ok_or(MemError::Overflow)?;
        f(s, addr, done, n)?;
        done += n;
        skip = 0;
    }
    if done < total {
        return Err(MemError::OutOfRange);
    }
    Ok(())
}

/// The common case without the walk over the list: `sges` is one SGE holding all of message
/// bytes `[offset, offset + n)`, `n > 0`. Returns that SGE and the address of the first byte;
/// `None` for anything else (longer lists, empty copies, ranges past the SGE: the walk handles
/// them, errors included, so results and error precedence stay the walk's).
#[inline]
pub(crate) fn single(sges: &[Sge], offset: u64, n: usize) -> Option<(&Sge, u64)> {
    let ([s], false) = (sges, n == 0) else { return None };
    if offset.checked_add(n as u64)? > u64::from(s.len) {
        return None;
    }
    Some((s, s.addr.checked_add(offset)?))
}

/// Copy message bytes `[offset, offset + dst.len())` of the SGE list into `dst`
/// (local read: no access bit needed).
pub fn gather<M: MemAccess + ?Sized>(
    table: &M,
    pd: PdHandle,
    qpn: u32,
    sges: &[Sge],
    offset: u64,
    dst: &mut [u8],
) -> Result<(), MemError> {
    let total = dst.len();
    if let Some((s, addr)) = single(sges, offset, total) {
        return table.lookup(s.lkey, pd, qpn, addr, total as u64, Access::EMPTY)?.copy_out(addr, dst);
    }
    walk(sges, offset, total, |s, addr, done, n| {
        let r = table.lookup(s.lkey, pd, qpn, addr, n as u64, Access::EMPTY)?;
        r.copy_out(addr, &mut dst[done..done + n])
    })
}

/// Copy `src` into message bytes `[offset, offset + src.len())` of the SGE list
/// (needs LOCAL_WRITE on every key touched).
pub fn scatter<M: MemAccess + ?Sized>(
    table: &M,
    pd: PdHandle,
    qpn: u32,
    sges: &[Sge],
    offset: u64,
    src: &[u8],
) -> Result<(), MemError> {
    if let Some((s, addr)) = single(sges, offset, src.len()) {
        return table.lookup(s.lkey, pd, qpn, addr, src.len() as u64, Access::LOCAL_WRITE)?.copy_in(addr, src);
    }
    walk(sges, offset, src.len(), |s, addr, done, n| {
        let r = table.lookup(s.lkey, pd, qpn, addr, n as u64, Access::LOCAL_WRITE)?;
        r.copy_in(addr, &src[done..done + n])
    })
}
