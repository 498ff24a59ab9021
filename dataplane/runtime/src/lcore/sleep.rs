//! `idle.mode = "wait"`: block until there is work, without losing a wake-up.
//!
//! After `spin_us` of empty iterations the lcore
//!
//! 1. sets its own [`Waker`] flag (for peer lcores and the connection manager) and issues a
//!    SeqCst fence (`Lcore::run`);
//! 2. takes a last look: the loop's next [`Lcore::poll_once`] (doorbells, commands, receive
//!    queues, hand-off inbox, QP1 queue, timers); work found → flag cleared, back to polling;
//!    none → [`Lcore::sleep`]:
//! 3. sets the need-wakeup bit in the summary word of its doorbell row in every client's page
//!    (`DoorbellRow::sleep_begin`, a `fetch_or` that returns the word): a doorbell rung since
//!    the last look → flags cleared, back to polling;
//! 4. blocks in `epoll_pwait2` on its eventfd and the ports' receive fds, with the next QP
//!    timer as the timeout (the engine's next deadline: a QP timer, or the re-examination of
//!    QPs held for an unresolved neighbour; bounded by `max_sleep_us` when a port cannot wake
//!    it or the af_packet PMD holds frames; and by 1 s in any case);
//! 5. clears the flags.
//!
//! Clients: the flag and the doorbells share one word, and both sides change it with a
//! read-modify-write that returns the old value, so whichever comes second sees the other —
//! the client's `fetch_or` sees the flag and signals the eventfd once, or the lcore's sees the
//! doorbell and does not sleep (`pmrxe_abi::DoorbellRow::ring`; the loom model in
//! `dataplane/abi/tests/loom.rs`). Peer lcores and the CM publish their work (a frame in a
//! queue, a MAD), issue a SeqCst fence and load the lcore's `Waker` flag
//! ([`Waker::wake_if_sleeping`]): by the fences' total order either they see the flag or the
//! lcore's last look (after its own fence) sees the work. Control commands always signal
//! ([`super::CmdSender`]). Frames: the af_packet and af_xdp
//! sockets are in the epoll set; a net_ring pair has no fd, but only lcores of this process
//! put frames on it: this lcore itself (a pass that transmitted had work, so it does not
//! sleep before receiving them) or a peer lcore, which calls `wake_peers` after every pass
//! with work.
use std::time::Duration;

use std::sync::Arc;

use pmrxe_port::Port;

use super::ports::Ports;
use super::Lcore;
use crate::idle::{Idle, Waker};


/// The longest sleep in any case: a wake-up source nobody thought of costs at most this.
const MAX_BLOCK: Duration = Duration::from_secs(1);

/// The idle stage's state: the policy (spin window, back-off), this lcore's wake-up eventfd
/// and sleep flag, and whether some port cannot wake it.
pub(super) struct Sleeper {
    pub(super) idle: Idle,
    /// This lcore's wake-up eventfd and sleep flag (wait mode).
    pub(super) waker: Arc<Waker>,
    /// Wait mode: some port cannot wake the lcore (no fd, not a ring pair): sleeps are bounded
    /// by `max_sleep_us`.
    wake_blind: bool,
}

impl Sleeper {
    pub(super) fn new(idle: Idle, waker: Arc<Waker>) -> Self {
        Sleeper { idle, waker, wake_blind: false }
    }

    /// Build the epoll set over the ports' receive fds (once, on the lcore thread).
    fn arm<L: Port>(&mut self, ports: &Ports<L>, lcore: usize) {
        let mut fds = Vec::new();
        for p in &ports.slots {
            match p.link.rx_wake() {
                pmrxe_port::RxWake::Fds(f) => fds.extend(f),
                pmrxe_port::RxWake::Local => {}
                pmrxe_port::RxWake::Poll => self.wake_blind = true,
            }
        }
        if let Err(e) = self.idle.arm(&self.waker, &fds) {
            tracing::warn!(lcore, error = %e, "no epoll set: the lcore sleeps in max_sleep_us steps");
            self.wake_blind = true;
        }
    }

    /// How long to block: 1 s at most; `max_sleep_us` when a port cannot wake the lcore or
    /// still holds frames (`held`); never past the next QP deadline `until` (ns from now).
    fn timeout(&self, held: bool, until: Option<u64>) -> Duration {
        let mut timeout = MAX_BLOCK;
        if self.wake_blind || held {
            timeout = timeout.min(self.idle.max_sleep());
        }
        if let Some(ns) = until {
            timeout = timeout.min(Duration::from_nanos(ns));
        }
        timeout
    }
}

impl<L: Port> Lcore<L> {
    /// Build the epoll set (once, on the lcore thread).
    pub(super) fn arm_wait(&mut self) {
        self.sleeper.arm(&self.ports, self.index);
    }

    /// After a pass with work (wait mode, several lcores): wake the peers that sleep — this
    /// pass may have handed them frames or sent frames on a ring pair they receive.
    pub(super) fn wake_peers(&self) {
        let Some(h) = &self.handoff else { return };
        for (i, w) in h.wakers.iter().enumerate() {
            if i != self.index {
                if let Some(w) = w.get() {
                    w.wake_if_sleeping();
                }
            }
        }
    }

    /// After an empty last look (the Waker flag set): announce to the clients, block. Returns
    /// whether it slept.
    pub(super) fn sleep(&mut self) -> bool {
        let mut rung = false;
        for c in &self.clients {
            rung |= c.page().row(self.index).sleep_begin();
        }
        if rung {
            self.sleep_end();
            return false;
        }
        // (QPs held for a neighbour bound the sleep through the engine's next deadline.)
        let held = self.ports.kick_all();
        let until = self.next_deadline().map(|d| d.0.saturating_sub(self.clock.now().0));
        let timeout = self.sleeper.timeout(held, until);
        // Offline before the sleep: a sleeping lcore never delays an MR invalidation.
        self.mem.offline();
        self.sleeper.idle.block(&self.sleeper.waker, Some(timeout));
        self.sleep_end();
        true
    }

    fn sleep_end(&self) {
        self.sleeper.waker.sleep_end();
        for c in &self.clients {
            c.page().row(self.index).sleep_end();
        }
    }
}
