//! Per-lcore counters: written by the lcore with relaxed stores, read by the control thread.
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

macro_rules! counters {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $f:ident,)* }) => {
        $(#[$m])*
        #[derive(Debug, Default)]
        pub struct $name { $($(#[$fm])* pub $f: AtomicU64,)* }
        paste_snapshot!($name { $($f,)* });
    };
}
macro_rules! paste_snapshot {
    ($name:ident { $($f:ident,)* }) => {
        /// A plain copy of the counters.
        #[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
        pub struct Snapshot { $(pub $f: u64,)* }
        impl $name {
            /// Read every counter.
            pub fn snapshot(&self) -> Snapshot {
                Snapshot { $($f: self.$f.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Counters of one lcore (all its ports and QPs).
    LcoreStats {
        /// Loop iterations that found work.
        busy_iterations,
        /// Loop iterations that found none.
        idle_iterations,
        /// Nanoseconds spent in iterations that found work (the lcore's busy time: with
        /// `sq_wqes` or `rx_packets`, its cost per operation, whatever the load offered).
        busy_ns,
        /// Idle sleeps taken (back-off mode).
        idle_sleeps,
        /// Wait mode: times another thread was found competing for the lcore's CPU (the lcore
        /// then blocks as soon as it finds nothing, without its spin window, for a while).
        cpu_contended,
        /// Frames the kernel dropped because a port's receive ring was full, before pmrxe saw
        /// them (af_packet: the sockets' `PACKET_STATISTICS`; af_xdp: `XDP_STATISTICS`'
        /// `rx_dropped` + `rx_ring_full`; read every 100 ms while idle).
        rx_ring_drops,
        /// Frames received.
        rx_packets,
        /// Bytes received.
        rx_bytes,
        /// Frames a port sent to its own address (same-device traffic), looped back inside the
        /// device instead of leaving on the wire.
        rx_loopback,
        /// RoCE frames parsed by header prediction: a MIDDLE packet whose headers equal those
        /// of its QP's last fully parsed MIDDLE but for the PSN and AckReq.
        rx_predicted,
        /// Frames transmitted.
        tx_packets,
        /// Bytes transmitted.
        tx_bytes,
        /// RoCE frames with a bad ICRC (dropped).
        rx_icrc_errors,
        /// Frames dropped by the parser for any other reason.
        rx_malformed,
        /// Frames that were not for us (other IP, not RoCE, not ARP/ND).
        rx_not_for_us,
        /// RoCE frames for an unknown QPN (dropped).
        rx_unknown_qp,
        /// Multicast datagrams (BTH destination QP 0xFFFFFF) received for a group a QP of
        /// this lcore's ports is attached to; each is delivered to every attached QP.
        rx_multicast,
        /// Copies of multicast datagrams placed for attached QPs (one per QP per datagram;
        /// whether a QP takes it — Q_Key, a receive WQE — is in its own counters).
        rx_multicast_copies,
        /// Multicast datagrams this lcore's QPs sent that were also looped back to the sending
        /// port's own attached QPs (as a NIC loops multicast back to its port's members).
        tx_multicast_loopback,
        /// IGMP messages sent: reports (joins, answers to queries) and leaves.
        igmp_sent,
        /// RoCE frames for one of our QPs that arrived marked ECN Congestion Experienced.
        rx_ecn_ce,
        /// CNPs (BTH opcode 0x81) received and handed to their QP's reaction point.
        rx_cnp,
        /// CNPs sent by the notification points of this lcore's QPs.
        tx_cnp,
        /// ARP requests answered.
        arp_replies,
        /// Transmit buffer allocation failures.
        tx_alloc_failures,
        /// Frames the engine produced that could not be framed (a bug if ever non-zero).
        tx_build_errors,
        /// Frames that could not be sent because no neighbour MAC is known.
        tx_no_neighbor,
        /// Transmit passes a QP skipped, its send state held, while ARP/ND resolved its peer.
        tx_neigh_hold,
        /// Frames the port refused (retried next iteration).
        tx_backpressure,
        /// Kicks of a device that still held frames afterwards (af_packet: the kernel's send
        /// buffer was full; retried next pass).
        tx_kicks_held,
        /// Send WQEs taken from client rings.
        sq_wqes,
        /// Of those, WQEs carrying their payload inline (IBV_SEND_INLINE).
        sq_inline_wqes,
        /// Receive WQEs taken from client rings.
        rq_wqes,
        /// Client WQEs rejected by validation (QP moved to error).
        bad_wqes,
        /// Completions written to client CQs.
        cqes,
        /// Of those, WR_FLUSH_ERR completions: work requests flushed because their QP went to
        /// ERR. (A verbs library may report flushed requests of its own, for a QP it destroyed;
        /// those never pass through here.)
        cqes_flushed,
        /// Times a CQ was full and a completion had to wait.
        cq_full,
        /// Completion events signalled (eventfd writes).
        cq_events,
        /// Corrupt ring indices seen (client misbehaviour).
        ring_corrupt,
        /// Frames handed to the lcore that owns their QP.
        handoff_out,
        /// Frames received from other lcores.
        handoff_in,
        /// Frames dropped because the owner's inbox was full.
        handoff_drops,
        /// Control commands handled.
        commands,
        /// Address handles held by this lcore for its clients (a gauge, not a counter).
        address_handles,
        /// Frames for QP1 (CM MADs) passed to the connection manager.
        cm_rx,
        /// CM MADs sent from QP1.
        cm_tx,
        /// QP1 frames dropped: CM queue full, oversize, no neighbour MAC yet, no buffer.
        cm_drops,
    }
}

/// Parser drop counters by wire error kind.
#[derive(Debug)]
pub struct DropStats {
    /// One counter per `pmrxe_wire::Error::index()`.
    pub by_reason: Vec<AtomicU64>,
}

impl Default for DropStats {
    fn default() -> Self {
        DropStats { by_reason: (0..pmrxe_wire::Error::COUNT).map(|_| AtomicU64::new(0)).collect() }
    }
}

impl DropStats {
    /// (reason, count) for every non-zero counter.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        self.by_reason
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let v = c.load(Ordering::Relaxed);
                (v > 0).then(|| (pmrxe_wire::Error::name_of(i).unwrap_or("unknown"), v))
            })
            .collect()
    }
}

/// Increment a counter (relaxed; the lcore is the only writer).
#[inline]
pub fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}
