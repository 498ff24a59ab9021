//! Work-request conversion: `ibv_send_wr` / `ibv_recv_wr` → shared-memory WQEs.
//!
//! Pure functions over the application's structs (plus handle look-ups), so they are tested
//! without a service. Opcodes and flags keep their libibverbs values (abi `wr_opcode`,
//! `send_flags`); the service validates them again.
//!
//! The post verbs fill the ring slot itself ([`fill_send_wqe`], [`fill_recv_wqe`] through
//! `Producer::stage_with`): the slot holds an older WQE's bytes, so a fill writes the whole
//! head first ([`send_head`]) and then only the live tail (SGEs or inline bytes), which is all
//! the service reads. Nothing on these paths allocates.
use crate::boundary::{Errno, Handle, Res};
use crate::mr::ShimMr;
use crate::mw::ShimMw;
use crate::pd::ShimAh;
use crate::sys::*;
use pmrxe_abi::{send_flags, wr_opcode, ShmRecvWqe, ShmSendWqe, ShmSge, MAX_INLINE_DATA, MAX_RECV_SGE, MAX_SEND_SGE};

/// Per-QP limits checked at post time (from the QP's granted capabilities).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline: u32,
    /// `IBV_QPT_*` of the QP.
    pub qp_type: u32,
}

impl Limits {
    fn send_sge(&self) -> usize {
        (self.max_send_sge as usize).min(MAX_SEND_SGE)
    }
    fn inline(&self) -> usize {
        (self.max_inline as usize).min(MAX_INLINE_DATA)
    }
}

/// Start a send WQE in `w` (a ring slot holding an older WQE's bytes): every head field is
/// written, the opcode fields zero. The exhaustive pattern makes a new `ShmSendWqe` field a
/// compile error here rather than a stale value in the ring.
pub fn send_head(w: &mut ShmSendWqe, wr_id: u64, opcode: u32, flags: u32) {
    let ShmSendWqe {
        wr_id: id,
        opcode: op,
        send_flags,
        num_sge,
        inline_len,
        imm_or_inv,
        rkey,
        remote_addr,
        compare_add,
        swap,
        length,
        ah,
        remote_qpn,
        remote_qkey,
        mr_key,
        mw_key,
        new_key,
        access,
        _reserved,
        data: _,
    } = w;
    (*id, *op, *send_flags) = (wr_id, opcode, flags);
    (*num_sge, *inline_len, *imm_or_inv, *rkey) = (0, 0, 0, 0);
    (*remote_addr, *compare_add, *swap, *length) = (0, 0, 0, 0);
    (*ah, *remote_qpn, *remote_qkey, *mr_key, *mw_key, *new_key, *access, *_reserved) = (0, 0, 0, 0, 0, 0, 0, 0);
}

/// Copy the buffers `bufs` (address, length) into the WQE as inline bytes
/// (`send_flags & INLINE`), refusing more than the QP's inline limit.
///
/// # Safety
/// Every buffer's `addr..addr+length` must be readable.
pub unsafe fn set_inline(w: &mut ShmSendWqe, lim: &Limits, bufs: impl IntoIterator<Item = (u64, usize)>) -> Res<()> {
    let max = lim.inline();
    let mut off = 0usize;
    for (addr, len) in bufs {
        if len == 0 {
            continue;
        }
        if len > max - off {
            return Err(Errno::INVAL);
        }
        if addr == 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: caller guarantees the source is readable; `off + len <= max <= data.len()`.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, w.data.as_mut_ptr().add(off), len) };
        off += len;
    }
    let total = off;
    w.inline_len = total as u32;
    w.num_sge = 0;
    w.send_flags |= send_flags::INLINE;
    Ok(())
}

/// Store SGEs in the WQE.
pub fn set_sges(w: &mut ShmSendWqe, lim: &Limits, sges: &[ibv_sge]) -> Res<()> {
    if sges.len() > lim.send_sge() {
        return Err(Errno::INVAL);
    }
    for (i, s) in sges.iter().enumerate() {
        w.set_sge(i, ShmSge { addr: s.addr, length: s.length, lkey: s.lkey });
    }
    w.num_sge = sges.len() as u32;
    w.inline_len = 0;
    w.send_flags &= !send_flags::INLINE;
    Ok(())
}

/// Opcodes whose payload may be inline.
fn may_inline(op: u32) -> bool {
    matches!(op, wr_opcode::SEND | wr_opcode::SEND_WITH_IMM | wr_opcode::SEND_WITH_INV | wr_opcode::RDMA_WRITE | wr_opcode::RDMA_WRITE_WITH_IMM)
}

/// Fill the bind fields of a BIND_MW WQE.
///
/// # Safety
/// `mw` and `info.mr` are NULL or handles of this shim.
pub unsafe fn set_bind(w: &mut ShmSendWqe, mw: *mut ibv_mw, new_rkey: u32, info: &ibv_mw_bind_info) -> Res<()> {
    // SAFETY: caller contract (magic-checked).
    let mw = unsafe { ShimMw::from_c(mw) }?;
    w.mw_key = mw.rkey();
    w.new_key = new_rkey;
    w.mr_key = if info.mr.is_null() {
        0 // unbind (zero-length)
    } else {
        // SAFETY: caller contract (magic-checked).
        unsafe { ShimMr::from_c(info.mr) }?.mr().lkey
    };
    w.remote_addr = info.addr;
    w.length = info.length;
    w.access = info.mw_access_flags;
    Ok(())
}

/// Checks a WQE must pass before the shim accepts it (rxe's `validate_send_wr`): an error
/// here is an immediate errno from `ibv_post_send`/`wr_complete`, never a WR that the service
/// rejects later without a completion (SEMANTICS E11).
pub fn check_wqe(w: &ShmSendWqe, lim: &Limits) -> Res<()> {
    if matches!(w.opcode, wr_opcode::ATOMIC_CMP_AND_SWP | wr_opcode::ATOMIC_FETCH_AND_ADD) {
        if lim.qp_type != IBV_QPT_RC {
            return Err(Errno::INVAL);
        }
        // The remote word is 8-byte aligned and the local buffer holds the 8-byte result.
        let local: u64 = (0..w.num_sge as usize).map(|i| u64::from(w.sge(i).length)).sum();
        if w.remote_addr & 7 != 0 || local < 8 || w.send_flags & send_flags::INLINE != 0 {
            return Err(Errno::INVAL);
        }
    }
    Ok(())
}

/// Convert one send WR into a fresh WQE (tests; the post path fills the ring slot with
/// [`fill_send_wqe`]).
///
/// # Safety
/// As [`fill_send_wqe`].
pub unsafe fn send_wr_to_wqe(wr: &ibv_send_wr, lim: &Limits) -> Res<ShmSendWqe> {
    let mut w = ShmSendWqe::default();
    // SAFETY: forwarded contract.
    unsafe { fill_send_wqe(&mut w, wr, lim) }?;
    Ok(w)
}

/// Convert one send WR into `w` (a ring slot: whatever it held is overwritten up to the live
/// tail). On error `w` holds garbage, which the caller does not stage.
///
/// # Safety
/// `wr.sg_list` holds `wr.num_sge` readable entries whose buffers are readable when INLINE;
/// handles in the WR (AH, MW, MR) are NULL or ours.
pub unsafe fn fill_send_wqe(w: &mut ShmSendWqe, wr: &ibv_send_wr, lim: &Limits) -> Res<()> {
    send_head(w, wr.wr_id, wr.opcode, wr.send_flags);
    if wr.num_sge < 0 || (wr.num_sge > 0 && wr.sg_list.is_null()) {
        return Err(Errno::INVAL);
    }
    let sges: &[ibv_sge] = if wr.num_sge == 0 {
        &[]
    } else {
        // SAFETY: caller contract.
        unsafe { std::slice::from_raw_parts(wr.sg_list, wr.num_sge as usize) }
    };
    // SAFETY: the unions are read according to the opcode, as the C API defines.
    unsafe {
        match wr.opcode {
            wr_opcode::SEND | wr_opcode::SEND_WITH_IMM | wr_opcode::SEND_WITH_INV => {
                w.imm_or_inv = wr.__bindgen_anon_1.imm_data; // same bits as invalidate_rkey
            }
            wr_opcode::RDMA_WRITE | wr_opcode::RDMA_WRITE_WITH_IMM | wr_opcode::RDMA_READ => {
                if wr.opcode == wr_opcode::RDMA_WRITE_WITH_IMM {
                    w.imm_or_inv = wr.__bindgen_anon_1.imm_data;
                }
                w.remote_addr = wr.wr.rdma.remote_addr;
                w.rkey = wr.wr.rdma.rkey;
            }
            wr_opcode::ATOMIC_CMP_AND_SWP | wr_opcode::ATOMIC_FETCH_AND_ADD => {
                w.remote_addr = wr.wr.atomic.remote_addr;
                w.rkey = wr.wr.atomic.rkey;
                w.compare_add = wr.wr.atomic.compare_add;
                w.swap = wr.wr.atomic.swap;
            }
            wr_opcode::LOCAL_INV => {
                w.imm_or_inv = wr.__bindgen_anon_1.invalidate_rkey;
            }
            wr_opcode::BIND_MW => {
                let b = &wr.__bindgen_anon_2.bind_mw;
                set_bind(w, b.mw, b.rkey, &b.bind_info)?;
            }
            _ => return Err(Errno::INVAL), // TSO, DRIVER1, unknown
        }
        if lim.qp_type == IBV_QPT_UD {
            if !matches!(wr.opcode, wr_opcode::SEND | wr_opcode::SEND_WITH_IMM) {
                return Err(Errno::INVAL);
            }
            w.ah = ShimAh::from_c(wr.wr.ud.ah)?.ah.handle;
            w.remote_qpn = wr.wr.ud.remote_qpn;
            w.remote_qkey = wr.wr.ud.remote_qkey;
        }
    }
    match wr.opcode {
        wr_opcode::LOCAL_INV | wr_opcode::BIND_MW => {
            w.send_flags &= !send_flags::INLINE;
            w.num_sge = 0;
        }
        op if wr.send_flags & send_flags::INLINE != 0 && may_inline(op) => {
            // SAFETY: caller contract: inline buffers are readable.
            unsafe { set_inline(w, lim, sges.iter().map(|s| (s.addr, s.length as usize))) }?;
        }
        _ => set_sges(w, lim, sges)?,
    }
    check_wqe(w, lim)
}

/// Convert one receive WR into a fresh WQE (tests; the post path uses [`fill_recv_wqe`]).
///
/// # Safety
/// As [`fill_recv_wqe`].
pub unsafe fn recv_wr_to_wqe(wr: &ibv_recv_wr, max_sge: u32) -> Res<ShmRecvWqe> {
    let mut w = ShmRecvWqe::default();
    // SAFETY: forwarded contract.
    unsafe { fill_recv_wqe(&mut w, wr, max_sge) }?;
    Ok(w)
}

/// Convert one receive WR into `w` (a ring slot: the head and the live SGEs are written,
/// the SGEs past `num_sge` keep older bytes, which the service does not read).
///
/// # Safety
/// `wr.sg_list` holds `wr.num_sge` readable entries.
pub unsafe fn fill_recv_wqe(w: &mut ShmRecvWqe, wr: &ibv_recv_wr, max_sge: u32) -> Res<()> {
    let max = (max_sge as usize).min(MAX_RECV_SGE);
    if wr.num_sge < 0 || wr.num_sge as usize > max || (wr.num_sge > 0 && wr.sg_list.is_null()) {
        return Err(Errno::INVAL);
    }
    let ShmRecvWqe { wr_id, num_sge, _reserved, sge } = w;
    (*wr_id, *num_sge, *_reserved) = (wr.wr_id, wr.num_sge as u32, 0);
    for (i, dst) in sge.iter_mut().take(wr.num_sge as usize).enumerate() {
        // SAFETY: caller contract, i < num_sge.
        let s = unsafe { &*wr.sg_list.add(i) };
        *dst = ShmSge { addr: s.addr, length: s.length, lkey: s.lkey };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim() -> Limits {
        Limits { max_send_sge: 4, max_recv_sge: 2, max_inline: 64, qp_type: IBV_QPT_RC }
    }
    fn wr(op: u32, sg: &mut [ibv_sge], flags: u32) -> ibv_send_wr {
        // SAFETY: plain C data.
        let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = 77;
        w.opcode = op;
        w.send_flags = flags;
        w.sg_list = sg.as_mut_ptr();
        w.num_sge = sg.len() as i32;
        w
    }
    fn sge(addr: u64, length: u32, lkey: u32) -> ibv_sge {
        ibv_sge { addr, length, lkey }
    }

    #[test]
    fn every_opcode_carries_its_fields() {
        let mut sg = [sge(0x1000, 8, 5)];
        // SEND with imm
        let mut w = wr(IBV_WR_SEND_WITH_IMM, &mut sg, IBV_SEND_SIGNALED);
        w.__bindgen_anon_1.imm_data = 0x0102_0304;
        // SAFETY: sg_list valid, no inline.
        let q = unsafe { send_wr_to_wqe(&w, &lim()) }.unwrap();
        assert_eq!((q.wr_id, q.opcode, q.send_flags, q.imm_or_inv, q.num_sge), (77, 3, 2, 0x0102_0304, 1));
        assert_eq!(q.sge(0), ShmSge { addr: 0x1000, length: 8, lkey: 5 });
        // WRITE / WRITE_IMM / READ
        for op in [IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ] {
            let mut w = wr(op, &mut sg, 0);
            w.wr.rdma.remote_addr = 0xdead_0000;
            w.wr.rdma.rkey = 0x4242;
            w.__bindgen_anon_1.imm_data = 9;
            // SAFETY: as above.
            let q = unsafe { send_wr_to_wqe(&w, &lim()) }.unwrap();
            assert_eq!((q.opcode, q.remote_addr, q.rkey), (op, 0xdead_0000, 0x4242));
            assert_eq!(q.imm_or_inv, if op == IBV_WR_RDMA_WRITE_WITH_IMM { 9 } else { 0 });
        }
        // Atomics
        for op in [IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD] {
            let mut w = wr(op, &mut sg, 0);
            w.wr.atomic.remote_addr = 0x8000;
            w.wr.atomic.rkey = 3;
            w.wr.atomic.compare_add = 11;
            w.wr.atomic.swap = 22;
            // SAFETY: as above.
            let q = unsafe { send_wr_to_wqe(&w, &lim()) }.unwrap();
            assert_eq!((q.remote_addr, q.rkey, q.compare_add, q.swap), (0x8000, 3, 11, 22));
        }
        // SEND_WITH_INV and LOCAL_INV carry the key; LOCAL_INV has no SGEs.
        let mut w = wr(IBV_WR_SEND_WITH_INV, &mut sg, 0);
        w.__bindgen_anon_1.invalidate_rkey = 0xabc;
        // SAFETY: as above.
        assert_eq!(unsafe { send_wr_to_wqe(&w, &lim()) }.unwrap().imm_or_inv, 0xabc);
        let mut w = wr(IBV_WR_LOCAL_INV, &mut sg, IBV_SEND_FENCE);
        w.__bindgen_anon_1.invalidate_rkey = 0x1234_56ff;
        // SAFETY: as above.
        let q = unsafe { send_wr_to_wqe(&w, &lim()) }.unwrap();
        assert_eq!((q.imm_or_inv, q.num_sge, q.send_flags), (0x1234_56ff, 0, IBV_SEND_FENCE));
        // TSO / driver / unknown opcodes are refused.
        for op in [IBV_WR_TSO, IBV_WR_DRIVER1, 99] {
            let w = wr(op, &mut sg, 0);
            // SAFETY: as above.
            assert_eq!(unsafe { send_wr_to_wqe(&w, &lim()) }.unwrap_err(), Errno::INVAL);
        }
    }

    #[test]
    fn inline_copies_bytes_and_respects_the_limit() {
        let a = *b"hello ";
        let b = *b"world";
        let mut sg = [sge(a.as_ptr() as u64, 6, 0), sge(b.as_ptr() as u64, 5, 0)];
        let w = wr(IBV_WR_SEND, &mut sg, IBV_SEND_INLINE);
        // SAFETY: the SGEs point at live arrays.
        let q = unsafe { send_wr_to_wqe(&w, &lim()) }.unwrap();
        assert_eq!(q.inline_len, 11);
        assert_eq!(&q.data[..11], b"hello world");
        assert_eq!(q.num_sge, 0);
        assert_ne!(q.send_flags & IBV_SEND_INLINE, 0);
        let big = [0u8; 65];
        let mut sg = [sge(big.as_ptr() as u64, 65, 0)];
        let w = wr(IBV_WR_RDMA_WRITE, &mut sg, IBV_SEND_INLINE);
        // SAFETY: as above.
        assert_eq!(unsafe { send_wr_to_wqe(&w, &lim()) }.unwrap_err(), Errno::INVAL);
        // INLINE on READ is ignored (SGEs kept), as providers do.
        let mut sg = [sge(0x2000, 4, 1)];
        let w = wr(IBV_WR_RDMA_READ, &mut sg, IBV_SEND_INLINE);
        // SAFETY: not dereferenced (READ).
        let q = unsafe { send_wr_to_wqe(&w, &lim()) }.unwrap();
        assert_eq!((q.num_sge, q.send_flags & IBV_SEND_INLINE), (1, 0));
    }

    #[test]
    fn sge_limits_are_enforced() {
        let mut sg: Vec<ibv_sge> = (0..5).map(|i| sge(0x1000 * i, 1, 1)).collect();
        let w = wr(IBV_WR_SEND, &mut sg, 0);
        // SAFETY: valid list.
        assert_eq!(unsafe { send_wr_to_wqe(&w, &lim()) }.unwrap_err(), Errno::INVAL);
        let mut w = wr(IBV_WR_SEND, &mut sg[..4], 0);
        // SAFETY: valid list.
        assert_eq!(unsafe { send_wr_to_wqe(&w, &lim()) }.unwrap().num_sge, 4);
        w.num_sge = -1;
        // SAFETY: rejected before use.
        assert_eq!(unsafe { send_wr_to_wqe(&w, &lim()) }.unwrap_err(), Errno::INVAL);
        // Receive side.
        // SAFETY: plain C data.
        let mut r: ibv_recv_wr = unsafe { std::mem::zeroed() };
        r.wr_id = 5;
        r.sg_list = sg.as_mut_ptr();
        r.num_sge = 2;
        // SAFETY: valid list.
        let q = unsafe { recv_wr_to_wqe(&r, 2) }.unwrap();
        assert_eq!((q.wr_id, q.num_sge, q.sge[1].addr), (5, 2, 0x1000));
        r.num_sge = 3;
        // SAFETY: rejected before use.
        assert_eq!(unsafe { recv_wr_to_wqe(&r, 2) }.unwrap_err(), Errno::INVAL);
    }

    /// The post path fills a ring slot that holds an older WQE: what the service reads (the
    /// head and the live tail) comes out exactly as from a zeroed WQE, whatever the slot held.
    #[test]
    fn filling_a_used_slot_writes_the_whole_head_and_the_live_tail() {
        use pmrxe_abi::ring::Prefixed;
        let a = *b"inline!!";
        let mut sg = [sge(a.as_ptr() as u64, 8, 0), sge(0x3000, 16, 4)];
        let mut sg_inline = [sge(a.as_ptr() as u64, 8, 0)];
        let mut cases = [wr(IBV_WR_RDMA_WRITE, &mut sg, IBV_SEND_SIGNALED), wr(IBV_WR_RDMA_WRITE, &mut sg_inline, IBV_SEND_INLINE)];
        cases[0].wr.rdma.remote_addr = 0x8000;
        cases[0].wr.rdma.rkey = 12;
        for w in &cases {
            // SAFETY: the SGEs point at a live array or are not dereferenced (no INLINE).
            let fresh = unsafe { send_wr_to_wqe(w, &lim()) }.unwrap();
            // SAFETY: plain integers: any bytes are a valid WQE (Pod), as a used slot holds.
            let mut used: ShmSendWqe = unsafe { std::mem::transmute([0xABu8; 352]) };
            // SAFETY: as above.
            unsafe { fill_send_wqe(&mut used, w, &lim()) }.unwrap();
            let live = ShmSendWqe::HEAD + fresh.live_tail();
            // SAFETY: both are 352-byte Pod values; `live` is within them.
            let bytes = |q: &ShmSendWqe| unsafe { std::slice::from_raw_parts((q as *const ShmSendWqe).cast::<u8>(), live) }.to_vec();
            assert_eq!(bytes(&used), bytes(&fresh));
        }
        // Receive WQEs likewise (head and the live SGEs).
        // SAFETY: plain C data.
        let mut r: ibv_recv_wr = unsafe { std::mem::zeroed() };
        r.wr_id = 9;
        r.sg_list = sg.as_mut_ptr();
        r.num_sge = 1;
        // SAFETY: valid list; any bytes are a valid receive WQE.
        let (fresh, mut used) = unsafe { (recv_wr_to_wqe(&r, 2).unwrap(), std::mem::transmute::<[u8; 144], ShmRecvWqe>([0xAB; 144])) };
        // SAFETY: valid list.
        unsafe { fill_recv_wqe(&mut used, &r, 2) }.unwrap();
        assert_eq!((used.wr_id, used.num_sge, used._reserved, used.sge[0]), (fresh.wr_id, fresh.num_sge, 0, fresh.sge[0]));
    }

    #[test]
    fn ud_needs_an_ah_of_ours() {
        let mut sg = [sge(0x1000, 8, 5)];
        let w = wr(IBV_WR_SEND, &mut sg, 0);
        let l = Limits { qp_type: IBV_QPT_UD, ..lim() };
        // SAFETY: NULL AH is rejected, not dereferenced.
        assert_eq!(unsafe { send_wr_to_wqe(&w, &l) }.unwrap_err(), Errno::INVAL);
    }
}
