//! Memory regions: user registrations over segment pieces, fast-reg MRs and their page lists.

use std::sync::Arc;

use pmrxe_abi::ctrl::{self, Response};
use pmrxe_mem::{Access, Key, Region, SgEntry};
use pmrxe_runtime::shm::MrMapping;

use pmrxe_config::LimitKind;

use super::{err, Reply, Session};
use crate::limits::Obj;

impl Session {
    pub(super) fn reg_mr(&mut self, pd: u32, addr: u64, len: u64, iova: u64, access: u32, pieces: &[ctrl::Piece]) -> Reply {
        let reservation = match self.reserve_on_pd(LimitKind::Mr, pd) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        let (region, tag) = match self.mr_region(pd, addr, len, pieces) {
            Ok(r) => r,
            Err((errno, msg)) => return (err(errno, &msg), vec![]),
        };
        match self.shared.mem.reg_mr(pd, region, iova, Access(access)) {
            Ok(k) => {
                super::fault::watch_mr(self.id, k.0, Some(tag));
                self.objs.mrs.insert(k.0, pd);
                self.commit(reservation, k.0.into());
                (Response::Mr { key: k.0 }, vec![])
            }
            Err(e) => (err(libc::EINVAL, &e.to_string()), vec![]),
        }
    }

    /// `ibv_rereg_mr`: the same key over a new PD/access/translation (one of this client's MRs).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rereg_mr(&mut self, key: u32, pd: u32, addr: u64, len: u64, iova: u64, access: u32, pieces: &[ctrl::Piece]) -> Reply {
        if !self.objs.mrs.contains_key(&key) {
            return (err(libc::EINVAL, "no such MR"), vec![]);
        }
        let (region, tag) = match self.mr_region(pd, addr, len, pieces) {
            Ok(r) => r,
            Err((errno, msg)) => return (err(errno, &msg), vec![]),
        };
        match self.shared.mem.rereg_mr(pmrxe_mem::Key(key), pd, region, iova, Access(access)) {
            Ok(()) => {
                super::fault::watch_mr(self.id, key, Some(tag));
                self.objs.mrs.insert(key, pd);
                (Response::Mr { key }, vec![])
            }
            Err(pmrxe_mem::MemError::MwBound) => (err(libc::EBUSY, "memory windows are bound to the MR"), vec![]),
            Err(e) => (err(libc::EINVAL, &e.to_string()), vec![]),
        }
    }

    /// The service's single map of a client registration `addr..addr+len` of PD `pd` from the
    /// segment pieces covering its pages, and the tag of its fault guards (issue 37: a fault
    /// rescued in it revokes the MR, `fault`). `Err`: the errno (EINVAL for an invalid
    /// request, EFAULT for memory that cannot be populated) and why.
    pub(super) fn mr_region(&mut self, pd: u32, addr: u64, len: u64, pieces: &[ctrl::Piece]) -> Result<(Region, u64), (i32, String)> {
        self.mr_region_inner(pd, addr, len, pieces).map_err(|e| match e {
            RegionError::Invalid(m) => (libc::EINVAL, m),
            RegionError::Fault(m) => (libc::EFAULT, m),
        })
    }

    fn mr_region_inner(&mut self, pd: u32, addr: u64, len: u64, pieces: &[ctrl::Piece]) -> Result<(Region, u64), RegionError> {
        if !self.objs.pds.contains_key(&pd) {
            return Err(RegionError::Invalid("no such PD".to_string()));
        }
        if len == 0 {
            return Err(RegionError::Invalid("zero-length MR".to_string()));
        }
        let Some(end) = addr.checked_add(len) else { return Err(RegionError::Invalid("range wraps".to_string())) };
        let a0 = addr & !4095;
        let a1 = match end.checked_add(4095) {
            Some(e) => e & !4095,
            None => return Err(RegionError::Invalid("range wraps".to_string())),
        };
        let mut parts = Vec::with_capacity(pieces.len());
        let mut total = 0u64;
        for p in pieces {
            let Some(s) = self.objs.segs.get(&p.seg) else { return Err(RegionError::Invalid("unknown segment".to_string())) };
            if p.seg_offset.checked_add(p.len).is_none_or(|e| e > s.len) {
                return Err(RegionError::Invalid("piece outside its segment".to_string()));
            }
            total = total.saturating_add(p.len);
            parts.push(s.piece(p.seg_offset, p.len));
        }
        if total != a1 - a0 {
            return Err(RegionError::Invalid("pieces do not cover the registration".to_string()));
        }
        let map = match MrMapping::assemble_at(a0, &parts) {
            Ok(m) => Arc::new(m),
            // Populating failed: a page that cannot be had (the kernel's pin says EFAULT).
            Err(e) if e.kind() == std::io::ErrorKind::OutOfMemory => return Err(RegionError::Fault(e.to_string())),
            Err(e) => return Err(RegionError::Invalid(e.to_string())),
        };
        // Tagged before the MR exists: a fault rescued from now on is blamed on it.
        let tag = super::fault::new_mr_tag();
        map.set_tag(tag);
        let ptr = map.as_ptr();
        // SAFETY: `map` covers [a0, a1) of the client's pages; the MR is [addr, addr+len) inside
        // it; the Arc keeps the mapping alive as long as the region; only raw copies touch it.
        let region = unsafe { Region::new(map, ptr.add((addr - a0) as usize), len as usize) };
        Ok((region, tag))
    }

    pub(super) fn dereg_mr(&mut self, key: u32) -> Reply {
        let sh = self.shared.clone();
        if self.objs.mrs.remove(&key).is_none() {
            return (err(libc::EINVAL, "no such MR"), vec![]);
        }
        match sh.mem.dereg_mr(Key(key)) {
            Ok(()) => {
                super::fault::forget_mr(key);
                self.release(Obj::Kind(LimitKind::Mr), key.into());
                (Response::Ok, vec![])
            }
            Err(e) => {
                self.objs.mrs.insert(key, 0);
                (err(libc::EBUSY, &e.to_string()), vec![])
            }
        }
    }

    pub(super) fn alloc_mr(&mut self, pd: u32, max_num_sg: u32) -> Reply {
        let sh = self.shared.clone();
        let reservation = match self.reserve_on_pd(LimitKind::Mr, pd) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        match sh.mem.alloc_mr(pd, max_num_sg) {
            Ok(k) => {
                super::fault::watch_mr(self.id, k.0, None);
                self.objs.mrs.insert(k.0, pd);
                self.commit(reservation, k.0.into());
                (Response::Mr { key: k.0 }, vec![])
            }
            Err(e) => (err(libc::EINVAL, &e.to_string()), vec![]),
        }
    }

    pub(super) fn map_mr_sg(&mut self, key: u32, sg: &[(u64, u64)], sg_offset: u64, page_size: u64) -> Reply {
        let sh = self.shared.clone();
        if !self.objs.mrs.contains_key(&key) {
            return (err(libc::EINVAL, "no such MR"), vec![]);
        }
        // Resolve each element to the segment containing it.
        let mut located = Vec::with_capacity(sg.len());
        for &(a, l) in sg {
            let hit = self.objs.segs.iter().find(|(_, s)| a >= s.base && a.checked_add(l).is_some_and(|e| e <= s.base + s.len));
            let Some((&id, _)) = hit else { return (err(libc::EINVAL, "scatter entry outside registered memory"), vec![]) };
            located.push((id, a, l));
        }
        for (id, _, _) in &located {
            let s = self.objs.segs.get_mut(id).expect("located above");
            if s.region.is_none() {
                match MrMapping::assemble_at(s.base, &[s.piece(0, s.len)]) {
                    Ok(m) => {
                        // A fault in it revokes this client's fast-reg MRs (fault.rs).
                        m.set_tag(super::fault::segment_tag(self.id));
                        let (ptr, len) = (m.as_ptr(), m.len());
                        // SAFETY: `m` maps the whole segment [ptr, ptr+len); the Arc keeps it
                        // mapped as long as the region; only raw copies touch it.
                        s.region = Some(unsafe { Region::new(Arc::new(m), ptr, len) });
                    }
                    Err(e) => return (err(libc::ENOMEM, &e.to_string()), vec![]),
                }
            }
        }
        let entries: Vec<SgEntry<'_>> = located
            .iter()
            .map(|(id, a, l)| {
                let s = &self.objs.segs[id];
                SgEntry { region: s.region.as_ref().expect("mapped above"), offset: (a - s.base) as usize, len: *l as usize }
            })
            .collect();
        match sh.mem.map_mr_sg(Key(key), &entries, sg_offset, page_size) {
            Ok(n) => {
                // The client addresses are the iova space the peers use.
                if let Some(&(a, _)) = sg.first() {
                    let _ = sh.mem.set_fast_reg_iova(Key(key), a + sg_offset);
                }
                (Response::Mapped { n: n as u32 }, vec![])
            }
            Err(e) => (err(libc::EINVAL, &e.to_string()), vec![]),
        }
    }
}

/// Why a registration's map could not be made.
enum RegionError {
    /// The request is wrong (EINVAL).
    Invalid(String),
    /// The memory cannot be populated (EFAULT, as a failed pin).
    Fault(String),
}
