//! `ibv_attach_mcast` / `ibv_detach_mcast`: a client attaches its own UD QPs to multicast
//! groups of their device; the service-wide table ([`crate::mcast`]) enforces the limits, and
//! every change of a group's members reaches the lcores (`Cmd::McastGroup`) in the order the
//! table made them (sent under its lock).

use pmrxe_abi::ctrl::Response;
use pmrxe_runtime::lcore::Cmd;
use pmrxe_wire::mcast::is_multicast_gid;

use super::{err, Reply, Session, Shared};

impl Session {
    pub(super) fn attach_mcast(&mut self, qpn: u32, gid: [u8; 16]) -> Reply {
        let Some(q) = self.objs.qps.get(&qpn) else { return (err(libc::EINVAL, "no such QP"), vec![]) };
        if !q.ud {
            return (err(libc::EINVAL, "only UD QPs attach to multicast groups"), vec![]);
        }
        if !is_multicast_gid(&gid) {
            return (err(libc::EINVAL, "not a multicast GID (IPv4-mapped 224.0.0.0/4 or ff00::/8)"), vec![]);
        }
        let device = q.device;
        let sh = self.shared.clone();
        let mut t = sh.mcast.lock().unwrap_or_else(|e| e.into_inner());
        match t.attach(device, gid, qpn, self.id) {
            Ok(Some(members)) => {
                sh.publish_group(device, gid, members);
                (Response::Ok, vec![])
            }
            Ok(None) => (Response::Ok, vec![]),
            Err((e, why)) => (err(e, why), vec![]),
        }
    }

    pub(super) fn detach_mcast(&mut self, qpn: u32, gid: [u8; 16]) -> Reply {
        let Some(q) = self.objs.qps.get(&qpn) else { return (err(libc::EINVAL, "no such QP"), vec![]) };
        let device = q.device;
        let sh = self.shared.clone();
        let mut t = sh.mcast.lock().unwrap_or_else(|e| e.into_inner());
        match t.detach(device, gid, qpn) {
            Ok(members) => {
                sh.publish_group(device, gid, members);
                (Response::Ok, vec![])
            }
            Err((e, why)) => (err(e, why), vec![]),
        }
    }

    /// `qpn` (being destroyed, or its client gone) leaves every group it is attached to.
    pub(super) fn leave_all_groups(&mut self, qpn: u32) {
        let Some(q) = self.objs.qps.get(&qpn) else { return };
        if !q.ud {
            return;
        }
        let device = q.device;
        let sh = self.shared.clone();
        let mut t = sh.mcast.lock().unwrap_or_else(|e| e.into_inner());
        for (gid, members) in t.detach_qp(device, qpn) {
            sh.publish_group(device, gid, members);
        }
    }
}

impl Shared {
    /// Tell every lcore the members of `gid` on `device` (every lcore may receive the group's
    /// datagrams on its own queue); the device's own lcore sends the IGMP messages. Called
    /// with the table locked, so the lcores see the changes in the table's order.
    fn publish_group(&self, device: u32, gid: [u8; 16], members: Vec<u32>) {
        let announcer = self.device_lcore.get(device as usize).copied().unwrap_or(0);
        for (i, lc) in self.lcores.iter().enumerate() {
            let _ = lc.cmds.send(Cmd::McastGroup { device, gid, members: members.clone(), announce: i == announcer });
        }
    }
}
