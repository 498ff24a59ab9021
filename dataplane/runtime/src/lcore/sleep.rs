//! `idle.mode = "wait"`: block until there is work, without losing a wake-up.
//!
//! After `spin_us` of empty iterations the lcore
//!
//! 1. announces the sleep: its own [`Waker`] flag (for peer lcores and the connection
//!    manager) and the `sleeping` flag of its doorbell row in every client's page;
//! 2. issues a SeqCst fence (`pmrxe_abi::sleep_fence`);
//! 3. takes a last look: one whole [`Lcore::poll_once`] (doorbells, commands, receive queues,
//!    hand-off inbox, QP1 queue, timers); work found → flags cleared, back to polling;
//! 4. blocks in `epoll_pwait2` on its eventfd and the ports' receive fds, with the next QP
//!    timer as the timeout (bounded by `max_sleep_us` when a port cannot wake it, while a
//!    neighbour is unresolved, transmit is deferred or the af_packet PMD holds frames; and by
//!    1 s in any case);
//! 5. clears the flags.
//!
//! Whoever makes work for the lcore publishes it, issues a SeqCst fence, and loads the flag:
//! set → one eventfd write (a client: `pmrxe_abi::DoorbellRow::ring`; a peer lcore or the CM:
//! [`Waker::wake_if_sleeping`]). By the fences' total order either the producer sees the flag
//! or the lcore's last look sees the work (the loom model in `dataplane/abi/tests/loom.rs`).
//! Control commands always signal ([`super::CmdSender`]). Frames: the af_packet and af_xdp
//! sockets are in the epoll set; a net_ring pair has no fd, but only lcores of this process
//! put frames on it: this lcore itself (a pass that transmitted had work, so it does not
//! sleep before receiving them) or a peer lcore, which calls `wake_peers` after every pass
//! with work.
use std::time::Duration;

use super::*;

/// The longest sleep in any case: a wake-up source nobody thought of costs at most this.
const MAX_BLOCK: Duration = Duration::from_secs(1);

impl<L: Port> Lcore<L> {
    /// Build the epoll set (once, on the lcore thread).
    pub(super) fn arm_wait(&mut self) {
        let mut fds = Vec::new();
        for p in &self.ports {
            match p.link.rx_wake() {
                pmrxe_port::RxWake::Fds(f) => fds.extend(f),
                pmrxe_port::RxWake::Local => {}
                pmrxe_port::RxWake::Poll => self.wake_blind = true,
            }
        }
        if let Err(e) = self.idle.arm(&self.waker, &fds) {
            tracing::warn!(lcore = self.index, error = %e, "no epoll set: the lcore sleeps in max_sleep_us steps");
            self.wake_blind = true;
        }
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

    /// Announce, look once more, block. Returns whether it slept.
    pub(super) fn sleep(&mut self) -> bool {
        self.waker.sleep_begin();
        for c in &self.clients {
            c.page().row(self.index).sleep_begin();
        }
        pmrxe_abi::sleep_fence();
        let now = self.clock.now();
        if self.poll_once(now) {
            self.sleep_end();
            self.idle.work();
            return false;
        }
        let mut bounded = self.wake_blind || !self.neigh_wait.is_empty() || !self.deferred.is_empty();
        for p in &mut self.ports {
            bounded |= p.link.kick();
        }
        let mut timeout = MAX_BLOCK;
        if bounded {
            timeout = timeout.min(self.idle.max_sleep());
        }
        if let Some(d) = self.next_deadline() {
            timeout = timeout.min(Duration::from_nanos(d.0.saturating_sub(self.clock.now().0)));
        }
        // Offline before the sleep: a sleeping lcore never delays an MR invalidation.
        self.mem.offline();
        self.idle.block(&self.waker, Some(timeout));
        self.sleep_end();
        true
    }

    fn sleep_end(&self) {
        self.waker.sleep_end();
        for c in &self.clients {
            c.page().row(self.index).sleep_end();
        }
    }
}
