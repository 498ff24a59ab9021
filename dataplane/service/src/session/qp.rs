//! Queue pairs: creation (QPN, rings, doorbell slot), modify, query, destroy.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use pmrxe_abi::ctrl::{QpAttr as AbiQpAttr, QpCap, Response};
use pmrxe_abi::ring::init_ring;
use pmrxe_abi::{Doorbell, QpSegmentLayout, ShmRecvWqe, ShmSendWqe};
use pmrxe_runtime::lcore::{Cmd, QpSetup};
use pmrxe_runtime::shm::Segment;
use pmrxe_transport::{AttrMask, Qp, QpAttr, QpCaps, QpType};

use super::attr::{from_engine_attr, path_mtu, qp_type as decode_qp_type, to_engine_attr, QpTypeError};
use pmrxe_config::LimitKind;

use super::{drop_after_send, err, QpRec, Reply, Session};
use crate::limits::Obj;

impl Session {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn create_qp(&mut self, device: u32, pd: u32, qp_type: u32, send_cq: u32, recv_cq: u32, srq: Option<u32>, cap: QpCap, sig_all: bool) -> Reply {
        let sh = self.shared.clone();
        let Some(&pd_dev) = self.objs.pds.get(&pd) else { return (err(libc::EINVAL, "no such PD"), vec![]) };
        if pd_dev != device {
            return (err(libc::EINVAL, "PD belongs to another device"), vec![]);
        }
        let lc = sh.lcore_for(self.home, device);
        if let Some(n) = srq {
            if self.objs.srqs.get(&n).map(|r| r.lcore) != Some(lc) {
                return (err(libc::EINVAL, "SRQ unknown or on another device"), vec![]);
            }
        }
        for cq in [send_cq, recv_cq] {
            if self.objs.cqs.get(&cq) != Some(&lc) {
                return (err(libc::EINVAL, "CQ unknown or on another device"), vec![]);
            }
        }
        let ty = match decode_qp_type(qp_type) {
            Ok(t) => t,
            Err(QpTypeError::Unsupported(_)) => return (err(libc::EOPNOTSUPP, "QP type must be RC, UC or UD"), vec![]),
            Err(QpTypeError::Invalid(v)) => return (err(libc::EINVAL, &format!("qp_type {v} is not an ibv_qp_type")), vec![]),
        };
        let d = &sh.devices[device as usize].attr;
        if cap.max_send_wr > d.max_qp_wr || cap.max_recv_wr > d.max_qp_wr || cap.max_send_sge > d.max_sge || cap.max_recv_sge > d.max_sge || cap.max_inline_data > d.max_inline_data {
            return (err(libc::EINVAL, "QP capabilities exceed the device limits"), vec![]);
        }
        let caps = QpCaps {
            max_send_wr: cap.max_send_wr.max(1),
            max_recv_wr: cap.max_recv_wr.max(1),
            max_send_sge: cap.max_send_sge.max(1),
            max_recv_sge: cap.max_recv_sge.max(1),
            // Inline data is sized from the send WQE's SGE space too, as rxe and mlx5 do
            // (at least max_send_sge × 16 bytes, reported back in cap.max_inline_data):
            // librdmacm programs post small IBV_SEND_INLINE messages on QPs created with 0.
            max_inline_data: cap.max_inline_data.max(cap.max_send_sge.max(1).saturating_mul(16)).min(d.max_inline_data),
        };
        let Some(slot) = self.objs.db_used.iter().position(|u| !u) else { return (err(libc::ENOMEM, "too many QPs for this client"), vec![]) };
        let reservation = match self.reserve(Obj::Kind(LimitKind::Qp), device) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        let rq_cap = if srq.is_some() { 0 } else { caps.max_recv_wr.next_power_of_two() };
        let layout = QpSegmentLayout::new(caps.max_send_wr.next_power_of_two(), rq_cap);
        let seg = match Segment::create("pmrxe-qp", layout.total_len as usize) {
            Ok(s) => Arc::new(s),
            Err(e) => return (err(libc::ENOMEM, &e.to_string()), vec![]),
        };
        // SAFETY: fresh zeroed segment laid out by `layout`.
        let ok = unsafe {
            init_ring::<ShmSendWqe>(seg.as_ptr().add(layout.sq_offset as usize), layout.sq_capacity).is_ok()
                && (layout.rq_capacity == 0 || init_ring::<ShmRecvWqe>(seg.as_ptr().add(layout.rq_offset as usize), layout.rq_capacity).is_ok())
        };
        if !ok {
            return (err(libc::EINVAL, "ring layout"), vec![]);
        }
        let fd = seg.fd().as_raw_fd();
        // A QPN names its lcore and its slot in that lcore's engine; a QP still living in the
        // slot a fresh QPN maps to (4096 creations ago) makes the lcore refuse it: take the next.
        let mut tries = 0;
        let qpn = loop {
            let qpn = sh.qpn_for(lc);
            let mut qp = match Qp::new(qpn, ty, pd, caps, srq) {
                Ok(q) => q,
                Err(e) => return (err(libc::EINVAL, &format!("{e:?}")), vec![]),
            };
            qp.set_sq_sig_all(sig_all);
            // UD messages may be as large as the port's active MTU (RC/UC get theirs at RTR).
            // The device's own MTU (`device::ibv_mtu`: always 1..=5), not a client's value.
            qp.set_port_mtu(path_mtu(sh.devices[device as usize].port.active_mtu).unwrap_or_default());
            let setup = Box::new(QpSetup { qp, client: self.id, device, seg: seg.clone(), layout, send_cq, recv_cq, db_slot: slot as u16 });
            let r: Result<(), String> = lcore_call!(sh.lcores[lc], AddQp { setup: setup });
            match r {
                Ok(()) => break qpn,
                // Every slot is tried before giving up: long-lived QPs can fill a run of
                // slots longer than any fixed number of tries while the table has room.
                Err(e) if e == pmrxe_transport::AddError::SlotTaken.to_string() && tries < pmrxe_runtime::lcore::MAX_QPS_PER_LCORE => tries += 1,
                Err(e) => return (err(if tries > 0 { libc::ENOMEM } else { libc::EINVAL }, &e), vec![]),
            }
        };
        self.objs.db_used[slot] = true;
        let out_cap = QpCap { max_inline_data: caps.max_inline_data, ..cap };
        self.objs.qps.insert(qpn, QpRec { lcore: lc, device, ud: ty == QpType::Ud, init_cap: out_cap, db_slot: slot as u16 });
        self.commit(reservation, qpn.into());
        let resp = (Response::Qp { qpn, cap: out_cap, layout, doorbell: Doorbell { lcore: sh.lcores[lc].index as u16, slot: slot as u16 } }, vec![fd]);
        drop_after_send(seg);
        resp
    }

    pub(super) fn modify_qp(&mut self, qpn: u32, attr: AbiQpAttr, mask: u32) -> Reply {
        let sh = self.shared.clone();
        let Some(q) = self.objs.qps.get(&qpn) else { return (err(libc::EINVAL, "no such QP"), vec![]) };
        // A privileged Q_Key (MSB set, GSI's among them) needs CAP_NET_RAW, as in the kernel
        // (uverbs' modify_qp, IB_QP_SET_QKEY): otherwise any user could send as the CM.
        if mask & pmrxe_transport::AttrMask::QKEY.0 != 0 && attr.qkey & pmrxe_transport::PRIVILEGED_QKEY_BIT != 0 && !self.net_raw {
            return (err(libc::EPERM, "a privileged Q_Key (most significant bit set) needs CAP_NET_RAW"), vec![]);
        }
        let a = match to_engine_attr(&attr, AttrMask(mask)) {
            Ok(a) => Box::new(a),
            Err(e) => return (err(libc::EINVAL, &e.msg()), vec![]),
        };
        let r: Result<(), i32> = lcore_call!(sh.lcores[q.lcore], ModifyQp { qpn: qpn, attr: a, mask: AttrMask(mask) });
        match r {
            Ok(()) => (Response::Ok, vec![]),
            Err(e) => (err(e, "modify_qp rejected (state transition or attribute mask)"), vec![]),
        }
    }

    pub(super) fn query_qp(&mut self, qpn: u32) -> Reply {
        let sh = self.shared.clone();
        let Some(q) = self.objs.qps.get(&qpn) else { return (err(libc::EINVAL, "no such QP"), vec![]) };
        let init_cap = q.init_cap;
        let a: Option<QpAttr> = lcore_call!(sh.lcores[q.lcore], QueryQp { qpn: qpn });
        match a {
            Some(a) => (Response::QpAttr { attr: from_engine_attr(&a, init_cap), init_cap }, vec![]),
            None => (err(libc::EINVAL, "no such QP"), vec![]),
        }
    }

    pub(super) fn destroy_qp(&mut self, qpn: u32) -> Reply {
        let sh = self.shared.clone();
        let Some(q) = self.objs.qps.get(&qpn) else { return (err(libc::EINVAL, "no such QP"), vec![]) };
        let lc = q.lcore;
        let slot = q.db_slot;
        // Detached first (as the kernel's uverbs does on destroy): no lcore delivers to it after.
        self.leave_all_groups(qpn);
        let r: Result<(), i32> = lcore_call!(sh.lcores[lc], DestroyQp { qpn: qpn });
        self.objs.qps.remove(&qpn);
        self.objs.db_used[slot as usize] = false;
        self.release(Obj::Kind(LimitKind::Qp), qpn.into());
        match r {
            Ok(()) => (Response::Ok, vec![]),
            Err(e) => (err(e, "destroy_qp"), vec![]),
        }
    }
}
