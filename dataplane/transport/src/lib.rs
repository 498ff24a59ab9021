//! pmrxe-transport: the sans-IO RoCEv2 transport engine (RC first-class, UC and UD too).
//!
//! # Contract
//!
//! Like quinn-proto, this crate is fully deterministic: it contains no networking code, reads no
//! clock, spawns no thread and never logs. Every QP ([`Qp`]) is a state machine that consumes
//! events and produces outputs; the caller (the lcore loop in `pmrxe-runtime`, or the simulated
//! wire in `sim`, compiled only with the `sim` feature that tests, benches and fuzz targets
//! enable) owns time and I/O.
//!
//! The methods of [`Qp`] fall into four groups:
//!
//! * (A) getters: [`Qp::query`], [`Qp::stats`], [`Qp::wants_transmit`], [`Qp::qpn`];
//! * (B) incoming events: [`Qp::handle_packet`], [`Qp::handle_timeout`];
//! * (C) application commands: [`Qp::modify`], [`Qp::post_send`], [`Qp::post_recv`];
//! * (D) outputs: [`Qp::poll_transmit`], [`Qp::poll_timeout`], [`Qp::poll_completion`],
//!   [`Qp::poll_event`].
//!
//! After any (B) or (C) call the caller drains the outputs in this order: `poll_transmit` until
//! `None`, then `poll_timeout` (arm one timer for the returned deadline), then
//! `poll_completion`, then `poll_event`. Time ([`Instant`], nanoseconds) must be monotonic across
//! calls.
//!
//! Memory is reached only through [`MemOps`] (implemented for `pmrxe_mem::MemTable`; keys,
//! SGEs, access flags and PD handles are `pmrxe_mem`'s types, PSNs are `pmrxe_wire::Psn`): payload
//! is gathered straight from memory regions into the caller's transmit buffer and scattered
//! straight from the received packet into memory regions.
//!
//! Invariants (see DESIGN.md "Core invariants"): local operations (REG_MR, LOCAL_INV, BIND_MW)
//! execute exactly once in SQ order (two cursors: the network cursor rewinds on retry, the
//! execution cursor never does); LOCAL_INV starts only when every earlier WQE has completed;
//! FENCE waits until every earlier READ/ATOMIC has its data placed; completions are delivered in
//! SQ order with the real status of the failing WQE; the responder never writes memory for a
//! duplicate; nothing executes after the QP entered ERROR.
#![forbid(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod attr;
pub mod builder;
pub mod completer;
pub mod cq;
pub mod dcqcn;
pub mod engine;
#[cfg(feature = "sim")]
pub mod fabric;
pub mod memops;
pub mod packet;
pub mod qp;
pub mod requester;
pub mod responder;
mod rq;
#[cfg(feature = "sim")]
pub mod sim;
pub mod sq;
pub mod srq;
pub mod stats;
pub mod timers;
pub mod wqe;

pub use engine::{AddError, Engine, QpnLayout, TxPort};
pub use dcqcn::{CcConfig, Dcqcn, DcqcnParams, NpParams};
pub use cq::{Bound, CompletionSink, Completions, CqSide, Cqe, Deferred, Delivery, WcFlags, WcOpcode, WcStatus};
pub use memops::{AtomicOp, MemOps};
pub use packet::RxPacket;
pub use attr::{PRIVILEGED_QKEY_BIT, AddressVector, AttrMask, CreateError, ModifyError, PathMtu, QpAttr, QpCaps, QpState, QpType};
pub use qp::{AsyncEvent, PostError, Qp, Transmit};
pub use srq::{Srq, SrqAttr};
pub use stats::QpStats;
pub use timers::{Instant, Timer};
pub use wqe::{RecvWqe, RecvWr, SendFlags, SendOp, SendWqe, SendWr, UdDest, MAX_INLINE, MAX_SGE};
