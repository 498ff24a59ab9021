//! Idle back-off: spin, then sleep with exponential back-off, snap back on work.
use pmrxe_config::{IdleConfig, IdleMode};

/// Per-lcore idle state.
#[derive(Debug)]
pub struct Idle {
    cfg: IdleConfig,
    empty: u32,
    sleep_us: u32,
}

impl Idle {
    /// From the `service.idle` config.
    pub fn new(cfg: IdleConfig) -> Idle {
        Idle { cfg, empty: 0, sleep_us: 1 }
    }
    /// An iteration did work: reset.
    pub fn work(&mut self) {
        self.empty = 0;
        self.sleep_us = 1;
    }
    /// An iteration found nothing: pause, and in back-off mode eventually sleep. Returns
    /// whether it slept (a syscall, counted by the caller as an idle sleep — never on a loop
    /// iteration that had work). `max_sleep_us` bounds the added latency.
    pub fn idle(&mut self, deadline_in_us: Option<u64>) -> bool {
        std::hint::spin_loop();
        if self.cfg.mode == IdleMode::Busy {
            return false;
        }
        self.empty = self.empty.saturating_add(1);
        if self.empty < self.cfg.spin_iterations {
            return false;
        }
        let mut us = self.sleep_us.min(self.cfg.max_sleep_us.max(1));
        if let Some(d) = deadline_in_us {
            us = us.min(d.max(1) as u32);
        }
        std::thread::sleep(std::time::Duration::from_micros(u64::from(us)));
        self.sleep_us = (self.sleep_us * 2).min(self.cfg.max_sleep_us.max(1));
        true
    }
}
