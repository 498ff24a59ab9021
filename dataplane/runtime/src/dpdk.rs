//! The DPDK port as an lcore [`Link`], optionally behind a seeded fault injector
//! ([`FaultyPort`], enabled by the config's `[faults]` table).
use std::sync::Arc;

use pmrxe_port::{ArrayVec, EthPort, FaultCounters, FaultStats, FaultyPort, Faults, Mbuf, PacketBuf, Port, BURST};
use crate::link::{FrameBuf, Link};

enum Inner {
    Plain(EthPort),
    Faulty(Box<FaultyPort<EthPort>>),
}

/// An ethdev port (one RX/TX queue pair) for an lcore.
pub struct DpdkLink {
    port: Inner,
    rx: ArrayVec<Mbuf, BURST>,
    tx: ArrayVec<Mbuf, BURST>,
}

impl DpdkLink {
    /// Wrap an opened, started port.
    pub fn new(port: EthPort) -> DpdkLink {
        DpdkLink { port: Inner::Plain(port), rx: ArrayVec::new(), tx: ArrayVec::new() }
    }
    /// Wrap an opened, started port; with `Some(faults)` every received frame goes through a
    /// seeded [`FaultyPort`] (loss, duplication, reordering, corruption).
    pub fn with_faults(port: EthPort, faults: Option<Faults>) -> DpdkLink {
        match faults {
            Some(f) => DpdkLink {
                port: Inner::Faulty(Box::new(FaultyPort::new(port, f))),
                rx: ArrayVec::new(),
                tx: ArrayVec::new(),
            },
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

impl FrameBuf for Mbuf {
    fn data(&self) -> &[u8] {
        PacketBuf::data(self)
    }
    fn resize(&mut self, len: usize) -> Option<&mut [u8]> {
        let cur = PacketBuf::len(self);
        if len > cur {
            PacketBuf::append(self, len - cur)?;
        } else if len < cur && !PacketBuf::trim(self, cur - len) {
            return None;
        }
        Some(PacketBuf::data_mut(self))
    }
    fn capacity(&self) -> usize {
        PacketBuf::len(self) + PacketBuf::tailroom(self)
    }
    fn prepend(&mut self, len: usize) -> Option<&mut [u8]> {
        PacketBuf::prepend(self, len)?;
        Some(PacketBuf::data_mut(self))
    }
}

impl Link for DpdkLink {
    type Buf = Mbuf;
    fn rx_burst(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let room = out.capacity() - out.len();
        if room < BURST.min(max) {
            return 0;
        }
        let n = match &mut self.port {
            Inner::Plain(p) => p.rx_burst(&mut self.rx),
            Inner::Faulty(f) => f.rx_burst(&mut self.rx),
        };
        out.extend(self.rx.drain(..));
        n
    }
    fn alloc(&mut self) -> Option<Mbuf> {
        match &mut self.port {
            Inner::Plain(p) => p.alloc(),
            Inner::Faulty(f) => f.alloc(),
        }
    }
    fn tx_burst(&mut self, bufs: &mut Vec<Mbuf>) -> usize {
        let mut sent = 0;
        while !bufs.is_empty() {
            let n = bufs.len().min(BURST);
            self.tx.extend(bufs.drain(..n));
            let s = match &mut self.port {
                Inner::Plain(p) => p.tx_burst(&mut self.tx),
                Inner::Faulty(f) => f.tx_burst(&mut self.tx),
            };
            sent += s;
            if !self.tx.is_empty() {
                // Put the unsent ones back at the front, in order (within the capacity the
                // drain above freed: no allocation).
                bufs.splice(0..0, self.tx.drain(..));
                break;
            }
        }
        sent
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
