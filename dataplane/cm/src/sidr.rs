//! Service ID Resolution for UD (IBTA 12.11): SIDR_REQ (retransmitted) → SIDR_REP with the
//! service's QPN and Q_Key. The server keeps its SIDR_REP for a TIMEWAIT period to answer
//! retransmitted SIDR_REQs without bothering the consumer again.

use crate::endpoint::{Conn, ConnState};
use crate::msg::{sidr_rep, sidr_req, CmMsg, SidrStatus};
use crate::timers::{iba_ns, Instant};
use crate::types::{ConnId, Event, MadSource, SidrParams, SidrReplyParams, SidrRequest};
use crate::{Cm, CmError};

impl Cm {
    /// Send a SIDR_REQ (the UD `rdma_connect`). `SidrReply` or `TimedOut` follows.
    pub fn sidr_resolve(&mut self, now: Instant, p: &SidrParams) -> Result<ConnId, CmError> {
        Cm::check_len(&p.private_data, sidr_req::PRIVATE_DATA_LEN)?;
        if p.timeout > 31 {
            return Err(CmError::BadParam("timeout"));
        }
        if p.max_cm_retries > 15 {
            return Err(CmError::BadParam("max_cm_retries"));
        }
        if self.table_full() {
            return Err(CmError::TableFull);
        }
        let id = self.alloc_id();
        let tid = self.tid_for(id);
        let path = p.path.gsi();
        let r = sidr_req::Repr { request_id: id, pkey: p.path.pkey, service_id: p.service_id, private_data: p.private_data.clone() };
        self.conns.insert(id, Conn::new(ConnState::SidrReqSent, true, path, tid, p.service_id, p.path.packet_life_time));
        let Some(mad) = self.send(path, tid, 0, &CmMsg::SidrReq(r)) else {
            self.remove(id);
            return Err(CmError::PrivateDataTooLong);
        };
        self.start_retry(now, id, mad, iba_ns(p.timeout), p.max_cm_retries);
        Ok(ConnId(id))
    }

    /// Answer a `SidrRequest`.
    pub fn sidr_reply(&mut self, now: Instant, id: ConnId, p: &SidrReplyParams) -> Result<(), CmError> {
        Cm::check_len(&p.private_data, sidr_rep::PRIVATE_DATA_LEN)?;
        if p.info.len() > sidr_rep::INFO_LEN {
            return Err(CmError::BadParam("info"));
        }
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId)?;
        if c.state != ConnState::SidrReqRcvd {
            return Err(CmError::InvalidState);
        }
        let r = sidr_rep::Repr {
            request_id: c.remote_id,
            status: p.status,
            vendor_id: p.vendor_id & 0xFF_FFFF,
            qpn: p.qpn,
            service_id: c.service_id,
            qkey: p.qkey,
            info: p.info.clone(),
            private_data: p.private_data.clone(),
        };
        let (path, tid) = (c.path, c.tid);
        let mad = self.send(path, tid, 0, &CmMsg::SidrRep(r));
        self.release_backlog(id.0);
        let linger = iba_ns(self.cfg.sidr_linger);
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId)?;
        c.state = ConnState::SidrRepSent;
        c.cached = mad;
        self.arm(id.0, Some(now.add_ns(linger)));
        Ok(())
    }

    pub(crate) fn on_sidr_req(&mut self, src: &MadSource, tid: u64, r: sidr_req::Repr) {
        let key = (src.sgid, r.request_id);
        if let Some(&id) = self.sidr_by_remote.get(&key) {
            self.stats.rx_duplicates += 1;
            if self.conns.get(&id).is_some_and(|c| c.state == ConnState::SidrRepSent) {
                self.resend_cached(id);
            }
            return;
        }
        let reply = src.reply_path();
        let refuse = |status: SidrStatus| {
            CmMsg::SidrRep(sidr_rep::Repr {
                request_id: r.request_id,
                status,
                vendor_id: 0,
                qpn: pmrxe_wire::Qpn::new(0),
                service_id: r.service_id,
                qkey: 0,
                info: Vec::new(),
                private_data: Vec::new(),
            })
        };
        let Some(l) = self.listeners.get(&r.service_id) else {
            // Kernel cm_sidr_req_handler: no listener → SIDR_REP "unsupported".
            self.stats.rej_no_listener += 1;
            let _ = self.send(reply, tid, 0, &refuse(SidrStatus::UNSUPPORTED));
            return;
        };
        if self.table_full() || l.pending >= l.backlog {
            self.stats.rej_no_resources += 1;
            let _ = self.send(reply, tid, 0, &refuse(SidrStatus::REJECT));
            return;
        }
        let id = self.alloc_id();
        let mut c = Conn::new(ConnState::SidrReqRcvd, false, reply, tid, r.service_id, self.cfg.packet_life_time);
        c.remote_id = r.request_id;
        c.listener = Some(r.service_id);
        c.sidr_key = Some(key);
        self.conns.insert(id, c);
        self.sidr_by_remote.insert(key, id);
        if let Some(l) = self.listeners.get_mut(&r.service_id) {
            l.pending += 1;
        }
        let req = Box::new(SidrRequest { req: r, source: *src });
        self.event(id, Event::SidrRequest { id: ConnId(id), req });
    }

    pub(crate) fn on_sidr_rep(&mut self, src: &MadSource, r: sidr_rep::Repr) {
        let Some(id) = self.lookup(src, r.request_id, None) else { return self.stray() };
        if self.conns[&id].state != ConnState::SidrReqSent {
            return self.stray();
        }
        self.event(id, Event::SidrReply { id: ConnId(id), rep: Box::new(r) });
        self.remove(id);
    }
}
