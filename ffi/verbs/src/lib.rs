//! `libpmrxe_verbs.so`: a libibverbs-compatible shim for the pmrxe service.
//!
//! Loaded with `LD_PRELOAD` (`pmrxe run -- PROGRAM`), it defines every exported `ibv_*`
//! entry point the supported programs use (unversioned symbols bind to the versioned
//! references, reference/PLATFORM.md §4 variant A') and hands out its own `verbs_context`
//! whose ops table serves the verbs `verbs.h` inlines (`ibv_post_send`, `ibv_poll_cq`, the
//! `ibv_wr_*` and `ibv_cq_ex` callbacks, `ibv_query_port`, `ibv_create_qp_ex`, ...). The real
//! libibverbs never sees a shim object.
//!
//! Layers:
//! * control path ([`client`]): one `SOCK_SEQPACKET` connection per process to the service,
//!   one request/response at a time, fds with `SCM_RIGHTS`;
//! * data path ([`qp`], [`cq`], [`srq`], [`qpex`]): SPSC rings in shared segments, a spinlock
//!   per queue, a doorbell bit in the client page; no system calls;
//! * memory ([`mr`]): FreeFlow-style remap of application pages onto memfd segments;
//! * boundary ([`boundary`]): every `extern "C"` body runs in `ffi_boundary` (panics become
//!   errors, never unwind into C); handles are `#[repr(C)]` structs with the C struct first
//!   and a magic word.
//!
//! librdmacm ([`cm`]): the `rdma_*` API over the service's connection manager.
//!
//! The pmrxedv extension ([`pmrxedv`], `include/pmrxedv.h`) adds fast registration.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod boundary;
pub mod client;
pub mod cm;
pub mod cq;
pub mod device;
pub mod events;
pub mod extras;
pub mod fork;
pub mod import;
pub mod mr;
pub mod mw;
pub mod pd;
pub mod pmrxedv;
pub mod provider;
pub mod post;
pub mod qp;
pub mod qp_state;
pub mod qpex;
pub mod registry;
pub mod srq;
pub mod strings;
pub mod sys;
pub mod vma;
