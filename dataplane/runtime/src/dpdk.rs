//! The DPDK port as an lcore [`Link`].
use pmrxe_port::{ArrayVec, EthPort, Mbuf, PacketBuf, BURST};
use crate::link::{FrameBuf, Link};

/// An ethdev port (one RX/TX queue pair) for an lcore.
pub struct DpdkLink {
    port: EthPort,
    rx: ArrayVec<Mbuf, BURST>,
    tx: ArrayVec<Mbuf, BURST>,
}

impl DpdkLink {
    /// Wrap an opened, started port.
    pub fn new(port: EthPort) -> DpdkLink {
        DpdkLink { port, rx: ArrayVec::new(), tx: ArrayVec::new() }
    }
    /// The port.
    pub fn port(&self) -> &EthPort {
        &self.port
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
}

impl Link for DpdkLink {
    type Buf = Mbuf;
    fn rx_burst(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let room = out.capacity() - out.len();
        if room < BURST.min(max) {
            return 0;
        }
        let n = self.port.rx_burst(&mut self.rx);
        out.extend(self.rx.drain(..));
        n
    }
    fn alloc(&mut self) -> Option<Mbuf> {
        pmrxe_port::Port::alloc(&mut self.port)
    }
    fn tx_burst(&mut self, bufs: &mut Vec<Mbuf>) -> usize {
        let mut sent = 0;
        while !bufs.is_empty() {
            let n = bufs.len().min(BURST);
            self.tx.extend(bufs.drain(..n));
            let s = self.port.tx_burst(&mut self.tx);
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
