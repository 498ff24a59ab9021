//! Memory the table may translate into.
//!
//! A [`Region`] is a `(ptr, len)` range of this process kept alive by an `Arc`'d owner
//! ([`Backing`]). The bytes are *foreign* memory: clients and remote peers write them at any
//! time, like DMA targets. The table only ever copies in and out with raw copies; it never
//! makes a Rust reference to them.

use std::fmt;
use std::io;
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::MemError;

/// Something that keeps a memory range mapped for as long as it lives (an mmap of a client's
/// memfd or a file mapped by the service, a heap buffer).
pub trait Backing: Send + Sync {}

/// A range of this process's memory plus the owner that keeps it alive.
#[derive(Clone)]
pub struct Region {
    owner: Arc<dyn Backing>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region is a pointer into memory owned by a `Send + Sync` backing that lives as long
// as the Region; all accesses through it are raw copies (no references), so sharing it between
// threads is as safe as sharing the backing.
unsafe impl Send for Region {}
// SAFETY: see `Send`; `&Region` only exposes raw copies and the address.
unsafe impl Sync for Region {}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Region({:p}, {:#x})", self.ptr, self.len)
    }
}

impl Region {
    /// Wrap `len` bytes at `ptr` owned by `owner`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be mapped, readable and writable memory of this process for as long
    /// as `owner` (any clone of it) is alive, must not be freed or remapped by anyone while
    /// `owner` lives, and must never be the target of a Rust `&`/`&mut` reference held by
    /// anyone else (it is accessed with raw copies and atomics concurrently).
    pub unsafe fn new(owner: Arc<dyn Backing>, ptr: *mut u8, len: usize) -> Region {
        let ptr = NonNull::new(ptr).unwrap_or(NonNull::dangling());
        Region { owner, ptr, len }
    }

    /// A zero-filled heap buffer of `len` bytes (tests, small service-owned buffers).
    pub fn zeroed(len: usize) -> Region {
        Self::from_vec(vec![0u8; len])
    }

    /// Take ownership of a vector's bytes.
    pub fn from_vec(v: Vec<u8>) -> Region {
        let len = v.len();
        let raw: *mut [u8] = Box::into_raw(v.into_boxed_slice());
        let ptr = raw.cast::<u8>();
        let owner: Arc<dyn Backing> = Arc::new(HeapBacking { raw });
        // SAFETY: `raw` is a leaked boxed slice of `len` bytes, freed only by HeapBacking::drop
        // once every clone of `owner` is gone; no reference to it is kept.
        unsafe { Region::new(owner, ptr, len) }
    }

    /// Map `len` bytes of `fd` at `offset` shared (a client's memfd segment).
    pub fn map_fd<F: AsFd>(fd: F, offset: u64, len: usize) -> io::Result<Region> {
        let map = memmap2::MmapOptions::new()
            .offset(offset)
            .len(len)
            .map_raw(&fd.as_fd())?;
        let ptr = map.as_mut_ptr();
        let owner: Arc<dyn Backing> = Arc::new(FdBacking { _map: map });
        // SAFETY: the mapping lives as long as `owner`; MmapRaw never hands out references.
        Ok(unsafe { Region::new(owner, ptr, len) })
    }

    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// Start address as an integer (the "DMA address" used by `map_mr_sg`).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Zero length.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The owner (kept alive by the table while a translation refers to it).
    pub fn owner(&self) -> &Arc<dyn Backing> {
        &self.owner
    }

    /// A sub-range sharing the same owner.
    pub fn slice(&self, offset: usize, len: usize) -> Result<Region, MemError> {
        let end = offset.checked_add(len).ok_or(MemError::Overflow)?;
        if end > self.len {
            return Err(MemError::OutOfRange);
        }
        // SAFETY: inside our own range, which `self.owner` keeps alive.
        let ptr = unsafe { self.ptr.as_ptr().add(offset) };
        // SAFETY: subrange of a valid region, same owner.
        Ok(unsafe { Region::new(self.owner.clone(), ptr, len) })
    }

    /// Copy `dst.len()` bytes from `offset` (bounds-checked).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        self.check(offset, dst.len())?;
        // SAFETY: checked in range; the region is live memory not referenced elsewhere; `dst`
        // is a distinct Rust buffer so they do not overlap.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    /// Copy `src` to `offset` (bounds-checked).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        self.check(offset, src.len())?;
        // SAFETY: as in `read`.
        unsafe {
            core::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len())
        };
        Ok(())
    }

    /// Fill `len` bytes at `offset` with `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), MemError> {
        self.check(offset, len)?;
        // SAFETY: as in `read`.
        unsafe { core::ptr::write_bytes(self.ptr.as_ptr().add(offset), byte, len) };
        Ok(())
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), MemError> {
        let end = offset.checked_add(len).ok_or(MemError::Overflow)?;
        if end > self.len {
            Err(MemError::OutOfRange)
        } else {
            Ok(())
        }
    }
}

/// A leaked boxed slice, freed when the last Region clone goes.
struct HeapBacking {
    raw: *mut [u8],
}
// SAFETY: the box is only freed in Drop (once); bytes are accessed through raw copies only.
unsafe impl Send for HeapBacking {}
// SAFETY: as above; HeapBacking has no methods reading the bytes.
unsafe impl Sync for HeapBacking {}
impl Backing for HeapBacking {}
impl Drop for HeapBacking {
    fn drop(&mut self) {
        // SAFETY: `raw` came from Box::into_raw in Region::from_vec and is dropped once here.
        drop(unsafe { Box::from_raw(self.raw) });
    }
}

struct FdBacking {
    _map: memmap2::MmapRaw,
}
impl Backing for FdBacking {}
