//! The CM side: QP1 frames in, MADs out, timers, and the per-port CM's events turned into
//! librdmacm events.

use super::*;

impl CmCore {
    /// A QP1 frame received on `device`.
    pub fn on_frame(&mut self, now: Instant, device: u32, frame: &[u8]) {
        let Some(pi) = self.ports.iter().position(|p| p.cfg.device == device) else { return };
        match pmrxe_cm::gsi::parse_mad_frame(frame) {
            Ok((src, mad)) => {
                if !self.ports[pi].cfg.gids.contains(&src.dgid.0) {
                    self.stats.rx_bad += 1;
                    return;
                }
                if self.ports[pi].cm.handle_mad(now, &src, mad).is_err() {
                    self.stats.rx_bad += 1;
                }
            }
            Err(_) => self.stats.rx_bad += 1,
        }
        self.drain_events(now);
    }

    /// Fire due CM timers.
    pub fn handle_timeouts(&mut self, now: Instant) {
        for p in &mut self.ports {
            if p.cm.poll_timeout().is_some_and(|t| t <= now) {
                p.cm.handle_timeout(now);
            }
        }
        self.drain_events(now);
    }

    /// MADs to send: (port index, transmit).
    pub fn take_transmits(&mut self) -> Vec<(usize, Transmit)> {
        let mut v = Vec::new();
        for (i, p) in self.ports.iter_mut().enumerate() {
            while let Some(t) = p.cm.poll_transmit() {
                v.push((i, t));
            }
        }
        v
    }

    /// Move the MADs to send into the owning lcores' queues.
    pub(super) fn pump(&mut self, pipe: &GsiPipe) {
        for (pi, t) in self.take_transmits() {
            let cfg = &self.ports[pi].cfg;
            let out = GsiOut { device: cfg.device, path: t.path, mad: *t.mad };
            if !pipe.push_tx(cfg.lcore, out) {
                self.stats.tx_dropped += 1;
            }
        }
    }

    pub(super) fn drain_events(&mut self, now: Instant) {
        for pi in 0..self.ports.len() {
            while let Some(ev) = self.ports[pi].cm.poll_event() {
                self.on_event(now, pi, ev);
            }
        }
    }

    pub(super) fn conn_gone(&mut self, pi: usize, cid: ConnId) -> Option<u32> {
        let id = self.by_conn.remove(&(pi, cid))?;
        if let Some(r) = self.ids.get_mut(&id) {
            r.conn = None;
        }
        Some(id)
    }

    pub(super) fn on_event(&mut self, now: Instant, pi: usize, ev: Event) {
        match ev {
            Event::ConnectRequest { id: cid, req } => {
                let sid = req.req.service_id;
                let split = req.cma().map(|(h, u)| (h, u.to_vec()));
                let source = req.source;
                let r = &req.req;
                let peer = PeerReq {
                    transport: if r.transport == 1 { Transport::Uc } else { Transport::Rc },
                    remote_qpn: r.local_qpn,
                    rq_psn: r.starting_psn,
                    path_mtu: r.path_mtu.min(self.ports[pi].cfg.active_mtu as u8).max(1),
                    resp_res: r.initiator_depth,
                    init_depth: r.responder_resources,
                    timeout: r.primary.local_ack_timeout,
                    retry_cnt: r.retry_count,
                    rnr_retry: r.rnr_retry_count,
                };
                let conn = CmConnParam {
                    private_data: split.as_ref().map(|(_, u)| u.clone()).unwrap_or_else(|| r.private_data.clone()),
                    responder_resources: r.initiator_depth,
                    initiator_depth: r.responder_resources,
                    flow_control: r.flow_control as u8,
                    retry_count: r.retry_count,
                    rnr_retry_count: r.rnr_retry_count,
                    srq: r.srq as u8,
                    qp_num: r.local_qpn.value(),
                };
                let new = match self.child_of(pi, sid, cid, source.sgid, split.map(|(h, _)| h)) {
                    Ok(new) => new,
                    Err(why) => {
                        // A full backlog: REJ 28, as the kernel's cm_destroy_id after ucma refused it.
                        let reason = if why == NoChild::Backlog { RejReason::CONSUMER_DEFINED } else { RejReason::NO_RESOURCES };
                        let _ = self.ports[pi].cm.reject(now, cid, reason, &[], &[]);
                        return;
                    }
                };
                if let Some(rec) = self.ids.get_mut(&new) {
                    rec.peer_req = Some(peer);
                }
                self.emit_request(new, Some(conn), None);
            }
            Event::SidrRequest { id: cid, req } => {
                let sid = req.req.service_id;
                let split = cma::split_private_data(sid, &req.req.private_data).map(|(h, u)| (h, u.to_vec()));
                let source = req.source;
                let user = split.as_ref().map(|(_, u)| u.clone()).unwrap_or_else(|| req.req.private_data.clone());
                let Ok(new) = self.child_of(pi, sid, cid, source.sgid, split.map(|(h, _)| h)) else {
                    let p = SidrReplyParams { status: SidrStatus::REJECT, qpn: Qpn::new(0), qkey: 0, vendor_id: 0, info: vec![], private_data: vec![] };
                    let _ = self.ports[pi].cm.sidr_reply(now, cid, &p);
                    return;
                };
                let (src, tos) = self.ids.get(&new).map(|r| (sock_ip(&r.src), r.tos)).unwrap_or((IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
                let ud = CmUdParam { private_data: user, ah_attr: self.ah_to(pi, src, source.sgid, tos), qp_num: 0, qkey: cma::UDP_QKEY };
                self.emit_request(new, None, Some(ud));
            }
            Event::ConnectResponse { id: cid, rep } => {
                let Some(&id) = self.by_conn.get(&(pi, cid)) else { return };
                let conn = CmConnParam {
                    private_data: rep.private_data.clone(),
                    responder_resources: rep.initiator_depth,
                    initiator_depth: rep.responder_resources,
                    flow_control: rep.flow_control as u8,
                    retry_count: 0,
                    rnr_retry_count: rep.rnr_retry_count,
                    srq: rep.srq as u8,
                    qp_num: rep.local_qpn.value(),
                };
                self.emit(id, ctrl::CM_EVENT_CONNECT_RESPONSE, 0, Some(conn), None);
            }
            Event::Established { id: cid, private_data } => {
                let Some(&id) = self.by_conn.get(&(pi, cid)) else { return };
                if self.ids.get(&id).is_some_and(|r| r.active) {
                    return; // the client turned CONNECT_RESPONSE into ESTABLISHED (librdmacm)
                }
                self.emit(id, event::ESTABLISHED, 0, Some(CmConnParam { private_data, ..Default::default() }), None);
            }
            Event::Rejected { id: cid, reason, private_data, .. } => {
                let Some(id) = self.conn_gone(pi, cid) else { return };
                self.emit(id, event::REJECTED, i32::from(reason.0), Some(CmConnParam { private_data, ..Default::default() }), None);
            }
            Event::TimedOut { id: cid, waiting_for } => {
                let Some(id) = self.conn_gone(pi, cid) else { return };
                let _ = waiting_for == Waiting::Rep;
                self.emit(id, event::UNREACHABLE, -libc::ETIMEDOUT, None, None);
            }
            Event::Disconnected { id: cid, private_data, .. } => {
                let Some(&id) = self.by_conn.get(&(pi, cid)) else { return };
                self.emit(id, event::DISCONNECTED, 0, Some(CmConnParam { private_data, ..Default::default() }), None);
            }
            Event::TimewaitExit { id: cid } => {
                let Some(id) = self.conn_gone(pi, cid) else { return };
                self.emit(id, event::TIMEWAIT_EXIT, 0, None, None);
            }
            Event::SidrReply { id: cid, rep } => {
                let Some(id) = self.conn_gone(pi, cid) else { return };
                if rep.status == SidrStatus::SUCCESS {
                    let Some(r) = self.ids.get(&id) else { return };
                    let ah = self.ah_to(pi, sock_ip(&r.src), self.ports[pi].cfg.wire_gid(sock_ip(&r.dst)), r.tos);
                    let ud = CmUdParam { private_data: rep.private_data.clone(), ah_attr: ah, qp_num: rep.qpn.value(), qkey: rep.qkey };
                    self.emit(id, event::ESTABLISHED, 0, None, Some(ud));
                } else {
                    let ud = CmUdParam { private_data: rep.private_data.clone(), ..Default::default() };
                    self.emit(id, event::UNREACHABLE, i32::from(rep.status.0), None, Some(ud));
                }
            }
        }
    }

    pub(super) fn ah_to(&self, pi: usize, src: IpAddr, peer: Gid, tos: u8) -> AhAttr {
        AhAttr {
            dgid: peer.0,
            sgid_index: self.ports[pi].cfg.sgid_index(self.ports[pi].cfg.wire_gid(src)),
            hop_limit: 64,
            traffic_class: tos,
            is_global: true,
            port_num: 1,
            ..Default::default()
        }
    }
}
