//! Multicast: the groups of each port (set by the service on `ibv_attach_mcast` /
//! `ibv_detach_mcast`), delivery of a received datagram to every attached QP, the copy a
//! sending port loops back to its own members, and IGMPv2 (a report when a group appears on a
//! port, a leave when it goes, reports in answer to a router's queries).
//!
//! A datagram for a group is a UD SEND to QPN 0xFFFFFF whose IP destination is the group. It
//! is checked once (P_Key, opcode, ICRC) and then placed for each attached QP of this lcore as
//! its own datagram would be (Q_Key, receive WQE and length checks per QP, counted per QP);
//! an lcore that receives one for QPs of other lcores hands each of them a copy.
use std::net::IpAddr;

use pmrxe_port::{PacketBuf, Port};
use pmrxe_transport::{Instant, RxPacket};
use pmrxe_wire::{self as wire, MacAddr};

use super::ports::{McastGroup, PortSlot};
use super::Lcore;
use crate::stats::{bump, LcoreStats};

impl<L: Port> Lcore<L> {
    /// `Cmd::McastGroup`.
    pub(super) fn set_group(&mut self, device: u32, gid: [u8; 16], members: Vec<u32>, announce: bool) {
        let Some(pi) = self.ports.of_device(device) else { return };
        let groups = &mut self.ports[pi].groups;
        let at = groups.iter().position(|g| g.gid == gid);
        let change = match (at, members.is_empty()) {
            (Some(i), true) => {
                let _ = self.grave.send(Box::new(groups.swap_remove(i).members));
                Some(false)
            }
            (Some(i), false) => {
                let old = std::mem::replace(&mut groups[i].members, members);
                let _ = self.grave.send(Box::new(old));
                None
            }
            (None, false) => {
                groups.push(McastGroup { gid, members });
                Some(true)
            }
            (None, true) => None,
        };
        if let (Some(join), true) = (change, announce) {
            if let Some(group) = wire::mcast::gid_ipv4_group(&gid) {
                self.send_igmp(pi, group, join);
            }
        }
    }

    /// An IGMPv2 report (`join`) or leave for `group`, from the port's first IPv4 address.
    fn send_igmp(&mut self, pi: usize, group: std::net::Ipv4Addr, join: bool) {
        let Some(IpAddr::V4(src)) = self.ports[pi].ips.iter().copied().find(IpAddr::is_ipv4) else { return };
        let mac = MacAddr(self.ports[pi].dev.mac);
        self.emit_control(pi, |buf| wire::mcast::emit_igmp_frame(buf, mac, src, group, join).ok());
        bump(&self.stats.igmp_sent, 1);
    }

    /// A frame that is neither RoCE nor ARP/ND: if it is an IGMP query and this port has
    /// groups, answer with a report for each group the query asks about. (The lcore that
    /// receives the query answers; every lcore knows every group of its ports.) Returns whether
    /// the frame was a query.
    pub(super) fn on_igmp(&mut self, pi: usize, data: &[u8]) -> bool {
        if self.ports[pi].groups.is_empty() {
            return false;
        }
        let Some(asked) = wire::mcast::parse_igmp_query(data) else { return false };
        for i in 0..self.ports[pi].groups.len() {
            let Some(group) = wire::mcast::gid_ipv4_group(&self.ports[pi].groups[i].gid) else { continue };
            if asked.is_none_or(|a| a == group) {
                self.send_igmp(pi, group, true);
            }
        }
        true
    }

    /// A parsed RoCE frame addressed to a multicast group (BTH destination QP 0xFFFFFF, IP
    /// destination a group): delivered to every QP of this lcore attached to the group on
    /// port `pi`, and (when `may_hand_off`: not for a copy handed over) copied to every other
    /// lcore that owns one.
    pub(super) fn on_multicast(&mut self, pi: usize, now: Instant, data: &[u8], pkt: &mut RxPacket<'_>, may_hand_off: bool) {
        let Some(gi) = self.ports[pi].groups.iter().position(|g| g.gid == pkt.frame.dst_gid) else {
            bump(&self.stats.rx_not_for_us, 1);
            return;
        };
        let op = pkt.hdr.bth.opcode;
        if pkt.hdr.bth.pkey & 0x7fff != 0x7fff || !(op == wire::Opcode::UD_SEND_ONLY || op == wire::Opcode::UD_SEND_ONLY_WITH_IMMEDIATE) || pkt.hdr.deth.is_none() {
            bump(&self.stats.rx_malformed, 1);
            return;
        }
        // Checked once here, for every copy.
        if !pkt.frame.check.verify(pkt.frame.payload) {
            self.count_bad_icrc();
            return;
        }
        pkt.deferred = false;
        bump(&self.stats.rx_multicast, 1);
        let lcores = self.handoff.as_ref().map_or(1, |h| h.lcores());
        let me = self.index % lcores;
        let mut others: u64 = 0;
        for k in 0..self.ports[pi].groups[gi].members.len() {
            let qpn = self.ports[pi].groups[gi].members[k];
            let owner = qpn as usize % lcores;
            if owner != me {
                if may_hand_off {
                    others |= 1 << owner;
                }
                continue;
            }
            let Some(at) = self.engine.slot(qpn) else { continue };
            if self.engine.ext_at(at).is_none_or(|s| s.dev != pi) {
                continue;
            }
            self.pull_recv_wqes(qpn, at);
            bump(&self.stats.rx_multicast_copies, 1);
            let mut cq = self.cq.writer(&self.stats);
            self.engine.receive(now, at, pi as u32, data, pkt, false, &*self.mem, &mut cq);
        }
        for o in (0..lcores).filter(|o| others & (1 << o) != 0) {
            let Some(mut b) = self.ports[pi].alloc() else {
                bump(&self.stats.tx_alloc_failures, 1);
                continue;
            };
            match b.resize(data.len()) {
                Some(room) => {
                    room.copy_from_slice(data);
                    self.hand_over(o, pi, b);
                }
                None => self.ports[pi].give_back(b),
            }
        }
    }
}

/// After a burst's frames are sealed: a multicast datagram the port sends to a group that
/// QPs of the same port are attached to is also looped back to them (a copy into the port's
/// loopback queue, received next pass), as a NIC delivers multicast to its own port's members.
pub(super) fn loop_back_multicast<L: Port>(port: &mut PortSlot<L>, frame_at: usize, stats: &LcoreStats) {
    if port.groups.is_empty() || port.lo.is_full() {
        return;
    }
    let data = port.tx[frame_at].data();
    let Some(gid) = wire::frame::dst_gid(data) else { return };
    if !port.groups.iter().any(|g| g.gid == gid) {
        return;
    }
    let Some(mut b) = port.alloc() else {
        bump(&stats.tx_alloc_failures, 1);
        return;
    };
    let len = port.tx[frame_at].data().len();
    match b.resize(len) {
        Some(room) => {
            room.copy_from_slice(port.tx[frame_at].data());
            port.lo.push(b);
            bump(&stats.tx_multicast_loopback, 1);
        }
        None => port.give_back(b),
    }
}
