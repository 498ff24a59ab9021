//! ibv_qp_attr / ibv_ah_attr values (as the shim sends them) ↔ engine attributes.

use pmrxe_abi::ctrl::{AhAttr, QpAttr as AbiQpAttr, QpCap};
use pmrxe_transport::{AddressVector, AttrMask, PathMtu, QpAttr, QpCaps, QpState, QpType};
use pmrxe_wire::{Psn, Qpn};

pub(super) fn to_av(a: &AhAttr) -> AddressVector {
    AddressVector {
        dgid: a.dgid,
        sgid_index: a.sgid_index,
        flow_label: a.flow_label,
        hop_limit: a.hop_limit,
        traffic_class: a.traffic_class,
        dmac: None,
        port: a.port_num.max(1),
    }
}

/// A client-supplied value that is no member of its verbs enum (`ibv_qp_state`, `ibv_mtu`,
/// `ibv_qp_type`) or does not fit its field (a 24-bit QPN): the request fails with EINVAL, it is
/// never mapped to a default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadValue {
    /// The `ibv_qp_attr` (or request) field.
    pub field: &'static str,
    /// What the client sent.
    pub value: u32,
}

impl BadValue {
    /// The message the client gets with its EINVAL.
    pub fn msg(&self) -> String {
        format!("{} {} is not a valid value", self.field, self.value)
    }
}

/// `enum ibv_qp_state` → engine state.
pub fn qp_state(v: u32) -> Result<QpState, BadValue> {
    QpState::try_from(v).map_err(|_| BadValue { field: "qp_state", value: v })
}

/// `enum ibv_mtu` (1..=5) → path MTU.
pub fn path_mtu(v: u32) -> Result<PathMtu, BadValue> {
    PathMtu::try_from(v).map_err(|_| BadValue { field: "path_mtu", value: v })
}

/// What `ibv_create_qp` may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpTypeError {
    /// A verbs QP type this engine does not implement (XRC, raw packet, driver): EOPNOTSUPP.
    Unsupported(u32),
    /// No `enum ibv_qp_type` value at all: EINVAL.
    Invalid(u32),
}

/// `enum ibv_qp_type` → engine type: RC (2), UC (3) and UD (4).
pub fn qp_type(v: u32) -> Result<QpType, QpTypeError> {
    match v {
        2 => Ok(QpType::Rc),
        3 => Ok(QpType::Uc),
        4 => Ok(QpType::Ud),
        // IBV_QPT_RAW_PACKET, IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV, IBV_QPT_DRIVER.
        8 | 9 | 10 | 0xff => Err(QpTypeError::Unsupported(v)),
        _ => Err(QpTypeError::Invalid(v)),
    }
}

/// ibv_qp_attr (as sent by the shim) → engine attributes. Only the fields `mask` names are
/// decoded (the others are whatever the client's struct held, often zero, and the engine does
/// not read them); a named field that is no value of its type is refused. PSNs keep their low
/// 24 bits as the kernel's drivers do (programs pass `lrand48()`-style values); a destination
/// QPN with high bits set would name another QP, so it is refused.
pub fn to_engine_attr(a: &AbiQpAttr, mask: AttrMask) -> Result<QpAttr, BadValue> {
    let has = |m: AttrMask| mask.contains(m);
    let state = if has(AttrMask::STATE) { qp_state(a.qp_state)? } else { QpState::default() };
    let cur_state = if has(AttrMask::CUR_STATE) { qp_state(a.cur_qp_state).map_err(|e| BadValue { field: "cur_qp_state", ..e })? } else { QpState::default() };
    let mtu = if has(AttrMask::PATH_MTU) { path_mtu(a.path_mtu)? } else { PathMtu::default() };
    let dest_qp_num = if has(AttrMask::DEST_QPN) {
        Qpn::try_from(a.dest_qp_num).map_err(|_| BadValue { field: "dest_qp_num", value: a.dest_qp_num })?
    } else {
        Qpn::default()
    };
    Ok(QpAttr {
        qp_state: state,
        cur_qp_state: cur_state,
        path_mtu: mtu,
        qkey: a.qkey,
        rq_psn: Psn::new(a.rq_psn),
        sq_psn: Psn::new(a.sq_psn),
        dest_qp_num,
        qp_access_flags: a.qp_access_flags,
        pkey_index: a.pkey_index,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        min_rnr_timer: a.min_rnr_timer,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        ah_attr: to_av(&a.ah_attr),
        port_num: a.port_num.max(1),
        sq_draining: a.sq_draining != 0,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        cap: QpCaps {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        },
    })
}

/// Engine attributes → ibv_qp_attr values.
pub fn from_engine_attr(a: &QpAttr, cap: QpCap) -> AbiQpAttr {
    AbiQpAttr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.qp_state as u32,
        path_mtu: a.path_mtu as u32,
        path_mig_state: 0,
        qkey: a.qkey,
        rq_psn: a.rq_psn.value(),
        sq_psn: a.sq_psn.value(),
        dest_qp_num: a.dest_qp_num.value(),
        qp_access_flags: a.qp_access_flags,
        cap,
        ah_attr: AhAttr {
            dgid: a.ah_attr.dgid,
            flow_label: a.ah_attr.flow_label,
            sgid_index: a.ah_attr.sgid_index,
            hop_limit: a.ah_attr.hop_limit,
            traffic_class: a.ah_attr.traffic_class,
            is_global: true,
            port_num: a.ah_attr.port,
            ..Default::default()
        },
        pkey_index: a.pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify as u8,
        sq_draining: a.sq_draining as u8,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a hostile (or buggy) client may put in each field: every value of the enum's
    /// numbering outside its members.
    #[test]
    fn unknown_enum_values_are_refused_not_defaulted() {
        for v in [7, 8, 0xff, u32::MAX] {
            assert_eq!(qp_state(v), Err(BadValue { field: "qp_state", value: v }));
        }
        for v in [0, 6, 1024, u32::MAX] {
            assert_eq!(path_mtu(v), Err(BadValue { field: "path_mtu", value: v }));
        }
        for (v, s) in (0..=6).zip([QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe, QpState::Err]) {
            assert_eq!(qp_state(v), Ok(s));
        }
        for v in 1..=5 {
            assert_eq!(path_mtu(v).map(|m| m as u32), Ok(v));
        }
        assert_eq!(qp_type(2), Ok(QpType::Rc));
        assert_eq!(qp_type(4), Ok(QpType::Ud));
        assert_eq!(qp_type(9), Err(QpTypeError::Unsupported(9)));
        assert_eq!(qp_type(0), Err(QpTypeError::Invalid(0)));
        assert_eq!(qp_type(77), Err(QpTypeError::Invalid(77)));
    }

    #[test]
    fn modify_attr_decodes_only_the_masked_fields() {
        let rtr = AbiQpAttr { qp_state: 2, path_mtu: 9, dest_qp_num: 0x11, ..Default::default() };
        // path_mtu 9 is named: refused.
        let m = AttrMask::STATE | AttrMask::PATH_MTU | AttrMask::DEST_QPN;
        assert_eq!(to_engine_attr(&rtr, m), Err(BadValue { field: "path_mtu", value: 9 }));
        // Not named: the garbage is not read.
        let a = to_engine_attr(&rtr, AttrMask::STATE | AttrMask::DEST_QPN).expect("path_mtu is not in the mask");
        assert_eq!((a.qp_state, a.dest_qp_num.value()), (QpState::Rtr, 0x11));
        // An unknown target state, or current state, is EINVAL, not RESET.
        let bad = AbiQpAttr { qp_state: 42, cur_qp_state: 3, ..Default::default() };
        assert_eq!(to_engine_attr(&bad, AttrMask::STATE), Err(BadValue { field: "qp_state", value: 42 }));
        let bad = AbiQpAttr { qp_state: 3, cur_qp_state: 42, ..Default::default() };
        assert_eq!(to_engine_attr(&bad, AttrMask::STATE | AttrMask::CUR_STATE), Err(BadValue { field: "cur_qp_state", value: 42 }));
        // A QPN with high bits set would truncate to another QP's number.
        let far = AbiQpAttr { qp_state: 2, path_mtu: 3, dest_qp_num: 0x0100_0011, ..Default::default() };
        assert_eq!(to_engine_attr(&far, m), Err(BadValue { field: "dest_qp_num", value: 0x0100_0011 }));
        // PSNs keep their low 24 bits, as the kernel's drivers do.
        let rts = AbiQpAttr { qp_state: 3, sq_psn: 0xAB12_3456, ..Default::default() };
        assert_eq!(to_engine_attr(&rts, AttrMask::STATE | AttrMask::SQ_PSN).map(|a| a.sq_psn.value()), Ok(0x12_3456));
    }
}
