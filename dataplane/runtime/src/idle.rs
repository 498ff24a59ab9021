//! What an lcore does when an iteration found no work.
//!
//! * `busy`: poll again at once (benchmarks, dedicated cores).
//! * `backoff`: keep polling for a while after the last work, then sleep with exponential
//!   back-off; snap back to full polling on the first work found.
//! * `wait` (the default): keep polling for `spin_us` after the last work, then block in
//!   `epoll_pwait2` until there is work: the lcore's wake-up eventfd ([`Waker`]: signalled by a
//!   client whose doorbell found the lcore asleep, by the control thread after a command, by a
//!   peer lcore that handed it frames, by the connection manager), the ports' receive-queue
//!   fds, or a timeout (the next QP timer; `max_sleep_us` when a port has no way to wake it).
//!   The lcore's side of the need-wakeup protocol (announce, fence, last look, block) lives in
//!   `lcore/sleep.rs`.
//!
//! The spin window is measured in time, not iterations: a ping-pong (latency test) has gaps of
//! a few microseconds between messages, so the lcore must never sleep inside one — a sleep
//! costs a wake-up (`wait`) or at least the kernel's timer slack (`backoff`: 50 µs by default;
//! the lcore sets its own slack to 1 µs).
//!
//! That holds on a CPU the lcore has to itself. On a shared one the spin window is the cost:
//! an application thread that must run on the lcore's CPU to answer (a busy-polling MPI rank or
//! perftest) waits while the lcore spins for nothing. Measured across two namespaces on a
//! 2-vCPU VM (two services, each CPU shared by one lcore and one busy-polling perftest):
//! `ib_send_lat` typical 175 µs with a 100 µs window, 38 µs with none. So in `wait` mode the
//! lcore watches for competition ([`Contention`]: involuntary context switches, which only
//! happen when another runnable thread was given its CPU) and, while it sees some, blocks as
//! soon as an iteration finds nothing; it tries its spin window again after a hold that
//! doubles while the competition persists.
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pmrxe_config::{IdleConfig, IdleMode};

/// An lcore's wake-up eventfd and its "I sleep" flag for in-process wakers (peer lcores, the
/// connection manager). Clients have their own flag per (client, lcore) in the client page
/// and get the eventfd at Hello.
#[derive(Debug)]
pub struct Waker {
    efd: OwnedFd,
    /// Set by the lcore before its last look (see `lcore/sleep.rs`), cleared when it wakes.
    sleeping: AtomicBool,
}

impl Waker {
    /// A new waker (a non-blocking, close-on-exec eventfd).
    pub fn new() -> std::io::Result<Waker> {
        use rustix::event::EventfdFlags;
        let efd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Waker { efd, sleeping: AtomicBool::new(false) })
    }

    /// The eventfd (to give to clients and to poll).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.efd.as_fd()
    }

    /// Signal the lcore unconditionally (one eventfd write; the control path).
    pub fn wake(&self) {
        let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
    }

    /// After publishing work for the lcore (frames in its queue, a MAD): signal it only if it
    /// sleeps. The producer's half of the Dekker pair whose other half is
    /// [`Waker::sleep_begin`], a SeqCst fence and the lcore's last look: a SeqCst fence, then
    /// the flag. No system call while the lcore is awake.
    #[inline]
    pub fn wake_if_sleeping(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::Relaxed) {
            self.wake();
        }
    }

    /// The lcore is about to take its last look before sleeping.
    pub(crate) fn sleep_begin(&self) {
        self.sleeping.store(true, Ordering::Relaxed);
    }

    /// The lcore is awake.
    pub(crate) fn sleep_end(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// Empty the counter (after a wake-up; the fd is level-triggered in the epoll set).
    fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.efd, &mut b);
    }
}

/// Whether another thread competes for the lcore's CPU, from the lcore thread's involuntary
/// context switches (`getrusage(RUSAGE_THREAD)`'s `ru_nivcsw`): the scheduler only switches
/// a runnable thread out for another runnable one. Sampled at most once per [`Self::CHECK`]
/// of spinning, so a dedicated core pays one cheap system call per millisecond of idle spin
/// and nothing while it works.
///
/// A pure state machine over (time, counter) samples: [`Contention::sample`].
#[derive(Debug)]
pub struct Contention {
    /// The last sample (time, involuntary switches); `None` before the first.
    last: Option<(Instant, u64)>,
    /// Spinning is skipped until then.
    hold_until: Option<Instant>,
    /// The next hold's length (doubles while competition is found right after a hold).
    hold: Duration,
}

impl Contention {
    /// Spin time between two samples.
    pub const CHECK: Duration = Duration::from_millis(1);
    /// A sample older than this says nothing about now (the lcore slept or worked since): it
    /// only restarts the count.
    pub const STALE: Duration = Duration::from_millis(10);
    /// The first hold after competition is found.
    pub const HOLD_MIN: Duration = Duration::from_millis(20);
    /// The longest hold.
    pub const HOLD_MAX: Duration = Duration::from_secs(1);

    /// No competition seen yet.
    pub fn new() -> Contention {
        Contention { last: None, hold_until: None, hold: Self::HOLD_MIN }
    }

    /// Is spinning held off at `now`?
    pub fn holding(&self, now: Instant) -> bool {
        self.hold_until.is_some_and(|t| now < t)
    }

    /// Is a sample due at `now` (spinning, not holding, [`Self::CHECK`] since the last)?
    pub fn due(&self, now: Instant) -> bool {
        !self.holding(now) && self.last.is_none_or(|(t, _)| now.saturating_duration_since(t) >= Self::CHECK)
    }

    /// A sample of the thread's involuntary context switches at `now`. Returns true when it
    /// finds competition (a switch since a fresh previous sample): spinning then stops for
    /// the hold, which doubles (up to [`Self::HOLD_MAX`]) when the competition is found
    /// within [`Self::STALE`] of the previous hold's end, and starts again at
    /// [`Self::HOLD_MIN`] otherwise.
    pub fn sample(&mut self, now: Instant, nivcsw: u64) -> bool {
        let prev = self.last.replace((now, nivcsw));
        let Some((t, n)) = prev else { return false };
        if now.saturating_duration_since(t) > Self::STALE || nivcsw <= n {
            return false;
        }
        let right_after = self.hold_until.is_some_and(|end| now.saturating_duration_since(end) <= Self::STALE);
        self.hold = if right_after { (self.hold * 2).min(Self::HOLD_MAX) } else { Self::HOLD_MIN };
        self.hold_until = Some(now + self.hold);
        true
    }

    /// The calling thread's involuntary context switches.
    fn read() -> u64 {
        // SAFETY: getrusage writes one `rusage` into the zeroed struct it is given.
        unsafe {
            let mut ru: libc::rusage = std::mem::zeroed();
            if libc::getrusage(libc::RUSAGE_THREAD, &mut ru) != 0 {
                return 0;
            }
            ru.ru_nivcsw as u64
        }
    }
}

impl Default for Contention {
    fn default() -> Self {
        Self::new()
    }
}

/// Per-lcore idle state.
#[derive(Debug)]
pub struct Idle {
    cfg: IdleConfig,
    /// When the current run of empty iterations started (`None`: the last one had work).
    idle_since: Option<Instant>,
    spin: Duration,
    sleep_us: u32,
    /// Wait mode: the epoll set (the waker's eventfd and the ports' receive fds).
    epoll: Option<OwnedFd>,
    /// Wait mode: competition for the lcore's CPU (spin windows are skipped while it lasts).
    contention: Contention,
}

impl Idle {
    /// From the `service.idle` config. Backoff: `spin_iterations` sets the spin window in
    /// microseconds-equivalents: the window is `spin_iterations / 5` µs, at least 100 µs. Wait:
    /// the window is `spin_us`.
    pub fn new(cfg: IdleConfig) -> Idle {
        let spin = match cfg.mode {
            IdleMode::Wait => Duration::from_micros(u64::from(cfg.spin_us)),
            _ => Duration::from_micros(u64::from(cfg.spin_iterations / 5).max(100)),
        };
        // Ask the kernel for precise short sleeps on this thread (default slack is 50 µs).
        // PR_SET_TIMERSLACK: 1 µs, this thread only. A failure (never seen) leaves the default
        // 50 µs slack: sleeps get longer, nothing breaks.
        let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1000));
        Idle { cfg, idle_since: None, spin, sleep_us: 1, epoll: None, contention: Contention::new() }
    }

    /// The idle mode.
    pub fn mode(&self) -> IdleMode {
        self.cfg.mode
    }

    /// Can the next empty iteration sleep at all (back-off mode)?
    pub fn may_sleep(&self) -> bool {
        self.cfg.mode == IdleMode::Backoff
    }

    /// The longest sleep when something cannot wake the lcore (wait mode).
    pub fn max_sleep(&self) -> Duration {
        Duration::from_micros(u64::from(self.cfg.max_sleep_us.max(1)))
    }

    /// An iteration did work: reset.
    #[inline]
    pub fn work(&mut self) {
        // No clock read here: busy iterations must stay cheap.
        self.idle_since = None;
        self.sleep_us = 1;
    }

    /// Wait mode: an iteration found nothing. True once nothing happened for the spin window
    /// (the caller then takes its last look and blocks in [`Idle::block`]) — at once while
    /// another thread competes for the CPU ([`Contention`]; `contended` counts each time
    /// competition is found).
    pub fn spun_out(&mut self, contended: &std::sync::atomic::AtomicU64) -> bool {
        std::hint::spin_loop();
        let now = Instant::now();
        let since = *self.idle_since.get_or_insert(now);
        if self.contention.holding(now) {
            return true;
        }
        if self.contention.due(now) && self.contention.sample(now, Contention::read()) {
            crate::stats::bump(contended, 1);
            return true;
        }
        now.saturating_duration_since(since) >= self.spin
    }

    /// Wait mode: build the epoll set: `waker`'s eventfd and `fds` (readable when frames
    /// arrive). Called once, on the lcore thread, before its first sleep.
    pub fn arm(&mut self, waker: &Waker, fds: &[RawFd]) -> std::io::Result<()> {
        use rustix::event::epoll;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(&ep, waker.fd(), epoll::EventData::new_u64(u64::MAX), epoll::EventFlags::IN)?;
        for (i, &fd) in fds.iter().enumerate() {
            // SAFETY: the port's PMD owns this fd and keeps it open while the port is open (it
            // closes after the lcore's loop ends); epoll_ctl only registers it, and the kernel
            // drops the registration itself when the file closes.
            let b = unsafe { BorrowedFd::borrow_raw(fd) };
            if let Err(e) = epoll::add(&ep, b, epoll::EventData::new_u64(i as u64), epoll::EventFlags::IN) {
                tracing::warn!(fd, error = %e, "cannot poll a port's receive fd; the lcore wakes every max_sleep_us");
            }
        }
        self.epoll = Some(ep);
        Ok(())
    }

    /// Wait mode: block until `waker` is signalled, a port fd is readable, or `timeout`
    /// passes (`None`: no timeout). Returns false when there is no epoll set (then it sleeps
    /// `max_sleep_us`).
    pub fn block(&mut self, waker: &Waker, timeout: Option<Duration>) -> bool {
        let Some(ep) = &self.epoll else {
            std::thread::sleep(timeout.unwrap_or(self.max_sleep()).min(self.max_sleep()));
            return false;
        };
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 8];
        let ts = timeout.map(|d| libc::timespec { tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long });
        let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // epoll_pwait2 (Linux 5.11): a nanosecond timeout (epoll_wait's is in milliseconds,
        // too coarse for an RNR timer). SAFETY: valid epoll fd, an 8-entry buffer, a timespec
        // (or NULL) that outlives the call, no signal mask.
        let rc = unsafe { libc::syscall(libc::SYS_epoll_pwait2, ep.as_raw_fd(), events.as_mut_ptr(), events.len() as libc::c_int, tsp, std::ptr::null::<libc::sigset_t>(), 0usize) };
        if rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            // An older kernel: milliseconds, rounded up.
            let ms = timeout.map_or(-1, |d| d.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int);
            // SAFETY: as above.
            unsafe { libc::epoll_wait(ep.as_raw_fd(), events.as_mut_ptr(), events.len() as libc::c_int, ms) };
        }
        waker.drain();
        true
    }

    /// An iteration found nothing: pause, and in back-off mode, once nothing happened for the
    /// spin window, call `before_sleep` and sleep (bounded by `max_sleep_us` and by the next
    /// timer deadline). Returns whether it slept — never on an iteration that had work.
    pub fn idle(&mut self, deadline_in_us: Option<u64>, before_sleep: impl FnOnce()) -> bool {
        std::hint::spin_loop();
        if self.cfg.mode != IdleMode::Backoff {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_switch_between_fresh_samples_holds_spinning() {
        let t0 = Instant::now();
        let mut c = Contention::new();
        assert!(c.due(t0));
        assert!(!c.sample(t0, 5), "the first sample only sets the baseline");
        assert!(!c.due(t0 + Duration::from_micros(500)), "samples are a CHECK apart");
        assert!(!c.sample(t0 + ms(1), 5), "no switch: no competition");
        assert!(c.sample(t0 + ms(2), 6), "a switch since a fresh sample is competition");
        assert!(c.holding(t0 + ms(2)) && c.holding(t0 + ms(21)) && !c.holding(t0 + ms(22)));
        assert!(!c.due(t0 + ms(10)), "no samples while holding");
    }

    #[test]
    fn a_stale_sample_only_restarts_the_count() {
        let t0 = Instant::now();
        let mut c = Contention::new();
        c.sample(t0, 1);
        // The lcore slept or worked 50 ms; the switches since say nothing about now.
        assert!(!c.sample(t0 + ms(50), 9));
        assert!(!c.holding(t0 + ms(50)));
        assert!(c.sample(t0 + ms(51), 10));
    }

    #[test]
    fn the_hold_doubles_while_competition_persists_and_resets_after_a_quiet_spell() {
        let t0 = Instant::now();
        let mut c = Contention::new();
        c.sample(t0, 0);
        assert!(c.sample(t0 + ms(1), 1));
        let mut end = t0 + ms(1) + Contention::HOLD_MIN;
        let mut want = Contention::HOLD_MIN;
        for n in 2..12u64 {
            // The probe after each hold: a stale baseline, then a switch a millisecond later.
            assert!(!c.sample(end, n * 10));
            assert!(c.sample(end + ms(1), n * 10 + 1));
            want = (want * 2).min(Contention::HOLD_MAX);
            assert!(c.holding(end + ms(1) + want - ms(1)) && !c.holding(end + ms(1) + want), "hold {n} is {want:?}");
            end = end + ms(1) + want;
        }
        assert_eq!(want, Contention::HOLD_MAX);
        // Quiet for a while after the hold: the next competition starts at the minimum again.
        let later = end + ms(100);
        assert!(!c.sample(later, 500));
        assert!(!c.sample(later + ms(1), 500));
        assert!(c.sample(later + ms(2), 501));
        assert!(!c.holding(later + ms(2) + Contention::HOLD_MIN));
    }

    #[test]
    fn the_sample_is_this_threads_involuntary_switch_count() {
        // The kernel's own figure for this thread lies between two reads.
        let a = Contention::read();
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("nonvoluntary_ctxt_switches:")).unwrap();
        let k: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let b = Contention::read();
        assert!(a <= k && k <= b, "getrusage {a}..{b}, /proc {k}");
    }
}
