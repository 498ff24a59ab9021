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
//! Callers drive the [`Engine`] (every QP of one lcore or one simulated node), through one
//! surface that the lcore and the simulator both use:
//!
//! * posts: [`Engine::pull`] (a QP's rung WRs from a [`WorkSource`]: the lcore's shared
//!   rings, the simulator's `Rings`; the engine decides full queues, malformed entries and
//!   corrupt rings) and [`Engine::modify`]; [`Engine::post_send`], [`Engine::post_recv`] for
//!   embedders that post one WR at a time (tests);
//! * frames in: [`Engine::predict`] (header prediction of a MIDDLE packet, keyed per QP and
//!   port), then [`Engine::receive`] (the packet acts; the next prediction is recorded);
//! * frames out: [`Engine::transmit`], which decides ready-list fairness and path gating (a QP
//!   whose neighbour is unresolved is held, and re-examined on a new neighbour generation) and
//!   writes into the caller's [`TxPort`];
//! * time: [`Engine::poll_timeout`] (the next deadline) and [`Engine::handle_timeout`];
//! * completions: [`Engine::deliver`] hands each QP's completions to the caller's
//!   [`Delivery`] sink, retries what the CQ refused, and on an overflow reports it and
//!   moves the QP to ERROR.
//!
//! A [`Qp`] on its own (tests, the congested fabric, fuzz targets) is driven with
//! [`Qp::handle_packet`], [`Qp::handle_timeout`], [`Qp::post_send`], [`Qp::post_recv`] and
//! drained with [`Qp::poll_transmit`], [`Qp::poll_timeout`], [`Qp::poll_completion`],
//! [`Qp::poll_event`], in that order after each event. Time ([`Instant`], nanoseconds) must be
//! monotonic across calls.
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
#[cfg(feature = "sim")]
pub mod link;
pub mod memops;
pub mod packet;
pub mod qp;
pub mod requester;
pub mod responder;
mod rq;
#[cfg(feature = "sim")]
pub mod sim;
pub mod source;
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
pub use attr::{PRIVILEGED_QKEY_BIT, AddressVector, AttrMask, CreateError, ModifyError, PathMtu, QpAttr, QpCaps, QpState, QpType, UnknownValue};
pub use qp::{AsyncEvent, PostError, Qp, Transmit};
pub use source::{Offer, Pulled, Queue, WorkSource};
pub use srq::{Srq, SrqAttr};
pub use stats::QpStats;
pub use timers::{Instant, Timer};
pub use wqe::{RecvWqe, RecvWr, SendFlags, SendOp, SendWqe, SendWr, UdDest, MAX_INLINE, MAX_SGE};
