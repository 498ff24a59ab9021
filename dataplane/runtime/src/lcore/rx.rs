//! Receive: `rx_burst` on every port, parse and validate, hand frames for another lcore's QPs
//! over, and dispatch the rest by destination QPN to the owning QP (CNPs to its reaction point,
//! QP1 MADs to the connection manager).
use pmrxe_port::{ArrayVec, PacketBuf, Port};
use pmrxe_transport::{Instant, RxPacket};
use pmrxe_wire as wire;

use super::{Lcore, BURST, RX_BURSTS};
use crate::stats::bump;

impl<L: Port> Lcore<L> {
    pub(super) fn receive(&mut self, now: Instant) -> bool {
        let mut any = false;
        let (mut rx, mut lo) = self.ports.take_scratch();
        for pi in 0..self.ports.slots.len() {
            if !self.ports[pi].lo.is_empty() {
                any = true;
                std::mem::swap(&mut self.ports[pi].lo, &mut lo);
                bump(&self.stats.rx_loopback, lo.len() as u64);
                // Consumed frames go back to the pool a burst at a time, as received ones do.
                let mut spent: ArrayVec<L::Buf, BURST> = ArrayVec::new();
                for buf in lo.drain(..) {
                    match self.on_frame(pi, now, buf.data(), true) {
                        Some(owner) => self.hand_over(owner, pi, buf),
                        None => {
                            if spent.is_full() {
                                <L::Buf as PacketBuf>::free_all(&mut spent);
                            }
                            spent.push(buf);
                        }
                    }
                }
                <L::Buf as PacketBuf>::free_all(&mut spent);
            }
            // Up to RX_BURSTS bursts per port and pass, while they come back full: a pass may
            // queue TX_QUEUE frames per port for transmit, so receiving only one burst let a
            // port's queue grow (on the loopback ring pair, to the whole ring: 1024 frames,
            // 4 MiB of frames gone cold in cache by the time they are read).
            for _ in 0..RX_BURSTS {
                let n = self.ports[pi].link.rx_burst(&mut rx);
                if n == 0 {
                    break;
                }
                any = true;
                bump(&self.stats.rx_packets, n as u64);
                // Frames this lcore consumed go back to the pool in one bulk free per burst.
                let mut spent: ArrayVec<L::Buf, BURST> = ArrayVec::new();
                for buf in rx.drain(..) {
                    let data = buf.data();
                    bump(&self.stats.rx_bytes, data.len() as u64);
                    if let Some(t) = &self.tap {
                        if t.active() {
                            t.frame(false, None, data);
                        }
                    }
                    match self.on_frame(pi, now, data, true) {
                        Some(owner) => self.hand_over(owner, pi, buf),
                        None => spent.push(buf),
                    }
                }
                <L::Buf as PacketBuf>::free_all(&mut spent);
                if n < BURST {
                    break;
                }
            }
        }
        self.ports.put_scratch(rx, lo);
        if self.handoff.is_some() {
            // Handed-over frames go back to the pool a burst at a time too (one put per frame
            // was 64 instructions per handed-over 8 B WRITE).
            let mut spent: ArrayVec<L::Buf, BURST> = ArrayVec::new();
            for _ in 0..BURST * 4 {
                let item = self.handoff.as_ref().and_then(|h| h.inbox[self.index % h.lcores()].pop());
                let Some((pi, buf)) = item else { break };
                any = true;
                bump(&self.stats.handoff_in, 1);
                let _ = self.on_frame(pi, now, buf.data(), false);
                if spent.is_full() {
                    <L::Buf as PacketBuf>::free_all(&mut spent);
                }
                spent.push(buf);
            }
            <L::Buf as PacketBuf>::free_all(&mut spent);
        }
        any
    }

    pub(super) fn hand_over(&mut self, owner: usize, pi: usize, buf: L::Buf) {
        let Some(h) = &self.handoff else { return };
        match h.inbox[owner].push((pi, buf)) {
            Ok(()) => bump(&self.stats.handoff_out, 1),
            // The owner is behind: drop (counted); the transport's retransmission recovers.
            Err(_) => bump(&self.stats.handoff_drops, 1),
        }
    }

    /// Handle one received frame. Returns the lcore to hand it to when its QP lives on another
    /// lcore (only when `may_hand_off`: a frame that was already handed over is not bounced).
    pub(super) fn on_frame(&mut self, pi: usize, now: Instant, data: &[u8], may_hand_off: bool) -> Option<usize> {
        // The ICRC check is deferred: to the owning QP (checked before the packet acts, or while
        // its payload is placed), or made here for frames the lcore itself consumes.
        // The packet is parsed in place: its headers are written once, where the engine reads
        // them.
        // Built from its parts, not copied from `TransportHeaders::BLANK`: LLVM copies a
        // 136-byte constant with a memcpy call, a literal's `None` tags with a few stores.
        let blank = wire::TransportHeaders::new(wire::BthRepr::new(wire::Opcode(0), wire::Qpn::new(0), wire::Psn::new(0)));
        let mut pkt = RxPacket::new(blank, &[]);
        // Route on BTH.dest_qp once the outer headers and lengths are checked: a frame for
        // another lcore's QP is handed over with its transport headers unparsed and its bytes
        // unhashed; the owner parses it and verifies its ICRC, once.
        let handoff = if may_hand_off { self.handoff.as_ref() } else { None };
        let me = self.index;
        let engine = &self.engine;
        let mut to = None;
        // Header prediction first: a MIDDLE packet whose headers equal its QP's last MIDDLE's
        // but for the PSN and AckReq gets what the full parse would have written (the same
        // checks follow).
        let predicted = self.engine.predict(pi as u32, data, &mut pkt);
        let parsed = if predicted.is_some() {
            bump(&self.stats.rx_predicted, 1);
            Ok(true)
        } else {
            wire::parse_frame_routed(data, &mut pkt.hdr, &mut pkt.frame, |qpn| {
                if let Some(h) = handoff {
                    let owner = h.owner(qpn);
                    if owner != me % h.lcores() && qpn != 1 && qpn != pmrxe_abi::MULTICAST_QPN && engine.slot(qpn).is_none() {
                        to = Some(owner);
                        return false;
                    }
                }
                true
            })
        };
        match parsed {
            Ok(false) => to,
            Ok(true) => {
                if u32::from(pkt.hdr.bth.dest_qp) == pmrxe_abi::MULTICAST_QPN && wire::mcast::is_multicast_gid(&pkt.frame.dst_gid) {
                    // The frame stays with this lcore: lcores owning other members get copies.
                    self.on_multicast(pi, now, data, &mut pkt, may_hand_off);
                    return None;
                }
                let f = &pkt.frame;
                if !self.ports[pi].dev.gids.contains(&f.dst_gid) {
                    bump(&self.stats.rx_not_for_us, 1);
                    return None;
                }
                // The P_Key must match the port's only partition, the default one (0xFFFF, or
                // its limited-member form 0x7FFF): SEMANTICS §5.7. (TVer is checked by parse.)
                if pkt.hdr.bth.pkey & 0x7fff != 0x7fff {
                    bump(&self.stats.rx_malformed, 1);
                    return None;
                }
                let qpn: u32 = pkt.hdr.bth.dest_qp.into();
                if qpn == 1 {
                    // QP1 takes only GSI datagrams (UD SEND_ONLY, Q_Key 0x80010000); anything
                    // else for it is a frame for a QP that does not exist.
                    let gsi = pkt.hdr.bth.opcode == wire::Opcode::UD_SEND_ONLY
                        && pkt.hdr.deth.is_some_and(|d| d.qkey == pmrxe_cm::gsi::GSI_QKEY);
                    if !gsi {
                        bump(&self.stats.rx_unknown_qp, 1);
                    } else if !f.check.verify(f.payload) {
                        self.count_bad_icrc();
                    } else {
                        self.qp1.receive(self.ports[pi].dev.index, data, &self.stats);
                    }
                    return None;
                }
                let Some((at, slot)) = predicted.or_else(|| self.engine.slot(qpn)).and_then(|at| Some((at, self.engine.ext_at(at)?))) else {
                    bump(&self.stats.rx_unknown_qp, 1);
                    return None;
                };
                // Learn the sender's MAC only from a valid frame for one of our QPs, and only
                // for an IP we know nothing about: a spoofed RoCE frame cannot redirect an
                // established neighbour (ARP/ND and static entries are authoritative).
                // (Only while the QP has no current path: steady traffic costs one compare.)
                let gen = self.neigh.generation();
                if slot.path.is_none_or(|p| p.neigh_gen != gen) && self.neigh.lookup(f.src_ip(), now.0).is_none() && f.check.verify(f.payload) {
                    self.neigh.learn(f.src_ip(), f.src_mac.0, now.0);
                }
                if slot.dev != pi {
                    bump(&self.stats.rx_unknown_qp, 1);
                    return None;
                }
                if wire::ecn::is_ce(f.tclass) {
                    bump(&self.stats.rx_ecn_ce, 1);
                }
                pkt.deferred = true;
                if pkt.hdr.bth.opcode.info().is_some_and(|i| i.needs_recv_wqe()) {
                    self.pull_recv_wqes(qpn, at);
                }
                let mut cq = self.cq.writer(&self.stats);
                // The QP handles it; a MIDDLE that took the full parse becomes its prediction
                // record (the engine's `receive`).
                if self.engine.receive(now, at, pi as u32, data, &pkt, predicted.is_some(), &*self.mem, &mut cq) {
                    self.count_bad_icrc();
                }
                None
            }
            Err(wire::Error::Arp) => {
                self.on_arp(pi, data, now);
                None
            }
            Err(wire::Error::Icmpv6) => {
                self.on_nd(pi, data, now);
                None
            }
            Err(wire::Error::UnknownOpcode(op)) if op == wire::cnp::OPCODE.0 => self.on_cnp(pi, now, data, may_hand_off),
            Err(e) => {
                if e == wire::Error::BadIcrc {
                    bump(&self.stats.rx_icrc_errors, 1);
                } else if e == wire::Error::NotUdp && self.on_igmp(pi, data) {
                    return None;
                } else if matches!(e, wire::Error::NotIp | wire::Error::NotUdp | wire::Error::NotRoce | wire::Error::Icmpv6) {
                    bump(&self.stats.rx_not_for_us, 1);
                } else {
                    bump(&self.stats.rx_malformed, 1);
                }
                bump(&self.drops.by_reason[e.index()], 1);
                None
            }
        }
    }

    /// A request that consumes a receive WQE arrived for `qpn`: if its receive queue (or SRQ)
    /// has none, take what the client posted to the ring since the last doorbell pass. A
    /// client that posts a receive and then tells its peer to send (udaddy, rping, any
    /// RDMA_CM accept) may have rung its doorbell after this pass read it; the peer's SEND
    /// must still find the WQE, as it would on a NIC that reads the queue on arrival.
    /// `at`: the QP's engine slot.
    pub(super) fn pull_recv_wqes(&mut self, qpn: u32, at: u32) {
        // Looked at read-only first: a QP with receive WQEs at hand (every SEND of a steady
        // stream) costs two loads here, not a re-filing on the engine's lists.
        let Some(qp) = self.engine.qp_at(at) else { return };
        if let Some(n) = qp.srq() {
            if let (Some(srq), Some(x)) = (self.engine.srq_mut(n), self.srqs.get_mut(&n)) {
                if srq.is_empty() {
                    super::doorbells::drain_srq(x, srq, &self.stats, &mut self.posts.scratch.shm_recv);
                }
            }
            return;
        }
        if !qp.recv_queue_empty() {
            return;
        }
        self.posts.pull(&mut self.engine, &mut self.cq, &self.stats, qpn, None);
    }

    /// A RoCEv2 CNP (BTH opcode 0x81): validated whole (layout, ICRC), then the QP it names
    /// cuts its rate (DCQCN reaction point). Returns the owning lcore when the QP lives there.
    pub(super) fn on_cnp(&mut self, pi: usize, now: Instant, data: &[u8], may_hand_off: bool) -> Option<usize> {
        let f = match wire::parse_cnp_frame(data) {
            Ok(f) => f,
            Err(e) => {
                if e == wire::Error::BadIcrc {
                    bump(&self.stats.rx_icrc_errors, 1);
                } else {
                    bump(&self.stats.rx_malformed, 1);
                }
                bump(&self.drops.by_reason[e.index()], 1);
                return None;
            }
        };
        if !self.ports[pi].owns_ip(f.dst_ip) {
            bump(&self.stats.rx_not_for_us, 1);
            return None;
        }
        if f.cnp.pkey & 0x7fff != 0x7fff {
            bump(&self.stats.rx_malformed, 1);
            return None;
        }
        let qpn: u32 = f.cnp.dest_qp.into();
        match self.engine.ext(qpn) {
            Some(slot) if slot.dev == pi => {
                bump(&self.stats.rx_cnp, 1);
                self.engine.handle_cnp(now, qpn);
                None
            }
            None if may_hand_off => match &self.handoff {
                Some(h) if h.owner(qpn) != self.index % h.lcores() => Some(h.owner(qpn)),
                _ => {
                    bump(&self.stats.rx_unknown_qp, 1);
                    None
                }
            },
            _ => {
                bump(&self.stats.rx_unknown_qp, 1);
                None
            }
        }
    }

    /// A frame dropped for a bad ICRC (found here or by the QP it was for).
    pub(super) fn count_bad_icrc(&self) {
        bump(&self.stats.rx_icrc_errors, 1);
        bump(&self.drops.by_reason[wire::Error::BadIcrc.index()], 1);
    }
}
