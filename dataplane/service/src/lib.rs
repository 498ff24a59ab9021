//! The pmrxe service (`pmrxe serve`).
//!
//! Start-up, in order, each step failing fast with a one-line error: validate the config →
//! EAL → ports (ring pair, memif, af_packet/af_xdp, PCI) → the memory table → one pinned
//! thread per configured lcore running [`pmrxe_runtime::lcore::Lcore`] → the control socket
//! (`service-user:group` mode 0660, in a directory others cannot write; a stale socket is
//! replaced only if nobody answers it). The control thread never runs
//! on an lcore's CPU and is never on the fast path.
//!
//! Clients (the verbs shim, `pmrxe stats`) connect to the socket; [`access`] admits root, the
//! service's user and members of `service.group`, and each admitted client gets a session thread
//! ([`session`]) that owns its objects and turns requests into lcore commands. A client that
//! dies is cleaned up completely: its QPs leave the lcore, its MRs are deregistered, its
//! segments unmapped.
//!
//! Stop: SIGINT/SIGTERM → lcores flush their QPs (clients see WR_FLUSH_ERR) and stop → ports
//! stop → EAL cleanup (runtime dir removed) → socket removed.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod access;
pub mod client;
pub mod cm;
pub mod device;
pub mod devnodes;
pub mod limits;
pub mod mcast;
pub mod metrics;

pub mod serve;
pub mod native;
pub mod session;
pub mod stats;

pub use serve::{serve, ServeError};
