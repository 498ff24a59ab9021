//! A simulated congested fabric (issue 17): host 0 is the receiver, hosts 1..=N send to it
//! through one switch egress port. Every host has a NIC of `link_bps` (one frame at a time,
//! serialization delay); the switch port towards host 0 has a drop-tail buffer of `buffer`
//! bytes, serves at `link_bps`, and marks ECN-capable frames CE by RED on the instantaneous
//! queue (`kmin`/`kmax`/`pmax`, as DCQCN's switches do); every hop adds `prop_ns`. Traffic
//! from host 0 (ACKs, CNPs, READ responses) goes back without queueing.
//!
//! Real frames and real engines, as in [`crate::sim`]: `poll_transmit` output gets Ethernet/
//! IPv4/UDP and the ICRC from `pmrxe_wire`, the switch rewrites the TOS byte (the ICRC masks
//! it; the IPv4 checksum is refilled), and the receiver parses with `parse_frame`, or with
//! `parse_cnp_frame` when that reports opcode 0x81, exactly as the lcore does. Seeded.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};

use pmrxe_wire::{ecn, emit_frame_headers, finish_frame, frame_header_len, parse_cnp_frame, parse_frame, udp_sport, Error, Ipv4Packet, L3Info, MacAddr, ICRC_LEN};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::packet::RxPacket;
use crate::sim::{Node, Outgoing};
use crate::timers::Instant;

/// Fabric parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FabricParams {
    /// Rate of every NIC and of the bottleneck port (b/s).
    pub link_bps: u64,
    /// Propagation delay per hop (host → switch, switch → host), ns.
    pub prop_ns: u64,
    /// RED: no marking below this queue (bytes).
    pub kmin: usize,
    /// RED: mark everything above this queue (bytes).
    pub kmax: usize,
    /// RED: marking probability at `kmax`.
    pub pmax: f64,
    /// Drop-tail buffer of the bottleneck port (bytes).
    pub buffer: usize,
    /// The switch marks CE (else it only drops).
    pub ecn_marking: bool,
    /// Hosts send ECT(0) (the per-port `ecn` setting).
    pub ect: bool,
}

impl Default for FabricParams {
    /// 10 Gb/s, 1 µs per hop, the DCQCN paper's RED (Kmin 5 KB, Kmax 200 KB, Pmax 1 %),
    /// a shallow 200 KB drop-tail buffer (= Kmax; less than two RC windows of 128 × 1 KiB packets, so
    /// that even two unregulated flows overflow it), ECN on.
    fn default() -> Self {
        FabricParams { link_bps: 10_000_000_000, prop_ns: 1_000, kmin: 5_000, kmax: 100_000, pmax: 0.01, buffer: 200_000, ecn_marking: true, ect: true }
    }
}

/// What the switch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames enqueued at the bottleneck.
    pub enqueued: u64,
    /// Frames dropped (buffer full).
    pub drops: u64,
    /// Frames marked CE.
    pub marks: u64,
    /// Highest queue (bytes).
    pub max_queue: usize,
    /// Time of the last drop.
    pub last_drop: Option<Instant>,
}

enum Ev {
    /// A frame reaches the switch.
    AtSwitch(Vec<u8>),
    /// The bottleneck port finished serializing its head frame.
    PortDone,
    /// A frame reaches host `dst`.
    Deliver(usize, Vec<u8>),
}

/// The fabric.
pub struct Fabric {
    /// Virtual time.
    pub now: Instant,
    /// Parameters.
    pub p: FabricParams,
    /// Hosts (0: receiver).
    pub nodes: Vec<Node>,
    /// Bottleneck statistics.
    pub port: PortStats,
    /// Queue samples (bytes, at every enqueue attempt) since [`Fabric::reset_samples`].
    pub queue_samples: Vec<usize>,
    nic_free: Vec<Instant>,
    queue: VecDeque<Vec<u8>>,
    queue_bytes: usize,
    busy: bool,
    events: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    store: Vec<Option<Ev>>,
    free: Vec<usize>,
    seq: u64,
    rng: SmallRng,
    buf: Vec<u8>,
    outgoing: Vec<Outgoing>,
}

impl core::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Fabric").field("now", &self.now).field("port", &self.port).field("queue_bytes", &self.queue_bytes).finish()
    }
}

impl Fabric {
    /// `senders` + 1 hosts (10.0.0.1 is the receiver), seeded.
    pub fn new(senders: usize, p: FabricParams, seed: u64) -> Self {
        let nodes = (0..=senders)
            .map(|i| Node::new(Ipv4Addr::new(10, 0, 0, i as u8 + 1)))
            .collect();
        Fabric {
            now: Instant(0),
            p,
            nodes,
            port: PortStats::default(),
            queue_samples: Vec::new(),
            nic_free: vec![Instant(0); senders + 1],
            queue: VecDeque::new(),
            queue_bytes: 0,
            busy: false,
            events: BinaryHeap::new(),
            store: Vec::new(),
            free: Vec::new(),
            seq: 0,
            rng: SmallRng::seed_from_u64(seed),
            buf: vec![0u8; 10_000],
            outgoing: Vec::new(),
        }
    }

    /// Current bottleneck queue (bytes).
    pub fn queue_bytes(&self) -> usize {
        self.queue_bytes
    }

    /// Forget the queue samples taken so far.
    pub fn reset_samples(&mut self) {
        self.queue_samples.clear();
    }

    fn ser_ns(&self, bytes: usize) -> u64 {
        // + preamble/SFD 8, FCS 4, inter-frame gap 12.
        ((bytes as u64 + 24) * 8 * 1_000_000_000).div_ceil(self.p.link_bps)
    }

    fn schedule(&mut self, at: Instant, ev: Ev) {
        let k = match self.free.pop() {
            Some(k) => {
                self.store[k] = Some(ev);
                k
            }
            None => {
                self.store.push(Some(ev));
                self.store.len() - 1
            }
        };
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, k)));
    }

    /// Let every host whose NIC is free send one frame.
    fn transmit(&mut self) -> bool {
        let mut any = false;
        let hl = frame_header_len(false);
        for i in 0..self.nodes.len() {
            if self.nic_free[i] > self.now {
                continue;
            }
            let now = self.now;
            let mut out = core::mem::take(&mut self.outgoing);
            self.nodes[i].transmit(now, 1, 1, &mut out);
            let Some(Outgoing { t, av, roce }) = out.pop() else {
                self.outgoing = out;
                continue;
            };
            self.outgoing = out;
            self.buf[hl..hl + t.len].copy_from_slice(&roce[..t.len]);
            let node = &mut self.nodes[i];
            node.recycle(roce);
            any = true;
            let node_ip = node.ip;
            let dst = self.nodes.iter().position(|n| n.gid() == av.dgid);
            let dst_ip = Ipv4Addr::from(<[u8; 4]>::try_from(&av.dgid[12..16]).expect("4 bytes"));
            let tclass = if self.p.ect { ecn::with_ecn(av.traffic_class, ecn::ECT0) } else { av.traffic_class };
            let l3 = L3Info {
                src_mac: MacAddr([2, 0, 0, 0, 0, i as u8]),
                dst_mac: MacAddr([2, 0, 0, 0, 0, dst.unwrap_or(255) as u8]),
                src_ip: IpAddr::V4(node_ip),
                dst_ip: IpAddr::V4(dst_ip),
                tclass,
                ttl: 64,
                flow_label: av.flow_label,
                udp_sport: udp_sport(av.flow_label, t.src_qpn, t.dest_qpn),
                ip_id: 0,
            };
            let n = emit_frame_headers(&mut self.buf, &l3, t.len).expect("frame headers");
            let total = n + t.len + ICRC_LEN;
            finish_frame(&mut self.buf[..total]).expect("finish frame");
            let frame = self.buf[..total].to_vec();
            let ser = self.ser_ns(total);
            self.nic_free[i] = now.add_ns(ser);
            let Some(dst) = dst else { continue };
            let at = now.add_ns(ser + self.p.prop_ns);
            if dst == 0 && i != 0 {
                self.schedule(at, Ev::AtSwitch(frame));
            } else {
                self.schedule(at.add_ns(self.p.prop_ns), Ev::Deliver(dst, frame));
            }
        }
        any
    }

    fn at_switch(&mut self, mut frame: Vec<u8>) {
        let q = self.queue_bytes;
        self.queue_samples.push(q);
        if q + frame.len() > self.p.buffer {
            self.port.drops += 1;
            self.port.last_drop = Some(self.now);
            return;
        }
        let tos = frame[15];
        if self.p.ecn_marking && ecn::ecn_of(tos) != ecn::NOT_ECT {
            let mark = if q <= self.p.kmin {
                false
            } else if q >= self.p.kmax {
                true
            } else {
                let prob = (q - self.p.kmin) as f64 / (self.p.kmax - self.p.kmin) as f64 * self.p.pmax;
                self.rng.gen::<f64>() < prob
            };
            if mark {
                let mut ip = Ipv4Packet::new_unchecked(&mut frame[14..34]);
                ip.set_tos(ecn::with_ecn(tos, ecn::CE));
                ip.fill_checksum();
                self.port.marks += 1;
            }
        }
        self.port.enqueued += 1;
        self.queue_bytes += frame.len();
        self.port.max_queue = self.port.max_queue.max(self.queue_bytes);
        self.queue.push_back(frame);
        if !self.busy {
            self.busy = true;
            let ser = self.ser_ns(self.queue[0].len());
            self.schedule(self.now.add_ns(ser), Ev::PortDone);
        }
    }

    fn port_done(&mut self) {
        let Some(f) = self.queue.pop_front() else {
            self.busy = false;
            return;
        };
        self.queue_bytes -= f.len();
        self.schedule(self.now.add_ns(self.p.prop_ns), Ev::Deliver(0, f));
        match self.queue.front() {
            Some(h) => {
                let ser = self.ser_ns(h.len());
                self.schedule(self.now.add_ns(ser), Ev::PortDone);
            }
            None => self.busy = false,
        }
    }

    fn deliver(&mut self, dst: usize, frame: &[u8]) {
        let now = self.now;
        let node = &mut self.nodes[dst];
        match parse_frame(frame) {
            Ok(f) => {
                node.handle_packet(now, &RxPacket::of_frame(&f, None));
            }
            Err(Error::UnknownOpcode(0x81)) => match parse_cnp_frame(frame) {
                Ok(c) => node.engine.handle_cnp(now, c.cnp.dest_qp.value()),
                Err(_) => node.rx_parse_drops += 1,
            },
            Err(_) => node.rx_parse_drops += 1,
        }
    }

    fn collect(&mut self) {
        for n in &mut self.nodes {
            n.collect();
        }
    }

    /// One step: hosts with a free NIC send, then time advances to the next event (frame,
    /// NIC free, timer) and everything due is processed. `false` when nothing is left.
    pub fn step(&mut self) -> bool {
        let more = self.step_inner();
        for n in &mut self.nodes {
            n.end_step();
        }
        more
    }

    fn step_inner(&mut self) -> bool {
        self.transmit();
        self.collect();
        let next_ev = self.events.peek().map(|Reverse((t, ..))| *t);
        let next_timer = self.nodes.iter().filter_map(|n| n.engine.poll_timeout()).min();
        let next_nic = (0..self.nodes.len()).filter(|&i| self.nodes[i].engine.has_ready()).map(|i| self.nic_free[i].max(self.now)).min();
        let Some(next) = [next_ev, next_timer, next_nic].into_iter().flatten().min() else { return false };
        if next > self.now {
            self.now = next;
        }
        while let Some(Reverse((t, _, k))) = self.events.peek().copied() {
            if t > self.now {
                break;
            }
            self.events.pop();
            let ev = self.store[k].take().expect("scheduled event");
            self.free.push(k);
            match ev {
                Ev::AtSwitch(f) => self.at_switch(f),
                Ev::PortDone => self.port_done(),
                Ev::Deliver(dst, f) => self.deliver(dst, &f),
            }
        }
        let now = self.now;
        for n in &mut self.nodes {
            n.handle_timeout(now);
        }
        self.collect();
        true
    }

    /// Run until `t` (or quiescence), at most `max_steps` steps; `false` if the step bound hit.
    pub fn run_until(&mut self, t: Instant, max_steps: usize) -> bool {
        for _ in 0..max_steps {
            if self.now >= t {
                return true;
            }
            if !self.step() {
                self.now = self.now.max(t);
                return true;
            }
        }
        false
    }
}
