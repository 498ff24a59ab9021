//! A deterministic simulated wire for CM tests (quinn's `Pair`): nodes (a [`Cm`] each) joined
//! by the transport simulator's [`Link`] (latency, a seeded RNG that drops, duplicates,
//! corrupts and delays (reorders) MADs by rate, filters that hit specific MADs) and a virtual
//! clock.
//!
//! MADs cross as real RoCEv2 frames: [`gsi::build_mad_frame`] on the way out,
//! [`gsi::parse_mad_frame`] (ICRC verified) on the way in, so every message exercises the
//! wire format. Frames can be captured for a pcap.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};

use pmrxe_wire::{frame_header_len, MacAddr, Psn};
use pmrxe_transport::link::Link;

use crate::gsi::{build_mad_frame, parse_mad_frame};
use crate::timers::Instant;
use crate::types::{Event, Gid, RoutePath};
use crate::{Cm, CmConfig};

pub use pmrxe_transport::link::{Fault, Impairments};

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
    link: Link<MadInfo>,
    psn: u32,
}

impl core::fmt::Debug for Sim {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sim").field("now", &self.now).field("nodes", &self.nodes.len()).field("link", &self.link).finish()
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
            link: Link::new(seed),
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
        self.link.add_filter(f);
    }
    /// Remove all filters.
    pub fn clear_filters(&mut self) {
        self.link.clear_filters();
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
            let fault = self.link.fate(&info, &self.impair);
            info.fault = fault;
            if self.record {
                self.trace.push(info);
            }
            let Some(dst) = dst else { continue };
            self.link.send(self.now.add_ns(self.latency_ns), dst, frame, fault, frame_header_len(false));
        }
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
        let next_pkt = self.link.next_arrival();
        let next_timer = self.nodes.iter().filter_map(|n| n.cm.poll_timeout()).min();
        let Some(next) = [next_pkt, next_timer].into_iter().flatten().min() else { return false };
        if next > self.now {
            self.now = next;
        }
        while let Some((dst, frame)) = self.link.arrive(self.now) {
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
