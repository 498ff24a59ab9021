//! The passive side: listeners, REQ → ConnectRequest → accept (REP) or reject, RTU (or the
//! consumer's `establish` when data arrives first) → Established.

use crate::endpoint::{Conn, ConnState, Listener};
use crate::msg::{rep, req, rtu_drep, CmMsg, MsgCode, RejReason};
use crate::timers::{iba_ns, Instant};
use crate::types::{AcceptParams, ConnId, ConnectRequest, Event, MadSource};
use crate::{Cm, CmError};

impl Cm {
    /// Accept REQs (and SIDR_REQs) for `service_id`; at most `backlog` of them may wait for
    /// the consumer's answer at once (more are rejected, as the kernel does when a
    /// `rdma_listen` backlog overflows: REJ reason 28).
    pub fn listen(&mut self, service_id: u64, backlog: usize) -> Result<(), CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::ListenerExists);
        }
        if self.listeners.len() >= self.cfg.max_listeners {
            return Err(CmError::TableFull);
        }
        self.listeners.insert(service_id, Listener { backlog: backlog.max(1), pending: 0 });
        Ok(())
    }

    /// Stop listening. Requests already delivered stay valid.
    pub fn unlisten(&mut self, service_id: u64) -> Result<(), CmError> {
        self.listeners.remove(&service_id).map(|_| ()).ok_or(CmError::NoListener)
    }

    /// Answer a ConnectRequest with a REP (`rdma_accept`). The REP is retransmitted every
    /// 4.096 µs · 2^(REQ's local CM response timeout) up to the REQ's max CM retries.
    pub fn accept(&mut self, now: Instant, id: ConnId, p: &AcceptParams) -> Result<(), CmError> {
        Cm::check_len(&p.private_data, rep::PRIVATE_DATA_LEN)?;
        if p.rnr_retry_count > 7 {
            return Err(CmError::BadParam("rnr_retry_count"));
        }
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId)?;
        if !matches!(c.state, ConnState::ReqRcvd | ConnState::MraReqSent) {
            return Err(CmError::InvalidState);
        }
        let r = rep::Repr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: p.local_qpn,
            vendor_id: p.ece.vendor_id & 0xFF_FFFF,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: self.cfg.target_ack_delay,
            failover_accepted: 0,
            flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: self.cfg.ca_guid,
            private_data: p.private_data.clone(),
        };
        let (path, tid, t, n) = (c.path, c.tid, c.timeout_ns, c.max_retries);
        let mad = self.send(path, tid, p.ece.attr_mod, &CmMsg::Rep(r.clone())).ok_or(CmError::PrivateDataTooLong)?;
        self.release_backlog(id.0);
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId)?;
        c.state = ConnState::RepSent;
        c.local_qpn = p.local_qpn;
        c.cached = None;
        c.rep = Some(Box::new(r));
        self.start_retry(now, id.0, mad, t, n);
        Ok(())
    }

    /// The consumer saw the connection work without an RTU (the QP got data: the kernel's
    /// `ib_cm_notify(IB_EVENT_COMM_EST)`): stop retransmitting the REP, report Established.
    pub fn establish(&mut self, _now: Instant, id: ConnId) -> Result<(), CmError> {
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId)?;
        match c.state {
            ConnState::RepSent | ConnState::MraRepRcvd => {
                self.stop_retry(id.0);
                if let Some(c) = self.conns.get_mut(&id.0) {
                    c.state = ConnState::Established;
                }
                self.event(id.0, Event::Established { id, private_data: Vec::new() });
                Ok(())
            }
            ConnState::Established => Ok(()),
            _ => Err(CmError::InvalidState),
        }
    }

    pub(crate) fn on_req(&mut self, now: Instant, src: &MadSource, tid: u64, r: req::Repr) {
        if let Some(&id) = self.by_remote.get(&(r.local_ca_guid, r.local_comm_id)) {
            self.on_dup_req(id, src);
            return;
        }
        let reply = src.reply_path();
        let Some(l) = self.listeners.get(&r.service_id) else {
            // IBTA 12.6.7 / kernel cm_req_handler: nobody listens → REJ "invalid service ID".
            self.stats.rej_no_listener += 1;
            self.send_rej(reply, tid, 0, r.local_comm_id, MsgCode::Req, RejReason::INVALID_SERVICE_ID, Vec::new());
            return;
        };
        if r.transport > 1 {
            self.send_rej(reply, tid, 0, r.local_comm_id, MsgCode::Req, RejReason::INVALID_TRANSPORT_TYPE, Vec::new());
            return;
        }
        if let Some(&old) = self.by_remote_qpn.get(&(src.sgid, r.local_qpn.value())) {
            // Kernel cm_req_handler: the remote QPN is still bound to a connection of ours →
            // REJ stale to the new REQ, and disconnect the old one if it is up.
            self.stats.rej_stale += 1;
            self.send_rej(reply, tid, 0, r.local_comm_id, MsgCode::Req, RejReason::STALE_CONN, Vec::new());
            if self.conns.get(&old).is_some_and(|c| c.state == ConnState::Established) {
                self.start_dreq(now, old, &[]);
            }
            return;
        }
        if self.table_full() || l.pending >= l.backlog {
            self.stats.rej_no_resources += 1;
            let reason = if self.table_full() { RejReason::NO_RESOURCES } else { RejReason::CONSUMER_DEFINED };
            self.send_rej(reply, tid, 0, r.local_comm_id, MsgCode::Req, reason, Vec::new());
            return;
        }
        let id = self.alloc_id();
        let mut path = reply;
        path.traffic_class = r.primary.traffic_class;
        if r.primary.hop_limit > 1 {
            path.hop_limit = r.primary.hop_limit;
        }
        let mut c = Conn::new(ConnState::ReqRcvd, false, path, tid, r.service_id, self.cfg.packet_life_time);
        c.remote_id = r.local_comm_id;
        c.remote_guid = r.local_ca_guid;
        c.remote_qpn = Some(r.local_qpn);
        c.listener = Some(r.service_id);
        // Kernel cm_req_handler: the REP waits the REQ's *local* CM response timeout.
        c.timeout_ns = iba_ns(r.local_cm_response_timeout);
        c.max_retries = r.max_cm_retries;
        c.req = Some(Box::new(r.clone()));
        self.conns.insert(id, c);
        self.by_remote.insert((r.local_ca_guid, r.local_comm_id), id);
        self.by_remote_qpn.insert((src.sgid, r.local_qpn.value()), id);
        if let Some(l) = self.listeners.get_mut(&r.service_id) {
            l.pending += 1;
        }
        let req = Box::new(ConnectRequest { req: r, source: *src });
        self.event(id, Event::ConnectRequest { id: ConnId(id), req });
    }

    /// A retransmitted REQ: MRA while the consumer decides, REP again once answered.
    fn on_dup_req(&mut self, id: u32, src: &MadSource) {
        self.stats.rx_duplicates += 1;
        let Some(c) = self.conns.get(&id) else { return };
        if c.path.dgid != src.sgid {
            return self.stray();
        }
        match c.state {
            ConnState::ReqRcvd => self.send_mra(id, MsgCode::Req, ConnState::MraReqSent),
            ConnState::MraReqSent => self.resend_cached(id),
            ConnState::RepSent | ConnState::MraRepRcvd => self.resend_retry(id),
            _ => {}
        }
    }

    pub(crate) fn on_rtu(&mut self, src: &MadSource, r: rtu_drep::Repr) {
        let Some(id) = self.lookup(src, r.remote_comm_id, Some(r.local_comm_id)) else { return self.stray() };
        match self.conns[&id].state {
            ConnState::RepSent | ConnState::MraRepRcvd => {
                self.stop_retry(id);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.state = ConnState::Established;
                }
                self.event(id, Event::Established { id: ConnId(id), private_data: r.private_data });
            }
            ConnState::Established | ConnState::DreqSent | ConnState::TimeWait => self.stats.rx_duplicates += 1,
            _ => self.stray(),
        }
    }
}
