//! The only place the shared pages' atomics come from, so loom can model the ring, the
//! doorbells and the CQ notification.
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
