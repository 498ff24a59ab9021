//! Transmit: timers, then the engine serves its ready list (`Engine::transmit`: fairness and
//! path gating) into the ports through [`LcorePorts`], the engine's `TxPort`: each packet
//! straight into a port buffer, Eth/IP/UDP from the QP's path cache, the ICRC from the
//! transport's tail CRC or over a short frame once its burst is built; QP1 MADs from the
//! connection manager; `tx_burst`.
use std::net::IpAddr;

use pmrxe_port::{ArrayVec, PacketBuf, Port};
use pmrxe_transport::{AddressVector, Instant, Transmit, TxPort};
use pmrxe_wire::{self as wire, MacAddr};

use super::ports::PortSlot;
use super::{Lcore, PathCache, QpSlot, Tap, BURST};
use crate::neigh::{gid_to_ip, Neighbors};
use crate::stats::{bump, LcoreStats};

impl<L: Port> Lcore<L> {
    pub(super) fn timers(&mut self, now: Instant) -> bool {
        let mut cq = self.cq.writer(&self.stats);
        self.engine.handle_timeout(now, &*self.mem, &mut cq)
    }

    /// Serve the engine's ready list (`Engine::transmit`: fairness and path gating are the
    /// engine's): each ready QP sends up to a burst into its port's buffers through
    /// [`LcorePorts`] (transport headers + payload straight into the buffer, then Eth/IP/UDP
    /// from the QP's path cache and the ICRC).
    /// MADs the connection manager wants sent from QP1 of one of our ports (the QP1 stage).
    #[inline]
    pub(super) fn gsi_transmit(&mut self, now: Instant) -> bool {
        if !self.qp1.has_work(self.index) {
            return false;
        }
        let (any, unresolved) = self.qp1.transmit(self.index, &mut self.ports, &self.neigh, &self.stats, self.tap.as_deref(), now);
        if let Some((pi, ip)) = unresolved {
            self.solicit(pi, ip, now);
        }
        any
    }

    pub(super) fn transmit(&mut self, now: Instant) -> bool {
        let mut any = self.drain_srqs();
        any |= self.drain_backlog(now);
        let mut cq = self.cq.writer(&self.stats);
        let mut ports = LcorePorts { ports: &mut self.ports.slots, neigh: &self.neigh, stats: &self.stats, tap: self.tap.as_deref(), unresolved: None, burst: Burst::default() };
        any |= self.engine.transmit(now, &*self.mem, &mut ports, &mut cq, BURST);
        if let Some((pi, ip)) = ports.unresolved {
            self.solicit(pi, ip, now);
        }
        any
    }
}

/// The longest Eth/IP/UDP header a packet is given (IPv6).
const MAX_OUTER_LEN: usize = wire::eth::HEADER_LEN + wire::ipv6::HEADER_LEN + wire::udp::HEADER_LEN;

/// The lcore's ports as the engine's transmit sees them (`TxPort`): DPDK buffers, the
/// neighbour table, each QP's path cache in its slot.
struct LcorePorts<'a, L: Port> {
    ports: &'a mut [PortSlot<L>],
    neigh: &'a Neighbors,
    stats: &'a LcoreStats,
    tap: Option<&'a dyn Tap>,
    /// A next hop to solicit after the pass (port index, address).
    unresolved: Option<(usize, IpAddr)>,
    /// The current QP's burst.
    burst: Burst,
}

/// The state of one QP's burst.
#[derive(Default)]
struct Burst {
    /// Frames of this burst to seal (short packets: ICRC over the finished frame) and show
    /// the capture tap, once the burst is built, and multicast frames to loop back to the
    /// port's own group members: (loopback, index, header length, seal, multicast).
    built: ArrayVec<(bool, u16, u8, bool, bool), BURST>,
    /// The QP's cached path was checked for its connected path in this burst: later packets
    /// on that path use it as it is (nothing the check reads — the QP's attributes, the
    /// neighbour table — changes inside a burst).
    connected_checked: bool,
    /// A capture is running (read once per burst).
    tap: bool,
    /// The burst has started (the tap flag is read).
    started: bool,
}

impl<L: Port> TxPort<QpSlot> for LcorePorts<'_, L> {
    type Frame = L::Buf;

    #[inline]
    fn has_room(&self, s: &QpSlot) -> bool {
        let port = &self.ports[s.dev];
        port.tx.len() < port.tx.capacity() && port.lo.len() < port.lo.capacity()
    }

    fn neigh_generation(&self) -> u64 {
        self.neigh.generation()
    }

    #[inline]
    fn resolve(&mut self, s: &mut QpSlot, av: &AddressVector, src_qpn: u32, dest_qpn: u32, now: Instant) -> bool {
        path_for(&mut s.path, &self.ports[s.dev], self.neigh, av, src_qpn, dest_qpn, now).is_some()
    }

    fn held(&mut self, s: &QpSlot, av: &AddressVector) {
        bump(&self.stats.tx_neigh_hold, 1);
        self.unresolved = Some((s.dev, gid_to_ip(&av.dgid)));
    }

    #[inline]
    fn frame(&mut self, s: &mut QpSlot) -> Option<L::Buf> {
        if !self.burst.started {
            self.burst.started = true;
            self.burst.tap = self.tap.is_some_and(|t| t.active());
        }
        let Some(mut b) = self.ports[s.dev].alloc() else {
            bump(&self.stats.tx_alloc_failures, 1);
            return None;
        };
        // The payload of a packet with a bare BTH (the MIDDLE and LAST packets of a long
        // message: the bulk of its bytes) starts on a cache line, so its copy stores whole
        // lines (the kernel's 4 KiB copy runs 10 % faster into aligned destinations than at
        // DPDK's default offset, 128 + 12), and a looped-back frame is read aligned too. The
        // headroom keeps room for the Eth/IPv6/UDP headers prepended in `emit`.
        b.open_aligned(wire::bth::HEADER_LEN, MAX_OUTER_LEN)?;
        Some(b)
    }

    #[inline]
    fn room(b: &mut L::Buf) -> &mut [u8] {
        // Transport headers + payload go at the start of the data room; Eth/IP/UDP are
        // prepended into the headroom afterwards, so the payload is written once.
        let buf = b.data_mut();
        let room = buf.len().saturating_sub(wire::ICRC_LEN);
        &mut buf[..room]
    }

    #[inline]
    fn emit(&mut self, s: &mut QpSlot, mut b: L::Buf, t: &Transmit, av: &AddressVector, now: Instant) {
        let stats = self.stats;
        if b.data()[0] == wire::cnp::OPCODE.0 {
            bump(&stats.tx_cnp, 1);
        }
        let port = &mut self.ports[s.dev];
        let connected = t.av.is_none();
        let cached = if connected && self.burst.connected_checked { s.path.as_mut() } else { path_for(&mut s.path, port, self.neigh, av, t.src_qpn, t.dest_qpn, now) };
        let Some(path) = cached else {
            bump(&stats.tx_no_neighbor, 1);
            self.unresolved = Some((s.dev, gid_to_ip(&av.dgid)));
            self.burst.connected_checked = false;
            return; // the engine's retransmission recovers once ARP/ND resolves
        };
        self.burst.connected_checked = connected;
        let (local, mcast) = (path.local, path.mcast);
        let Some(header) = path.header(t.len) else {
            bump(&stats.tx_build_errors, 1);
            return;
        };
        if b.resize(t.len + wire::ICRC_LEN).is_none() {
            return;
        }
        if b.prepend(header.header_len()).is_none() {
            bump(&stats.tx_alloc_failures, 1);
            return;
        }
        if header.finish(b.data_mut(), t.tail_crc).is_err() {
            bump(&stats.tx_build_errors, 1);
            return;
        }
        let seal = t.tail_crc.is_none();
        let mcast = mcast && !port.groups.is_empty();
        if seal || self.burst.tap || mcast {
            let at = if local { port.lo.len() } else { port.tx.len() };
            self.burst.built.push((local, at as u16, header.header_len() as u8, seal, mcast));
        }
        if local {
            port.lo.push(b);
        } else {
            port.tx.push(b);
        }
    }

    #[inline]
    fn give_back(&mut self, s: &mut QpSlot, b: L::Buf) {
        self.ports[s.dev].give_back(b);
    }

    /// The short frames' ICRCs, hashed now that the burst's header and payload stores have
    /// settled (hashed right after them, the CRC's first loads waited on store forwarding: a
    /// stall per packet); then the capture tap.
    fn end_burst(&mut self, s: &mut QpSlot, qpn: u32) {
        let port = &mut self.ports[s.dev];
        for &(local, at, hl, seal, mcast) in &self.burst.built {
            let b = if local { &mut port.lo[usize::from(at)] } else { &mut port.tx[usize::from(at)] };
            if seal && wire::seal_frame(b.data_mut(), usize::from(hl)).is_err() {
                bump(&self.stats.tx_build_errors, 1);
            }
            if self.burst.tap {
                if let Some(t) = self.tap {
                    t.frame(true, Some(qpn), b.data());
                }
            }
            if mcast {
                super::mcast::loop_back_multicast(port, usize::from(at), self.stats);
            }
        }
        self.burst.built.clear();
        self.burst.connected_checked = false;
        self.burst.started = false;
    }
}

/// The Eth/IP/UDP addressing of a packet on `av` to `dest_qpn` from `src_qpn`, from the QP's
/// cache when nothing it depends on changed; `None` while the next hop's MAC is unknown.
#[allow(clippy::too_many_arguments)]
fn path_for<'a, L: Port>(cache: &'a mut Option<PathCache>, port: &PortSlot<L>, neigh: &Neighbors, av: &AddressVector, src_qpn: u32, dest_qpn: u32, now: Instant) -> Option<&'a mut PathCache> {
    let gen = neigh.generation();
    let hit = cache.as_ref().is_some_and(|c| c.neigh_gen == gen && c.dest_qpn == dest_qpn && c.av == *av);
    if !hit {
        let dst_ip = gid_to_ip(&av.dgid);
        let src_ip = port.ips.get(av.sgid_index as usize).copied().unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        // A multicast group's datagrams go to its group MAC (and, through the burst's end, to
        // the port's own members); nothing is resolved.
        let group = wire::mcast::group_mac(&av.dgid);
        let local = group.is_none() && port.owns_ip(dst_ip);
        let dmac = match group {
            Some(m) => Some(m.0),
            None if local => Some(port.dev.mac),
            None => av.dmac.or_else(|| neigh.lookup(dst_ip, now.0)),
        }?;
        let l3 = wire::L3Info {
            src_mac: MacAddr(port.dev.mac),
            dst_mac: MacAddr(dmac),
            src_ip,
            dst_ip,
            // RoCEv2 over an ECN fabric: ECT(0), the DSCP from the GRH traffic class.
            tclass: if port.dev.ecn { wire::ecn::with_ecn(av.traffic_class, wire::ecn::ECT0) } else { av.traffic_class },
            ttl: if av.hop_limit == 0 { 64 } else { av.hop_limit },
            flow_label: av.flow_label,
            udp_sport: wire::udp_sport(av.flow_label, src_qpn, dest_qpn),
            ip_id: 0,
        };
        *cache = Some(PathCache { av: *av, dest_qpn, neigh_gen: gen, l3, local, mcast: group.is_some(), headers: [None; 2], next_header: 0 });
    }
    cache.as_mut()
}
