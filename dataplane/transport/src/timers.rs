//! Explicit time and the QP timer table (quinn-proto style: timers are data, not callbacks).

/// Monotonic time in nanoseconds. The runtime converts its TSC to this; tests use a virtual
/// clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

impl Instant {
    /// `self + ns`, saturating.
    #[must_use]
    pub const fn add_ns(self, ns: u64) -> Instant {
        Instant(self.0.saturating_add(ns))
    }
    /// Nanoseconds since `earlier` (0 if `earlier` is later).
    pub const fn since(self, earlier: Instant) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// The timers of one QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// Local ACK timeout (requester): 4.096 µs × 2^timeout.
    Retransmit = 0,
    /// RNR NAK delay (requester): the peer said "receiver not ready"; resend after this.
    RnrWait = 1,
    /// Pacer (DCQCN): the requester may send its next packet at this time.
    Pacing = 2,
    /// DCQCN α update.
    DcqcnAlpha = 3,
    /// DCQCN rate-increase timer.
    DcqcnIncrease = 4,
}

impl Timer {
    /// Every timer, in the order `handle_timeout` services them.
    pub const ALL: [Timer; 5] = [Timer::Retransmit, Timer::RnrWait, Timer::Pacing, Timer::DcqcnAlpha, Timer::DcqcnIncrease];
}

/// One optional deadline per [`Timer`].
#[derive(Clone, Copy, Debug, Default)]
pub struct TimerTable([Option<Instant>; 5]);

impl TimerTable {
    /// Arm (or re-arm) `t` for `at`.
    pub fn set(&mut self, t: Timer, at: Instant) {
        self.0[t as usize] = Some(at);
    }
    /// Current deadline of `t`.
    pub fn get(&self, t: Timer) -> Option<Instant> {
        self.0[t as usize]
    }
    /// Disarm `t`.
    pub fn stop(&mut self, t: Timer) {
        self.0[t as usize] = None;
    }
    /// Is `t` armed and due at `now`?
    pub fn is_expired(&self, t: Timer, now: Instant) -> bool {
        self.0[t as usize].is_some_and(|d| d <= now)
    }
    /// The earliest armed deadline.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.0.iter().flatten().min().copied()
    }
    /// Disarm everything.
    pub fn clear(&mut self) {
        self.0 = [None; 5];
    }
}

/// Local ACK timeout for the 5-bit `timeout` attribute: 4.096 µs × 2^timeout; 0 = infinite.
pub fn local_ack_timeout_ns(timeout: u8) -> Option<u64> {
    if timeout == 0 {
        None
    } else {
        Some(4096u64 << timeout.min(31))
    }
}

/// IBTA RNR NAK timer table (9.7.5.2.8): code → delay in nanoseconds. Code 0 is 655.36 ms.
pub fn rnr_delay_ns(code: u8) -> u64 {
    const US_X100: [u64; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    // Table in units of 10 µs (code 1 = 0.01 ms … code 31 = 491.52 ms).
    US_X100[(code & 31) as usize] * 10_000
}

/// Retry limit: IBTA's `rnr_retry` = 7 means "infinite"; `retry_cnt` 7 means 7.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryLimit {
    /// Retry this many more times.
    Left(u8),
    /// Never give up (only for `rnr_retry` = 7).
    Infinite,
}

impl RetryLimit {
    /// The limit for an RNR retry attribute.
    pub fn rnr(v: u8) -> Self {
        if v >= 7 {
            RetryLimit::Infinite
        } else {
            RetryLimit::Left(v)
        }
    }
    /// The limit for the transport `retry_cnt` attribute (7 means 7).
    pub fn transport(v: u8) -> Self {
        RetryLimit::Left(v.min(7))
    }
    /// Take one retry; `false` when exhausted.
    pub fn take(&mut self) -> bool {
        match self {
            RetryLimit::Infinite => true,
            RetryLimit::Left(0) => false,
            RetryLimit::Left(n) => {
                *n -= 1;
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn tables() {
        assert_eq!(rnr_delay_ns(1), 10_000);
        assert_eq!(rnr_delay_ns(0), 655_360_000);
        assert_eq!(rnr_delay_ns(31), 491_520_000);
        assert_eq!(local_ack_timeout_ns(14), Some(67_108_864));
        assert_eq!(local_ack_timeout_ns(0), None);
        let mut r = RetryLimit::transport(7);
        for _ in 0..7 {
            assert!(r.take());
        }
        assert!(!r.take());
        let mut r = RetryLimit::rnr(7);
        for _ in 0..100 {
            assert!(r.take());
        }
    }
}
