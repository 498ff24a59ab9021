//! Completion queue entries (`ibv_wc` semantics, numeric values from libibverbs `verbs.h`).
//!
//! The QP produces CQEs in order on two logical queues ([`CqSide::Send`], [`CqSide::Recv`])
//! and hands each to a [`CompletionSink`] the moment it is produced: the runtime's writes it in
//! place into the consumer's CQ ring (several QPs may share one CQ).

/// Which CQ of the QP a completion belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqSide {
    /// The send CQ.
    Send,
    /// The receive CQ.
    Recv,
}

/// `enum ibv_wc_status` (values as in libibverbs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// IBV_WC_SUCCESS
    Success = 0,
    /// IBV_WC_LOC_LEN_ERR
    LocLenErr = 1,
    /// IBV_WC_LOC_QP_OP_ERR
    LocQpOpErr = 2,
    /// IBV_WC_LOC_PROT_ERR
    LocProtErr = 4,
    /// IBV_WC_WR_FLUSH_ERR
    WrFlushErr = 5,
    /// IBV_WC_MW_BIND_ERR
    MwBindErr = 6,
    /// IBV_WC_BAD_RESP_ERR
    BadRespErr = 7,
    /// IBV_WC_LOC_ACCESS_ERR
    LocAccessErr = 8,
    /// IBV_WC_REM_INV_REQ_ERR
    RemInvReqErr = 9,
    /// IBV_WC_REM_ACCESS_ERR
    RemAccessErr = 10,
    /// IBV_WC_REM_OP_ERR
    RemOpErr = 11,
    /// IBV_WC_RETRY_EXC_ERR
    RetryExcErr = 12,
    /// IBV_WC_RNR_RETRY_EXC_ERR
    RnrRetryExcErr = 13,
    /// IBV_WC_FATAL_ERR
    FatalErr = 19,
    /// IBV_WC_GENERAL_ERR
    GeneralErr = 21,
}

impl WcStatus {
    /// Number of distinct statuses tracked by [`crate::QpStats`].
    pub const COUNT: usize = 22;
    /// Is this SUCCESS?
    pub fn is_ok(self) -> bool {
        self == WcStatus::Success
    }
}

/// `enum ibv_wc_opcode` (values as in libibverbs; REG_MR uses IBV_WC_DRIVER1 = 135 like mlx5dv).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// IBV_WC_SEND
    Send = 0,
    /// IBV_WC_RDMA_WRITE
    RdmaWrite = 1,
    /// IBV_WC_RDMA_READ
    RdmaRead = 2,
    /// IBV_WC_COMP_SWAP
    CompSwap = 3,
    /// IBV_WC_FETCH_ADD
    FetchAdd = 4,
    /// IBV_WC_BIND_MW
    BindMw = 5,
    /// IBV_WC_LOCAL_INV
    LocalInv = 6,
    /// IBV_WC_RECV
    Recv = 128,
    /// IBV_WC_RECV_RDMA_WITH_IMM
    RecvRdmaWithImm = 129,
    /// IBV_WC_DRIVER1 (fast-register MR completion)
    RegMr = 135,
}

/// `ibv_wc_flags`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WcFlags(pub u32);

impl WcFlags {
    /// IBV_WC_GRH: a 40-byte GRH was written at the start of the receive buffer.
    pub const GRH: WcFlags = WcFlags(1);
    /// IBV_WC_WITH_IMM.
    pub const WITH_IMM: WcFlags = WcFlags(2);
    /// IBV_WC_WITH_INV.
    pub const WITH_INV: WcFlags = WcFlags(8);
    /// Are all bits of `o` set?
    pub const fn contains(self, o: WcFlags) -> bool {
        self.0 & o.0 == o.0
    }
}
impl core::ops::BitOrAssign for WcFlags {
    fn bitor_assign(&mut self, o: WcFlags) {
        self.0 |= o.0;
    }
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe {
    /// Consumer's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (meaningless for flushed completions).
    pub opcode: WcOpcode,
    /// Bytes transferred (receive: message length; READ: bytes read).
    pub byte_len: u32,
    /// Immediate data.
    pub imm_data: Option<u32>,
    /// The key invalidated by a SEND with invalidate.
    pub invalidated_rkey: Option<u32>,
    /// Local QPN.
    pub qp_num: u32,
    /// Source QPN (UD receive).
    pub src_qp: u32,
    /// `ibv_wc_flags`.
    pub wc_flags: WcFlags,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID (0 on RoCE).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// DLID path bits (0 on RoCE).
    pub dlid_path_bits: u8,
    /// A GRH is present (UD receive).
    pub grh_present: bool,
}

impl Cqe {
    /// A completion with everything but the given fields zeroed.
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Self {
        Cqe {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            qp_num,
            src_qp: 0,
            wc_flags: WcFlags::default(),
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
            grh_present: false,
        }
    }
}

/// Where a QP's completions go the moment it produces them: for the runtime, straight into the
/// consumer's shared CQ ring (staged there, published once per lcore iteration); for the
/// simulator, its list. Every QP call that can complete something takes one.
///
/// A completion the sink cannot take (its CQ is full) stays in the QP, in order: later
/// completions queue behind it until [`crate::Qp::drain_completions`] moves them. The sink must
/// not call back into the QP.
pub trait CompletionSink {
    /// Take `c` for the QP's `side` CQ; false if that CQ has no room for it now.
    fn complete(&mut self, side: CqSide, c: &Cqe) -> bool;
}

/// Keeps every completion in the QP ([`crate::Qp::poll_completion`] hands them out): for tests
/// that drive a bare QP, and for calls that cannot complete anything.
#[derive(Clone, Copy, Debug, Default)]
pub struct Deferred;

impl CompletionSink for Deferred {
    fn complete(&mut self, _side: CqSide, _c: &Cqe) -> bool {
        false
    }
}

/// An embedder's completion handling for the QPs of an [`crate::Engine`]: like a
/// [`CompletionSink`], given the attachment of the QP that completed (which names its CQs).
///
/// The sink may refuse a completion (its CQ is full); the engine keeps it in the QP, in order,
/// and [`crate::Engine::deliver`] retries it through a [`Delivery`].
pub trait Completions<X> {
    /// Take `c` for `side` of the QP whose attachment is `ext`; false if that CQ is full.
    fn complete(&mut self, ext: &X, side: CqSide, c: &Cqe) -> bool;
}

/// The end of a pass's completion work ([`crate::Engine::deliver`]): completions as in
/// [`Completions`], plus what the engine decides there. A CQ that still refuses a kept
/// completion has overflowed: the engine reports [`Delivery::overflow`] and moves the QP to
/// ERROR (IBTA 11.4.2.1: a CQ overrun is a CQ error; the QPs completing into it cannot go
/// on). Nothing is lost: the QP keeps its completions until the consumer makes room.
pub trait Delivery<X>: Completions<X> {
    /// The `side` CQ of QP `qpn` (attachment `ext`) refused a completion again when
    /// [`crate::Engine::deliver`] retried it: an overflow (the embedder reports
    /// IBV_EVENT_CQ_ERR for that CQ). The engine moves the QP to ERROR right after.
    fn overflow(&mut self, ext: &X, qpn: u32, side: CqSide);
    /// An asynchronous event of QP `qpn` (attachment `ext`).
    fn event(&mut self, ext: &X, qpn: u32, ev: crate::qp::AsyncEvent);
}

/// A [`Completions`] bound to one QP's attachment: the sink passed to that QP's calls.
pub struct Bound<'a, C: ?Sized, X> {
    /// The embedder's completion handling.
    pub out: &'a mut C,
    /// The attachment of the QP being called.
    pub ext: &'a X,
}

impl<C: ?Sized, X> core::fmt::Debug for Bound<'_, C, X> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Bound")
    }
}

impl<C: Completions<X> + ?Sized, X> CompletionSink for Bound<'_, C, X> {
    #[inline]
    fn complete(&mut self, side: CqSide, c: &Cqe) -> bool {
        self.out.complete(self.ext, side, c)
    }
}
