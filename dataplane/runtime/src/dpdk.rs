//! The DPDK port of an lcore: an ethdev queue pair, optionally behind a seeded fault injector
//! ([`FaultyPort`], enabled by the config's `[faults]` table). It is a [`Port`] like the
//! simulated ports the tests use; bursts go straight through (no container copies).
use std::sync::Arc;

use pmrxe_port::{ArrayVec, EthPort, FaultCounters, FaultStats, FaultyPort, Faults, MacAddr, Mbuf, Port};

enum Inner {
    Plain(EthPort),
    Faulty(Box<FaultyPort<EthPort>>),
}

/// An ethdev port (one RX/TX queue pair) for an lcore.
pub struct DpdkLink {
    port: Inner,
}

impl DpdkLink {
    /// Wrap an opened, started port.
    pub fn new(port: EthPort) -> DpdkLink {
        DpdkLink { port: Inner::Plain(port) }
    }
    /// Wrap an opened, started port; with `Some(faults)` every received frame goes through a
    /// seeded [`FaultyPort`] (loss, duplication, reordering, corruption).
    pub fn with_faults(port: EthPort, faults: Option<Faults>) -> DpdkLink {
        match faults {
            Some(f) => DpdkLink { port: Inner::Faulty(Box::new(FaultyPort::new(port, f))) },
            None => DpdkLink::new(port),
        }
    }
    /// The port.
    pub fn port(&self) -> &EthPort {
        match &self.port {
            Inner::Plain(p) => p,
            Inner::Faulty(f) => f.inner(),
        }
    }
    /// Injected-fault counters (`None` without fault injection).
    pub fn fault_stats(&self) -> Option<FaultStats> {
        match &self.port {
            Inner::Plain(_) => None,
            Inner::Faulty(f) => Some(f.stats()),
        }
    }
    /// The live injected-fault counters, readable from other threads (`None` without fault
    /// injection).
    pub fn fault_counters(&self) -> Option<Arc<FaultCounters>> {
        match &self.port {
            Inner::Plain(_) => None,
            Inner::Faulty(f) => Some(f.counters()),
        }
    }
}

impl Port for DpdkLink {
    type Buf = Mbuf;
    fn port_id(&self) -> u16 {
        self.port().port_id()
    }
    fn mac(&self) -> MacAddr {
        Port::mac(self.port())
    }
    fn mtu(&self) -> u16 {
        Port::mtu(self.port())
    }
    #[inline]
    fn alloc(&mut self) -> Option<Mbuf> {
        match &mut self.port {
            Inner::Plain(p) => p.alloc(),
            Inner::Faulty(f) => f.alloc(),
        }
    }
    fn alloc_bulk<const N: usize>(&mut self, out: &mut ArrayVec<Mbuf, N>) -> usize {
        match &mut self.port {
            Inner::Plain(p) => Port::alloc_bulk(p, out),
            Inner::Faulty(f) => f.alloc_bulk(out),
        }
    }
    #[inline]
    fn rx_burst<const N: usize>(&mut self, out: &mut ArrayVec<Mbuf, N>) -> usize {
        match &mut self.port {
            Inner::Plain(p) => p.rx_burst(out),
            Inner::Faulty(f) => f.rx_burst(out),
        }
    }
    #[inline]
    fn tx_burst<const N: usize>(&mut self, bufs: &mut ArrayVec<Mbuf, N>) -> usize {
        match &mut self.port {
            Inner::Plain(p) => p.tx_burst(bufs),
            Inner::Faulty(f) => f.tx_burst(bufs),
        }
    }
    fn kick(&mut self) -> bool {
        match &mut self.port {
            Inner::Plain(p) => p.kick(),
            Inner::Faulty(f) => f.kick(),
        }
    }
    fn rx_ring_drops(&mut self) -> u64 {
        match &mut self.port {
            Inner::Plain(p) => p.rx_ring_drops(),
            Inner::Faulty(f) => f.rx_ring_drops(),
        }
    }
    fn rx_wake(&self) -> pmrxe_port::RxWake {
        self.port().rx_wake()
    }
}

impl Drop for DpdkLink {
    fn drop(&mut self) {
        if let Some(s) = self.fault_stats() {
            tracing::info!(port = self.port().port_id(), seen = s.seen, dropped = s.dropped, duplicated = s.duplicated,
                reordered = s.reordered, corrupted = s.corrupted, "injected faults");
        }
    }
}
