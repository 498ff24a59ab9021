//! The FFI boundary: every `extern "C"` body runs inside [`ffi_boundary`], errors are one type
//! ([`Errno`]) mapped to the C convention of each verb in exactly one place per convention.
//!
//! Conventions of libibverbs (rdma-core 44):
//! * constructors return a pointer, NULL + `errno` on failure ([`ret_ptr`]);
//! * most other verbs return 0 or a positive errno ([`ret_errno`]);
//! * `poll_cq` returns a count or a negative value ([`ret_count`]).
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// An errno value (positive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub c_int);

impl Errno {
    pub const INVAL: Errno = Errno(libc::EINVAL);
    pub const NOMEM: Errno = Errno(libc::ENOMEM);
    pub const NOSYS: Errno = Errno(libc::ENOSYS);
    pub const OPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const IO: Errno = Errno(libc::EIO);
    pub const NODEV: Errno = Errno(libc::ENODEV);
    pub const NOENT: Errno = Errno(libc::ENOENT);
    pub const AGAIN: Errno = Errno(libc::EAGAIN);

    /// The calling thread's last OS error.
    pub fn last() -> Errno {
        Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Self {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

/// A ring that refuses an entry: full is ENOMEM (what `ibv_post_*` return for a full queue),
/// impossible indices EIO.
impl From<pmrxe_abi::ring::PushError<()>> for Errno {
    fn from(e: pmrxe_abi::ring::PushError<()>) -> Self {
        match e {
            pmrxe_abi::ring::PushError::Full(()) => Errno::NOMEM,
            pmrxe_abi::ring::PushError::Corrupt(()) => Errno::IO,
        }
    }
}

/// Shorthand result type of the shim's internals.
pub type Res<T> = Result<T, Errno>;

/// Set the calling thread's `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Run `f`, turning a panic into `default` (with errno = EIO) instead of unwinding into C.
pub fn ffi_boundary<T>(default: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            default
        }
    }
}

/// Blocking waits that are pthread cancellation points, as the `read(2)` libibverbs and
/// librdmacm block in: `pthread_cancel` of a thread waiting in `ibv_get_cq_event`,
/// `ibv_get_async_event` or `rdma_get_cm_event` must end the thread (running its cleanup
/// handlers), not the process. glibc cancels by forced unwinding from inside the system call;
/// `catch_unwind` (in [`ffi_boundary`]) or an `extern "C"` frame would stop that unwind and
/// abort ("FATAL: exception not rethrown"). So the blocking exports are `extern "C-unwind"`,
/// do all their work in non-blocking steps inside `ffi_boundary`, and block only through
/// these functions, called from the export's own frame with nothing to drop alive (a
/// plain-old frame the unwind may pass through).
pub mod cancel {
    use std::os::raw::{c_int, c_void};

    // The libc functions, declared as possibly unwinding (they do, when cancelled).
    extern "C-unwind" {
        fn read(fd: c_int, buf: *mut c_void, count: usize) -> isize;
        fn recv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize;
        fn poll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int;
    }

    /// Read an eventfd's 8-byte count (blocks unless the fd is O_NONBLOCK). `Err(errno)`.
    pub fn read_u64(fd: c_int) -> Result<u64, c_int> {
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a local u64.
        let n = unsafe { read(fd, (&mut v as *mut u64).cast(), 8) };
        if n < 0 {
            return Err(super::Errno::last().0);
        }
        Ok(v)
    }

    /// Wait until a datagram can be read from socket `fd` (peeks, consumes nothing; EOF
    /// counts). Restarts as `recv(2)` does under SA_RESTART. `Err(errno)`.
    pub fn wait_datagram(fd: c_int) -> Result<(), c_int> {
        let mut b = 0u8;
        // SAFETY: peeking one byte into a local.
        let n = unsafe { recv(fd, (&mut b as *mut u8).cast(), 1, libc::MSG_PEEK) };
        if n < 0 {
            return Err(super::Errno::last().0);
        }
        Ok(())
    }

    extern "C" {
        fn pthread_setcancelstate(state: c_int, oldstate: *mut c_int) -> c_int;
    }
    const PTHREAD_CANCEL_DISABLE: c_int = 1;

    /// Run `f` with cancellation disabled: the system calls it makes (the control socket's
    /// sendmsg/recvmsg, polls) are not where the call may be cancelled. A cancel requested
    /// meanwhile stays pending for the next cancellation point.
    pub fn no_cancel<T>(f: impl FnOnce() -> T) -> T {
        let mut old = 0;
        // SAFETY: plain glibc call with a valid out pointer.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        let r = f();
        // SAFETY: as above; restores the caller's state (not a cancellation point).
        unsafe { pthread_setcancelstate(old, std::ptr::null_mut()) };
        r
    }

    /// Wait at most `ms` for `fd` to become readable.
    pub fn wait_readable(fd: c_int, ms: c_int) {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { poll(&mut p, 1, ms) };
    }
}

/// Constructor convention: the pointer, or NULL with errno set.
pub fn ret_ptr<T>(r: Res<*mut T>) -> *mut T {
    match r {
        Ok(p) => p,
        Err(Errno(e)) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

/// Verb convention: 0 or a positive errno (errno is set as well, as rdma-core does).
pub fn ret_errno(r: Res<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(Errno(e)) => {
            set_errno(e);
            e
        }
    }
}

/// `-1` + errno convention (ibv_get_cq_event, ibv_get_async_event, ...).
pub fn ret_minus1(r: Res<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(Errno(e)) => {
            set_errno(e);
            -1
        }
    }
}

/// Count convention: a non-negative count or a negative errno.
pub fn ret_count(r: Res<c_int>) -> c_int {
    match r {
        Ok(n) => n,
        Err(Errno(e)) => -e,
    }
}

/// Turn a possibly-NULL pointer into a reference, or EINVAL.
///
/// # Safety
/// A non-NULL `p` must point to a live, properly aligned `T` for the lifetime `'a`.
pub unsafe fn nonnull<'a, T>(p: *mut T) -> Res<&'a mut T> {
    // SAFETY: forwarded contract.
    unsafe { p.as_mut() }.ok_or(Errno::INVAL)
}

/// A handle type: a `#[repr(C)]` struct whose first field is the C struct handed to the
/// application, plus a magic word that tells our objects from anything else.
///
/// Ownership: handles are created with `Box::into_raw` by the constructor verb and freed by
/// the matching destroy verb (`Box::from_raw`); the application only borrows them in between.
pub trait Handle: Sized {
    /// The C struct that is the first field.
    type C;
    /// Magic word identifying this handle type.
    const MAGIC: u64;
    /// The stored magic (must equal `MAGIC` on a live handle).
    fn magic(&self) -> u64;

    /// Recover our handle from the C pointer the application passes back.
    ///
    /// # Safety
    /// A non-NULL `p` must have been produced by this shim for a handle of type `Self` and not
    /// yet destroyed (the magic check catches some, not all, misuse).
    unsafe fn from_c<'a>(p: *mut Self::C) -> Res<&'a Self> {
        if p.is_null() {
            return Err(Errno::INVAL);
        }
        // SAFETY: `C` is the first field of a repr(C) `Self`, so the pointers coincide; the
        // caller guarantees it is one of ours and alive. Shared, never `&mut`: verbs lets
        // several application threads use one handle at once.
        let h = unsafe { &*p.cast::<Self>() };
        if h.magic() != Self::MAGIC {
            return Err(Errno::INVAL);
        }
        Ok(h)
    }

    /// Box the handle and return the C pointer (the handle is live from now on: see
    /// [`Handle::find_live`]).
    fn into_c(self: Box<Self>) -> *mut Self::C {
        let p = Box::into_raw(self);
        live(|m| m.entry(Self::MAGIC).or_default().insert(p as usize));
        p.cast()
    }

    /// Take ownership back (for destroy verbs).
    ///
    /// # Safety
    /// `p` must be a live handle of this type (checked with [`Handle::from_c`] just before);
    /// the application must not use it afterwards.
    unsafe fn take(p: *mut Self::C) -> Box<Self> {
        // No longer findable before it can be freed (find_live reads under the same lock).
        live(|m| m.get_mut(&Self::MAGIC).map(|s| s.remove(&(p as usize))));
        // SAFETY: produced by `into_c` (caller contract).
        let mut b = unsafe { Box::from_raw(p.cast::<Self>()) };
        b.clear_magic();
        b
    }

    /// A live handle of this type (made by [`Handle::into_c`], not yet [`Handle::take`]n) for
    /// which `pred` holds: how an object is found by its service handle (`ibv_import_pd`,
    /// `ibv_import_mr`). Control path only (a process-wide mutex, a scan).
    fn find_live(mut pred: impl FnMut(&Self) -> bool) -> Option<*mut Self::C> {
        live(|m| {
            m.get(&Self::MAGIC)?.iter().copied().find(|&p| {
                // SAFETY: the set holds exactly the pointers `into_c` returned and `take` has
                // not yet removed; `take` removes under this lock before the box can be
                // dropped, so `p` is a live `Self` for as long as we hold the lock.
                let h = unsafe { &*(p as *const Self) };
                h.magic() == Self::MAGIC && pred(h)
            })
        })
        .map(|p| p as *mut Self::C)
    }

    /// Overwrite the magic so a stale pointer is rejected.
    fn clear_magic(&mut self);
}

/// Live handles (as addresses) by handle type (its `MAGIC`).
type LiveSet = std::collections::HashMap<u64, std::collections::HashSet<usize>>;
static LIVE: std::sync::Mutex<Option<LiveSet>> = std::sync::Mutex::new(None);

/// Run `f` on the live-handle table, under its lock.
fn live<R>(f: impl FnOnce(&mut LiveSet) -> R) -> R {
    let mut g = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Default::default))
}

/// Implement [`Handle`] for a struct with a `magic: u64` field.
macro_rules! handle {
    ($t:ty, $c:ty, $magic:expr) => {
        impl $crate::boundary::Handle for $t {
            type C = $c;
            const MAGIC: u64 = $magic;
            fn magic(&self) -> u64 {
                self.magic
            }
            fn clear_magic(&mut self) {
                self.magic = 0xdead_dead_dead_dead;
            }
        }
    };
}
pub(crate) use handle;

/// A tiny test-and-test-and-set spinlock for per-queue data-path state (no syscalls).
pub struct SpinLock<T> {
    locked: std::sync::atomic::AtomicBool,
    value: std::cell::UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `locked` (acquire on lock, release on unlock).
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the value; T: Send.
unsafe impl<T: Send> Send for SpinLock<T> {}

/// Guard of a [`SpinLock`].
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> SpinLock<T> {
    pub fn new(v: T) -> Self {
        SpinLock { locked: std::sync::atomic::AtomicBool::new(false), value: std::cell::UnsafeCell::new(v) }
    }
    pub fn lock(&self) -> SpinGuard<'_, T> {
        use std::sync::atomic::Ordering::*;
        let mut spins = 0u32;
        loop {
            if !self.locked.load(Relaxed) && self.locked.compare_exchange_weak(false, true, Acquire, Relaxed).is_ok() {
                return SpinGuard { lock: self };
            }
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                // Another thread holds the queue for long (e.g. between wr_start and
                // wr_complete); stop burning the core.
                std::thread::yield_now();
            }
        }
    }
    /// Lock without a guard (wr_start .. wr_complete span two calls).
    pub fn raw_lock(&self) {
        std::mem::forget(self.lock());
    }
    /// Release a lock taken with [`SpinLock::raw_lock`].
    ///
    /// # Safety
    /// The calling thread must hold the lock through `raw_lock`.
    pub unsafe fn raw_unlock(&self) {
        self.locked.store(false, std::sync::atomic::Ordering::Release);
    }
    /// The value, assuming the lock is held through `raw_lock`.
    ///
    /// # Safety
    /// The caller holds the lock via `raw_lock` and creates no other reference.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn raw_get(&self) -> &mut T {
        // SAFETY: exclusive by the caller's lock.
        unsafe { &mut *self.value.get() }
    }
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves exclusive access.
        unsafe { &*self.lock.value.get() }
    }
}
impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves exclusive access.
        unsafe { &mut *self.lock.value.get() }
    }
}
impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// A shared mapping that is unmapped on drop (the client core's).
pub use pmrxe_abi::client::Mapping;

/// Copy a C string into a fixed `c_char` array (NUL-terminated, truncated).
pub fn copy_cstr(dst: &mut [std::os::raw::c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as std::os::raw::c_char;
    }
    if let Some(d) = dst.get_mut(n) {
        *d = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spinlock is what lets several threads share one queue handle (`&ShimQp`,
    /// `&ShimCq`): increments under the guard and under `raw_lock`/`raw_get`/`raw_unlock` (the
    /// `wr_start`..`wr_complete` span) from several threads are never lost. Under Miri this
    /// also checks that the guard's `&mut` never aliases another thread's.
    #[test]
    fn spinlock_serialises_threads_through_guard_and_raw_span() {
        const THREADS: u64 = 4;
        const N: u64 = if cfg!(miri) { 50 } else { 20_000 };
        let lock = SpinLock::new((0u64, 0u64));
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let lock = &lock;
                s.spawn(move || {
                    for i in 0..N {
                        if (i + t) % 2 == 0 {
                            let mut g = lock.lock();
                            g.0 += 1;
                        } else {
                            lock.raw_lock();
                            // SAFETY: this thread took the lock with raw_lock just above and
                            // makes no other reference until raw_unlock.
                            unsafe { lock.raw_get() }.1 += 1;
                            // SAFETY: held by this thread since raw_lock.
                            unsafe { lock.raw_unlock() };
                        }
                    }
                });
            }
        });
        let g = lock.lock();
        assert_eq!(g.0 + g.1, THREADS * N);
    }

    /// Ring refusals map to the post verbs' errnos.
    #[test]
    fn ring_refusals_are_enomem_or_eio() {
        use pmrxe_abi::ring::PushError;
        assert_eq!(Errno::from(PushError::Full(())), Errno::NOMEM);
        assert_eq!(Errno::from(PushError::Corrupt(())), Errno::IO);
    }
}
