//! pmrxedv: fast registration for userspace (`include/pmrxedv.h`).
//!
//! A fast-registration MR is a [`ShimMr`] with `fast = true`: `AllocMr` reserves the key,
//! `MapMrSg` stages a page list in the service, and the REG_MR / LOCAL_INV work requests
//! travel through the send queue like any other WQE, so the service executes them in SQ
//! order (DESIGN.md invariants 1–3). Memory named by `map_mr_sg` is made shared exactly as
//! `ibv_reg_mr` does it; the MR keeps its segment references until it is deregistered
//! (`ibv_dereg_mr`), because an installed translation may still point at older segments.
use crate::boundary::{ffi_boundary, ret_errno, ret_ptr, Errno, Handle, Res};
use crate::client;
use crate::mr::{ShimMr, SEGMENTS};
use crate::pd::ShimPd;
use crate::qp::ShimQp;
use crate::sys::*;
use pmrxe_abi::ctrl::{Request, Response};
use pmrxe_abi::{send_flags, wr_opcode, ShmSendWqe};
use std::os::raw::{c_int, c_uint};

/// # Safety
/// `pd` is ours.
#[no_mangle]
pub unsafe extern "C" fn pmrxedv_alloc_mr(pd: *mut ibv_pd, max_num_sg: u32) -> *mut ibv_mr {
    ffi_boundary(std::ptr::null_mut(), || {
        ret_ptr((|| {
            // SAFETY: magic-checked.
            let p = unsafe { ShimPd::from_c(pd) }?;
            if max_num_sg == 0 {
                return Err(Errno::INVAL);
            }
            let (r, _) = client::existing()?.call(&Request::AllocMr { pd: p.pd.handle, max_num_sg }, &[])?;
            let Response::Mr { key } = r else { return Err(Errno(libc::EPROTO)) };
            let mr = ibv_mr { context: p.pd.context, pd, addr: std::ptr::null_mut(), length: 0, handle: key, lkey: key, rkey: key };
            Ok(ShimMr::new_fast(mr, max_num_sg).into_c())
        })())
    })
}

/// Check the page-list shape the kernel's `ib_sg_to_pages` accepts.
pub fn check_sg_shape(sg: &[(u64, u64)], offset: u64, page_size: u64) -> Res<()> {
    if !page_size.is_power_of_two() || page_size < 4096 || sg.is_empty() {
        return Err(Errno::INVAL);
    }
    let mask = page_size - 1;
    let last = sg.len() - 1;
    for (i, &(a, l)) in sg.iter().enumerate() {
        if l == 0 || a.checked_add(l).is_none() {
            return Err(Errno::INVAL);
        }
        if i == 0 && offset >= l {
            return Err(Errno::INVAL);
        }
        if i > 0 && a & mask != 0 {
            return Err(Errno::INVAL);
        }
        if i < last && (a + l) & mask != 0 {
            return Err(Errno::INVAL);
        }
    }
    Ok(())
}

/// # Safety
/// `mr` ours; `sg_list` holds `sg_nents` entries; `sg_offset` NULL or readable/writable.
#[no_mangle]
pub unsafe extern "C" fn pmrxedv_map_mr_sg(mr: *mut ibv_mr, sg_list: *const ibv_sge, sg_nents: c_int, sg_offset: *mut c_uint, page_size: c_uint) -> c_int {
    ffi_boundary(-libc::EIO, || {
        let r = (|| {
            // SAFETY: magic-checked.
            let m = unsafe { ShimMr::from_c(mr) }?;
            if !m.fast || sg_nents <= 0 || sg_list.is_null() {
                return Err(Errno::INVAL);
            }
            // SAFETY: caller contract.
            let list = unsafe { std::slice::from_raw_parts(sg_list, sg_nents as usize) };
            // SAFETY: caller contract.
            let off = if sg_offset.is_null() { 0 } else { u64::from(unsafe { *sg_offset }) };
            let sg: Vec<(u64, u64)> = list.iter().map(|s| (s.addr, u64::from(s.length))).collect();
            check_sg_shape(&sg, off, u64::from(page_size))?;
            // Pages per entry bound the MR's page slots.
            let ps = u64::from(page_size);
            let pages: u64 = sg.iter().enumerate().map(|(i, &(a, l))| {
                let a = if i == 0 { a + off } else { a };
                let l = if i == 0 { l - off } else { l };
                ((a + l + ps - 1) & !(ps - 1)).saturating_sub(a & !(ps - 1)) / ps
            }).sum();
            if pages > u64::from(m.max_num_sg) {
                return Err(Errno::INVAL);
            }
            let c = client::existing()?;
            {
                let mut segs = SEGMENTS.lock().unwrap_or_else(|e| e.into_inner());
                for &(a, l) in &sg {
                    let (_, ids) = segs.cover(c, a, l)?;
                    // Keep one reference per segment for the MR's lifetime.
                    let mut extra = Vec::new();
                    m.update(|_, st| {
                        for id in ids {
                            if st.segs.contains(&id) {
                                extra.push(id);
                            } else {
                                st.segs.push(id);
                            }
                        }
                    });
                    segs.release(c, &extra);
                }
            }
            let (r, _) = c.call(&Request::MapMrSg { key: m.mr().handle, sg: sg.clone(), sg_offset: off, page_size: ps }, &[])?;
            let Response::Mapped { n } = r else { return Err(Errno(libc::EPROTO)) };
            let total: u64 = sg.iter().take(n as usize).map(|s| s.1).sum::<u64>() - off;
            m.update(|mr, _| {
                mr.addr = (sg[0].0 + off) as *mut std::ffi::c_void;
                mr.length = total as usize;
            });
            if !sg_offset.is_null() {
                // SAFETY: caller contract.
                unsafe { *sg_offset = 0 };
            }
            Ok(n as c_int)
        })();
        match r {
            Ok(n) => n,
            Err(Errno(e)) => -e,
        }
    })
}

/// # Safety
/// `mr` ours.
#[no_mangle]
pub unsafe extern "C" fn pmrxedv_update_fast_reg_key(mr: *mut ibv_mr, key_byte: u8) {
    ffi_boundary((), || {
        // SAFETY: magic-checked.
        if let Ok(m) = unsafe { ShimMr::from_c(mr) } {
            m.update(|mr, _| {
                mr.lkey = (mr.lkey & !0xff) | u32::from(key_byte);
                mr.rkey = (mr.rkey & !0xff) | u32::from(key_byte);
            });
        }
    })
}

fn post_one(qp: *mut ibv_qp, w: ShmSendWqe) -> Res<()> {
    // SAFETY: magic-checked.
    let q = unsafe { ShimQp::from_qp(qp) }?;
    let mut sq = q.sq.lock();
    q.post_batch(&mut sq, &[w])
}

const ALLOWED_FLAGS: u32 = send_flags::SIGNALED | send_flags::FENCE;

/// # Safety
/// `qp`, `mr` ours.
#[no_mangle]
pub unsafe extern "C" fn pmrxedv_post_reg_mr(qp: *mut ibv_qp, wr_id: u64, mr: *mut ibv_mr, access: c_uint, flags: c_uint) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let m = unsafe { ShimMr::from_c(mr) }?;
            if !m.fast || flags & !ALLOWED_FLAGS != 0 {
                return Err(Errno::INVAL);
            }
            let mr = m.mr();
            let w = ShmSendWqe {
                wr_id,
                opcode: wr_opcode::PMRXE_REG_MR,
                send_flags: flags,
                mr_key: mr.handle,
                new_key: mr.rkey,
                access,
                remote_addr: mr.addr as u64,
                length: mr.length as u64,
                ..Default::default()
            };
            post_one(qp, w)
        })())
    })
}

/// # Safety
/// `qp` ours.
#[no_mangle]
pub unsafe extern "C" fn pmrxedv_post_local_inv(qp: *mut ibv_qp, wr_id: u64, key: u32, flags: c_uint) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            if flags & !ALLOWED_FLAGS != 0 {
                return Err(Errno::INVAL);
            }
            post_one(qp, ShmSendWqe { wr_id, opcode: wr_opcode::LOCAL_INV, send_flags: flags, imm_or_inv: key, ..Default::default() })
        })())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sg_shape_follows_ib_sg_to_pages() {
        assert!(check_sg_shape(&[(0x1000, 0x3000)], 0x10, 4096).is_ok());
        assert!(check_sg_shape(&[(0x1010, 0xff0), (0x2000, 0x100)], 0, 4096).is_ok());
        // Middle entry not page aligned.
        assert_eq!(check_sg_shape(&[(0x1000, 0x1000), (0x2010, 0x100)], 0, 4096), Err(Errno::INVAL));
        // First entry not ending on a page.
        assert_eq!(check_sg_shape(&[(0x1000, 0x800), (0x2000, 0x100)], 0, 4096), Err(Errno::INVAL));
        assert_eq!(check_sg_shape(&[(0x1000, 0x1000)], 0, 3000), Err(Errno::INVAL));
        assert_eq!(check_sg_shape(&[(0x1000, 0x10)], 0x10, 4096), Err(Errno::INVAL));
        assert_eq!(check_sg_shape(&[], 0, 4096), Err(Errno::INVAL));
    }
}
