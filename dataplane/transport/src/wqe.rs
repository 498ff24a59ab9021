//! Work queue entries as posted by the consumer (fixed size, no allocation).

use pmrxe_mem::{Access, Key, Sge};

use crate::attr::AddressVector;

/// Maximum scatter/gather entries per WQE.
pub const MAX_SGE: usize = 8;
/// Maximum inline payload per WQE.
pub const MAX_INLINE: usize = 256;

/// A send work request opcode (`ibv_wr_opcode` plus the fast-registration extension).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendImm(u32),
    /// SEND with invalidate of the given rkey at the responder.
    SendInv(u32),
    /// RDMA WRITE.
    Write,
    /// RDMA WRITE with immediate data.
    WriteImm(u32),
    /// RDMA READ.
    Read,
    /// 64-bit compare and swap.
    CmpSwap {
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// 64-bit fetch and add.
    FetchAdd {
        /// Addend.
        add: u64,
    },
    /// Fast-register MR `mr` with key `key` (local op).
    RegMr {
        /// The MR (its current lkey).
        mr: Key,
        /// The new key (same index, new key byte).
        key: Key,
        /// Access rights granted.
        access: Access,
        /// Override of the MR's iova (xprtrdma rewrites the upper bits).
        iova: Option<u64>,
        /// Override of the mapped length.
        length: Option<u64>,
    },
    /// Local invalidate of `key` (local op).
    LocalInv {
        /// lkey or rkey of the MR/MW.
        key: Key,
    },
    /// Bind a memory window (local op).
    BindMw {
        /// The MW.
        mw: Key,
        /// The new MW key.
        new_key: Key,
        /// The MR it is bound to.
        mr: Key,
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
        /// Access rights of the window.
        access: Access,
    },
}

impl SendOp {
    /// REG_MR, LOCAL_INV or BIND_MW: executed locally, never on the wire.
    pub fn is_local(&self) -> bool {
        matches!(self, SendOp::RegMr { .. } | SendOp::LocalInv { .. } | SendOp::BindMw { .. })
    }
    /// READ or an atomic: needs an rd_atomic credit and is covered by FENCE.
    pub fn is_rd_atomic(&self) -> bool {
        matches!(self, SendOp::Read | SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. })
    }
    /// CMP_SWP or FETCH_ADD.
    pub fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. })
    }
    /// SEND of any flavour.
    pub fn is_send(&self) -> bool {
        matches!(self, SendOp::Send | SendOp::SendImm(_) | SendOp::SendInv(_))
    }
    /// WRITE of any flavour.
    pub fn is_write(&self) -> bool {
        matches!(self, SendOp::Write | SendOp::WriteImm(_))
    }
    /// Immediate data carried by this op.
    pub fn imm(&self) -> Option<u32> {
        match *self {
            SendOp::SendImm(i) | SendOp::WriteImm(i) => Some(i),
            _ => None,
        }
    }
}

/// `ibv_send_flags`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// IBV_SEND_FENCE.
    pub const FENCE: SendFlags = SendFlags(1);
    /// IBV_SEND_SIGNALED.
    pub const SIGNALED: SendFlags = SendFlags(2);
    /// IBV_SEND_SOLICITED.
    pub const SOLICITED: SendFlags = SendFlags(4);
    /// IBV_SEND_INLINE.
    pub const INLINE: SendFlags = SendFlags(8);
    /// No flags.
    pub const NONE: SendFlags = SendFlags(0);
    /// Are all bits of `o` set?
    pub const fn contains(self, o: SendFlags) -> bool {
        self.0 & o.0 == o.0
    }
}
impl core::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, o: SendFlags) -> SendFlags {
        SendFlags(self.0 | o.0)
    }
}

/// UD destination (from the address handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// Path to the peer.
    pub av: AddressVector,
    /// Remote QPN.
    pub remote_qpn: u32,
    /// Remote Q_Key.
    pub remote_qkey: u32,
}

/// What [`Qp::post_send`](crate::Qp::post_send) reads from a send work request, field by
/// field: a [`SendWqe`], or a view of a WQE kept in another layout (the runtime reads a
/// client's ring entry through one, so a post does not build a 512-byte `SendWqe` first and
/// the engine does not read back, in wide loads, an opcode just written with a narrow store).
/// Whatever implements it, `post_send` is the one place a send WQE is checked against the QP.
pub trait SendWr {
    /// Consumer's id, returned in the CQE.
    fn wr_id(&self) -> u64;
    /// What to do.
    fn op(&self) -> SendOp;
    /// Flags.
    fn flags(&self) -> SendFlags;
    /// Remote address for WRITE/READ/atomics.
    fn remote_addr(&self) -> u64;
    /// Remote key for WRITE/READ/atomics.
    fn rkey(&self) -> u32;
    /// Number of gather entries (may exceed [`MAX_SGE`]: `post_send` refuses that).
    fn num_sge(&self) -> usize;
    /// Gather entry `i` (`i < num_sge().min(MAX_SGE)`).
    fn sge(&self, i: usize) -> Sge;
    /// Inline payload length (may exceed [`MAX_INLINE`]: `post_send` refuses that).
    fn inline_len(&self) -> usize;
    /// The inline payload, `inline_len()` bytes when that is at most [`MAX_INLINE`].
    fn inline(&self) -> &[u8];
    /// UD destination.
    fn ud(&self) -> Option<UdDest>;
}

impl SendWr for SendWqe {
    #[inline]
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
    #[inline]
    fn op(&self) -> SendOp {
        self.op
    }
    #[inline]
    fn flags(&self) -> SendFlags {
        self.flags
    }
    #[inline]
    fn remote_addr(&self) -> u64 {
        self.remote_addr
    }
    #[inline]
    fn rkey(&self) -> u32 {
        self.rkey
    }
    #[inline]
    fn num_sge(&self) -> usize {
        self.num_sge
    }
    #[inline]
    fn sge(&self, i: usize) -> Sge {
        self.sges[i]
    }
    #[inline]
    fn inline_len(&self) -> usize {
        self.inline_len
    }
    #[inline]
    fn inline(&self) -> &[u8] {
        &self.inline[..self.inline_len.min(MAX_INLINE)]
    }
    #[inline]
    fn ud(&self) -> Option<UdDest> {
        self.ud
    }
}

/// A send work request. `Copy`, fixed size: the SQ ring holds these by value.
#[derive(Clone, Copy, Debug)]
pub struct SendWqe {
    /// Consumer's id, returned in the CQE.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Flags.
    pub flags: SendFlags,
    /// Gather list (only `sges[..num_sge]` is used).
    pub sges: [Sge; MAX_SGE],
    /// Number of valid gather entries.
    pub num_sge: usize,
    /// Inline payload (only `inline[..inline_len]`), used with `SendFlags::INLINE`.
    pub inline: [u8; MAX_INLINE],
    /// Inline payload length.
    pub inline_len: usize,
    /// Remote address for WRITE/READ/atomics.
    pub remote_addr: u64,
    /// Remote key for WRITE/READ/atomics.
    pub rkey: u32,
    /// UD destination.
    pub ud: Option<UdDest>,
}

impl SendWqe {
    /// A WQE with no SGEs and no flags.
    pub fn new(wr_id: u64, op: SendOp) -> Self {
        SendWqe {
            wr_id,
            op,
            flags: SendFlags::NONE,
            sges: [Sge::default(); MAX_SGE],
            num_sge: 0,
            inline: [0; MAX_INLINE],
            inline_len: 0,
            remote_addr: 0,
            rkey: 0,
            ud: None,
        }
    }
    /// Builder: add a gather entry (panics past `MAX_SGE`; test/convenience helper).
    #[must_use]
    pub fn sge(mut self, s: Sge) -> Self {
        self.sges[self.num_sge] = s;
        self.num_sge += 1;
        self
    }
    /// Builder: set flags.
    #[must_use]
    pub fn flags(mut self, f: SendFlags) -> Self {
        self.flags = f;
        self
    }
    /// Builder: remote address and key.
    #[must_use]
    pub fn remote(mut self, addr: u64, rkey: u32) -> Self {
        self.remote_addr = addr;
        self.rkey = rkey;
        self
    }
    /// Builder: inline payload (sets `SendFlags::INLINE`). Truncated to `MAX_INLINE`.
    #[must_use]
    pub fn inline_data(mut self, d: &[u8]) -> Self {
        let n = d.len().min(MAX_INLINE);
        self.inline[..n].copy_from_slice(&d[..n]);
        self.inline_len = d.len();
        self.flags = self.flags | SendFlags::INLINE;
        self
    }
    /// Builder: UD destination.
    #[must_use]
    pub fn ud(mut self, d: UdDest) -> Self {
        self.ud = Some(d);
        self
    }
    /// The active gather entries.
    pub fn sg_list(&self) -> &[Sge] {
        &self.sges[..self.num_sge.min(MAX_SGE)]
    }
    /// Payload length of the message (sum of SGEs, or the inline length). Local ops: 0.
    pub fn payload_len(&self) -> u64 {
        if self.op.is_local() {
            return 0;
        }
        if self.flags.contains(SendFlags::INLINE) {
            return self.inline_len as u64;
        }
        self.sg_list().iter().map(|s| u64::from(s.len)).sum()
    }
    /// Is a completion requested (or the QP signals all)?
    pub fn signaled(&self) -> bool {
        self.flags.contains(SendFlags::SIGNALED)
    }
}

/// What [`Qp::post_recv`](crate::Qp::post_recv) reads from a receive work request: a
/// [`RecvWqe`], or a view of one kept in another layout (the runtime reads a client's ring
/// entry through one, so a post does not build a 144-byte `RecvWqe` to copy from).
pub trait RecvWr {
    /// Consumer's id, returned in the CQE.
    fn wr_id(&self) -> u64;
    /// Number of scatter entries (may exceed [`MAX_SGE`]: `post_recv` refuses that).
    fn num_sge(&self) -> usize;
    /// Scatter entry `i` (`i < num_sge().min(MAX_SGE)`).
    fn sge(&self, i: usize) -> Sge;
}

impl RecvWr for RecvWqe {
    #[inline]
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
    #[inline]
    fn num_sge(&self) -> usize {
        self.num_sge
    }
    #[inline]
    fn sge(&self, i: usize) -> Sge {
        self.sges[i]
    }
}

/// A receive work request.
#[derive(Clone, Copy, Debug)]
pub struct RecvWqe {
    /// Consumer's id, returned in the CQE.
    pub wr_id: u64,
    /// Scatter list (only `sges[..num_sge]`).
    pub sges: [Sge; MAX_SGE],
    /// Number of valid scatter entries.
    pub num_sge: usize,
}

impl RecvWqe {
    /// An empty receive WQE.
    pub fn new(wr_id: u64) -> Self {
        RecvWqe { wr_id, sges: [Sge::default(); MAX_SGE], num_sge: 0 }
    }
    /// Builder: add a scatter entry.
    #[must_use]
    pub fn sge(mut self, s: Sge) -> Self {
        self.sges[self.num_sge] = s;
        self.num_sge += 1;
        self
    }
    /// The active scatter entries.
    pub fn sg_list(&self) -> &[Sge] {
        &self.sges[..self.num_sge.min(MAX_SGE)]
    }
    /// Total capacity.
    pub fn capacity(&self) -> u64 {
        self.sg_list().iter().map(|s| u64::from(s.len)).sum()
    }
}
