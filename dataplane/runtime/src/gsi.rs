//! QP1 (the GSI) between the lcores and the service's connection-manager thread.
//!
//! Received: an lcore copies every valid RoCE frame for QP 1 (after the parser's length, ICRC,
//! IP and P_Key checks) into [`GsiPipe::rx`], a bounded lock-free queue of fixed-size buffers
//! allocated up front (no heap allocation per frame; full → dropped and counted in
//! `cm_drops`). The CM thread pops them, parses the MAD and feeds its `Cm`. [`GsiPipe::push_rx`]
//! also wakes the CM thread (it sleeps until woken, its next CM deadline or its housekeeping
//! tick), so a MAD costs no polling delay.
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
    /// The CM thread, once it runs: unparked after every frame queued on `rx`.
    waker: std::sync::OnceLock<std::thread::Thread>,
    /// The lcores' wakers (registered by `Lcore::set_gsi`): a MAD queued on `tx[i]` wakes
    /// lcore `i` if it sleeps (`idle.mode = "wait"`).
    lcore_wakers: Vec<std::sync::OnceLock<std::sync::Arc<crate::idle::Waker>>>,
}

impl GsiPipe {
    /// Queues for `lcores` lcores (allocated here, never on the fast path).
    pub fn new(lcores: usize) -> std::sync::Arc<GsiPipe> {
        std::sync::Arc::new(GsiPipe {
            rx: ArrayQueue::new(GSI_QUEUE_DEPTH),
            tx: (0..lcores.max(1)).map(|_| ArrayQueue::new(GSI_QUEUE_DEPTH)).collect(),
            waker: std::sync::OnceLock::new(),
            lcore_wakers: (0..lcores.max(1)).map(|_| std::sync::OnceLock::new()).collect(),
        })
    }

    /// The thread that consumes `rx` (the CM thread registers itself once).
    pub fn set_waker(&self, t: std::thread::Thread) {
        let _ = self.waker.set(t);
    }

    /// Lcore `i`'s waker (once, before it runs).
    pub fn set_lcore_waker(&self, i: usize, w: std::sync::Arc<crate::idle::Waker>) {
        if let Some(slot) = self.lcore_wakers.get(i) {
            let _ = slot.set(w);
        }
    }

    /// Queue a MAD for lcore `lcore` to send (the first lcore's queue if there is no such
    /// lcore) and wake it if it sleeps. Full → `false` (dropped; the CM retransmits).
    pub fn push_tx(&self, lcore: usize, out: GsiOut) -> bool {
        let i = if lcore < self.tx.len() { lcore } else { 0 };
        let Some(q) = self.tx.get(i) else { return false };
        if q.push(out).is_err() {
            return false;
        }
        if let Some(w) = self.lcore_wakers.get(i).and_then(|w| w.get()) {
            w.wake_if_sleeping();
        }
        true
    }

    /// Queue a received frame for the CM and wake its thread (`Thread::unpark`: an atomic
    /// swap, plus a futex wake only when the thread sleeps). Full → `false` (the frame is
    /// dropped; the CM retransmits).
    pub fn push_rx(&self, f: GsiFrame) -> bool {
        if self.rx.push(f).is_err() {
            return false;
        }
        if let Some(t) = self.waker.get() {
            t.unpark();
        }
        true
    }
}
