//! Explicit time for the engine.
//!
//! The lcore reads the clock once per iteration. On x86-64 with an invariant TSC
//! (`constant_tsc` and `nonstop_tsc` in /proc/cpuinfo, as DPDK's `rte_rdtsc` assumes) that is
//! one `rdtsc` scaled by a factor calibrated against CLOCK_MONOTONIC when the clock is made;
//! elsewhere `std::time::Instant` (CLOCK_MONOTONIC through the vDSO, ~35 ns on this VM against
//! ~8 ns for `rdtsc`). Either way the engine only ever sees our `Instant(u64 ns)`.
use std::time::Duration;

use pmrxe_transport::Instant;

/// A monotonic nanosecond clock anchored at creation.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: std::time::Instant,
    tsc: Option<Tsc>,
}

/// TSC ticks → ns: `ns = (ticks - base) * mult >> 32`.
#[derive(Clone, Copy, Debug)]
struct Tsc {
    base: u64,
    mult: u64,
}

impl Clock {
    /// Start a clock at 0 ns (calibrates the TSC for a few milliseconds where it is used).
    pub fn new() -> Clock {
        let origin = std::time::Instant::now();
        Clock { origin, tsc: Tsc::calibrate(origin, Duration::from_millis(4)) }
    }

    /// A clock that reads CLOCK_MONOTONIC only (no TSC).
    pub fn monotonic() -> Clock {
        Clock { origin: std::time::Instant::now(), tsc: None }
    }

    /// Does this clock read the TSC?
    pub fn uses_tsc(&self) -> bool {
        self.tsc.is_some()
    }

    /// Now, in engine time.
    #[inline]
    pub fn now(&self) -> Instant {
        match self.tsc {
            // Saturating: a read below the calibration point (another core's TSC behind by
            // more than the time since) is time zero, never the far future.
            Some(t) => Instant(((u128::from(rdtsc().saturating_sub(t.base)) * u128::from(t.mult)) >> 32) as u64),
            None => Instant(self.origin.elapsed().as_nanos() as u64),
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl Tsc {
    /// The TSC's rate against CLOCK_MONOTONIC over `span`, from two (TSC, monotonic) pairs each
    /// read between two TSC reads close together (a pair the scheduler split is read again);
    /// `None` without an invariant TSC.
    fn calibrate(origin: std::time::Instant, span: Duration) -> Option<Tsc> {
        if !invariant_tsc() {
            return None;
        }
        let pair = || {
            for _ in 0..1000 {
                let a = rdtsc();
                let ns = origin.elapsed().as_nanos() as u64;
                let b = rdtsc();
                // A pair is good when both TSC reads are within ~2 µs at any plausible rate.
                if b.wrapping_sub(a) < 10_000 {
                    return Some((a / 2 + b / 2, ns));
                }
            }
            None
        };
        let (t0, n0) = pair()?;
        let deadline = std::time::Instant::now() + span;
        while std::time::Instant::now() < deadline {
            std::hint::spin_loop();
        }
        let (t1, n1) = pair()?;
        let (dt, dn) = (t1.checked_sub(t0)?, n1.checked_sub(n0)?);
        if dt == 0 || dn == 0 {
            return None;
        }
        let mult = ((u128::from(dn) << 32) / u128::from(dt)) as u64;
        // base such that now() reads n0 at t0.
        let base = t0.wrapping_sub(((u128::from(n0) << 32) / u128::from(mult.max(1))) as u64);
        // Plausible rates only (0.1–10 GHz); anything else means a bad calibration.
        let ghz = dt as f64 / dn as f64;
        (0.1..10.0).contains(&ghz).then_some(Tsc { base, mult })
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86-64 (it only reads the time-stamp counter).
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn rdtsc() -> u64 {
    0
}

/// x86-64 with `constant_tsc` and `nonstop_tsc`: the TSC ticks at a fixed rate in every
/// power state, the same on every core.
fn invariant_tsc() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return false };
    let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    has("constant_tsc") && has("nonstop_tsc")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The TSC clock tracks CLOCK_MONOTONIC and never goes back. Each end of the window is
    /// bracketed by two monotonic reads, so a preemption widens the accepted range instead of
    /// failing the test: only the scale is checked (±1 % over ≥ 50 ms), not timing.
    #[test]
    fn tsc_clock_follows_monotonic_time() {
        let c = Clock::new();
        if !c.uses_tsc() {
            eprintln!("no invariant TSC here: the clock is CLOCK_MONOTONIC, nothing to compare");
            return;
        }
        let base = std::time::Instant::now();
        let ns = || base.elapsed().as_nanos() as f64;
        let (m0a, c0, m0b) = (ns(), c.now(), ns());
        let mut last = c0;
        while ns() - m0b < 50e6 {
            let n = c.now();
            assert!(n >= last, "the clock went back: {n:?} < {last:?}");
            last = n;
        }
        let (m1a, c1, m1b) = (ns(), c.now(), ns());
        let d = (c1.0 - c0.0) as f64;
        let (lo, hi) = ((m1a - m0b) * 0.99, (m1b - m0a) * 1.01);
        assert!(lo <= d && d <= hi, "TSC clock advanced {d} ns; CLOCK_MONOTONIC between {lo} and {hi}");
        let mono = Clock::monotonic();
        assert!(!mono.uses_tsc());
    }
}
