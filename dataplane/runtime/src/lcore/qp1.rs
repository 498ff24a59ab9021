//! The QP1 stage: connection-manager MADs between the lcore's ports and the connection
//! manager's queues ([`GsiPipe`]), and the PSN of the MADs this lcore sends.
use std::net::IpAddr;
use std::sync::Arc;

use pmrxe_port::{PacketBuf, Port};
use pmrxe_transport::Instant;
use pmrxe_wire::{MacAddr, Psn};

use super::ports::Ports;
use super::{Tap, BURST};
use crate::gsi::{GsiFrame, GsiPipe, MAX_GSI_FRAME};
use crate::neigh::Neighbors;
use crate::stats::{bump, LcoreStats};

/// QP1 as one lcore serves it.
#[derive(Default)]
pub(super) struct Qp1 {
    /// The queues to and from the connection manager (None: QP1 frames are dropped).
    pub(super) pipe: Option<Arc<GsiPipe>>,
    /// PSN of the next MAD this lcore sends (receivers do not check it).
    psn: Psn,
}

impl Qp1 {
    /// MADs the connection manager queued for lcore `lcore`, built into frames on the port of
    /// their device (or its loopback queue). Returns whether any was taken, and a next hop to
    /// solicit (port index, address) when one was not resolved.
    /// Every pass: a look at the queue, inline; the work out of line.
    #[inline]
    pub(super) fn has_work(&self, lcore: usize) -> bool {
        self.pipe.as_ref().and_then(|p| p.tx.get(lcore)).is_some_and(|q| !q.is_empty())
    }

    /// Only after [`Qp1::has_work`].
    #[inline(never)]
    pub(super) fn transmit<L: Port>(&mut self, lcore: usize, ports: &mut Ports<L>, neigh: &Neighbors, stats: &LcoreStats, tap: Option<&dyn Tap>, now: Instant) -> (bool, Option<(usize, IpAddr)>) {
        let Some(q) = self.pipe.as_ref().and_then(|p| p.tx.get(lcore)) else {
            return (false, None);
        };
        let mut any = false;
        let mut unresolved = None;
        for _ in 0..BURST {
            let Some(out) = q.pop() else { break };
            any = true;
            let Some(pi) = ports.of_device(out.device) else {
                bump(&stats.cm_drops, 1);
                continue;
            };
            let port = &mut ports[pi];
            if port.tx.len() >= port.tx.capacity() || port.lo.len() >= port.lo.capacity() {
                bump(&stats.cm_drops, 1);
                continue;
            }
            let dst_ip = out.path.dgid.to_ip();
            let local = port.owns_ip(dst_ip);
            let dmac = if local { Some(port.dev.mac) } else { neigh.lookup(dst_ip, now.0) };
            let Some(dmac) = dmac else {
                bump(&stats.tx_no_neighbor, 1);
                bump(&stats.cm_drops, 1);
                unresolved = Some((pi, dst_ip));
                continue;
            };
            let Some(mut b) = port.alloc() else {
                bump(&stats.tx_alloc_failures, 1);
                bump(&stats.cm_drops, 1);
                continue;
            };
            let need = pmrxe_cm::gsi::mad_frame_len(dst_ip.is_ipv6());
            let Some(buf) = b.resize(need) else {
                bump(&stats.cm_drops, 1);
                continue;
            };
            self.psn = self.psn.wrapping_add(1);
            match pmrxe_cm::gsi::build_mad_frame_into(buf, &out.path, MacAddr(port.dev.mac), MacAddr(dmac), self.psn, &out.mad) {
                Ok(n) => {
                    let _ = b.resize(n);
                }
                Err(_) => {
                    bump(&stats.tx_build_errors, 1);
                    continue;
                }
            }
            if let Some(tap) = tap.filter(|t| t.active()) {
                tap.frame(true, Some(1), b.data());
            }
            bump(&stats.cm_tx, 1);
            if local {
                port.lo.push(b);
            } else {
                port.tx.push(b);
            }
        }
        (any, unresolved)
    }

    /// A valid RoCE frame for QP1 from device `device`: a copy goes to the connection
    /// manager's queue (fixed-size slots allocated up front; full or oversize → dropped and
    /// counted, the CM retransmits).
    pub(super) fn receive(&self, device: u32, data: &[u8], stats: &LcoreStats) {
        let Some(pipe) = &self.pipe else {
            bump(&stats.rx_unknown_qp, 1);
            return;
        };
        if data.len() > MAX_GSI_FRAME {
            bump(&stats.cm_drops, 1);
            return;
        }
        let mut f = GsiFrame { device, len: data.len() as u16, data: [0; MAX_GSI_FRAME] };
        f.data[..data.len()].copy_from_slice(data);
        if pipe.push_rx(f) {
            bump(&stats.cm_rx, 1);
        } else {
            bump(&stats.cm_drops, 1);
        }
    }
}
