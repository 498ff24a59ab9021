//! One test per error class: each asserts the exact one-line message and the key it names.

use pmrxe_config::{Config, ConfigError, IdleMode, PortKind, SystemInfo, DEFAULT_LOOPBACK};

/// A fixed 2-CPU machine with no hugepages, so results never depend on the host.
fn sys() -> SystemInfo {
    SystemInfo { cpus: 2, hugepages_free: 0, hugepage_kb: 2048 }
}

fn err(text: &str) -> String {
    let e = Config::parse_with(text, &sys()).expect_err("config should be rejected");
    let s = e.to_string();
    assert!(!s.contains('\n'), "error must be one line: {s:?}");
    assert!(s.starts_with("config error: "), "{s}");
    s
}

/// The loopback config with one line replaced (`from` must occur exactly once).
fn loopback_with(from: &str, to: &str) -> String {
    assert_eq!(DEFAULT_LOOPBACK.matches(from).count(), 1, "{from:?} must occur once");
    DEFAULT_LOOPBACK.replacen(from, to, 1)
}

#[test]
fn loopback_copy_is_identical() {
    let copy = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/loopback.toml"))
        .expect("configs/loopback.toml exists");
    assert_eq!(copy, DEFAULT_LOOPBACK, "configs/loopback.toml must equal dataplane/config/src/loopback.toml");
}

#[test]
fn loopback_parses() {
    let c = Config::parse_with(DEFAULT_LOOPBACK, &sys()).unwrap();
    assert_eq!(c.ports.len(), 2);
    assert_eq!(c.ports[0].name, "pmrxe0");
    assert_eq!(c.ports[0].kind(), PortKind::RingPair);
    assert_eq!(c.ports[0].peer.as_deref(), Some("pmrxe1"));
    assert_eq!(c.ports[1].ipv4.unwrap().to_string(), "198.18.0.2/24");
    assert!(!c.eal.hugepages);
    assert_eq!(c.lcores.cores, vec![1]);
    assert_eq!(c.service.idle.mode, IdleMode::Wait);
    assert_eq!(c.neighbors.len(), 2);
    assert!(c.faults.is_none());
    assert_eq!(c.limits, pmrxe_config::Limits::default());
}

#[test]
fn shipped_configs_parse() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        // nic-example asks for hugepages and two lcores: validate it on a big machine with pages.
        let big = SystemInfo { cpus: 64, hugepages_free: 4096, hugepage_kb: 2048 };
        let text = std::fs::read_to_string(&path).unwrap();
        Config::parse_with(&text, &big).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        n += 1;
    }
    assert!(n >= 1);
}

#[test]
fn unknown_key_top_level() {
    assert_eq!(err("no_such_key = 1\n"), "config error: unknown key 'no_such_key' at top level (line 1)");
}

#[test]
fn unknown_key_nested() {
    let s = err(&loopback_with("log = \"info\"", "log = \"info\"\nlogg = 1"));
    assert!(s.starts_with("config error: unknown key 'logg' in service"), "{s}");
    let s = err(&loopback_with("mtu = 9000\n\n[[ports]]", "mtu = 1500\nmtuu = 9\n\n[[ports]]"));
    assert!(s.starts_with("config error: unknown key 'mtuu' in ports[0]"), "{s}");
    let s = err("[service]\nidle = { mode = \"busy\", sleep = 1 }\n");
    assert!(s.starts_with("config error: unknown key 'sleep' in service.idle"), "{s}");
}

#[test]
fn syntax_error_has_line() {
    let s = err("[service]\nlog = \n");
    assert!(s.starts_with("config error: line 2: "), "{s}");
}

#[test]
fn bad_mac() {
    let s = err(&loopback_with("mac = \"02:00:c6:12:00:01\"\nipv4", "mac = \"zz\"\nipv4"));
    assert_eq!(s, "config error: ports[0].mac: invalid MAC \"zz\"");
}

#[test]
fn multicast_mac() {
    let s = err(&loopback_with("mac = \"02:00:c6:12:00:02\"\nipv4", "mac = \"03:00:c6:12:00:02\"\nipv4"));
    assert_eq!(s, "config error: ports[1].mac: 03:00:c6:12:00:02 is not a unicast MAC");
}

#[test]
fn bad_ipv4() {
    let s = err(&loopback_with("ipv4 = \"198.18.0.1/24\"", "ipv4 = \"198.18.0/24\""));
    assert_eq!(s, "config error: ports[0].ipv4: invalid IPv4 address \"198.18.0/24\"");
    let s = err(&loopback_with("ipv4 = \"198.18.0.1/24\"", "ipv4 = \"198.18.0.1/40\""));
    assert!(s.starts_with("config error: ports[0].ipv4: invalid IPv4 prefix length"), "{s}");
}

#[test]
fn bad_neighbor_ip() {
    let s = err(&loopback_with("ip = \"198.18.0.2\"", "ip = \"nope\""));
    assert_eq!(s, "config error: neighbors[1].ip: invalid IP address \"nope\"");
}

#[test]
fn duplicate_ip() {
    let s = err(&loopback_with("ipv4 = \"198.18.0.2/24\"", "ipv4 = \"198.18.0.1/24\""));
    assert_eq!(s, "config error: ports[1].ipv4: duplicate address 198.18.0.1");
}

#[test]
fn bad_mtu() {
    let s = err(&loopback_with("mtu = 9000\n\n[[ports]]", "mtu = 20\n\n[[ports]]"));
    assert_eq!(s, "config error: ports[0].mtu: 20 is outside 68..=9216");
    let s = err(&loopback_with("mtu = 9000\n\n[[ports]]", "mtu = 70000\n\n[[ports]]"));
    assert!(s.starts_with("config error: ports[0].mtu: "), "{s}");
}

#[test]
fn wrong_type() {
    let s = err("[eal]\nmemory_mb = \"lots\"\n");
    assert!(s.starts_with("config error: eal.memory_mb: invalid type"), "{s}");
}

#[test]
fn bad_enum() {
    let s = err("[service]\nidle = { mode = \"lazy\" }\n");
    assert!(s.starts_with("config error: service.idle.mode: unknown variant `lazy`"), "{s}");
}

#[test]
fn duplicate_names() {
    let s = err(&loopback_with("name = \"pmrxe1\"", "name = \"pmrxe0\""));
    assert_eq!(s, "config error: ports[1].name: duplicate port name \"pmrxe0\"");
}

const VDEV_BASE: &str = "[lcores]\ncores = [1]\n[[ports]]\nname = \"p0\"\n";

#[test]
fn bad_devargs_prefix() {
    let s = err(&format!("{VDEV_BASE}devargs = \"memif0,role=server\"\n"));
    assert!(s.starts_with("config error: ports[0].devargs: bad devargs \"memif0,role=server\""), "{s}");
    let s = err(&format!("{VDEV_BASE}kind = \"pci\"\ndevargs = \"net_ring0\"\n"));
    assert!(s.starts_with("config error: ports[0].devargs: bad devargs \"net_ring0\": a pci port"), "{s}");
    let s = err(&format!("{VDEV_BASE}kind = \"vdev\"\n"));
    assert_eq!(s, "config error: ports[0].devargs: required for vdev and pci ports");
}

#[test]
fn kind_inference() {
    let c = Config::parse_with(&format!("{VDEV_BASE}devargs = \"0000:3b:00.0,txq_inline=0\"\n"), &sys()).unwrap();
    assert_eq!(c.ports[0].kind(), PortKind::Pci);
    let c = Config::parse_with(&format!("{VDEV_BASE}devargs = \"net_af_packet0,iface=veth0\"\n"), &sys()).unwrap();
    assert_eq!(c.ports[0].kind(), PortKind::Vdev);
}

#[test]
fn ring_pair_peer_rules() {
    let s = err(&loopback_with("peer = \"pmrxe0\"", "peer = \"pmrxe9\""));
    assert_eq!(s, "config error: ports[0].peer: port \"pmrxe1\" must be a ring_pair port whose peer is \"pmrxe0\"");
    let s = err(&loopback_with("peer = \"pmrxe1\"", "peer = \"pmrxe7\""));
    assert_eq!(s, "config error: ports[0].peer: no port named \"pmrxe7\"");
    let s = err(&loopback_with("peer = \"pmrxe1\"", "peer = \"pmrxe0\""));
    assert_eq!(s, "config error: ports[0].peer: a port cannot be its own peer");
    let s = err(&loopback_with("peer = \"pmrxe1\"", "devargs = \"net_ring0\""));
    assert!(s.starts_with("config error: ports[0].peer: a ring_pair port needs a peer")
        || s.starts_with("config error: ports[0].devargs:"), "{s}");
}

#[test]
fn hugepages_none_free() {
    let s = err(&loopback_with("hugepages = false", "hugepages = true"));
    assert!(s.starts_with("config error: eal.hugepages: hugepages requested but none are free"), "{s}");
    // Enough pages: accepted. Too few for memory_mb: rejected, naming memory_mb.
    let text = loopback_with("hugepages = false", "hugepages = true");
    let ok = SystemInfo { hugepages_free: 128, ..sys() };
    Config::parse_with(&text, &ok).unwrap();
    let few = SystemInfo { hugepages_free: 10, ..sys() };
    let e = Config::parse_with(&text, &few).unwrap_err().to_string();
    assert!(e.starts_with("config error: eal.memory_mb: 256 MiB of hugepages requested but only 20 MiB"), "{e}");
}

#[test]
fn lcore_beyond_cpu_count() {
    let s = err(&loopback_with("cores = [1]", "cores = [1, 7]"));
    assert_eq!(s, "config error: lcores.cores[1]: CPU 7 does not exist (this machine has CPUs 0..1)");
    let s = err(&loopback_with("cores = [1]", "cores = [0]"));
    assert!(s.starts_with("config error: lcores.cores[0]: CPU 0 is the main_core"), "{s}");
    let s = err(&loopback_with("main_core = 0", "main_core = 5"));
    assert!(s.starts_with("config error: lcores.main_core: CPU 5 does not exist"), "{s}");
}

/// Issue 15: more lcores than a client page has doorbell rows for is a config error, not a
/// service whose doorbells fold onto each other.
#[test]
fn lcores_at_most_max_and_shared_cpus_need_the_flag_and_backoff() {
    let many = |n: usize| format!("cores = [{}]", vec!["1"; n].join(", "));
    let shared = |n: usize| loopback_with("cores = [1]", &format!("{}\nallow_shared_cores = true", many(n)));
    let s = err(&shared(pmrxe_config::MAX_LCORES + 1));
    assert_eq!(s, format!("config error: lcores.cores: {} lcores listed; pmrxe runs at most 64 (one doorbell row per lcore in each client page)", pmrxe_config::MAX_LCORES + 1));
    let c = Config::parse_with(&shared(pmrxe_config::MAX_LCORES), &sys()).unwrap();
    assert_eq!(c.lcores.cores.len(), 64);
    // Without the flag a CPU listed twice is refused, naming the flag.
    let s = err(&loopback_with("cores = [1]", &many(2)));
    assert_eq!(s, "config error: lcores.cores[1]: CPU 1 listed twice (set lcores.allow_shared_cores to run several lcores on one CPU)");
    // Shared CPUs with busy polling would starve each other.
    let s = err(&shared(8).replace("mode = \"wait\"", "mode = \"busy\""));
    assert!(s.starts_with("config error: lcores.allow_shared_cores: lcores sharing a CPU need an idle mode that sleeps"), "{s}");
}

#[test]
fn faults_range() {
    let s = err(&format!("{DEFAULT_LOOPBACK}\n[faults]\nloss = 1.5\n"));
    assert_eq!(s, "config error: faults.loss: 1.5 is not a fraction in 0..=1");
    let c = Config::parse_with(&format!("{DEFAULT_LOOPBACK}\n[faults]\nloss = 0.1\nseed = 7\n"), &sys()).unwrap();
    assert_eq!(c.faults.unwrap().seed, 7);
}

#[test]
fn limits_rules() {
    let s = err(&format!("{DEFAULT_LOOPBACK}\n[limits]\nmax_qp = 0\n"));
    assert_eq!(s, "config error: limits.max_qp: must be at least 1");
    let s = err(&format!("{DEFAULT_LOOPBACK}\n[limits]\nmax_mr = 16777216\n"));
    assert!(s.starts_with("config error: limits.max_mr: 16777216 exceeds the 24-bit"), "{s}");
    let s = err(&format!("{DEFAULT_LOOPBACK}\n[limits]\nmax_cqe = 16777216\n"));
    assert_eq!(s, "config error: limits.max_cqe: 16777216 exceeds 2^24 - 1");
    assert_eq!(pmrxe_config::Limits::default().max_cqe, 4_194_303, "what ConnectX NICs report");
}

#[test]
fn per_client_limits() {
    use pmrxe_config::LimitKind;
    let l = pmrxe_config::Limits::default();
    assert_eq!(l.client_cap(LimitKind::Qp), 512, "half the device's 1024");
    assert_eq!(l.client_cap(LimitKind::Mr), 2048);
    let big = pmrxe_config::Limits { max_qp: 8192, ..l.clone() };
    assert_eq!(big.client_cap(LimitKind::Qp), 2048, "at most half an lcore's QP table");
    let c = pmrxe_config::Config::parse_unvalidated(&format!("{DEFAULT_LOOPBACK}\n[limits]\nmax_qp = 8\n[limits.per_client]\nmax_qp = 3\n")).unwrap();
    assert_eq!(c.limits.client_cap(LimitKind::Qp), 3);
    let s = err(&format!("{DEFAULT_LOOPBACK}\n[limits]\nmax_qp = 8\n[limits.per_client]\nmax_qp = 9\n"));
    assert_eq!(s, "config error: limits.per_client.max_qp: 9 is outside 1..=limits.max_qp (8)");
    let s = err(&format!("{DEFAULT_LOOPBACK}\n[limits.per_client]\nmax_fds = 2\n"));
    assert_eq!(s, "config error: limits.per_client.max_fds: 2 is outside 16..=1048576");
    let s = err(&format!("{DEFAULT_LOOPBACK}\n[limits.per_client]\nmax_qps = 2\n"));
    assert!(s.contains("unknown key 'max_qps'"), "{s}");
    let s = err(&format!("{DEFAULT_LOOPBACK}\n[limits]\nmax_qp = 3000\n"));
    assert_eq!(s, "config error: limits.max_qp: 3000 on each of 2 devices exceeds the 4096 QP slots of 1 lcores");
}

#[test]
fn bad_file_prefix_and_memory() {
    let s = err(&loopback_with("in_memory = false", "file_prefix = \"a b\""));
    assert!(s.starts_with("config error: eal.file_prefix: invalid prefix \"a b\""), "{s}");
    let s = err(&loopback_with("memory_mb = 256", "memory_mb = 1"));
    assert_eq!(s, "config error: eal.memory_mb: 1 is outside 64..=1048576");
}

#[test]
fn io_error_names_path() {
    let e = Config::load("/nonexistent/pmrxe.toml").unwrap_err();
    assert!(matches!(e, ConfigError::Io { .. }));
    assert!(e.to_string().starts_with("config error: cannot read /nonexistent/pmrxe.toml: "), "{e}");
}

#[test]
fn socket_env_override() {
    // The only test in this binary that touches PMRXE_SOCKET.
    let c = Config::parse_with(DEFAULT_LOOPBACK, &sys()).unwrap();
    std::env::remove_var("PMRXE_SOCKET");
    assert_eq!(c.socket_path(), std::path::PathBuf::from("/run/pmrxe/pmrxe.sock"));
    std::env::set_var("PMRXE_SOCKET", "/tmp/x.sock");
    assert_eq!(c.socket_path(), std::path::PathBuf::from("/tmp/x.sock"));
    std::env::remove_var("PMRXE_SOCKET");
}

#[test]
fn eal_file_prefix_default() {
    let c = Config::parse_with(DEFAULT_LOOPBACK, &sys()).unwrap();
    assert_eq!(c.eal.file_prefix(), format!("pmrxe-{}", std::process::id()));
}

#[test]
fn ecn_defaults_and_congestion_ranges() {
    // Loopback ring pairs: off by default (nothing between the rings marks CE); on if asked.
    let c = Config::parse_with(DEFAULT_LOOPBACK, &sys()).unwrap();
    assert!(!c.ports[0].ecn_enabled() && !c.ports[1].ecn_enabled());
    let text = loopback_with("name = \"pmrxe0\"", "name = \"pmrxe0\"\necn = true\ncongestion = { cnp_interval_us = 20, line_rate_mbps = 25000 }");
    let c = Config::parse_with(&text, &sys()).unwrap();
    assert!(c.ports[0].ecn_enabled() && !c.ports[1].ecn_enabled());
    assert_eq!((c.ports[0].congestion.cnp_interval_us, c.ports[0].congestion.line_rate_mbps), (20, 25000));
    assert_eq!(c.ports[0].congestion.cnp_dscp, 48, "unset keys keep the NIC defaults");
    // NIC ports: on by default.
    let p = pmrxe_config::PortConfig { devargs: Some("net_af_packet0,iface=veth0".into()), ..Default::default() };
    assert!(p.ecn_enabled());
    assert!(!pmrxe_config::PortConfig { ecn: Some(false), ..p }.ecn_enabled());
    for (kv, msg) in [
        ("cnp_dscp = 64", "ports[0].congestion.cnp_dscp: 64 is outside 0..=63"),
        ("alpha_g = 0.0", "ports[0].congestion.alpha_g: 0 is outside (0, 1]"),
        ("min_rate_mbps = 0", "ports[0].congestion.min_rate_mbps: 0 is outside 1..=line_rate_mbps (100000)"),
        ("ai_rate_mbps = 200000", "ports[0].congestion.ai_rate_mbps: 200000 is above line_rate_mbps (100000)"),
        ("rate_increase_timer_us = 0", "ports[0].congestion.rate_increase_timer_us: 0 is outside 1..=1000000"),
    ] {
        let e = err(&loopback_with("name = \"pmrxe0\"", &format!("name = \"pmrxe0\"\ncongestion = {{ {kv} }}")));
        assert!(e.ends_with(msg), "{e}");
    }
    assert!(err(&loopback_with("name = \"pmrxe0\"", "name = \"pmrxe0\"\ncongestion = { kmin = 1 }")).contains("unknown key 'kmin'"));
}
