//! [`SimPort`]: an in-memory port pair for tests without DPDK. Frames are `Vec<u8>`-backed
//! [`SimBuf`]s moved over bounded crossbeam channels (a full channel behaves like a full TX
//! ring: `tx_burst` returns the unsent frames). Wrap either end in [`crate::FaultyPort`] for
//! seeded loss, duplication, reordering and corruption.

use arrayvec::ArrayVec;
use crossbeam::channel::{bounded, Receiver, Sender, TryRecvError, TrySendError};
use pmrxe_config::MacAddr;

use crate::{PacketBuf, Port, MBUF_HEADROOM};

/// A heap packet buffer with head- and tailroom, like an mbuf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimBuf {
    storage: Box<[u8]>,
    head: usize,
    len: usize,
}

impl SimBuf {
    /// A buffer of `room` bytes in total whose data starts after `headroom` bytes.
    pub fn with_capacity(room: usize, headroom: usize) -> SimBuf {
        SimBuf { storage: vec![0; room].into_boxed_slice(), head: headroom.min(room), len: 0 }
    }

    /// A buffer holding a copy of `bytes` (default headroom).
    pub fn from_slice(bytes: &[u8]) -> SimBuf {
        let h = usize::from(MBUF_HEADROOM);
        let mut b = SimBuf::with_capacity(h + bytes.len(), h);
        b.extend_from_slice(bytes);
        b
    }
}

impl PacketBuf for SimBuf {
    fn data(&self) -> &[u8] {
        &self.storage[self.head..self.head + self.len]
    }
    fn data_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.head..self.head + self.len]
    }
    fn tailroom(&self) -> usize {
        self.storage.len() - self.head - self.len
    }
    fn headroom(&self) -> usize {
        self.head
    }
    fn append(&mut self, len: usize) -> Option<&mut [u8]> {
        if len > self.tailroom() {
            return None;
        }
        let start = self.head + self.len;
        self.len += len;
        Some(&mut self.storage[start..start + len])
    }
    fn prepend(&mut self, len: usize) -> Option<&mut [u8]> {
        if len > self.head {
            return None;
        }
        self.head -= len;
        self.len += len;
        Some(&mut self.storage[self.head..self.head + len])
    }
    fn trim(&mut self, len: usize) -> bool {
        if len > self.len {
            return false;
        }
        self.len -= len;
        true
    }
    fn adj(&mut self, len: usize) -> bool {
        if len > self.len {
            return false;
        }
        self.head += len;
        self.len -= len;
        true
    }
}

/// One end of an in-memory link.
#[derive(Debug)]
pub struct SimPort {
    id: u16,
    mac: MacAddr,
    mtu: u16,
    tx: Sender<SimBuf>,
    rx: Receiver<SimBuf>,
}

impl SimPort {
    /// Two ports wired back to back, ids 0 and 1, MACs `02:00:00:00:00:01`/`:02`, each
    /// direction buffering up to `depth` frames.
    pub fn pair(mtu: u16, depth: usize) -> (SimPort, SimPort) {
        SimPort::pair_with(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]), mtu, depth)
    }

    /// As [`SimPort::pair`] with chosen MACs.
    pub fn pair_with(mac_a: MacAddr, mac_b: MacAddr, mtu: u16, depth: usize) -> (SimPort, SimPort) {
        let (tx_ab, rx_ab) = bounded(depth.max(1));
        let (tx_ba, rx_ba) = bounded(depth.max(1));
        (
            SimPort { id: 0, mac: mac_a, mtu, tx: tx_ab, rx: rx_ba },
            SimPort { id: 1, mac: mac_b, mtu, tx: tx_ba, rx: rx_ab },
        )
    }

    /// Frames waiting to be received on this end.
    pub fn rx_pending(&self) -> usize {
        self.rx.len()
    }
}

impl Port for SimPort {
    type Buf = SimBuf;
    fn port_id(&self) -> u16 {
        self.id
    }
    fn mac(&self) -> MacAddr {
        self.mac
    }
    fn mtu(&self) -> u16 {
        self.mtu
    }
    fn alloc(&mut self) -> Option<SimBuf> {
        let h = usize::from(MBUF_HEADROOM);
        Some(SimBuf::with_capacity(h + usize::from(self.mtu) + 18, h))
    }
    fn rx_burst<const N: usize>(&mut self, out: &mut ArrayVec<SimBuf, N>) -> usize {
        let mut n = 0;
        while !out.is_full() {
            match self.rx.try_recv() {
                Ok(b) => {
                    out.push(b);
                    n += 1;
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        n
    }
    fn tx_burst<const N: usize>(&mut self, bufs: &mut ArrayVec<SimBuf, N>) -> usize {
        let mut sent = 0;
        while !bufs.is_empty() {
            let b = bufs.remove(0);
            match self.tx.try_send(b) {
                Ok(()) => sent += 1,
                Err(TrySendError::Full(b) | TrySendError::Disconnected(b)) => {
                    bufs.insert(0, b);
                    break;
                }
            }
        }
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Burst;

    #[test]
    fn simbuf_ops() {
        let mut b = SimBuf::with_capacity(16, 4);
        assert_eq!(b.append(8).map(|s| s.len()), Some(8));
        assert_eq!(b.len(), 8);
        assert!(b.append(5).is_none());
        assert_eq!(b.prepend(4).map(|s| s.len()), Some(4));
        assert!(b.prepend(1).is_none());
        assert!(b.trim(2));
        assert!(b.adj(3));
        assert_eq!(b.len(), 7);
        assert!(!b.trim(8));
        assert_eq!(b.headroom(), 3);
        assert_eq!(b.tailroom(), 6);
    }

    #[test]
    fn simbuf_open_aligned() {
        // 328 bytes, data at 128: opening puts data byte 12 on a cache line by moving the
        // start back at most 63 bytes, keeping at least 62 bytes of headroom and all the
        // tailroom.
        let mut b = SimBuf::with_capacity(328, 128);
        let d = b.open_aligned(12, 62).expect("empty buffer");
        assert_eq!((d.as_ptr() as usize + 12) % 64, 0);
        let head = b.headroom();
        assert!((62..=128).contains(&head) && 128 - head < 64);
        assert_eq!((b.len(), b.tailroom()), (328 - head, 0));
        assert!(b.open_aligned(12, 62).is_none(), "not empty");
        // A headroom that cannot spare the move: the start stays.
        let mut c = SimBuf::with_capacity(100, 4);
        assert_eq!(c.open_aligned(12, 62).map(|d| d.len()), Some(96));
        assert_eq!(c.headroom(), 4);
    }

    #[test]
    fn full_link_returns_unsent_in_order() {
        let (mut a, mut b) = SimPort::pair(1500, 4);
        let mut burst: Burst<SimBuf> = Burst::new();
        for i in 0..10u8 {
            burst.push(SimBuf::from_slice(&[i; 3]));
        }
        assert_eq!(a.tx_burst(&mut burst), 4);
        assert_eq!(burst.len(), 6);
        assert_eq!(burst[0].data(), &[4, 4, 4]);
        let mut rx: Burst<SimBuf> = Burst::new();
        assert_eq!(b.rx_burst(&mut rx), 4);
        let firsts: Vec<u8> = rx.iter().map(|b| b.data()[0]).collect();
        assert_eq!(firsts, [0, 1, 2, 3]);
        assert_eq!(a.tx_burst(&mut burst), 4);
        assert_eq!(burst.len(), 2);
    }
}
