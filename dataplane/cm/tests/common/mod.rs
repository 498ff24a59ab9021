//! Shared test harness: short CM timers, a scripted consumer, event log.
#![allow(dead_code)]

use pmrxe_cm::sim::Sim;
use pmrxe_cm::*;
use pmrxe_wire::{Psn, Qpn};

/// Short timers so virtual time stays small: packet lifetime 2^8 units (≈1 ms), CM response
/// timeout 2^12 (≈17 ms), MRA service timeout 2^14 (≈67 ms).
pub fn cfg() -> CmConfig {
    CmConfig { packet_life_time: 8, mra_service_timeout: 14, sidr_linger: 16, ..CmConfig::default() }
}

pub const SID: u64 = 0x0000_0000_0106_1C06; // RDMA_PS_TCP port 7174

pub fn params(sim: &Sim, a: usize, b: usize, qpn: u32) -> ConnectParams {
    let mut path = sim.route(a, b);
    path.packet_life_time = 8;
    let mut p = ConnectParams::new(path, SID, Qpn::new(qpn), Psn::new(qpn * 7));
    p.remote_cm_response_timeout = 12;
    p.local_cm_response_timeout = 12;
    p.max_cm_retries = 15;
    p
}

pub fn accept_params(qpn: u32) -> AcceptParams {
    AcceptParams {
        local_qpn: Qpn::new(qpn),
        starting_psn: Psn::new(qpn * 3),
        responder_resources: 2,
        initiator_depth: 3,
        rnr_retry_count: 6,
        flow_control: true,
        srq: false,
        ece: Ece::default(),
        private_data: vec![],
    }
}

/// A consumer that accepts every request (QPN 0x1000 + n), sends RTU on every response and
/// answers every SIDR request; it logs every event as (node, event).
#[derive(Default)]
pub struct Consumer {
    pub log: Vec<(usize, Event)>,
    pub accepted: u32,
    pub auto_accept: bool,
    pub auto_rtu: bool,
}

impl Consumer {
    pub fn auto() -> Consumer {
        Consumer { auto_accept: true, auto_rtu: true, ..Consumer::default() }
    }
    /// Drain every node's events and react.
    pub fn pump(&mut self, sim: &mut Sim) {
        sim.flush();
        let now = sim.now;
        for i in 0..sim.nodes.len() {
            for ev in sim.nodes[i].take_events() {
                match &ev {
                    Event::ConnectRequest { id, .. } if self.auto_accept => {
                        self.accepted += 1;
                        sim.nodes[i].cm.accept(now, *id, &accept_params(0x1000 + self.accepted)).unwrap();
                    }
                    Event::ConnectResponse { id, .. } if self.auto_rtu => sim.nodes[i].cm.rtu(now, *id, &[]).unwrap(),
                    Event::SidrRequest { id, .. } => {
                        let p = SidrReplyParams {
                            status: SidrStatus::SUCCESS,
                            qpn: Qpn::new(0x77),
                            qkey: pmrxe_cm::cma::UDP_QKEY,
                            vendor_id: 0,
                            info: vec![],
                            private_data: b"sidr-ok".to_vec(),
                        };
                        sim.nodes[i].cm.sidr_reply(now, *id, &p).unwrap();
                    }
                    _ => {}
                }
                self.log.push((i, ev));
            }
        }
        sim.flush();
    }
    /// Step the sim, pumping events, until `cond` or quiescence.
    pub fn run(&mut self, sim: &mut Sim, max_steps: usize, mut cond: impl FnMut(&Consumer, &Sim) -> bool) -> bool {
        for _ in 0..max_steps {
            self.pump(sim);
            if cond(self, sim) {
                return true;
            }
            if !sim.step() {
                self.pump(sim);
                return cond(self, sim);
            }
        }
        false
    }
    pub fn count(&self, node: usize, f: impl Fn(&Event) -> bool) -> usize {
        self.log.iter().filter(|(n, e)| *n == node && f(e)).count()
    }
    pub fn has(&self, node: usize, f: impl Fn(&Event) -> bool) -> bool {
        self.count(node, f) > 0
    }
}

pub fn is_established(e: &Event) -> bool {
    matches!(e, Event::Established { .. })
}
pub fn is_disconnected(e: &Event) -> bool {
    matches!(e, Event::Disconnected { timed_out: false, .. })
}
pub fn is_tw_exit(e: &Event) -> bool {
    matches!(e, Event::TimewaitExit { .. })
}

/// Both CMs hold nothing but listeners.
pub fn assert_empty(sim: &Sim) {
    for (i, n) in sim.nodes.iter().enumerate() {
        assert!(n.cm.is_empty(), "node {i} not empty: {} entries, stats {:?}", n.cm.len(), n.cm.stats());
    }
}

/// `connect` from node `a` to node `b` with [`params`].
pub fn connect(sim: &mut Sim, a: usize, b: usize, qpn: u32) -> ConnId {
    let p = params(sim, a, b, qpn);
    let now = sim.now;
    sim.nodes[a].cm.connect(now, &p).unwrap()
}
