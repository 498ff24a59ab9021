//! The pmrxe poll-mode runtime: what turns the sans-IO transport engine into a data plane.
//!
//! * [`lcore`]: the per-core run-to-completion loop — rx burst → parse/validate → QP
//!   responder/completer → doorbells of owned SQs/RQs → requester → timers → tx burst — with
//!   batching everywhere, no syscalls, locks or allocations on the fast path, and an idle
//!   back-off for shared machines.
//! * [`dpdk`]: the lcore's DPDK port (ethdev queue pair, optional fault injector). The loop
//!   runs on any `pmrxe_port::Port` — the same trait the simulated ports of the tests
//!   implement.
//! * [`shm`]: shared-memory segments (memfd) for client rings and client memory.
//! * [`neigh`]: static + learned ARP/ND neighbours and the ARP responder.
//! * [`convert`]: validation/conversion of client WQEs (untrusted shared memory) into engine
//!   WQEs, and engine CQEs into client CQEs.
//! * [`gsi`]: QP1 queues between the lcores and the service's connection manager.
//! * [`clock`]: explicit time for the engine (invariant TSC or CLOCK_MONOTONIC).
//! * [`call`]: how a control thread waits for an lcore's reply (as long as the lcore lives
//!   and makes progress; honest errors otherwise).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod call;
pub mod clock;
pub mod convert;
pub mod dpdk;
pub mod gsi;
pub mod idle;
pub mod lcore;
pub mod neigh;
pub mod shm;
pub mod stats;
