//! Devices and contexts: `ibv_get_device_list` … `ibv_close_device`, the query verbs, and the
//! extended `verbs_context` whose ops table serves the verbs that `verbs.h` inlines.
use crate::boundary::{copy_cstr, ffi_boundary, handle, nonnull, ret_errno, ret_ptr, Errno, Handle, Res};
use crate::client::{self, client};
use crate::sys::*;
use pmrxe_abi::ctrl::{DeviceInfo, Request};
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::raw::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// A device as handed out by `ibv_get_device_list` (lives for the whole process).
#[repr(C)]
pub struct ShimDevice {
    pub dev: ibv_device,
    magic: u64,
    pub index: u32,
}
handle!(ShimDevice, ibv_device, 0x504d_5845_4445_5631);

/// An open device: the C `ibv_context` lives inside a `verbs_context` (extended ABI).
///
/// Every thread of the application uses its contexts, and libibverbs writes parts of the C
/// struct itself (its mutex), so the shim holds only `&ShimContext` and the C struct lives in
/// an `UnsafeCell`, reached through [`ShimContext::as_ctx`].
#[repr(C)]
pub struct ShimContext {
    vctx: std::cell::UnsafeCell<verbs_context>,
    magic: u64,
    /// Index into the client's device list.
    pub dev: u32,
    /// `context.async_fd`: a duplicate of the service's async-event eventfd (crate::events).
    _async_fd: OwnedFd,
    /// `context.cmd_fd`: a sealed memfd naming this process, client session and device
    /// ([`crate::import`]); `ibv_import_device` on a dup of it opens another context on the
    /// same device and session. Closed by `ibv_close_device`.
    _cmd_fd: OwnedFd,
}
const CTX_MAGIC: u64 = 0x504d_5845_4354_5831;

/// Offset of the `ibv_context` inside our context (320 on x86-64, PLATFORM.md §4).
const CTX_OFFSET: usize = offset_of!(ShimContext, vctx) + offset_of!(verbs_context, context);

impl ShimContext {
    /// Recover our context from the `ibv_context` pointer.
    ///
    /// # Safety
    /// A non-NULL `ctx` must have been returned by our `ibv_open_device` and not closed.
    pub unsafe fn from_ctx<'a>(ctx: *mut ibv_context) -> Res<&'a ShimContext> {
        if ctx.is_null() {
            return Err(Errno::INVAL);
        }
        // SAFETY: container_of: `ctx` points at `vctx.context` inside a ShimContext (caller).
        // Shared, never `&mut`: every thread of the application uses its contexts.
        let c = unsafe { &*ctx.cast::<u8>().sub(CTX_OFFSET).cast::<ShimContext>() };
        if c.magic != CTX_MAGIC {
            return Err(Errno::INVAL);
        }
        Ok(c)
    }

    /// The `ibv_context` pointer handed to the application.
    pub fn as_ctx(&self) -> *mut ibv_context {
        self.vctx.get().cast::<u8>().wrapping_add(offset_of!(verbs_context, context)).cast()
    }

    /// `context->num_comp_vectors` (fixed at open).
    pub fn num_comp_vectors(&self) -> c_int {
        // SAFETY: a field of our allocation inside the UnsafeCell, read through a raw pointer.
        unsafe { std::ptr::addr_of!((*self.as_ctx()).num_comp_vectors).read() }
    }

    /// `context->async_fd`: the duplicate of the service's async-event eventfd we own.
    pub fn async_fd(&self) -> c_int {
        self._async_fd.as_raw_fd()
    }

    /// The device this context was opened on.
    pub fn info(&self) -> Res<&'static DeviceInfo> {
        client::existing()?.devices.get(self.dev as usize).ok_or(Errno::NODEV)
    }
}

struct DevList(Vec<usize>);
static DEVICES: OnceLock<DevList> = OnceLock::new();

fn devices() -> Res<&'static [usize]> {
    if let Some(d) = DEVICES.get() {
        return Ok(&d.0);
    }
    let c = client()?;
    let list = c
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            // SAFETY: ibv_device is plain C data; all-zero is valid.
            let mut dev: ibv_device = unsafe { std::mem::zeroed() };
            dev.node_type = IBV_NODE_CA;
            dev.transport_type = IBV_TRANSPORT_IB;
            copy_cstr(&mut dev.name, &d.name);
            // UCX lists the device only if /dev/infiniband/<dev_name> is a read/write character
            // device: the service provides that node under this name (service devnodes.rs).
            let node = pmrxe_abi::ctrl::dev_node_name(d.index);
            copy_cstr(&mut dev.dev_name, &node);
            copy_cstr(&mut dev.dev_path, &format!("/sys/class/infiniband_verbs/{node}"));
            copy_cstr(&mut dev.ibdev_path, &format!("/sys/class/infiniband/{}", d.name));
            Box::into_raw(Box::new(ShimDevice { dev, magic: <ShimDevice as Handle>::MAGIC, index: i as u32 })) as usize
        })
        .collect();
    Ok(&DEVICES.get_or_init(|| DevList(list)).0)
}

/// # Safety
/// `num_devices` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    ffi_boundary(std::ptr::null_mut(), || {
        let r = devices().and_then(|d| {
            // calloc so ibv_free_device_list can free(3) it.
            // SAFETY: plain allocation of d.len()+1 pointers.
            let arr = unsafe { libc::calloc(d.len() + 1, size_of::<*mut ibv_device>()) }.cast::<*mut ibv_device>();
            if arr.is_null() {
                return Err(Errno::NOMEM);
            }
            for (i, p) in d.iter().enumerate() {
                // SAFETY: `arr` has d.len()+1 slots.
                unsafe { *arr.add(i) = *p as *mut ibv_device };
            }
            if !num_devices.is_null() {
                // SAFETY: caller contract.
                unsafe { *num_devices = d.len() as c_int };
            }
            Ok(arr)
        });
        if r.is_err() && !num_devices.is_null() {
            // SAFETY: caller contract.
            unsafe { *num_devices = 0 };
        }
        // No service: an empty list (the reason was logged once by `client()`), as libibverbs
        // does on a host without RDMA devices — not an error the program has to special-case.
        let r = r.or_else(|e| {
            // SAFETY: a one-slot NULL-terminated array, freed by ibv_free_device_list.
            let arr = unsafe { libc::calloc(1, size_of::<*mut ibv_device>()) }.cast::<*mut ibv_device>();
            if arr.is_null() {
                Err(e)
            } else {
                Ok(arr)
            }
        });
        ret_ptr(r)
    })
}

/// # Safety
/// `list` is NULL or came from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    ffi_boundary((), || {
        // The devices themselves live for the process (contexts point at them).
        // SAFETY: allocated with calloc by ibv_get_device_list.
        unsafe { libc::free(list.cast()) }
    })
}

fn dev_info(dev: *mut ibv_device) -> Res<(&'static ShimDevice, &'static DeviceInfo)> {
    // SAFETY: devices are only ever created by us and never freed; magic is checked.
    let d: &'static ShimDevice = unsafe { ShimDevice::from_c(dev) }?;
    let info = client::existing()?.devices.get(d.index as usize).ok_or(Errno::NODEV)?;
    Ok((d, info))
}

/// # Safety
/// `device` is one of ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    ffi_boundary(std::ptr::null(), || match dev_info(device) {
        Ok((d, _)) => d.dev.name.as_ptr(),
        Err(e) => ret_ptr::<c_char>(Err(e)),
    })
}

/// # Safety
/// `device` is one of ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    ffi_boundary(0, || dev_info(device).map(|(_, i)| i.guid.to_be()).unwrap_or(0))
}

/// # Safety
/// `device` is one of ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    ffi_boundary(-1, || dev_info(device).map(|(_, i)| i.index as c_int).unwrap_or(-1))
}

/// # Safety
/// `device` is one of ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    ffi_boundary(std::ptr::null_mut(), || ret_ptr(open(device)))
}

/// The device handed out for client device `index`.
pub fn device_ptr(index: u32) -> Res<*mut ibv_device> {
    devices()?.get(index as usize).map(|p| *p as *mut ibv_device).ok_or(Errno::NODEV)
}

fn open(device: *mut ibv_device) -> Res<*mut ibv_context> {
    let (d, _) = dev_info(device)?;
    open_with(device, d.index, || crate::import::context_fd(d.index))
}

/// A new context on `device` (client device `index`) whose `cmd_fd` comes from `cmd_fd` (the
/// last fallible step: nothing fails after it, so a caller's fd is owned by the context only
/// on success). The context closes it in `ibv_close_device`.
pub fn open_with(device: *mut ibv_device, index: u32, cmd_fd: impl FnOnce() -> Res<OwnedFd>) -> Res<*mut ibv_context> {
    // async_fd: a duplicate of the service's async-event eventfd for this client, so it is
    // readable while an event is pending (crate::events).
    let events_fd = client::existing()?.events_fd.as_raw_fd();
    // SAFETY: F_DUPFD_CLOEXEC of a descriptor the client owns for the process's lifetime.
    let efd = unsafe { libc::fcntl(events_fd, libc::F_DUPFD_CLOEXEC, 0) };
    if efd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: fresh fd we own.
    let async_fd = unsafe { OwnedFd::from_raw_fd(efd) };
    // SAFETY: verbs_context is C data (pointers, integers, Option<fn>, pthread_mutex_t);
    // all-zero is valid and is PTHREAD_MUTEX_INITIALIZER on glibc.
    let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
    vctx.sz = size_of::<verbs_context>();
    vctx.query_port = Some(crate::device::vctx_query_port);
    vctx.query_device_ex = Some(crate::device::vctx_query_device_ex);
    vctx.create_qp_ex = Some(crate::qp::vctx_create_qp_ex);
    vctx.create_cq_ex = Some(crate::cq::vctx_create_cq_ex);
    let cmd_fd = cmd_fd()?;
    let c = &mut vctx.context;
    c.device = device;
    c.cmd_fd = cmd_fd.as_raw_fd();
    c.async_fd = async_fd.as_raw_fd();
    c.num_comp_vectors = 1;
    c.abi_compat = usize::MAX as *mut c_void;
    c.ops.poll_cq = Some(crate::cq::op_poll_cq);
    c.ops.req_notify_cq = Some(crate::cq::op_req_notify_cq);
    c.ops.post_send = Some(crate::qp::op_post_send);
    c.ops.post_recv = Some(crate::qp::op_post_recv);
    c.ops.post_srq_recv = Some(crate::srq::op_post_srq_recv);
    c.ops.alloc_mw = Some(crate::mw::op_alloc_mw);
    c.ops.bind_mw = Some(crate::mw::op_bind_mw);
    c.ops.dealloc_mw = Some(crate::mw::op_dealloc_mw);
    let b = Box::new(ShimContext { vctx: std::cell::UnsafeCell::new(vctx), magic: CTX_MAGIC, dev: index, _async_fd: async_fd, _cmd_fd: cmd_fd });
    let p = Box::into_raw(b);
    // SAFETY: `p` is a fresh, live allocation.
    Ok(unsafe { (*p).as_ctx() })
}

/// # Safety
/// `context` came from `ibv_open_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: validated by magic; the application gives up the context.
            unsafe { ShimContext::from_ctx(context) }?;
            // SAFETY: allocated by Box in `open` (container_of as in `from_ctx`, from the
            // application's pointer); no reference to it is used after this point.
            let mut b = unsafe { Box::from_raw(context.cast::<u8>().sub(CTX_OFFSET).cast::<ShimContext>()) };
            b.magic = 0;
            drop(b);
            Ok(())
        })())
    })
}

fn fill_device_attr(info: &DeviceInfo, a: &mut ibv_device_attr) {
    let s = &info.attr;
    // SAFETY: ibv_device_attr is plain C data.
    *a = unsafe { std::mem::zeroed() };
    copy_cstr(&mut a.fw_ver, &s.fw_ver);
    a.node_guid = (if s.node_guid != 0 { s.node_guid } else { info.guid }).to_be();
    a.sys_image_guid = (if s.sys_image_guid != 0 { s.sys_image_guid } else { info.guid }).to_be();
    a.max_mr_size = s.max_mr_size;
    a.page_size_cap = s.page_size_cap;
    a.vendor_id = s.vendor_id;
    a.vendor_part_id = s.vendor_part_id;
    a.hw_ver = s.hw_ver;
    let i = |v: u32| v.min(i32::MAX as u32) as c_int;
    a.max_qp = i(s.max_qp);
    a.max_qp_wr = i(s.max_qp_wr);
    a.device_cap_flags = s.device_cap_flags;
    a.max_sge = i(s.max_sge);
    a.max_sge_rd = i(s.max_sge_rd);
    a.max_cq = i(s.max_cq);
    a.max_cqe = i(s.max_cqe);
    a.max_mr = i(s.max_mr);
    a.max_pd = i(s.max_pd);
    a.max_qp_rd_atom = i(s.max_qp_rd_atom);
    a.max_res_rd_atom = i(s.max_res_rd_atom);
    a.max_qp_init_rd_atom = i(s.max_qp_init_rd_atom);
    a.atomic_cap = s.atomic_cap;
    a.max_mw = i(s.max_mw);
    a.max_ah = i(s.max_ah);
    a.max_mcast_grp = i(pmrxe_abi::McastLimits::GROUPS);
    a.max_mcast_qp_attach = i(pmrxe_abi::McastLimits::QPS_PER_GROUP);
    a.max_total_mcast_qp_attach = i(pmrxe_abi::McastLimits::TOTAL);
    a.max_srq = i(s.max_srq);
    a.max_srq_wr = i(s.max_srq_wr);
    a.max_srq_sge = i(s.max_srq_sge);
    a.max_pkeys = s.max_pkeys;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
}

/// # Safety
/// `context` is ours; `device_attr` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(context: *mut ibv_context, device_attr: *mut ibv_device_attr) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked context; caller-provided out pointer.
            let (c, a) = unsafe { (ShimContext::from_ctx(context)?, nonnull(device_attr)?) };
            fill_device_attr(c.info()?, a);
            Ok(())
        })())
    })
}

/// `verbs_context.query_device_ex`.
///
/// # Safety
/// `attr` has room for `attr_size` bytes.
pub unsafe extern "C" fn vctx_query_device_ex(
    context: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked context.
            let c = unsafe { ShimContext::from_ctx(context) }?;
            if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
                return Err(Errno::INVAL);
            }
            // SAFETY: plain C data.
            let mut full: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
            fill_device_attr(c.info()?, &mut full.orig_attr);
            full.phys_port_cnt_ex = 1;
            let n = attr_size.min(size_of::<ibv_device_attr_ex>());
            // SAFETY: the caller's buffer holds `attr_size >= n` bytes.
            unsafe {
                std::ptr::write_bytes(attr.cast::<u8>(), 0, attr_size);
                std::ptr::copy_nonoverlapping((&full as *const ibv_device_attr_ex).cast::<u8>(), attr.cast::<u8>(), n);
            }
            Ok(())
        })())
    })
}

fn port_attr(c: &ShimContext, port: u8) -> Res<ibv_port_attr> {
    if port != 1 {
        return Err(Errno::INVAL);
    }
    let p = &c.info()?.port;
    // SAFETY: plain C data.
    let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
    a.state = p.state;
    a.max_mtu = p.max_mtu;
    a.active_mtu = p.active_mtu;
    a.gid_tbl_len = p.gid_tbl_len as c_int;
    a.port_cap_flags = p.port_cap_flags;
    a.max_msg_sz = p.max_msg_sz;
    a.pkey_tbl_len = p.pkey_tbl_len;
    a.active_width = p.active_width;
    a.active_speed = p.active_speed;
    a.phys_state = p.phys_state;
    a.link_layer = p.link_layer;
    a.max_vl_num = 1;
    Ok(a)
}

/// `ibv_query_port` into a caller buffer of `len` bytes (the compat and extended layouts).
///
/// # Safety
/// `c` is NULL or a context of this shim; `out` is NULL or writable for `len` bytes.
unsafe fn copy_port_attr(c: *mut ibv_context, port: u8, out: *mut u8, len: usize) -> Res<()> {
    // SAFETY: magic-checked context.
    let ctx = unsafe { ShimContext::from_ctx(c) }?;
    if out.is_null() {
        return Err(Errno::INVAL);
    }
    let a = port_attr(ctx, port)?;
    let n = len.min(size_of::<ibv_port_attr>());
    // SAFETY: the caller's buffer holds `len >= n` bytes.
    unsafe { std::ptr::copy_nonoverlapping((&a as *const ibv_port_attr).cast::<u8>(), out, n) };
    Ok(())
}

/// `verbs_context.query_port`.
///
/// # Safety
/// `port_attr` has room for `len` bytes.
pub unsafe extern "C" fn vctx_query_port(context: *mut ibv_context, port: u8, port_attr: *mut ibv_port_attr, len: usize) -> c_int {
    // SAFETY: forwarded contract.
    ffi_boundary(libc::EIO, || ret_errno(unsafe { copy_port_attr(context, port, port_attr.cast(), len) }))
}

/// Exported `ibv_query_port@1.1` (legacy callers pass a `_compat_ibv_port_attr`, which ends
/// after `flags`: 48 bytes).
///
/// # Safety
/// `port_attr` has room for 48 bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(context: *mut ibv_context, port: u8, port_attr: *mut _compat_ibv_port_attr) -> c_int {
    const COMPAT_LEN: usize = offset_of!(ibv_port_attr, port_cap_flags2);
    // SAFETY: forwarded contract.
    ffi_boundary(libc::EIO, || ret_errno(unsafe { copy_port_attr(context, port, port_attr.cast(), COMPAT_LEN) }))
}

fn gid_of(c: &ShimContext, port: u8, index: c_int) -> Res<Option<pmrxe_abi::ctrl::GidEntry>> {
    if port != 1 || index < 0 {
        return Err(Errno::INVAL);
    }
    let info = c.info()?;
    if index as u32 >= info.port.gid_tbl_len.max(info.gids.len() as u32) {
        return Err(Errno::INVAL);
    }
    Ok(info.gids.iter().find(|g| g.index == index as u32).cloned())
}

/// # Safety
/// `gid` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(context: *mut ibv_context, port_num: u8, index: c_int, gid: *mut ibv_gid) -> c_int {
    ffi_boundary(-1, || {
        let r = (|| {
            // SAFETY: magic-checked context; caller-provided out pointer.
            let (c, out) = unsafe { (ShimContext::from_ctx(context)?, nonnull(gid)?) };
            // Empty slots below gid_tbl_len read as the zero GID (as sysfs shows them).
            out.raw = gid_of(c, port_num, index)?.map(|g| g.gid).unwrap_or([0; 16]);
            Ok(())
        })();
        crate::boundary::ret_minus1(r)
    })
}

/// `ibv_query_gid_type@IBVERBS_PRIVATE_34` (ibv_devinfo): the sysfs flavour of the type
/// (`enum ibv_gid_type_sysfs`: 0 = IB/RoCE v1, 1 = RoCE v2).
///
/// # Safety
/// `type_` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(context: *mut ibv_context, port_num: u8, index: c_uint, type_: *mut c_uint) -> c_int {
    ffi_boundary(-1, || {
        let r = (|| {
            // SAFETY: magic-checked context; caller-provided out pointer.
            let (c, out) = unsafe { (ShimContext::from_ctx(context)?, nonnull(type_)?) };
            // enum ibv_gid_type → sysfs: RoCE v2 = 1, IB / RoCE v1 = 0.
            *out = match gid_of(c, port_num, index as c_int)?.map(|g| g.gid_type) {
                Some(IBV_GID_TYPE_ROCE_V2) => 1,
                _ => 0,
            };
            Ok(())
        })();
        crate::boundary::ret_minus1(r)
    })
}
use std::os::raw::c_uint;

/// The `ibv_gid_entry` of a GID of port 1.
fn gid_entry(c: &ShimContext, g: &pmrxe_abi::ctrl::GidEntry) -> Res<ibv_gid_entry> {
    // SAFETY: plain C data.
    let mut e: ibv_gid_entry = unsafe { std::mem::zeroed() };
    e.gid.raw = g.gid;
    e.gid_index = g.index;
    e.port_num = 1;
    // The service reports enum ibv_gid_type; an "IB" GID on an Ethernet port is RoCE v1.
    let eth = c.info()?.port.link_layer == IBV_LINK_LAYER_ETHERNET as u8;
    e.gid_type = match g.gid_type {
        IBV_GID_TYPE_IB if eth => IBV_GID_TYPE_ROCE_V1,
        t => t,
    };
    Ok(e)
}

/// `_ibv_query_gid_table@IBVERBS_1.11` (behind the inline `ibv_query_gid_table`): every valid
/// GID of every port, `entry_size` bytes apart. Returns the count, or -EINVAL when `flags` is
/// set, `entry_size` is too small or `max_entries` cannot hold the table (as rdma-core).
///
/// # Safety
/// `entries` has room for `max_entries * entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    ffi_boundary(-(libc::EIO as isize), || {
        let r = (|| {
            // SAFETY: magic-checked context.
            let c = unsafe { ShimContext::from_ctx(context) }?;
            if flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
                return Err(Errno::INVAL);
            }
            let gids = c.info()?.gids.clone();
            if max_entries < gids.len() || (!gids.is_empty() && entries.is_null()) {
                return Err(Errno::INVAL);
            }
            for (i, g) in gids.iter().enumerate() {
                let e = gid_entry(c, g)?;
                // SAFETY: i < max_entries and the caller provides max_entries * entry_size
                // bytes; entry_size >= size_of::<ibv_gid_entry>(), and the C structure is read
                // unaligned-safe by writing it with write_unaligned.
                unsafe { entries.cast::<u8>().add(i * entry_size).cast::<ibv_gid_entry>().write_unaligned(e) };
            }
            Ok(gids.len() as isize)
        })();
        match r {
            Ok(n) => n,
            Err(Errno(e)) => -(e as isize),
        }
    })
}

/// `_ibv_query_gid_ex@IBVERBS_1.11` (behind the inline `ibv_query_gid_ex`). Empty slots give
/// ENODATA, as rdma-core does, so perftest's GID auto-selection skips them.
///
/// # Safety
/// `entry` has room for `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            // SAFETY: magic-checked context.
            let c = unsafe { ShimContext::from_ctx(context) }?;
            if flags != 0 || entry.is_null() || entry_size < size_of::<ibv_gid_entry>() || port_num > 255 || gid_index > i32::MAX as u32 {
                return Err(Errno::INVAL);
            }
            let g = gid_of(c, port_num as u8, gid_index as c_int)?.ok_or(Errno(libc::ENODATA))?;
            let e = gid_entry(c, &g)?;
            // SAFETY: checked size above.
            unsafe { *entry = e };
            Ok(())
        })())
    })
}

/// # Safety
/// `pkey` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(context: *mut ibv_context, port_num: u8, index: c_int, pkey: *mut u16) -> c_int {
    ffi_boundary(-1, || {
        let r = (|| {
            // SAFETY: magic-checked context; caller-provided out pointer.
            let (c, out) = unsafe { (ShimContext::from_ctx(context)?, nonnull(pkey)?) };
            if port_num != 1 || index < 0 || index as u32 >= u32::from(c.info()?.port.pkey_tbl_len.max(1)) {
                return Err(Errno::INVAL);
            }
            // Only the default full-membership P_Key (network order).
            *out = if index == 0 { 0xffffu16.to_be() } else { 0 };
            Ok(())
        })();
        crate::boundary::ret_minus1(r)
    })
}

/// # Safety
/// `context` is ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(context: *mut ibv_context, port_num: u8, pkey: u16) -> c_int {
    ffi_boundary(-1, || {
        // SAFETY: magic-checked context.
        match unsafe { ShimContext::from_ctx(context) } {
            Ok(_) if port_num == 1 && u16::from_be(pkey) & 0x7fff == 0x7fff => 0,
            _ => {
                crate::boundary::set_errno(libc::ENOENT);
                -1
            }
        }
    })
}

/// `ibv_attach_mcast`: the UD QP receives the datagrams sent to multicast group `gid` on its
/// device (the service refuses other QP types, unicast GIDs and attachments beyond the limits
/// `ibv_query_device` reports). `lid` is unused on RoCE.
///
/// # Safety
/// `qp` is ours; `gid` is readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    mcast(qp, gid, true)
}

/// `ibv_detach_mcast` (EINVAL when the QP is not attached to `gid`).
///
/// # Safety
/// See `ibv_attach_mcast`.
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    mcast(qp, gid, false)
}

fn mcast(qp: *mut ibv_qp, gid: *const ibv_gid, attach: bool) -> c_int {
    ffi_boundary(libc::EIO, || {
        ret_errno((|| {
            if gid.is_null() {
                return Err(Errno::INVAL);
            }
            // SAFETY: `gid` is the caller's readable ibv_gid (16 bytes, any bit pattern valid);
            // read unaligned, as an application may pass any pointer.
            let gid: [u8; 16] = unsafe { std::ptr::read_unaligned(gid as *const [u8; 16]) };
            mcast_qp(qp, gid, attach)
        })())
    })
}

/// Attach (or detach) `qp` to the multicast group `gid` at the service.
pub(crate) fn mcast_qp(qp: *mut ibv_qp, gid: [u8; 16], attach: bool) -> Res<()> {
    // SAFETY: magic-checked QP.
    let q = unsafe { crate::qp::ShimQp::from_qp(qp) }?;
    let req = if attach { Request::AttachMcast { qpn: q.qpn, gid } } else { Request::DetachMcast { qpn: q.qpn, gid } };
    client::existing()?.call_ok(&req)
}
