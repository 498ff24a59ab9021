//! Neighbours: IP → MAC, from static config entries and learned from ARP and from received
//! RoCE frames. Fixed capacity, reserved up front: lookups and updates never allocate.
use std::net::IpAddr;

/// Capacity of the table.
pub const MAX_NEIGHBORS: usize = 1024;

/// The neighbour table of one lcore.
#[derive(Debug)]
pub struct Neighbors {
    entries: Vec<(IpAddr, [u8; 6], bool)>, // (ip, mac, static)
    /// Bumped on every change: path caches built at an older generation are rebuilt.
    generation: u64,
}

impl Neighbors {
    /// An empty table with its capacity reserved.
    pub fn new() -> Neighbors {
        Neighbors { entries: Vec::with_capacity(MAX_NEIGHBORS), generation: 1 }
    }
    /// A static entry (never replaced by learning).
    pub fn add_static(&mut self, ip: IpAddr, mac: [u8; 6]) {
        self.generation += 1;
        self.entries.retain(|e| e.0 != ip);
        if self.entries.len() < MAX_NEIGHBORS {
            self.entries.push((ip, mac, true));
        }
    }
    /// Learn `ip` at `mac` (ignored for static entries; when full, the oldest learned entry
    /// is replaced).
    pub fn learn(&mut self, ip: IpAddr, mac: [u8; 6]) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.0 == ip) {
            if !e.2 && e.1 != mac {
                e.1 = mac;
                self.generation += 1;
            }
            return;
        }
        self.generation += 1;
        if self.entries.len() < MAX_NEIGHBORS {
            self.entries.push((ip, mac, false));
        } else if let Some(i) = self.entries.iter().position(|e| !e.2) {
            self.entries[i] = (ip, mac, false);
        }
    }
    /// Changes so far (a path cache stamped with an older value is stale).
    pub fn generation(&self) -> u64 {
        self.generation
    }
    /// The MAC of `ip`, if known.
    pub fn lookup(&self, ip: IpAddr) -> Option<[u8; 6]> {
        self.entries.iter().find(|e| e.0 == ip).map(|e| e.1)
    }
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// Empty?
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Default for Neighbors {
    fn default() -> Self {
        Neighbors::new()
    }
}

/// The IP address a RoCEv2 GID stands for (IPv4-mapped → IPv4).
pub fn gid_to_ip(gid: &[u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The RoCEv2 GID of an IP address (IPv4 → IPv4-mapped IPv6).
pub fn ip_to_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_entries_win_over_learning_and_gids_map_both_ways() {
        let mut n = Neighbors::new();
        let ip: IpAddr = "198.18.0.2".parse().unwrap();
        n.add_static(ip, [2, 0, 0, 0, 0, 2]);
        n.learn(ip, [9; 6]);
        assert_eq!(n.lookup(ip), Some([2, 0, 0, 0, 0, 2]));
        let other: IpAddr = "10.0.0.9".parse().unwrap();
        n.learn(other, [7; 6]);
        n.learn(other, [8; 6]);
        assert_eq!(n.lookup(other), Some([8; 6]));
        assert_eq!(gid_to_ip(&ip_to_gid(ip)), ip);
        let v6: IpAddr = "fd00::5".parse().unwrap();
        assert_eq!(gid_to_ip(&ip_to_gid(v6)), v6);
    }
}
