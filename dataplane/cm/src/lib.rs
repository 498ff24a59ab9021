//! pmrxe-cm: the InfiniBand Communication Manager (IBTA vol.1 ch.12) for RoCEv2, sans-IO.
//!
//! # Layers
//!
//! * Wire (smoltcp style, no state): [`mad`] (the 24-byte common MAD header), [`msg`] (REQ,
//!   MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP: one `Packet`/`Repr` pair per file,
//!   [`parse_mad`]/[`emit_mad`] for a whole 256-byte MAD), [`cma`] (RDMA CM service IDs and
//!   the `cma_hdr` IP header in REQ private data) and [`gsi`] (the RoCEv2 frame: UD SEND_ONLY
//!   QP1 → QP1, Q_Key 0x80010000, built with `pmrxe_wire`). The `Packet` contract is the one of
//!   `pmrxe_wire`: after `check_len()` returns `Ok` no accessor panics; `parse` never panics.
//! * Protocol (quinn style): [`Cm`], one per port, a deterministic state machine with explicit
//!   time ([`Instant`], the transport engine's: one time type in the workspace, the only
//!   thing the protocol takes from `pmrxe_transport`). It reads no clock, owns no socket, knows nothing of lcores, QPs or
//!   the shim: it consumes received MADs, consumer commands and `now`, and produces MADs to
//!   send, a deadline and [`Event`]s. See [`Cm`] for the method taxonomy and polling order.
//! * `sim` (feature `sim`, tests only): two or more `Cm`s exchanging real frames over the
//!   transport simulator's link (`pmrxe_transport::link`: seeded loss, duplication,
//!   corruption, reordering, delay; one simulated wire for the workspace).
//!
//! Design, message flows, timers and what matches the kernel: `docs/cm.md`.
#![forbid(unsafe_code)]
#![warn(missing_debug_implementations)]

mod bits;
pub mod cma;
pub mod error;
pub mod gsi;
pub mod mad;
pub mod msg;
#[cfg(feature = "sim")]
pub mod sim;
pub mod timers;
pub mod types;

mod active;
mod endpoint;
mod passive;
mod sidr;
mod teardown;

pub use endpoint::{Cm, CmConfig, ConnState};
pub use error::{CmError, Error, Result};
pub use msg::{emit_mad, parse_mad, CmMsg, Mad, MsgCode, RejReason, SidrStatus};
pub use timers::{iba_ns, Instant};
pub use types::{
    AcceptParams, CmStats, ConnId, ConnectParams, ConnectRequest, Ece, Event, Gid, GsiPath, MadSource, QpAttrs, RoutePath,
    SidrParams, SidrReplyParams, SidrRequest, Transmit, Transport, Waiting,
};
