//! A native Rust client of the service: the verbs data path without the C shim.
//!
//! It speaks the same control protocol ([`pmrxe_abi::ctrl`]) and the same shared-memory rings
//! ([`pmrxe_abi::ring`], [`pmrxe_abi::layout`]) as `ffi/verbs`, so what it measures is what an
//! application measures minus the libibverbs ABI translation:
//!
//! * [`Context`]: connect to the control socket, `Hello`, map the client page (doorbells);
//! * [`Pd`], [`Cq`] (poll = read CQEs from the shared ring, no syscall);
//! * [`Qp`]: create, modify to INIT/RTR/RTS ([`Qp::connect`] with an address vector to the
//!   other device's GID), `post_send`/`post_recv` (stage WQEs, one release store, doorbell);
//! * [`Buffer`] + [`Mr`]: memory the library allocates itself as a memfd segment (`AddSegment`)
//!   and registers with one piece (`RegMr`), no FreeFlow remap needed.
//!
//! Objects hold a clone of the [`Context`] (an `Arc`), so they may outlive the variable that
//! created them; destroy requests are best effort on drop (the service also cleans up a
//! client that disconnects). One thread per object: the rings are single-producer/consumer.

mod context;
mod mr;
mod queue;

pub use context::{Context, Pd};
pub use mr::{Buffer, Mr};
pub use queue::{mask, state, Cq, Qp, QpOptions};

pub use pmrxe_abi::ctrl::{AhAttr, DeviceInfo, QpAttr, QpCap};
pub use pmrxe_abi::layout::{send_flags, wr_opcode, ShmCqe, ShmRecvWqe, ShmSendWqe, ShmSge};

/// libibverbs `enum ibv_access_flags` bits.
pub mod access {
    pub const LOCAL_WRITE: u32 = 1;
    pub const REMOTE_WRITE: u32 = 2;
    pub const REMOTE_READ: u32 = 4;
    pub const REMOTE_ATOMIC: u32 = 8;
    /// Everything a benchmark buffer needs.
    pub const ALL: u32 = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC;
}

/// libibverbs `enum ibv_wc_opcode` values seen in [`ShmCqe::opcode`].
pub mod wc_opcode {
    pub const SEND: u32 = 0;
    pub const RDMA_WRITE: u32 = 1;
    pub const RDMA_READ: u32 = 2;
    pub const RECV: u32 = 128;
    pub const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// Build send WQEs.
pub mod wqe {
    use super::*;

    fn base(wr_id: u64, opcode: u32, signaled: bool) -> ShmSendWqe {
        let mut w = ShmSendWqe { wr_id, opcode, ..Default::default() };
        if signaled {
            w.send_flags |= send_flags::SIGNALED;
        }
        w
    }

    /// SEND of one SGE.
    pub fn send(wr_id: u64, sge: ShmSge, signaled: bool) -> ShmSendWqe {
        let mut w = base(wr_id, wr_opcode::SEND, signaled);
        w.num_sge = 1;
        w.set_sge(0, sge);
        w
    }

    /// SEND of inline bytes (`data.len() <= MAX_INLINE_DATA` and the QP's `max_inline_data`).
    pub fn send_inline(wr_id: u64, data: &[u8], signaled: bool) -> ShmSendWqe {
        let mut w = base(wr_id, wr_opcode::SEND, signaled);
        set_inline(&mut w, data);
        w
    }

    /// RDMA WRITE of one SGE to `remote_addr`/`rkey`.
    pub fn write(wr_id: u64, sge: ShmSge, remote_addr: u64, rkey: u32, signaled: bool) -> ShmSendWqe {
        let mut w = base(wr_id, wr_opcode::RDMA_WRITE, signaled);
        w.num_sge = 1;
        w.set_sge(0, sge);
        w.remote_addr = remote_addr;
        w.rkey = rkey;
        w
    }

    /// RDMA WRITE of inline bytes.
    pub fn write_inline(wr_id: u64, data: &[u8], remote_addr: u64, rkey: u32, signaled: bool) -> ShmSendWqe {
        let mut w = base(wr_id, wr_opcode::RDMA_WRITE, signaled);
        set_inline(&mut w, data);
        w.remote_addr = remote_addr;
        w.rkey = rkey;
        w
    }

    /// RDMA READ from `remote_addr`/`rkey` into one SGE.
    pub fn read(wr_id: u64, sge: ShmSge, remote_addr: u64, rkey: u32, signaled: bool) -> ShmSendWqe {
        let mut w = base(wr_id, wr_opcode::RDMA_READ, signaled);
        w.num_sge = 1;
        w.set_sge(0, sge);
        w.remote_addr = remote_addr;
        w.rkey = rkey;
        w
    }

    fn set_inline(w: &mut ShmSendWqe, data: &[u8]) {
        let n = data.len().min(w.data.len());
        w.data[..n].copy_from_slice(&data[..n]);
        w.inline_len = n as u32;
        w.num_sge = 0;
        w.send_flags |= send_flags::INLINE;
    }

    /// A receive WQE of one SGE.
    pub fn recv(wr_id: u64, sge: ShmSge) -> ShmRecvWqe {
        let mut r = ShmRecvWqe { wr_id, num_sge: 1, ..Default::default() };
        r.sge[0] = sge;
        r
    }
}

/// An error reply of the service (errno + message) or a local I/O failure.
pub type Result<T> = std::io::Result<T>;

pub(crate) fn proto(what: &'static str) -> std::io::Error {
    pmrxe_abi::client::Error::Protocol(what).into()
}
