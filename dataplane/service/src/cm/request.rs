//! The dispatcher of `Request::Cm*`: one request of one client, checked and turned into the
//! CM commands of the other modules.

use super::*;

/// The id a request names (for the backlog: naming a passive id means its CONNECT_REQUEST
/// was read).
pub(super) fn named_id(req: &Request) -> Option<u32> {
    match *req {
        Request::CmMigrateId { id, .. }
        | Request::CmBindAddr { id, .. }
        | Request::CmResolveAddr { id, .. }
        | Request::CmResolveRoute { id, .. }
        | Request::CmListen { id, .. }
        | Request::CmConnect { id, .. }
        | Request::CmAccept { id, .. }
        | Request::CmReject { id, .. }
        | Request::CmEstablish { id }
        | Request::CmDisconnect { id }
        | Request::CmInitQpAttr { id, .. }
        | Request::CmSetOption { id, .. }
        | Request::CmDestroyId { id }
        | Request::CmJoinMulticast { id, .. }
        | Request::CmLeaveMulticast { id, .. } => Some(id),
        _ => None,
    }
}

impl CmCore {
    /// One `Request::Cm*` of `client`.
    pub fn request(&mut self, now: Instant, client: u32, req: Request) -> Reply {
        // A client that names a passive id has read its CONNECT_REQUEST.
        if let Some(id) = named_id(&req).filter(|id| self.ids.get(id).is_some_and(|r| r.client == client)) {
            self.request_read(id);
        }
        let r = self.request_inner(now, client, req);
        self.drain_events(now);
        r
    }

    pub(super) fn request_inner(&mut self, now: Instant, client: u32, req: Request) -> Reply {
        match req {
            Request::CmOpenChannel => {
                if self.channels.len() >= MAX_CHANNELS || self.channels.values().filter(|c| c.client == client).count() >= MAX_CHANNELS_PER_CLIENT {
                    return fail(libc::EMFILE, "too many rdma_cm event channels");
                }
                let (ours, theirs) = match seqpacket_pair() {
                    Ok(p) => p,
                    Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE), &e.to_string()),
                };
                let h = self.handle();
                self.channels.insert(h, Channel { client, sock: ours, backlog: VecDeque::new() });
                (Response::CmChannel { channel: h }, Some(theirs))
            }
            Request::CmCreateId { channel, ps, qp_type, context } => {
                if !self.own_channel(client, channel) {
                    return fail(libc::EINVAL, "no such rdma_cm event channel");
                }
                let Ok(ps) = PortSpace::try_from(ps) else { return fail(libc::EPROTONOSUPPORT, "unknown rdma_cm port space") };
                let Ok(qp_type) = crate::session::decode_qp_type(qp_type) else { return fail(libc::EINVAL, "rdma_cm ids are for RC, UC or UD QPs") };
                if self.ids.len() >= MAX_IDS || self.ids.values().filter(|r| r.client == client).count() >= MAX_IDS_PER_CLIENT {
                    return fail(libc::ENOMEM, "too many rdma_cm ids");
                }
                let h = self.handle();
                self.ids.insert(
                    h,
                    IdRec {
                        client,
                        channel,
                        context,
                        ps,
                        qp_type,
                        device: None,
                        bound: false,
                        child: false,
                        src: CmSockAddr::default(),
                        dst: CmSockAddr::default(),
                        addr_resolved: false,
                        route_resolved: false,
                        listen_sid: None,
                        conn: None,
                        psn: Psn::new(self.rng.gen()),
                        tos: 0,
                        ack_timeout: None,
                        reuseaddr: false,
                        afonly: None,
                        peer_req: None,
                        active: false,
                        parent: None,
                        peer_gid: None,
                        backlog: 0,
                        pending: 0,
                        unread: false,
                        joins: Vec::new(),
                    },
                );
                (Response::CmId { id: h }, None)
            }
            Request::CmMigrateId { id, channel } => {
                if let Err(e) = self.own(client, id) {
                    return fail(e.0, e.1);
                }
                if !self.own_channel(client, channel) {
                    return fail(libc::EINVAL, "no such rdma_cm event channel");
                }
                self.ids.get_mut(&id).expect("owned").channel = channel;
                ok()
            }
            Request::CmBindAddr { id, addr } => {
                if let Err(e) = self.own(client, id) {
                    return fail(e.0, e.1);
                }
                match self.bind(id, addr) {
                    Ok(()) => self.addr_reply(id),
                    Err(e) => fail(e.0, e.1),
                }
            }
            Request::CmResolveAddr { id, src, dst, .. } => self.resolve_addr(client, id, src, dst),
            Request::CmResolveRoute { id, .. } => {
                let r = match self.own(client, id) {
                    Ok(r) => r,
                    Err(e) => return fail(e.0, e.1),
                };
                if !r.addr_resolved {
                    return fail(libc::EINVAL, "resolve the address first");
                }
                self.ids.get_mut(&id).expect("owned").route_resolved = true;
                self.emit(id, event::ROUTE_RESOLVED, 0, None, None);
                ok()
            }
            Request::CmListen { id, backlog } => self.listen(client, id, backlog),
            Request::CmConnect { id, qpn, conn } => self.connect(now, client, id, qpn, conn),
            Request::CmAccept { id, qpn, conn } => self.accept(now, client, id, qpn, conn),
            Request::CmReject { id, private_data } => {
                let r = match self.own(client, id) {
                    Ok(r) => r,
                    Err(e) => return fail(e.0, e.1),
                };
                let (Some(pi), Some(cid), ud) = (r.device, r.conn, r.is_ud()) else { return fail(libc::EINVAL, "no connection request to reject") };
                let res = if ud {
                    let p = SidrReplyParams { status: SidrStatus::REJECT, qpn: Qpn::new(0), qkey: 0, vendor_id: 0, info: vec![], private_data };
                    self.ports[pi].cm.sidr_reply(now, cid, &p)
                } else {
                    self.ports[pi].cm.reject(now, cid, RejReason::CONSUMER_DEFINED, &[], &private_data)
                };
                match res {
                    Ok(()) => {
                        self.conn_gone(pi, cid);
                        ok()
                    }
                    Err(e) => fail(libc::EINVAL, &format!("reject: {e:?}")),
                }
            }
            Request::CmEstablish { id } => {
                let r = match self.own(client, id) {
                    Ok(r) => r,
                    Err(e) => return fail(e.0, e.1),
                };
                let (Some(pi), Some(cid)) = (r.device, r.conn) else { return fail(libc::EINVAL, "not connecting") };
                let cm = &mut self.ports[pi].cm;
                let res = match cm.state(cid) {
                    Some(ConnState::RepRcvd | ConnState::MraRepSent) => cm.rtu(now, cid, &[]),
                    Some(ConnState::RepSent | ConnState::MraRepRcvd) => cm.establish(now, cid),
                    Some(ConnState::Established) => Ok(()),
                    _ => return fail(libc::EINVAL, "the connection is not being established"),
                };
                match res {
                    Ok(()) => ok(),
                    Err(e) => fail(libc::EINVAL, &format!("establish: {e:?}")),
                }
            }
            Request::CmDisconnect { id } => {
                let r = match self.own(client, id) {
                    Ok(r) => r,
                    Err(e) => return fail(e.0, e.1),
                };
                let (Some(pi), Some(cid)) = (r.device, r.conn) else { return fail(libc::EINVAL, "not connected") };
                let cm = &mut self.ports[pi].cm;
                match cm.state(cid) {
                    Some(ConnState::Established) => match cm.disconnect(now, cid, &[]) {
                        Ok(()) => ok(),
                        Err(e) => fail(libc::EINVAL, &format!("disconnect: {e:?}")),
                    },
                    Some(ConnState::DreqSent | ConnState::TimeWait) => ok(),
                    _ => fail(libc::EINVAL, "not connected"),
                }
            }
            Request::CmInitQpAttr { id, qp_state } => match self.own(client, id) {
                Ok(_) => self.init_qp_attr(id, qp_state),
                Err(e) => fail(e.0, e.1),
            },
            Request::CmSetOption { id, level, name, value } => {
                if let Err(e) = self.own(client, id) {
                    return fail(e.0, e.1);
                }
                let r = self.ids.get_mut(&id).expect("owned");
                let int = || value.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                match (level, name) {
                    (0, 0) => match value.first() {
                        Some(&t) => r.tos = t,
                        None => return fail(libc::EINVAL, "TOS needs one byte"),
                    },
                    (0, 1) => match int() {
                        Some(v) => r.reuseaddr = v != 0,
                        None => return fail(libc::EINVAL, "REUSEADDR needs an int"),
                    },
                    (0, 2) => match int() {
                        Some(v) => r.afonly = Some(v != 0),
                        None => return fail(libc::EINVAL, "AFONLY needs an int"),
                    },
                    (0, 3) => match value.first() {
                        Some(&t) => r.ack_timeout = Some(t.min(31)),
                        None => return fail(libc::EINVAL, "ACK_TIMEOUT needs one byte"),
                    },
                    _ => return fail(libc::ENOSYS, "unsupported rdma_cm option"),
                }
                ok()
            }
            Request::CmDestroyId { id } => {
                if let Err(e) = self.own(client, id) {
                    return fail(e.0, e.1);
                }
                self.destroy(now, id);
                ok()
            }
            Request::CmJoinMulticast { id, addr } => self.join_multicast(client, id, addr),
            Request::CmLeaveMulticast { id, addr } => self.leave_multicast(client, id, addr),
            _ => fail(libc::EINVAL, "not an rdma_cm request"),
        }
    }
}
