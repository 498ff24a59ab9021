//! The service's multicast groups: which UD QPs are attached to which group on which device,
//! shared by every session (two clients may attach QPs to one group), with the limits
//! [`McastLimits`] reports enforced here. The lcores get each group's member list whenever it
//! changes (`Cmd::McastGroup`); this table is the only writer.

use std::collections::HashMap;

use pmrxe_abi::McastLimits;

/// One attachment: a QP and the client that owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Member {
    qpn: u32,
    client: u32,
}

/// Every group with attached QPs, per device.
#[derive(Default)]
pub struct McastTable {
    groups: HashMap<(u32, [u8; 16]), Vec<Member>>,
}

/// A refusal: errno and why.
pub type Refusal = (i32, &'static str);

impl McastTable {
    /// Attach `qpn` of `client` to `gid` on `device`. `Ok(Some(members))`: the group's new
    /// member QPNs; `Ok(None)`: it was attached already (nothing changes, as in the kernel).
    pub fn attach(&mut self, device: u32, gid: [u8; 16], qpn: u32, client: u32) -> Result<Option<Vec<u32>>, Refusal> {
        if let Some(m) = self.groups.get(&(device, gid)) {
            if m.iter().any(|x| x.qpn == qpn) {
                return Ok(None);
            }
            if m.len() as u32 >= McastLimits::QPS_PER_GROUP {
                return Err((libc::ENOMEM, "the group has max_mcast_qp_attach QPs attached"));
            }
        } else if self.groups.keys().filter(|(d, _)| *d == device).count() as u32 >= McastLimits::GROUPS {
            return Err((libc::ENOMEM, "the device has max_mcast_grp groups"));
        }
        let (mut total, mut mine, mut my_groups) = (0u32, 0u32, 0u32);
        for ((d, _), m) in &self.groups {
            if *d == device {
                total += m.len() as u32;
                let n = m.iter().filter(|x| x.client == client).count() as u32;
                mine += n;
                my_groups += u32::from(n > 0);
            }
        }
        let new_group_for_me = self.groups.get(&(device, gid)).is_none_or(|m| !m.iter().any(|x| x.client == client));
        if total >= McastLimits::TOTAL {
            return Err((libc::ENOMEM, "the device has max_total_mcast_qp_attach attachments"));
        }
        if mine >= McastLimits::PER_CLIENT {
            return Err((libc::ENOMEM, "this client holds its share of the device's multicast attachments"));
        }
        if new_group_for_me && my_groups >= McastLimits::GROUPS_PER_CLIENT {
            return Err((libc::ENOMEM, "this client's QPs are members of their share of the device's groups"));
        }
        let m = self.groups.entry((device, gid)).or_default();
        m.push(Member { qpn, client });
        Ok(Some(qpns(m)))
    }

    /// Detach `qpn` from `gid` on `device`: the group's remaining member QPNs (empty: the
    /// group is gone). EINVAL when it was not attached.
    pub fn detach(&mut self, device: u32, gid: [u8; 16], qpn: u32) -> Result<Vec<u32>, Refusal> {
        let Some(m) = self.groups.get_mut(&(device, gid)) else { return Err((libc::EINVAL, "the QP is not attached to that group")) };
        let Some(i) = m.iter().position(|x| x.qpn == qpn) else { return Err((libc::EINVAL, "the QP is not attached to that group")) };
        m.remove(i);
        let left = qpns(m);
        if left.is_empty() {
            self.groups.remove(&(device, gid));
        }
        Ok(left)
    }

    /// Detach `qpn` (destroyed, or its client gone) from every group of `device`: each group
    /// it left, with its remaining members.
    pub fn detach_qp(&mut self, device: u32, qpn: u32) -> Vec<([u8; 16], Vec<u32>)> {
        let gids: Vec<[u8; 16]> = self.groups.iter().filter(|((d, _), m)| *d == device && m.iter().any(|x| x.qpn == qpn)).map(|((_, g), _)| *g).collect();
        gids.into_iter().filter_map(|g| self.detach(device, g, qpn).ok().map(|left| (g, left))).collect()
    }

    /// The groups `qpn` on `device` is attached to.
    pub fn groups_of(&self, device: u32, qpn: u32) -> usize {
        self.groups.iter().filter(|((d, _), m)| *d == device && m.iter().any(|x| x.qpn == qpn)).count()
    }

    /// Groups and attachments, for `pmrxe stats`: (groups, attachments) over all devices.
    pub fn counts(&self) -> (usize, usize) {
        (self.groups.len(), self.groups.values().map(Vec::len).sum())
    }
}

fn qpns(m: &[Member]) -> Vec<u32> {
    m.iter().map(|x| x.qpn).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: u32) -> [u8; 16] {
        std::net::Ipv4Addr::from(0xef00_0000 | n).to_ipv6_mapped().octets()
    }

    #[test]
    fn attach_detach_and_the_member_lists() {
        let mut t = McastTable::default();
        assert_eq!(t.attach(0, g(1), 20, 1), Ok(Some(vec![20])));
        assert_eq!(t.attach(0, g(1), 20, 1), Ok(None), "attaching twice changes nothing");
        assert_eq!(t.attach(0, g(1), 21, 2), Ok(Some(vec![20, 21])));
        assert_eq!(t.attach(1, g(1), 22, 2), Ok(Some(vec![22])), "groups are per device");
        assert_eq!(t.counts(), (2, 3));
        assert_eq!(t.detach(0, g(1), 22).unwrap_err().0, libc::EINVAL, "22 is attached on device 1");
        assert_eq!(t.detach(0, g(1), 20), Ok(vec![21]));
        assert_eq!(t.detach(0, g(1), 20).unwrap_err().0, libc::EINVAL);
        assert_eq!(t.detach(0, g(1), 21), Ok(vec![]));
        assert_eq!(t.counts(), (1, 1));
        assert_eq!(t.attach(0, g(2), 30, 1), Ok(Some(vec![30])));
        assert_eq!(t.attach(0, g(3), 30, 1), Ok(Some(vec![30])));
        assert_eq!(t.groups_of(0, 30), 2);
        let mut left = t.detach_qp(0, 30);
        left.sort();
        assert_eq!(left, vec![(g(2), vec![]), (g(3), vec![])]);
        assert_eq!(t.counts(), (1, 1));
    }

    #[test]
    fn every_limit_is_enforced() {
        let mut t = McastTable::default();
        for q in 0..McastLimits::QPS_PER_GROUP {
            t.attach(0, g(1), 100 + q, q % 4).unwrap();
        }
        assert_eq!(t.attach(0, g(1), 99, 9).unwrap_err().0, libc::ENOMEM, "max_mcast_qp_attach");
        // One client: its share of the groups, then refused, while another client still gets in.
        let mut t = McastTable::default();
        for n in 0..McastLimits::GROUPS_PER_CLIENT {
            t.attach(0, g(n), 7, 1).unwrap();
        }
        assert_eq!(t.attach(0, g(5000), 7, 1).unwrap_err().0, libc::ENOMEM, "per-client share of the groups");
        assert_eq!(t.attach(0, g(0), 70, 1), Ok(Some(vec![7, 70])), "a group it is in takes more of its QPs");
        assert_eq!(t.attach(0, g(5000), 8, 2), Ok(Some(vec![8])));
        assert_eq!(t.attach(1, g(5001), 7, 1), Ok(Some(vec![7])), "the share is per device");
        // One client: its share of the attachments.
        let mut t = McastTable::default();
        let mut q = 0;
        'fill: for n in 0..McastLimits::GROUPS_PER_CLIENT {
            for _ in 0..McastLimits::QPS_PER_GROUP {
                if q == McastLimits::PER_CLIENT {
                    break 'fill;
                }
                t.attach(0, g(n), q, 1).unwrap();
                q += 1;
            }
        }
        assert_eq!(t.attach(0, g(0), 99_999, 1).unwrap_err().0, libc::ENOMEM, "per-client share of the attachments");
        assert_eq!(t.attach(0, g(300), 99_999, 2), Ok(Some(vec![99_999])));
        // Groups per device.
        let mut t = McastTable::default();
        for n in 0..McastLimits::GROUPS {
            t.attach(0, g(n), n, n % 8).unwrap();
        }
        assert_eq!(t.attach(0, g(9999), 1, 1).unwrap_err().0, libc::ENOMEM, "max_mcast_grp");
        assert_eq!(t.attach(0, g(0), 5000, 1), Ok(Some(vec![0, 5000])), "an existing group still takes members");
        // Total attachments per device.
        let mut t = McastTable::default();
        let mut n = 0;
        for client in 0..8 {
            for q in 0..McastLimits::TOTAL / 8 {
                t.attach(0, g(q % 200), client * 10_000 + q, client).unwrap();
                n += 1;
            }
        }
        assert_eq!(n, McastLimits::TOTAL);
        assert_eq!(t.attach(0, g(1), 99_999, 42).unwrap_err().0, libc::ENOMEM, "max_total_mcast_qp_attach");
    }
}
