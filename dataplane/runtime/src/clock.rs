//! Explicit time for the engine.
//!
//! `std::time::Instant` reads CLOCK_MONOTONIC through the vDSO (no system call), so it is fit
//! for the fast path; the engine only ever sees our `Instant(u64 ns)`.
use pmrxe_transport::Instant;

/// A monotonic nanosecond clock anchored at creation.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: std::time::Instant,
}

impl Clock {
    /// Start a clock at 0 ns.
    pub fn new() -> Clock {
        Clock { origin: std::time::Instant::now() }
    }
    /// Now, in engine time.
    pub fn now(&self) -> Instant {
        Instant(self.origin.elapsed().as_nanos() as u64)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}
