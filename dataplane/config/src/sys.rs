//! [`SystemInfo`]: the facts about this machine that validation needs (CPU count, free
//! hugepages). Probed from `/sys` and `/proc`; tests build one by hand so results do not
//! depend on the machine.

/// Machine facts used by [`crate::Config::validate_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemInfo {
    /// Number of CPU ids (highest online CPU id + 1).
    pub cpus: u32,
    /// Free hugepages of the default size (`HugePages_Free` in /proc/meminfo).
    pub hugepages_free: u64,
    /// Default hugepage size in KiB (`Hugepagesize`).
    pub hugepage_kb: u64,
}

impl SystemInfo {
    /// Reads this machine. Falls back to `available_parallelism` and "no hugepages" when
    /// `/sys` or `/proc` cannot be read.
    pub fn probe() -> SystemInfo {
        let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|s| parse_cpu_list_max(&s))
            .map(|max| max + 1)
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get() as u32))
            .unwrap_or(1);
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        SystemInfo {
            cpus,
            hugepages_free: meminfo_value(&meminfo, "HugePages_Free").unwrap_or(0),
            hugepage_kb: meminfo_value(&meminfo, "Hugepagesize").unwrap_or(2048),
        }
    }

    /// Free hugepage memory in MiB.
    pub fn hugepages_free_mb(&self) -> u64 {
        self.hugepages_free * self.hugepage_kb / 1024
    }
}

/// Highest CPU id in a kernel CPU list such as `0-3,8,10-11`.
pub(crate) fn parse_cpu_list_max(s: &str) -> Option<u32> {
    s.trim()
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| p.rsplit('-').next().unwrap_or(p).trim().parse::<u32>().ok())
        .try_fold(None, |acc: Option<u32>, v| v.map(|v| Some(acc.map_or(v, |a| a.max(v)))))?
}

/// The number after `key:` in /proc/meminfo text.
pub(crate) fn meminfo_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        if k.trim() != key {
            return None;
        }
        v.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_list() {
        assert_eq!(parse_cpu_list_max("0-1\n"), Some(1));
        assert_eq!(parse_cpu_list_max("0-3,8,10-11"), Some(11));
        assert_eq!(parse_cpu_list_max("0"), Some(0));
        assert_eq!(parse_cpu_list_max("x"), None);
    }

    #[test]
    fn meminfo() {
        let t = "MemTotal: 100 kB\nHugePages_Free:      12\nHugepagesize:       2048 kB\n";
        assert_eq!(meminfo_value(t, "HugePages_Free"), Some(12));
        assert_eq!(meminfo_value(t, "Hugepagesize"), Some(2048));
        assert_eq!(meminfo_value(t, "Nope"), None);
    }

    #[test]
    fn probe_is_sane() {
        let s = SystemInfo::probe();
        assert!(s.cpus >= 1);
        assert!(s.hugepage_kb > 0);
    }
}
