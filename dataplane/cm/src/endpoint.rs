//! [`Cm`]: one connection manager per port. Tables, dispatch of received MADs, timers and the
//! output queues live here; the protocol roles are in `active.rs`, `passive.rs`,
//! `teardown.rs` and `sidr.rs`, each an `impl Cm` block.

use std::collections::{HashMap, VecDeque};

use pmrxe_wire::Qpn;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::msg::{emit_mad, mra, parse_mad, rej, rep, req, CmMsg, Mad, MsgCode, RejReason};
use crate::timers::{iba_ns, Instant, TimerQueue};
use crate::types::{CmStats, ConnId, Event, Gid, GsiPath, MadSource, QpAttrs, Transmit, Transport};
use crate::{CmError, Error};

/// Configuration of one [`Cm`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CmConfig {
    /// Our CA (node) GUID: REQ/REP "Local CA GUID", REJ-timeout ARI.
    pub ca_guid: u64,
    /// Seed for local communication IDs and the transaction-ID high word.
    pub seed: u64,
    /// Max connections + SIDR entries (TIMEWAIT included). Beyond it: REJ NO_RESOURCES.
    pub max_conns: usize,
    /// Max listeners.
    pub max_listeners: usize,
    /// Max MADs waiting in the transmit queue (more are dropped and counted).
    pub max_tx_queue: usize,
    /// Service timeout advertised in our MRAs (IBA exponent).
    pub mra_service_timeout: u8,
    /// REP "Target ACK Delay" (the device's ACK delay exponent).
    pub target_ack_delay: u8,
    /// Packet lifetime (IBA exponent) for passive connections: TIMEWAIT is 2^(this+1) units,
    /// MRA waits add it.
    pub packet_life_time: u8,
    /// How long (IBA exponent) a SIDR server keeps its SIDR_REP to answer retransmitted
    /// SIDR_REQs; it should cover the requesters' retry window (the CMA retries every
    /// 2^20 units, 15 times).
    pub sidr_linger: u8,
}

impl Default for CmConfig {
    fn default() -> CmConfig {
        CmConfig {
            ca_guid: 0,
            seed: 0,
            max_conns: 4096,
            max_listeners: 1024,
            max_tx_queue: 4096,
            mra_service_timeout: crate::types::CMA_MRA_SERVICE_TIMEOUT,
            target_ack_delay: 15,
            packet_life_time: crate::types::IBOE_PACKET_LIFETIME,
            sidr_linger: 24,
        }
    }
}

/// Connection states (IBTA 12.9 state diagrams; the kernel's `enum ib_cm_state`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ConnState {
    /// Active: REQ sent, waiting for REP (REQ retransmitted).
    ReqSent,
    /// Active: the peer sent an MRA for our REQ (longer wait).
    MraReqRcvd,
    /// Active: REP received, the consumer decides (RTU or reject).
    RepRcvd,
    /// Active: REP retransmitted while the consumer decides; we sent an MRA.
    MraRepSent,
    /// Passive: REQ received, the consumer decides (accept or reject).
    ReqRcvd,
    /// Passive: REQ retransmitted while the consumer decides; we sent an MRA.
    MraReqSent,
    /// Passive: REP sent, waiting for RTU (REP retransmitted).
    RepSent,
    /// Passive: the peer sent an MRA for our REP.
    MraRepRcvd,
    /// Both: connected.
    Established,
    /// Both: DREQ sent, waiting for DREP (DREQ retransmitted).
    DreqSent,
    /// Both: disconnected; stray MADs are absorbed until the timer ends.
    TimeWait,
    /// SIDR client: SIDR_REQ sent (retransmitted).
    SidrReqSent,
    /// SIDR server: SIDR_REQ received, the consumer decides.
    SidrReqRcvd,
    /// SIDR server: SIDR_REP sent; kept briefly to answer retransmitted SIDR_REQs.
    SidrRepSent,
}

/// An unanswered MAD we retransmit.
#[derive(Debug)]
pub(crate) struct Retry {
    pub mad: Box<Mad>,
    pub left: u8,
    pub timeout_ns: u64,
}

/// One connection or SIDR exchange.
#[derive(Debug)]
pub(crate) struct Conn {
    pub state: ConnState,
    pub active: bool,
    /// The peer's QP1.
    pub path: GsiPath,
    pub remote_id: u32,
    pub remote_guid: u64,
    pub remote_qpn: Option<Qpn>,
    pub local_qpn: Qpn,
    /// Transaction ID of the handshake (REQ's) or of the SIDR exchange.
    pub tid: u64,
    pub service_id: u64,
    /// Passive, not yet answered: counts against this listener's backlog.
    pub listener: Option<u64>,
    pub retry: Option<Retry>,
    /// Last reply that is not retransmitted by timer (MRA, RTU, DREP, SIDR_REP), resent when
    /// the peer retransmits what it answers.
    pub cached: Option<Box<Mad>>,
    pub deadline: Option<Instant>,
    /// The consumer destroyed the id: finish the protocol silently.
    pub detached: bool,
    pub packet_life_time: u8,
    /// Retransmission interval and budget of this connection (REQ/REP, reused for DREQ).
    pub timeout_ns: u64,
    pub max_retries: u8,
    pub req: Option<Box<req::Repr>>,
    pub rep: Option<Box<rep::Repr>>,
    /// SIDR server: the (requester GID, request ID) key.
    pub sidr_key: Option<(Gid, u32)>,
}

impl Conn {
    pub(crate) fn new(state: ConnState, active: bool, path: GsiPath, tid: u64, service_id: u64, plt: u8) -> Conn {
        Conn {
            state,
            active,
            path,
            remote_id: 0,
            remote_guid: 0,
            remote_qpn: None,
            local_qpn: Qpn::new(0),
            tid,
            service_id,
            listener: None,
            retry: None,
            cached: None,
            deadline: None,
            detached: false,
            packet_life_time: plt,
            timeout_ns: 0,
            max_retries: 0,
            req: None,
            rep: None,
            sidr_key: None,
        }
    }
    /// TIMEWAIT duration: 4.096 µs · 2^(packet lifetime + 1), the kernel's `av.timeout`.
    pub(crate) fn timewait_ns(&self) -> u64 {
        iba_ns(self.packet_life_time.saturating_add(1))
    }
}

#[derive(Debug)]
pub(crate) struct Listener {
    pub backlog: usize,
    pub pending: usize,
}

/// The connection manager of one port: sans-IO, explicit time.
///
/// Methods, quinn style:
///
/// * (A) getters: [`Cm::stats`], [`Cm::state`], [`Cm::qp_attrs`], [`Cm::len`], [`Cm::is_empty`];
/// * (B) incoming events: [`Cm::handle_mad`], [`Cm::handle_timeout`];
/// * (C) consumer commands: [`Cm::listen`], [`Cm::unlisten`], [`Cm::connect`], [`Cm::accept`],
///   [`Cm::reject`], [`Cm::rtu`], [`Cm::establish`], [`Cm::disconnect`], [`Cm::destroy`],
///   [`Cm::sidr_resolve`], [`Cm::sidr_reply`];
/// * (D) outputs: [`Cm::poll_transmit`], [`Cm::poll_timeout`], [`Cm::poll_event`].
///
/// After any (B) or (C) call, drain `poll_transmit` (wrap each MAD with
/// [`gsi::build_mad_frame`](crate::gsi::build_mad_frame) and send it from QP1), arm one timer
/// for `poll_timeout`, and drain `poll_event`. `now` must be monotonic across calls.
#[derive(Debug)]
pub struct Cm {
    pub(crate) cfg: CmConfig,
    pub(crate) conns: HashMap<u32, Conn>,
    /// (remote CA GUID, remote comm ID) → local ID: duplicate REQ detection, REJ(timeout).
    pub(crate) by_remote: HashMap<(u64, u32), u32>,
    /// (remote GID, remote QPN) → local ID: stale connection detection.
    pub(crate) by_remote_qpn: HashMap<(Gid, u32), u32>,
    /// (requester GID, request ID) → local ID: duplicate SIDR_REQ detection.
    pub(crate) sidr_by_remote: HashMap<(Gid, u32), u32>,
    pub(crate) listeners: HashMap<u64, Listener>,
    pub(crate) timers: TimerQueue,
    tx: VecDeque<Transmit>,
    pub(crate) events: VecDeque<Event>,
    next_id: u32,
    id_mask: u32,
    tid_hi: u64,
    pub(crate) stats: CmStats,
}

impl Cm {
    /// A CM with no listener and no connection.
    pub fn new(cfg: CmConfig) -> Cm {
        let mut rng = SmallRng::seed_from_u64(cfg.seed);
        Cm {
            cfg,
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            by_remote_qpn: HashMap::new(),
            sidr_by_remote: HashMap::new(),
            listeners: HashMap::new(),
            timers: TimerQueue::default(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            next_id: rng.gen(),
            id_mask: rng.gen(),
            tid_hi: u64::from(rng.gen::<u32>()),
            stats: CmStats::default(),
        }
    }

    // ---- (A) getters

    /// Counters.
    pub fn stats(&self) -> &CmStats {
        &self.stats
    }
    /// The configuration.
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }
    /// State of a connection or SIDR exchange (`None`: no such id).
    pub fn state(&self, id: ConnId) -> Option<ConnState> {
        self.conns.get(&id.0).map(|c| c.state)
    }
    /// Entries in the connection table (TIMEWAIT and SIDR included).
    pub fn len(&self) -> usize {
        self.conns.len()
    }
    /// No connection, no SIDR exchange, no pending output (listeners may remain).
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
            && self.by_remote.is_empty()
            && self.by_remote_qpn.is_empty()
            && self.sidr_by_remote.is_empty()
            && self.timers.len() == 0
            && self.tx.is_empty()
    }
    /// Number of listeners.
    pub fn listener_count(&self) -> usize {
        self.listeners.len()
    }
    /// QP attributes for INIT/RTR/RTS, once REQ and REP have been exchanged (active: from
    /// `ConnectResponse` on; passive: from `accept` on).
    pub fn qp_attrs(&self, id: ConnId) -> Option<QpAttrs> {
        let c = self.conns.get(&id.0)?;
        let (req, rep) = (c.req.as_deref()?, c.rep.as_deref()?);
        let transport = if req.transport == 1 { Transport::Uc } else { Transport::Rc };
        Some(if c.active {
            QpAttrs {
                transport,
                local_qpn: req.local_qpn,
                remote_qpn: rep.local_qpn,
                path: c.path,
                path_mtu: req.path_mtu,
                rq_psn: rep.starting_psn,
                max_dest_rd_atomic: rep.initiator_depth,
                sq_psn: req.starting_psn,
                max_rd_atomic: rep.responder_resources,
                timeout: req.primary.local_ack_timeout,
                retry_cnt: req.retry_count,
                rnr_retry: rep.rnr_retry_count,
            }
        } else {
            QpAttrs {
                transport,
                local_qpn: rep.local_qpn,
                remote_qpn: req.local_qpn,
                path: c.path,
                path_mtu: req.path_mtu,
                rq_psn: req.starting_psn,
                max_dest_rd_atomic: rep.responder_resources,
                sq_psn: rep.starting_psn,
                max_rd_atomic: rep.initiator_depth,
                timeout: req.primary.local_ack_timeout,
                retry_cnt: req.retry_count,
                rnr_retry: req.rnr_retry_count,
            }
        })
    }

    // ---- (B) incoming events

    /// A MAD received on QP1 (`mad`: the UD payload, 256 bytes). Non-CM classes return
    /// `Err(NotCm)` so the caller can route them elsewhere; malformed MADs `Err(..)`; all are
    /// counted. Protocol-level surprises (unknown IDs, duplicates) are handled, not errors.
    pub fn handle_mad(&mut self, now: Instant, src: &MadSource, mad: &[u8]) -> Result<(), Error> {
        self.stats.rx_mads += 1;
        let (h, msg) = match parse_mad(mad) {
            Ok(x) => x,
            Err(e) => {
                match e {
                    Error::NotCm(_) => self.stats.rx_not_cm += 1,
                    Error::UnknownAttribute(_) => self.stats.rx_unsupported += 1,
                    _ => self.stats.rx_malformed += 1,
                }
                return Err(e);
            }
        };
        match msg {
            CmMsg::Req(r) => self.on_req(now, src, h.tid, r),
            CmMsg::Mra(r) => self.on_mra(now, src, r),
            CmMsg::Rej(r) => self.on_rej(now, src, r),
            CmMsg::Rep(r) => self.on_rep(now, src, r),
            CmMsg::Rtu(r) => self.on_rtu(src, r),
            CmMsg::Dreq(r) => self.on_dreq(now, src, h.tid, r),
            CmMsg::Drep(r) => self.on_drep(now, src, r),
            CmMsg::SidrReq(r) => self.on_sidr_req(src, h.tid, r),
            CmMsg::SidrRep(r) => self.on_sidr_rep(src, r),
        }
        Ok(())
    }

    /// Service every deadline at or before `now`: retransmissions, retry exhaustion, TIMEWAIT
    /// and SIDR linger ends.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(id) = self.timers.pop_due(now) {
            let Some(c) = self.conns.get_mut(&id) else { continue };
            c.deadline = None;
            if let Some(r) = &mut c.retry {
                if r.left > 0 {
                    r.left -= 1;
                    let (mad, path, t) = (r.mad.clone(), c.path, r.timeout_ns);
                    self.stats.retransmits += 1;
                    self.push_tx(path, mad);
                    self.arm(id, Some(now.add_ns(t)));
                    continue;
                }
                c.retry = None;
                self.stats.timeouts += 1;
                self.on_retries_exhausted(now, id);
            } else {
                match c.state {
                    ConnState::TimeWait => {
                        let detached = c.detached;
                        self.remove(id);
                        if !detached {
                            self.events.push_back(Event::TimewaitExit { id: ConnId(id) });
                        }
                    }
                    ConnState::SidrRepSent => self.remove(id),
                    _ => {}
                }
            }
        }
    }

    // ---- (D) outputs

    /// Next MAD to send.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.tx.pop_front()
    }
    /// Earliest deadline: call `handle_timeout` then.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }
    /// Next event for the consumer.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ---- helpers shared by the role files

    pub(crate) fn alloc_id(&mut self) -> u32 {
        loop {
            self.next_id = self.next_id.wrapping_add(1);
            let id = self.next_id ^ self.id_mask;
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }
    /// A transaction ID for a MAD we originate (the kernel: agent high word | local ID).
    pub(crate) fn tid_for(&self, id: u32) -> u64 {
        (self.tid_hi << 32) | u64::from(id)
    }
    pub(crate) fn table_full(&self) -> bool {
        self.conns.len() >= self.cfg.max_conns
    }
    pub(crate) fn push_tx(&mut self, path: GsiPath, mad: Box<Mad>) {
        if self.tx.len() >= self.cfg.max_tx_queue {
            self.stats.tx_dropped += 1;
            return;
        }
        self.stats.tx_mads += 1;
        self.tx.push_back(Transmit { path, mad });
    }
    /// Emit and queue a MAD; returns it (for caching or retransmission). Our own messages
    /// are built from checked parameters, so emission cannot fail; if it ever did, nothing is
    /// sent and `None` is returned.
    pub(crate) fn send(&mut self, path: GsiPath, tid: u64, attr_mod: u32, msg: &CmMsg) -> Option<Box<Mad>> {
        let mad = Box::new(emit_mad(tid, attr_mod, msg).ok()?);
        self.push_tx(path, mad.clone());
        Some(mad)
    }
    /// A REJ not tied to a connection of ours (no listener, stale, no resources).
    #[allow(clippy::too_many_arguments)] // one per REJ field; a struct would just rename them
    pub(crate) fn send_rej(&mut self, path: GsiPath, tid: u64, local: u32, remote: u32, message: MsgCode, reason: RejReason, ari: Vec<u8>) {
        let r = rej::Repr { local_comm_id: local, remote_comm_id: remote, message_rejected: message, reason, ari, private_data: Vec::new() };
        let _ = self.send(path, tid, 0, &CmMsg::Rej(r));
    }
    pub(crate) fn arm(&mut self, id: u32, at: Option<Instant>) {
        if let Some(c) = self.conns.get_mut(&id) {
            self.timers.update(id, c.deadline, at);
            c.deadline = at;
        }
    }
    /// Start retransmitting `mad` every `timeout_ns`, `retries` more times.
    pub(crate) fn start_retry(&mut self, now: Instant, id: u32, mad: Box<Mad>, timeout_ns: u64, retries: u8) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.retry = Some(Retry { mad, left: retries, timeout_ns });
        }
        self.arm(id, Some(now.add_ns(timeout_ns)));
    }
    pub(crate) fn stop_retry(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.retry = None;
        }
        self.arm(id, None);
    }
    /// Queue an event unless the consumer destroyed the id.
    pub(crate) fn event(&mut self, id: u32, ev: Event) {
        if self.conns.get(&id).is_some_and(|c| !c.detached) {
            self.events.push_back(ev);
        }
    }
    /// Release a listener backlog slot held by a passive connection.
    pub(crate) fn release_backlog(&mut self, id: u32) {
        if let Some(sid) = self.conns.get_mut(&id).and_then(|c| c.listener.take()) {
            if let Some(l) = self.listeners.get_mut(&sid) {
                l.pending = l.pending.saturating_sub(1);
            }
        }
    }
    /// Forget a connection entirely (indexes, timer, backlog slot).
    pub(crate) fn remove(&mut self, id: u32) {
        self.release_backlog(id);
        let Some(c) = self.conns.remove(&id) else { return };
        self.timers.update(id, c.deadline, None);
        if self.by_remote.get(&(c.remote_guid, c.remote_id)) == Some(&id) {
            self.by_remote.remove(&(c.remote_guid, c.remote_id));
        }
        if let Some(q) = c.remote_qpn {
            if self.by_remote_qpn.get(&(c.path.dgid, q.value())) == Some(&id) {
                self.by_remote_qpn.remove(&(c.path.dgid, q.value()));
            }
        }
        if let Some(k) = c.sidr_key {
            if self.sidr_by_remote.get(&k) == Some(&id) {
                self.sidr_by_remote.remove(&k);
            }
        }
    }
    /// Enter TIMEWAIT: no retransmission, absorb strays until the timer ends.
    pub(crate) fn enter_timewait(&mut self, now: Instant, id: u32) {
        self.release_backlog(id);
        let Some(c) = self.conns.get_mut(&id) else { return };
        c.state = ConnState::TimeWait;
        c.retry = None;
        c.cached = None;
        let t = c.timewait_ns();
        self.arm(id, Some(now.add_ns(t)));
    }
    /// The connection whose local ID is `local` if the MAD comes from its peer and, when
    /// `remote` is given, names the peer's ID we know.
    pub(crate) fn lookup(&self, src: &MadSource, local: u32, remote: Option<u32>) -> Option<u32> {
        let c = self.conns.get(&local)?;
        if c.path.dgid != src.sgid {
            return None;
        }
        if let Some(r) = remote {
            if c.remote_id != r {
                return None;
            }
        }
        Some(local)
    }
    pub(crate) fn stray(&mut self) {
        self.stats.rx_stray += 1;
    }
    pub(crate) fn resend_cached(&mut self, id: u32) {
        if let Some(c) = self.conns.get(&id) {
            if let Some(m) = c.cached.clone() {
                let p = c.path;
                self.push_tx(p, m);
            }
        }
    }
    pub(crate) fn resend_retry(&mut self, id: u32) {
        if let Some(c) = self.conns.get(&id) {
            if let Some(r) = &c.retry {
                let (p, m) = (c.path, r.mad.clone());
                self.push_tx(p, m);
            }
        }
    }
    /// Send an MRA for the peer's message `code` of connection `id` (our answer will take a
    /// while), keep it as the reply to further duplicates, and move the connection to `next`.
    pub(crate) fn send_mra(&mut self, id: u32, code: MsgCode, next: ConnState) {
        let Some(c) = self.conns.get(&id) else { return };
        let m = mra::Repr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            message_mraed: code,
            service_timeout: self.cfg.mra_service_timeout,
            private_data: Vec::new(),
        };
        let (path, tid) = (c.path, c.tid);
        let mad = self.send(path, tid, 0, &CmMsg::Mra(m));
        if let Some(c) = self.conns.get_mut(&id) {
            c.cached = mad;
            c.state = next;
        }
    }
    pub(crate) fn check_len(data: &[u8], max: usize) -> Result<(), CmError> {
        if data.len() > max {
            Err(CmError::PrivateDataTooLong)
        } else {
            Ok(())
        }
    }
}

impl Event {
    /// The id an event is about.
    pub fn id(&self) -> ConnId {
        match self {
            Event::ConnectRequest { id, .. }
            | Event::ConnectResponse { id, .. }
            | Event::Established { id, .. }
            | Event::Rejected { id, .. }
            | Event::TimedOut { id, .. }
            | Event::Disconnected { id, .. }
            | Event::TimewaitExit { id }
            | Event::SidrRequest { id, .. }
            | Event::SidrReply { id, .. } => *id,
        }
    }
}
