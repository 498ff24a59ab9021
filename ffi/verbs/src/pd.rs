//! Protection domains and address handles.
use crate::boundary::{ffi_boundary, handle, nonnull, ret_errno, ret_ptr, Errno, Handle, Res};
use crate::client;
use crate::device::ShimContext;
use crate::sys::*;
use pmrxe_abi::ctrl::{AhAttr, Request, Response};
use std::os::raw::c_int;

/// A PD handle.
#[repr(C)]
pub struct ShimPd {
    pub pd: ibv_pd,
    magic: u64,
    /// Client device index of the PD's context (an imported PD must stay on its device).
    pub dev: u32,
}
handle!(ShimPd, ibv_pd, 0x504d_5845_5044_3031);

impl ShimPd {
    /// A handle for service PD `pd.handle` (a new one, or an imported one: `ibv_import_pd`).
    pub fn wrap(pd: ibv_pd, dev: u32) -> Box<ShimPd> {
        Box::new(ShimPd { pd, magic: ShimPd::MAGIC, dev })
    }

    /// The context of this PD.
    pub fn ctx(&self) -> Res<&'static ShimContext> {
        // SAFETY: set by ibv_alloc_pd from a validated context.
        unsafe { ShimContext::from_ctx(self.pd.context) }
    }
}

/// # Safety
/// `context` is ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    ffi_boundary(std::ptr::null_mut(), || {
        ret_ptr((|| {
            // SAFETY: magic-checked.
            let c = unsafe { ShimContext::from_ctx(context) }?;
            let (r, _) = client::existing()?.call(&Request::AllocPd { device: c.dev }, &[])?;
            let Response::Pd { pd } = r else { return Err(Errno(libc::EPROTO)) };
            Ok(ShimPd::wrap(ibv_pd { context, handle: pd }, c.dev).into_c())
        })())
    })
}

/// # Safety
/// `pd` is ours; the application no longer uses it.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let p = unsafe { ShimPd::from_c(pd) }?;
            client::existing()?.call_ok(&Request::DeallocPd { pd: p.pd.handle })?;
            // SAFETY: validated above; the service accepted the destroy.
            drop(unsafe { ShimPd::take(pd) });
            Ok(())
        })())
    })
}

/// An AH handle.
#[repr(C)]
pub struct ShimAh {
    pub ah: ibv_ah,
    magic: u64,
}
handle!(ShimAh, ibv_ah, 0x504d_5845_4148_3031);

/// Convert `ibv_ah_attr` to the control-protocol form.
pub fn ah_attr_from_c(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        // SAFETY: reading the raw bytes of a union of byte arrays is always valid.
        dgid: unsafe { a.grh.dgid.raw },
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        is_global: a.is_global != 0,
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        port_num: a.port_num,
    }
}

/// A RoCE port addresses by GID: an address vector without a GRH cannot be routed, and the
/// kernel refuses it (`rdma_check_ah_attr`: EINVAL) instead of creating an AH or a connection
/// that silently never delivers.
pub fn check_roce_ah(a: &AhAttr) -> Res<()> {
    if !a.is_global {
        return Err(Errno::INVAL);
    }
    Ok(())
}

/// Convert back (query QP).
pub fn ah_attr_to_c(a: &AhAttr) -> ibv_ah_attr {
    // SAFETY: plain C data.
    let mut c: ibv_ah_attr = unsafe { std::mem::zeroed() };
    c.grh.dgid.raw = a.dgid;
    c.grh.flow_label = a.flow_label;
    c.grh.sgid_index = a.sgid_index;
    c.grh.hop_limit = a.hop_limit;
    c.grh.traffic_class = a.traffic_class;
    c.is_global = a.is_global as u8;
    c.dlid = a.dlid;
    c.sl = a.sl;
    c.src_path_bits = a.src_path_bits;
    c.static_rate = a.static_rate;
    c.port_num = a.port_num;
    c
}

fn create_ah(pd: *mut ibv_pd, attr: AhAttr) -> Res<*mut ibv_ah> {
    // SAFETY: magic-checked.
    let p = unsafe { ShimPd::from_c(pd) }?;
    check_roce_ah(&attr)?;
    let (r, _) = client::existing()?.call(&Request::CreateAh { pd: p.pd.handle, attr }, &[])?;
    let Response::Ah { ah } = r else { return Err(Errno(libc::EPROTO)) };
    Ok(Box::new(ShimAh { ah: ibv_ah { context: p.pd.context, pd, handle: ah }, magic: ShimAh::MAGIC }).into_c())
}

/// # Safety
/// `pd` is ours; `attr` readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ffi_boundary(std::ptr::null_mut(), || {
        // SAFETY: caller-provided pointer.
        ret_ptr(unsafe { nonnull(attr) }.and_then(|a| create_ah(pd, ah_attr_from_c(a))))
    })
}

/// Fill `ah_attr` from a received completion (and its GRH, which RoCE always carries): the
/// reply goes back to the sender's GID.
///
/// # Safety
/// `wc`, `grh` readable, `ah_attr` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    ffi_boundary(-1, || {
        // SAFETY: caller-provided pointers; context magic-checked.
        let r = unsafe { init_ah_from_wc(context, port_num, wc, grh, ah_attr) };
        crate::boundary::ret_minus1(r)
    })
}

/// `ibv_init_ah_from_wc`: the address to answer the sender of `wc`.
///
/// # Safety
/// `context` is NULL or a context of this shim; `wc` and `ah_attr` are NULL or valid (read,
/// written); `grh` is NULL or readable when `wc` has IBV_WC_GRH.
unsafe fn init_ah_from_wc(context: *mut ibv_context, port_num: u8, wc: *mut ibv_wc, grh: *mut ibv_grh, ah_attr: *mut ibv_ah_attr) -> Res<()> {
    // SAFETY: forwarded contract.
    let (c, wc, out) = unsafe { (ShimContext::from_ctx(context)?, nonnull(wc)?, nonnull(ah_attr)?) };
    // SAFETY: plain C data.
    let mut a: ibv_ah_attr = unsafe { std::mem::zeroed() };
    a.dlid = wc.slid;
    a.sl = wc.sl;
    a.src_path_bits = wc.dlid_path_bits;
    a.port_num = port_num;
    if wc.wc_flags & IBV_WC_GRH != 0 {
        // SAFETY: caller contract.
        let g = unsafe { nonnull(grh) }?;
        a.is_global = 1;
        // SAFETY: unions of byte arrays.
        a.grh.dgid.raw = unsafe { g.sgid.raw };
        let vtf = u32::from_be(g.version_tclass_flow);
        a.grh.flow_label = vtf & 0xfffff;
        a.grh.traffic_class = ((vtf >> 20) & 0xff) as u8;
        a.grh.hop_limit = 0xff;
        // Our own GID that the peer addressed becomes the source GID index.
        // SAFETY: union of byte arrays.
        let dgid = unsafe { g.dgid.raw };
        let info = c.info()?;
        a.grh.sgid_index = info.gids.iter().find(|e| e.gid == dgid || e.gid[12..] == dgid[12..] && dgid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]).map(|e| e.index as u8).ok_or(Errno::NOENT)?;
    }
    *out = a;
    Ok(())
}

/// # Safety
/// As `ibv_init_ah_from_wc`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(pd: *mut ibv_pd, wc: *mut ibv_wc, grh: *mut ibv_grh, port_num: u8) -> *mut ibv_ah {
    ffi_boundary(std::ptr::null_mut(), || {
        ret_ptr((|| {
            // SAFETY: magic-checked PD, caller-provided wc/grh.
            let p = unsafe { ShimPd::from_c(pd) }?;
            // SAFETY: plain C data.
            let mut a: ibv_ah_attr = unsafe { std::mem::zeroed() };
            // SAFETY: forwarded contract.
            unsafe { init_ah_from_wc(p.pd.context, port_num, wc, grh, &mut a) }?;
            create_ah(pd, ah_attr_from_c(&a))
        })())
    })
}

/// # Safety
/// `ah` is ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked.
            let a = unsafe { ShimAh::from_c(ah) }?;
            client::existing()?.call_ok(&Request::DestroyAh { ah: a.ah.handle })?;
            // SAFETY: validated above.
            drop(unsafe { ShimAh::take(ah) });
            Ok(())
        })())
    })
}
