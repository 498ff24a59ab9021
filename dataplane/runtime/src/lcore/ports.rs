//! The ports stage: the lcore's devices (each a [`Port`] with its transmit queue, its loopback
//! queue and its spare buffers), the receive scratch, `tx_burst` at the end of a pass, and
//! the idle check of what the kernel dropped from the receive rings.
use std::net::IpAddr;

use pmrxe_port::{ArrayVec, PacketBuf, Port};
use pmrxe_transport::Instant;

use super::{DeviceConfig, BURST, TX_QUEUE};
use crate::neigh::gid_to_ip;
use crate::stats::{bump, LcoreStats};

/// How often an idle lcore asks its ports what the kernel dropped from their receive rings
/// (one getsockopt per af_packet socket): 100 ms.
const RING_CHECK_NS: u64 = 100_000_000;

/// A receive burst's buffers.
pub(super) type RxBurst<L> = ArrayVec<<L as Port>::Buf, BURST>;
/// A port's transmit or loopback queue.
pub(super) type TxQueue<L> = ArrayVec<<L as Port>::Buf, TX_QUEUE>;

/// The lcore's ports and what only they use.
pub(super) struct Ports<L: Port> {
    /// One per device, in the order the service gave them (frames name them by index).
    pub(super) slots: Vec<PortSlot<L>>,
    /// Reserved scratch: the receive burst, one for every port (ports are polled in turn).
    /// Boxed and taken out by pointer for the pass, which needs the whole lcore per frame:
    /// moving the array itself in and out was two memcpys per port per iteration, busy or not.
    rx: Option<Box<RxBurst<L>>>,
    /// Always empty between passes: swapped with a port's `lo` to receive its looped frames.
    lo_spare: Option<Box<TxQueue<L>>>,
    /// When the receive rings were last asked what the kernel dropped.
    last_ring_check: Instant,
}

impl<L: Port> std::ops::Index<usize> for Ports<L> {
    type Output = PortSlot<L>;
    #[inline]
    fn index(&self, pi: usize) -> &PortSlot<L> {
        &self.slots[pi]
    }
}

impl<L: Port> std::ops::IndexMut<usize> for Ports<L> {
    #[inline]
    fn index_mut(&mut self, pi: usize) -> &mut PortSlot<L> {
        &mut self.slots[pi]
    }
}

impl<L: Port> Ports<L> {
    pub(super) fn new(ports: Vec<(L, DeviceConfig)>) -> Self {
        let slots = ports
            .into_iter()
            .map(|(link, dev)| {
                let ips = dev.gids.iter().map(gid_to_ip).collect();
                PortSlot { link, dev, ips, tx: ArrayVec::new(), lo: Box::default(), spare: ArrayVec::new(), groups: Vec::new() }
            })
            .collect();
        Ports { slots, rx: Some(Box::default()), lo_spare: Some(Box::default()), last_ring_check: Instant(0) }
    }

    /// The receive scratch for one pass (the burst and the empty loopback queue); give it
    /// back with [`Ports::put_scratch`].
    pub(super) fn take_scratch(&mut self) -> (Box<RxBurst<L>>, Box<TxQueue<L>>) {
        let (Some(rx), Some(lo)) = (self.rx.take(), self.lo_spare.take()) else {
            unreachable!("the receive scratch is put back at the end of every pass")
        };
        (rx, lo)
    }

    pub(super) fn put_scratch(&mut self, rx: Box<RxBurst<L>>, lo: Box<TxQueue<L>>) {
        debug_assert!(rx.is_empty() && lo.is_empty());
        (self.rx, self.lo_spare) = (Some(rx), Some(lo));
    }

    /// The index of the port of device `index`.
    pub(super) fn of_device(&self, index: u32) -> Option<usize> {
        self.slots.iter().position(|p| p.dev.index == index)
    }

    /// `tx_burst` what each port queued this pass; a port with nothing new is kicked instead
    /// (see below). Returns whether any port had frames.
    #[inline]
    pub(super) fn flush(&mut self, stats: &LcoreStats) -> bool {
        let mut any = false;
        for p in &mut self.slots {
            if p.tx.is_empty() {
                // Nothing new for this port: make sure what earlier bursts left inside the
                // device goes out (af_packet; a no-op elsewhere). Not work: a kernel that keeps
                // refusing is retried on the next pass, after any idle back-off.
                if p.link.kick() {
                    bump(&stats.tx_kicks_held, 1);
                }
                continue;
            }
            any = true;
            let bytes: usize = p.tx.iter().map(|b| b.data().len()).sum();
            let want = p.tx.len();
            let sent = p.link.tx_burst(&mut p.tx);
            bump(&stats.tx_packets, sent as u64);
            if sent == want {
                bump(&stats.tx_bytes, bytes as u64);
            } else {
                bump(&stats.tx_backpressure, 1);
                let left: usize = p.tx.iter().map(|b| b.data().len()).sum();
                bump(&stats.tx_bytes, (bytes - left) as u64);
            }
        }
        any
    }

    /// Kick every port before a sleep; true if one still holds frames the kernel refused
    /// (the sleep must then be bounded).
    pub(super) fn kick_all(&mut self) -> bool {
        let mut held = false;
        for p in &mut self.slots {
            held |= p.link.kick();
        }
        held
    }

    /// On an idle iteration, at most every [`RING_CHECK_NS`]: count what the kernel dropped
    /// from the ports' receive rings since the last look (`rx_ring_drops`; drops during a busy
    /// stretch are counted at its end).
    pub(super) fn check_rings(&mut self, now: Instant, stats: &LcoreStats) {
        if now.0.saturating_sub(self.last_ring_check.0) < RING_CHECK_NS {
            return;
        }
        self.last_ring_check = now;
        let n: u64 = self.slots.iter_mut().map(|p| p.link.rx_ring_drops()).sum();
        if n > 0 {
            bump(&stats.rx_ring_drops, n);
        }
    }
}

pub(super) struct PortSlot<L: Port> {
    pub(super) dev: DeviceConfig,
    /// The GIDs as IP addresses (same order as `dev.gids`), converted once.
    pub(super) ips: Vec<IpAddr>,
    pub(super) tx: ArrayVec<L::Buf, TX_QUEUE>,
    /// Frames this port sent to one of its own addresses (two QPs of the same device): looped
    /// back inside the device, as rxe and every NIC do, and received on the next iteration.
    /// Boxed so that the receive pass takes it by swapping a pointer with `Ports::lo_spare`
    /// (moving the 1 KiB array in and out cost two memcpys per pass).
    pub(super) lo: Box<ArrayVec<L::Buf, TX_QUEUE>>,
    /// Empty transmit buffers: taken from the port a burst at a time (one mempool call instead
    /// of one per frame) and given back when a QP's poll produced nothing, so a visit that
    /// ends the QP's turn costs no allocation and free. Last in, first out (cache-warm).
    pub(super) spare: ArrayVec<L::Buf, BURST>,
    /// Multicast groups with QPs attached on this port (few: a linear search).
    pub(super) groups: Vec<McastGroup>,
    /// Declared last, so dropped after every buffer above (buffers never outlive their pool).
    pub(super) link: L,
}

/// A multicast group of a port and the QPs attached to it (of every lcore: a datagram that
/// arrives on one lcore is copied to the others that own members).
pub(super) struct McastGroup {
    pub(super) gid: [u8; 16],
    pub(super) members: Vec<u32>,
}

impl<L: Port> PortSlot<L> {
    /// An empty transmit buffer (from `spare`, refilled in bulk; one at a time when the pool
    /// cannot supply a whole burst).
    #[inline]
    pub(super) fn alloc(&mut self) -> Option<L::Buf> {
        if self.spare.is_empty() && self.link.alloc_bulk(&mut self.spare) == 0 {
            return self.link.alloc();
        }
        self.spare.pop()
    }

    /// Return an unused buffer from [`PortSlot::alloc`] (emptied first; freed if there is no
    /// room or it cannot be emptied).
    #[inline]
    pub(super) fn give_back(&mut self, mut b: L::Buf) {
        if !self.spare.is_full() && b.resize(0).is_some() {
            self.spare.push(b);
        }
    }

    pub(super) fn owns_ip(&self, ip: IpAddr) -> bool {
        self.ips.contains(&ip)
    }
    /// Our first address of the family of `like`.
    pub(super) fn ip_like(&self, like: IpAddr) -> Option<IpAddr> {
        self.ips.iter().copied().find(|i| i.is_ipv4() == like.is_ipv4())
    }
}
