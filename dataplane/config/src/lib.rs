//! pmrxe's configuration: the TOML schema, its loader and its validation.
//!
//! Contract: [`Config::load`] / [`Config::from_str`] either return a configuration that has
//! passed every check in [`Config::validate_with`], or a [`ConfigError`] whose `Display` is one
//! line naming the key (`config error: unknown key 'no_such_key' at top level`,
//! `config error: ports[0].mac: invalid MAC "zz"`). Every table denies unknown keys, so a typo
//! is an error rather than a silently ignored setting. The full schema, with defaults, is
//! documented in `configs/README.md` and on the types below.
//!
//! ```toml
//! [service]    socket, log, idle = { mode, spin_us, spin_iterations, max_sleep_us }, metrics
//! [eal]        hugepages, memory_mb, file_prefix, in_memory, extra_args, log_level
//! [lcores]     cores = [1], main_core = 0
//! [[ports]]    name, kind, devargs, peer, mac, ipv4, ipv6, mtu, rx_queues, tx_queues, rx_desc, tx_desc,
//!               vendor_id, vendor_part_id, ecn, congestion = { cnp_interval_us, ... }
//! [[neighbors]] ip, mac
//! [limits]     max_qp, max_cq, ..., max_clients (defaults in Limits::default)
//! [limits.per_client] max_qp, max_cq, ..., max_fds (default: fair shares, Limits::client_cap)
//! [faults]     loss, duplicate, reorder, corrupt, seed (optional)
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod sys;
mod types;
mod validate;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use error::ConfigError;
pub use sys::SystemInfo;
pub use types::{Ipv4Cidr, Ipv6Cidr, MacAddr};

/// The embedded default configuration (`configs/loopback.toml` is an identical copy; a test
/// keeps them equal): two ring-pair devices `pmrxe0` ↔ `pmrxe1`, no hugepages, one lcore.
pub const DEFAULT_LOOPBACK: &str = include_str!("loopback.toml");

/// Environment variable that overrides `service.socket` (see [`Config::socket_path`]).
pub const SOCKET_ENV: &str = "PMRXE_SOCKET";

/// The whole configuration file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[service]`: control socket, logging, idle policy, metrics.
    pub service: ServiceConfig,
    /// `[eal]`: DPDK EAL memory and process options.
    pub eal: EalSection,
    /// `[lcores]`: CPUs for poll-mode lcores and the main lcore.
    pub lcores: LcoreConfig,
    /// `[[ports]]`: the devices, in order; device `pmrxeN` is usually `ports[N]`.
    pub ports: Vec<PortConfig>,
    /// `[[neighbors]]`: static ARP/ND entries.
    pub neighbors: Vec<Neighbor>,
    /// `[limits]`: device limits reported by `ibv_query_device` and enforced by the service.
    pub limits: Limits,
    /// `[faults]`: optional fault injection on every port (tests only).
    pub faults: Option<FaultConfig>,
}

/// `[service]`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceConfig {
    /// Control socket path. Default `/run/pmrxe/pmrxe.sock`; `PMRXE_SOCKET` overrides it.
    pub socket: PathBuf,
    /// Log filter (`error`, `warn`, `info`, `debug`, `trace`, or a tracing `EnvFilter` string).
    pub log: String,
    /// What a poll-mode lcore does when a loop iteration found no work.
    pub idle: IdleConfig,
    /// Optional `host:port` for the metrics endpoint.
    pub metrics: Option<std::net::SocketAddr>,
    /// The group whose members may use the service besides root and the service's own user
    /// (default `pmrxe`, which `scripts/install.sh` creates). A host without that group admits
    /// only root and the service user. The socket and its directory get this group.
    pub group: String,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            socket: PathBuf::from("/run/pmrxe/pmrxe.sock"),
            log: "info".into(),
            idle: IdleConfig::default(),
            metrics: None,
            group: "pmrxe".into(),
        }
    }
}

/// `service.idle`: lcore idle policy.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdleConfig {
    /// `wait` (spin `spin_us` after the last work, then block until there is work: the
    /// default), `backoff` (spin, then sleep with exponential back-off) or `busy` (never sleep).
    pub mode: IdleMode,
    /// Empty iterations spent spinning before the first sleep (backoff mode).
    pub spin_iterations: u32,
    /// Longest sleep between polls, in microseconds (backoff mode; in wait mode, the longest
    /// sleep of an lcore with a port that cannot wake it: neither a queue fd nor a ring pair).
    pub max_sleep_us: u32,
    /// Wait mode: microseconds of empty iterations spent spinning after the last work before
    /// the lcore blocks (a ping-pong's gaps must fit in it, or every message pays a wake-up).
    pub spin_us: u32,
}

impl Default for IdleConfig {
    fn default() -> Self {
        IdleConfig { mode: IdleMode::Wait, spin_iterations: 1000, max_sleep_us: 200, spin_us: 100 }
    }
}

/// Idle policy of a poll-mode lcore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleMode {
    /// Spin `spin_us`, then block until there is work: frames (epoll on the ports' queue fds),
    /// a client post (need-wakeup flag in the client page), a control command or the next QP
    /// timer (the default: shared machines, cloud hosts).
    Wait,
    /// Spin `spin_iterations` times, then sleep up to `max_sleep_us` (tests, shared machines).
    Backoff,
    /// Poll forever without sleeping (benchmarks, dedicated cores).
    Busy,
}

/// `[eal]`: DPDK Environment Abstraction Layer options.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EalSection {
    /// Use hugepages (must be reserved: see `scripts/hugepages.sh`). `false` passes `--no-huge`.
    pub hugepages: bool,
    /// Memory for EAL in MiB (`-m`).
    pub memory_mb: u32,
    /// `--file-prefix`; default `pmrxe-<pid>` so that processes never collide.
    pub file_prefix: Option<String>,
    /// `--in-memory`: no runtime files at all (no multi-process, no file prefix).
    pub in_memory: bool,
    /// Extra EAL arguments appended verbatim.
    pub extra_args: Vec<String>,
    /// `--log-level` value (`error`, `info`, `8`, `lib.eal:debug`, ...). Default: DPDK's.
    pub log_level: Option<String>,
}

impl Default for EalSection {
    fn default() -> Self {
        EalSection {
            hugepages: false,
            memory_mb: 256,
            file_prefix: None,
            in_memory: false,
            extra_args: Vec::new(),
            log_level: None,
        }
    }
}

impl EalSection {
    /// The effective `--file-prefix`: the configured one or `pmrxe-<pid>`.
    pub fn file_prefix(&self) -> String {
        self.file_prefix.clone().unwrap_or_else(|| format!("pmrxe-{}", std::process::id()))
    }
}

/// `[lcores]`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LcoreConfig {
    /// CPU ids for the poll-mode lcores, one lcore each. The control thread never runs on them.
    pub cores: Vec<u32>,
    /// CPU of the EAL main lcore (and the control thread). Must not be in `cores`, unless
    /// `allow_main_core` is set.
    pub main_core: u32,
    /// Permit a poll-mode lcore on the main core (small machines: then use idle back-off, or the
    /// control thread starves). Default false.
    pub allow_main_core: bool,
    /// Permit several poll-mode lcores on one CPU (tests of many lcores on a small machine;
    /// only with idle back-off, or they starve each other). Default false.
    pub allow_shared_cores: bool,
    /// Scheduling niceness of the poll-mode lcore threads (-20..=19; default 0: left as
    /// started). A negative value lets an lcore woken by work take a CPU it shares with
    /// busy-polling application threads at once (-10 weights it about 9:1 against a nice-0
    /// thread), at their expense: an event-driven receiver on that CPU then falls behind its
    /// sender (fio's SEND test, which connects with rnr_retry 0, failed on RNR NAKs at -10).
    /// Needs root or CAP_SYS_NICE; without it the service logs a warning and runs on.
    pub nice: i32,
}

/// Most poll-mode lcores a service runs: a client page has one doorbell row per lcore
/// (`pmrxe_abi::MAX_LCORES`, asserted equal in the service) and a port at most 64 queue pairs.
pub const MAX_LCORES: usize = 64;

impl Default for LcoreConfig {
    fn default() -> Self {
        LcoreConfig { cores: vec![1], main_core: 0, allow_main_core: false, allow_shared_cores: false, nice: 0 }
    }
}

/// What a port is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PortKind {
    /// Two ports wired back to back inside this process by two `rte_ring`s
    /// (`rte_eth_from_rings`); needs `peer`, no `devargs`.
    RingPair,
    /// A DPDK virtual device: `devargs` starts with `net_` (`net_memif0,role=server,...`,
    /// `net_af_packet0,iface=veth0`, `net_af_xdp0,iface=...`, `net_tap0`, ...).
    Vdev,
    /// A PCI device: `devargs` is a PCI address (`0000:3b:00.0[,key=value...]`).
    Pci,
}

/// One `[[ports]]` entry: a device `pmrxeN`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PortConfig {
    /// Device name, also the verbs device name (`pmrxe0`). Unique.
    pub name: String,
    /// Port kind; inferred when absent ([`PortConfig::kind`]).
    pub kind: Option<PortKind>,
    /// DPDK device string for `vdev`/`pci` kinds.
    pub devargs: Option<String>,
    /// The other port of a `ring_pair`, by name.
    pub peer: Option<String>,
    /// MAC address; default: the one the PMD reports.
    pub mac: Option<MacAddr>,
    /// IPv4 address with prefix (`198.18.0.1/24`); becomes the IPv4-mapped RoCEv2 GID.
    pub ipv4: Option<Ipv4Cidr>,
    /// Optional IPv6 address with prefix; becomes a RoCEv2 GID.
    pub ipv6: Option<Ipv6Cidr>,
    /// Ethernet MTU (L3 bytes). 68..=9216; default 1500.
    pub mtu: u16,
    /// Number of RX queues (1..=64).
    pub rx_queues: u16,
    /// Number of TX queues (1..=64).
    pub tx_queues: u16,
    /// RX descriptors per queue (power of two, 32..=16384).
    pub rx_desc: u16,
    /// TX descriptors per queue (power of two, 32..=16384).
    pub tx_desc: u16,
    /// `vendor_id` the device reports in `ibv_query_device` (24-bit IEEE OUI); default
    /// 0xFFFFFF, the software-provider id rxe uses. Only for tools that enable features by
    /// vendor (perftest turns inline on only for ids it knows): an operator's explicit choice.
    pub vendor_id: Option<u32>,
    /// `vendor_part_id` reported with it; default 0x5058.
    pub vendor_part_id: Option<u32>,
    /// ECN and congestion control on this port: ECT(0) on every transmitted RoCE frame, CNPs
    /// for CE-marked packets (notification point) and DCQCN rate control with pacing (reaction
    /// point). Default ([`PortConfig::ecn_enabled`]): on for `vdev`/`pci` ports, off for
    /// `ring_pair` (no switch between the two rings can mark).
    pub ecn: Option<bool>,
    /// The notification-point and DCQCN parameters (used when ECN is on).
    pub congestion: CongestionConfig,
}

/// `[ports.congestion]`: notification-point and DCQCN reaction-point parameters. Defaults: the
/// DCQCN paper (Zhu et al., SIGCOMM 2015) and NVIDIA ConnectX firmware defaults, as listed in
/// docs/congestion.md.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CongestionConfig {
    /// At most one CNP per QP per this many µs (ConnectX `min_time_between_cnps`, 50 µs
    /// here as the paper's N). 0..=1_000_000.
    pub cnp_interval_us: u32,
    /// DSCP of the CNPs we send (ConnectX `cnp_dscp` 48). 0..=63.
    pub cnp_dscp: u8,
    /// Line rate (Mb/s): the rate of an unlimited QP and the ceiling of the DCQCN rates.
    pub line_rate_mbps: u64,
    /// Lowest DCQCN rate (Mb/s; ConnectX `rpg_min_rate` 1).
    pub min_rate_mbps: u64,
    /// α gain g (paper 1/256). In (0, 1].
    pub alpha_g: f64,
    /// α update period K (µs; paper 55).
    pub alpha_timer_us: u32,
    /// α at the first CNP (ConnectX `initial_alpha_value` 1023/1024 ≈ 1). In [0, 1].
    pub initial_alpha: f64,
    /// Rate-increase timer T (µs; ConnectX `rpg_time_reset` 300).
    pub rate_increase_timer_us: u32,
    /// Rate-increase byte counter B (bytes; paper 10 MB).
    pub byte_counter: u64,
    /// Fast-recovery stages F (paper 5).
    pub fast_recovery_steps: u32,
    /// Additive increase R_AI (Mb/s; paper 40).
    pub ai_rate_mbps: u64,
    /// Hyper increase R_HAI (Mb/s; ConnectX `rpg_hai_rate` 50).
    pub hai_rate_mbps: u64,
    /// At most one rate decrease per this many µs (ConnectX `rate_reduce_monitor_period` 4).
    pub rate_reduce_period_us: u32,
}

impl Default for CongestionConfig {
    fn default() -> Self {
        CongestionConfig {
            cnp_interval_us: 50,
            cnp_dscp: 48,
            line_rate_mbps: 100_000,
            min_rate_mbps: 1,
            alpha_g: 1.0 / 256.0,
            alpha_timer_us: 55,
            initial_alpha: 1.0,
            rate_increase_timer_us: 300,
            byte_counter: 10_000_000,
            fast_recovery_steps: 5,
            ai_rate_mbps: 40,
            hai_rate_mbps: 50,
            rate_reduce_period_us: 4,
        }
    }
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            name: String::new(),
            kind: None,
            devargs: None,
            peer: None,
            mac: None,
            ipv4: None,
            ipv6: None,
            mtu: 1500,
            rx_queues: 1,
            tx_queues: 1,
            rx_desc: 1024,
            tx_desc: 1024,
            vendor_id: None,
            vendor_part_id: None,
            ecn: None,
            congestion: CongestionConfig::default(),
        }
    }
}

impl PortConfig {
    /// Whether ECN/CNP/DCQCN is on: `ecn` if set, else on for NIC ports (`vdev`, `pci`) and
    /// off for `ring_pair` ports.
    pub fn ecn_enabled(&self) -> bool {
        self.ecn.unwrap_or(self.kind() != PortKind::RingPair)
    }

    /// The effective kind: explicit, else `ring_pair` if `peer` is set, `pci` if `devargs`
    /// looks like a PCI address, otherwise `vdev`.
    pub fn kind(&self) -> PortKind {
        if let Some(k) = self.kind {
            return k;
        }
        match (&self.peer, &self.devargs) {
            (Some(_), None) => PortKind::RingPair,
            (_, Some(d)) if validate::is_pci_addr(d.split(',').next().unwrap_or("")) => PortKind::Pci,
            _ => PortKind::Vdev,
        }
    }
}

/// One `[[neighbors]]` entry: a static ARP (IPv4) or ND (IPv6) entry.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Neighbor {
    /// The neighbour's IP address.
    #[serde(deserialize_with = "types::de_ip")]
    pub ip: IpAddr,
    /// Its MAC address.
    pub mac: MacAddr,
}

/// `[limits]`: device limits. Defaults are sane for a software device.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Queue pairs per device.
    pub max_qp: u32,
    /// Completion queues per device.
    pub max_cq: u32,
    /// Memory regions per device.
    pub max_mr: u32,
    /// Memory windows per device.
    pub max_mw: u32,
    /// Shared receive queues per device.
    pub max_srq: u32,
    /// Protection domains per device.
    pub max_pd: u32,
    /// Address handles per device.
    pub max_ah: u32,
    /// Work requests per send or receive queue.
    pub max_qp_wr: u32,
    /// Work requests per SRQ.
    pub max_srq_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Bytes of inline data per send work request.
    pub max_inline: u32,
    /// Entries per completion queue (default 4194303 = 2^22 - 1, what ConnectX NICs report:
    /// libfabric's rxm sizes its CQs by the expected number of peers). The ring is shared
    /// memory touched only as completions are written, so a large CQ costs address space, not
    /// memory, until it is used. At most 2^24 - 1.
    pub max_cqe: u32,
    /// Outstanding RDMA READ/atomic requests per QP, as responder and as initiator.
    pub max_rd_atomic: u32,
    /// Largest memory region, in bytes.
    pub max_mr_size: u64,
    /// Largest message, in bytes (IBTA: at most 2^31).
    pub max_msg_size: u32,
    /// Pages in a fast-registration page list.
    pub max_fast_reg_pages: u32,
    /// Clients connected at once (service-wide). A connection beyond it is closed at once;
    /// each connected client costs the service three fds (socket, client page, event fd).
    pub max_clients: u32,
    /// `[limits.per_client]`: what one client may hold, so that one client cannot starve
    /// the others (see [`PerClientLimits`]).
    pub per_client: PerClientLimits,
}

/// `[limits.per_client]`: caps on one client's objects, each on each device (`max_fds`: over
/// the whole service). Unset: a fair share, [`Limits::client_cap`]. A client at its cap gets
/// `EAGAIN` (as the kernel's rdma cgroup answers at `rdma.max`); a device at its `[limits]`
/// limit answers `ENOMEM`, as a NIC whose table is full.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PerClientLimits {
    /// QPs per client per device (default: half of `max_qp`, at most half an lcore's QP table).
    pub max_qp: Option<u32>,
    /// CQs per client per device (default: half of `max_cq`).
    pub max_cq: Option<u32>,
    /// MRs per client per device (default: half of `max_mr`).
    pub max_mr: Option<u32>,
    /// MWs per client per device (default: half of `max_mw`).
    pub max_mw: Option<u32>,
    /// SRQs per client per device (default: half of `max_srq`).
    pub max_srq: Option<u32>,
    /// PDs per client per device (default: half of `max_pd`).
    pub max_pd: Option<u32>,
    /// AHs per client per device (default: half of `max_ah`).
    pub max_ah: Option<u32>,
    /// File descriptors the service holds for one client's CQ/QP/SRQ rings, completion
    /// channels and registered segments (default: a quarter of the service's fd budget, at
    /// most 4096, computed at start from RLIMIT_NOFILE).
    pub max_fds: Option<u32>,
}

/// The objects `[limits]` counts per device (and `[limits.per_client]` per client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitKind {
    /// Protection domains.
    Pd,
    /// Completion queues.
    Cq,
    /// Queue pairs.
    Qp,
    /// Shared receive queues.
    Srq,
    /// Memory regions.
    Mr,
    /// Memory windows.
    Mw,
    /// Address handles.
    Ah,
}

impl LimitKind {
    /// Every kind, in a fixed order (arrays of counters are indexed by `kind as usize`).
    pub const ALL: [LimitKind; 7] = [LimitKind::Pd, LimitKind::Cq, LimitKind::Qp, LimitKind::Srq, LimitKind::Mr, LimitKind::Mw, LimitKind::Ah];

    /// The `[limits]` key (`max_<name>`) and stats name.
    pub fn name(self) -> &'static str {
        match self {
            LimitKind::Pd => "pd",
            LimitKind::Cq => "cq",
            LimitKind::Qp => "qp",
            LimitKind::Srq => "srq",
            LimitKind::Mr => "mr",
            LimitKind::Mw => "mw",
            LimitKind::Ah => "ah",
        }
    }
}

/// QP slots of one poll-mode lcore (`pmrxe_runtime::lcore::MAX_QPS_PER_LCORE`, asserted equal
/// in the service): a client's QPs all live on one lcore, so its fair share is taken from here.
pub const LCORE_QP_SLOTS: u32 = 4096;

/// Largest per-client fd cap the service picks by itself ([`PerClientLimits::max_fds`]).
pub const DEFAULT_CLIENT_FDS: u32 = 4096;

impl Limits {
    /// The device-wide limit of `kind` (per device), as `ibv_query_device` reports it.
    pub fn device_max(&self, kind: LimitKind) -> u32 {
        match kind {
            LimitKind::Pd => self.max_pd,
            LimitKind::Cq => self.max_cq,
            LimitKind::Qp => self.max_qp,
            LimitKind::Srq => self.max_srq,
            LimitKind::Mr => self.max_mr,
            LimitKind::Mw => self.max_mw,
            LimitKind::Ah => self.max_ah,
        }
    }

    /// One client's cap on `kind` per device: `[limits.per_client]` if set, else a fair share:
    /// half the device limit (at least 1); for QPs also at most half an lcore's QP table.
    pub fn client_cap(&self, kind: LimitKind) -> u32 {
        let p = &self.per_client;
        let set = match kind {
            LimitKind::Pd => p.max_pd,
            LimitKind::Cq => p.max_cq,
            LimitKind::Qp => p.max_qp,
            LimitKind::Srq => p.max_srq,
            LimitKind::Mr => p.max_mr,
            LimitKind::Mw => p.max_mw,
            LimitKind::Ah => p.max_ah,
        };
        set.unwrap_or_else(|| {
            let half = (self.device_max(kind) / 2).max(1);
            if kind == LimitKind::Qp {
                half.min(LCORE_QP_SLOTS / 2)
            } else {
                half
            }
        })
    }
}

/// Default `[limits] max_cqe`: 2^22 - 1 entries, as ConnectX-4..7 report.
pub const MAX_CQE_DEFAULT: u32 = (1 << 22) - 1;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_qp: 1024,
            max_cq: 1024,
            max_mr: 4096,
            max_mw: 1024,
            max_srq: 256,
            max_pd: 1024,
            max_ah: 1024,
            max_qp_wr: 4096,
            max_srq_wr: 4096,
            max_sge: 16,
            max_inline: 256,
            max_cqe: MAX_CQE_DEFAULT,
            max_rd_atomic: 16,
            max_mr_size: 1 << 40,
            max_msg_size: 1 << 31,
            max_fast_reg_pages: 512,
            max_clients: 256,
            per_client: PerClientLimits::default(),
        }
    }
}

/// `[faults]`: seeded fault injection applied to every port (for tests and demos).
#[derive(Clone, Debug, PartialEq, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Fraction of frames dropped, 0..=1.
    pub loss: f64,
    /// Fraction of frames sent twice, 0..=1.
    pub duplicate: f64,
    /// Fraction of frames held back and sent after the next one, 0..=1.
    pub reorder: f64,
    /// Fraction of frames with one byte flipped, 0..=1.
    pub corrupt: f64,
    /// RNG seed: the same seed gives the same fault pattern.
    pub seed: u64,
}

impl Config {
    /// Reads and validates a config file against this machine ([`SystemInfo::probe`]).
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Io { path: path.to_path_buf(), source })?;
        Config::from_str(&text)
    }

    /// Parses and validates TOML text against this machine ([`SystemInfo::probe`]).
    #[allow(clippy::should_implement_trait)] // also implemented as FromStr below
    pub fn from_str(text: &str) -> Result<Config, ConfigError> {
        Config::parse_with(text, &SystemInfo::probe())
    }

    /// Parses and validates TOML text against a given machine description (for tests).
    pub fn parse_with(text: &str, sys: &SystemInfo) -> Result<Config, ConfigError> {
        let cfg = Config::parse_unvalidated(text)?;
        cfg.validate_with(sys)?;
        Ok(cfg)
    }

    /// Parses TOML text and checks types and keys only (no cross-field or machine checks).
    pub fn parse_unvalidated(text: &str) -> Result<Config, ConfigError> {
        let de = toml::Deserializer::new(text);
        serde_path_to_error::deserialize(de).map_err(|e| validate::map_de_error(text, e))
    }

    /// The embedded default ([`DEFAULT_LOOPBACK`]), validated against this machine.
    pub fn default_loopback() -> Result<Config, ConfigError> {
        Config::from_str(DEFAULT_LOOPBACK)
    }

    /// Checks every cross-field rule and the machine-dependent ones (CPU ids, free
    /// hugepages). Called by every loader; public for configs built in code.
    pub fn validate_with(&self, sys: &SystemInfo) -> Result<(), ConfigError> {
        validate::validate(self, sys)
    }

    /// The control socket path: `$PMRXE_SOCKET` when set and non-empty, else `service.socket`.
    pub fn socket_path(&self) -> PathBuf {
        match std::env::var_os(SOCKET_ENV) {
            Some(v) if !v.is_empty() => PathBuf::from(v),
            _ => self.service.socket.clone(),
        }
    }

    /// The port named `name`, with its index.
    pub fn port(&self, name: &str) -> Option<(usize, &PortConfig)> {
        self.ports.iter().enumerate().find(|(_, p)| p.name == name)
    }
}

impl std::str::FromStr for Config {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Config::from_str(s)
    }
}
