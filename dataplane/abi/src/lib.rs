//! The pmrxe client ABI.
//!
//! Everything a verbs client (the `libpmrxe_verbs.so` shim) and the service must agree on,
//! and nothing else: no DPDK, no transport logic.
//!
//! * [`ring`]: a `repr(C)` single-producer/single-consumer ring that lives in a shared-memory
//!   segment mapped by two processes. The producer and consumer indices sit on their own cache
//!   lines; a push is a plain write of the slot followed by a release-store of the producer
//!   index, so posting a WQE or polling a CQE makes no system call.
//! * [`layout`]: the fixed-size entries that travel through those rings — send WQEs, receive
//!   WQEs and CQEs — plus the per-object segment layouts (QP, CQ, SRQ, client page with its
//!   doorbell bitmaps).
//! * [`qp_table`]: the IBTA QP state-transition table in libibverbs numbers, the one both the
//!   shim (early EINVAL) and the engine (the real transition) check against. It lives in its
//!   own dependency-free crate (`pmrxe-qp-table`), re-exported here for the shim, so the
//!   sans-IO transport can use it without linking this crate's sockets and serde.
//! * [`client`]: the client core — connection, `Hello`, client page and doorbells, segment
//!   mapping and ring attach — shared by the shim, the native harness and the tools.
//! * [`ctrl`]: the versioned control protocol spoken over the service's Unix socket (object
//!   creation, modify QP, memory registration with fd passing).
//!
//! Trust: the service maps the same pages as the client, so it must treat every byte of a
//! shared segment as hostile. Ring consumers validate indices ([`ring::RingError`]) and every
//! entry is copied out of shared memory before it is validated and used.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(not(loom))]
pub mod client;
pub mod ctrl;
pub mod layout;
pub use pmrxe_qp_table as qp_table;
pub mod ring;
mod sync;

pub use layout::*;
