//! Waiting for an lcore's reply to a control command ([`crate::lcore::LcoreHandle::call`]).
//!
//! A control thread never blocks in a way the lcore would have to wake with a system call: it
//! polls the reply channel with short sleeps. How long it waits is decided by the lcore's
//! state, not by a clock alone:
//!
//! * the reply arrives: done, however long a loaded lcore took;
//! * the service's stop flag is set: [`CallError::Stopping`] (ESHUTDOWN) — the only case that
//!   says "stopping";
//! * the lcore thread is gone (reply channel closed without the stop flag):
//!   [`CallError::Gone`];
//! * the lcore made no progress at all (its iteration and command counters stood still) for
//!   [`STALL_LIMIT`]: [`CallError::Stuck`] (ETIMEDOUT). A busy lcore advances its counters on
//!   every loop iteration, so it is never declared stuck while it is alive.
use std::fmt;
use std::time::Duration;

use crossbeam::channel::{Receiver, TryRecvError};

/// How long an lcore may show no progress whatsoever (not one loop iteration, not one command)
/// before a control call gives up on it. An iteration takes microseconds even under load and
/// the idle back-off sleeps at most `idle.max_sleep_us`, so this is only reached by a thread
/// that is wedged (or frozen, e.g. SIGSTOP'd under a debugger).
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// Pause between polls of the reply channel.
const POLL: Duration = Duration::from_micros(20);

/// Why a control command got no reply from its lcore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// The service is stopping (its stop flag is set).
    Stopping,
    /// Lcore `index`'s thread is gone although the service was not told to stop.
    Gone {
        /// The lcore.
        index: usize,
    },
    /// Lcore `index` made no progress for `stalled`.
    Stuck {
        /// The lcore.
        index: usize,
        /// How long its counters stood still.
        stalled: Duration,
    },
}

impl CallError {
    /// The errno a control reply carries for this error.
    pub fn errno(&self) -> i32 {
        match self {
            CallError::Stopping => libc::ESHUTDOWN,
            CallError::Gone { .. } => libc::EIO,
            CallError::Stuck { .. } => libc::ETIMEDOUT,
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Stopping => write!(f, "service is stopping"),
            CallError::Gone { index } => write!(f, "lcore {index} is not running (its thread exited); the service is stopping"),
            CallError::Stuck { index, stalled } => {
                write!(f, "lcore {index} made no progress for {} s (wedged?); command abandoned", stalled.as_secs())
            }
        }
    }
}

impl std::error::Error for CallError {}

/// What [`wait_reply`] observes about the lcore, and how it passes time (injected so the
/// waiting rule is tested without real clocks).
pub(crate) trait Watch {
    /// Is the service's stop flag set?
    fn stopping(&self) -> bool;
    /// A counter the lcore advances on every loop iteration and every command.
    fn progress(&self) -> u64;
    /// Time since the wait began.
    fn elapsed(&self) -> Duration;
    /// Let time pass before the next poll.
    fn pause(&self);
}

/// Wait for the reply on `rx` from lcore `index` under the rules in the module documentation.
pub(crate) fn wait_reply<R>(rx: &Receiver<R>, index: usize, w: &impl Watch, stall_limit: Duration) -> Result<R, CallError> {
    let mut seen = w.progress();
    let mut seen_at = w.elapsed();
    loop {
        match rx.try_recv() {
            Ok(r) => return Ok(r),
            Err(TryRecvError::Disconnected) => {
                // The lcore dropped the command unanswered: it exited (or discarded its queue).
                return Err(if w.stopping() { CallError::Stopping } else { CallError::Gone { index } });
            }
            Err(TryRecvError::Empty) => {}
        }
        if w.stopping() {
            return Err(CallError::Stopping);
        }
        let now = w.elapsed();
        let p = w.progress();
        if p != seen {
            seen = p;
            seen_at = now;
        } else if now.saturating_sub(seen_at) >= stall_limit {
            return Err(CallError::Stuck { index, stalled: now.saturating_sub(seen_at) });
        }
        w.pause();
    }
}

/// The real watch: the stop flag, the lcore's counters, a monotonic clock and short sleeps.
pub(crate) struct LiveWatch<'a> {
    pub(crate) stop: &'a std::sync::atomic::AtomicBool,
    pub(crate) stats: &'a crate::stats::LcoreStats,
    pub(crate) t0: std::time::Instant,
}

impl Watch for LiveWatch<'_> {
    fn stopping(&self) -> bool {
        self.stop.load(std::sync::atomic::Ordering::Acquire)
    }
    fn progress(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let s = self.stats;
        s.busy_iterations.load(Relaxed).wrapping_add(s.idle_iterations.load(Relaxed)).wrapping_add(s.commands.load(Relaxed))
    }
    fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }
    fn pause(&self) {
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam::channel::{bounded, Sender};
    use std::cell::{Cell, RefCell};

    /// A scripted lcore on a fake clock: every poll advances time by `tick`; the lcore makes
    /// progress on a poll while `progressing(poll)` says so, and replies on poll `reply_at`.
    struct Fake<'a> {
        polls: Cell<u64>,
        tick: Duration,
        counter: Cell<u64>,
        progressing: &'a dyn Fn(u64) -> bool,
        reply_at: Option<u64>,
        stop_at: Option<u64>,
        tx: RefCell<Option<Sender<u32>>>,
        drop_at: Option<u64>,
    }

    impl<'a> Fake<'a> {
        fn new(tx: Sender<u32>, tick: Duration, progressing: &'a dyn Fn(u64) -> bool) -> Self {
            Fake { polls: Cell::new(0), tick, counter: Cell::new(0), progressing, reply_at: None, stop_at: None, tx: RefCell::new(Some(tx)), drop_at: None }
        }
    }

    impl Watch for Fake<'_> {
        fn stopping(&self) -> bool {
            self.stop_at.is_some_and(|s| self.polls.get() >= s)
        }
        fn progress(&self) -> u64 {
            self.counter.get()
        }
        fn elapsed(&self) -> Duration {
            self.tick * self.polls.get() as u32
        }
        fn pause(&self) {
            let n = self.polls.get() + 1;
            self.polls.set(n);
            if (self.progressing)(n) {
                self.counter.set(self.counter.get() + 1);
            }
            if self.reply_at == Some(n) {
                self.tx.borrow().as_ref().unwrap().send(7).unwrap();
            }
            if self.drop_at == Some(n) {
                self.tx.borrow_mut().take();
            }
        }
    }

    /// The bug of issue 13 item 10: a busy lcore that takes 10 minutes (fake time) to get to a
    /// command, advancing its counters all along, is waited for — no ESHUTDOWN, no timeout.
    #[test]
    fn slow_but_live_lcore_is_waited_for_far_beyond_ten_seconds() {
        let (tx, rx) = bounded(1);
        let always = |_| true;
        let mut f = Fake::new(tx, Duration::from_secs(1), &always);
        f.reply_at = Some(600);
        assert_eq!(wait_reply(&rx, 0, &f, STALL_LIMIT), Ok(7));
        assert_eq!(f.polls.get(), 600);
    }

    /// Progress in bursts with gaps shorter than the limit (a loaded machine descheduling the
    /// lcore for a while) still counts as alive.
    #[test]
    fn gaps_in_progress_shorter_than_the_limit_are_not_a_stall() {
        let (tx, rx) = bounded(1);
        let every_50th = |n: u64| n.is_multiple_of(50); // 50 s gaps, limit 60 s
        let mut f = Fake::new(tx, Duration::from_secs(1), &every_50th);
        f.reply_at = Some(1000);
        assert_eq!(wait_reply(&rx, 0, &f, STALL_LIMIT), Ok(7));
    }

    /// A wedged lcore (counters frozen) gives ETIMEDOUT with its index, once the limit passed
    /// since the last progress — not "service is stopping".
    #[test]
    fn wedged_lcore_times_out_with_an_honest_error() {
        let (tx, rx) = bounded(1);
        let until_100 = |n: u64| n <= 100;
        let f = Fake::new(tx, Duration::from_secs(1), &until_100);
        let e = wait_reply(&rx, 3, &f, STALL_LIMIT).unwrap_err();
        assert_eq!(e, CallError::Stuck { index: 3, stalled: STALL_LIMIT });
        assert_eq!(f.polls.get(), 100 + 60, "gave up exactly STALL_LIMIT after the last progress");
        assert_eq!(e.errno(), libc::ETIMEDOUT);
        assert!(e.to_string().contains("lcore 3 made no progress for 60 s"), "{e}");
    }

    /// ESHUTDOWN only when the stop flag is set, and then promptly.
    #[test]
    fn stop_flag_gives_eshutdown_at_once() {
        let (tx, rx) = bounded(1);
        let always = |_| true;
        let mut f = Fake::new(tx, Duration::from_secs(1), &always);
        f.stop_at = Some(5);
        let e = wait_reply(&rx, 0, &f, STALL_LIMIT).unwrap_err();
        assert_eq!(e, CallError::Stopping);
        assert_eq!(f.polls.get(), 5);
        assert_eq!(e.errno(), libc::ESHUTDOWN);
        assert_eq!(e.to_string(), "service is stopping");
    }

    /// The reply channel closing without the stop flag: the lcore thread is gone (EIO), which
    /// is not reported as a timeout.
    #[test]
    fn closed_reply_channel_without_stop_is_lcore_gone() {
        let (tx, rx) = bounded(1);
        let always = |_| true;
        let mut f = Fake::new(tx, Duration::from_secs(1), &always);
        f.drop_at = Some(3);
        let e = wait_reply(&rx, 1, &f, STALL_LIMIT).unwrap_err();
        assert_eq!(e, CallError::Gone { index: 1 });
        assert_eq!(e.errno(), libc::EIO);
    }

    /// With a real thread and the real watch (stop flag, LcoreStats counters, clock): an
    /// "lcore" that works through 2000 iterations before answering is waited for, and once the
    /// stop flag is set an unanswered call says "stopping".
    #[test]
    fn live_watch_follows_a_real_slow_consumer() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let stats = Arc::new(crate::stats::LcoreStats::default());
        let stop = AtomicBool::new(false);
        let (tx, rx) = bounded(1);
        let s2 = stats.clone();
        let lcore = std::thread::spawn(move || {
            for _ in 0..2000 {
                s2.busy_iterations.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(100));
            }
            tx.send(42u32).unwrap();
        });
        let w = LiveWatch { stop: &stop, stats: &stats, t0: std::time::Instant::now() };
        assert_eq!(wait_reply(&rx, 0, &w, STALL_LIMIT), Ok(42));
        lcore.join().unwrap();
        stop.store(true, Ordering::Release);
        let (_tx, rx2) = bounded::<u32>(1);
        assert_eq!(wait_reply(&rx2, 0, &w, STALL_LIMIT), Err(CallError::Stopping));
    }
}
