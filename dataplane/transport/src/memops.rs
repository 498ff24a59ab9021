//! The engine's view of memory: a thin adapter over `pmrxe_mem::MemTable`.
//!
//! The engine reaches memory only through [`MemOps`], so it never holds a pointer: payload is
//! gathered into the transmit buffer and scattered from the received packet by the memory
//! crate, which checks keys, PDs, access rights and ranges (with checked arithmetic).
//! `MemOps` is implemented in this file for every `pmrxe_mem::MemAccess`: the table itself
//! (counted lookups: the simulator, tests) and an lcore's `pmrxe_mem::Reader` (epoch lookups,
//! no atomic read-modify-write: production).

use pmrxe_mem::{Access, Key, MemAccess, MemError, PdHandle, Sge, Translation};

/// An atomic operation at the responder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Compare and swap.
    CmpSwap {
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// Fetch and add.
    FetchAdd {
        /// Addend.
        add: u64,
    },
}

/// Everything the engine asks of the memory layer. All methods take `&self`: the table uses
/// its own synchronisation, so QPs on one lcore share one `&MemTable`.
pub trait MemOps {
    /// Copy bytes `[offset, offset + out.len())` of the message described by `sges` (local
    /// keys, no special access) into `out`.
    fn gather(&self, pd: PdHandle, qpn: u32, sges: &[Sge], offset: u64, out: &mut [u8]) -> Result<(), MemError>;
    /// Copy `data` to bytes `[offset, ..)` of the message described by `sges` (needs
    /// LOCAL_WRITE on every MR touched).
    fn scatter(&self, pd: PdHandle, qpn: u32, sges: &[Sge], offset: u64, data: &[u8]) -> Result<(), MemError>;
    /// Check that `rkey` grants `need` on `[va, va + len)` for QP `qpn` in `pd`; the check,
    /// carried to the message's packets (`*_carried`).
    fn check_remote(&self, pd: PdHandle, qpn: u32, rkey: u32, va: u64, len: u64, need: Access) -> Result<Translation, MemError>;
    /// Remote write of `data` at `va` through `rkey` (a single-packet message).
    fn write_remote(&self, pd: PdHandle, qpn: u32, rkey: u32, va: u64, data: &[u8]) -> Result<(), MemError>;
    /// Remote write of `data` at `va` inside a window [`check_remote`](MemOps::check_remote)
    /// validated for REMOTE_WRITE: without a lookup while `t` is valid (an lcore), else by
    /// looking its key up again.
    fn write_carried(&self, t: &Translation, va: u64, data: &[u8]) -> Result<(), MemError>;
    /// Read into `out` from `va` inside a window validated for reading (as
    /// [`write_carried`](MemOps::write_carried)): by [`check_remote`](MemOps::check_remote)
    /// for REMOTE_READ (READ responses), or by [`check_local`](MemOps::check_local) (the
    /// requester's gather of a long message).
    fn read_carried(&self, t: &Translation, va: u64, out: &mut [u8]) -> Result<(), MemError>;
    /// Check that `lkey` covers `[addr, addr + len)` for QP `qpn` in `pd` as a gather does (no
    /// special access); the check, carried to the message's packets
    /// ([`read_carried_crc`](MemOps::read_carried_crc)).
    fn check_local(&self, pd: PdHandle, qpn: u32, lkey: Key, addr: u64, len: u64) -> Result<Translation, MemError>;
    /// Remote atomic on the 8 bytes at `va` through `rkey`; returns the original value.
    fn atomic_remote(&self, pd: PdHandle, qpn: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError>;
    /// Invalidation requested by a SEND with invalidate (IETH).
    fn invalidate_remote(&self, pd: PdHandle, qpn: u32, key: u32) -> Result<(), MemError>;
    /// Execute a fast-register (REG_MR) work request.
    #[allow(clippy::too_many_arguments)]
    fn reg_mr(&self, pd: PdHandle, qpn: u32, mr: Key, key: Key, access: Access, iova: Option<u64>, length: Option<u64>) -> Result<(), MemError>;
    /// Execute a LOCAL_INV work request.
    fn local_inv(&self, pd: PdHandle, qpn: u32, key: Key) -> Result<(), MemError>;
    /// Execute a BIND_MW work request.
    #[allow(clippy::too_many_arguments)]
    fn bind_mw(&self, pd: PdHandle, qpn: u32, mw: Key, new_key: Key, mr: Key, addr: u64, len: u64, access: Access) -> Result<(), MemError>;

    // One-pass copies that fold the CRC-32 of the bytes moved (the ICRC, zlib convention) into
    // `crc` and return it: the data path gathers payload into a frame while hashing it and
    // scatters a received payload while checking it (`pmrxe_crc`). The defaults copy and then
    // hash (two passes), for models; the memory table's implementation does one pass.

    /// [`gather`](MemOps::gather) folding the bytes into `crc`.
    #[allow(clippy::too_many_arguments)]
    fn gather_crc(&self, pd: PdHandle, qpn: u32, sges: &[Sge], offset: u64, out: &mut [u8], crc: u32) -> Result<u32, MemError> {
        self.gather(pd, qpn, sges, offset, out)?;
        Ok(pmrxe_crc::crc_update(crc, out))
    }
    /// [`scatter`](MemOps::scatter) folding the bytes into `crc`.
    #[allow(clippy::too_many_arguments)]
    fn scatter_crc(&self, pd: PdHandle, qpn: u32, sges: &[Sge], offset: u64, data: &[u8], crc: u32) -> Result<u32, MemError> {
        self.scatter(pd, qpn, sges, offset, data)?;
        Ok(pmrxe_crc::crc_update(crc, data))
    }
    /// [`write_remote`](MemOps::write_remote) folding the bytes into `crc`.
    #[allow(clippy::too_many_arguments)]
    fn write_remote_crc(&self, pd: PdHandle, qpn: u32, rkey: u32, va: u64, data: &[u8], crc: u32) -> Result<u32, MemError> {
        self.write_remote(pd, qpn, rkey, va, data)?;
        Ok(pmrxe_crc::crc_update(crc, data))
    }
    /// [`write_carried`](MemOps::write_carried) folding the bytes into `crc`.
    fn write_carried_crc(&self, t: &Translation, va: u64, data: &[u8], crc: u32) -> Result<u32, MemError> {
        self.write_carried(t, va, data)?;
        Ok(pmrxe_crc::crc_update(crc, data))
    }
    /// [`read_carried`](MemOps::read_carried) folding the bytes into `crc`.
    fn read_carried_crc(&self, t: &Translation, va: u64, out: &mut [u8], crc: u32) -> Result<u32, MemError> {
        self.read_carried(t, va, out)?;
        Ok(pmrxe_crc::crc_update(crc, out))
    }
}

impl<T: MemAccess> MemOps for T {
    fn gather(&self, pd: PdHandle, qpn: u32, sges: &[Sge], offset: u64, out: &mut [u8]) -> Result<(), MemError> {
        pmrxe_mem::gather(self, pd, qpn, sges, offset, out)
    }
    fn scatter(&self, pd: PdHandle, qpn: u32, sges: &[Sge], offset: u64, data: &[u8]) -> Result<(), MemError> {
        pmrxe_mem::scatter(self, pd, qpn, sges, offset, data)
    }
    fn check_remote(&self, pd: PdHandle, qpn: u32, rkey: u32, va: u64, len: u64, need: Access) -> Result<Translation, MemError> {
        self.lookup_carried(Key(rkey), pd, qpn, va, len, need)
    }
    fn write_remote(&self, pd: PdHandle, qpn: u32, rkey: u32, va: u64, data: &[u8]) -> Result<(), MemError> {
        self.lookup(Key(rkey), pd, qpn, va, data.len() as u64, Access::REMOTE_WRITE)?.copy_in(va, data)
    }
    fn write_carried(&self, t: &Translation, va: u64, data: &[u8]) -> Result<(), MemError> {
        self.resume(t, va, data.len() as u64)?.copy_in(va, data)
    }
    fn read_carried(&self, t: &Translation, va: u64, out: &mut [u8]) -> Result<(), MemError> {
        self.resume(t, va, out.len() as u64)?.copy_out(va, out)
    }
    fn check_local(&self, pd: PdHandle, qpn: u32, lkey: Key, addr: u64, len: u64) -> Result<Translation, MemError> {
        self.lookup_carried(lkey, pd, qpn, addr, len, Access::EMPTY)
    }
    fn atomic_remote(&self, pd: PdHandle, qpn: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        let r = self.lookup(Key(rkey), pd, qpn, va, 8, Access::REMOTE_ATOMIC)?;
        match op {
            AtomicOp::CmpSwap { compare, swap } => r.atomic_cmp_swap(va, compare, swap),
            AtomicOp::FetchAdd { add } => r.atomic_fetch_add(va, add),
        }
    }
    fn invalidate_remote(&self, pd: PdHandle, qpn: u32, key: u32) -> Result<(), MemError> {
        self.remote_invalidate(pd, qpn, Key(key))
    }
    fn reg_mr(&self, pd: PdHandle, _qpn: u32, mr: Key, key: Key, access: Access, iova: Option<u64>, length: Option<u64>) -> Result<(), MemError> {
        self.exec_reg_mr_for(pd, mr, key, access, iova, length)
    }
    fn local_inv(&self, pd: PdHandle, _qpn: u32, key: Key) -> Result<(), MemError> {
        self.exec_local_inv(pd, key)
    }
    fn bind_mw(&self, pd: PdHandle, qpn: u32, mw: Key, new_key: Key, mr: Key, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        self.exec_bind_mw(pd, qpn, mw, new_key, mr, addr, len, access)
    }
    fn gather_crc(&self, pd: PdHandle, qpn: u32, sges: &[Sge], offset: u64, out: &mut [u8], crc: u32) -> Result<u32, MemError> {
        pmrxe_mem::gather_crc(self, pd, qpn, sges, offset, out, crc)
    }
    fn scatter_crc(&self, pd: PdHandle, qpn: u32, sges: &[Sge], offset: u64, data: &[u8], crc: u32) -> Result<u32, MemError> {
        pmrxe_mem::scatter_crc(self, pd, qpn, sges, offset, data, crc)
    }
    fn write_remote_crc(&self, pd: PdHandle, qpn: u32, rkey: u32, va: u64, data: &[u8], crc: u32) -> Result<u32, MemError> {
        self.lookup(Key(rkey), pd, qpn, va, data.len() as u64, Access::REMOTE_WRITE)?.copy_in_crc(va, data, crc)
    }
    fn write_carried_crc(&self, t: &Translation, va: u64, data: &[u8], crc: u32) -> Result<u32, MemError> {
        self.resume(t, va, data.len() as u64)?.copy_in_crc(va, data, crc)
    }
    fn read_carried_crc(&self, t: &Translation, va: u64, out: &mut [u8], crc: u32) -> Result<u32, MemError> {
        self.resume(t, va, out.len() as u64)?.copy_out_crc(va, out, crc)
    }
}
