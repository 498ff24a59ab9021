//! Frame I/O for the lcore loop.
//!
//! The loop needs only: burst receive of owned frame buffers, allocation of a transmit
//! buffer, and burst transmit that hands back what it could not send (nothing is ever lost
//! or leaked). DPDK ports implement it in the service; [`PipeLink`] implements it in memory
//! for tests that run the real loop without EAL.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// An owned frame buffer.
pub trait FrameBuf {
    /// The frame bytes.
    fn data(&self) -> &[u8];
    /// Make the frame exactly `len` bytes long and return them for writing (`None` if the
    /// buffer cannot hold `len`).
    fn resize(&mut self, len: usize) -> Option<&mut [u8]>;
    /// Largest frame the buffer can hold from its current start.
    fn capacity(&self) -> usize;
    /// Grow the frame at the front by `len` bytes (into the headroom) and return the whole
    /// frame; `None` if the headroom is too small. Lets the lcore write transport headers and
    /// payload first and put Eth/IP/UDP in front without moving the payload.
    fn prepend(&mut self, len: usize) -> Option<&mut [u8]>;
}

/// Headroom a [`VecBuf`] keeps in front of the frame (like DPDK's RTE_PKTMBUF_HEADROOM).
pub const VEC_HEADROOM: usize = 128;

/// A port as the lcore sees it.
pub trait Link {
    /// The buffer type.
    type Buf: FrameBuf;
    /// Receive up to `max` frames, appending to `out`; returns the count.
    fn rx_burst(&mut self, out: &mut Vec<Self::Buf>, max: usize) -> usize;
    /// A fresh transmit buffer, or `None` when the pool is exhausted (counted, retried).
    fn alloc(&mut self) -> Option<Self::Buf>;
    /// Transmit from the front of `bufs`; sent buffers are removed, unsent ones stay.
    fn tx_burst(&mut self, bufs: &mut Vec<Self::Buf>) -> usize;
}

/// Vec-backed frame buffer for [`PipeLink`].
#[derive(Debug, Clone)]
pub struct VecBuf {
    data: Vec<u8>,
    start: usize,
    len: usize,
}

impl VecBuf {
    /// An empty buffer for frames up to `cap` bytes, with [`VEC_HEADROOM`] in front.
    pub fn with_capacity(cap: usize) -> VecBuf {
        VecBuf { data: vec![0; VEC_HEADROOM + cap], start: VEC_HEADROOM, len: 0 }
    }
}

impl FrameBuf for VecBuf {
    fn data(&self) -> &[u8] {
        &self.data[self.start..self.start + self.len]
    }
    fn resize(&mut self, len: usize) -> Option<&mut [u8]> {
        if self.start + len > self.data.len() {
            return None;
        }
        self.len = len;
        Some(&mut self.data[self.start..self.start + len])
    }
    fn capacity(&self) -> usize {
        self.data.len() - self.start
    }
    fn prepend(&mut self, len: usize) -> Option<&mut [u8]> {
        if len > self.start {
            return None;
        }
        self.start -= len;
        self.len += len;
        Some(&mut self.data[self.start..self.start + self.len])
    }
}

type Queue = Arc<Mutex<VecDeque<VecBuf>>>;

/// One end of an in-memory wire (tests only: it locks, which the DPDK path never does).
#[derive(Debug, Clone)]
pub struct PipeLink {
    rx: Queue,
    tx: Queue,
    frame_cap: usize,
}

impl PipeLink {
    /// Two ends wired to each other.
    pub fn pair(frame_cap: usize) -> (PipeLink, PipeLink) {
        let a: Queue = Default::default();
        let b: Queue = Default::default();
        (PipeLink { rx: a.clone(), tx: b.clone(), frame_cap }, PipeLink { rx: b, tx: a, frame_cap })
    }
}

impl Link for PipeLink {
    type Buf = VecBuf;
    fn rx_burst(&mut self, out: &mut Vec<VecBuf>, max: usize) -> usize {
        let mut q = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let n = max.min(q.len());
        out.extend(q.drain(..n));
        n
    }
    fn alloc(&mut self) -> Option<VecBuf> {
        Some(VecBuf { data: vec![0; VEC_HEADROOM + self.frame_cap], start: VEC_HEADROOM, len: 0 })
    }
    fn tx_burst(&mut self, bufs: &mut Vec<VecBuf>) -> usize {
        let n = bufs.len();
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).extend(bufs.drain(..));
        n
    }
}
