//! QP attributes as verbs knows them: service type, state, path MTU, address vector,
//! capacities, `ibv_qp_attr` and its mask bits, and the per-transition required/optional mask
//! table (`transition_masks`, from `pmrxe_qp_table`, shared with the shim).

use pmrxe_wire::{Psn, Qpn};

/// Transport service type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
}

impl QpType {
    pub(crate) fn wire(self) -> pmrxe_wire::QpType {
        match self {
            QpType::Rc => pmrxe_wire::QpType::Rc,
            QpType::Uc => pmrxe_wire::QpType::Uc,
            QpType::Ud => pmrxe_wire::QpType::Ud,
        }
    }
}

/// `enum ibv_qp_state` (same order and values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum QpState {
    /// IBV_QPS_RESET
    #[default]
    Reset = 0,
    /// IBV_QPS_INIT
    Init = 1,
    /// IBV_QPS_RTR
    Rtr = 2,
    /// IBV_QPS_RTS
    Rts = 3,
    /// IBV_QPS_SQD
    Sqd = 4,
    /// IBV_QPS_SQE
    Sqe = 5,
    /// IBV_QPS_ERR
    Err = 6,
}

/// `enum ibv_mtu` (values 1..5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PathMtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    #[default]
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl PathMtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// A libibverbs number that names no value of the enum it was given for: a client asking for
/// it is refused (EINVAL), never given a default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownValue(pub u32);

/// `enum ibv_qp_state` (0..=6).
impl TryFrom<u32> for QpState {
    type Error = UnknownValue;
    fn try_from(v: u32) -> Result<QpState, UnknownValue> {
        Ok(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => return Err(UnknownValue(v)),
        })
    }
}

/// `enum ibv_mtu` (1..=5).
impl TryFrom<u32> for PathMtu {
    type Error = UnknownValue;
    fn try_from(v: u32) -> Result<PathMtu, UnknownValue> {
        Ok(match v {
            1 => PathMtu::Mtu256,
            2 => PathMtu::Mtu512,
            3 => PathMtu::Mtu1024,
            4 => PathMtu::Mtu2048,
            5 => PathMtu::Mtu4096,
            _ => return Err(UnknownValue(v)),
        })
    }
}

/// Path to the peer (RoCEv2: GIDs are IP addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AddressVector {
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Source GID index on our port.
    pub sgid_index: u8,
    /// IPv6 flow label (also feeds the UDP source port hash).
    pub flow_label: u32,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// Traffic class / TOS.
    pub traffic_class: u8,
    /// Resolved destination MAC, if known.
    pub dmac: Option<[u8; 6]>,
    /// Port number (1-based).
    pub port: u8,
}

/// Requested QP capacities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Gather entries per send WQE.
    pub max_send_sge: u32,
    /// Scatter entries per receive WQE.
    pub max_recv_sge: u32,
    /// Inline payload per send WQE.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps { max_send_wr: 256, max_recv_wr: 256, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 }
    }
}

/// Limits of this engine.
pub const MAX_QP_WR: u32 = 16384;
/// Largest `max_rd_atomic` / `max_dest_rd_atomic`.
pub const MAX_RD_ATOMIC: u8 = 128;

/// The Q_Key bit that makes a Q_Key privileged (IBTA 10.2.5): a UD work request whose Q_Key
/// has it set sends the QP's own Q_Key instead, and only a client with CAP_NET_RAW may give a
/// QP such a Q_Key (the kernel's `IB_QP_SET_QKEY` rule). GSI's Q_Key 0x80010000 is one.
pub const PRIVILEGED_QKEY_BIT: u32 = 0x8000_0000;

/// QP attributes (`struct ibv_qp_attr`, the fields RoCE uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub qp_state: QpState,
    /// Current state (checked if `CUR_STATE` is in the mask).
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: PathMtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Expected PSN of the responder (24 bits by type: a client's wider value is refused by
    /// the decoder at the trust boundary, never truncated here).
    pub rq_psn: Psn,
    /// First PSN of the requester.
    pub sq_psn: Psn,
    /// Remote QPN (RC/UC).
    pub dest_qp_num: Qpn,
    /// `ibv_access_flags` for remote access to this QP (REMOTE_WRITE/READ/ATOMIC).
    pub qp_access_flags: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Local ACK timeout exponent (0 = infinite, ≤ 31).
    pub timeout: u8,
    /// Transport retry count (≤ 7; 7 means 7).
    pub retry_cnt: u8,
    /// RNR retry count (≤ 7; 7 means infinite).
    pub rnr_retry: u8,
    /// RNR timer code our responder advertises (≤ 31).
    pub min_rnr_timer: u8,
    /// Outstanding READ/ATOMIC as requester.
    pub max_rd_atomic: u8,
    /// READ/ATOMIC resources as responder.
    pub max_dest_rd_atomic: u8,
    /// Primary path.
    pub ah_attr: AddressVector,
    /// Port number.
    pub port_num: u8,
    /// Query only: SQD and still draining.
    pub sq_draining: bool,
    /// Raise `AsyncEvent::SqDrained` when SQD drain completes.
    pub en_sqd_async_notify: bool,
    /// Capacities (query only).
    pub cap: QpCaps,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: PathMtu::Mtu1024,
            qkey: 0,
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            dest_qp_num: Qpn::new(0),
            qp_access_flags: 0,
            pkey_index: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            ah_attr: AddressVector::default(),
            port_num: 1,
            sq_draining: false,
            en_sqd_async_notify: false,
            cap: QpCaps::default(),
        }
    }
}

/// `enum ibv_qp_attr_mask` (IBV_QP_* bit values exactly).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AttrMask(pub u32);

#[allow(missing_docs)]
impl AttrMask {
    pub const STATE: AttrMask = AttrMask(1);
    pub const CUR_STATE: AttrMask = AttrMask(2);
    pub const EN_SQD_ASYNC_NOTIFY: AttrMask = AttrMask(4);
    pub const ACCESS_FLAGS: AttrMask = AttrMask(8);
    pub const PKEY_INDEX: AttrMask = AttrMask(16);
    pub const PORT: AttrMask = AttrMask(32);
    pub const QKEY: AttrMask = AttrMask(64);
    pub const AV: AttrMask = AttrMask(128);
    pub const PATH_MTU: AttrMask = AttrMask(256);
    pub const TIMEOUT: AttrMask = AttrMask(512);
    pub const RETRY_CNT: AttrMask = AttrMask(1024);
    pub const RNR_RETRY: AttrMask = AttrMask(2048);
    pub const RQ_PSN: AttrMask = AttrMask(4096);
    pub const MAX_QP_RD_ATOMIC: AttrMask = AttrMask(8192);
    pub const ALT_PATH: AttrMask = AttrMask(16384);
    pub const MIN_RNR_TIMER: AttrMask = AttrMask(32768);
    pub const SQ_PSN: AttrMask = AttrMask(65536);
    pub const MAX_DEST_RD_ATOMIC: AttrMask = AttrMask(131072);
    pub const PATH_MIG_STATE: AttrMask = AttrMask(262144);
    pub const CAP: AttrMask = AttrMask(524288);
    pub const DEST_QPN: AttrMask = AttrMask(1048576);
    /// No bits.
    pub const EMPTY: AttrMask = AttrMask(0);

    /// All bits of `o` set?
    pub const fn contains(self, o: AttrMask) -> bool {
        self.0 & o.0 == o.0
    }
    /// Bits in `self` but not in `o`.
    pub const fn minus(self, o: AttrMask) -> AttrMask {
        AttrMask(self.0 & !o.0)
    }
    /// Is it empty?
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
    const fn or(self, o: AttrMask) -> AttrMask {
        AttrMask(self.0 | o.0)
    }
}
impl core::ops::BitOr for AttrMask {
    type Output = AttrMask;
    fn bitor(self, o: AttrMask) -> AttrMask {
        self.or(o)
    }
}

/// Attributes a transition requires and allows (beyond `STATE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransitionMasks {
    /// Must be present.
    pub required: AttrMask,
    /// May be present.
    pub optional: AttrMask,
}

/// The IBTA QP state table (IBA 10.3.1, as the kernel's `qp_state_table`): `None` if
/// `cur → next` is not a valid transition for `ty`, otherwise the attribute masks. The table
/// itself is `pmrxe_qp_table`, shared with the shim (one table, libibverbs numbers: the
/// engine's `QpState` and `AttrMask` values are the IBV ones).
pub fn transition_masks(ty: QpType, cur: QpState, next: QpState) -> Option<TransitionMasks> {
    use pmrxe_qp_table::{qp_type, transition};
    let t = match ty {
        QpType::Rc => qp_type::RC,
        QpType::Uc => qp_type::UC,
        QpType::Ud => qp_type::UD,
    };
    transition(t, cur as u32, next as u32).map(|m| TransitionMasks { required: AttrMask(m.required), optional: AttrMask(m.optional) })
}

/// `create_qp` failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateError {
    /// A capacity exceeds the engine's limits.
    CapsTooLarge,
    /// An SRQ was given for a QP type that cannot use it... (reserved) or other bad argument.
    InvalidArgument,
}

/// `modify_qp` failure (EINVAL in verbs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModifyError {
    /// `cur → next` is not a valid transition.
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// Required attributes missing.
    MissingAttributes(AttrMask),
    /// Attributes not allowed for this transition.
    InvalidAttributes(AttrMask),
    /// An attribute value is out of range.
    InvalidValue(&'static str),
    /// `cur_qp_state` does not match.
    CurrentStateMismatch,
}
