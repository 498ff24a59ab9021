//! ibv_qp_attr / ibv_ah_attr values (as the shim sends them) ↔ engine attributes.

use pmrxe_abi::ctrl::{AhAttr, QpAttr as AbiQpAttr, QpCap};
use pmrxe_transport::{AddressVector, PathMtu, QpAttr, QpCaps, QpState};

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

fn state(v: u32) -> QpState {
    match v {
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => QpState::Reset,
    }
}

pub(super) fn mtu(v: u32) -> PathMtu {
    match v {
        1 => PathMtu::Mtu256,
        2 => PathMtu::Mtu512,
        4 => PathMtu::Mtu2048,
        5 => PathMtu::Mtu4096,
        _ => PathMtu::Mtu1024,
    }
}

/// ibv_qp_attr (as sent by the shim) → engine attributes.
pub fn to_engine_attr(a: &AbiQpAttr) -> QpAttr {
    QpAttr {
        qp_state: state(a.qp_state),
        cur_qp_state: state(a.cur_qp_state),
        path_mtu: mtu(a.path_mtu),
        qkey: a.qkey,
        rq_psn: a.rq_psn & 0xff_ffff,
        sq_psn: a.sq_psn & 0xff_ffff,
        dest_qp_num: a.dest_qp_num & 0xff_ffff,
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
    }
}

/// Engine attributes → ibv_qp_attr values.
pub fn from_engine_attr(a: &QpAttr, cap: QpCap) -> AbiQpAttr {
    AbiQpAttr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.qp_state as u32,
        path_mtu: a.path_mtu as u32,
        path_mig_state: 0,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
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
