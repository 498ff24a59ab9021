//! Client WQEs (untrusted bytes copied out of shared memory) → engine WQEs, and engine CQEs
//! → client CQEs. Every field is range-checked here, once; the engine never sees a value a
//! client could not legitimately have posted.
use pmrxe_abi::ring::Consumer;
use pmrxe_abi::{send_flags, wr_opcode, ShmCqe, ShmRecvWqe, ShmSendWqe, MAX_RECV_SGE};
use pmrxe_mem::{Access, Key, Sge};
use pmrxe_transport::{AddressVector, Cqe, Offer, RecvWqe, RecvWr, SendFlags, SendOp, SendWr, UdDest, MAX_INLINE, MAX_SGE};

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

/// A client send WQE (the lcore's copy of a ring entry) as the engine reads it: checked once
/// when made ([`ShmSendWr::new`]: opcode, gather-list and inline lengths, UD address handle),
/// then read field by field by `Qp::post_send`, which copies what it keeps into the SQ. No
/// `SendWqe` is built in between (its 512 bytes, and the engine's wide reads of an opcode just
/// written with a narrow store, cost more than the WQE's own fields).
pub struct ShmSendWr<'a> {
    w: &'a ShmSendWqe,
    /// The flags the engine sees (INLINE dropped for a local operation).
    flags: u32,
    /// Gather entries (0 for inline and local operations).
    num_sge: u32,
    /// Inline bytes (0 unless an inline, non-local WQE; at most `MAX_INLINE`).
    inline_len: u32,
    ud: Option<UdDest>,
}

/// The engine opcode of a client opcode (`None`: unknown or unsupported).
#[inline]
fn send_op(w: &ShmSendWqe) -> Option<SendOp> {
    Some(match w.opcode {
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
        _ => return None,
    })
}

/// Local operations (REG_MR, LOCAL_INV, BIND_MW) by client opcode.
fn is_local_opcode(op: u32) -> bool {
    matches!(op, wr_opcode::LOCAL_INV | wr_opcode::PMRXE_REG_MR | wr_opcode::BIND_MW)
}

impl<'a> ShmSendWr<'a> {
    /// Check `w` (`ah` resolves UD address handles; `is_ud`: the QP is UD).
    #[inline]
    pub fn new(w: &'a ShmSendWqe, ah: impl Fn(u32) -> Option<AddressVector>, is_ud: bool) -> Result<Self, WqeError> {
        if send_op(w).is_none() {
            return Err(WqeError::BadOpcode(w.opcode));
        }
        let local = is_local_opcode(w.opcode);
        let mut flags = w.send_flags & (send_flags::FENCE | send_flags::SIGNALED | send_flags::SOLICITED | send_flags::INLINE);
        let (mut num_sge, mut inline_len) = (0, 0);
        if local {
            // A local operation carries no payload: INLINE means nothing for it.
            flags &= !send_flags::INLINE;
        } else if flags & send_flags::INLINE != 0 {
            let n = w.inline_len as usize;
            if n > MAX_INLINE || n > w.data.len() {
                return Err(WqeError::InlineTooLong(w.inline_len));
            }
            inline_len = w.inline_len;
        } else {
            if w.num_sge as usize > MAX_SGE {
                return Err(WqeError::TooManySge(w.num_sge));
            }
            num_sge = w.num_sge;
        }
        let ud = if is_ud && !local {
            let av = ah(w.ah).ok_or(WqeError::BadAh(w.ah))?;
            Some(UdDest { av, remote_qpn: w.remote_qpn & 0xFF_FFFF, remote_qkey: w.remote_qkey })
        } else {
            None
        };
        Ok(ShmSendWr { w, flags, num_sge, inline_len, ud })
    }
}

impl SendWr for ShmSendWr<'_> {
    #[inline]
    fn wr_id(&self) -> u64 {
        self.w.wr_id
    }
    #[inline]
    fn op(&self) -> SendOp {
        // Checked by `new`; the copy it checked cannot have changed (it is the lcore's).
        send_op(self.w).unwrap_or(SendOp::Send)
    }
    #[inline]
    fn flags(&self) -> SendFlags {
        SendFlags(self.flags)
    }
    #[inline]
    fn remote_addr(&self) -> u64 {
        self.w.remote_addr
    }
    #[inline]
    fn rkey(&self) -> u32 {
        self.w.rkey
    }
    #[inline]
    fn num_sge(&self) -> usize {
        self.num_sge as usize
    }
    #[inline]
    fn sge(&self, i: usize) -> Sge {
        let s = self.w.sge(i);
        Sge { addr: s.addr, len: s.length, lkey: Key(s.lkey) }
    }
    #[inline]
    fn inline_len(&self) -> usize {
        self.inline_len as usize
    }
    #[inline]
    fn inline(&self) -> &[u8] {
        // `new` checked the length against both bounds.
        &self.w.data[..(self.inline_len as usize).min(MAX_INLINE)]
    }
    #[inline]
    fn ud(&self) -> Option<UdDest> {
        self.ud
    }
}

/// A client's receive WQE (the lcore's copy of its ring slot) as the engine reads it: checked
/// when made ([`ShmRecvWr::new`]: the scatter count), then read field by field by
/// `Qp::post_recv`, which copies what it keeps into the receive queue. No `RecvWqe` is built
/// in between.
pub struct ShmRecvWr<'a> {
    w: &'a ShmRecvWqe,
}

impl<'a> ShmRecvWr<'a> {
    /// Check `w`.
    #[inline]
    pub fn new(w: &'a ShmRecvWqe) -> Result<Self, WqeError> {
        if w.num_sge as usize > MAX_RECV_SGE.min(MAX_SGE) {
            return Err(WqeError::TooManySge(w.num_sge));
        }
        Ok(ShmRecvWr { w })
    }
}

impl RecvWr for ShmRecvWr<'_> {
    #[inline]
    fn wr_id(&self) -> u64 {
        self.w.wr_id
    }
    #[inline]
    fn num_sge(&self) -> usize {
        self.w.num_sge as usize
    }
    #[inline]
    fn sge(&self, i: usize) -> Sge {
        let s = self.w.sge[i];
        Sge { addr: s.addr, len: s.length, lkey: Key(s.lkey) }
    }
}

/// What a client's send ring offers the engine next ([`pmrxe_transport::WorkSource::next_send`]):
/// the entry at the ring's tail copied once into `scratch` (the client can rewrite its ring at
/// any time; only this copy is read), then checked there ([`ShmSendWr::new`]: a bad entry is
/// [`Offer::Malformed`]); impossible ring indices are [`Offer::Corrupt`]. The entry stays in the
/// ring until the caller advances past it. `ah` resolves UD address handles; `is_ud`: the QP
/// is UD. The lcore's rings and the seeded simulator's client rings both offer through here.
#[inline]
pub fn offer_send<'a>(ring: &mut Consumer<ShmSendWqe>, scratch: &'a mut ShmSendWqe, ah: impl Fn(u32) -> Option<AddressVector>, is_ud: bool) -> Offer<ShmSendWr<'a>> {
    match ring.peek_into(scratch) {
        Ok(true) => match ShmSendWr::new(scratch, ah, is_ud) {
            Ok(wr) => Offer::Wr(wr),
            Err(_) => Offer::Malformed,
        },
        Ok(false) => Offer::Empty,
        Err(_) => Offer::Corrupt,
    }
}

/// [`offer_send`] for a receive ring.
#[inline]
pub fn offer_recv<'a>(ring: &mut Consumer<ShmRecvWqe>, scratch: &'a mut ShmRecvWqe) -> Offer<ShmRecvWr<'a>> {
    match ring.peek_into(scratch) {
        Ok(true) => match ShmRecvWr::new(scratch) {
            Ok(wr) => Offer::Wr(wr),
            Err(_) => Offer::Malformed,
        },
        Ok(false) => Offer::Empty,
        Err(_) => Offer::Corrupt,
    }
}

/// Convert a client receive WQE into an owned one (for an SRQ, whose WQEs move to the QP a
/// message arrives on).
pub fn recv_wqe(w: &ShmRecvWqe) -> Result<RecvWqe, WqeError> {
    let v = ShmRecvWr::new(w)?;
    let mut out = RecvWqe::new(v.wr_id());
    for i in 0..v.num_sge() {
        out.sges[i] = v.sge(i);
    }
    out.num_sge = v.num_sge();
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
        let s = ShmSendWr::new(&w, |_| None, false).unwrap();
        assert_eq!((s.wr_id(), s.op(), s.remote_addr(), s.rkey()), (7, SendOp::Write, 0x1000, 0x1234));
        assert_eq!((0..s.num_sge()).map(|i| s.sge(i)).collect::<Vec<_>>(), [Sge { addr: 10, len: 20, lkey: Key(30) }, Sge { addr: 40, len: 50, lkey: Key(60) }]);
        assert_eq!(s.flags(), SendFlags::SIGNALED);
        assert_eq!((s.inline_len(), s.inline()), (0, &[][..]), "a gather WQE has no inline payload");
        w.num_sge = 99;
        assert_eq!(ShmSendWr::new(&w, |_| None, false).err(), Some(WqeError::TooManySge(99)));
        w.opcode = 0xdead;
        assert_eq!(ShmSendWr::new(&w, |_| None, false).err(), Some(WqeError::BadOpcode(0xdead)));
        let mut i = ShmSendWqe { opcode: wr_opcode::SEND, send_flags: send_flags::INLINE, inline_len: 5, num_sge: 3, ..Default::default() };
        i.data[..5].copy_from_slice(b"hello");
        let s = ShmSendWr::new(&i, |_| None, false).unwrap();
        assert_eq!((s.inline_len(), s.inline()), (5, &b"hello"[..]));
        assert_eq!(s.num_sge(), 0, "an inline WQE has no gather list, whatever num_sge says");
        i.inline_len = 100_000;
        assert!(matches!(ShmSendWr::new(&i, |_| None, false), Err(WqeError::InlineTooLong(_))));
        let ud = ShmSendWqe { opcode: wr_opcode::SEND, ah: 5, ..Default::default() };
        assert_eq!(ShmSendWr::new(&ud, |_| None, true).err(), Some(WqeError::BadAh(5)));
        // A local operation: no payload, INLINE dropped, no address handle needed on UD.
        let inv = ShmSendWqe { opcode: wr_opcode::LOCAL_INV, imm_or_inv: 0x4242, send_flags: send_flags::INLINE | send_flags::FENCE, inline_len: 9, num_sge: 2, ..Default::default() };
        let s = ShmSendWr::new(&inv, |_| None, true).unwrap();
        assert_eq!(s.op(), SendOp::LocalInv { key: Key(0x4242) });
        assert_eq!((s.flags(), s.num_sge(), s.inline_len(), s.ud()), (SendFlags::FENCE, 0, 0, None));
    }

    /// A receive WQE read in place (QP receive queues) and converted to an owned one (SRQs):
    /// the same fields either way, and the same refusal of too long a scatter list.
    #[test]
    fn recv_with_sges_reads_in_place_and_too_many_are_rejected() {
        let mut w = ShmRecvWqe { wr_id: 9, num_sge: 2, ..Default::default() };
        w.sge[0] = ShmSge { addr: 10, length: 20, lkey: 30 };
        w.sge[1] = ShmSge { addr: 40, length: 50, lkey: 60 };
        w.sge[2] = ShmSge { addr: 1, length: 1, lkey: 1 }; // past num_sge: not read
        let want = [Sge { addr: 10, len: 20, lkey: Key(30) }, Sge { addr: 40, len: 50, lkey: Key(60) }];
        let v = ShmRecvWr::new(&w).unwrap();
        assert_eq!((v.wr_id(), v.num_sge()), (9, 2));
        assert_eq!((0..v.num_sge()).map(|i| v.sge(i)).collect::<Vec<_>>(), want);
        let owned = recv_wqe(&w).unwrap();
        assert_eq!((owned.wr_id, owned.sg_list()), (9, &want[..]));
        w.num_sge = (MAX_RECV_SGE.min(MAX_SGE) + 1) as u32;
        assert_eq!(ShmRecvWr::new(&w).err(), Some(WqeError::TooManySge(w.num_sge)));
        assert_eq!(recv_wqe(&w).err(), Some(WqeError::TooManySge(w.num_sge)));
        w.num_sge = 0;
        assert_eq!(ShmRecvWr::new(&w).map(|v| v.num_sge()).ok(), Some(0), "a zero-length receive is valid");
    }
}
