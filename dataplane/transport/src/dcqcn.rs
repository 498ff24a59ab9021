//! Congestion control: the DCQCN reaction point (rate per QP) and the notification point's
//! CNP rate limit, as pure state machines with explicit time.
//!
//! Source: Y. Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015
//! (DCQCN), §3 and Fig. 7 (the reaction-point algorithm), with the NIC parameters of NVIDIA
//! ConnectX ("DCQCN CC Parameters"). docs/congestion.md has the algorithm, every default with
//! its source, and where pmrxe deviates.
//!
//! Reaction point (sender QP), per QP:
//! * on a CNP: `Rt = Rc`, `Rc = Rc (1 − α/2)` (not below `min_rate`), `α = (1 − g) α + g`, and
//!   the rate-increase state restarts (both stage counters and the byte counter to 0);
//! * every `alpha_timer` without a CNP: `α = (1 − g) α`;
//! * rate-increase events, from the timer (every `rate_increase_timer`) and from the byte
//!   counter (every `byte_counter` bytes sent), each counting its own stage `T` / `BC`:
//!   fast recovery while `max(T, BC) < F` (`Rc = (Rt + Rc)/2`), hyper increase once both exceed
//!   `F` (`Rt += i · R_HAI`, `i = min(T, BC) − F`), additive increase otherwise
//!   (`Rt += R_AI`), and `Rc = (Rt + Rc)/2` after each;
//! * a QP that never saw a CNP, or climbed back to line rate, is unlimited: no timers, no pacing.
//!
//! The pacer is a next-departure time: a packet of `n` bytes leaving at `t` moves it to
//! `max(next, t) + n·8/Rc`; the requester sends nothing before it (the QP arms
//! [`Timer::Pacing`](crate::Timer) for it, so `poll_timeout` carries the deadline).

use crate::timers::Instant;

/// Reaction-point (sender) parameters. Defaults: DCQCN paper / ConnectX (see the field docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DcqcnParams {
    /// Line rate (b/s): the rate of an unlimited QP and the ceiling of `Rc`/`Rt`.
    pub line_rate_bps: u64,
    /// Lowest rate (b/s). ConnectX `rpg_min_rate` default 1 Mb/s.
    pub min_rate_bps: u64,
    /// α gain g (paper: 1/256).
    pub g: f64,
    /// α update period K in ns (paper: 55 µs).
    pub alpha_timer_ns: u64,
    /// α on the first CNP of a flow (ConnectX `initial_alpha_value` 1023/1024 ≈ 1).
    pub initial_alpha: f64,
    /// Rate-increase timer T in ns (ConnectX `rpg_time_reset` default 300 µs).
    pub rate_increase_timer_ns: u64,
    /// Byte counter B in bytes (paper: 10 MB).
    pub byte_counter: u64,
    /// Fast-recovery stages F (paper: 5; ConnectX `rpg_threshold`... see docs/congestion.md).
    pub fast_recovery_steps: u32,
    /// Additive increase R_AI in b/s (paper: 40 Mb/s).
    pub ai_rate_bps: u64,
    /// Hyper increase R_HAI in b/s (ConnectX `rpg_hai_rate` default 50 Mb/s).
    pub hai_rate_bps: u64,
    /// At most one rate decrease per this many ns (ConnectX `rate_reduce_monitor_period` 4 µs).
    pub rate_reduce_period_ns: u64,
}

impl Default for DcqcnParams {
    fn default() -> Self {
        DcqcnParams {
            line_rate_bps: 100_000_000_000,
            min_rate_bps: 1_000_000,
            g: 1.0 / 256.0,
            alpha_timer_ns: 55_000,
            initial_alpha: 1.0,
            rate_increase_timer_ns: 300_000,
            byte_counter: 10_000_000,
            fast_recovery_steps: 5,
            ai_rate_bps: 40_000_000,
            hai_rate_bps: 50_000_000,
            rate_reduce_period_ns: 4_000,
        }
    }
}

/// Notification-point (receiver) parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NpParams {
    /// At most one CNP per QP per this many ns (paper N = 50 µs).
    pub cnp_interval_ns: u64,
    /// DSCP of CNPs (ConnectX `cnp_dscp` default 48).
    pub cnp_dscp: u8,
}

impl Default for NpParams {
    fn default() -> Self {
        NpParams { cnp_interval_ns: 50_000, cnp_dscp: 48 }
    }
}

/// Congestion control of one QP: notification point (answer CE with CNPs) and reaction point
/// (DCQCN), each optional. `Default` is both off (the engine's historical behaviour).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CcConfig {
    /// Send CNPs for CE-marked packets.
    pub np: Option<NpParams>,
    /// React to CNPs with DCQCN and pace the requester.
    pub rp: Option<DcqcnParams>,
}

/// DCQCN reaction-point state of one QP.
#[derive(Clone, Copy, Debug)]
pub struct Dcqcn {
    p: DcqcnParams,
    /// Limiting (a CNP was seen and the rate has not yet climbed back to line rate).
    active: bool,
    /// Current rate Rc (b/s).
    rc: f64,
    /// Target rate Rt (b/s).
    rt: f64,
    /// α.
    alpha: f64,
    /// A CNP arrived since the last α update.
    cnp_seen: bool,
    /// Timer stage T and byte-counter stage BC.
    t_stage: u32,
    bc_stage: u32,
    /// Bytes sent since the last byte-counter event.
    bytes: u64,
    last_decrease: Option<Instant>,
    alpha_due: Option<Instant>,
    increase_due: Option<Instant>,
    /// Pacer: earliest departure of the next packet.
    next_send: Instant,
    /// Rate decreases applied.
    pub decreases: u64,
}

impl Dcqcn {
    /// An unlimited QP with these parameters.
    pub fn new(p: DcqcnParams) -> Self {
        let line = p.line_rate_bps as f64;
        Dcqcn {
            p,
            active: false,
            rc: line,
            rt: line,
            alpha: p.initial_alpha,
            cnp_seen: false,
            t_stage: 0,
            bc_stage: 0,
            bytes: 0,
            last_decrease: None,
            alpha_due: None,
            increase_due: None,
            next_send: Instant(0),
            decreases: 0,
        }
    }
    /// The parameters.
    pub fn params(&self) -> &DcqcnParams {
        &self.p
    }
    /// Current rate Rc in b/s (line rate when not limiting).
    pub fn rate_bps(&self) -> u64 {
        self.rc as u64
    }
    /// Target rate Rt in b/s.
    pub fn target_bps(&self) -> u64 {
        self.rt as u64
    }
    /// α.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }
    /// Is the rate limited (pacing on)?
    pub fn is_limiting(&self) -> bool {
        self.active
    }
    /// Next α update, if armed.
    pub fn alpha_deadline(&self) -> Option<Instant> {
        self.alpha_due
    }
    /// Next rate-increase timer event, if armed.
    pub fn increase_deadline(&self) -> Option<Instant> {
        self.increase_due
    }

    /// A CNP for this QP arrived.
    pub fn on_cnp(&mut self, now: Instant) {
        self.cnp_seen = true;
        if !self.active {
            // First CNP of a flow (or after recovering to line rate): start from α0.
            self.active = true;
            self.alpha = self.p.initial_alpha;
            self.alpha_due = Some(now.add_ns(self.p.alpha_timer_ns));
        } else {
            self.alpha = (1.0 - self.p.g) * self.alpha + self.p.g;
        }
        if self.last_decrease.is_some_and(|t| now.since(t) < self.p.rate_reduce_period_ns) {
            return;
        }
        self.last_decrease = Some(now);
        self.decreases += 1;
        self.rt = self.rc;
        self.rc = (self.rc * (1.0 - self.alpha / 2.0)).max(self.p.min_rate_bps as f64);
        self.t_stage = 0;
        self.bc_stage = 0;
        self.bytes = 0;
        self.increase_due = Some(now.add_ns(self.p.rate_increase_timer_ns));
    }

    /// The α timer fired at `now` (call when `alpha_deadline() <= now`).
    pub fn on_alpha_timer(&mut self, now: Instant) {
        if !self.active {
            self.alpha_due = None;
            return;
        }
        if !self.cnp_seen {
            self.alpha *= 1.0 - self.p.g;
        }
        self.cnp_seen = false;
        self.alpha_due = Some(now.add_ns(self.p.alpha_timer_ns));
    }

    /// The rate-increase timer fired at `now`.
    pub fn on_increase_timer(&mut self, now: Instant) {
        if !self.active {
            self.increase_due = None;
            return;
        }
        self.t_stage = self.t_stage.saturating_add(1);
        self.increase();
        self.increase_due = if self.active { Some(now.add_ns(self.p.rate_increase_timer_ns)) } else { None };
    }

    /// `bytes` (whole frame) left at `now`: byte counter and pacer.
    pub fn on_sent(&mut self, now: Instant, bytes: u64) {
        if !self.active {
            return;
        }
        let ns = (bytes as f64 * 8.0 * 1e9 / self.rc).ceil() as u64;
        self.next_send = self.next_send.max(now).add_ns(ns);
        self.bytes += bytes;
        if self.bytes >= self.p.byte_counter {
            self.bytes = 0;
            self.bc_stage = self.bc_stage.saturating_add(1);
            self.increase();
        }
    }

    /// Earliest time the next packet may leave (`None`: not limiting).
    pub fn next_send(&self) -> Option<Instant> {
        self.active.then_some(self.next_send)
    }

    fn increase(&mut self) {
        let f = self.p.fast_recovery_steps;
        let line = self.p.line_rate_bps as f64;
        if self.t_stage.max(self.bc_stage) < f {
            // Fast recovery: towards the target, which stays.
        } else if self.t_stage.min(self.bc_stage) > f {
            let i = self.t_stage.min(self.bc_stage) - f;
            self.rt = (self.rt + f64::from(i) * self.p.hai_rate_bps as f64).min(line);
        } else {
            self.rt = (self.rt + self.p.ai_rate_bps as f64).min(line);
        }
        self.rc = ((self.rt + self.rc) / 2.0).min(line);
        if self.rc >= line * 0.999 {
            // Back at line rate: release the limiter (NICs do the same), no more timers.
            self.active = false;
            self.rc = line;
            self.rt = line;
            self.alpha_due = None;
            self.increase_due = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> DcqcnParams {
        DcqcnParams { line_rate_bps: 10_000_000_000, ..DcqcnParams::default() }
    }

    #[test]
    fn first_cnp_halves_and_alpha_decays() {
        let mut d = Dcqcn::new(p());
        assert!(!d.is_limiting() && d.next_send().is_none());
        d.on_cnp(Instant(0));
        // α0 = 1: Rc = Rc (1 − 1/2), Rt = the old Rc.
        assert_eq!((d.rate_bps(), d.target_bps()), (5_000_000_000, 10_000_000_000));
        assert_eq!(d.alpha_deadline(), Some(Instant(55_000)));
        assert_eq!(d.increase_deadline(), Some(Instant(300_000)));
        // A second CNP within the monitor period raises α but does not cut again.
        d.on_cnp(Instant(1_000));
        assert_eq!(d.rate_bps(), 5_000_000_000);
        // α timers without CNP: α ← (1 − g) α.
        d.on_alpha_timer(Instant(55_000)); // the CNP at 1 µs counts for this period
        let a0 = d.alpha();
        d.on_alpha_timer(Instant(110_000));
        assert!((d.alpha() - a0 * (1.0 - 1.0 / 256.0)).abs() < 1e-12);
        // Next CNP: Rc ← Rc (1 − α/2).
        let rc = d.rate_bps() as f64;
        d.on_cnp(Instant(120_000));
        let a = d.alpha();
        assert!((d.rate_bps() as f64 - rc * (1.0 - a / 2.0)).abs() < 2.0);
    }

    #[test]
    fn recovery_phases_and_release() {
        let mut d = Dcqcn::new(p());
        d.on_cnp(Instant(0));
        let mut t = Instant(0);
        // Fast recovery: 4 timer events halve the distance to Rt = 10 G each time; Rt stays.
        for k in 1..=4u32 {
            t = t.add_ns(300_000);
            d.on_increase_timer(t);
            let want = 10e9 - 5e9 / f64::from(1u32 << k);
            assert!((d.rate_bps() as f64 - want).abs() < 2.0, "stage {k}: {}", d.rate_bps());
            assert_eq!(d.target_bps(), 10_000_000_000);
        }
        // Eventually back at line rate: released, no timers, no pacing.
        for _ in 0..40 {
            t = t.add_ns(300_000);
            d.on_increase_timer(t);
        }
        assert!(!d.is_limiting());
        assert_eq!(d.rate_bps(), 10_000_000_000);
        assert_eq!((d.alpha_deadline(), d.increase_deadline()), (None, None));
    }

    #[test]
    fn additive_and_hyper_increase_move_the_target() {
        let mut d = Dcqcn::new(p());
        d.on_cnp(Instant(0));
        d.on_cnp(Instant(10_000));
        d.on_cnp(Instant(20_000)); // Rt well below line rate now
        let rt0 = d.target_bps();
        // T reaches F = 5 by timer alone (BC still 0): additive increase at stages 5 and 6.
        let mut t = Instant(20_000);
        for _ in 0..6 {
            t = t.add_ns(300_000);
            d.on_increase_timer(t);
        }
        assert_eq!(d.target_bps(), rt0 + 2 * 40_000_000);
        // Byte-counter stages 1..5: additive (min(T, BC) <= F); stage 6: both > F, hyper
        // increase with i = min(T, BC) - F = 1.
        for _ in 0..6 {
            d.on_sent(t, 10_000_000);
        }
        assert_eq!(d.target_bps(), rt0 + 7 * 40_000_000 + 50_000_000);
    }

    #[test]
    fn pacer_spaces_packets_at_rc_and_min_rate_holds() {
        let mut d = Dcqcn::new(DcqcnParams { min_rate_bps: 100_000_000, ..p() });
        d.on_cnp(Instant(0)); // 5 Gb/s
        d.on_sent(Instant(1_000), 1250); // 10 000 bits at 5 Gb/s = 2 µs
        assert_eq!(d.next_send(), Some(Instant(3_000)));
        d.on_sent(Instant(3_000), 1250);
        assert_eq!(d.next_send(), Some(Instant(5_000)));
        for k in 0..200 {
            d.on_cnp(Instant(10_000 + k * 5_000));
        }
        assert_eq!(d.rate_bps(), 100_000_000);
    }
}
