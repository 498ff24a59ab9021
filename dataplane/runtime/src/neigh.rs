//! Neighbours: IP → MAC, from static config entries and learned from ARP/ND and from received
//! RoCE frames.
//!
//! Bounded and hashed: at most [`MAX_NEIGHBORS`] entries, reserved up front (lookups and
//! updates never allocate), found by hash rather than by a linear scan. Learned entries expire
//! [`NEIGH_TTL_NS`] after they were last confirmed. What gets in is limited to addresses this
//! host talks to: a solicitation we sent (`want`), a peer resolving one of our addresses (its
//! ARP request / neighbour solicitation), or a valid RoCE frame for one of our QPs — an
//! unsolicited ARP reply for an address nobody asked about is ignored, so a sender on the
//! segment cannot fill the table. When full, the oldest learned entry makes room; static
//! entries are never replaced or expired. Lookups are rare: QPs cache their resolved path
//! (stamped with [`Neighbors::generation`]).
use std::collections::HashMap;
use std::net::IpAddr;

/// Capacity of the table.
pub const MAX_NEIGHBORS: usize = 1024;
/// Capacity of the set of addresses being resolved.
pub const MAX_WANTED: usize = 256;
/// Lifetime of a learned entry after its last confirmation.
pub const NEIGH_TTL_NS: u64 = 60_000_000_000;
/// How long an unanswered solicitation keeps its address wanted.
pub const WANT_TTL_NS: u64 = 3_000_000_000;

#[derive(Clone, Copy, Debug)]
struct Entry {
    mac: [u8; 6],
    fixed: bool,
    /// Last confirmation (ns, the lcore clock).
    at: u64,
}

/// The neighbour table of one lcore.
#[derive(Debug)]
pub struct Neighbors {
    entries: HashMap<IpAddr, Entry>,
    /// Addresses we solicited, with when.
    wanted: HashMap<IpAddr, u64>,
    /// Bumped on every change: path caches built at an older generation are rebuilt.
    generation: u64,
}

impl Neighbors {
    /// An empty table with its capacity reserved.
    pub fn new() -> Neighbors {
        // Twice the bound: churn (remove + insert at the bound) rehashes in place, never grows.
        Neighbors { entries: HashMap::with_capacity(2 * MAX_NEIGHBORS), wanted: HashMap::with_capacity(2 * MAX_WANTED), generation: 1 }
    }
    /// A static entry (never replaced by learning, never expires).
    pub fn add_static(&mut self, ip: IpAddr, mac: [u8; 6]) {
        self.generation += 1;
        if self.entries.len() >= MAX_NEIGHBORS && !self.entries.contains_key(&ip) && !self.evict_oldest() {
            return;
        }
        self.entries.insert(ip, Entry { mac, fixed: true, at: 0 });
    }
    /// `ip` is being resolved (we sent an ARP request / neighbour solicitation for it): an
    /// answer for it will be learned.
    pub fn want(&mut self, ip: IpAddr, now: u64) {
        if self.wanted.len() >= MAX_WANTED && !self.wanted.contains_key(&ip) {
            self.wanted.retain(|_, t| now.saturating_sub(*t) < WANT_TTL_NS);
            if self.wanted.len() >= MAX_WANTED {
                return;
            }
        }
        self.wanted.insert(ip, now);
    }
    /// Learn `ip` at `mac` because this host talks to it (a frame for one of our QPs, a peer
    /// resolving our address). Static entries are not changed.
    pub fn learn(&mut self, ip: IpAddr, mac: [u8; 6], now: u64) {
        self.wanted.remove(&ip);
        if let Some(e) = self.entries.get_mut(&ip) {
            if !e.fixed {
                if e.mac != mac {
                    e.mac = mac;
                    self.generation += 1;
                }
                e.at = now;
            }
            return;
        }
        if self.entries.len() >= MAX_NEIGHBORS && !self.evict_oldest() {
            return;
        }
        self.entries.insert(ip, Entry { mac, fixed: false, at: now });
        self.generation += 1;
    }
    /// An answer (ARP reply, neighbour advertisement): learned only if we asked for `ip` or
    /// already know it (then it refreshes or updates the entry). Returns whether it was taken.
    pub fn answer(&mut self, ip: IpAddr, mac: [u8; 6], now: u64) -> bool {
        if self.wanted.contains_key(&ip) || self.entries.contains_key(&ip) {
            self.learn(ip, mac, now);
            true
        } else {
            false
        }
    }
    /// The MAC of `ip`, if known and not expired.
    pub fn lookup(&self, ip: IpAddr, now: u64) -> Option<[u8; 6]> {
        self.entries.get(&ip).filter(|e| e.fixed || now.saturating_sub(e.at) < NEIGH_TTL_NS).map(|e| e.mac)
    }
    /// Changes so far (a path cache stamped with an older value is stale).
    pub fn generation(&self) -> u64 {
        self.generation
    }
    /// Number of entries (static and learned, expired ones until evicted).
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// Empty?
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Make room: drop the learned entry confirmed longest ago (control path: only when full).
    fn evict_oldest(&mut self) -> bool {
        let Some(ip) = self.entries.iter().filter(|(_, e)| !e.fixed).min_by_key(|(_, e)| e.at).map(|(ip, _)| *ip) else { return false };
        self.entries.remove(&ip);
        self.generation += 1;
        true
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
        n.learn(ip, [9; 6], 5);
        assert_eq!(n.lookup(ip, u64::MAX), Some([2, 0, 0, 0, 0, 2]), "static: never replaced, never expires");
        let other: IpAddr = "10.0.0.9".parse().unwrap();
        n.learn(other, [7; 6], 1);
        let g = n.generation();
        n.learn(other, [8; 6], 2);
        assert!(n.generation() > g, "a changed MAC invalidates cached paths");
        assert_eq!(n.lookup(other, 3), Some([8; 6]));
        assert_eq!(n.lookup(other, 2 + NEIGH_TTL_NS), None, "learned entries expire");
        assert_eq!(gid_to_ip(&ip_to_gid(ip)), ip);
        let v6: IpAddr = "fd00::5".parse().unwrap();
        assert_eq!(gid_to_ip(&ip_to_gid(v6)), v6);
    }

    #[test]
    fn unsolicited_answers_are_ignored_and_the_table_stays_bounded() {
        let mut n = Neighbors::new();
        let asked: IpAddr = "10.0.0.1".parse().unwrap();
        let stranger: IpAddr = "10.0.0.2".parse().unwrap();
        n.want(asked, 0);
        assert!(n.answer(asked, [1; 6], 1));
        assert!(!n.answer(stranger, [2; 6], 1), "nobody asked for it");
        assert_eq!(n.lookup(stranger, 1), None);
        let fixed: IpAddr = "10.9.9.9".parse().unwrap();
        n.add_static(fixed, [3; 6]);
        // A flood of peers resolving our address: the oldest learned entries make room, the
        // table never grows past its capacity and static entries stay.
        for i in 0..(3 * MAX_NEIGHBORS as u32) {
            n.learn(IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 + i)), [4; 6], 10 + i as u64);
        }
        assert_eq!(n.len(), MAX_NEIGHBORS);
        assert_eq!(n.lookup(fixed, 0), Some([3; 6]));
        assert_eq!(n.lookup(asked, 2), None, "the oldest learned entry was evicted");
    }
}
