//! Addresses, ports and routes: which device owns or routes an IP address, the loopback rules of
//! the kernel CMA, address families of listeners, binding (ephemeral ports included) and
//! `rdma_resolve_addr`.

use super::*;

impl CmPort {
    pub(super) fn owns(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|(a, _)| *a == ip)
    }
    pub(super) fn routes(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|&(a, p)| same_subnet(a, ip, p))
    }
    pub(super) fn addr_like(&self, like: IpAddr) -> Option<IpAddr> {
        self.nets.iter().map(|(a, _)| *a).find(|a| a.is_ipv4() == like.is_ipv4())
    }
    pub(super) fn sgid_index(&self, gid: Gid) -> u8 {
        self.gids.iter().position(|x| *x == gid.0).unwrap_or(0) as u8
    }
    /// The GID that stands for `ip` on the wire: `ip`'s own, except for a loopback address,
    /// which (as with the kernel CMA's `cma_bind_loopback`/`cma_resolve_loopback`) is this
    /// device's: the GID of its address of the same family, else GID index 0.
    pub(super) fn wire_gid(&self, ip: IpAddr) -> Gid {
        if !is_loopback(ip) {
            return Gid::from_ip(ip);
        }
        match self.addr_like(ip) {
            Some(a) => Gid::from_ip(a),
            None => Gid(self.gids.first().copied().unwrap_or_default()),
        }
    }
}

/// 127.0.0.0/8, ::1 (and ::ffff:127.0.0.0/104): the kernel CMA's `cma_loopback_addr`.
pub(super) fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v) => v.is_loopback(),
        IpAddr::V6(v) => v.is_loopback() || v.to_ipv4_mapped().is_some_and(|m| m.is_loopback()),
    }
}

/// The source address of an id that resolves loopback `dst` with no source: the loopback
/// interface's address of that family (what a TCP socket to `dst` gets).
pub(super) fn loopback_src(dst: IpAddr) -> IpAddr {
    match dst {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

pub(super) fn same_subnet(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let p = u32::from(prefix.min(32));
            let m = if p == 0 { 0 } else { u32::MAX << (32 - p) };
            u32::from(a) & m == u32::from(b) & m
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let p = u32::from(prefix.min(128));
            let m = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            u128::from(a) & m == u128::from(b) & m
        }
        _ => false,
    }
}

pub(super) fn sock_ip(a: &CmSockAddr) -> IpAddr {
    let v6 = Ipv6Addr::from(a.ip);
    if a.v6 {
        IpAddr::V6(v6)
    } else {
        IpAddr::V4(v6.to_ipv4_mapped().unwrap_or(Ipv4Addr::new(a.ip[12], a.ip[13], a.ip[14], a.ip[15])))
    }
}

pub(super) fn sock_addr(ip: IpAddr, port: u16) -> CmSockAddr {
    match ip {
        IpAddr::V4(v) => CmSockAddr { ip: v.to_ipv6_mapped().octets(), v6: false, port },
        IpAddr::V6(v) => CmSockAddr { ip: v.octets(), v6: true, port },
    }
}

pub(super) fn is_wildcard(a: &CmSockAddr) -> bool {
    sock_ip(a).is_unspecified()
}

/// A listener that takes requests of both families (an IPv6 id that is not AF-only).
pub(super) const FAM_ANY: u8 = 0;

/// Whether a bound id takes only its own address family (`RDMA_OPTION_ID_AFONLY`, else the
/// kernel's default: IPv4 yes, IPv6 no).
pub(super) fn is_afonly(r: &IdRec) -> bool {
    r.afonly.unwrap_or(!r.src.v6)
}

/// Which requests a listener takes: 4, 6 or [`FAM_ANY`]. Only an id that asked for AF-only
/// (`RDMA_OPTION_ID_AFONLY` = 1) is held to its family; any other listener takes both, as
/// pmrxe always did (the kernel would hold an IPv4 listener to IPv4).
pub(super) fn listen_family(r: &IdRec) -> u8 {
    match (r.afonly, r.src.v6) {
        (Some(true), false) => 4,
        (Some(true), true) => 6,
        _ => FAM_ANY,
    }
}

/// The family of a request's address: 4 for IPv4 and IPv4-mapped IPv6, else 6.
pub(super) fn ip_family(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 4,
        IpAddr::V6(v) if v.to_ipv4_mapped().is_some() => 4,
        IpAddr::V6(_) => 6,
    }
}

impl CmCore {
    /// Is (`ps`, `port`) on `device` (None = every device) taken by another id?
    /// Is `port` taken for id `me` binding on `device`? `fam`: the family of the address it
    /// binds and whether it is AF-only; two AF-only ids of different families never clash
    /// (the kernel's `cma_check_port`).
    pub(super) fn port_taken(&self, me: u32, ps: PortSpace, device: Option<usize>, port: u16, fam: Option<(bool, bool)>) -> bool {
        self.ids.iter().any(|(&h, r)| {
            h != me && r.bound && !r.child && r.ps == ps && r.src.port == port && (r.device.is_none() || device.is_none() || r.device == device)
                && !(r.reuseaddr && r.listen_sid.is_none())
                && !fam.is_some_and(|(v6, afonly)| afonly && is_afonly(r) && v6 != r.src.v6)
        })
    }

    pub(super) fn ephemeral(&mut self, me: u32, ps: PortSpace, device: Option<usize>) -> Option<u16> {
        let n = EPHEMERAL.end() - EPHEMERAL.start() + 1;
        for _ in 0..n {
            let p = self.next_port;
            self.next_port = if p >= *EPHEMERAL.end() { *EPHEMERAL.start() } else { p + 1 };
            if !self.port_taken(me, ps, device, p, None) {
                return Some(p);
            }
        }
        None
    }

    /// Bind `id` to `addr` (wildcard = every device; port 0 = ephemeral).
    pub(super) fn bind(&mut self, id: u32, addr: CmSockAddr) -> Result<(), Fail> {
        let Some(r) = self.ids.get(&id) else { return Err((libc::EINVAL, "no such rdma_cm id")) };
        if r.bound {
            return Err((libc::EINVAL, "rdma_cm id already bound"));
        }
        let ps = r.ps;
        let device = if is_wildcard(&addr) {
            None
        } else {
            let ip = sock_ip(&addr);
            match self.ports.iter().position(|p| p.cfg.owns(ip)) {
                Some(p) => Some(p),
                // cma_bind_loopback: the first device; the id keeps the loopback address.
                None if is_loopback(ip) && !self.ports.is_empty() => Some(LOOPBACK_DEVICE),
                None => return Err((libc::EADDRNOTAVAIL, "no pmrxe device has this address")),
            }
        };
        let port = if addr.port == 0 {
            match self.ephemeral(id, ps, device) {
                Some(p) => p,
                None => return Err((libc::EADDRINUSE, "no free port")),
            }
        } else {
            let afonly = self.ids[&id].afonly.unwrap_or(!addr.v6);
            if self.port_taken(id, ps, device, addr.port, Some((addr.v6, afonly))) {
                return Err((libc::EADDRINUSE, "address already in use"));
            }
            addr.port
        };
        let r = self.ids.get_mut(&id).expect("checked above");
        r.device = device;
        r.bound = true;
        r.src = CmSockAddr { port, ..addr };
        Ok(())
    }

    pub(super) fn addr_reply(&self, id: u32) -> Reply {
        let r = &self.ids[&id];
        (Response::CmAddr { addr: r.src, device: r.device.map(|p| self.ports[p].cfg.device) }, None)
    }

    pub(super) fn resolve_addr(&mut self, client: u32, id: u32, src: Option<CmSockAddr>, dst: CmSockAddr) -> Reply {
        let r = match self.own(client, id) {
            Ok(r) => r,
            Err(e) => return fail(e.0, e.1),
        };
        if r.listen_sid.is_some() || r.conn.is_some() {
            return fail(libc::EINVAL, "rdma_cm id is listening or connected");
        }
        if let Some(s) = src {
            if !r.bound {
                if let Err(e) = self.bind(id, s) {
                    return fail(e.0, e.1);
                }
            }
        }
        let r = &self.ids[&id];
        let dip = sock_ip(&dst);
        if dip.is_unspecified() {
            return fail(libc::EADDRNOTAVAIL, "no destination address");
        }
        let chosen = r
            .device
            .or_else(|| self.ports.iter().position(|p| p.cfg.owns(dip)))
            .or_else(|| self.ports.iter().position(|p| p.cfg.routes(dip)))
            // A multicast group is reached through the first device with an address of its
            // family (the kernel's default multicast route); bind the id to choose another.
            .or_else(|| if dip.is_multicast() { self.ports.iter().position(|p| p.cfg.addr_like(dip).is_some()) } else { None })
            .or_else(|| (is_loopback(dip) && !self.ports.is_empty()).then_some(LOOPBACK_DEVICE));
        let Some(pi) = chosen else { return fail(libc::EADDRNOTAVAIL, "no pmrxe device owns or routes to the destination") };
        let sip = if r.bound && !is_wildcard(&r.src) {
            Some(sock_ip(&r.src))
        } else if is_loopback(dip) {
            Some(loopback_src(dip))
        } else {
            self.ports[pi].cfg.addr_like(dip)
        };
        let Some(sip) = sip.filter(|s| s.is_ipv4() == dip.is_ipv4()) else {
            return fail(libc::EADDRNOTAVAIL, "the device has no address of the destination's family");
        };
        let port = if r.bound && r.src.port != 0 {
            r.src.port
        } else {
            match self.ephemeral(id, r.ps, Some(pi)) {
                Some(p) => p,
                None => return fail(libc::EADDRINUSE, "no free port"),
            }
        };
        let r = self.ids.get_mut(&id).expect("owned");
        r.device = Some(pi);
        r.bound = true;
        r.src = sock_addr(sip, port);
        r.dst = dst;
        r.addr_resolved = true;
        self.emit(id, event::ADDR_RESOLVED, 0, None, None);
        self.addr_reply(id)
    }

    pub(super) fn route(&self, r: &IdRec, pi: usize) -> RoutePath {
        let mut path = RoutePath::between(sock_ip(&r.src), sock_ip(&r.dst));
        let cfg = &self.ports[pi].cfg;
        path.sgid = cfg.wire_gid(sock_ip(&r.src));
        path.dgid = cfg.wire_gid(sock_ip(&r.dst));
        path.mtu = self.ports[pi].cfg.active_mtu.clamp(1, 5) as u8;
        path.traffic_class = r.tos;
        if let Some(t) = r.ack_timeout {
            path.local_ack_timeout = t;
        }
        path
    }
}
