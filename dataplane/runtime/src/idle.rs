//! Idle back-off: keep polling for a while after the last work, then sleep with exponential
//! back-off; snap back to full polling on the first work found.
//!
//! The spin window is measured in time, not iterations: a ping-pong (latency test) has gaps of
//! a few microseconds between messages, so the lcore must never sleep inside one — a sleep
//! costs at least the kernel's timer slack (50 µs by default; the lcore sets its own slack to
//! 1 µs). Idle lcores still give the CPU back within `spin window` so tests on a 2-core machine
//! do not starve each other.
use std::time::{Duration, Instant};

use pmrxe_config::{IdleConfig, IdleMode};

/// Per-lcore idle state.
#[derive(Debug)]
pub struct Idle {
    cfg: IdleConfig,
    /// When the current run of empty iterations started (`None`: the last one had work).
    idle_since: Option<Instant>,
    spin: Duration,
    sleep_us: u32,
}

impl Idle {
    /// From the `service.idle` config. `spin_iterations` sets the spin window in
    /// microseconds-equivalents: the window is `spin_iterations / 5` µs, at least 100 µs.
    pub fn new(cfg: IdleConfig) -> Idle {
        let spin = Duration::from_micros(u64::from(cfg.spin_iterations / 5).max(100));
        // Ask the kernel for precise short sleeps on this thread (default slack is 50 µs).
        // PR_SET_TIMERSLACK: 1 µs, this thread only. A failure (never seen) leaves the default
        // 50 µs slack: sleeps get longer, nothing breaks.
        let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1000));
        Idle { cfg, idle_since: None, spin, sleep_us: 1 }
    }
    /// Can the next empty iteration sleep at all (back-off mode)?
    pub fn may_sleep(&self) -> bool {
        self.cfg.mode != IdleMode::Busy
    }

    /// An iteration did work: reset.
    pub fn work(&mut self) {
        // No clock read here: busy iterations must stay cheap.
        self.idle_since = None;
        self.sleep_us = 1;
    }
    /// An iteration found nothing: pause, and in back-off mode, once nothing happened for the
    /// spin window, call `before_sleep` and sleep (bounded by `max_sleep_us` and by the next
    /// timer deadline). Returns whether it slept — never on an iteration that had work.
    pub fn idle(&mut self, deadline_in_us: Option<u64>, before_sleep: impl FnOnce()) -> bool {
        std::hint::spin_loop();
        if self.cfg.mode == IdleMode::Busy {
            return false;
        }
        let since = *self.idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < self.spin {
            return false;
        }
        let mut us = self.sleep_us.min(self.cfg.max_sleep_us.max(1));
        if let Some(d) = deadline_in_us {
            us = us.min(d.max(1) as u32);
        }
        before_sleep();
        std::thread::sleep(Duration::from_micros(u64::from(us)));
        self.sleep_us = (self.sleep_us * 2).min(self.cfg.max_sleep_us.max(1));
        true
    }
}
