//! Explicit time: IBA timeout exponents and the deadline queue of all connections.

use std::collections::BTreeSet;

/// Monotonic time in nanoseconds, supplied by the caller: the workspace's one time type, the
/// transport engine's (the CM and the engine share a clock representation, and the service's
/// CM thread and the lcores no longer convert between two look-alike types).
pub use pmrxe_transport::Instant;

/// 4.096 µs · 2^`exp` in nanoseconds (IBA timeout encoding; `exp` is capped at 31).
pub const fn iba_ns(exp: u8) -> u64 {
    let e = if exp > 31 { 31 } else { exp };
    4096u64 << e
}

/// One deadline per connection, ordered by time (quinn's timer table, keyed by comm ID).
#[derive(Debug, Default)]
pub(crate) struct TimerQueue {
    set: BTreeSet<(Instant, u32)>,
}

impl TimerQueue {
    /// Move `id`'s deadline from `old` to `new`.
    pub(crate) fn update(&mut self, id: u32, old: Option<Instant>, new: Option<Instant>) {
        if let Some(o) = old {
            self.set.remove(&(o, id));
        }
        if let Some(n) = new {
            self.set.insert((n, id));
        }
    }
    /// Earliest deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.set.first().map(|(t, _)| *t)
    }
    /// Remove and return one connection whose deadline is at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<u32> {
        let &(t, id) = self.set.first()?;
        if t > now {
            return None;
        }
        self.set.pop_first();
        Some(id)
    }
    pub(crate) fn len(&self) -> usize {
        self.set.len()
    }
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn iba_timeouts() {
        assert_eq!(iba_ns(0), 4096);
        assert_eq!(iba_ns(20), 4_294_967_296); // ≈ 4.3 s, the CMA's CM response timeout
        assert_eq!(iba_ns(40), iba_ns(31));
    }
    #[test]
    fn queue_orders_and_updates() {
        let mut q = TimerQueue::default();
        q.update(1, None, Some(Instant(30)));
        q.update(2, None, Some(Instant(10)));
        q.update(1, Some(Instant(30)), Some(Instant(5)));
        assert_eq!(q.next(), Some(Instant(5)));
        assert_eq!(q.pop_due(Instant(4)), None);
        assert_eq!(q.pop_due(Instant(10)), Some(1));
        assert_eq!(q.pop_due(Instant(10)), Some(2));
        assert_eq!(q.len(), 0);
    }
}
