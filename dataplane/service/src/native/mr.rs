//! Memory the library allocates itself (a memfd segment) and its registration.
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use pmrxe_abi::ctrl::{Piece, Request, Response};

use pmrxe_abi::client::Mapping;

use super::context::{Context, Pd};
use super::{proto, Result, ShmSge};

const PAGE: usize = 4096;

/// A page-aligned buffer backed by a memfd that the service maps too (`AddSegment`).
///
/// The service (and, through it, the peer) writes these bytes whenever it likes, so no Rust
/// reference ever covers them: there is no `&[u8]` view. Bytes move in and out by copies
/// through raw pointers ([`Buffer::read`], [`Buffer::to_vec`], [`Buffer::write`],
/// [`Buffer::fill`]) or one volatile byte at a time (polling for data the service places).
pub struct Buffer {
    ctx: Context,
    seg: u64,
    map: Mapping,
    _fd: OwnedFd,
}

impl Buffer {
    /// Allocate `len` bytes (rounded up to pages), zeroed and populated, and announce them.
    pub fn new(ctx: &Context, len: usize) -> Result<Buffer> {
        let len = len.max(1).div_ceil(PAGE) * PAGE;
        let fd = pmrxe_abi::client::memfd(c"pmrxe-native", len as u64, 0, false)?;
        let map = Mapping::map(fd.as_raw_fd(), 0, len, true)?;
        let seg = ctx.next_seg();
        match ctx.call(&Request::AddSegment { seg, base: map.ptr() as u64, len: len as u64 }, &[fd.as_raw_fd()])?.0 {
            Response::Ok => {}
            _ => return Err(proto("AddSegment")),
        }
        Ok(Buffer { ctx: ctx.clone(), seg, map, _fd: fd })
    }

    /// Start address (client address space).
    pub fn addr(&self) -> u64 {
        self.map.ptr() as u64
    }

    /// Raw pointer to the start.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.ptr()
    }

    /// Length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Never empty (at least one page); for clippy.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The range `off..off + n`, checked against the mapping (panics outside it).
    fn range(&self, off: usize, n: usize) -> *mut u8 {
        assert!(off.checked_add(n).is_some_and(|e| e <= self.map.len()), "{off}+{n} outside a {}-byte buffer", self.map.len());
        // SAFETY: `off <= len`, so the result is inside (or one past) our mapping.
        unsafe { self.map.ptr().add(off) }
    }

    /// Copy `dst.len()` bytes at `off` out of the buffer (a snapshot: the service may be
    /// writing them meanwhile, so what arrives is whatever each byte held when copied).
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        let src = self.range(off, dst.len());
        // SAFETY: `src..src + dst.len()` is inside our mapping (checked), alive as long as
        // `self`; `dst` is a distinct local buffer. A raw copy: no reference to shared bytes.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) }
    }

    /// `len` bytes at `off`, copied out ([`Buffer::read`]).
    pub fn to_vec(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.read(off, &mut v);
        v
    }

    /// Copy `src` into the buffer at `off`.
    pub fn write(&self, off: usize, src: &[u8]) {
        let dst = self.range(off, src.len());
        // SAFETY: inside our mapping (checked); `src` is distinct memory. A raw copy.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
    }

    /// Set every byte of the buffer to `v`.
    pub fn fill(&self, v: u8) {
        // SAFETY: the whole mapping, alive as long as `self`; raw writes, no reference.
        unsafe { std::ptr::write_bytes(self.map.ptr(), v, self.map.len()) }
    }

    /// Volatile read of the byte at `off` (polling for data the service places).
    #[inline]
    pub fn read_volatile(&self, off: usize) -> u8 {
        assert!(off < self.map.len());
        // SAFETY: in bounds of our mapping.
        unsafe { self.map.ptr().add(off).read_volatile() }
    }

    /// Volatile write of the byte at `off`.
    #[inline]
    pub fn write_volatile(&self, off: usize, v: u8) {
        assert!(off < self.map.len());
        // SAFETY: in bounds of our mapping.
        unsafe { self.map.ptr().add(off).write_volatile(v) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // The service keeps the pages mapped as long as an MR uses them.
        let _ = self.ctx.call_ok(&Request::ReleaseSegment { seg: self.seg });
    }
}

/// A registered memory region (lkey = rkey = `key`).
pub struct Mr {
    ctx: Context,
    pub key: u32,
    pub addr: u64,
    pub len: u64,
}

impl Mr {
    /// Register `len` bytes at `offset` of `buf` with `access` ([`super::access`]).
    pub fn register_range(pd: &Pd, buf: &Buffer, offset: usize, len: usize, access: u32) -> Result<Mr> {
        if len == 0 || offset.checked_add(len).is_none_or(|e| e > buf.len()) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "MR outside its buffer"));
        }
        let addr = buf.addr() + offset as u64;
        let a0 = offset / PAGE * PAGE;
        let a1 = (offset + len).div_ceil(PAGE) * PAGE;
        let pieces = vec![Piece { seg: buf.seg, seg_offset: a0 as u64, len: (a1 - a0) as u64 }];
        let req = Request::RegMr { pd: pd.handle, addr, len: len as u64, iova: addr, access, pieces };
        match pd.ctx.call(&req, &[])?.0 {
            Response::Mr { key } => Ok(Mr { ctx: pd.ctx.clone(), key, addr, len: len as u64 }),
            _ => Err(proto("RegMr")),
        }
    }

    /// Register the whole buffer.
    pub fn register(pd: &Pd, buf: &Buffer, access: u32) -> Result<Mr> {
        Mr::register_range(pd, buf, 0, buf.len(), access)
    }

    /// An SGE of `len` bytes at `offset` into the MR.
    #[inline]
    pub fn sge(&self, offset: u64, len: u32) -> ShmSge {
        ShmSge { addr: self.addr + offset, length: len, lkey: self.key }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let _ = self.ctx.call_ok(&Request::DeregMr { key: self.key });
    }
}
