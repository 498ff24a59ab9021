//! The active and passive handshakes: `rdma_connect` (REQ or SIDR_REQ) and `rdma_accept`
//! (REP or SIDR_REP).

use super::*;

impl CmCore {
    pub(super) fn connect(&mut self, now: Instant, client: u32, id: u32, qpn: u32, conn: CmConnParam) -> Reply {
        let Ok(qpn) = Qpn::try_from(qpn) else { return fail(libc::EINVAL, "QP number does not fit 24 bits") };
        let r = match self.own(client, id) {
            Ok(r) => r,
            Err(e) => return fail(e.0, e.1),
        };
        let Some(pi) = r.device.filter(|_| r.route_resolved) else { return fail(libc::EINVAL, "resolve the route first") };
        if r.conn.is_some() || r.listen_sid.is_some() {
            return fail(libc::EISCONN, "rdma_cm id is already connecting or listening");
        }
        let path = self.route(r, pi);
        let hdr = cma::Repr { src_ip: sock_ip(&r.src), src_port: r.src.port, dst_ip: sock_ip(&r.dst) };
        let (ud, ps, dport, psn, qp_type) = (r.is_ud(), r.ps, r.dst.port, r.psn, r.qp_type);
        let res = if ud {
            let Ok(pd) = hdr.with_user_data(&conn.private_data, sidr_req::PRIVATE_DATA_LEN) else {
                return fail(libc::EINVAL, "private data too long");
            };
            let sid = cma::service_id(if ps == PortSpace::IPOIB { PortSpace::IPOIB } else { PortSpace::UDP }, dport);
            let p = SidrParams { path, service_id: sid, timeout: pmrxe_cm::types::CMA_CM_RESPONSE_TIMEOUT, max_cm_retries: pmrxe_cm::types::CMA_MAX_CM_RETRIES, private_data: pd };
            self.ports[pi].cm.sidr_resolve(now, &p)
        } else {
            let Ok(pd) = hdr.with_user_data(&conn.private_data, req::PRIVATE_DATA_LEN) else {
                return fail(libc::EINVAL, "private data too long");
            };
            let sid = cma::service_id(ps, dport);
            let mut p = ConnectParams::new(path, sid, qpn, psn);
            p.transport = if qp_type == QpType::Uc { Transport::Uc } else { Transport::Rc };
            p.responder_resources = conn.responder_resources;
            p.initiator_depth = conn.initiator_depth;
            p.retry_count = conn.retry_count.min(7);
            p.rnr_retry_count = conn.rnr_retry_count.min(7);
            p.flow_control = conn.flow_control != 0;
            p.srq = conn.srq != 0;
            p.private_data = pd;
            self.ports[pi].cm.connect(now, &p)
        };
        match res {
            Ok(cid) => {
                let rec = self.ids.get_mut(&id).expect("owned");
                rec.conn = Some(cid);
                rec.active = !ud;
                self.by_conn.insert((pi, cid), id);
                ok()
            }
            Err(pmrxe_cm::CmError::TableFull) => fail(libc::ENOMEM, "connection table full"),
            Err(e) => fail(libc::EINVAL, &format!("connect: {e:?}")),
        }
    }

    pub(super) fn accept(&mut self, now: Instant, client: u32, id: u32, qpn: u32, conn: CmConnParam) -> Reply {
        let Ok(qpn) = Qpn::try_from(qpn) else { return fail(libc::EINVAL, "QP number does not fit 24 bits") };
        let r = match self.own(client, id) {
            Ok(r) => r,
            Err(e) => return fail(e.0, e.1),
        };
        let (Some(pi), Some(cid)) = (r.device, r.conn) else { return fail(libc::EINVAL, "no connection request to accept") };
        let res = if r.is_ud() {
            let p = SidrReplyParams { status: SidrStatus::SUCCESS, qpn, qkey: cma::UDP_QKEY, vendor_id: 0, info: vec![], private_data: conn.private_data };
            let res = self.ports[pi].cm.sidr_reply(now, cid, &p);
            if res.is_ok() {
                self.conn_gone(pi, cid);
            }
            res
        } else {
            let p = AcceptParams {
                local_qpn: qpn,
                starting_psn: r.psn,
                responder_resources: conn.responder_resources,
                initiator_depth: conn.initiator_depth,
                rnr_retry_count: conn.rnr_retry_count.min(7),
                flow_control: conn.flow_control != 0,
                srq: conn.srq != 0,
                ece: Default::default(),
                private_data: conn.private_data,
            };
            self.ports[pi].cm.accept(now, cid, &p)
        };
        match res {
            Ok(()) => ok(),
            Err(e) => fail(libc::EINVAL, &format!("accept: {e:?}")),
        }
    }
}
