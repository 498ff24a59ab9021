//! Listeners: `rdma_listen`, the passive child id made for each REQ/SIDR_REQ, and the backlog
//! of CONNECT_REQUESTs the client has not read.

use super::*;

/// Why no passive id was made for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NoChild {
    /// No listener, or the id tables are full.
    Resources,
    /// The listener's backlog of unread CONNECT_REQUESTs is full.
    Backlog,
}

impl CmCore {
    pub(super) fn listen(&mut self, client: u32, id: u32, backlog: u32) -> Reply {
        let r = match self.own(client, id) {
            Ok(r) => r,
            Err(e) => return fail(e.0, e.1),
        };
        if r.listen_sid.is_some() {
            return ok();
        }
        if r.conn.is_some() || r.child {
            return fail(libc::EINVAL, "rdma_cm id is connected");
        }
        if !r.bound {
            if let Err(e) = self.bind(id, CmSockAddr::default()) {
                return fail(e.0, e.1);
            }
        }
        let r = &self.ids[&id];
        let ps = if r.is_ud() && r.ps != PortSpace::IPOIB { PortSpace::UDP } else { r.ps };
        let sid = cma::service_id(ps, r.src.port);
        let ports: Vec<usize> = match r.device {
            Some(p) => vec![p],
            None => (0..self.ports.len()).collect(),
        };
        let backlog = if backlog == 0 || backlog > MAX_BACKLOG { MAX_BACKLOG } else { backlog };
        let fam = listen_family(r);
        for (k, &pi) in ports.iter().enumerate() {
            // The CM's own bound on requests waiting for an answer is the client's id limit;
            // the listen backlog (unread CONNECT_REQUESTs, as the kernel's ucma) is ours.
            // An AF-only IPv4 and an AF-only IPv6 listener share a port (tgt's iSER portals);
            // the port's CM listens once for both.
            let others: Vec<u8> = [FAM_ANY, 4, 6].into_iter().filter(|&f| self.listeners.contains_key(&(pi, sid, f))).collect();
            let clash = others.iter().any(|&f| f == fam || f == FAM_ANY || fam == FAM_ANY);
            if clash || (others.is_empty() && self.ports[pi].cm.listen(sid, MAX_IDS_PER_CLIENT).is_err()) {
                for &undo in &ports[..k] {
                    self.listeners.remove(&(undo, sid, fam));
                    if ![FAM_ANY, 4, 6].iter().any(|&f| self.listeners.contains_key(&(undo, sid, f))) {
                        let _ = self.ports[undo].cm.unlisten(sid);
                    }
                }
                return fail(libc::EADDRINUSE, "already listening on this port");
            }
            self.listeners.insert((pi, sid, fam), id);
        }
        let r = self.ids.get_mut(&id).expect("owned");
        r.listen_sid = Some(sid);
        r.backlog = backlog;
        ok()
    }

    /// A new passive id for a REQ/SIDR_REQ of connection `cid` on port `pi` to listener `sid`.
    /// Each refusal is counted: `rej_backlog` or `rej_resources`.
    pub(super) fn child_of(&mut self, pi: usize, sid: u64, cid: ConnId, peer: Gid, hdr: Option<cma::Repr>) -> Result<u32, NoChild> {
        let r = self.new_child(pi, sid, cid, peer, hdr);
        if r == Err(NoChild::Resources) {
            self.stats.rej_resources += 1;
        }
        r
    }

    pub(super) fn new_child(&mut self, pi: usize, sid: u64, cid: ConnId, peer: Gid, hdr: Option<cma::Repr>) -> Result<u32, NoChild> {
        let fam = ip_family(hdr.as_ref().map_or(peer.to_ip(), |h| h.dst_ip));
        let &lid = self.listeners.get(&(pi, sid, fam)).or_else(|| self.listeners.get(&(pi, sid, FAM_ANY))).ok_or(NoChild::Resources)?;
        let l = self.ids.get(&lid).ok_or(NoChild::Resources)?;
        if l.pending >= l.backlog {
            // Full as far as we know: collect the client's read-acknowledgements first.
            let ch = l.channel;
            self.read_acks(ch);
        }
        let l = self.ids.get(&lid).ok_or(NoChild::Resources)?;
        if l.pending >= l.backlog {
            self.stats.rej_backlog += 1;
            return Err(NoChild::Backlog);
        }
        let client = l.client;
        if self.ids.len() >= MAX_IDS || self.ids.values().filter(|r| r.client == client).count() >= MAX_IDS_PER_CLIENT {
            return Err(NoChild::Resources);
        }
        let port = l.src.port;
        let (src, dst) = match hdr {
            Some(h) => (sock_addr(h.dst_ip, port), sock_addr(h.src_ip, h.src_port)),
            None => {
                let ours = self.ports[pi].cfg.addr_like(peer.to_ip()).unwrap_or(peer.to_ip());
                (sock_addr(ours, port), sock_addr(peer.to_ip(), 0))
            }
        };
        let rec = IdRec {
            client,
            channel: l.channel,
            context: l.context,
            ps: l.ps,
            qp_type: l.qp_type,
            device: Some(pi),
            bound: true,
            child: true,
            src,
            dst,
            addr_resolved: true,
            route_resolved: true,
            listen_sid: None,
            conn: Some(cid),
            psn: Psn::new(self.rng.gen()),
            tos: l.tos,
            ack_timeout: l.ack_timeout,
            reuseaddr: false,
            afonly: None,
            peer_req: None,
            active: false,
            parent: Some(lid),
            peer_gid: Some(peer),
            backlog: 0,
            pending: 0,
            unread: true,
            joins: Vec::new(),
        };
        let h = self.handle();
        self.ids.insert(h, rec);
        self.by_conn.insert((pi, cid), h);
        if let Some(l) = self.ids.get_mut(&lid) {
            l.pending += 1;
        }
        Ok(h)
    }

    /// The client read the CONNECT_REQUEST of child `id` (or named the id in a request): its
    /// listener's backlog slot is free again.
    pub(super) fn request_read(&mut self, id: u32) {
        let Some(r) = self.ids.get_mut(&id) else { return };
        if !std::mem::take(&mut r.unread) {
            return;
        }
        if let Some(l) = r.parent.and_then(|p| self.ids.get_mut(&p)) {
            l.pending = l.pending.saturating_sub(1);
        }
    }
}
