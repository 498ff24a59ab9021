//! Validation: deserializer errors turned into one-line [`ConfigError`]s with key paths, and
//! every cross-field and machine-dependent rule of the schema.

use std::collections::HashSet;

use crate::{Config, ConfigError, PortKind, SystemInfo};

/// 1-based line number of byte offset `pos` in `text`.
fn line_of(text: &str, pos: usize) -> usize {
    text.as_bytes().iter().take(pos).filter(|&&b| b == b'\n').count() + 1
}

/// Converts a path-tracking TOML deserializer error into a [`ConfigError`].
pub(crate) fn map_de_error(
    text: &str,
    e: serde_path_to_error::Error<toml::de::Error>,
) -> ConfigError {
    let mut path = e.path().to_string();
    if path == "." || path == "?" {
        path.clear();
    }
    let inner = e.into_inner();
    let line = inner.span().map(|s| line_of(text, s.start));
    let message = inner.message().to_string();
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let key = rest.split('`').next().unwrap_or(rest).to_string();
        // serde_path_to_error may or may not have pushed the unknown key onto the path.
        let table = match path.strip_suffix(&key) {
            Some(t) => t.trim_end_matches('.').to_string(),
            None => path,
        };
        return ConfigError::UnknownKey { key, table, line };
    }
    if path.is_empty() {
        return ConfigError::Syntax { line, message };
    }
    ConfigError::Invalid { field: path, message }
}

/// The `[ports.congestion]` ranges: (key, message) of the first bad value.
fn validate_congestion(c: &crate::CongestionConfig) -> Result<(), (&'static str, String)> {
    if c.cnp_interval_us > 1_000_000 {
        return Err(("cnp_interval_us", format!("{} is outside 0..=1000000", c.cnp_interval_us)));
    }
    if c.cnp_dscp > 63 {
        return Err(("cnp_dscp", format!("{} is outside 0..=63", c.cnp_dscp)));
    }
    if !(1..=1_000_000).contains(&c.line_rate_mbps) {
        return Err(("line_rate_mbps", format!("{} is outside 1..=1000000", c.line_rate_mbps)));
    }
    if c.min_rate_mbps == 0 || c.min_rate_mbps > c.line_rate_mbps {
        return Err(("min_rate_mbps", format!("{} is outside 1..=line_rate_mbps ({})", c.min_rate_mbps, c.line_rate_mbps)));
    }
    if !(c.alpha_g > 0.0 && c.alpha_g <= 1.0) {
        return Err(("alpha_g", format!("{} is outside (0, 1]", c.alpha_g)));
    }
    if !(0.0..=1.0).contains(&c.initial_alpha) {
        return Err(("initial_alpha", format!("{} is outside [0, 1]", c.initial_alpha)));
    }
    for (k, v) in [("alpha_timer_us", c.alpha_timer_us), ("rate_increase_timer_us", c.rate_increase_timer_us)] {
        if !(1..=1_000_000).contains(&v) {
            return Err((k, format!("{v} is outside 1..=1000000")));
        }
    }
    if c.rate_reduce_period_us > 1_000_000 {
        return Err(("rate_reduce_period_us", format!("{} is outside 0..=1000000", c.rate_reduce_period_us)));
    }
    if c.byte_counter == 0 {
        return Err(("byte_counter", "must be at least 1".into()));
    }
    if c.fast_recovery_steps == 0 || c.fast_recovery_steps > 1000 {
        return Err(("fast_recovery_steps", format!("{} is outside 1..=1000", c.fast_recovery_steps)));
    }
    for (k, v) in [("ai_rate_mbps", c.ai_rate_mbps), ("hai_rate_mbps", c.hai_rate_mbps)] {
        if v > c.line_rate_mbps {
            return Err((k, format!("{v} is above line_rate_mbps ({})", c.line_rate_mbps)));
        }
    }
    Ok(())
}

/// True for `DDDD:BB:DD.F` or `BB:DD.F` (hex digits).
pub(crate) fn is_pci_addr(s: &str) -> bool {
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
    let (dom_bus_dev, func) = match s.rsplit_once('.') {
        Some(x) => x,
        None => return false,
    };
    if !(func.len() == 1 && func.bytes().all(|b| (b'0'..=b'7').contains(&b))) {
        return false;
    }
    let parts: Vec<&str> = dom_bus_dev.split(':').collect();
    match parts.as_slice() {
        [d, b, v] => hex(d, 4) && hex(b, 2) && hex(v, 2),
        [b, v] => hex(b, 2) && hex(v, 2),
        _ => false,
    }
}

fn valid_ident(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

fn inv(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::invalid(field, message)
}

pub(crate) fn validate(cfg: &Config, sys: &SystemInfo) -> Result<(), ConfigError> {

    // [service]
    if cfg.service.socket.as_os_str().is_empty() {
        return Err(inv("service.socket", "must not be empty"));
    }
    if cfg.service.log.trim().is_empty() {
        return Err(inv("service.log", "must not be empty"));
    }
    if cfg.service.idle.max_sleep_us > 1_000_000 {
        return Err(inv(
            "service.idle.max_sleep_us",
            format!("{} is above the 1000000 us maximum", cfg.service.idle.max_sleep_us),
        ));
    }
    if cfg.service.idle.spin_us > 1_000_000 {
        return Err(inv("service.idle.spin_us", format!("{} is above the 1000000 us maximum", cfg.service.idle.spin_us)));
    }

    // [eal]
    let eal = &cfg.eal;
    if !(64..=1_048_576).contains(&eal.memory_mb) {
        return Err(inv("eal.memory_mb", format!("{} is outside 64..=1048576", eal.memory_mb)));
    }
    if let Some(p) = &eal.file_prefix {
        if !valid_ident(p) {
            return Err(inv(
                "eal.file_prefix",
                format!("invalid prefix {p:?} (use 1-63 of [A-Za-z0-9_.-])"),
            ));
        }
    }
    if let Some(l) = &eal.log_level {
        if l.trim().is_empty() || l.contains(char::is_whitespace) {
            return Err(inv("eal.log_level", format!("invalid log level {l:?}")));
        }
    }
    if eal.hugepages {
        let free_mb = sys.hugepages_free_mb();
        if sys.hugepages_free == 0 {
            return Err(inv(
                "eal.hugepages",
                "hugepages requested but none are free (HugePages_Free = 0); run scripts/hugepages.sh reserve N or set hugepages = false",
            ));
        }
        if u64::from(eal.memory_mb) > free_mb {
            return Err(inv(
                "eal.memory_mb",
                format!(
                    "{} MiB of hugepages requested but only {free_mb} MiB are free (HugePages_Free = {})",
                    eal.memory_mb, sys.hugepages_free
                ),
            ));
        }
    }

    // [lcores]
    let lc = &cfg.lcores;
    if lc.cores.is_empty() {
        return Err(inv("lcores.cores", "must list at least one CPU id"));
    }
    if lc.cores.len() > crate::MAX_LCORES {
        return Err(inv(
            "lcores.cores",
            format!("{} lcores listed; pmrxe runs at most {} (one doorbell row per lcore in each client page)", lc.cores.len(), crate::MAX_LCORES),
        ));
    }
    if !(-20..=19).contains(&lc.nice) {
        return Err(inv("lcores.nice", format!("{} is outside -20..=19", lc.nice)));
    }
    if lc.allow_shared_cores && cfg.service.idle.mode == crate::IdleMode::Busy {
        return Err(inv("lcores.allow_shared_cores", "lcores sharing a CPU need an idle mode that sleeps (service.idle.mode = \"wait\" or \"backoff\"); busy-polling lcores would starve each other"));
    }
    let mut seen = HashSet::new();
    for (i, &c) in lc.cores.iter().enumerate() {
        if c >= sys.cpus {
            return Err(inv(
                format!("lcores.cores[{i}]"),
                format!("CPU {c} does not exist (this machine has CPUs 0..{})", sys.cpus - 1),
            ));
        }
        if !seen.insert(c) && !lc.allow_shared_cores {
            return Err(inv(format!("lcores.cores[{i}]"), format!("CPU {c} listed twice (set lcores.allow_shared_cores to run several lcores on one CPU)")));
        }
        if c == lc.main_core && !lc.allow_main_core {
            return Err(inv(
                format!("lcores.cores[{i}]"),
                format!("CPU {c} is the main_core; poll-mode lcores must not share it with the control thread"),
            ));
        }
    }
    if lc.main_core >= sys.cpus {
        return Err(inv(
            "lcores.main_core",
            format!("CPU {} does not exist (this machine has CPUs 0..{})", lc.main_core, sys.cpus - 1),
        ));
    }

    // [[ports]]
    if cfg.ports.is_empty() {
        return Err(inv("ports", "at least one [[ports]] entry is required"));
    }
    // Names first, so that peer lookups below see a well-formed name set.
    let mut names = HashSet::new();
    for (i, p) in cfg.ports.iter().enumerate() {
        if !valid_ident(&p.name) {
            return Err(inv(format!("ports[{i}].name"), format!("invalid name {:?} (use 1-63 of [A-Za-z0-9_.-])", p.name)));
        }
        if !names.insert(p.name.as_str()) {
            return Err(inv(format!("ports[{i}].name"), format!("duplicate port name {:?}", p.name)));
        }
    }
    let mut macs = HashSet::new();
    let mut ips = HashSet::new();
    for (i, p) in cfg.ports.iter().enumerate() {
        let f = |k: &str| format!("ports[{i}].{k}");
        match p.kind() {
            PortKind::RingPair => {
                if p.devargs.is_some() {
                    return Err(inv(f("devargs"), "a ring_pair port takes no devargs (it is made in-process)"));
                }
                let peer = p.peer.as_deref().ok_or_else(|| inv(f("peer"), "a ring_pair port needs a peer"))?;
                if peer == p.name {
                    return Err(inv(f("peer"), "a port cannot be its own peer"));
                }
                let other = cfg
                    .ports
                    .iter()
                    .find(|q| q.name == peer)
                    .ok_or_else(|| inv(f("peer"), format!("no port named {peer:?}")))?;
                if other.kind() != PortKind::RingPair || other.peer.as_deref() != Some(p.name.as_str()) {
                    return Err(inv(
                        f("peer"),
                        format!("port {peer:?} must be a ring_pair port whose peer is {:?}", p.name),
                    ));
                }
            }
            kind => {
                if p.peer.is_some() {
                    return Err(inv(f("peer"), "only ring_pair ports take a peer"));
                }
                let d = p
                    .devargs
                    .as_deref()
                    .ok_or_else(|| inv(f("devargs"), "required for vdev and pci ports"))?;
                let head = d.split(',').next().unwrap_or("");
                if kind == PortKind::Vdev {
                    let ok = head.len() > 4
                        && head.starts_with("net_")
                        && head.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                    if !ok {
                        return Err(inv(
                            f("devargs"),
                            format!("bad devargs {d:?}: a vdev must start with a net_ driver name (net_memif0, net_af_packet0, ...)"),
                        ));
                    }
                    if let Some(missing) = missing_pmd(head) {
                        return Err(inv(f("devargs"), format!("bad devargs {d:?}: no DPDK driver {missing:?} is installed ({})", PMD_DIR)));
                    }
                } else if !is_pci_addr(head) {
                    return Err(inv(
                        f("devargs"),
                        format!("bad devargs {d:?}: a pci port must start with a PCI address like 0000:3b:00.0"),
                    ));
                }
                if d.contains(char::is_whitespace) {
                    return Err(inv(f("devargs"), format!("bad devargs {d:?}: contains whitespace")));
                }
            }
        }
        if let Some(m) = p.mac {
            if m.is_multicast() || m == crate::MacAddr::ZERO {
                return Err(inv(f("mac"), format!("{m} is not a unicast MAC")));
            }
            if !macs.insert(m) {
                return Err(inv(f("mac"), format!("duplicate MAC {m}")));
            }
        }
        if let Some(a) = p.ipv4 {
            let ip = a.addr;
            if ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() {
                return Err(inv(f("ipv4"), format!("{a} is not a unicast address")));
            }
            if !ips.insert(std::net::IpAddr::V4(ip)) {
                return Err(inv(f("ipv4"), format!("duplicate address {ip}")));
            }
        }
        if let Some(a) = p.ipv6 {
            let ip = a.addr;
            if ip.is_unspecified() || ip.is_multicast() {
                return Err(inv(f("ipv6"), format!("{a} is not a unicast address")));
            }
            if !ips.insert(std::net::IpAddr::V6(ip)) {
                return Err(inv(f("ipv6"), format!("duplicate address {ip}")));
            }
        }
        if !(68..=9216).contains(&p.mtu) {
            return Err(inv(f("mtu"), format!("{} is outside 68..=9216", p.mtu)));
        }
        for (k, v) in [("rx_queues", p.rx_queues), ("tx_queues", p.tx_queues)] {
            if !(1..=64).contains(&v) {
                return Err(inv(f(k), format!("{v} is outside 1..=64")));
            }
        }
        for (k, v) in [("rx_desc", p.rx_desc), ("tx_desc", p.tx_desc)] {
            if !(32..=16384).contains(&v) || !v.is_power_of_two() {
                return Err(inv(f(k), format!("{v} is not a power of two in 32..=16384")));
            }
        }
        if let Some(v) = p.vendor_id.filter(|v| *v == 0 || *v > 0xff_ffff) {
            return Err(inv(f("vendor_id"), format!("{v:#x} is not a 24-bit vendor id (1..=0xffffff)")));
        }
        validate_congestion(&p.congestion).map_err(|(k, m)| inv(f(&format!("congestion.{k}")), m))?;
    }

    // [[neighbors]]
    let mut nips = HashSet::new();
    for (i, n) in cfg.neighbors.iter().enumerate() {
        if !nips.insert(n.ip) {
            return Err(inv(format!("neighbors[{i}].ip"), format!("duplicate neighbor {}", n.ip)));
        }
        if n.mac.is_multicast() || n.mac == crate::MacAddr::ZERO {
            return Err(inv(format!("neighbors[{i}].mac"), format!("{} is not a unicast MAC", n.mac)));
        }
    }

    // [limits]
    let l = &cfg.limits;
    for (k, v) in [
        ("max_qp", l.max_qp),
        ("max_cq", l.max_cq),
        ("max_mr", l.max_mr),
        ("max_mw", l.max_mw),
        ("max_srq", l.max_srq),
        ("max_pd", l.max_pd),
        ("max_ah", l.max_ah),
        ("max_qp_wr", l.max_qp_wr),
        ("max_srq_wr", l.max_srq_wr),
        ("max_sge", l.max_sge),
        ("max_cqe", l.max_cqe),
        ("max_rd_atomic", l.max_rd_atomic),
        ("max_msg_size", l.max_msg_size),
        ("max_fast_reg_pages", l.max_fast_reg_pages),
    ] {
        if v == 0 {
            return Err(inv(format!("limits.{k}"), "must be at least 1"));
        }
    }
    // QPNs, MR indexes and CQ numbers are 24-bit on the wire / in keys.
    for (k, v) in [("max_qp", l.max_qp), ("max_mr", l.max_mr), ("max_mw", l.max_mw), ("max_cq", l.max_cq)] {
        if v >= 1 << 24 {
            return Err(inv(format!("limits.{k}"), format!("{v} exceeds the 24-bit index space")));
        }
    }
    // A CQ ring holds a power of two of 64-byte entries (cqe + 1 rounded up).
    if l.max_cqe >= 1 << 24 {
        return Err(inv("limits.max_cqe", format!("{} exceeds 2^24 - 1", l.max_cqe)));
    }
    if l.max_msg_size > 1 << 31 {
        return Err(inv("limits.max_msg_size", format!("{} exceeds 2^31 (IBTA maximum message size)", l.max_msg_size)));
    }
    if l.max_mr_size == 0 {
        return Err(inv("limits.max_mr_size", "must be at least 1"));
    }
    if l.max_rd_atomic > 255 {
        return Err(inv("limits.max_rd_atomic", format!("{} exceeds 255", l.max_rd_atomic)));
    }
    let devices = cfg.ports.len().max(1) as u64;
    // Every lcore may hold QPs of every device (one lcore per device, or clients spread over
    // lcores that share the ports), so all devices' QPs must fit the lcores' QP tables.
    let lcores = cfg.lcores.cores.len().max(1) as u64;
    if u64::from(l.max_qp) * devices > lcores * u64::from(crate::LCORE_QP_SLOTS) {
        return Err(inv(
            "limits.max_qp",
            format!("{} on each of {devices} devices exceeds the {} QP slots of {lcores} lcores", l.max_qp, lcores * u64::from(crate::LCORE_QP_SLOTS)),
        ));
    }
    // One MR table serves every device; its indexes stop below the MW index base (2^19).
    if u64::from(l.max_mr) * devices >= 1 << 19 {
        return Err(inv("limits.max_mr", format!("{} on each of {devices} devices exceeds the 524287 slots of the MR table", l.max_mr)));
    }
    if u64::from(l.max_mw) * devices >= 1 << 23 {
        return Err(inv("limits.max_mw", format!("{} on each of {devices} devices exceeds the MW index space", l.max_mw)));
    }
    if !(1..=65536).contains(&l.max_clients) {
        return Err(inv("limits.max_clients", format!("{} is outside 1..=65536", l.max_clients)));
    }
    for kind in crate::LimitKind::ALL {
        let (cap, max) = (l.client_cap(kind), l.device_max(kind));
        if cap == 0 || cap > max {
            return Err(inv(format!("limits.per_client.max_{}", kind.name()), format!("{cap} is outside 1..=limits.max_{} ({max})", kind.name())));
        }
    }
    if let Some(f) = l.per_client.max_fds {
        if !(16..=1 << 20).contains(&f) {
            return Err(inv("limits.per_client.max_fds", format!("{f} is outside 16..=1048576")));
        }
    }

    // [faults]
    if let Some(fc) = &cfg.faults {
        for (k, v) in [("loss", fc.loss), ("duplicate", fc.duplicate), ("reorder", fc.reorder), ("corrupt", fc.corrupt)] {
            if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
                return Err(inv(format!("faults.{k}"), format!("{v} is not a fraction in 0..=1")));
            }
        }
    }
    Ok(())
}

/// Where Debian's shared DPDK keeps its autoloaded PMDs (EAL's compiled-in plugin dir).
const PMD_DIR: &str = "/usr/lib/x86_64-linux-gnu/dpdk/pmds-23.0";

/// For a vdev name like `net_af_packet0`, the driver (`net_af_packet`) if its PMD library is
/// not installed. `None` when it is, or when the PMD directory does not exist (static builds,
/// other distributions: EAL then reports the error itself).
fn missing_pmd(vdev: &str) -> Option<String> {
    let drv = vdev.trim_end_matches(|c: char| c.is_ascii_digit());
    let dir = std::path::Path::new(PMD_DIR);
    if !dir.is_dir() {
        return None;
    }
    // net_ring is linked in (rte_eth_from_rings); everything else is a plugin librte_<drv>.so.
    if drv == "net_ring" || dir.join(format!("librte_{drv}.so")).exists() {
        return None;
    }
    Some(drv.to_string())
}

#[cfg(test)]
mod tests {
    use super::is_pci_addr;

    #[test]
    fn pci_addresses() {
        assert!(is_pci_addr("0000:3b:00.0"));
        assert!(is_pci_addr("3b:00.1"));
        assert!(!is_pci_addr("3b:00.8"));
        assert!(!is_pci_addr("net_ring0"));
        assert!(!is_pci_addr("0000:3b:00"));
        assert!(!is_pci_addr("000:3b:00.0"));
    }
}
