//! Transmit: timers, then every ready QP builds packets straight into port buffers through
//! its path cache (Eth/IP/UDP; the ICRC from the transport's tail CRC, or over a short
//! frame once its burst is built); QP1 MADs from the connection manager; `tx_burst`.
use super::*;

impl<L: Port> Lcore<L> {
    pub(super) fn timers(&mut self, now: Instant) -> bool {
        let mut cq = CqWriter::new(&mut self.cqs, &mut self.dirty_cqs, &self.stats);
        self.engine.handle_timeout(now, &*self.mem, &mut cq)
    }

    /// Serve the engine's ready list: each ready QP sends up to a burst into its port's
    /// buffers (transport headers + payload straight into the buffer, then Eth/IP/UDP from the
    /// QP's path cache and the ICRC), then goes to the back of the list if it has more. A QP
    /// whose port is full keeps its place at the front for the next pass.
    pub(super) fn transmit(&mut self, now: Instant) -> bool {
        let mut any = self.drain_srqs();
        any |= self.drain_backlog(now);
        self.recheck_neigh_wait(now);
        let mut unresolved: Option<(usize, IpAddr)> = None;
        let mut deferred = core::mem::take(&mut self.deferred);
        let mut cq = CqWriter::new(&mut self.cqs, &mut self.dirty_cqs, &self.stats);
        for _ in 0..self.engine.ready_len() {
            let Some(slot) = self.engine.pop_ready() else { break };
            let Some((qp, s)) = self.engine.entry(slot) else { continue };
            let port = &mut self.ports[s.dev];
            if port.tx.len() >= port.tx.capacity() || port.lo.len() >= port.lo.capacity() {
                deferred.push(slot);
                continue;
            }
            // The next packet's path must be resolved before the QP's send state advances
            // (a UC/UD packet built for an unknown MAC would be lost yet reported sent).
            if let Some((av, dest)) = qp.next_path() {
                if path_for(&mut s.path, port, &self.neigh, av, qp.qpn(), dest, now).is_none() {
                    let held = *s.hold_since.get_or_insert(now);
                    if now.0.saturating_sub(held.0) < NEIGH_HOLD_NS {
                        bump(&self.stats.tx_neigh_hold, 1);
                        unresolved = Some((s.dev, gid_to_ip(&av.dgid)));
                        if self.neigh_wait.len() < self.neigh_wait.capacity() && !self.neigh_wait.contains(&qp.qpn()) {
                            self.neigh_wait.push(qp.qpn());
                        }
                        continue; // off the ready list until the neighbour changes
                    }
                } else {
                    s.hold_since = None;
                }
            }
            let ctx = BurstCtx { mem: &self.mem, neigh: &self.neigh, stats: &self.stats, tap: self.tap.as_deref(), now };
            let (sent, progressed) = send_burst(qp, s, port, &ctx, &mut cq, &mut unresolved);
            any |= sent;
            self.engine.requeue(slot, progressed);
        }
        // Cut off by a full port: first in line next time, in the order they were waiting.
        for &slot in deferred.iter().rev() {
            self.engine.defer(slot);
        }
        deferred.clear();
        self.deferred = deferred;
        if let Some((pi, ip)) = unresolved {
            self.solicit(pi, ip, now);
        }
        any
    }

    /// QPs holding for a neighbour go back on the ready list when the neighbour table changed,
    /// and at least every solicitation interval (to re-ask, or to give up after the hold).
    pub(super) fn recheck_neigh_wait(&mut self, now: Instant) {
        if self.neigh_wait.is_empty() {
            return;
        }
        let gen = self.neigh.generation();
        let (seen_gen, seen_at) = self.neigh_wait_seen;
        if gen == seen_gen && now.0.saturating_sub(seen_at.0) < 100_000 {
            return;
        }
        self.neigh_wait_seen = (gen, now);
        for k in 0..self.neigh_wait.len() {
            self.engine.kick(self.neigh_wait[k]);
        }
        self.neigh_wait.clear();
    }

    /// MADs the connection manager wants sent from QP1 of one of our ports.
    pub(super) fn gsi_transmit(&mut self, now: Instant) -> bool {
        // Every iteration: one load of the queue, no Arc clone (refcount traffic) unless a MAD
        // is waiting.
        let Some(pipe) = self.gsi.as_ref().filter(|p| p.tx.get(self.index).is_some_and(|q| !q.is_empty())).cloned() else {
            return false;
        };
        let Some(q) = pipe.tx.get(self.index) else { return false };
        let mut any = false;
        let mut unresolved: Option<(usize, IpAddr)> = None;
        for _ in 0..BURST {
            let Some(out) = q.pop() else { break };
            any = true;
            let Some(pi) = self.ports.iter().position(|p| p.dev.index == out.device) else {
                bump(&self.stats.cm_drops, 1);
                continue;
            };
            let port = &mut self.ports[pi];
            if port.tx.len() >= port.tx.capacity() || port.lo.len() >= port.lo.capacity() {
                bump(&self.stats.cm_drops, 1);
                continue;
            }
            let dst_ip = out.path.dgid.to_ip();
            let local = port.owns_ip(dst_ip);
            let dmac = if local { Some(port.dev.mac) } else { self.neigh.lookup(dst_ip, now.0) };
            let Some(dmac) = dmac else {
                bump(&self.stats.tx_no_neighbor, 1);
                bump(&self.stats.cm_drops, 1);
                unresolved = Some((pi, dst_ip));
                continue;
            };
            let Some(mut b) = port.alloc() else {
                bump(&self.stats.tx_alloc_failures, 1);
                bump(&self.stats.cm_drops, 1);
                continue;
            };
            let need = pmrxe_cm::gsi::mad_frame_len(dst_ip.is_ipv6());
            let Some(buf) = b.resize(need) else {
                bump(&self.stats.cm_drops, 1);
                continue;
            };
            self.gsi_psn = (self.gsi_psn + 1) & 0xff_ffff;
            let psn = wire::Psn::new(self.gsi_psn);
            match pmrxe_cm::gsi::build_mad_frame_into(buf, &out.path, MacAddr(port.dev.mac), MacAddr(dmac), psn, &out.mad) {
                Ok(n) => {
                    let _ = b.resize(n);
                }
                Err(_) => {
                    bump(&self.stats.tx_build_errors, 1);
                    continue;
                }
            }
            if let Some(tap) = &self.tap {
                if tap.active() {
                    tap.frame(true, Some(1), b.data());
                }
            }
            bump(&self.stats.cm_tx, 1);
            if local {
                port.lo.push(b);
            } else {
                port.tx.push(b);
            }
        }
        if let Some((pi, ip)) = unresolved {
            self.solicit(pi, ip, now);
        }
        any
    }

    pub(super) fn flush_tx(&mut self) -> bool {
        let mut any = false;
        for p in &mut self.ports {
            if p.tx.is_empty() {
                // Nothing new for this port: make sure what earlier bursts left inside the
                // device goes out (af_packet; a no-op elsewhere). Not work: a kernel that keeps
                // refusing is retried on the next pass, after any idle back-off.
                if p.link.kick() {
                    bump(&self.stats.tx_kicks_held, 1);
                }
                continue;
            }
            any = true;
            let bytes: usize = p.tx.iter().map(|b| b.data().len()).sum();
            let want = p.tx.len();
            let sent = p.link.tx_burst(&mut p.tx);
            bump(&self.stats.tx_packets, sent as u64);
            if sent == want {
                bump(&self.stats.tx_bytes, bytes as u64);
            } else {
                bump(&self.stats.tx_backpressure, 1);
                let left: usize = p.tx.iter().map(|b| b.data().len()).sum();
                bump(&self.stats.tx_bytes, (bytes - left) as u64);
            }
        }
        any
    }
}

/// The longest Eth/IP/UDP header a packet is given (IPv6).
const MAX_OUTER_LEN: usize = wire::eth::HEADER_LEN + wire::ipv6::HEADER_LEN + wire::udp::HEADER_LEN;

/// What a QP's transmit burst reads from the lcore besides its QP, slot and port.
struct BurstCtx<'a> {
    mem: &'a Reader,
    neigh: &'a Neighbors,
    stats: &'a LcoreStats,
    tap: Option<&'a dyn Tap>,
    now: Instant,
}

/// Up to a burst of one ready QP's packets into its port's buffers: transport headers and
/// payload straight into each buffer, Eth/IP/UDP from the QP's path cache, the ICRC from the
/// transport's tail CRC or (short frames) over the finished frame once the burst is built.
/// Returns (any packet built, progressed: false when the QP itself had nothing to send).
/// Out of line (one call per QP burst): profiles and `scripts/instructions.sh` see the
/// per-packet work here, apart from the pass that polls.
#[inline(never)]
fn send_burst<L: Port>(qp: &mut Qp, s: &mut QpSlot, port: &mut PortSlot<L>, ctx: &BurstCtx<'_>, cq: &mut CqWriter<'_>, unresolved: &mut Option<(usize, IpAddr)>) -> (bool, bool) {
    let mut built_any = false;
    let mut budget = BURST;
    // Stays true unless the QP itself had nothing to send (then it leaves the ready
    // list until a packet, timer or post re-files it).
    let mut progressed = true;
    // Frames of this burst to seal (short packets: ICRC over the finished frame) and
    // show the capture tap, once the burst is built: (loopback, index, header length).
    let mut built: ArrayVec<(bool, u16, u8, bool), BURST> = ArrayVec::new();
    let tap = ctx.tap.is_some_and(|t| t.active());
    // The QP's cached path was checked for its connected path in this burst: later packets on
    // that path use it as it is (nothing the check reads — the QP's attributes, the neighbour
    // table — changes inside a burst).
    let mut connected_checked = false;
    // Completions (a UC/UD send, a local operation, a failed gather) go straight to the QP's CQs.
    let mut sink = cq.sink(&s.cq);
    while budget > 0 && port.tx.len() < port.tx.capacity() && port.lo.len() < port.lo.capacity() {
        budget -= 1;
        let Some(mut b) = port.alloc() else {
            bump(&ctx.stats.tx_alloc_failures, 1);
            break;
        };
        // The payload of a packet with a bare BTH (the MIDDLE and LAST packets of a long
        // message: the bulk of its bytes) starts on a cache line, so its copy stores whole
        // lines (the kernel's 4 KiB copy runs 10 % faster into aligned destinations than at
        // DPDK's default offset, 128 + 12), and a looped-back frame is read aligned too. The
        // headroom keeps room for the Eth/IPv6/UDP headers prepended below.
        let Some(buf) = b.open_aligned(wire::bth::HEADER_LEN, MAX_OUTER_LEN) else { break };
        let cap = buf.len();
        // Transport headers + payload go at the start of the data room; Eth/IP/UDP are
        // prepended into the headroom afterwards, so the payload is written once.
        let room = cap.saturating_sub(wire::ICRC_LEN);
        // Read in place: moving the returned value out copied it in wide words right
        // after poll_transmit wrote it field by field (a store-forwarding stall, a third
        // of this function's time at 8 B).
        let sent = qp.poll_transmit(ctx.now, ctx.mem, &mut buf[..room], &mut sink);
        let Some(t) = &sent else {
            port.give_back(b);
            progressed = budget + 1 < BURST;
            break;
        };
        built_any = true;
        if buf[0] == wire::cnp::OPCODE.0 {
            bump(&ctx.stats.tx_cnp, 1);
        }
        let connected = t.av.is_none();
        let cached = if connected && connected_checked { s.path.as_mut() } else { path_for(&mut s.path, port, ctx.neigh, qp.transmit_av(t), t.src_qpn, t.dest_qpn, ctx.now) };
        let Some(path) = cached else {
            bump(&ctx.stats.tx_no_neighbor, 1);
            *unresolved = Some((s.dev, gid_to_ip(&qp.transmit_av(t).dgid)));
            connected_checked = false;
            continue; // the engine's retransmission recovers once ARP/ND resolves
        };
        connected_checked = connected;
        let local = path.local;
        let Some(header) = path.header(t.len) else {
            bump(&ctx.stats.tx_build_errors, 1);
            continue;
        };
        if b.resize(t.len + wire::ICRC_LEN).is_none() {
            continue;
        }
        if b.prepend(header.header_len()).is_none() {
            bump(&ctx.stats.tx_alloc_failures, 1);
            continue;
        }
        if header.finish(b.data_mut(), t.tail_crc).is_err() {
            bump(&ctx.stats.tx_build_errors, 1);
            continue;
        }
        let seal = t.tail_crc.is_none();
        if seal || tap {
            let at = if local { port.lo.len() } else { port.tx.len() };
            built.push((local, at as u16, header.header_len() as u8, seal));
        }
        if local {
            port.lo.push(b);
        } else {
            port.tx.push(b);
        }
    }
    // The short frames' ICRCs, hashed now that the burst's header and payload stores
    // have settled (hashed right after them, the CRC's first loads waited on store
    // forwarding: a stall per packet).
    for &(local, at, hl, seal) in &built {
        let b = if local { &mut port.lo[usize::from(at)] } else { &mut port.tx[usize::from(at)] };
        if seal && wire::seal_frame(b.data_mut(), usize::from(hl)).is_err() {
            bump(&ctx.stats.tx_build_errors, 1);
        }
        if tap {
            if let Some(t) = ctx.tap {
                t.frame(true, Some(qp.qpn()), b.data());
            }
        }
    }
    (built_any, progressed)
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
        let local = port.owns_ip(dst_ip);
        let dmac = if local { Some(port.dev.mac) } else { av.dmac.or_else(|| neigh.lookup(dst_ip, now.0)) }?;
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
        *cache = Some(PathCache { av: *av, dest_qpn, neigh_gen: gen, l3, local, headers: [None; 2], next_header: 0 });
    }
    cache.as_mut()
}
