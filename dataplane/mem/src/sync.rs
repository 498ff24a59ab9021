//! The only place atomics and locks come from, so the loom models see every access.
//!
//! Build with `RUSTFLAGS="--cfg loom"` to swap in loom's types.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Lock a mutex, ignoring poisoning (a panicked control thread must not wedge the table;
/// every critical section leaves the slot consistent before it can panic).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Back off while waiting for in-flight copies to drain.
#[inline]
pub(crate) fn spin_wait(iter: u32) {
    #[cfg(loom)]
    {
        let _ = iter;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if iter < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
