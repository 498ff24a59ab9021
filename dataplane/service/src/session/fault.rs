//! Rescued faults in client memory: who pays (issue 37, "client memory can never fault the
//! service").
//!
//! The SIGBUS guard of `pmrxe_runtime::shm` keeps an lcore alive when a page of a client's
//! memory vanishes under it (a truncated file, a hole punched in a hugetlb file whose free
//! huge pages the client then took): the page is replaced by anonymous memory and the copy
//! carries on. This module gives the fault its consequence, on the client that owns the
//! memory and nobody else:
//!
//! * **an MR's memory** (tag `TAG_MR`): the MR is revoked ([`MemTable::revoke_mr`]: like a
//!   LOCAL_INV the client cannot undo, waiting for in-flight copies), so every later local
//!   access through its keys completes with a local protection error and every remote one is
//!   NAKed (remote access error): the QP that tries goes to ERROR the normal way. The client
//!   gets the async event [`EVENT_MR_REVOKED`] with the MR's key as its element.
//! * **a client segment used by fast-registration page lists** (`TAG_SEG`): every fast-reg
//!   MR of that client is revoked (which of them map the page is not tracked), each with an
//!   event.
//! * **a segment the service created for the client** (its client page, a ring or a CQ:
//!   `TAG_CLIENT`): the client is disconnected (its session socket is shut down), so the
//!   session cleans up every object of the client as if it had exited.
//!
//! The watcher is one thread, started with the first client, that sleeps on the guard's
//! eventfd (`shm::wait_for_faults`): nothing runs on the lcores' path. Faults are counted
//! ([`counters`], per client in [`client_faults`]); warnings are rate-limited (a client that
//! faults in a loop cannot flood the log).
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::{Duration, Instant};

use crossbeam::channel::Sender;
use pmrxe_abi::ctrl::AsyncEvent;
use pmrxe_mem::{Key, MemTable};
use pmrxe_runtime::shm::{self, EventFd, Segment};

/// Kinds of guard tags (the top byte), the rest names the object.
const KIND_SHIFT: u32 = 56;
const TAG_CLIENT: u64 = 1 << KIND_SHIFT;
const TAG_MR: u64 = 2 << KIND_SHIFT;
const TAG_SEG: u64 = 3 << KIND_SHIFT;
const ID_MASK: u64 = (1 << KIND_SHIFT) - 1;

pub use pmrxe_abi::ctrl::EVENT_MR_REVOKED;

/// The guard tag of the segments the service creates for `client`.
pub(super) fn client_tag(client: u32) -> u64 {
    TAG_CLIENT | client as u64
}

/// The guard tag of `client`'s own segments mapped whole for fast-registration page lists.
pub(super) fn segment_tag(client: u32) -> u64 {
    TAG_SEG | client as u64
}

/// Totals since the service started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounters {
    /// Faults the SIGBUS guard rescued (pages replaced).
    pub rescued: u64,
    /// MRs revoked because their memory faulted.
    pub revoked_mrs: u64,
    /// Clients disconnected because a segment the service made for them faulted.
    pub disconnected: u64,
    /// Rescued faults no object could be blamed for (a mapping gone meanwhile).
    pub unattributed: u64,
}

static REVOKED: AtomicU64 = AtomicU64::new(0);
static DISCONNECTED: AtomicU64 = AtomicU64::new(0);
static UNATTRIBUTED: AtomicU64 = AtomicU64::new(0);

/// The totals (for `pmrxe stats`).
pub fn counters() -> FaultCounters {
    FaultCounters {
        rescued: shm::FaultGuard::rescued(),
        revoked_mrs: REVOKED.load(Ordering::Relaxed),
        disconnected: DISCONNECTED.load(Ordering::Relaxed),
        unattributed: UNATTRIBUTED.load(Ordering::Relaxed),
    }
}

/// Rescued faults blamed on `client` so far (0 for a client that is gone).
pub fn client_faults(client: u32) -> u64 {
    registry().clients.get(&client).map_or(0, |c| c.faults)
}

struct ClientEntry {
    events: Sender<AsyncEvent>,
    /// The session's async-event eventfd; dead once the session and the lcores let go of the
    /// client (the entry is swept then).
    efd: Weak<EventFd>,
    /// A dup of the session's socket, to shut it down (never read or written).
    sock: OwnedFd,
    mem: Arc<MemTable>,
    faults: u64,
}

struct MrEntry {
    client: u32,
    /// The tag of its mapping (user MRs).
    tag: Option<u64>,
    fast: bool,
}

#[derive(Default)]
struct Registry {
    clients: HashMap<u32, ClientEntry>,
    /// By MR key.
    mrs: HashMap<u32, MrEntry>,
    /// MR mapping tag → MR key.
    tags: HashMap<u64, u32>,
    next_tag: u64,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
static WATCHER: Once = Once::new();

struct Locked(std::sync::MutexGuard<'static, Option<Registry>>);
impl std::ops::Deref for Locked {
    type Target = Registry;
    fn deref(&self) -> &Registry {
        self.0.as_ref().expect("initialised by registry()")
    }
}
impl std::ops::DerefMut for Locked {
    fn deref_mut(&mut self) -> &mut Registry {
        self.0.as_mut().expect("initialised by registry()")
    }
}

fn registry() -> Locked {
    let mut g = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        *g = Some(Registry { next_tag: 1, ..Default::default() });
    }
    Locked(g)
}

/// A client said Hello (on its session thread): remember how to reach it, tag its client page
/// and every segment this thread creates for it from now on, start the watcher.
pub(super) fn client_started(client: u32, sock: RawFd, events: &Sender<AsyncEvent>, efd: &Arc<EventFd>, page: &Segment, mem: &Arc<MemTable>) {
    let tag = client_tag(client);
    shm::set_segment_owner(tag);
    page.set_tag(tag);
    // SAFETY: the session's socket is open for the whole session (this runs inside it).
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(sock) };
    match borrowed.try_clone_to_owned() {
        Ok(sock) => {
            registry().clients.insert(client, ClientEntry { events: events.clone(), efd: Arc::downgrade(efd), sock, mem: mem.clone(), faults: 0 });
        }
        Err(e) => tracing::warn!(client, "fault watch: cannot dup the session socket ({e}); a fault in this client's rings will not disconnect it"),
    }
    WATCHER.call_once(|| {
        if let Err(e) = std::thread::Builder::new().name("pmrxe-faults".into()).spawn(watch) {
            tracing::error!("fault watcher thread: {e}; rescued faults will not revoke anything");
        }
    });
}

/// A fresh tag for an MR mapping (set on the mapping before the MR is valid).
pub(super) fn new_mr_tag() -> u64 {
    let mut r = registry();
    let t = TAG_MR | (r.next_tag & ID_MASK);
    r.next_tag += 1;
    t
}

/// `client` registered MR `key` over a mapping tagged `tag` (`None`: a fast-reg MR, whose
/// pages live in segment mappings tagged [`segment_tag`]).
pub(super) fn watch_mr(client: u32, key: u32, tag: Option<u64>) {
    let mut r = registry();
    if let Some(old) = r.mrs.insert(key, MrEntry { client, tag, fast: tag.is_none() }).and_then(|e| e.tag) {
        r.tags.remove(&old);
    }
    if let Some(t) = tag {
        r.tags.insert(t, key);
    }
}

/// MR `key` is gone (deregistered).
pub(super) fn forget_mr(key: u32) {
    let mut r = registry();
    if let Some(t) = r.mrs.remove(&key).and_then(|e| e.tag) {
        r.tags.remove(&t);
    }
}

/// What to do about one faulted tag, decided under the registry lock, done outside it.
enum Action {
    Revoke { client: u32, keys: Vec<u32>, mem: Arc<MemTable>, events: Sender<AsyncEvent>, efd: Weak<EventFd> },
    Disconnect { client: u32, sock: OwnedFd },
    Nobody(u64),
}

fn decide(r: &mut Registry, tag: u64) -> Action {
    let kind = tag & !ID_MASK;
    let client_of_tag = match kind {
        TAG_CLIENT | TAG_SEG => Some((tag & ID_MASK) as u32),
        TAG_MR => r.tags.get(&tag).and_then(|k| r.mrs.get(k)).map(|m| m.client),
        _ => None,
    };
    let Some(client) = client_of_tag else { return Action::Nobody(tag) };
    let keys: Vec<u32> = match kind {
        TAG_MR => r.tags.get(&tag).copied().into_iter().collect(),
        TAG_SEG => r.mrs.iter().filter(|(_, m)| m.client == client && m.fast).map(|(k, _)| *k).collect(),
        _ => Vec::new(),
    };
    let Some(c) = r.clients.get_mut(&client) else { return Action::Nobody(tag) };
    c.faults += 1;
    if kind == TAG_CLIENT {
        return match c.sock.as_fd().try_clone_to_owned() {
            Ok(sock) => Action::Disconnect { client, sock },
            Err(_) => Action::Nobody(tag),
        };
    }
    Action::Revoke { client, keys, mem: c.mem.clone(), events: c.events.clone(), efd: c.efd.clone() }
}

fn act(a: Action, log: &mut RateLimit) {
    match a {
        Action::Revoke { client, keys, mem, events, efd } => {
            for key in keys {
                match mem.revoke_mr(Key(key)) {
                    Ok(_) => {
                        REVOKED.fetch_add(1, Ordering::Relaxed);
                        log.warn(|| tracing::warn!(client, key = format_args!("{key:#x}"), "client memory vanished under the data plane (truncated file or punched hole); MR revoked"));
                        let _ = events.try_send(AsyncEvent { event_type: EVENT_MR_REVOKED, element: key });
                        if let Some(e) = efd.upgrade() {
                            e.signal();
                        }
                    }
                    Err(e) => tracing::debug!(client, key, "revoking a faulted MR: {e}"),
                }
            }
        }
        Action::Disconnect { client, sock } => {
            DISCONNECTED.fetch_add(1, Ordering::Relaxed);
            log.warn(|| tracing::warn!(client, "a segment the service made for this client faulted (hole punched in its memfd); disconnecting the client"));
            let _ = rustix::net::shutdown(&sock, rustix::net::Shutdown::Both);
        }
        Action::Nobody(tag) => {
            UNATTRIBUTED.fetch_add(1, Ordering::Relaxed);
            log.warn(|| tracing::warn!(tag = format_args!("{tag:#x}"), "rescued a fault in client memory no live object owns"));
        }
    }
}

/// At most `BURST` warnings per `WINDOW`; the rest are counted and summed up in the next one.
struct RateLimit {
    start: Instant,
    shown: u32,
    suppressed: u64,
}

impl RateLimit {
    const WINDOW: Duration = Duration::from_secs(10);
    const BURST: u32 = 10;

    fn warn(&mut self, emit: impl FnOnce()) {
        if self.start.elapsed() >= Self::WINDOW {
            if self.suppressed > 0 {
                tracing::warn!(suppressed = self.suppressed, "more client memory faults were handled (warnings rate-limited)");
            }
            *self = RateLimit { start: Instant::now(), shown: 0, suppressed: 0 };
        }
        if self.shown < Self::BURST {
            self.shown += 1;
            emit();
        } else {
            self.suppressed += 1;
        }
    }
}

/// The watcher thread: wait for the guard's wake-up, act on every faulted tag, forget clients
/// that are gone.
fn watch() {
    let mut log = RateLimit { start: Instant::now(), shown: 0, suppressed: 0 };
    loop {
        shm::wait_for_faults(Duration::from_millis(500));
        let tags = shm::take_faulted();
        if !tags.is_empty() {
            let actions: Vec<Action> = {
                let mut r = registry();
                tags.into_iter().map(|t| decide(&mut r, t)).collect()
            };
            for a in actions {
                act(a, &mut log);
            }
        }
        sweep();
    }
}

/// Drop the entries of clients whose session is over (their socket dup closes with them).
fn sweep() {
    let mut r = registry();
    let gone: Vec<u32> = r.clients.iter().filter(|(_, c)| c.efd.strong_count() == 0).map(|(id, _)| *id).collect();
    if gone.is_empty() {
        return;
    }
    for id in &gone {
        r.clients.remove(id);
    }
    let keys: Vec<u32> = r.mrs.iter().filter(|(_, m)| gone.contains(&m.client)).map(|(k, _)| *k).collect();
    for k in keys {
        if let Some(t) = r.mrs.remove(&k).and_then(|e| e.tag) {
            r.tags.remove(&t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_name_their_kind_and_owner() {
        assert_eq!(client_tag(7) & !ID_MASK, TAG_CLIENT);
        assert_eq!(segment_tag(7) & ID_MASK, 7);
        let (a, b) = (new_mr_tag(), new_mr_tag());
        assert_ne!(a, b);
        assert_eq!(a & !ID_MASK, TAG_MR);
    }

    /// A registered client on one end of a socket pair (the other end is the "client").
    fn client(id: u32) -> (Arc<MemTable>, crossbeam::channel::Receiver<AsyncEvent>, Arc<EventFd>, std::os::unix::net::UnixStream, Segment) {
        let mem = Arc::new(MemTable::new(pmrxe_mem::MemLimits { max_mr: 16, max_mw: 16, page_slots: 1024, ..Default::default() }));
        let (tx, rx) = crossbeam::channel::bounded(4);
        let efd = Arc::new(EventFd::new().unwrap());
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let page = Segment::create("page", 4096).unwrap();
        client_started(id, std::os::fd::AsRawFd::as_raw_fd(&ours), &tx, &efd, &page, &mem);
        drop(ours); // the registry holds its own dup
        (mem, rx, efd, theirs, page)
    }

    #[test]
    fn a_faulted_mr_is_revoked_and_its_client_told() {
        let (mem, rx, _efd, _sock, _page) = client(900_001);
        let key = mem.reg_mr(5, pmrxe_mem::Region::zeroed(8192), 0x1000, pmrxe_mem::Access::LOCAL_WRITE).unwrap();
        let tag = new_mr_tag();
        watch_mr(900_001, key.0, Some(tag));
        let a = decide(&mut registry(), tag);
        act(a, &mut RateLimit { start: Instant::now(), shown: 0, suppressed: 0 });
        assert!(mem.is_revoked(key));
        assert_eq!(rx.try_recv(), Ok(AsyncEvent { event_type: EVENT_MR_REVOKED, element: key.0 }));
        assert_eq!(client_faults(900_001), 1);
        // Deregistered: a late fault of its mapping is nobody's.
        forget_mr(key.0);
        assert!(matches!(decide(&mut registry(), tag), Action::Nobody(_)));
    }

    #[test]
    fn a_fault_in_a_service_segment_disconnects_its_client() {
        let (_mem, _rx, _efd, mut sock, page) = client(900_002);
        // The client page was tagged with its client.
        let a = decide(&mut registry(), client_tag(900_002));
        assert!(matches!(a, Action::Disconnect { client: 900_002, .. }));
        act(a, &mut RateLimit { start: Instant::now(), shown: 0, suppressed: 0 });
        // The client sees its connection end.
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 8];
        assert_eq!(std::io::Read::read(&mut sock, &mut b).unwrap(), 0, "the client's socket was not shut down");
        drop(page);
    }

    #[test]
    fn a_fault_nobody_owns_is_only_counted() {
        let mut r = Registry::default();
        assert!(matches!(decide(&mut r, 0), Action::Nobody(0)));
        assert!(matches!(decide(&mut r, TAG_MR | 99), Action::Nobody(_)));
        assert!(matches!(decide(&mut r, client_tag(12345)), Action::Nobody(_)));
    }
}
