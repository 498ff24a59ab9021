//! DPDK's Environment Abstraction Layer: [`EalConfig`] → argument vector, [`Eal`] handle.
//!
//! Contract:
//! - EAL initialises **once per process** and can never be re-initialised, not even after
//!   `rte_eal_cleanup`. [`Eal::init`] enforces this with the only global state in this crate,
//!   `EAL_STATE` (a `Mutex`), because EAL itself is global state; a second call returns
//!   [`PortError::EalAlreadyInitialized`].
//! - [`Eal`] is a cheap clonable handle. Mempools and ports hold one, so the last handle is
//!   dropped only after every port has been stopped and closed; its `Drop` then runs
//!   `rte_eal_cleanup` and removes the runtime directory (`/var/run/dpdk/<file-prefix>`).
//! - Mbufs hold no handle (that would cost an atomic per packet): drop them before the last
//!   [`Eal`]/[`crate::Mempool`] handle.
//! - `rte_eal_init` pins the calling thread to the main lcore's CPU.

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pmrxe_config::{Config, PortKind};
use pmrxe_dpdk_sys as sys;

use crate::PortError;

/// Process-wide EAL lifecycle. EAL is a process singleton; this mirrors its state so misuse
/// becomes an error instead of undefined behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EalState {
    Uninit,
    Running,
    Finished,
}

static EAL_STATE: Mutex<EalState> = Mutex::new(EalState::Uninit);

/// How to start EAL. Build it with [`EalConfig::from_config`] or by hand for tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EalConfig {
    /// `argv[0]` for EAL (appears in its logs).
    pub app_name: String,
    /// Use hugepages; `false` passes `--no-huge`.
    pub hugepages: bool,
    /// `--huge-unlink` (recommended: otherwise hugepage files outlive the process).
    pub huge_unlink: bool,
    /// `--huge-dir`.
    pub huge_dir: Option<PathBuf>,
    /// `-m`, MiB.
    pub memory_mb: u32,
    /// `--file-prefix` (ignored with `in_memory`).
    pub file_prefix: Option<String>,
    /// `--in-memory`.
    pub in_memory: bool,
    /// `--no-pci`.
    pub no_pci: bool,
    /// `--vdev=...`, one per entry.
    pub vdevs: Vec<String>,
    /// `-a ...` PCI allow-list entries (address plus optional `,key=value` args).
    pub pci_allow: Vec<String>,
    /// CPU ids given to EAL as lcores (`-l`). Empty: just `main_lcore`.
    pub lcores: Vec<u32>,
    /// `--main-lcore`; also the CPU the calling thread is pinned to.
    pub main_lcore: u32,
    /// `--log-level`.
    pub log_level: Option<String>,
    /// Keep the telemetry socket/thread (off by default: one thread less).
    pub telemetry: bool,
    /// Appended verbatim.
    pub extra_args: Vec<String>,
}

impl Default for EalConfig {
    fn default() -> Self {
        EalConfig {
            app_name: "pmrxe".into(),
            hugepages: false,
            huge_unlink: true,
            huge_dir: None,
            memory_mb: 256,
            file_prefix: None,
            in_memory: false,
            no_pci: true,
            vdevs: Vec::new(),
            pci_allow: Vec::new(),
            lcores: Vec::new(),
            main_lcore: 0,
            log_level: Some("notice".into()),
            telemetry: false,
            extra_args: Vec::new(),
        }
    }
}

/// Frames in each af_packet ring when the devargs do not say (`framecnt`). DPDK 22.11's
/// default, 512 frames, is half of one 1 MiB message at path MTU 1024: a receiving lcore that
/// loses its CPU for a few hundred microseconds overflows it, and the kernel drops the rest
/// (two services on a shared 2-vCPU VM lost ~2 % of their frames to it under Open MPI, and the
/// go-back-N recovery made 1 MiB transfers 3× slower). 4096 frames of the default 2 KiB cost
/// 8 MiB of kernel memory per ring.
pub const AF_PACKET_FRAMES: u32 = 4096;

/// A vdev's devargs as given to EAL: `net_af_packet` gets `framecnt=`[`AF_PACKET_FRAMES`]
/// unless the config sets its own.
pub fn vdev_devargs(d: &str) -> String {
    let mut parts = d.split(',');
    let name = parts.next().unwrap_or_default();
    let has_framecnt = parts.any(|kv| kv.trim().starts_with("framecnt="));
    if name.trim().starts_with("net_af_packet") && !has_framecnt {
        format!("{d},framecnt={AF_PACKET_FRAMES}")
    } else {
        d.to_string()
    }
}

impl EalConfig {
    /// EAL options for a service config: memory from `[eal]`, the main lcore from `[lcores]`
    /// (poll-mode lcores are our own pinned threads, see [`Eal::register_thread`]), one
    /// `--vdev` per vdev port, one `-a` per PCI port, `--no-pci` when there is none.
    pub fn from_config(cfg: &Config) -> EalConfig {
        let e = &cfg.eal;
        let mut vdevs = Vec::new();
        let mut pci_allow = Vec::new();
        for p in &cfg.ports {
            match (p.kind(), &p.devargs) {
                (PortKind::Vdev, Some(d)) => vdevs.push(vdev_devargs(d)),
                (PortKind::Pci, Some(d)) => pci_allow.push(d.clone()),
                _ => {}
            }
        }
        EalConfig {
            hugepages: e.hugepages,
            memory_mb: e.memory_mb,
            file_prefix: if e.in_memory { None } else { Some(e.file_prefix()) },
            in_memory: e.in_memory,
            no_pci: pci_allow.is_empty(),
            vdevs,
            pci_allow,
            main_lcore: cfg.lcores.main_core,
            log_level: e.log_level.clone().or_else(|| Some("notice".into())),
            extra_args: e.extra_args.clone(),
            ..EalConfig::default()
        }
    }

    /// The argument vector passed to `rte_eal_init`, `argv[0]` included.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![self.app_name.clone()];
        let mut cores = self.lcores.clone();
        if !cores.contains(&self.main_lcore) {
            cores.insert(0, self.main_lcore);
        }
        let list: Vec<String> = cores.iter().map(u32::to_string).collect();
        a.push(format!("-l{}", list.join(",")));
        a.push(format!("--main-lcore={}", self.main_lcore));
        if self.hugepages {
            if self.huge_unlink {
                a.push("--huge-unlink".into());
            }
            if let Some(d) = &self.huge_dir {
                a.push(format!("--huge-dir={}", d.display()));
            }
        } else {
            a.push("--no-huge".into());
        }
        a.push(format!("-m{}", self.memory_mb));
        if self.in_memory {
            a.push("--in-memory".into());
        } else if let Some(p) = &self.file_prefix {
            a.push(format!("--file-prefix={p}"));
        }
        if self.no_pci {
            a.push("--no-pci".into());
        }
        for v in &self.vdevs {
            a.push(format!("--vdev={v}"));
        }
        for p in &self.pci_allow {
            a.push(format!("-a{p}"));
        }
        if let Some(l) = &self.log_level {
            a.push(format!("--log-level={l}"));
        }
        if !self.telemetry {
            a.push("--no-telemetry".into());
        }
        a.extend(self.extra_args.iter().cloned());
        a
    }
}

struct EalInner {
    /// Runtime directory to remove after cleanup (only when a file prefix was used).
    runtime_dir: Option<PathBuf>,
    /// EAL may keep pointers into argv; the strings live until after `rte_eal_cleanup`.
    _argv: Vec<CString>,
}

impl Drop for EalInner {
    fn drop(&mut self) {
        // SAFETY: this is the last handle: every mempool and port holding an `Eal` is gone,
        // so no DPDK object created through this crate is still in use.
        let rc = unsafe { sys::rte_eal_cleanup() };
        if rc != 0 {
            tracing::warn!(rc, "rte_eal_cleanup failed");
        }
        if let Ok(mut st) = EAL_STATE.lock() {
            *st = EalState::Finished;
        }
        if let Some(dir) = &self.runtime_dir {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not remove DPDK runtime dir");
                }
            }
        }
    }
}

/// A handle on the initialised EAL. Clone freely; the last drop cleans EAL up.
#[derive(Clone)]
pub struct Eal {
    inner: Arc<EalInner>,
}

impl std::fmt::Debug for Eal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Eal").field("runtime_dir", &self.inner.runtime_dir).finish()
    }
}

impl Eal {
    /// Initialises EAL with `cfg`. Fails with [`PortError::EalAlreadyInitialized`] if EAL
    /// was initialised before in this process (even if since cleaned up).
    pub fn init(cfg: &EalConfig) -> Result<Eal, PortError> {
        let mut st = EAL_STATE.lock().unwrap_or_else(|p| p.into_inner());
        if *st != EalState::Uninit {
            return Err(PortError::EalAlreadyInitialized);
        }
        let args = cfg.args();
        let argv: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_str()).map_err(|_| PortError::Nul(a.clone())))
            .collect::<Result<_, _>>()?;
        let mut ptrs: Vec<*mut c_char> = argv.iter().map(|c| c.as_ptr().cast_mut()).collect();
        ptrs.push(std::ptr::null_mut());
        let argc = c_int::try_from(argv.len()).map_err(|_| PortError::Nul("too many args".into()))?;
        tracing::debug!(args = %args.join(" "), "rte_eal_init");
        // SAFETY: `ptrs` is a NULL-terminated array of `argc` valid C strings that outlive
        // EAL (kept in `EalInner::_argv`); EAL permutes the pointer array only. EAL_STATE
        // guarantees this is the first and only call in the process.
        let rc = unsafe { sys::rte_eal_init(argc, ptrs.as_mut_ptr()) };
        if rc < 0 {
            // EAL cannot be retried after a failed init either.
            *st = EalState::Finished;
            let errno = rte_errno();
            // A failed init may already have created /var/run/dpdk/<prefix>; leave nothing behind.
            if let (false, Some(prefix)) = (cfg.in_memory, cfg.file_prefix.as_deref()) {
                let dir = std::path::Path::new("/var/run/dpdk").join(prefix);
                let _ = std::fs::remove_dir_all(dir);
            }
            return Err(PortError::EalInit { reason: strerror(errno), errno, args: args.join(" ") });
        }
        *st = EalState::Running;
        let runtime_dir = if cfg.in_memory || cfg.file_prefix.is_none() {
            None
        } else {
            // SAFETY: EAL is initialised; the returned string is static inside EAL.
            let p = unsafe { sys::rte_eal_get_runtime_dir() };
            if p.is_null() {
                None
            } else {
                // SAFETY: non-NULL, NUL-terminated, owned by EAL for the process lifetime.
                let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
                Some(PathBuf::from(s))
            }
        };
        Ok(Eal { inner: Arc::new(EalInner { runtime_dir, _argv: argv }) })
    }

    /// The runtime directory EAL created (removed on cleanup), if any.
    pub fn runtime_dir(&self) -> Option<&std::path::Path> {
        self.inner.runtime_dir.as_deref()
    }

    /// Registers the calling (non-EAL) thread with EAL so it gets an lcore id and can use
    /// per-lcore mempool caches. Pin the thread first (the registration records the
    /// thread's current CPU affinity). Unregisters when the guard drops; the guard cannot
    /// leave the thread.
    pub fn register_thread(&self) -> Result<LcoreGuard, PortError> {
        // SAFETY: EAL is initialised (we hold a handle); registers the calling thread only.
        let rc = unsafe { sys::rte_thread_register() };
        if rc != 0 {
            return Err(PortError::ThreadRegister(strerror(rte_errno())));
        }
        Ok(LcoreGuard { lcore_id: lcore_id(), _eal: self.clone(), _not_send: std::marker::PhantomData })
    }

    /// Number of ethdev ports EAL knows (from `--vdev`, PCI probing, hotplug, ring pairs).
    pub fn port_count(&self) -> u16 {
        // SAFETY: EAL is initialised.
        unsafe { sys::rte_eth_dev_count_avail() }
    }

    /// TSC frequency measured by EAL, in Hz.
    pub fn tsc_hz(&self) -> u64 {
        // SAFETY: EAL is initialised; reads a global set during init.
        unsafe { sys::pmrxe_get_tsc_hz() }
    }
}

/// Proof that the current thread is registered with EAL; unregisters on drop. `!Send`.
pub struct LcoreGuard {
    lcore_id: u32,
    _eal: Eal,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl LcoreGuard {
    /// The lcore id EAL assigned to this thread.
    pub fn lcore_id(&self) -> u32 {
        self.lcore_id
    }
}

impl Drop for LcoreGuard {
    fn drop(&mut self) {
        // SAFETY: the guard is !Send, so this runs on the thread that registered.
        unsafe { sys::rte_thread_unregister() };
    }
}

/// `rte_errno` of the calling thread.
pub fn rte_errno() -> i32 {
    // SAFETY: reads a thread-local int; valid before and after EAL init.
    unsafe { sys::pmrxe_errno() }
}

/// `rte_strerror(errno)` as a String (handles DPDK's own error numbers too).
pub fn strerror(errno: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local NUL-terminated buffer.
    let p = unsafe { sys::rte_strerror(errno) };
    if p.is_null() {
        return format!("error {errno}");
    }
    // SAFETY: non-NULL and NUL-terminated (see above); copied out immediately.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The calling thread's EAL lcore id (`u32::MAX`, i.e. LCORE_ID_ANY, if unregistered).
pub fn lcore_id() -> u32 {
    // SAFETY: reads a thread-local.
    unsafe { sys::pmrxe_lcore_id() }
}

/// Reads the time-stamp counter.
#[inline]
pub fn rdtsc() -> u64 {
    // SAFETY: a single rdtsc instruction; no memory access.
    unsafe { sys::pmrxe_rdtsc() }
}

/// Spin-loop hint (`pause`).
#[inline]
pub fn cpu_pause() {
    std::hint::spin_loop();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn af_packet_rings_hold_4096_frames_unless_the_config_says() {
        assert_eq!(vdev_devargs("net_af_packet0,iface=v0,qpairs=1"), "net_af_packet0,iface=v0,qpairs=1,framecnt=4096");
        assert_eq!(vdev_devargs("net_af_packet1,iface=v0,framecnt=1024"), "net_af_packet1,iface=v0,framecnt=1024");
        assert_eq!(vdev_devargs("net_af_xdp0,iface=v0"), "net_af_xdp0,iface=v0");
        assert_eq!(vdev_devargs("net_ring0"), "net_ring0");
    }

    #[test]
    fn args_no_huge() {
        let c = EalConfig { file_prefix: Some("t1".into()), vdevs: vec!["net_null0".into()], ..Default::default() };
        let a = c.args();
        assert_eq!(
            a,
            [
                "pmrxe", "-l0", "--main-lcore=0", "--no-huge", "-m256", "--file-prefix=t1", "--no-pci",
                "--vdev=net_null0", "--log-level=notice", "--no-telemetry"
            ]
        );
    }

    #[test]
    fn args_huge_in_memory_pci() {
        let c = EalConfig {
            hugepages: true,
            in_memory: true,
            file_prefix: Some("ignored".into()),
            no_pci: false,
            pci_allow: vec!["0000:3b:00.0".into()],
            lcores: vec![2, 3],
            main_lcore: 1,
            log_level: None,
            ..Default::default()
        };
        let a = c.args();
        assert_eq!(
            a,
            ["pmrxe", "-l1,2,3", "--main-lcore=1", "--huge-unlink", "-m256", "--in-memory", "-a0000:3b:00.0", "--no-telemetry"]
        );
    }

    #[test]
    fn from_loopback_config() {
        let sys = pmrxe_config::SystemInfo { cpus: 2, hugepages_free: 0, hugepage_kb: 2048 };
        let cfg = Config::parse_with(pmrxe_config::DEFAULT_LOOPBACK, &sys).unwrap();
        let e = EalConfig::from_config(&cfg);
        assert!(!e.hugepages);
        assert!(e.no_pci);
        assert!(e.vdevs.is_empty(), "ring pairs are made in-process, not by --vdev");
        assert_eq!(e.file_prefix, Some(format!("pmrxe-{}", std::process::id())));
    }
}
