//! The [`Port`] and [`PacketBuf`] traits: what the runtime and the transport tests need from
//! a network port, implemented by DPDK ports ([`crate::EthPort`]), the in-memory
//! [`crate::SimPort`] and the fault-injecting wrapper [`crate::FaultyPort`].
//!
//! Contract:
//! - Bursts never allocate: callers pass fixed-capacity [`ArrayVec`]s (see [`Burst`]).
//! - `rx_burst` appends at most `out.remaining_capacity()` buffers to `out`.
//! - `tx_burst` sends a prefix of `bufs` and removes exactly those; the unsent suffix stays
//!   in `bufs`, in order, owned by the caller. Nothing is ever leaked or silently dropped.
//! - A port handle serves one RX and one TX queue and is used by one thread at a time
//!   (`&mut self`); clone DPDK handles per lcore with [`crate::EthPort::for_queues`].

pub use arrayvec::ArrayVec;
pub use pmrxe_config::MacAddr;

/// Default burst size.
pub const BURST: usize = 32;

/// A burst of packet buffers with the default capacity.
pub type Burst<B> = ArrayVec<B, BURST>;

/// A packet buffer: contiguous bytes with head- and tailroom.
pub trait PacketBuf: Send {
    /// The packet bytes.
    fn data(&self) -> &[u8];
    /// The packet bytes, mutable.
    fn data_mut(&mut self) -> &mut [u8];
    /// Number of packet bytes.
    fn len(&self) -> usize {
        self.data().len()
    }
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Free bytes after the data.
    fn tailroom(&self) -> usize;
    /// Free bytes before the data.
    fn headroom(&self) -> usize;
    /// Grows the tail by `len` bytes and returns the new region (`None`: no room, no change).
    fn append(&mut self, len: usize) -> Option<&mut [u8]>;
    /// Grows the head by `len` bytes and returns the new region (`None`: no room, no change).
    fn prepend(&mut self, len: usize) -> Option<&mut [u8]>;
    /// Removes `len` bytes from the tail (`false`: too short, no change).
    fn trim(&mut self, len: usize) -> bool;
    /// Removes `len` bytes from the head (`false`: too short, no change).
    fn adj(&mut self, len: usize) -> bool;
    /// Largest frame the buffer can hold from its current start (length + tailroom).
    #[inline]
    fn capacity(&self) -> usize {
        self.len() + self.tailroom()
    }
    /// Make the data exactly `len` bytes long (growing into the tailroom or trimming the tail)
    /// and return it for writing; `None` (no change) if the buffer cannot hold `len`.
    #[inline]
    fn resize(&mut self, len: usize) -> Option<&mut [u8]> {
        let cur = self.len();
        if len > cur {
            self.append(len - cur)?;
        } else if len < cur && !self.trim(cur - len) {
            return None;
        }
        Some(self.data_mut())
    }
    /// Open an empty buffer for writing a frame in place: move the start of its data back
    /// (at most 63 bytes, into the headroom) so that data byte `at` lies on a 64-byte
    /// boundary, unless that would leave less than `keep` bytes of headroom (then the start
    /// stays); then make all of its room the data and return it (the caller trims or resizes
    /// it to the frame). The tailroom is never shortened. `None` (no change) if the buffer is
    /// not empty.
    #[inline]
    fn open_aligned(&mut self, at: usize, keep: usize) -> Option<&mut [u8]> {
        if !self.is_empty() {
            return None;
        }
        let back = (self.data().as_ptr() as usize).wrapping_add(at) & 63;
        if back != 0 && self.headroom() >= keep + back {
            let _ = self.prepend(back);
        }
        let room = self.tailroom() + self.len();
        self.resize(room)
    }
    /// Free every buffer in `bufs` (leaving it empty). The same as `bufs.clear()`; DPDK mbufs
    /// return to their pool in one bulk operation instead of one put per buffer.
    fn free_all<const N: usize>(bufs: &mut ArrayVec<Self, N>)
    where
        Self: Sized,
    {
        bufs.clear();
    }
    /// Appends a copy of `bytes` (`false`: no room, no change).
    fn extend_from_slice(&mut self, bytes: &[u8]) -> bool {
        match self.append(bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }
}

/// A network port (one RX queue, one TX queue) as seen by the data plane.
pub trait Port: Send {
    /// Its packet buffer type.
    type Buf: PacketBuf;

    /// Port id (DPDK port id, or a small integer for simulated ports).
    fn port_id(&self) -> u16;
    /// The port's MAC address.
    fn mac(&self) -> MacAddr;
    /// The port's MTU (L3 bytes; frames are up to `mtu + 14` bytes without FCS/VLAN).
    fn mtu(&self) -> u16;
    /// An empty buffer for transmission, with headroom for headers; `None` if exhausted.
    fn alloc(&mut self) -> Option<Self::Buf>;
    /// Fill `out` with empty buffers; returns how many were added. DPDK ports take them from
    /// the mempool in one call, all or nothing (0 when it cannot supply them all).
    fn alloc_bulk<const N: usize>(&mut self, out: &mut ArrayVec<Self::Buf, N>) -> usize {
        let mut n = 0;
        while !out.is_full() {
            let Some(b) = self.alloc() else { break };
            out.push(b);
            n += 1;
        }
        n
    }
    /// Receives up to `out.remaining_capacity()` frames, appended to `out`. Returns the count.
    fn rx_burst<const N: usize>(&mut self, out: &mut ArrayVec<Self::Buf, N>) -> usize;
    /// Sends a prefix of `bufs`, removing the sent ones; unsent ones stay in `bufs` in order.
    /// Returns the number sent.
    fn tx_burst<const N: usize>(&mut self, bufs: &mut ArrayVec<Self::Buf, N>) -> usize;
    /// Push to the wire what earlier bursts left inside the device. Called when the caller has
    /// nothing to send. Most devices hold nothing (the default); DPDK's af_packet PMD can
    /// (see [`crate::EthPort::kick`]). Returns true while frames may still be held: call again
    /// on a later pass.
    fn kick(&mut self) -> bool {
        false
    }
    /// Frames the kernel dropped since the last call because this port's receive ring was full
    /// (the af_packet PMD's sockets: `PACKET_STATISTICS`, which the read resets; the af_xdp
    /// PMD's: `XDP_STATISTICS`, totals, of which the port returns the growth). Frames lost
    /// before pmrxe ever saw them, invisible to every other counter. Default: 0 (no such ring).
    fn rx_ring_drops(&mut self) -> u64 {
        0
    }
    /// How an idle lcore learns that frames arrived on this port (`idle.mode = "wait"`).
    /// Default: nothing tells ([`RxWake::Poll`]).
    fn rx_wake(&self) -> RxWake {
        RxWake::Poll
    }
}

/// How an idle lcore in `wait` mode learns that frames arrived on a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RxWake {
    /// These fds turn readable (epoll) when frames wait in the port's receive queue (the
    /// af_packet and af_xdp PMDs' sockets).
    Fds(Vec<std::os::fd::RawFd>),
    /// Only lcores of this process put frames on its receive queue (a net_ring pair): the
    /// sender wakes the receiving lcore itself.
    Local,
    /// Nothing tells: an lcore with such a port sleeps at most `max_sleep_us`.
    Poll,
}
