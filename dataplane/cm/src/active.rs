//! The active side: connect (REQ) → REP → ConnectResponse → the consumer brings its QP to
//! RTS and calls `rtu` → Established. MRAs from the peer stretch the wait.

use crate::endpoint::{Conn, ConnState};
use crate::msg::{mra, rep, req, rtu_drep, CmMsg, MsgCode, RejReason};
use crate::timers::{iba_ns, Instant};
use crate::types::{ConnId, ConnectParams, Event, MadSource};
use crate::{Cm, CmError};

impl Cm {
    /// Send a REQ (`rdma_connect`). It is retransmitted every
    /// 2 · 4.096 µs · 2^packet_life_time + 4.096 µs · 2^remote_cm_response_timeout (the kernel's
    /// `ib_send_cm_req`), `max_cm_retries` times; then REJ(timeout) goes out and `TimedOut`.
    pub fn connect(&mut self, now: Instant, p: &ConnectParams) -> Result<ConnId, CmError> {
        Cm::check_len(&p.private_data, req::PRIVATE_DATA_LEN)?;
        for (v, max, name) in [
            (p.retry_count, 7, "retry_count"),
            (p.rnr_retry_count, 7, "rnr_retry_count"),
            (p.max_cm_retries, 15, "max_cm_retries"),
            (p.remote_cm_response_timeout, 31, "remote_cm_response_timeout"),
            (p.local_cm_response_timeout, 31, "local_cm_response_timeout"),
            (p.path.packet_life_time, 31, "packet_life_time"),
            (p.path.local_ack_timeout, 31, "local_ack_timeout"),
            (p.path.sl, 15, "sl"),
            (p.path.rate, 63, "rate"),
        ] {
            if v > max {
                return Err(CmError::BadParam(name));
            }
        }
        if !(1..=5).contains(&p.path.mtu) {
            return Err(CmError::BadParam("mtu"));
        }
        if self.table_full() {
            return Err(CmError::TableFull);
        }
        let id = self.alloc_id();
        let r = req::Repr {
            local_comm_id: id,
            vendor_id: p.ece.vendor_id & 0xFF_FFFF,
            service_id: p.service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.remote_cm_response_timeout,
            transport: p.transport as u8,
            flow_control: p.flow_control,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.local_cm_response_timeout,
            retry_count: p.retry_count,
            pkey: p.path.pkey,
            path_mtu: p.path.mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            extended_transport: 0,
            primary: p.path.req_path(),
            alternate: None,
            private_data: p.private_data.clone(),
        };
        let tid = self.tid_for(id);
        let path = p.path.gsi();
        let mut c = Conn::new(ConnState::ReqSent, true, path, tid, p.service_id, p.path.packet_life_time);
        c.local_qpn = p.local_qpn;
        c.timeout_ns = 2 * iba_ns(p.path.packet_life_time) + iba_ns(p.remote_cm_response_timeout);
        c.max_retries = p.max_cm_retries;
        c.req = Some(Box::new(r.clone()));
        let (t, n) = (c.timeout_ns, c.max_retries);
        self.conns.insert(id, c);
        let Some(mad) = self.send(path, tid, p.ece.attr_mod, &CmMsg::Req(r)) else {
            self.remove(id);
            return Err(CmError::PrivateDataTooLong);
        };
        self.start_retry(now, id, mad, t, n);
        Ok(ConnId(id))
    }

    /// After `ConnectResponse` and the QP's RTR/RTS: send the RTU (`rdma_establish`; the
    /// kernel CMA does it itself once it moved the QP) → Established.
    pub fn rtu(&mut self, _now: Instant, id: ConnId, private_data: &[u8]) -> Result<(), CmError> {
        Cm::check_len(private_data, rtu_drep::PRIVATE_DATA_LEN)?;
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId)?;
        if !matches!(c.state, ConnState::RepRcvd | ConnState::MraRepSent) {
            return Err(CmError::InvalidState);
        }
        let m = rtu_drep::Repr { local_comm_id: id.0, remote_comm_id: c.remote_id, private_data: private_data.to_vec() };
        let (path, tid) = (c.path, c.tid);
        let mad = self.send(path, tid, 0, &CmMsg::Rtu(m));
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId)?;
        c.cached = mad;
        c.state = ConnState::Established;
        self.event(id.0, Event::Established { id, private_data: Vec::new() });
        Ok(())
    }

    pub(crate) fn on_rep(&mut self, now: Instant, src: &MadSource, r: rep::Repr) {
        let Some(id) = self.lookup(src, r.remote_comm_id, None) else { return self.stray() };
        let c = &self.conns[&id];
        match c.state {
            ConnState::ReqSent | ConnState::MraReqRcvd => {}
            ConnState::RepRcvd | ConnState::MraRepSent | ConnState::Established if c.remote_id == r.local_comm_id => {
                return self.on_dup_rep(id);
            }
            _ => return self.stray(),
        }
        if let Some(&other) = self.by_remote_qpn.get(&(src.sgid, r.local_qpn.value())) {
            if other != id {
                // Kernel cm_rep_handler: the peer's QPN is still bound here → REJ stale.
                self.stats.rej_stale += 1;
                let (path, tid) = (c.path, c.tid);
                self.send_rej(path, tid, id, r.local_comm_id, MsgCode::Rep, RejReason::STALE_CONN, Vec::new());
                self.event(
                    id,
                    Event::Rejected { id: ConnId(id), reason: RejReason::STALE_CONN, message: MsgCode::Rep, ari: Vec::new(), private_data: Vec::new() },
                );
                self.enter_timewait(now, id);
                return;
            }
        }
        self.stop_retry(id);
        self.by_remote.insert((r.local_ca_guid, r.local_comm_id), id);
        self.by_remote_qpn.insert((src.sgid, r.local_qpn.value()), id);
        let c = self.conns.get_mut(&id).expect("looked up");
        c.remote_id = r.local_comm_id;
        c.remote_guid = r.local_ca_guid;
        c.remote_qpn = Some(r.local_qpn);
        c.state = ConnState::RepRcvd;
        c.rep = Some(Box::new(r.clone()));
        self.event(id, Event::ConnectResponse { id: ConnId(id), rep: Box::new(r) });
    }

    /// A retransmitted REP: the RTU was lost (resend it), or the consumer is still deciding
    /// (MRA, so the peer waits instead of timing out).
    fn on_dup_rep(&mut self, id: u32) {
        self.stats.rx_duplicates += 1;
        let c = &self.conns[&id];
        match c.state {
            ConnState::RepRcvd => self.send_mra(id, MsgCode::Rep, ConnState::MraRepSent),
            _ => self.resend_cached(id),
        }
    }

    /// MRA: the peer needs up to 4.096 µs · 2^service_timeout more; wait that plus a packet
    /// lifetime before the next retransmission (the kernel's `cm_mra_handler`).
    pub(crate) fn on_mra(&mut self, now: Instant, src: &MadSource, m: mra::Repr) {
        let Some(id) = self.lookup(src, m.remote_comm_id, None) else { return self.stray() };
        let c = &self.conns[&id];
        let next = match (c.state, m.message_mraed) {
            (ConnState::ReqSent | ConnState::MraReqRcvd, MsgCode::Req) => ConnState::MraReqRcvd,
            (ConnState::RepSent | ConnState::MraRepRcvd, MsgCode::Rep) if c.remote_id == m.local_comm_id => ConnState::MraRepRcvd,
            _ => return self.stray(),
        };
        let wait = iba_ns(m.service_timeout) + iba_ns(c.packet_life_time.saturating_add(1));
        let c = self.conns.get_mut(&id).expect("looked up");
        c.state = next;
        if let Some(r) = &mut c.retry {
            r.timeout_ns = wait;
        }
        self.arm(id, Some(now.add_ns(wait)));
    }
}
