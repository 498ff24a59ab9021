//! pmrxe-mem: memory regions, memory windows and the key table.
//!
//! # Contract
//! * [`MemTable`] is `Send + Sync`, shared by `Arc` between the control thread (registers,
//!   deregisters) and the lcores (copy through keys). Lookups and copies take no lock and never
//!   allocate; control operations may do both.
//! * One active translation per MR; `map_mr_sg` only stages; `exec_reg_mr` installs or
//!   revalidates; invalidation blocks the key but keeps the mapping (DESIGN invariant 1,
//!   reference/SEMANTICS.md §2).
//! * `exec_local_inv`, `remote_invalidate`, `dereg_mr` and MW unbind return only after every
//!   [`MrRef`] obtained through the old state has been dropped (DESIGN invariant 3).
//! * Lcores look keys up through their [`Reader`] (quiescent-state-based reclamation: a lookup
//!   is a load plus checks, invalidation waits until every online reader has passed a
//!   quiescent point); other threads through the table (a counted reference). The transport
//!   reaches both through [`MemAccess`].
//! * All address arithmetic is checked; `va + len` never wraps (DESIGN invariant 8).
//!
//! Executed operations (`exec_*`) are meant to be called exactly once each, in send-queue
//! order, by the transport; errors are precise [`MemError`]s that the transport maps to
//! work-completion statuses (LOC_QP_OP_ERR, MW_BIND_ERR, LOC_PROT_ERR, NAK 0x62 ...).
//!
//! # Loom
//! The invalidate-vs-copy protocols (counted and epoch) have loom models:
//! `RUSTFLAGS="--cfg loom" cargo test -p pmrxe-mem --release --test loom`
//! (atomics and locks come only from the private `sync` facade).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, clippy::undocumented_unsafe_blocks)]

mod access;
mod crc;
mod epoch;
mod error;
pub mod map;
mod reader;
mod region;
mod sge;
mod sync;
mod table;

pub use access::{Access, Key, PdHandle};
pub use crc::{gather_crc, scatter_crc};
pub use error::MemError;
pub use reader::{MemAccess, Reader};
pub use region::{Backing, Region};
pub use sge::{gather, scatter, sge_total_len, Sge};
pub use table::{
    MemLimits, MemTable, MrInfo, MrKind, MrRef, MrState, MwType, SgEntry, Translation, MAX_INDEX, MW_INDEX_BASE,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn table_is_send_sync() {
        assert_send_sync::<MemTable>();
        assert_send_sync::<Region>();
    }

    fn assert_send<T: Send>() {}

    #[test]
    fn reader_is_send() {
        assert_send::<Reader>();
    }
}
