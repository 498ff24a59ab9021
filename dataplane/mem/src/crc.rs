//! Copies that fold the CRC-32 of the bytes (the RoCEv2 ICRC, `pmrxe_crc`) in the same pass:
//! the send side gathers payload into a frame while hashing it, the receive side scatters a
//! payload into memory while checking it. One read and one write per byte; the copy is the
//! kernel's own vector loads and stores (no `memcpy`, whose `rep movsb` path is slow for some
//! sizes on some CPUs), and the CRC is of the bytes stored, even if a client rewrites the
//! source meanwhile.

use pmrxe_crc::Kernel;

use crate::access::{Access, PdHandle};
use crate::reader::MemAccess;
use crate::sge::{single, walk, Sge};
use crate::table::MrRef;
use crate::MemError;

impl MrRef<'_> {
    /// [`copy_out`](MrRef::copy_out) folding the bytes into `crc` (zlib convention); returns
    /// the new CRC. Always inlined: the data path calls it with the window just looked up or
    /// resumed, kept in registers instead of passed as a 64-byte `MrRef` through memory.
    #[inline(always)]
    pub fn copy_out_crc(&self, iova: u64, dst: &mut [u8], crc: u32) -> Result<u32, MemError> {
        let k = Kernel::best();
        let d = dst.as_mut_ptr();
        let mut c = crc;
        self.walk(iova, dst.len() as u64, |a, done, n| {
            // SAFETY: as in `copy_out`: `a..a+n` lies in a Region kept alive and valid for this
            // reference's lifetime, `d+done..+n` inside `dst`, and a Rust buffer never overlaps
            // registered memory.
            c = unsafe { k.copy_and_crc_raw(c, d.add(done), a as *const u8, n) };
        })?;
        Ok(c)
    }

    /// [`copy_in`](MrRef::copy_in) folding the bytes into `crc`; returns the new CRC (always
    /// inlined, as `copy_out_crc`).
    #[inline(always)]
    pub fn copy_in_crc(&self, iova: u64, src: &[u8], crc: u32) -> Result<u32, MemError> {
        let k = Kernel::best();
        let s = src.as_ptr();
        let mut c = crc;
        self.walk(iova, src.len() as u64, |a, done, n| {
            // SAFETY: as in `copy_out_crc`, with the roles swapped.
            c = unsafe { k.copy_and_crc_raw(c, a as *mut u8, s.add(done), n) };
        })?;
        Ok(c)
    }
}

/// [`gather`](crate::gather) folding the bytes into `crc`; returns the new CRC.
pub fn gather_crc<M: MemAccess + ?Sized>(
    table: &M,
    pd: PdHandle,
    qpn: u32,
    sges: &[Sge],
    offset: u64,
    dst: &mut [u8],
    crc: u32,
) -> Result<u32, MemError> {
    if let Some((s, addr)) = single(sges, offset, dst.len()) {
        return table.lookup(s.lkey, pd, qpn, addr, dst.len() as u64, Access::EMPTY)?.copy_out_crc(addr, dst, crc);
    }
    let mut c = crc;
    walk(sges, offset, dst.len(), |s, addr, done, n| {
        let r = table.lookup(s.lkey, pd, qpn, addr, n as u64, Access::EMPTY)?;
        c = r.copy_out_crc(addr, &mut dst[done..done + n], c)?;
        Ok(())
    })?;
    Ok(c)
}

/// [`scatter`](crate::scatter) folding the bytes into `crc`; returns the new CRC.
pub fn scatter_crc<M: MemAccess + ?Sized>(
    table: &M,
    pd: PdHandle,
    qpn: u32,
    sges: &[Sge],
    offset: u64,
    src: &[u8],
    crc: u32,
) -> Result<u32, MemError> {
    if let Some((s, addr)) = single(sges, offset, src.len()) {
        return table.lookup(s.lkey, pd, qpn, addr, src.len() as u64, Access::LOCAL_WRITE)?.copy_in_crc(addr, src, crc);
    }
    let mut c = crc;
    walk(sges, offset, src.len(), |s, addr, done, n| {
        let r = table.lookup(s.lkey, pd, qpn, addr, n as u64, Access::LOCAL_WRITE)?;
        c = r.copy_in_crc(addr, &src[done..done + n], c)?;
        Ok(())
    })?;
    Ok(c)
}
