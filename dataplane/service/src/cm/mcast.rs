//! `rdma_join_multicast` / `rdma_leave_multicast` on RoCEv2, as the kernel CMA does it for an
//! IPv4 group (`cma_iboe_join_multicast`): no subnet manager to ask; the group's GID is its
//! IPv4-mapped address, the Q_Key the port space's, the QPN 0xFFFFFF, and the join completes at
//! once with MULTICAST_JOIN. The client attaches the id's QP when it reads the event (as
//! librdmacm's `ucma_process_join` does), which makes the port announce the group (IGMP).
//! IPv6 groups are refused with EOPNOTSUPP, as the kernel refuses them on RoCEv2 GIDs.

use super::*;

/// Groups one id may join.
const MAX_JOINS_PER_ID: usize = 64;

impl CmCore {
    pub(super) fn join_multicast(&mut self, client: u32, id: u32, addr: CmSockAddr) -> Reply {
        let r = match self.own(client, id) {
            Ok(r) => r,
            Err(e) => return fail(e.0, e.1),
        };
        let Some(pi) = r.device else { return fail(libc::EINVAL, "bind or resolve the rdma_cm id to a device first") };
        if !r.is_ud() {
            return fail(libc::EINVAL, "multicast needs a UD rdma_cm id (RDMA_PS_UDP or RDMA_PS_IPOIB)");
        }
        let group = match sock_ip(&addr) {
            IpAddr::V4(g) if g.is_multicast() => g,
            IpAddr::V6(g) if g.to_ipv4_mapped().is_some_and(|m| m.is_multicast()) => g.to_ipv4_mapped().expect("checked"),
            IpAddr::V6(g) if g.is_multicast() => return fail(libc::EOPNOTSUPP, "IPv6 multicast over RoCEv2 is not supported (as in the kernel)"),
            _ => return fail(libc::EINVAL, "not a multicast address"),
        };
        let src = sock_ip(&r.src);
        // The group is joined from the id's IPv4 address, or the device's for a wildcard bind.
        let from = match self.ports[pi].cfg.addr_like(IpAddr::V4(group)) {
            _ if src.is_ipv4() => src,
            Some(a) if src.is_unspecified() => a,
            _ => return fail(libc::EINVAL, "the id has no IPv4 address to join an IPv4 group from"),
        };
        let addr = sock_addr(IpAddr::V4(group), addr.port);
        if r.joins.iter().any(|j| j.ip == addr.ip) {
            return fail(libc::EADDRINUSE, "the id already joined this group");
        }
        if r.joins.len() >= MAX_JOINS_PER_ID {
            return fail(libc::ENOMEM, "too many groups joined by one rdma_cm id");
        }
        let mut ah_attr = self.ah_to(pi, from, Gid::from_ip(IpAddr::V4(group)), r.tos);
        ah_attr.hop_limit = 64;
        let ud = CmUdParam { private_data: vec![], ah_attr, qp_num: pmrxe_abi::MULTICAST_QPN, qkey: cma::UDP_QKEY };
        self.ids.get_mut(&id).expect("owned").joins.push(addr);
        let Some((ch, mut m)) = self.event_msg(id, event::MULTICAST_JOIN, 0) else { return ok() };
        // The event names the group it is for (an id may join several).
        m.dst = addr;
        m.ud = Some(ud);
        self.deliver(ch, &m);
        ok()
    }

    pub(super) fn leave_multicast(&mut self, client: u32, id: u32, addr: CmSockAddr) -> Reply {
        if let Err(e) = self.own(client, id) {
            return fail(e.0, e.1);
        }
        let ip = match sock_ip(&addr) {
            IpAddr::V6(g) => g.to_ipv4_mapped().map_or(g.octets(), |m| m.to_ipv6_mapped().octets()),
            IpAddr::V4(g) => g.to_ipv6_mapped().octets(),
        };
        let r = self.ids.get_mut(&id).expect("owned");
        match r.joins.iter().position(|j| j.ip == ip) {
            Some(i) => {
                r.joins.remove(i);
                ok()
            }
            None => fail(libc::EADDRNOTAVAIL, "the id did not join this group"),
        }
    }
}
