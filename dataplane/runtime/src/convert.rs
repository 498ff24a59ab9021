//! Client WQEs (untrusted bytes copied out of shared memory) → engine WQEs, and engine CQEs
//! → client CQEs. Every field is range-checked here, once; the engine never sees a value a
//! client could not legitimately have posted.
use pmrxe_abi::{send_flags, wr_opcode, ShmCqe, ShmRecvWqe, ShmSendWqe, MAX_RECV_SGE};
use pmrxe_mem::{Access, Key, Sge};
use pmrxe_transport::{AddressVector, Cqe, RecvWqe, SendFlags, SendOp, SendWqe, UdDest, MAX_INLINE, MAX_SGE};

/// Why a client WQE was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WqeError {
    /// Opcode unknown or not supported.
    BadOpcode(u32),
    /// More SGEs than the engine supports.
    TooManySge(u32),
    /// Inline data longer than supported.
    InlineTooLong(u32),
    /// Unknown address handle.
    BadAh(u32),
}

/// Convert a client send WQE into `out`, the lcore's reusable scratch WQE: only the used
/// SGEs and inline bytes are written (`num_sge`/`inline_len` bound what is read), so a post
/// costs what the client posted, not a 512-byte clear. `ah` resolves UD address handles.
pub fn send_wqe(w: &ShmSendWqe, ah: impl Fn(u32) -> Option<AddressVector>, is_ud: bool, out: &mut SendWqe) -> Result<(), WqeError> {
    let op = match w.opcode {
        wr_opcode::SEND => SendOp::Send,
        wr_opcode::SEND_WITH_IMM => SendOp::SendImm(w.imm_or_inv),
        wr_opcode::SEND_WITH_INV => SendOp::SendInv(w.imm_or_inv),
        wr_opcode::RDMA_WRITE => SendOp::Write,
        wr_opcode::RDMA_WRITE_WITH_IMM => SendOp::WriteImm(w.imm_or_inv),
        wr_opcode::RDMA_READ => SendOp::Read,
        wr_opcode::ATOMIC_CMP_AND_SWP => SendOp::CmpSwap { compare: w.compare_add, swap: w.swap },
        wr_opcode::ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd { add: w.compare_add },
        wr_opcode::LOCAL_INV => SendOp::LocalInv { key: Key(w.imm_or_inv) },
        wr_opcode::PMRXE_REG_MR => SendOp::RegMr {
            mr: Key(w.mr_key),
            key: Key(w.new_key),
            access: Access(w.access),
            iova: (w.remote_addr != 0).then_some(w.remote_addr),
            length: (w.length != 0).then_some(w.length),
        },
        wr_opcode::BIND_MW => SendOp::BindMw {
            mw: Key(w.mw_key),
            new_key: Key(w.new_key),
            mr: Key(w.mr_key),
            addr: w.remote_addr,
            len: w.length,
            access: Access(w.access),
        },
        other => return Err(WqeError::BadOpcode(other)),
    };
    out.wr_id = w.wr_id;
    out.op = op;
    out.num_sge = 0;
    out.inline_len = 0;
    out.ud = None;
    out.flags = SendFlags(w.send_flags & (send_flags::FENCE | send_flags::SIGNALED | send_flags::SOLICITED | send_flags::INLINE));
    out.remote_addr = w.remote_addr;
    out.rkey = w.rkey;
    if out.op.is_local() {
        out.flags = SendFlags(out.flags.0 & !send_flags::INLINE);
    } else if w.send_flags & send_flags::INLINE != 0 {
        let n = w.inline_len as usize;
        if n > MAX_INLINE || n > w.data.len() {
            return Err(WqeError::InlineTooLong(w.inline_len));
        }
        pmrxe_crc::copy_short(&mut out.inline[..n], &w.data[..n]);
        out.inline_len = n;
    } else {
        let n = w.num_sge as usize;
        if n > MAX_SGE {
            return Err(WqeError::TooManySge(w.num_sge));
        }
        for i in 0..n {
            let s = w.sge(i);
            out.sges[i] = Sge { addr: s.addr, len: s.length, lkey: Key(s.lkey) };
        }
        out.num_sge = n;
    }
    if is_ud && !out.op.is_local() {
        let av = ah(w.ah).ok_or(WqeError::BadAh(w.ah))?;
        out.ud = Some(UdDest { av, remote_qpn: w.remote_qpn & 0xFF_FFFF, remote_qkey: w.remote_qkey });
    }
    Ok(())
}

/// Convert a client receive WQE.
pub fn recv_wqe(w: &ShmRecvWqe) -> Result<RecvWqe, WqeError> {
    let n = w.num_sge as usize;
    if n > MAX_RECV_SGE.min(MAX_SGE) {
        return Err(WqeError::TooManySge(w.num_sge));
    }
    let mut out = RecvWqe::new(w.wr_id);
    for i in 0..n {
        let s = w.sge[i];
        out.sges[i] = Sge { addr: s.addr, len: s.length, lkey: Key(s.lkey) };
    }
    out.num_sge = n;
    Ok(out)
}

/// Convert an engine completion for the client.
pub fn cqe(c: &Cqe) -> ShmCqe {
    ShmCqe {
        wr_id: c.wr_id,
        status: c.status as u32,
        opcode: c.opcode as u32,
        vendor_err: 0,
        byte_len: c.byte_len,
        imm_or_inv: c.imm_data.or(c.invalidated_rkey).unwrap_or(0),
        qp_num: c.qp_num,
        src_qp: c.src_qp,
        wc_flags: c.wc_flags.0,
        pkey_index: c.pkey_index,
        slid: c.slid,
        sl: c.sl,
        dlid_path_bits: c.dlid_path_bits,
        _reserved: [0; 18],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmrxe_abi::ShmSge;

    #[test]
    fn write_with_sges_converts_and_bad_fields_are_rejected() {
        let mut w = ShmSendWqe { wr_id: 7, opcode: wr_opcode::RDMA_WRITE, send_flags: send_flags::SIGNALED, num_sge: 2, remote_addr: 0x1000, rkey: 0x1234, ..Default::default() };
        w.set_sge(0, ShmSge { addr: 10, length: 20, lkey: 30 });
        w.set_sge(1, ShmSge { addr: 40, length: 50, lkey: 60 });
        let mut s = SendWqe::new(0, SendOp::Send);
        send_wqe(&w, |_| None, false, &mut s).unwrap();
        assert_eq!(s.op, SendOp::Write);
        assert_eq!(s.sg_list(), &[Sge { addr: 10, len: 20, lkey: Key(30) }, Sge { addr: 40, len: 50, lkey: Key(60) }]);
        assert!(s.signaled());
        w.num_sge = 99;
        assert_eq!(send_wqe(&w, |_| None, false, &mut s).unwrap_err(), WqeError::TooManySge(99));
        w.opcode = 0xdead;
        assert_eq!(send_wqe(&w, |_| None, false, &mut s).unwrap_err(), WqeError::BadOpcode(0xdead));
        let mut i = ShmSendWqe { opcode: wr_opcode::SEND, send_flags: send_flags::INLINE, inline_len: 5, ..Default::default() };
        i.data[..5].copy_from_slice(b"hello");
        send_wqe(&i, |_| None, false, &mut s).unwrap();
        assert_eq!(&s.inline[..s.inline_len], b"hello");
        assert!(s.sg_list().is_empty(), "the previous conversion's SGEs do not leak into this one");
        i.inline_len = 100_000;
        assert!(matches!(send_wqe(&i, |_| None, false, &mut s), Err(WqeError::InlineTooLong(_))));
        let ud = ShmSendWqe { opcode: wr_opcode::SEND, ah: 5, ..Default::default() };
        assert_eq!(send_wqe(&ud, |_| None, true, &mut s).unwrap_err(), WqeError::BadAh(5));
    }
}
