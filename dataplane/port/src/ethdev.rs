//! [`EthPort`]: a configured, started DPDK ethdev port, and the constructors for every port
//! kind the config knows (ring pair, vdev, PCI; see [`open_ports`]).
//!
//! Ownership: a port is shared by its handles (`Arc<PortInner>`); each handle owns one RX and
//! one TX queue, claimed exclusively ([`EthPort::for_queues`]), so two threads can never burst
//! on the same queue. The port is stopped and closed when the last handle drops, before its
//! mempool and EAL handles are released.

use std::ffi::{CStr, CString};
use std::os::fd::{BorrowedFd, RawFd};
use std::os::raw::c_char;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use arrayvec::ArrayVec;
use pmrxe_config::{Config, MacAddr, PortConfig, PortKind};
use pmrxe_dpdk_sys as sys;

use crate::{Eal, Mbuf, Mempool, PacketBuf, Port, PortError};

/// Queue and address settings for [`EthPort::open`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSettings {
    /// Name used in logs and errors (the config's port name).
    pub name: String,
    /// RX queues to configure.
    pub rx_queues: u16,
    /// TX queues to configure.
    pub tx_queues: u16,
    /// RX descriptors per queue.
    pub rx_desc: u16,
    /// TX descriptors per queue.
    pub tx_desc: u16,
    /// MTU; `None` keeps the driver default.
    pub mtu: Option<u16>,
    /// MAC to use; `None` keeps the driver's. If the driver cannot change its MAC, this one
    /// is still what [`EthPort::mac`] reports (software MAC; frames are built with it).
    pub mac: Option<MacAddr>,
    /// Enable promiscuous mode (errors ignored: many vdevs do not support it).
    pub promiscuous: bool,
}

impl PortSettings {
    /// Settings from a `[[ports]]` entry.
    pub fn from_config(p: &PortConfig) -> PortSettings {
        PortSettings {
            name: p.name.clone(),
            rx_queues: p.rx_queues,
            tx_queues: p.tx_queues,
            rx_desc: p.rx_desc,
            tx_desc: p.tx_desc,
            mtu: Some(p.mtu),
            mac: p.mac,
            promiscuous: true,
        }
    }
}

impl Default for PortSettings {
    fn default() -> Self {
        PortSettings {
            name: "port".into(),
            rx_queues: 1,
            tx_queues: 1,
            rx_desc: 1024,
            tx_desc: 1024,
            mtu: None,
            mac: None,
            promiscuous: true,
        }
    }
}

/// Link state from `rte_eth_link_get_nowait`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkStatus {
    /// Link is up.
    pub up: bool,
    /// Speed in Mbit/s (0 if unknown).
    pub speed_mbps: u32,
    /// Full duplex.
    pub full_duplex: bool,
}

/// Port counters from `rte_eth_stats_get`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames received.
    pub ipackets: u64,
    /// Frames sent.
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent.
    pub obytes: u64,
    /// RX frames dropped by the hardware/driver (queue full).
    pub imissed: u64,
    /// RX errors.
    pub ierrors: u64,
    /// TX errors.
    pub oerrors: u64,
    /// RX mbuf allocation failures.
    pub rx_nombuf: u64,
}

/// The rings behind a ring pair; freed after both ports are closed.
struct RingSet {
    rings: Vec<NonNull<sys::rte_ring>>,
}

// SAFETY: ring pointers are only passed to DPDK, whose ring create/free are thread-safe;
// enqueue/dequeue happen inside the ring PMD under the queue-ownership rules of EthPort.
unsafe impl Send for RingSet {}
// SAFETY: see Send; RingSet exposes no access through &self.
unsafe impl Sync for RingSet {}

impl Drop for RingSet {
    fn drop(&mut self) {
        for r in &self.rings {
            // SAFETY: both ring ports using these rings were closed before this drop (each
            // PortInner closes its port in Drop before releasing its Arc<RingSet>).
            unsafe { sys::rte_ring_free(r.as_ptr()) };
        }
    }
}

struct PortInner {
    port_id: u16,
    name: String,
    mac: MacAddr,
    mtu: u16,
    started: AtomicBool,
    rx_claimed: Vec<AtomicBool>,
    tx_claimed: Vec<AtomicBool>,
    pool: Mempool,
    /// The af_packet PMD's sockets of this port (see [`EthPort::kick`]); empty for other
    /// drivers. Owned by the PMD, open until the port is closed in [`PortInner`]'s drop.
    kick_fds: Vec<RawFd>,
    /// The af_xdp PMD's sockets of this port (their `XDP_STATISTICS`); empty for other drivers.
    xdp_fds: Vec<RawFd>,
    /// What wakes an idle lcore for this port's frames ([`crate::Port::rx_wake`]).
    rx_wake: crate::RxWake,
    _rings: Option<Arc<RingSet>>,
    _eal: Eal,
}

impl Drop for PortInner {
    fn drop(&mut self) {
        if self.started.load(Ordering::Acquire) {
            // SAFETY: last handle: no thread can be bursting on this port any more.
            let rc = unsafe { sys::rte_eth_dev_stop(self.port_id) };
            if rc != 0 {
                tracing::warn!(port = self.port_id, rc, "rte_eth_dev_stop failed");
            }
        }
        // SAFETY: port stopped, no handle left; the mempool and rings outlive this call.
        let rc = unsafe { sys::rte_eth_dev_close(self.port_id) };
        if rc != 0 {
            tracing::warn!(port = self.port_id, rc, "rte_eth_dev_close failed");
        }
    }
}

/// A DPDK port handle that owns one RX and one TX queue.
pub struct EthPort {
    inner: Arc<PortInner>,
    rxq: u16,
    txq: u16,
    /// A burst went to an af_packet socket and no kick has succeeded since.
    unkicked: bool,
    /// Per af_xdp socket of the port, the drops already counted (XDP_STATISTICS are totals).
    xdp_seen: Vec<u64>,
}

impl std::fmt::Debug for EthPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EthPort")
            .field("name", &self.inner.name)
            .field("port_id", &self.inner.port_id)
            .field("rxq", &self.rxq)
            .field("txq", &self.txq)
            .finish()
    }
}

fn cstring(s: &str) -> Result<CString, PortError> {
    CString::new(s).map_err(|_| PortError::Nul(s.to_string()))
}

fn check(call: impl FnOnce() -> String, rc: i32) -> Result<(), PortError> {
    if rc < 0 {
        Err(PortError::dpdk(call(), rc))
    } else {
        Ok(())
    }
}

/// Names of every ethdev EAL knows, for error messages.
fn known_ports() -> String {
    let mut names = Vec::new();
    for id in 0..sys::RTE_MAX_ETHPORTS as u16 {
        // SAFETY: EAL initialised by the caller; validity check only.
        if unsafe { sys::rte_eth_dev_is_valid_port(id) } == 1 {
            names.push(port_name(id).unwrap_or_else(|| id.to_string()));
        }
    }
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// The ethdev name of `port_id`.
pub fn port_name(port_id: u16) -> Option<String> {
    let mut buf = [0 as c_char; sys::RTE_ETH_NAME_MAX_LEN as usize];
    // SAFETY: `buf` has RTE_ETH_NAME_MAX_LEN bytes as the API requires.
    let rc = unsafe { sys::rte_eth_dev_get_name_by_port(port_id, buf.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: DPDK wrote a NUL-terminated name into `buf`.
    Some(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// The port id of the ethdev called `name` (vdev name such as `net_memif0`, or a PCI address).
pub fn find_port(name: &str) -> Result<u16, PortError> {
    let c = cstring(name)?;
    let mut id = 0u16;
    // SAFETY: valid C string and out-pointer.
    let rc = unsafe { sys::rte_eth_dev_get_port_by_name(c.as_ptr(), &mut id) };
    if rc == 0 {
        Ok(id)
    } else {
        Err(PortError::NoSuchPort(name.to_string(), known_ports()))
    }
}

/// The ethdev name DPDK gives the device in `devargs` (the part before the first comma; PCI
/// addresses get the `0000:` domain if they lack one).
pub fn devargs_name(devargs: &str) -> String {
    let head = devargs.split(',').next().unwrap_or(devargs);
    if head.matches(':').count() == 1 && head.contains('.') {
        format!("0000:{head}")
    } else {
        head.to_string()
    }
}

static RING_SEQ: AtomicU32 = AtomicU32::new(0);

impl EthPort {
    /// Configures `port_id` with `settings` (queues on `pool`) and starts it.
    pub fn open(eal: &Eal, pool: &Mempool, port_id: u16, settings: &PortSettings) -> Result<EthPort, PortError> {
        Self::open_inner(eal, pool, port_id, settings, None)
    }

    /// Finds the device of `devargs` (probing it with `rte_dev_probe` if EAL does not have it
    /// yet, e.g. a vdev not given with `--vdev`), then [`EthPort::open`]s it.
    pub fn probe(eal: &Eal, pool: &Mempool, devargs: &str, settings: &PortSettings) -> Result<EthPort, PortError> {
        let name = devargs_name(devargs);
        let id = match find_port(&name) {
            Ok(id) => id,
            Err(_) => {
                let c = cstring(devargs)?;
                // SAFETY: EAL initialised; valid C string.
                let rc = unsafe { sys::rte_dev_probe(c.as_ptr()) };
                check(|| format!("rte_dev_probe({devargs})"), rc)?;
                find_port(&name)?
            }
        };
        Self::open(eal, pool, id, settings)
    }

    /// Creates two net_ring ports wired back to back (A's TX is B's RX and vice versa) with
    /// `rte_eth_from_rings`, one ring per queue and direction, and opens both.
    pub fn ring_pair(
        eal: &Eal,
        pool: &Mempool,
        a: &PortSettings,
        b: &PortSettings,
    ) -> Result<(EthPort, EthPort), PortError> {
        let nq = a.rx_queues.max(a.tx_queues).max(b.rx_queues).max(b.tx_queues);
        let ring_size = u32::from(a.rx_desc.max(b.rx_desc)).next_power_of_two();
        let mut rings = RingSet { rings: Vec::new() };
        let mut make = |dir: &str| -> Result<NonNull<sys::rte_ring>, PortError> {
            let seq = RING_SEQ.fetch_add(1, Ordering::Relaxed);
            let name = format!("pmrxe_r{seq}_{dir}");
            let c = cstring(&name)?;
            // Each ring has one producer (one TX queue) and one consumer (one RX queue).
            let flags = sys::RING_F_SP_ENQ | sys::RING_F_SC_DEQ;
            // SAFETY: EAL initialised; valid name; size is a power of two.
            let r = unsafe { sys::rte_ring_create(c.as_ptr(), ring_size, sys::SOCKET_ID_ANY, flags) };
            let r = NonNull::new(r).ok_or_else(|| PortError::from_rte_errno(format!("rte_ring_create({name})")))?;
            rings.rings.push(r);
            Ok(r)
        };
        let mut a_to_b = Vec::new();
        let mut b_to_a = Vec::new();
        for _ in 0..nq {
            a_to_b.push(make("ab")?.as_ptr());
            b_to_a.push(make("ba")?.as_ptr());
        }
        let rings = Arc::new(rings);
        let mk_port = |s: &PortSettings, rx: &[*mut sys::rte_ring], tx: &[*mut sys::rte_ring]| -> Result<u16, PortError> {
            let c = cstring(&s.name)?;
            // SAFETY: EAL initialised; ring arrays hold `nq` live rings each; the rings
            // outlive the port (RingSet is released after the port is closed).
            let rc = unsafe {
                sys::rte_eth_from_rings(
                    c.as_ptr(),
                    rx.as_ptr(),
                    u32::from(s.rx_queues),
                    tx.as_ptr(),
                    u32::from(s.tx_queues),
                    0,
                )
            };
            check(|| format!("rte_eth_from_rings({})", s.name), rc)?;
            Ok(rc as u16)
        };
        let ida = mk_port(a, &b_to_a, &a_to_b)?;
        let pa = Self::open_inner(eal, pool, ida, a, Some(rings.clone()))?;
        let idb = mk_port(b, &a_to_b, &b_to_a)?;
        let pb = Self::open_inner(eal, pool, idb, b, Some(rings))?;
        Ok((pa, pb))
    }

    fn open_inner(
        eal: &Eal,
        pool: &Mempool,
        port_id: u16,
        s: &PortSettings,
        rings: Option<Arc<RingSet>>,
    ) -> Result<EthPort, PortError> {
        let id = port_id;
        let name = &s.name;
        let mut info = sys::rte_eth_dev_info::default();
        // SAFETY: valid port id checked by DPDK; `info` is a valid out-struct.
        check(|| format!("rte_eth_dev_info_get({name})"), unsafe { sys::rte_eth_dev_info_get(id, &mut info) })?;
        // The XDP sockets that exist before this port's queues are set up: the af_xdp PMD
        // makes one per queue in its queue setup, so the new ones are this port's.
        let xdp_before = if cstr_eq(info.driver_name, "net_af_xdp") { af_xdp_sockets() } else { Vec::new() };
        let mut conf = sys::rte_eth_conf::default();
        if let Some(mtu) = s.mtu {
            if mtu > info.max_mtu && info.max_mtu != 0 {
                return Err(PortError::dpdk(format!("{name}: MTU {mtu} above the driver maximum {}", info.max_mtu), -22));
            }
            conf.rxmode.mtu = u32::from(mtu);
        }
        // SAFETY: `conf` is a valid, zero-initialised config (DPDK's documented idiom).
        let rc = unsafe { sys::rte_eth_dev_configure(id, s.rx_queues, s.tx_queues, &conf) };
        check(|| format!("rte_eth_dev_configure({name}, rxq={}, txq={})", s.rx_queues, s.tx_queues), rc)?;
        let (mut nrx, mut ntx) = (s.rx_desc, s.tx_desc);
        // SAFETY: valid pointers to locals.
        let rc = unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(id, &mut nrx, &mut ntx) };
        check(|| format!("rte_eth_dev_adjust_nb_rx_tx_desc({name})"), rc)?;
        // SAFETY: plain query.
        let socket = unsafe { sys::rte_eth_dev_socket_id(id) };
        let socket = if socket < 0 { 0 } else { socket as u32 };
        for q in 0..s.rx_queues {
            // SAFETY: port configured with rx_queues queues; NULL rxconf = driver defaults;
            // the pool outlives the port (PortInner holds it).
            let rc = unsafe { sys::rte_eth_rx_queue_setup(id, q, nrx, socket, std::ptr::null(), pool.as_raw()) };
            check(|| format!("rte_eth_rx_queue_setup({name}, q={q})"), rc)?;
        }
        for q in 0..s.tx_queues {
            // SAFETY: as above; NULL txconf = driver defaults.
            let rc = unsafe { sys::rte_eth_tx_queue_setup(id, q, ntx, socket, std::ptr::null()) };
            check(|| format!("rte_eth_tx_queue_setup({name}, q={q})"), rc)?;
        }
        let mut mac = None;
        if let Some(m) = s.mac {
            let mut addr = sys::rte_ether_addr { addr_bytes: m.0 };
            // SAFETY: valid port and address.
            let rc = unsafe { sys::rte_eth_dev_default_mac_addr_set(id, &mut addr) };
            if rc != 0 {
                tracing::debug!(port = %name, rc, "driver kept its MAC; using {m} in software");
            }
            mac = Some(m);
        }
        let mac = match mac {
            Some(m) => m,
            None => {
                let mut addr = sys::rte_ether_addr::default();
                // SAFETY: valid out-pointer.
                check(|| format!("rte_eth_macaddr_get({name})"), unsafe { sys::rte_eth_macaddr_get(id, &mut addr) })?;
                MacAddr(addr.addr_bytes)
            }
        };
        if s.promiscuous {
            // SAFETY: plain call; unsupported is fine.
            let _ = unsafe { sys::rte_eth_promiscuous_enable(id) };
        }
        let kick_fds = if cstr_eq(info.driver_name, "net_af_packet") { af_packet_sockets(info.if_index) } else { Vec::new() };
        tracing::debug!(port = %name, sockets = ?kick_fds, "af_packet sockets to kick");
        // What wakes an lcore in `wait` mode. DPDK 22.11's af_packet and af_xdp PMDs have no Rx
        // interrupts (no rx_queue_intr_enable; `rte_eth_dev_rx_intr_ctl_q_get_fd` has nothing
        // to return), but their sockets poll readable when frames wait: af_packet's
        // (packet_poll looks at the mmapped RX ring) and af_xdp's (xsk_poll: RX ring not
        // empty). A net_ring pair is fed only by lcores of this process, which wake the
        // receiver themselves.
        let rx_wake = if cstr_eq(info.driver_name, "net_ring") {
            crate::RxWake::Local
        } else if cstr_eq(info.driver_name, "net_af_packet") && !kick_fds.is_empty() {
            crate::RxWake::Fds(kick_fds.clone())
        } else if cstr_eq(info.driver_name, "net_af_xdp") {
            match af_xdp_sockets() {
                f if f.is_empty() => crate::RxWake::Poll,
                f => crate::RxWake::Fds(f),
            }
        } else {
            crate::RxWake::Poll
        };
        tracing::debug!(port = %name, ?rx_wake, "idle wake-up source");
        let xdp_fds: Vec<RawFd> = if cstr_eq(info.driver_name, "net_af_xdp") { af_xdp_sockets().into_iter().filter(|f| !xdp_before.contains(f)).collect() } else { Vec::new() };
        tracing::debug!(port = %name, sockets = ?xdp_fds, "af_xdp sockets (drop statistics)");
        let inner = Arc::new(PortInner {
            port_id: id,
            name: name.clone(),
            mac,
            mtu: 0,
            started: AtomicBool::new(false),
            rx_claimed: (0..s.rx_queues).map(|_| AtomicBool::new(false)).collect(),
            tx_claimed: (0..s.tx_queues).map(|_| AtomicBool::new(false)).collect(),
            pool: pool.clone(),
            kick_fds,
            xdp_fds,
            rx_wake,
            _rings: rings,
            _eal: eal.clone(),
        });
        // From here on a failure closes the port through PortInner::drop.
        // SAFETY: configured with all queues set up.
        check(|| format!("rte_eth_dev_start({name})"), unsafe { sys::rte_eth_dev_start(id) })?;
        inner.started.store(true, Ordering::Release);
        let mut mtu = 0u16;
        // SAFETY: valid out-pointer.
        let _ = unsafe { sys::rte_eth_dev_get_mtu(id, &mut mtu) };
        let mut inner = inner;
        if let Some(i) = Arc::get_mut(&mut inner) {
            i.mtu = if mtu != 0 { mtu } else { s.mtu.unwrap_or(1500) };
        }
        EthPort::claim(&inner, 0, 0).ok_or_else(|| PortError::Verify("queue 0 already claimed".into()))
    }

    fn claim(inner: &Arc<PortInner>, rxq: u16, txq: u16) -> Option<EthPort> {
        let rx = inner.rx_claimed.get(usize::from(rxq))?;
        let tx = inner.tx_claimed.get(usize::from(txq))?;
        if rx.swap(true, Ordering::AcqRel) {
            return None;
        }
        if tx.swap(true, Ordering::AcqRel) {
            rx.store(false, Ordering::Release);
            return None;
        }
        Some(EthPort { inner: inner.clone(), rxq, txq, unkicked: false, xdp_seen: vec![0; inner.xdp_fds.len()] })
    }

    /// Another handle on the same port owning RX queue `rxq` and TX queue `txq` (for another
    /// lcore). `None` if a queue does not exist or is owned by a live handle.
    pub fn for_queues(&self, rxq: u16, txq: u16) -> Option<EthPort> {
        EthPort::claim(&self.inner, rxq, txq)
    }

    /// The DPDK port id.
    pub fn id(&self) -> u16 {
        self.inner.port_id
    }
    /// The configured name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// RX queue of this handle.
    pub fn rx_queue(&self) -> u16 {
        self.rxq
    }
    /// TX queue of this handle.
    pub fn tx_queue(&self) -> u16 {
        self.txq
    }
    /// The mempool the port receives into and `alloc` takes from.
    pub fn mempool(&self) -> &Mempool {
        &self.inner.pool
    }

    /// Current link status (non-blocking).
    pub fn link(&self) -> LinkStatus {
        let mut l = sys::rte_eth_link::default();
        // SAFETY: valid port and out-pointer.
        let rc = unsafe { sys::rte_eth_link_get_nowait(self.inner.port_id, &mut l) };
        if rc != 0 {
            return LinkStatus { up: false, speed_mbps: 0, full_duplex: false };
        }
        LinkStatus {
            up: l.link_status() == sys::RTE_ETH_LINK_UP as u16,
            speed_mbps: l.link_speed,
            full_duplex: l.link_duplex() == sys::RTE_ETH_LINK_FULL_DUPLEX as u16,
        }
    }

    /// Port counters.
    pub fn stats(&self) -> Result<PortStats, PortError> {
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: valid port and out-pointer.
        check(|| format!("rte_eth_stats_get({})", self.inner.name), unsafe {
            sys::rte_eth_stats_get(self.inner.port_id, &mut s)
        })?;
        Ok(PortStats {
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        })
    }

    /// Receives up to `out.remaining_capacity()` mbufs from this handle's RX queue.
    #[inline]
    pub fn rx_burst<const N: usize>(&mut self, out: &mut ArrayVec<Mbuf, N>) -> usize {
        let room = out.remaining_capacity().min(usize::from(u16::MAX)) as u16;
        if room == 0 {
            return 0;
        }
        let mut ptrs = [std::ptr::null_mut::<sys::rte_mbuf>(); N];
        // SAFETY: this handle exclusively owns `rxq` (claimed); `ptrs` has room for `room`.
        let n = usize::from(unsafe { sys::pmrxe_eth_rx_burst(self.inner.port_id, self.rxq, ptrs.as_mut_ptr(), room) });
        for &p in &ptrs[..n] {
            // SAFETY: the driver handed us ownership of `n` valid mbufs.
            out.push(unsafe { Mbuf::from_raw(p) });
        }
        n
    }

    /// Sends a prefix of `bufs`; sent mbufs are removed (now owned by the driver), unsent
    /// ones stay in `bufs` in order.
    #[inline]
    pub fn tx_burst<const N: usize>(&mut self, bufs: &mut ArrayVec<Mbuf, N>) -> usize {
        let len = bufs.len().min(usize::from(u16::MAX));
        if len == 0 {
            return 0;
        }
        // SAFETY: Mbuf is repr(transparent) over NonNull<rte_mbuf>, so the ArrayVec's
        // storage is an array of `len` valid `rte_mbuf *`; this handle owns `txq`. The driver
        // takes ownership of the first `n`, which we forget below without freeing.
        let n = usize::from(unsafe {
            sys::pmrxe_eth_tx_burst(self.inner.port_id, self.txq, bufs.as_mut_ptr().cast::<*mut sys::rte_mbuf>(), len as u16)
        });
        for m in bufs.drain(..n) {
            std::mem::forget(m);
        }
        self.unkicked |= n > 0 && !self.inner.kick_fds.is_empty();
        n
    }

    /// Make the kernel send what the af_packet PMD left in its TX ring.
    ///
    /// The PMD (DPDK 22.11 `eth_af_packet_tx`) marks frames `TP_STATUS_SEND_REQUEST` and
    /// then calls `sendto` once, non-blocking. When the kernel answers EAGAIN or ENOBUFS
    /// (the socket's send buffer is full: a qdisc such as tbf holds its frames), the PMD
    /// reports the burst sent and the rest of the frames wait in the ring for the next
    /// non-empty burst; an empty burst returns before the `sendto`. A sender whose QPs have
    /// their whole window in that ring sends nothing more, so the frames sat there until the
    /// retransmission timer fired (67 ms with perftest's timeout 14): spurious timeouts that
    /// cut a tbf-limited `ib_write_bw -q 4` to 23 % of the link on a loaded machine. This
    /// makes the same `sendto` the PMD makes. Returns true while frames may be left (the
    /// kernel refused or took only some: call again later), false once a kick found nothing
    /// pending, and always for other drivers.
    pub fn kick(&mut self) -> bool {
        if !self.unkicked {
            return false;
        }
        let mut held = false;
        for &fd in &self.inner.kick_fds {
            // SAFETY: the PMD opened this socket before the port started and closes it only in
            // rte_eth_dev_stop, which runs in PortInner::drop after the last handle (this one
            // holds an Arc) is gone.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            // The kernel (tpacket_snd) sends ring frames until its send buffer is full and
            // returns the bytes it sent: more than 0 may leave frames behind, so only 0 (none
            // pending) or an error other than "full" ends the kicking.
            match rustix::net::send(fd, &[], rustix::net::SendFlags::DONTWAIT) {
                Ok(0) => {}
                Ok(_) => held = true,
                Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::NOBUFS => held = true,
                Err(_) => {}
            }
        }
        self.unkicked = held;
        held
    }
}

/// Frames an AF_PACKET socket dropped since the last read (`PACKET_STATISTICS`'s `tp_drops`;
/// the kernel resets both counters on each read). 0 when the socket cannot say.
pub(crate) fn packet_socket_drops(fd: RawFd) -> u64 {
    let mut st = libc::tpacket_stats { tp_packets: 0, tp_drops: 0 };
    let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `st`, a live local of that size, and
    // `len`; `fd` is the PMD's socket (see `EthPort::kick`), or any other number, which only
    // makes the call fail.
    let rc = unsafe { libc::getsockopt(fd, libc::SOL_PACKET, libc::PACKET_STATISTICS, (&mut st as *mut libc::tpacket_stats).cast(), &mut len) };
    if rc == 0 {
        u64::from(st.tp_drops)
    } else {
        0
    }
}

/// Frames an AF_XDP socket lost on receive so far (`XDP_STATISTICS`: `rx_dropped`, frames the
/// kernel could not place, e.g. with no buffer on the fill ring, plus `rx_ring_full`, frames
/// that found the RX ring full). Totals since the socket was made; 0 when it cannot say.
pub(crate) fn xdp_socket_drops(fd: RawFd) -> u64 {
    // struct xdp_statistics (linux/if_xdp.h): six __u64 counters, rx_dropped first and
    // rx_ring_full fourth; older kernels fill only the first three (the length says).
    let mut st = [0u64; 6];
    let mut len = std::mem::size_of_val(&st) as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `st`, a live local of that size, and
    // updates `len`; `fd` is the PMD's socket, open while the port is (a wrong fd only fails).
    let rc = unsafe { libc::getsockopt(fd, libc::SOL_XDP, libc::XDP_STATISTICS, st.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return 0;
    }
    let full = if len as usize >= 4 * 8 { st[3] } else { 0 };
    st[0] + full
}

/// The AF_XDP sockets of this process (the af_xdp PMD's, made when its queues were set up).
/// An XDP socket does not say which interface it is bound to (no getsockname), so a process
/// with several af_xdp ports lists all of them for each: an lcore then wakes for another
/// port's frames too (a spurious wake-up, never a missed one).
fn af_xdp_sockets() -> Vec<RawFd> {
    socket_fds(|fd, _| {
        // SAFETY: an fd of this process listed a moment ago, borrowed for one getsockopt
        // (a stale or reused number only fails or answers for another socket).
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        rustix::net::sockopt::socket_domain(b).is_ok_and(|d| d == rustix::net::AddressFamily::XDP)
    })
}

/// The socket fds of this process (from /proc/self/fd) that `keep(fd, inode)` accepts, sorted.
fn socket_fds(mut keep: impl FnMut(RawFd, &str) -> bool) -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    let mut fds: Vec<RawFd> = dir
        .flatten()
        .filter_map(|e| {
            let fd = e.file_name().to_str()?.parse::<RawFd>().ok()?;
            let link = std::fs::read_link(e.path()).ok()?;
            let ino = link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_string();
            keep(fd, &ino).then_some(fd)
        })
        .collect();
    fds.sort_unstable();
    fds
}

fn cstr_eq(p: *const c_char, want: &str) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: DPDK's dev_info strings are NUL-terminated and static for the driver's life.
    unsafe { CStr::from_ptr(p) }.to_bytes() == want.as_bytes()
}

/// The AF_PACKET sockets of this process bound to interface `if_index` (the af_packet PMD's,
/// one per queue pair): /proc/net/packet maps socket inodes to interfaces, /proc/self/fd maps
/// fds to inodes. Read once when the port opens.
fn af_packet_sockets(if_index: u32) -> Vec<RawFd> {
    let Ok(table) = std::fs::read_to_string("/proc/net/packet") else { return Vec::new() };
    // Columns: sk RefCnt Type Proto Iface R Rmem User Inode.
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 9 && f[4].parse::<u32>().ok() == Some(if_index)).then(|| f[8].to_string())
        })
        .collect();
    socket_fds(|_, ino| inodes.iter().any(|i| i == ino))
}

impl Drop for EthPort {
    fn drop(&mut self) {
        if let Some(r) = self.inner.rx_claimed.get(usize::from(self.rxq)) {
            r.store(false, Ordering::Release);
        }
        if let Some(t) = self.inner.tx_claimed.get(usize::from(self.txq)) {
            t.store(false, Ordering::Release);
        }
    }
}

impl PacketBuf for Mbuf {
    #[inline]
    fn data(&self) -> &[u8] {
        Mbuf::data(self)
    }
    #[inline]
    fn data_mut(&mut self) -> &mut [u8] {
        Mbuf::data_mut(self)
    }
    #[inline]
    fn len(&self) -> usize {
        Mbuf::len(self)
    }
    #[inline]
    fn tailroom(&self) -> usize {
        Mbuf::tailroom(self)
    }
    #[inline]
    fn headroom(&self) -> usize {
        Mbuf::headroom(self)
    }
    #[inline]
    fn append(&mut self, len: usize) -> Option<&mut [u8]> {
        Mbuf::append(self, len)
    }
    #[inline]
    fn prepend(&mut self, len: usize) -> Option<&mut [u8]> {
        Mbuf::prepend(self, len)
    }
    #[inline]
    fn trim(&mut self, len: usize) -> bool {
        Mbuf::trim(self, len)
    }
    #[inline]
    fn adj(&mut self, len: usize) -> bool {
        Mbuf::adj(self, len)
    }
    #[inline]
    fn open_aligned(&mut self, at: usize, keep: usize) -> Option<&mut [u8]> {
        Mbuf::open_aligned(self, at, keep)
    }
    #[inline]
    fn free_all<const N: usize>(bufs: &mut ArrayVec<Mbuf, N>) {
        let n = bufs.len();
        if n == 0 {
            return;
        }
        // SAFETY: Mbuf is repr(transparent) over NonNull<rte_mbuf>, so the ArrayVec's storage
        // is `n` valid `rte_mbuf *` that we own; DPDK frees every one of them.
        unsafe { sys::pmrxe_pktmbuf_free_bulk(bufs.as_mut_ptr().cast::<*mut sys::rte_mbuf>(), n as u32) };
        // SAFETY: the `n` handles were freed above: forget them (no second free by Drop).
        unsafe { bufs.set_len(0) };
    }
}

impl Port for EthPort {
    type Buf = Mbuf;
    fn port_id(&self) -> u16 {
        self.inner.port_id
    }
    fn mac(&self) -> MacAddr {
        self.inner.mac
    }
    fn mtu(&self) -> u16 {
        self.inner.mtu
    }
    fn alloc(&mut self) -> Option<Mbuf> {
        self.inner.pool.alloc()
    }
    fn alloc_bulk<const N: usize>(&mut self, out: &mut ArrayVec<Mbuf, N>) -> usize {
        self.inner.pool.alloc_bulk(out)
    }
    fn rx_burst<const N: usize>(&mut self, out: &mut ArrayVec<Mbuf, N>) -> usize {
        EthPort::rx_burst(self, out)
    }
    fn tx_burst<const N: usize>(&mut self, bufs: &mut ArrayVec<Mbuf, N>) -> usize {
        EthPort::tx_burst(self, bufs)
    }
    fn kick(&mut self) -> bool {
        EthPort::kick(self)
    }
    fn rx_ring_drops(&mut self) -> u64 {
        let packet: u64 = self.inner.kick_fds.iter().map(|&fd| packet_socket_drops(fd)).sum();
        let mut xdp = 0;
        for (&fd, seen) in self.inner.xdp_fds.iter().zip(self.xdp_seen.iter_mut()) {
            let total = xdp_socket_drops(fd);
            xdp += total.saturating_sub(*seen);
            *seen = total.max(*seen);
        }
        packet + xdp
    }
    fn rx_wake(&self) -> crate::RxWake {
        self.inner.rx_wake.clone()
    }
}

/// Mbufs a set of ports needs: every RX/TX descriptor plus ring-pair rings plus slack.
fn pool_size(cfg: &Config) -> u32 {
    let mut n: u32 = 4096;
    for p in &cfg.ports {
        n += u32::from(p.rx_queues) * u32::from(p.rx_desc) + u32::from(p.tx_queues) * u32::from(p.tx_desc);
        if p.kind() == PortKind::RingPair {
            n += u32::from(p.rx_desc) * u32::from(p.rx_queues.max(p.tx_queues));
        }
    }
    // Keep the pool within half of EAL's memory (about 2.5 KiB per default mbuf).
    let max_frame = cfg.ports.iter().map(|p| u32::from(p.mtu) + 18).max().unwrap_or(1518);
    let per = max_frame.max(2048) + 512;
    let cap = ((u64::from(cfg.eal.memory_mb) << 20) / 2 / u64::from(per)) as u32;
    n.min(cap.max(1024))
}

/// Creates the process's mempool and opens every `[[ports]]` entry of `cfg`, in order:
/// ring pairs are created in-process, vdev/PCI ports are found by name (EAL was given them
/// through [`crate::EalConfig::from_config`]) or probed.
pub fn open_ports(cfg: &Config, eal: &Eal) -> Result<Vec<EthPort>, PortError> {
    let max_frame = cfg.ports.iter().map(|p| u32::from(p.mtu) + 18).max().unwrap_or(1518);
    let pool = Mempool::new(eal, pool_size(cfg), 256, max_frame)?;
    let mut out: Vec<Option<EthPort>> = (0..cfg.ports.len()).map(|_| None).collect();
    for (i, p) in cfg.ports.iter().enumerate() {
        if out[i].is_some() {
            continue;
        }
        let s = PortSettings::from_config(p);
        match p.kind() {
            PortKind::RingPair => {
                let peer = p.peer.as_deref().unwrap_or_default();
                let (j, q) = cfg.port(peer).ok_or_else(|| PortError::NoSuchPort(peer.to_string(), "config".into()))?;
                let (a, b) = EthPort::ring_pair(eal, &pool, &s, &PortSettings::from_config(q))?;
                out[i] = Some(a);
                out[j] = Some(b);
            }
            PortKind::Vdev | PortKind::Pci => {
                let d = p.devargs.as_deref().unwrap_or_default();
                out[i] = Some(EthPort::probe(eal, &pool, d, &s)?);
            }
        }
    }
    Ok(out.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::{af_packet_sockets, packet_socket_drops};

    /// What a full receive ring drops is read from the socket, and the read resets it: a
    /// receiver on `lo` for a local experimental EtherType with the smallest receive buffer
    /// the kernel allows, never read, and 200 frames sent to it (root: CAP_NET_RAW).
    #[test]
    fn packet_socket_drops_reads_and_resets_what_a_full_receiver_dropped() {
        const PROTO: u16 = 0x88b5; // IEEE 802 local experimental EtherType
        // SAFETY: plain socket calls on fds this test owns; every pointer is to a live local of
        // the size passed with it.
        unsafe {
            let lo = libc::if_nametoindex(c"lo".as_ptr()) as i32;
            assert!(lo > 0, "no lo interface");
            let rx = libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, i32::from(PROTO.to_be()));
            assert!(rx >= 0, "AF_PACKET socket: {} (the test needs root: CAP_NET_RAW)", std::io::Error::last_os_error());
            let zero: libc::c_int = 0;
            assert_eq!(libc::setsockopt(rx, libc::SOL_SOCKET, libc::SO_RCVBUF, (&zero as *const libc::c_int).cast(), 4), 0);
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = PROTO.to_be();
            sll.sll_ifindex = lo;
            let sll_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            assert_eq!(libc::bind(rx, (&sll as *const libc::sockaddr_ll).cast(), sll_len), 0, "bind: {}", std::io::Error::last_os_error());
            assert_eq!(packet_socket_drops(rx), 0, "nothing dropped before any frame");
            let tx = libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
            assert!(tx >= 0);
            let mut frame = [0u8; 1000];
            frame[12..14].copy_from_slice(&PROTO.to_be_bytes());
            for _ in 0..200 {
                let n = libc::sendto(tx, frame.as_ptr().cast(), frame.len(), 0, (&sll as *const libc::sockaddr_ll).cast(), sll_len);
                assert_eq!(n, frame.len() as isize, "sendto: {}", std::io::Error::last_os_error());
            }
            // The loopback delivers in its receive softirq, normally before sendto returns; read
            // until the drops are in (bounded). Were reads not resetting, the sum would pass 200.
            let t0 = std::time::Instant::now();
            let mut dropped = 0;
            while dropped < 150 && t0.elapsed() < std::time::Duration::from_secs(5) {
                dropped += packet_socket_drops(rx);
                std::thread::yield_now();
            }
            assert!((150..=200).contains(&dropped), "a ~2 KiB receive buffer never read dropped {dropped} of 200 frames");
            assert_eq!(packet_socket_drops(rx), 0, "the read resets the count");
            libc::close(tx);
            libc::close(rx);
        }
    }

    /// The kick finds the PMD's sockets the way this finds one of ours: an AF_PACKET socket not
    /// bound to any interface is listed under interface 0, and under no other.
    #[test]
    fn af_packet_sockets_finds_this_process_packet_sockets() {
        use rustix::net::{socket, AddressFamily, SocketType};
        let Ok(s) = socket(AddressFamily::PACKET, SocketType::RAW, None) else {
            eprintln!("no AF_PACKET socket (needs CAP_NET_RAW): skipped");
            return;
        };
        let fd = s.as_raw_fd();
        assert!(af_packet_sockets(0).contains(&fd), "fd {fd} not found among {:?}", af_packet_sockets(0));
        assert!(!af_packet_sockets(u32::MAX).contains(&fd));
        // Closed, it is listed no more. Compared by inode, not fd number: another test of this
        // binary may open a packet socket that reuses the number at once (it failed a CI run so).
        let ino = |f: std::os::fd::RawFd| std::fs::read_link(format!("/proc/self/fd/{f}")).ok();
        let mine = ino(fd).expect("the socket's /proc/self/fd link");
        drop(s);
        assert!(af_packet_sockets(0).into_iter().all(|f| ino(f).as_ref() != Some(&mine)), "the closed socket {mine:?} is still listed");
    }
}
