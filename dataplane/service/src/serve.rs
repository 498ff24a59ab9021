//! `pmrxe serve`: start-up, the accept loop and clean shutdown.
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pmrxe_config::Config;
use pmrxe_mem::{MemLimits, MemTable};
use pmrxe_port::{Eal, EalConfig};
use pmrxe_runtime::lcore::{DeviceConfig, Lcore};

use crate::device;
use pmrxe_runtime::dpdk::DpdkLink;
use crate::session::{self, Shared};
use crate::stats::{Capture, CaptureTap, FaultSource, ServiceStats};

// The config refuses more lcores than a client page has doorbell rows for.
const _: () = assert!(pmrxe_config::MAX_LCORES == pmrxe_abi::MAX_LCORES);

/// Why the service could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// DPDK EAL or a port.
    #[error("{0}")]
    Port(#[from] pmrxe_port::PortError),
    /// The control socket.
    #[error("control socket {path}: {source}")]
    Socket {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Another service answers on the socket.
    #[error("control socket {0}: another pmrxe service is running there")]
    InUse(PathBuf),
    /// Lcore threads.
    #[error("lcore {0}: {1}")]
    Lcore(u32, String),
    /// Signals.
    #[error("signal setup: {0}")]
    Signal(std::io::Error),
    /// The fd limit cannot cover the configured limits (one line with the numbers).
    #[error("{0}")]
    Limits(String),
    /// The metrics endpoint (`service.metrics`).
    #[error("metrics endpoint {0}: {1}")]
    Metrics(std::net::SocketAddr, std::io::Error),
}

/// Run the service until SIGINT/SIGTERM. Returns after a clean stop.
pub fn serve(cfg: Config) -> Result<(), ServeError> {
    ignore_sigpipe();
    let sigs = block_signals().map_err(ServeError::Signal)?;
    let sock_path = cfg.socket_path();
    // Refuse early if a live service already owns the socket (probed with the socket type
    // services listen with), and before EAL if clients could not trust its directory.
    probe_socket(&sock_path)?;
    let access = crate::access::Access::new(rustix::process::getuid().as_raw(), &cfg.service.group);
    if access.group.is_none() {
        tracing::warn!(group = %cfg.service.group, "no such group on this host: only root and the service's user may use pmrxe (scripts/install.sh creates it)");
    }
    let crc = calibrate_crc(&cfg);
    // Started under a real-time policy (`chrt -f 10 pmrxe serve`): only the lcores keep it. The
    // control threads (this one, EAL's, the connection manager's) run SCHED_OTHER, so that a
    // busy lcore or a busy control thread at the same priority on one CPU cannot starve the
    // other (EAL's start-up waited forever on a CPU it shared with a FIFO spinner).
    let rt = take_realtime_policy();
    let eal = Eal::init(&EalConfig::from_config(&cfg))?;
    let nl = cfg.lcores.cores.len().max(1);
    // Several lcores: each gets its own RX/TX queue pair on every port (QPs are spread per
    // client; frames reaching the wrong lcore are handed over, see `Handoff`).
    let mut port_cfg = cfg.clone();
    if nl > 1 {
        for p in &mut port_cfg.ports {
            p.rx_queues = p.rx_queues.max(nl as u16);
            p.tx_queues = p.tx_queues.max(nl as u16);
        }
    }
    let ports = pmrxe_port::open_ports(&port_cfg, &eal)?;
    // RLIMIT_NOFILE sized from the limits, once EAL and the ports hold their fds: every
    // CQ/QP/SRQ ring, channel and segment costs the service one (crate::limits).
    let fd_plan = crate::limits::size_fd_limit(&cfg.limits, cfg.ports.len()).map_err(ServeError::Limits)?;
    // One MR table for every device; each device's share is enforced by crate::limits.
    let n_dev = cfg.ports.len().max(1) as u32;
    let mem = Arc::new(MemTable::new(MemLimits {
        max_mr: cfg.limits.max_mr.saturating_mul(n_dev),
        max_mw: cfg.limits.max_mw.saturating_mul(n_dev),
        max_fast_reg_pages: cfg.limits.max_fast_reg_pages,
        max_mr_size: cfg.limits.max_mr_size,
        // One epoch reader per lcore.
        max_readers: pmrxe_abi::MAX_LCORES as u32,
        ..MemLimits::default()
    }));
    let devices: Vec<_> = ports.iter().enumerate().map(|(i, p)| {
        let mac = cfg.ports[i].mac.map(|m| m.octets()).unwrap_or_else(|| pmrxe_port::Port::mac(p).octets());
        device::device_info(&cfg, i, mac)
    }).collect();
    let device_lcore: Vec<usize> = (0..devices.len()).map(|i| i % nl).collect();
    // /dev/infiniband/pmrxe_uverbs<i> while we run (UCX's device probe); removed when dropped.
    let dev_nodes = crate::devnodes::DevNodes::create(devices.len());
    let neighbors: Vec<(IpAddr, [u8; 6])> = cfg.neighbors.iter().map(|n| (n.ip, n.mac.octets())).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let capture = Arc::new(Capture::default());

    // Build each lcore with its ports, then pin and start it.
    let dev_cfg = |i: usize| {
        let d = &devices[i];
        let p = &cfg.ports[i];
        let ecn = p.ecn_enabled();
        DeviceConfig { index: i as u32, mac: d.mac, gids: d.gids.iter().map(|g| g.gid).collect(), mtu: p.mtu, ecn, cc: crate::device::congestion(ecn, &p.congestion) }
    };
    // `[faults]`: a seeded injector on every port's receive side (seed + port index + lcore).
    // Their counters are exported by `pmrxe stats --json` ("faults").
    let mut fault_counters = Vec::new();
    let mut link = |p: pmrxe_port::EthPort, i: usize, li: usize| {
        let l = DpdkLink::with_faults(p, cfg.faults.as_ref().map(|f| pmrxe_port::Faults { seed: f.seed.wrapping_add((i + 64 * li) as u64), ..f.into() }));
        if let Some(c) = l.fault_counters() {
            fault_counters.push(FaultSource { device: devices[i].name.clone(), lcore: li, counters: c });
        }
        l
    };
    let mut per_lcore: Vec<Vec<(DpdkLink, DeviceConfig)>> = (0..nl).map(|_| Vec::new()).collect();
    if nl > 1 {
        for (li, lane) in per_lcore.iter_mut().enumerate().skip(1) {
            for (i, p) in ports.iter().enumerate() {
                let q = p.for_queues(li as u16, li as u16).ok_or_else(|| ServeError::Lcore(li as u32, format!("port {} has no queue pair {li}", cfg.ports[i].name)))?;
                lane.push((link(q, i, li), dev_cfg(i)));
            }
        }
        for (i, p) in ports.into_iter().enumerate() {
            per_lcore[0].push((link(p, i, 0), dev_cfg(i)));
        }
    } else {
        for (i, p) in ports.into_iter().enumerate() {
            per_lcore[device_lcore[i]].push((link(p, i, 0), dev_cfg(i)));
        }
    }
    let handoff = (nl > 1).then(|| pmrxe_runtime::lcore::Handoff::new(nl, 4096));
    // QP1 of every port goes to the connection manager (crate::cm) through these queues.
    let gsi = pmrxe_runtime::gsi::GsiPipe::new(nl);
    let mut handles = Vec::new();
    let mut threads = Vec::new();
    for (li, links) in per_lcore.into_iter().enumerate() {
        let core = cfg.lcores.cores.get(li).copied().unwrap_or(0);
        let (mut lc, h) = Lcore::new(li, links, mem.clone(), &neighbors, cfg.service.idle.clone(), stop.clone(), Some(Box::new(CaptureTap(capture.clone()))));
        if let Some(hd) = &handoff {
            lc.set_handoff(hd.clone());
        }
        lc.set_gsi(gsi.clone());
        handles.push(h);
        let eal_ref = eal.clone();
        let nice = cfg.lcores.nice;
        let t = std::thread::Builder::new()
            .name(format!("pmrxe-lcore{li}"))
            .spawn(move || {
                if !core_affinity::set_for_current(core_affinity::CoreId { id: core as usize }) {
                    tracing::warn!(core, "could not pin lcore {li} to its CPU");
                }
                if let Some((policy, prio)) = rt {
                    if let Err(e) = set_thread_policy(policy, prio) {
                        tracing::warn!(error = %e, "could not give lcore {li} the real-time policy the service was started with");
                    }
                }
                if nice != 0 {
                    if let Err(e) = set_thread_nice(nice) {
                        tracing::warn!(nice, error = %e, "could not set lcore {li}'s niceness (lcores.nice; needs root or CAP_SYS_NICE): it competes with application threads on its CPU as an equal");
                    }
                }
                let _reg = eal_ref.register_thread();
                lc.run();
                drop(lc); // ports stop/close with their last handle
            })
            .map_err(|e| ServeError::Lcore(core, e.to_string()))?;
        threads.push(t);
    }
    // The control thread stays off the lcore CPUs.
    let _ = core_affinity::set_for_current(core_affinity::CoreId { id: cfg.lcores.main_core as usize });

    let cm_ports: Vec<crate::cm::CmPort> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let p = &cfg.ports[i];
            let mut nets: Vec<(IpAddr, u8)> = Vec::new();
            if let Some(v4) = &p.ipv4 {
                nets.push((IpAddr::V4(v4.addr), v4.prefix));
            }
            if let Some(v6) = &p.ipv6 {
                nets.push((IpAddr::V6(v6.addr), v6.prefix));
            }
            crate::cm::CmPort {
                device: i as u32,
                guid: d.guid,
                gids: d.gids.iter().map(|g| g.gid).collect(),
                nets,
                active_mtu: d.port.active_mtu,
                lcore: device_lcore[i],
            }
        })
        .collect();
    let (cm, cm_thread) = match crate::cm::spawn(cm_ports, gsi, stop.clone()) {
        Ok(x) => x,
        Err(e) => {
            stop.store(true, Ordering::Release);
            for t in threads {
                let _ = t.join();
            }
            return Err(ServeError::Lcore(0, format!("connection manager thread: {e}")));
        }
    };

    let (listener, sock_id) = bind_socket(&sock_path, &access)?;
    // `pmrxe stats` lists the sessions' own client table (`Shared::clients`, filled at Hello and
    // emptied when a client goes): the stats closure reaches it through a weak reference.
    let budget = Arc::new(crate::limits::Budget::new(cfg.limits.clone(), devices.iter().map(|d| d.name.clone()).collect(), fd_plan));
    let shared = Arc::new_cyclic(|weak: &std::sync::Weak<Shared>| Shared {
        devices: devices.clone(),
        device_lcore,
        lcores: handles.clone(),
        mem,
        next_handle: AtomicU32::new(1),
        next_qpn: AtomicU32::new(0x11),
        next_home: AtomicU32::new(0),
        clients: Mutex::new(Default::default()),
        stats: Arc::new(ServiceStats {
            lcores: handles,
            devices: devices.iter().map(|d| d.name.clone()).collect(),
            started: std::time::Instant::now(),
            capture: capture.clone(),
            faults: fault_counters,
            clients: {
                let w = weak.clone();
                Arc::new(move || {
                    w.upgrade().map_or_else(Vec::new, |sh| {
                        sh.clients.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
                    })
                })
            },
            cm: Some(cm.clone()),
            limits: Some(budget.clone()),
            crc: Some(crc),
        }),
        limits: budget,
        capture,
        cm: Some(cm),
        mcast: Mutex::new(Default::default()),
        access,
        refused: Default::default(),
    });
    // Prometheus endpoint (crate::metrics): its own thread, renders the same snapshot as `pmrxe stats`.
    if let Some(addr) = cfg.service.metrics {
        if let Err(e) = crate::metrics::spawn(addr, shared.stats.clone()) {
            stop.store(true, Ordering::Release);
            for t in threads {
                let _ = t.join();
            }
            remove_own_socket(&sock_path, sock_id);
            return Err(ServeError::Metrics(addr, e));
        }
    }
    tracing::info!(socket = %sock_path.display(), devices = devices.len(), lcores = nl, "pmrxe serving");

    // Accept clients until a signal arrives (the listener is non-blocking; between clients the
    // control thread blocks in poll(2) on the listener and a signalfd — it is never on the fast
    // path).
    listener.set_nonblocking(true).map_err(|e| ServeError::Socket { path: sock_path.clone(), source: e })?;
    // A failing accept (EMFILE, ENFILE, ENOBUFS...) backs off, 5 ms doubling to 100 ms, and is
    // logged at most once per limits::WARN_PERIOD with the count suppressed: a client flood
    // must not spin the control thread or flood the log (counted: limits.accept_errors).
    const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(100));
    let mut backoff = ACCEPT_BACKOFF.0;
    let limits = shared.limits.clone();
    let sigfd = signal_fd(&sigs).map_err(ServeError::Signal)?;
    let sig = loop {
        if let Some(s) = pending_signal(&sigs) {
            break s;
        }
        match listener.accept() {
            Ok((s, _)) => {
                backoff = ACCEPT_BACKOFF.0;
                if !limits.connect() {
                    if let Some(n) = limits.refused_client_warn.hit() {
                        tracing::warn!(suppressed = n, max_clients = cfg.limits.max_clients, "closing a new connection: [limits] max_clients are connected");
                    }
                    continue;
                }
                let _ = s.set_nonblocking(false);
                let sh = shared.clone();
                let spawned = std::thread::Builder::new().name("pmrxe-client".into()).spawn(move || {
                    let limits = sh.limits.clone();
                    session::run(sh, s);
                    limits.disconnected();
                });
                if let Err(e) = spawned {
                    limits.disconnected();
                    if let Some(n) = limits.accept_errors.hit() {
                        tracing::warn!(suppressed = n, "no thread for a new client: {e}");
                    }
                }
            }
            // Nothing to accept: block until a client connects or SIGINT/SIGTERM arrives (no
            // polling interval: an idle service's control thread costs nothing), waking once
            // a second to see that the lcores are alive.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => wait_for_client_or_signal(&listener, &sigfd, Duration::from_secs(1)),
            Err(e) => {
                if let Some(n) = limits.accept_errors.hit() {
                    tracing::warn!(suppressed = n, "accept: {e}; backing off (repeats are counted in pmrxe stats: limits.accept_errors)");
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
            }
        }
        if threads.iter().any(|t| t.is_finished()) {
            tracing::error!("an lcore thread exited unexpectedly; stopping");
            break 0;
        }
    };
    tracing::info!(signal = sig, "stopping");
    stop.store(true, Ordering::Release);
    // An lcore asleep in `idle.mode = "wait"` sees the stop flag once woken (else its next
    // timeout, up to 1 s).
    for lc in &shared.lcores {
        lc.waker.wake();
    }
    let _ = cm_thread.join();
    for t in threads {
        let _ = t.join();
    }
    remove_own_socket(&sock_path, sock_id);
    drop(dev_nodes);
    drop(shared);
    drop(eal);
    Ok(())
}

/// Choose the fused copy+ICRC kernel by measurement (issue 41): time every kernel this CPU
/// has for a few milliseconds at the largest RoCE payload the ports' MTUs allow, install the
/// fastest (or the one `PMRXE_CRC_KERNEL` forces) before any lcore runs, and log the figures.
fn calibrate_crc(cfg: &Config) -> pmrxe_crc::Calibration {
    // The largest IBTA path MTU (256..4096) that fits the Ethernet MTU with the RoCEv2
    // headers (IPv6 40 + UDP 8 + BTH 12 + RETH 16 + ICRC 4 < 80).
    let eth = cfg.ports.iter().map(|p| usize::from(p.mtu)).max().unwrap_or(1500);
    let frame = [4096, 2048, 1024, 512, 256].into_iter().find(|&m| m + 80 <= eth).unwrap_or(256);
    let cal = pmrxe_crc::Kernel::calibrate(frame, Duration::from_millis(30));
    let k = cal.install();
    let figures: Vec<String> = cal.gb_per_s.iter().map(|(k, g)| format!("{} {g:.1}", k.name())).collect();
    if let Some(bad) = std::env::var("PMRXE_CRC_KERNEL").ok().filter(|n| cal.forced.is_none() && !n.is_empty()) {
        let have: Vec<&str> = pmrxe_crc::Kernel::available().map(|k| k.name()).collect();
        tracing::warn!("PMRXE_CRC_KERNEL={bad}: no such kernel on this CPU (have {}); measuring instead", have.join(", "));
    }
    tracing::info!(kernel = k.name(), forced = cal.is_forced(), frame, "ICRC kernel chosen; GB/s at {frame} B: {}", figures.join(", "));
    cal
}

/// Fail with `InUse` if a service answers at `path`, and with a clear error if anything but
/// "nobody listens" (ENOENT, ECONNREFUSED) stops the probe: a socket we cannot probe is never
/// replaced. Also refuses a directory others may write: every client would refuse it
/// (`pmrxe_abi::ctrl::untrusted_socket_dir`).
fn probe_socket(path: &Path) -> Result<(), ServeError> {
    let err = |source| ServeError::Socket { path: path.to_path_buf(), source };
    match pmrxe_abi::ctrl::seqpacket_connect(path) {
        Ok(_) => return Err(ServeError::InUse(path.to_path_buf())),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ECONNREFUSED)) => {}
        Err(e) => return Err(err(std::io::Error::new(e.kind(), format!("cannot tell whether a service listens there ({e}); not replacing it")))),
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        use std::os::unix::fs::MetadataExt;
        if let Ok(md) = std::fs::metadata(dir) {
            if md.mode() & 0o022 != 0 {
                return Err(err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("its directory {} is writable by others (mode {:o}); clients refuse such a socket: use a directory only the service's user can write, e.g. /run/pmrxe", dir.display(), md.mode() & 0o7777),
                )));
            }
        }
    }
    Ok(())
}

/// Bind the control socket: `service-user:group` mode 0660 (the group's members and root may
/// connect), in a directory made 0750 with the group when the service creates it. Returns the
/// socket's (device, inode), so the service removes it at stop only if it is still its own.
fn bind_socket(path: &Path, access: &crate::access::Access) -> Result<(UnixListener, (u64, u64)), ServeError> {
    use std::os::unix::fs::MetadataExt;
    let err = |source| ServeError::Socket { path: path.to_path_buf(), source };
    let gid = access.group.map(rustix::fs::Gid::from_raw);
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            std::fs::create_dir_all(dir).map_err(err)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750)).map_err(err)?;
            if gid.is_some() {
                rustix::fs::chown(dir, None, gid).map_err(|e| err(e.into()))?;
            }
        }
    }
    // A stale socket (nobody answered the probe) is replaced.
    let _ = std::fs::remove_file(path);
    // SOCK_SEQPACKET: std has no constructor, so bind with libc and wrap.
    let fd = seqpacket_listener(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(err)?;
    if gid.is_some() {
        rustix::fs::chown(path, None, gid).map_err(|e| err(e.into()))?;
    }
    let md = std::fs::metadata(path).map_err(err)?;
    Ok((fd, (md.dev(), md.ino())))
}

/// Remove the control socket at stop, unless another service has since put its own there.
fn remove_own_socket(path: &Path, id: (u64, u64)) {
    use std::os::unix::fs::MetadataExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == id) {
        let _ = std::fs::remove_file(path);
    }
}

fn seqpacket_listener(path: &Path) -> std::io::Result<UnixListener> {
    // UnixListener only needs a listening AF_UNIX fd (accept works the same for SEQPACKET).
    Ok(UnixListener::from(pmrxe_abi::ctrl::seqpacket_listen(path, 128)?))
}

/// No client disconnect may take the service down: a write into a pipe or socket whose reader
/// is gone (a killed `pmrxe capture`, a metrics scraper that hung up, a closed log pipe) must
/// fail with EPIPE, which the writer handles, instead of killing the process with SIGPIPE.
/// Set for the whole process (dispositions are per process) before the service starts any
/// thread, whatever the caller left (the `pmrxe` CLI restores SIG_DFL for its filters). The
/// control socket also sends with MSG_NOSIGNAL (`ctrl::send_msg`).
fn ignore_sigpipe() {
    // SAFETY: setting a signal disposition to SIG_IGN; no handler runs, so nothing can race it.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Block SIGINT/SIGTERM in this thread (and every thread spawned after), so they are only
/// ever received synchronously by the control loop.
fn block_signals() -> std::io::Result<libc::sigset_t> {
    // SAFETY: sigset manipulation on a local set, then pthread_sigmask for this thread.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, core::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(set)
    }
}

/// A non-blocking signalfd for the blocked set: readable while SIGINT/SIGTERM is pending (the
/// control loop still takes the signal with [`pending_signal`]).
fn signal_fd(set: &libc::sigset_t) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: signalfd(-1, ...) creates a new fd from a valid sigset; we own the result.
    let fd = unsafe { libc::signalfd(-1, set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Block until the listener has a connection waiting, a signal is pending, or `limit` passes.
fn wait_for_client_or_signal(listener: &UnixListener, sigfd: &std::os::fd::OwnedFd, limit: Duration) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(listener, PollFlags::IN), PollFd::new(sigfd, PollFlags::IN)];
    let t = Timespec { tv_sec: limit.as_secs() as i64, tv_nsec: i64::from(limit.subsec_nanos()) };
    // EINTR or an error: the loop looks again (accept, signals) and comes back here.
    let _ = poll(&mut fds, Some(&t));
}

fn pending_signal(set: &libc::sigset_t) -> Option<i32> {
    let ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: sigtimedwait with a zero timeout on our blocked set; no info requested.
    let s = unsafe { libc::sigtimedwait(set, core::ptr::null_mut(), &ts) };
    (s > 0).then_some(s)
}

/// If the calling thread runs under a real-time policy (SCHED_FIFO or SCHED_RR), move it to
/// SCHED_OTHER and return the policy and priority it had (for the lcores); else `None`.
fn take_realtime_policy() -> Option<(i32, i32)> {
    // SAFETY: sched_getscheduler/getparam on the calling thread (0) write only `param`.
    let (policy, prio) = unsafe {
        let policy = libc::sched_getscheduler(0);
        let mut param = libc::sched_param { sched_priority: 0 };
        if policy < 0 || libc::sched_getparam(0, &mut param) != 0 {
            return None;
        }
        (policy & !libc::SCHED_RESET_ON_FORK, param.sched_priority)
    };
    if policy != libc::SCHED_FIFO && policy != libc::SCHED_RR {
        return None;
    }
    match set_thread_policy(libc::SCHED_OTHER, 0) {
        Ok(()) => {
            tracing::info!(policy = if policy == libc::SCHED_FIFO { "SCHED_FIFO" } else { "SCHED_RR" }, priority = prio, "started under a real-time policy: the lcores keep it, the control threads run SCHED_OTHER");
            Some((policy, prio))
        }
        Err(e) => {
            tracing::warn!(error = %e, "started under a real-time policy and could not leave it for the control threads");
            None
        }
    }
}

/// Set the calling thread's scheduling policy and priority (`sched_setscheduler` on thread 0,
/// which on Linux is the calling thread).
fn set_thread_policy(policy: i32, prio: i32) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: prio };
    // SAFETY: reads `param`, which lives across the call.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Set the calling thread's niceness (`lcores.nice`): `setpriority(PRIO_PROCESS, tid)`, which
/// on Linux applies to that one thread.
fn set_thread_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
