//! `rdma_init_qp_attr`: the QP attributes and mask for INIT, RTR and RTS from the id's
//! connection.

use super::*;

/// `enum ibv_access_flags` bits `rdma_init_qp_attr` grants at INIT.
const IBV_ACCESS_LOCAL_WRITE: u32 = 1;
const IBV_ACCESS_REMOTE_WRITE: u32 = 2;
const IBV_ACCESS_REMOTE_READ: u32 = 4;
const IBV_ACCESS_REMOTE_ATOMIC: u32 = 8;

impl CmCore {
    /// `rdma_init_qp_attr` (kernel `rdma_init_qp_attr` + `ib_cm_init_qp_attr` for RoCE).
    pub(super) fn init_qp_attr(&self, id: u32, qp_state: u32) -> Reply {
        let r = &self.ids[&id];
        let Some(pi) = r.device else { return fail(libc::EINVAL, "rdma_cm id has no device yet") };
        let port = &self.ports[pi];
        let mut a = QpAttr { qp_state, cur_qp_state: qp_state, ..Default::default() };
        let ud = r.is_ud();
        let attrs = r.conn.and_then(|c| port.cm.qp_attrs(c));
        let mask = match qp_state {
            1 => {
                a.pkey_index = 0;
                a.port_num = 1;
                if ud {
                    a.qkey = cma::UDP_QKEY;
                    mask::STATE | mask::PKEY_INDEX | mask::PORT | mask::QKEY
                } else {
                    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
                    let resp = attrs.map(|x| x.max_dest_rd_atomic).or(r.peer_req.map(|p| p.resp_res)).unwrap_or(0);
                    if resp > 0 {
                        a.qp_access_flags |= IBV_ACCESS_REMOTE_ATOMIC;
                    }
                    mask::STATE | mask::ACCESS_FLAGS | mask::PKEY_INDEX | mask::PORT
                }
            }
            2 if ud => mask::STATE,
            2 => {
                let (transport, dqpn, rq_psn, mtu, resp) = match (attrs, r.peer_req) {
                    (Some(x), _) => (x.transport, x.remote_qpn, x.rq_psn, x.path_mtu, x.max_dest_rd_atomic),
                    (None, Some(p)) => (p.transport, p.remote_qpn, p.rq_psn, p.path_mtu, p.resp_res),
                    (None, None) => return fail(libc::EINVAL, "no connection parameters yet (RTR needs the REQ or REP)"),
                };
                a.dest_qp_num = dqpn.value();
                a.rq_psn = rq_psn.value();
                a.path_mtu = u32::from(mtu);
                let peer = r.peer_gid.unwrap_or_else(|| port.cfg.wire_gid(sock_ip(&r.dst)));
                a.ah_attr = self.ah_to(pi, sock_ip(&r.src), peer, r.tos);
                let mut m = mask::STATE | mask::AV | mask::PATH_MTU | mask::DEST_QPN | mask::RQ_PSN;
                if transport == Transport::Rc {
                    a.max_dest_rd_atomic = resp;
                    a.min_rnr_timer = MIN_RNR_TIMER;
                    m |= mask::MAX_DEST_RD_ATOMIC | mask::MIN_RNR_TIMER;
                }
                m
            }
            3 if ud => {
                a.sq_psn = 0;
                mask::STATE | mask::SQ_PSN
            }
            3 => {
                let (transport, timeout, retry, rnr, init) = match (attrs, r.peer_req) {
                    (Some(x), _) => (x.transport, x.timeout, x.retry_cnt, x.rnr_retry, x.max_rd_atomic),
                    (None, Some(p)) => (p.transport, p.timeout, p.retry_cnt, p.rnr_retry, p.init_depth),
                    (None, None) => return fail(libc::EINVAL, "no connection parameters yet (RTS needs the REQ or REP)"),
                };
                a.sq_psn = r.psn.value();
                let mut m = mask::STATE | mask::SQ_PSN;
                if transport == Transport::Rc {
                    a.timeout = r.ack_timeout.unwrap_or(timeout);
                    a.retry_cnt = retry;
                    a.rnr_retry = rnr;
                    a.max_rd_atomic = init;
                    m |= mask::TIMEOUT | mask::RETRY_CNT | mask::RNR_RETRY | mask::MAX_QP_RD_ATOMIC;
                }
                m
            }
            _ => return fail(libc::EINVAL, "rdma_init_qp_attr: only INIT, RTR and RTS"),
        };
        (Response::CmQpAttr { attr: a, mask }, None)
    }
}
