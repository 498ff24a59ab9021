//! A deterministic simulated wire for CM tests (the transport's `sim.rs`, quinn's `Pair`):
//! nodes (a [`Cm`] each) joined by a link with latency, a virtual clock, a seeded RNG that
//! drops, duplicates and delays (reorders) MADs by rate, and filters that hit specific MADs.
//!
//! MADs cross as real RoCEv2 frames: [`gsi::build_mad_frame`] on the way out,
//! [`gsi::parse_mad_frame`] (ICRC verified) on the way in, so every message exercises the
//! wire format. Frames can be captured for a pcap.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};

use pmrxe_wire::{MacAddr, Psn};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::gsi::{build_mad_frame, parse_mad_frame};
use crate::timers::Instant;
use crate::types::{Event, Gid, RoutePath};
use crate::{Cm, CmConfig};

/// What happens to one MAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Deliver after the link latency.
    Pass,
    /// Discard.
    Drop,
    /// Deliver this many extra nanoseconds late (reordering).
    Delay(u64),
    /// Deliver twice.
    Duplicate,
}

/// A MAD as filters and the trace see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadInfo {
    /// Send time.
    pub time: Instant,
    /// Sending node.
    pub from: usize,
    /// Receiving node (`usize::MAX`: nobody owns the destination GID).
    pub to: usize,
    /// CM attribute ID.
    pub attr_id: u16,
    /// What the link did.
    pub fault: Fault,
}

/// Random impairments (rates in 0..=1).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Impairments {
    /// Loss rate.
    pub drop: f64,
    /// Duplication rate.
    pub duplicate: f64,
    /// Rate of MADs delayed by up to `reorder_ns`.
    pub reorder: f64,
    /// Max extra delay.
    pub reorder_ns: u64,
}

type Filter = Box<dyn FnMut(&MadInfo) -> Option<Fault>>;
/// (delivery time, sequence number, destination node, frame), earliest first.
type InFlight = BinaryHeap<Reverse<(Instant, u64, usize, Vec<u8>)>>;

/// One host.
#[derive(Debug)]
pub struct Node {
    /// Its connection manager.
    pub cm: Cm,
    /// Its IPv4 address (GID: IPv4-mapped).
    pub ip: Ipv4Addr,
    /// Events collected by `step`, in order.
    pub events: VecDeque<Event>,
    /// Frames or MADs the receive path refused.
    pub rx_errors: u64,
}

impl Node {
    /// The node's GID.
    pub fn gid(&self) -> Gid {
        Gid::from_ip(IpAddr::V4(self.ip))
    }
    /// Remove and return the collected events.
    pub fn take_events(&mut self) -> Vec<Event> {
        self.events.drain(..).collect()
    }
}

/// The simulated network.
pub struct Sim {
    /// Virtual time.
    pub now: Instant,
    /// One-way latency.
    pub latency_ns: u64,
    /// Hosts.
    pub nodes: Vec<Node>,
    /// Random impairments.
    pub impair: Impairments,
    /// Every MAD sent (when `record`).
    pub trace: Vec<MadInfo>,
    /// Record the trace.
    pub record: bool,
    /// Keep every frame sent, with its send time (for pcaps).
    pub capture: Option<Vec<(Instant, Vec<u8>)>>,
    rng: SmallRng,
    filters: Vec<Filter>,
    in_flight: InFlight,
    seq: u64,
    psn: u32,
}

impl core::fmt::Debug for Sim {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sim").field("now", &self.now).field("nodes", &self.nodes.len()).field("in_flight", &self.in_flight.len()).finish()
    }
}

/// `drive` did not reach quiescence within its step bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Livelock;

impl Sim {
    /// `n` nodes 10.0.0.1.. with `cfg` (each gets its own CA GUID and seed), a seeded RNG,
    /// 2 µs latency.
    pub fn new(n: usize, seed: u64, cfg: CmConfig) -> Sim {
        let nodes = (0..n)
            .map(|i| Node {
                cm: Cm::new(CmConfig { ca_guid: 0x0200_00ff_fe00_0000 | (i as u64 + 1), seed: seed ^ ((i as u64 + 1) * 0x9E37_79B9), ..cfg }),
                ip: Ipv4Addr::new(10, 0, 0, i as u8 + 1),
                events: VecDeque::new(),
                rx_errors: 0,
            })
            .collect();
        Sim {
            now: Instant(0),
            latency_ns: 2_000,
            nodes,
            impair: Impairments::default(),
            trace: Vec::new(),
            record: true,
            capture: None,
            rng: SmallRng::seed_from_u64(seed),
            filters: Vec::new(),
            in_flight: BinaryHeap::new(),
            seq: 0,
            psn: 0,
        }
    }

    /// The RoCEv2 route from node `a` to node `b` (CMA defaults, shortened timers are up to
    /// the test).
    pub fn route(&self, a: usize, b: usize) -> RoutePath {
        RoutePath::between(IpAddr::V4(self.nodes[a].ip), IpAddr::V4(self.nodes[b].ip))
    }

    /// Add a filter; the first returning `Some` decides a MAD's fate before the random
    /// impairments. Filters keep their own state ("only the first REP").
    pub fn add_filter(&mut self, f: impl FnMut(&MadInfo) -> Option<Fault> + 'static) {
        self.filters.push(Box::new(f));
    }
    /// Remove all filters.
    pub fn clear_filters(&mut self) {
        self.filters.clear();
    }

    fn node_of(&self, gid: Gid) -> Option<usize> {
        self.nodes.iter().position(|n| n.gid() == gid)
    }

    fn transmit(&mut self, i: usize) {
        while let Some(t) = self.nodes[i].cm.poll_transmit() {
            let dst = self.node_of(t.path.dgid);
            self.psn = self.psn.wrapping_add(1);
            let frame = build_mad_frame(
                &t.path,
                MacAddr([2, 0, 0, 0, 0, i as u8]),
                MacAddr([2, 0, 0, 0, 0, dst.unwrap_or(255) as u8]),
                Psn::new(self.psn),
                &t.mad,
            )
            .expect("a CM MAD always fits a frame");
            if let Some(c) = &mut self.capture {
                c.push((self.now, frame.clone()));
            }
            let mut info = MadInfo {
                time: self.now,
                from: i,
                to: dst.unwrap_or(usize::MAX),
                attr_id: u16::from_be_bytes([t.mad[16], t.mad[17]]),
                fault: Fault::Pass,
            };
            let fault = self.filters.iter_mut().find_map(|f| f(&info)).unwrap_or_else(|| {
                let im = self.impair;
                let r: f64 = self.rng.gen();
                if r < im.drop {
                    Fault::Drop
                } else if r < im.drop + im.duplicate {
                    Fault::Duplicate
                } else if r < im.drop + im.duplicate + im.reorder && im.reorder_ns > 0 {
                    Fault::Delay(self.rng.gen_range(1..=im.reorder_ns))
                } else {
                    Fault::Pass
                }
            });
            info.fault = fault;
            if self.record {
                self.trace.push(info);
            }
            let Some(dst) = dst else { continue };
            let at = self.now.add_ns(self.latency_ns);
            match fault {
                Fault::Pass => self.enqueue(at, dst, frame),
                Fault::Drop => {}
                Fault::Delay(d) => self.enqueue(at.add_ns(d), dst, frame),
                Fault::Duplicate => {
                    self.enqueue(at, dst, frame.clone());
                    self.enqueue(at.add_ns(1), dst, frame);
                }
            }
        }
    }

    fn enqueue(&mut self, at: Instant, dst: usize, frame: Vec<u8>) {
        self.seq += 1;
        self.in_flight.push(Reverse((at, self.seq, dst, frame)));
    }

    fn collect(&mut self) {
        for n in &mut self.nodes {
            while let Some(e) = n.cm.poll_event() {
                n.events.push_back(e);
            }
        }
    }

    fn deliver(&mut self, dst: usize, frame: &[u8]) {
        let now = self.now;
        let node = &mut self.nodes[dst];
        match parse_mad_frame(frame) {
            Ok((src, mad)) => {
                if node.cm.handle_mad(now, &src, mad).is_err() {
                    node.rx_errors += 1;
                }
            }
            Err(_) => node.rx_errors += 1,
        }
    }

    /// Flush what the consumers' commands queued (call after commands on `nodes[i].cm`).
    pub fn flush(&mut self) {
        for i in 0..self.nodes.len() {
            self.transmit(i);
        }
        self.collect();
    }

    /// One step: transmit everything queued, advance the clock to the next delivery or
    /// deadline, deliver/expire what is due. `false` when nothing is left to do.
    pub fn step(&mut self) -> bool {
        self.flush();
        let next_pkt = self.in_flight.peek().map(|Reverse((t, ..))| *t);
        let next_timer = self.nodes.iter().filter_map(|n| n.cm.poll_timeout()).min();
        let Some(next) = [next_pkt, next_timer].into_iter().flatten().min() else { return false };
        if next > self.now {
            self.now = next;
        }
        while let Some(Reverse((t, ..))) = self.in_flight.peek() {
            if *t > self.now {
                break;
            }
            let Reverse((_, _, dst, frame)) = self.in_flight.pop().expect("peeked");
            self.deliver(dst, &frame);
        }
        let now = self.now;
        for n in &mut self.nodes {
            n.cm.handle_timeout(now);
        }
        self.flush();
        true
    }

    /// Run until quiescent, at most `max_steps` steps.
    pub fn drive(&mut self, max_steps: usize) -> Result<usize, Livelock> {
        for i in 0..max_steps {
            if !self.step() {
                return Ok(i);
            }
        }
        Err(Livelock)
    }

    /// Run until `cond` holds (checked before every step) or quiescence, at most
    /// `max_steps` steps; returns whether `cond` held.
    pub fn drive_until(&mut self, max_steps: usize, mut cond: impl FnMut(&mut Sim) -> bool) -> bool {
        self.flush();
        for _ in 0..max_steps {
            if cond(self) {
                return true;
            }
            if !self.step() {
                return cond(self);
            }
        }
        cond(self)
    }
}
