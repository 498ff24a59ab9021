//! Limits, enforced and reported: the device-wide limits `ibv_query_device` reports, the
//! per-client caps of `[limits.per_client]`, the service's fd budget and the rate-limited
//! warnings of events a client can repeat.
//!
//! Contract:
//! * **Device limits are exact.** Every PD/CQ/QP/SRQ/MR/MW/AH a client creates first takes a
//!   [`Reservation`] of its device's counter with a compare-and-swap that never passes the
//!   limit, so session threads racing for the last slot cannot both win. A reservation not
//!   committed (the creation failed later) gives its slot back when dropped. Refusal: `ENOMEM`.
//! * **Per-client caps.** A session's [`Usage`] (only its own thread touches it) counts what
//!   the client holds per device and kind; reaching a cap is refused before the device counter
//!   is touched. Refusal: `EAGAIN` (what the kernel's rdma cgroup answers at `rdma.max`).
//! * **Fds.** CQ/QP/SRQ rings, completion channels and registered segments each keep one fd
//!   open in the service. They draw on the client's `max_fds` (`EAGAIN`) and on the service's
//!   fd budget, the soft RLIMIT_NOFILE less what start-up opened, a reserve and three fds per
//!   allowed client (`ENOMEM` when spent). [`fd_plan`] sizes RLIMIT_NOFILE at start.
//! * **Everything is given back when its client goes**: dropping a session's [`Usage`]
//!   releases every count it holds, whatever path ended the session.
//! * **Counted, not logged.** Each refusal bumps a counter shown by `pmrxe stats` ([`json`]);
//!   warnings a client can repeat cheaply go through a [`RateLimited`] (one line per period,
//!   with the number suppressed).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pmrxe_config::{LimitKind, Limits};
use serde_json::json;

const KINDS: usize = LimitKind::ALL.len();
// The config's fair share of QP slots is taken from the lcore's real table.
const _: () = assert!(pmrxe_config::LCORE_QP_SLOTS as usize == pmrxe_runtime::lcore::MAX_QPS_PER_LCORE);

/// Fds the service keeps free for itself beyond what start-up opened: stats and capture
/// connections, the CM's sockets, the metrics endpoint, log files.
pub const FD_RESERVE: u64 = 64;
/// Fds one connected client costs besides its objects: the socket, the client page, the
/// async-event fd.
pub const FDS_PER_CLIENT: u64 = 3;

/// An object the service may refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Obj {
    /// A device object counted against `[limits]` (and its per-client cap).
    Kind(LimitKind),
    /// A completion channel (one eventfd, no device).
    Channel,
    /// A registered memory segment (the client's fd, kept open).
    Segment,
}

impl Obj {
    /// Fds the service holds for one such object.
    fn fds(self) -> u32 {
        match self {
            Obj::Kind(LimitKind::Cq | LimitKind::Qp | LimitKind::Srq) | Obj::Channel | Obj::Segment => 1,
            Obj::Kind(_) => 0,
        }
    }
}

/// Why a creation was refused: the errno and message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `ENOMEM` (device limit or service fd budget) or `EAGAIN` (the client's cap).
    pub errno: i32,
    /// One line for the client.
    pub msg: String,
}

/// The service's fd plan (see [`fd_plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdPlan {
    /// Fds the device limits and connected clients need: what start-up opened, the reserve,
    /// three per allowed client and one per CQ/QP/SRQ every device may hold.
    pub need: u64,
    /// What every cap could use at most (`need` plus each allowed client's `max_fds` of
    /// channels and segments): the soft limit asked for.
    pub want: u64,
    /// The soft limit set (at most the hard limit).
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
    /// Fds clients' objects may hold in all (`soft` less start-up, reserve and per-client fds).
    pub object_budget: u64,
    /// The effective per-client fd cap.
    pub client_fds: u32,
}

/// Sizes RLIMIT_NOFILE for `limits` on `devices` devices when `open_now` fds are open:
/// raises the soft limit to what every cap could use (at most the hard limit). `Err`: one
/// line with the numbers when the hard limit cannot cover even the device limits (the
/// service refuses to start: `ibv_query_device` would report limits it cannot reach).
pub fn fd_plan(limits: &Limits, devices: usize, open_now: u64, soft: u64, hard: u64) -> Result<FdPlan, String> {
    let rings = LimitKind::ALL
        .iter()
        .filter(|k| Obj::Kind(**k).fds() > 0)
        .map(|k| u64::from(limits.device_max(*k)))
        .sum::<u64>()
        .saturating_mul(devices.max(1) as u64);
    let fixed = open_now + FD_RESERVE + u64::from(limits.max_clients) * FDS_PER_CLIENT;
    let need = fixed + rings;
    let client_extra = u64::from(limits.per_client.max_fds.unwrap_or(pmrxe_config::DEFAULT_CLIENT_FDS));
    let want = need.saturating_add(u64::from(limits.max_clients).saturating_mul(client_extra));
    if hard < need {
        return Err(format!(
            "RLIMIT_NOFILE hard limit {hard} cannot cover the configured limits: they need {need} fds \
             ({open_now} open at start + {FD_RESERVE} reserve + {} clients x {FDS_PER_CLIENT} + {devices} devices x \
             (max_qp {} + max_cq {} + max_srq {})); raise the hard limit (LimitNOFILE=) or lower [limits]",
            limits.max_clients, limits.max_qp, limits.max_cq, limits.max_srq
        ));
    }
    let soft = soft.max(want.min(hard));
    let object_budget = soft - fixed;
    let client_fds = match limits.per_client.max_fds {
        Some(f) => f,
        None => (object_budget / 4).clamp(16, u64::from(pmrxe_config::DEFAULT_CLIENT_FDS)) as u32,
    };
    Ok(FdPlan { need, want, soft, hard, object_budget, client_fds })
}

/// Reads RLIMIT_NOFILE, counts the fds open now, computes the [`fd_plan`] and raises the soft
/// limit to it. Logs one line with the numbers.
pub fn size_fd_limit(limits: &Limits, devices: usize) -> Result<FdPlan, String> {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return Err(format!("getrlimit(RLIMIT_NOFILE): {}", std::io::Error::last_os_error()));
    }
    let open_now = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or(64);
    let plan = fd_plan(limits, devices, open_now, rl.rlim_cur, rl.rlim_max)?;
    if plan.soft > rl.rlim_cur {
        let new = libc::rlimit { rlim_cur: plan.soft, rlim_max: rl.rlim_max };
        // SAFETY: setrlimit reads the struct we pass; raising the soft limit up to the hard
        // one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
            return Err(format!("setrlimit(RLIMIT_NOFILE, {}): {}", plan.soft, std::io::Error::last_os_error()));
        }
    }
    // One line with the numbers: what the limits need, what was set, what clients' objects share.
    tracing::info!(
        soft = plan.soft, hard = plan.hard, need = plan.need, object_budget = plan.object_budget, client_fds = plan.client_fds,
        "fd limit sized from [limits]{}", if plan.soft < plan.want { " (not every client can reach its max_fds at once)" } else { "" }
    );
    Ok(plan)
}

/// One client's live counts, as `pmrxe stats` shows them.
#[derive(Default)]
pub struct ClientCounters {
    held: [AtomicU32; KINDS],
    fds: AtomicU32,
    refused: AtomicU64,
}

/// A warning a client can trigger at will: at most one line per `period`, with the count of
/// the ones suppressed since; every event is counted.
pub struct RateLimited {
    period: Duration,
    last: Mutex<Option<Instant>>,
    suppressed: AtomicU64,
    /// Every event, logged or not.
    pub total: AtomicU64,
}

impl RateLimited {
    /// A limiter allowing one line per `period`.
    pub fn new(period: Duration) -> RateLimited {
        RateLimited { period, last: Mutex::new(None), suppressed: AtomicU64::new(0), total: AtomicU64::new(0) }
    }

    /// Counts one event. `Some(n)`: log it now, saying `n` were suppressed before it.
    pub fn hit(&self) -> Option<u64> {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < self.period) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

/// Period of the rate-limited warnings.
pub const WARN_PERIOD: Duration = Duration::from_secs(10);

/// The service-wide counts and counters (in `session::Shared`).
pub struct Budget {
    cfg: Limits,
    names: Vec<String>,
    used: Vec<[AtomicU32; KINDS]>,
    refused_device: [AtomicU64; KINDS],
    refused_client: [AtomicU64; KINDS],
    plan: FdPlan,
    fds: AtomicU64,
    refused_fds_service: AtomicU64,
    refused_fds_client: AtomicU64,
    connected: AtomicU32,
    refused_clients: AtomicU64,
    clients: Mutex<HashMap<u32, Arc<ClientCounters>>>,
    /// `accept` failures (EMFILE, ENFILE, ...): logged at most once per [`WARN_PERIOD`].
    pub accept_errors: RateLimited,
    /// Connections closed at once because `max_clients` were connected.
    pub refused_client_warn: RateLimited,
    /// Client-triggered warnings of the sessions (rate-limited together).
    pub session_warn: RateLimited,
    /// The "client gone" line (a client may connect and go in a loop): one per second.
    pub client_gone_log: RateLimited,
}

impl Budget {
    /// Counters for `devices` (names) under `cfg`, with the fd plan made at start.
    pub fn new(cfg: Limits, names: Vec<String>, plan: FdPlan) -> Budget {
        Budget {
            used: names.iter().map(|_| Default::default()).collect(),
            names,
            cfg,
            refused_device: Default::default(),
            refused_client: Default::default(),
            plan,
            fds: AtomicU64::new(0),
            refused_fds_service: AtomicU64::new(0),
            refused_fds_client: AtomicU64::new(0),
            connected: AtomicU32::new(0),
            refused_clients: AtomicU64::new(0),
            clients: Mutex::new(HashMap::new()),
            accept_errors: RateLimited::new(WARN_PERIOD),
            refused_client_warn: RateLimited::new(WARN_PERIOD),
            session_warn: RateLimited::new(WARN_PERIOD),
            client_gone_log: RateLimited::new(Duration::from_secs(1)),
        }
    }

    /// Takes one of `max_clients` connection slots; `false`: all are taken (close the
    /// connection). Give it back with [`Budget::disconnected`].
    pub fn connect(&self) -> bool {
        let max = self.cfg.max_clients;
        let ok = self.connected.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).is_ok();
        if !ok {
            self.refused_clients.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// A connection taken with [`Budget::connect`] closed.
    pub fn disconnected(&self) {
        let _ = self.connected.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Reserve one `obj` on `device` for a client whose holdings are `usage`: checks the
    /// client's cap, then takes the device's slot and the fds race-free.
    pub fn reserve(self: &Arc<Self>, usage: &Usage, obj: Obj, device: u32) -> Result<Reservation, Refusal> {
        let fds = obj.fds();
        if let Obj::Kind(kind) = obj {
            let k = kind as usize;
            let Some(used) = self.used.get(device as usize) else { return Err(Refusal { errno: libc::ENODEV, msg: "no such device".into() }) };
            let cap = self.cfg.client_cap(kind);
            if usage.count(kind, device) >= cap {
                self.refused_client[k].fetch_add(1, Ordering::Relaxed);
                usage.refused();
                return Err(Refusal {
                    errno: libc::EAGAIN,
                    msg: format!("this client holds {cap} {}s on {}: its [limits.per_client] max_{}", kind.name(), self.names[device as usize], kind.name()),
                });
            }
            let max = self.cfg.device_max(kind);
            if used[k].fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).is_err() {
                self.refused_device[k].fetch_add(1, Ordering::Relaxed);
                usage.refused();
                return Err(Refusal { errno: libc::ENOMEM, msg: format!("{} has its [limits] max_{} = {max} in use", self.names[device as usize], kind.name()) });
            }
        }
        let mut r = Reservation { budget: self.clone(), obj, device, fds: 0, done: false };
        if fds > 0 {
            if usage.fds + fds > self.plan.client_fds {
                self.refused_fds_client.fetch_add(1, Ordering::Relaxed);
                usage.refused();
                return Err(Refusal { errno: libc::EAGAIN, msg: format!("this client holds {} service fds: its [limits.per_client] max_fds", usage.fds) });
            }
            let budget = self.plan.object_budget;
            if self.fds.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n + u64::from(fds) <= budget).then_some(n + u64::from(fds))).is_err() {
                self.refused_fds_service.fetch_add(1, Ordering::Relaxed);
                usage.refused();
                return Err(Refusal { errno: libc::ENOMEM, msg: format!("the service's fd budget ({budget} for clients' objects) is spent") });
            }
        }
        r.fds = fds;
        Ok(r)
    }

    fn release(&self, obj: Obj, device: u32, fds: u32) {
        if let Obj::Kind(kind) = obj {
            if let Some(u) = self.used.get(device as usize) {
                let _ = u[kind as usize].fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            }
        }
        if fds > 0 {
            let _ = self.fds.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(u64::from(fds)));
        }
    }

    /// Objects of `kind` in use on `device`.
    pub fn in_use(&self, device: usize, kind: LimitKind) -> u32 {
        self.used.get(device).map_or(0, |u| u[kind as usize].load(Ordering::Relaxed))
    }

    /// The effective per-client fd cap.
    pub fn client_fds(&self) -> u32 {
        self.plan.client_fds
    }

    /// The `limits` object of `pmrxe stats --json`; `client_visible` filters the per-client
    /// list (a non-root user sees only their own clients).
    pub fn json(&self, client_visible: &dyn Fn(u32) -> bool) -> serde_json::Value {
        let kinds = |f: &dyn Fn(LimitKind) -> u64| LimitKind::ALL.iter().map(|k| (k.name().to_string(), json!(f(*k)))).collect::<serde_json::Map<_, _>>();
        let mut clients: Vec<_> = self.clients.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(id, c)| (*id, c.clone())).collect();
        clients.sort_by_key(|(id, _)| *id);
        json!({
            "devices": self.names.iter().enumerate().map(|(i, n)| json!({
                "device": n,
                "in_use": kinds(&|k| u64::from(self.in_use(i, k))),
                "max": kinds(&|k| u64::from(self.cfg.device_max(k))),
            })).collect::<Vec<_>>(),
            "per_client_cap": {
                "objects": kinds(&|k| u64::from(self.cfg.client_cap(k))),
                "fds": self.plan.client_fds,
            },
            "refused": {
                "device_limit": kinds(&|k| self.refused_device[k as usize].load(Ordering::Relaxed)),
                "client_cap": kinds(&|k| self.refused_client[k as usize].load(Ordering::Relaxed)),
                "client_fds": self.refused_fds_client.load(Ordering::Relaxed),
                "service_fds": self.refused_fds_service.load(Ordering::Relaxed),
                "clients": self.refused_clients.load(Ordering::Relaxed),
            },
            "fds": {
                "in_use": self.fds.load(Ordering::Relaxed), "budget": self.plan.object_budget,
                "soft_limit": self.plan.soft, "hard_limit": self.plan.hard, "need": self.plan.need,
            },
            "clients": { "connected": self.connected.load(Ordering::Relaxed), "max": self.cfg.max_clients },
            "accept_errors": self.accept_errors.total.load(Ordering::Relaxed),
            "session_warnings": self.session_warn.total.load(Ordering::Relaxed),
            "per_client": clients.iter().filter(|(id, _)| client_visible(*id)).map(|(id, c)| {
                let mut held = kinds(&|k| u64::from(c.held[k as usize].load(Ordering::Relaxed)));
                held.insert("fds".into(), json!(c.fds.load(Ordering::Relaxed)));
                json!({ "id": id, "held": held, "refused": c.refused.load(Ordering::Relaxed) })
            }).collect::<Vec<_>>(),
        })
    }

    /// Lines for the text form of `pmrxe stats`.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (i, n) in self.names.iter().enumerate() {
            let row: Vec<String> = LimitKind::ALL.iter().map(|k| format!("{} {}/{}", k.name(), self.in_use(i, *k), self.cfg.device_max(*k))).collect();
            out.push_str(&format!("limits {n}: {}\n", row.join(", ")));
        }
        let refused: u64 = (0..KINDS).map(|k| self.refused_device[k].load(Ordering::Relaxed) + self.refused_client[k].load(Ordering::Relaxed)).sum::<u64>()
            + self.refused_fds_client.load(Ordering::Relaxed)
            + self.refused_fds_service.load(Ordering::Relaxed)
            + self.refused_clients.load(Ordering::Relaxed);
        out.push_str(&format!(
            "limits: clients {}/{}, fds {}/{} (soft limit {}), refused {refused}, accept errors {}\n",
            self.connected.load(Ordering::Relaxed),
            self.cfg.max_clients,
            self.fds.load(Ordering::Relaxed),
            self.plan.object_budget,
            self.plan.soft,
            self.accept_errors.total.load(Ordering::Relaxed),
        ));
        out
    }
}

/// A slot taken on a device counter (and fds): given back when dropped, unless
/// [`Usage::commit`]ted to the object it was taken for.
pub struct Reservation {
    budget: Arc<Budget>,
    obj: Obj,
    device: u32,
    fds: u32,
    done: bool,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.done {
            self.budget.release(self.obj, self.device, self.fds);
        }
    }
}

/// What one client holds (one per session; only the session's thread touches it). Dropping
/// it gives everything back to the [`Budget`].
#[derive(Default)]
pub struct Usage {
    budget: Option<Arc<Budget>>,
    client: u32,
    counters: Arc<ClientCounters>,
    count: HashMap<(LimitKind, u32), u32>,
    owned: HashMap<(Obj, u64), (u32, u32)>,
    fds: u32,
}

impl Usage {
    fn count(&self, kind: LimitKind, device: u32) -> u32 {
        self.count.get(&(kind, device)).copied().unwrap_or(0)
    }

    fn refused(&self) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether `handle` of `obj` is counted.
    pub fn holds(&self, obj: Obj, handle: u64) -> bool {
        self.owned.contains_key(&(obj, handle))
    }

    /// The reservation `r` became the object `handle` of client `client`.
    pub fn commit(&mut self, mut r: Reservation, client: u32, handle: u64) {
        r.done = true;
        if self.budget.is_none() {
            self.client = client;
            r.budget.clients.lock().unwrap_or_else(|e| e.into_inner()).insert(client, self.counters.clone());
            self.budget = Some(r.budget.clone());
        }
        if let Some((dev, fds)) = self.owned.insert((r.obj, handle), (r.device, r.fds)) {
            // Already counted (a handle reused): keep one count.
            r.budget.release(r.obj, dev, fds);
            self.forget(r.obj, dev, fds);
        }
        if let Obj::Kind(k) = r.obj {
            *self.count.entry((k, r.device)).or_insert(0) += 1;
            self.counters.held[k as usize].fetch_add(1, Ordering::Relaxed);
        }
        self.fds += r.fds;
        self.counters.fds.fetch_add(r.fds, Ordering::Relaxed);
    }

    fn forget(&mut self, obj: Obj, dev: u32, fds: u32) {
        if let Obj::Kind(k) = obj {
            if let Some(n) = self.count.get_mut(&(k, dev)) {
                *n = n.saturating_sub(1);
            }
            let _ = self.counters.held[k as usize].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
        self.fds = self.fds.saturating_sub(fds);
        let _ = self.counters.fds.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(fds));
    }

    /// The object `handle` of `obj` is destroyed: give its counts back.
    pub fn release(&mut self, obj: Obj, handle: u64) {
        if let Some((dev, fds)) = self.owned.remove(&(obj, handle)) {
            if let Some(b) = &self.budget {
                b.release(obj, dev, fds);
            }
            self.forget(obj, dev, fds);
        }
    }
}

impl Drop for Usage {
    fn drop(&mut self) {
        let Some(b) = self.budget.take() else { return };
        for ((obj, _), (dev, fds)) in self.owned.drain() {
            b.release(obj, dev, fds);
        }
        b.clients.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(cfg: Limits) -> Arc<Budget> {
        let plan = fd_plan(&cfg, 2, 10, 1 << 20, 1 << 20).unwrap();
        Arc::new(Budget::new(cfg, vec!["pmrxe0".into(), "pmrxe1".into()], plan))
    }

    fn small() -> Limits {
        let mut l = Limits { max_qp: 8, max_cq: 8, ..Limits::default() };
        l.per_client.max_qp = Some(5);
        l
    }

    #[test]
    fn per_client_cap_is_eagain_device_limit_is_enomem() {
        let b = budget(small());
        let (mut a, mut c) = (Usage::default(), Usage::default());
        for h in 0..5 {
            let r = b.reserve(&a, Obj::Kind(LimitKind::Qp), 0).unwrap();
            a.commit(r, 1, h);
        }
        assert_eq!(b.reserve(&a, Obj::Kind(LimitKind::Qp), 0).err().map(|r| r.errno), Some(libc::EAGAIN));
        for h in 0..3 {
            let r = b.reserve(&c, Obj::Kind(LimitKind::Qp), 0).unwrap();
            c.commit(r, 2, 100 + h);
        }
        assert_eq!(b.reserve(&c, Obj::Kind(LimitKind::Qp), 0).err().map(|r| r.errno), Some(libc::ENOMEM));
        assert_eq!(b.in_use(0, LimitKind::Qp), 8);
        // The other device is independent.
        assert!(b.reserve(&c, Obj::Kind(LimitKind::Qp), 1).is_ok());
        // A dropped reservation gave its slot back; destroying one frees one.
        c.release(Obj::Kind(LimitKind::Qp), 100);
        assert_eq!(b.in_use(0, LimitKind::Qp), 7);
        drop(a);
        assert_eq!(b.in_use(0, LimitKind::Qp), 2, "a client's counts go with it");
        assert_eq!(b.fds.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn racing_threads_never_pass_the_device_limit() {
        let mut cfg = Limits { max_cq: 100, ..Limits::default() };
        cfg.per_client.max_cq = Some(100);
        let b = budget(cfg);
        let won: u32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|t| {
                    let b = b.clone();
                    s.spawn(move || {
                        let mut u = Usage::default();
                        let mut n = 0;
                        for h in 0..100 {
                            if let Ok(r) = b.reserve(&u, Obj::Kind(LimitKind::Cq), 0) {
                                u.commit(r, t, h);
                                n += 1;
                            }
                        }
                        std::mem::forget(u);
                        n
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(won, 100);
        assert_eq!(b.in_use(0, LimitKind::Cq), 100);
    }

    #[test]
    fn fd_plan_refuses_a_hard_limit_below_the_device_limits() {
        let l = Limits::default();
        let e = fd_plan(&l, 2, 20, 1024, 4096).unwrap_err();
        assert!(e.contains("hard limit 4096") && !e.contains('\n'), "{e}");
        let p = fd_plan(&l, 2, 20, 1024, 20000).unwrap();
        assert_eq!(p.soft, 20000, "soft raised up to the hard limit");
        assert!(p.object_budget >= 2 * (1024 + 1024 + 256));
        assert_eq!(p.client_fds, 4096);
    }

    #[test]
    fn rate_limited_logs_once_per_period_and_counts_all() {
        let r = RateLimited::new(Duration::from_secs(3600));
        assert_eq!(r.hit(), Some(0));
        for _ in 0..1000 {
            assert_eq!(r.hit(), None);
        }
        assert_eq!(r.total.load(Ordering::Relaxed), 1001);
    }
}

/// Most bytes of a `pmrxe stats` reply body: one control message (`ctrl::MAX_MSG`) less room
/// for its envelope. A reply that does not fit would end the stats client's connection.
pub const STATS_BUDGET: usize = pmrxe_abi::ctrl::MAX_MSG - 4096;

/// A `pmrxe stats` reply (`json` or text, as rendered) within [`STATS_BUDGET`]: unchanged if
/// it fits, else [`fit_json`] / [`fit_text`]. The metrics endpoint keeps the full rendering.
pub fn fit_stats(json: bool, s: String) -> String {
    if s.len() <= STATS_BUDGET {
        return s;
    }
    if json {
        match serde_json::from_str(&s) {
            Ok(v) => fit_json(v),
            Err(_) => fit_text(s),
        }
    } else {
        fit_text(s)
    }
}

/// Render `v` as the JSON of `pmrxe stats --json` within [`STATS_BUDGET`]: pretty if it fits,
/// else compact, else without the per-QP lists (`qps_omitted` per lcore), else without the
/// per-client lists too (`omitted` says what went). Many QPs or clients (an attacker's
/// thousands) must not make the stats unanswerable.
pub fn fit_json(mut v: serde_json::Value) -> String {
    let pretty = serde_json::to_string_pretty(&v).unwrap_or_default();
    if pretty.len() <= STATS_BUDGET {
        return pretty;
    }
    let mut omitted = Vec::new();
    let compact = serde_json::to_string(&v).unwrap_or_default();
    if compact.len() <= STATS_BUDGET {
        return compact;
    }
    if let Some(lcores) = v.get_mut("lcores").and_then(|l| l.as_array_mut()) {
        for l in lcores {
            let n = l.get("qps").and_then(|q| q.as_array()).map_or(0, Vec::len);
            l["qps"] = json!([]);
            l["qps_omitted"] = json!(n);
        }
        omitted.push("lcores[].qps");
    }
    v["omitted"] = json!(omitted);
    let s = serde_json::to_string(&v).unwrap_or_default();
    if s.len() <= STATS_BUDGET {
        return s;
    }
    if let Some(pc) = v.get_mut("limits").and_then(|l| l.get_mut("per_client")) {
        *pc = json!([]);
        omitted.push("limits.per_client");
    }
    if let Some(c) = v.get_mut("clients") {
        *c = json!([]);
        omitted.push("clients");
    }
    v["omitted"] = json!(omitted);
    serde_json::to_string(&v).unwrap_or_default()
}

/// The text form of `pmrxe stats` within [`STATS_BUDGET`] (cut at a line, saying so).
pub fn fit_text(mut s: String) -> String {
    if s.len() <= STATS_BUDGET {
        return s;
    }
    let mut cut = STATS_BUDGET - 80;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    let end = s[..cut].rfind('\n').map_or(0, |i| i + 1);
    s.truncate(end);
    s.push_str("... (truncated: use pmrxe stats --json)\n");
    s
}

#[cfg(test)]
mod fit_tests {
    use super::*;

    #[test]
    fn stats_of_thousands_of_qps_fit_one_message() {
        let qps: Vec<_> = (0..5000).map(|i| json!({"qpn": i, "tx_packets": 1, "rx_packets": 2, "name": "x".repeat(40)})).collect();
        let v = json!({"lcores": [{"index": 0, "qps": qps}], "clients": [], "limits": {"per_client": []}});
        let s = fit_json(v);
        assert!(s.len() <= STATS_BUDGET);
        let back: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(back["lcores"][0]["qps_omitted"], 5000);
        let t = fit_text("line\n".repeat(100_000));
        assert!(t.len() <= STATS_BUDGET && t.ends_with("(truncated: use pmrxe stats --json)\n"));
    }
}
