//! Neighbours: ARP and IPv6 neighbour discovery on each port (answer for our addresses, learn
//! only addresses a QP needs, solicit unresolved next hops).
use std::net::IpAddr;

use pmrxe_port::{PacketBuf, Port};
use pmrxe_transport::Instant;
use pmrxe_wire::{self as wire, MacAddr};

use super::Lcore;
use crate::stats::bump;

impl<L: Port> Lcore<L> {
    pub(super) fn on_arp(&mut self, pi: usize, data: &[u8], now: Instant) {
        let Ok((_, a)) = wire::arp::parse_arp_frame(data) else {
            bump(&self.stats.rx_malformed, 1);
            return;
        };
        let (src, for_us) = (IpAddr::V4(a.source_ip), self.ports[pi].owns_ip(IpAddr::V4(a.target_ip)));
        if a.operation == wire::ArpOp::Request && for_us {
            // A peer resolving our address is about to talk to us (as Linux, learn it).
            self.neigh.learn(src, a.source_mac.0, now.0);
        } else {
            // A reply (or a request for someone else, gratuitous ARP): only for addresses we
            // asked about or already know.
            self.neigh.answer(src, a.source_mac.0, now.0);
        }
        let port = &self.ports[pi];
        if a.operation != wire::ArpOp::Request || !for_us {
            return;
        }
        let mac = MacAddr(port.dev.mac);
        let reply = wire::ArpRepr {
            operation: wire::ArpOp::Reply,
            source_mac: mac,
            source_ip: a.target_ip,
            target_mac: a.source_mac,
            target_ip: a.source_ip,
        };
        self.emit_control(pi, |buf| wire::arp::emit_arp_frame(buf, mac, &reply).ok());
        bump(&self.stats.arp_replies, 1);
    }

    pub(super) fn on_nd(&mut self, pi: usize, data: &[u8], now: Instant) {
        let Ok(f) = wire::parse_nd_frame(data) else {
            bump(&self.stats.rx_not_for_us, 1);
            return;
        };
        match f.nd {
            wire::NdRepr::Solicit { target, src_lladdr } => {
                let for_us = self.ports[pi].owns_ip(IpAddr::V6(target));
                if let Some(mac) = src_lladdr.filter(|_| for_us) {
                    self.neigh.learn(IpAddr::V6(f.src_ip), mac.0, now.0);
                }
                let port = &self.ports[pi];
                if !port.owns_ip(IpAddr::V6(target)) || f.src_ip.is_unspecified() {
                    return;
                }
                let adv = wire::NdRepr::Advert { router: false, solicited: true, override_: true, target, target_lladdr: Some(MacAddr(port.dev.mac)) };
                let (mac, dst_mac) = (port.dev.mac, src_lladdr.unwrap_or(f.src_mac));
                self.emit_control(pi, |buf| wire::emit_nd_frame(buf, MacAddr(mac), dst_mac, target, f.src_ip, &adv).ok());
                bump(&self.stats.arp_replies, 1);
            }
            wire::NdRepr::Advert { target, target_lladdr, .. } => {
                if let Some(mac) = target_lladdr {
                    self.neigh.answer(IpAddr::V6(target), mac.0, now.0);
                }
            }
        }
    }

    /// Queue a small control frame (ARP/ND) built by `build` into a fresh buffer.
    pub(super) fn emit_control(&mut self, pi: usize, build: impl FnOnce(&mut [u8]) -> Option<usize>) {
        let port = &mut self.ports[pi];
        if port.tx.len() >= port.tx.capacity() {
            return;
        }
        let Some(mut b) = port.alloc() else {
            bump(&self.stats.tx_alloc_failures, 1);
            return;
        };
        let Some(buf) = b.resize(128) else { return };
        buf.fill(0);
        if let Some(n) = build(buf) {
            let _ = b.resize(n.max(60));
            port.tx.push(b);
        }
    }

    /// No MAC for `ip`: ask for it (ARP request or neighbour solicitation), at most once per
    /// 100 µs per lcore so a stream of packets to an unknown peer does not flood the link.
    pub(super) fn solicit(&mut self, pi: usize, ip: IpAddr, now: Instant) {
        self.neigh.want(ip, now.0);
        if now.0 < self.last_solicit.0 + 100_000 && self.last_solicit.0 != 0 {
            return;
        }
        self.last_solicit = now;
        let mac = MacAddr(self.ports[pi].dev.mac);
        let Some(src) = self.ports[pi].ip_like(ip) else { return };
        match (ip, src) {
            (IpAddr::V4(t), IpAddr::V4(src)) => {
                let req = wire::ArpRepr { operation: wire::ArpOp::Request, source_mac: mac, source_ip: src, target_mac: MacAddr([0; 6]), target_ip: t };
                self.emit_control(pi, |buf| wire::arp::emit_arp_frame(buf, mac, &req).ok());
            }
            (IpAddr::V6(t), IpAddr::V6(src)) => {
                let sn = wire::icmpv6::solicited_node(&t);
                let ns = wire::NdRepr::Solicit { target: t, src_lladdr: Some(mac) };
                self.emit_control(pi, |buf| wire::emit_nd_frame(buf, mac, wire::icmpv6::multicast_mac(&sn), src, sn, &ns).ok());
            }
            _ => {}
        }
    }

    // ---- doorbells ----------------------------------------------------------------------
}
