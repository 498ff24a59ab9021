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
        Idle { cfg, idle_since: None, spin, sleep_us: 1, epoll: None }
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
    /// (the caller then takes its last look and blocks in [`Idle::block`]).
    pub fn spun_out(&mut self) -> bool {
        std::hint::spin_loop();
        let since = *self.idle_since.get_or_insert_with(Instant::now);
        since.elapsed() >= self.spin
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
