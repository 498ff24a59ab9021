//! Ending connections: reject (REJ), disconnect (DREQ/DREP), TIMEWAIT, retry exhaustion and
//! the consumer's `destroy` (which finishes the protocol as `ib_destroy_cm_id` does).

use crate::endpoint::ConnState;
use crate::msg::{dreq, rej, rtu_drep, sidr_rep, CmMsg, MsgCode, RejReason, SidrStatus};
use crate::timers::Instant;
use crate::types::{ConnId, Event, MadSource, Waiting};
use crate::{Cm, CmError};

impl Cm {
    /// Reject a ConnectRequest (passive, before `accept`) or a ConnectResponse (active, before
    /// `rtu`) with `reason` (consumer rejects: [`RejReason::CONSUMER_DEFINED`], 28), ARI
    /// (≤ 72 bytes) and private data (≤ 148 bytes). A rejected REQ is forgotten at once; a
    /// rejected REP enters TIMEWAIT (`TimewaitExit` follows), as in the kernel.
    pub fn reject(&mut self, now: Instant, id: ConnId, reason: RejReason, ari: &[u8], private_data: &[u8]) -> Result<(), CmError> {
        Cm::check_len(private_data, rej::PRIVATE_DATA_LEN)?;
        if ari.len() > rej::ARI_LEN {
            return Err(CmError::BadParam("ari"));
        }
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId)?;
        let message = match c.state {
            ConnState::ReqRcvd | ConnState::MraReqSent => MsgCode::Req,
            ConnState::RepRcvd | ConnState::MraRepSent => MsgCode::Rep,
            _ => return Err(CmError::InvalidState),
        };
        let r = rej::Repr { local_comm_id: id.0, remote_comm_id: c.remote_id, message_rejected: message, reason, ari: ari.to_vec(), private_data: private_data.to_vec() };
        let (path, tid) = (c.path, c.tid);
        let _ = self.send(path, tid, 0, &CmMsg::Rej(r));
        match message {
            MsgCode::Req => self.remove(id.0),
            _ => self.enter_timewait(now, id.0),
        }
        Ok(())
    }

    /// Send a DREQ (`rdma_disconnect`). `Disconnected` follows when the DREP arrives, the
    /// peer's own DREQ crosses ours, or the retries run out. Idempotent while disconnecting.
    pub fn disconnect(&mut self, now: Instant, id: ConnId, private_data: &[u8]) -> Result<(), CmError> {
        Cm::check_len(private_data, dreq::PRIVATE_DATA_LEN)?;
        match self.conns.get(&id.0).ok_or(CmError::UnknownId)?.state {
            ConnState::Established => {
                self.start_dreq(now, id.0, private_data);
                Ok(())
            }
            ConnState::DreqSent | ConnState::TimeWait => Ok(()),
            _ => Err(CmError::InvalidState),
        }
    }

    /// The consumer is done with `id` (its process died, or `rdma_destroy_id`). Whatever the
    /// state, the peer is told: REJ before establishment (timeout while our REQ is
    /// unanswered, consumer-defined otherwise), DREQ when established (then TIMEWAIT, all
    /// silently), SIDR_REP(reject) for an unanswered SIDR_REQ. No event for `id` follows, and
    /// queued ones are dropped.
    pub fn destroy(&mut self, now: Instant, id: ConnId) -> Result<(), CmError> {
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId)?;
        let (path, tid, remote) = (c.path, c.tid, c.remote_id);
        match c.state {
            ConnState::ReqSent | ConnState::MraReqRcvd => {
                let ari = self.cfg.ca_guid.to_be_bytes().to_vec();
                self.send_rej(path, tid, id.0, remote, MsgCode::Other, RejReason::TIMEOUT, ari);
                self.remove(id.0);
            }
            ConnState::ReqRcvd | ConnState::MraReqSent => {
                self.send_rej(path, tid, id.0, remote, MsgCode::Req, RejReason::CONSUMER_DEFINED, Vec::new());
                self.remove(id.0);
            }
            ConnState::RepRcvd | ConnState::MraRepSent => {
                self.send_rej(path, tid, id.0, remote, MsgCode::Rep, RejReason::CONSUMER_DEFINED, Vec::new());
                self.remove(id.0);
            }
            ConnState::RepSent | ConnState::MraRepRcvd => {
                self.send_rej(path, tid, id.0, remote, MsgCode::Other, RejReason::CONSUMER_DEFINED, Vec::new());
                self.remove(id.0);
            }
            ConnState::Established => {
                self.start_dreq(now, id.0, &[]);
                self.detach(id.0);
            }
            ConnState::DreqSent | ConnState::TimeWait | ConnState::SidrRepSent => self.detach(id.0),
            ConnState::SidrReqSent => self.remove(id.0),
            ConnState::SidrReqRcvd => {
                let c = &self.conns[&id.0];
                let r = sidr_rep::Repr {
                    request_id: c.remote_id,
                    status: SidrStatus::REJECT,
                    vendor_id: 0,
                    qpn: pmrxe_wire::Qpn::new(0),
                    service_id: c.service_id,
                    qkey: 0,
                    info: Vec::new(),
                    private_data: Vec::new(),
                };
                let _ = self.send(path, tid, 0, &CmMsg::SidrRep(r));
                self.remove(id.0);
            }
        }
        self.events.retain(|e| e.id() != id);
        Ok(())
    }

    fn detach(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.detached = true;
        }
    }

    pub(crate) fn start_dreq(&mut self, now: Instant, id: u32, private_data: &[u8]) {
        let Some(c) = self.conns.get(&id) else { return };
        let d = dreq::Repr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            remote_qpn: c.remote_qpn.unwrap_or_default(),
            private_data: private_data.to_vec(),
        };
        // A fresh transaction for the disconnect (the handshake's TID with the high word + 1).
        let tid = self.tid_for(id).wrapping_add(1 << 32);
        let (path, t, n) = (c.path, c.timeout_ns, c.max_retries);
        let Some(mad) = self.send(path, tid, 0, &CmMsg::Dreq(d)) else { return };
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = ConnState::DreqSent;
            c.cached = None;
        }
        self.start_retry(now, id, mad, t, n);
    }

    pub(crate) fn on_dreq(&mut self, now: Instant, src: &MadSource, tid: u64, d: dreq::Repr) {
        let drep = |local: u32, remote: u32| CmMsg::Drep(rtu_drep::Repr { local_comm_id: local, remote_comm_id: remote, private_data: Vec::new() });
        let Some(id) = self.lookup(src, d.remote_comm_id, Some(d.local_comm_id)) else {
            // Kernel cm_dreq_handler: unknown connection → DREP anyway, so the peer's
            // disconnect completes (it may have outlived our TIMEWAIT).
            self.stray();
            let _ = self.send(src.reply_path(), tid, 0, &drep(d.remote_comm_id, d.local_comm_id));
            return;
        };
        let c = &self.conns[&id];
        if d.remote_qpn != c.local_qpn {
            return self.stray();
        }
        match c.state {
            ConnState::Established | ConnState::RepSent | ConnState::MraRepRcvd | ConnState::DreqSent => {
                if matches!(c.state, ConnState::RepSent | ConnState::MraRepRcvd) {
                    // The RTU was lost but the peer, established, already disconnects: report
                    // the establishment first so the consumer always sees Established before
                    // Disconnected (the kernel reports only DISCONNECTED here).
                    self.event(id, Event::Established { id: ConnId(id), private_data: Vec::new() });
                }
                let c = &self.conns[&id];
                let path = c.path;
                let mad = self.send(path, tid, 0, &drep(id, d.local_comm_id));
                self.enter_timewait(now, id);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.cached = mad;
                }
                self.event(id, Event::Disconnected { id: ConnId(id), timed_out: false, private_data: d.private_data });
            }
            ConnState::TimeWait => {
                self.stats.rx_duplicates += 1;
                let path = c.path;
                let _ = self.send(path, tid, 0, &drep(id, d.local_comm_id));
            }
            _ => self.stray(),
        }
    }

    pub(crate) fn on_drep(&mut self, now: Instant, src: &MadSource, d: rtu_drep::Repr) {
        let Some(id) = self.lookup(src, d.remote_comm_id, Some(d.local_comm_id)) else { return self.stray() };
        match self.conns[&id].state {
            ConnState::DreqSent => {
                self.enter_timewait(now, id);
                self.event(id, Event::Disconnected { id: ConnId(id), timed_out: false, private_data: d.private_data });
            }
            ConnState::TimeWait => self.stats.rx_duplicates += 1,
            _ => self.stray(),
        }
    }

    pub(crate) fn on_rej(&mut self, now: Instant, src: &MadSource, r: rej::Repr) {
        // Kernel cm_acquire_rejected_id: a REJ(timeout) names the sender's CA GUID in its ARI
        // (it may never have learnt our ID); otherwise it names our ID.
        let by_ari = (r.reason == RejReason::TIMEOUT && r.ari.len() >= 8)
            .then(|| u64::from_be_bytes(r.ari[..8].try_into().expect("8 bytes")))
            .and_then(|guid| self.by_remote.get(&(guid, r.local_comm_id)).copied())
            .filter(|&id| self.lookup(src, id, None).is_some());
        let id = by_ari.or_else(|| {
            let remote = (r.message_rejected != MsgCode::Req).then_some(r.local_comm_id);
            self.lookup(src, r.remote_comm_id, remote)
                .or_else(|| self.lookup(src, r.remote_comm_id, None).filter(|id| self.conns[id].remote_id == 0))
        });
        let Some(id) = id else { return self.stray() };
        let state = self.conns[&id].state;
        let timewait = match state {
            ConnState::ReqSent | ConnState::MraReqRcvd | ConnState::ReqRcvd | ConnState::MraReqSent | ConnState::RepSent | ConnState::MraRepRcvd => {
                r.reason == RejReason::STALE_CONN
            }
            ConnState::RepRcvd | ConnState::MraRepSent | ConnState::Established | ConnState::DreqSent => true,
            _ => return self.stray(),
        };
        self.event(
            id,
            Event::Rejected { id: ConnId(id), reason: r.reason, message: r.message_rejected, ari: r.ari, private_data: r.private_data },
        );
        if timewait {
            self.enter_timewait(now, id);
        } else {
            self.remove(id);
        }
    }

    /// Retries of the MAD we were retransmitting ran out.
    pub(crate) fn on_retries_exhausted(&mut self, now: Instant, id: u32) {
        let c = &self.conns[&id];
        let (path, tid, remote) = (c.path, c.tid, c.remote_id);
        let waiting = match c.state {
            ConnState::ReqSent | ConnState::MraReqRcvd => Waiting::Rep,
            ConnState::RepSent | ConnState::MraRepRcvd => Waiting::Rtu,
            ConnState::SidrReqSent => Waiting::SidrRep,
            ConnState::DreqSent => {
                self.enter_timewait(now, id);
                self.event(id, Event::Disconnected { id: ConnId(id), timed_out: true, private_data: Vec::new() });
                return;
            }
            _ => return,
        };
        if waiting != Waiting::SidrRep {
            // IBTA 12.9.x: tell the peer we gave up, so it does not hold a half-open entry
            // (REJ reason 4, ARI = our CA GUID, as `ib_destroy_cm_id` sends it).
            let ari = self.cfg.ca_guid.to_be_bytes().to_vec();
            self.send_rej(path, tid, id, remote, MsgCode::Other, RejReason::TIMEOUT, ari);
        }
        self.event(id, Event::TimedOut { id: ConnId(id), waiting_for: waiting });
        self.remove(id);
    }
}
