//! QP1 (the GSI) between the lcores and the service's connection-manager thread.
//!
//! Received: an lcore copies every valid RoCE frame for QP 1 (after the parser's length, ICRC,
//! IP and P_Key checks) into [`GsiPipe::rx`], a bounded lock-free queue of fixed-size buffers
//! allocated up front (no heap allocation per frame; full → dropped and counted in
//! `cm_drops`). The CM thread pops them, parses the MAD and feeds its `Cm`.
//!
//! Sent: the CM thread pushes (device, [`GsiPath`], MAD) into the owning lcore's
//! [`GsiPipe::tx`] queue; the lcore resolves the destination MAC (own address → own MAC and the
//! frame loops back inside the device; unknown → ARP/ND solicitation and drop: the CM
//! retransmits) and builds the frame with [`pmrxe_cm::gsi::build_mad_frame_into`] in an mbuf.
use crossbeam::queue::ArrayQueue;
use pmrxe_cm::GsiPath;

/// Largest frame carried to the CM (a GSI frame is 322 bytes over IPv4, 342 over IPv6).
pub const MAX_GSI_FRAME: usize = 512;
/// Depth of the receive queue and of each lcore's transmit queue.
pub const GSI_QUEUE_DEPTH: usize = 1024;

/// A received frame for QP1.
#[derive(Clone, Copy)]
pub struct GsiFrame {
    /// Device index (pmrxeN) it arrived on.
    pub device: u32,
    /// Bytes used in `data`.
    pub len: u16,
    /// The whole Ethernet frame.
    pub data: [u8; MAX_GSI_FRAME],
}

impl GsiFrame {
    /// The frame bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data[..self.len as usize]
    }
}

/// A MAD to send from QP1 of `device`.
#[derive(Clone, Copy)]
pub struct GsiOut {
    /// Device index (pmrxeN).
    pub device: u32,
    /// Where to.
    pub path: GsiPath,
    /// The 256-byte MAD.
    pub mad: pmrxe_cm::Mad,
}

/// The queues between the lcores and the CM thread (one `rx` shared by every lcore, one `tx`
/// per lcore).
pub struct GsiPipe {
    /// Lcores → CM.
    pub rx: ArrayQueue<GsiFrame>,
    /// CM → lcore `i`.
    pub tx: Vec<ArrayQueue<GsiOut>>,
}

impl GsiPipe {
    /// Queues for `lcores` lcores (allocated here, never on the fast path).
    pub fn new(lcores: usize) -> std::sync::Arc<GsiPipe> {
        std::sync::Arc::new(GsiPipe {
            rx: ArrayQueue::new(GSI_QUEUE_DEPTH),
            tx: (0..lcores.max(1)).map(|_| ArrayQueue::new(GSI_QUEUE_DEPTH)).collect(),
        })
    }
}
