//! MR/MW semantics at the table level, named after reference/SEMANTICS.md §7 (A*, B*) and the
//! IBTA rules they exercise.

use pmrxe_mem::*;

const PD: PdHandle = 7;
const OTHER_PD: PdHandle = 8;
const QPN: u32 = 0x11;
const PG: usize = 4096;
const ALL_RW: Access =
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);

fn table() -> MemTable {
    MemTable::new(MemLimits {
        max_mr: 64,
        max_mw: 64,
        max_fast_reg_pages: 512,
        page_slots: 1 << 14,
        ..MemLimits::default()
    })
}

/// `len` bytes aligned to `align`, filled with a position pattern.
fn aligned(len: usize, align: usize) -> Region {
    let big = Region::zeroed(len + align);
    let off = (align - big.addr() as usize % align) % align;
    let r = big.slice(off, len).unwrap();
    let pat: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    r.write(0, &pat).unwrap();
    r
}

fn read(r: &Region, off: usize, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    r.read(off, &mut v).unwrap();
    v
}

/// Fast-reg MR over `pages` 4 KiB pages of `r` as one SG element per page, first offset `off`.
fn fmr(t: &MemTable, r: &Region, pages: usize, off: u64) -> Key {
    let k = t.alloc_mr(PD, 16).unwrap();
    let sg: Vec<SgEntry> = (0..pages)
        .map(|i| SgEntry {
            region: r,
            offset: i * PG,
            len: PG,
        })
        .collect();
    assert_eq!(t.map_mr_sg(k, &sg, off, PG as u64).unwrap(), pages);
    k
}

fn valid_fmr(t: &MemTable, r: &Region, pages: usize, off: u64, access: Access) -> Key {
    let k = fmr(t, r, pages, off).inc();
    t.exec_reg_mr(PD, k, access, None, None).unwrap();
    k
}

fn iova(t: &MemTable, k: Key) -> u64 {
    t.query(k).unwrap().iova
}

// ---- A. MR lifecycle and keys -------------------------------------------------------------

#[test]
fn a1_new_fmr_is_free_key_unusable() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = fmr(&t, &r, 4, 0);
    assert_eq!(t.query(k).unwrap().state, MrState::Free);
    let io = t.query(k).unwrap().next_iova;
    assert_eq!(
        t.lookup(k, PD, QPN, io, 8, Access::EMPTY).unwrap_err(),
        MemError::NotValid
    );
    let sge = [Sge {
        addr: io,
        len: 8,
        lkey: k,
    }];
    assert_eq!(
        gather(&t, PD, QPN, &sge, 0, &mut [0; 8]).unwrap_err(),
        MemError::NotValid
    );
}

#[test]
fn a2_map_offset_update_key_register_and_stale_key() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = fmr(&t, &r, 4, 0x100);
    let k1 = k.inc();
    t.exec_reg_mr(PD, k1, ALL_RW, None, None).unwrap();
    let info = t.query(k1).unwrap();
    assert_eq!(
        (info.state, info.key, info.length, info.page_size),
        (MrState::Valid, k1, 4 * PG as u64 - 0x100, 4096)
    );
    assert_eq!(info.iova, r.addr() + 0x100);
    let m = t
        .lookup(k1, PD, QPN, info.iova + 0x100, 4, Access::REMOTE_WRITE)
        .unwrap();
    m.copy_in(info.iova + 0x100, &[1, 2, 3, 4]).unwrap();
    drop(m);
    assert_eq!(read(&r, 0x200, 4), [1, 2, 3, 4]);
    assert_eq!(
        t.lookup(k, PD, QPN, info.iova, 4, Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::KeyMismatch
    );
}

#[test]
fn a3_reg_mr_on_valid_fails_not_free() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = valid_fmr(&t, &r, 4, 0, ALL_RW);
    assert_eq!(
        t.exec_reg_mr(PD, k.inc(), ALL_RW, None, None).unwrap_err(),
        MemError::NotFree
    );
    assert_eq!(t.query(k).unwrap().key, k, "failed REG_MR changes nothing");
}

#[test]
fn a4_reg_mr_key_index_mismatch() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = fmr(&t, &r, 4, 0);
    let other = Key::new(k.index() + 1, k.key_byte());
    assert_eq!(
        t.exec_reg_mr_for(PD, k, other, ALL_RW, None, None)
            .unwrap_err(),
        MemError::KeyMismatch
    );
    assert_eq!(
        t.exec_reg_mr(PD, Key::new(60, 1), ALL_RW, None, None)
            .unwrap_err(),
        MemError::NoSuchKey
    );
    t.exec_reg_mr_for(PD, k, k.inc(), ALL_RW, None, None)
        .unwrap();
}

#[test]
fn a5_reg_mr_other_pd() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = fmr(&t, &r, 4, 0);
    assert_eq!(
        t.exec_reg_mr(OTHER_PD, k, ALL_RW, None, None).unwrap_err(),
        MemError::PdMismatch
    );
}

#[test]
fn a6_local_inv_lkey_equals_rkey_then_read_fails() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = valid_fmr(&t, &r, 4, 0, ALL_RW);
    let io = iova(&t, k);
    t.exec_local_inv(PD, k).unwrap();
    assert_eq!(t.query(k).unwrap().state, MrState::Free);
    assert_eq!(
        t.lookup(k, PD, QPN, io, 8, Access::REMOTE_READ)
            .unwrap_err(),
        MemError::NotValid
    );
    // Invalidating a FREE MR again succeeds (rxe behaviour).
    t.exec_local_inv(PD, k).unwrap();
}

#[test]
fn a7_local_inv_wrong_key_byte() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = valid_fmr(&t, &r, 4, 0, ALL_RW);
    assert_eq!(
        t.exec_local_inv(PD, k.inc()).unwrap_err(),
        MemError::KeyMismatch
    );
    assert_eq!(
        t.exec_local_inv(OTHER_PD, k).unwrap_err(),
        MemError::PdMismatch
    );
    assert_eq!(t.query(k).unwrap().state, MrState::Valid);
}

#[test]
fn a8_local_inv_with_bound_type2_mw() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = valid_fmr(&t, &r, 4, 0, ALL_RW | Access::MW_BIND);
    let mw = t.alloc_mw(PD, MwType::Type2).unwrap();
    let io = iova(&t, k);
    t.exec_bind_mw(PD, QPN, mw, mw.inc(), k, io, 64, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(t.exec_local_inv(PD, k).unwrap_err(), MemError::MwBound);
    assert_eq!(
        t.remote_invalidate(PD, QPN, k).unwrap_err(),
        MemError::MwBound
    );
    assert_eq!(t.dereg_mr(k).unwrap_err(), MemError::MwBound);
    t.exec_local_inv(PD, mw.inc()).unwrap();
    t.exec_local_inv(PD, k).unwrap();
    t.dereg_mr(k).unwrap();
}

#[test]
fn a9_local_inv_of_user_mr_rejected() {
    let t = table();
    let k = t.reg_mr(PD, Region::zeroed(100), 0x1000, ALL_RW).unwrap();
    assert_eq!(t.exec_local_inv(PD, k).unwrap_err(), MemError::WrongMrType);
    assert_eq!(
        t.remote_invalidate(PD, QPN, k).unwrap_err(),
        MemError::WrongMrType
    );
    assert_eq!(
        t.exec_reg_mr(PD, k, ALL_RW, None, None).unwrap_err(),
        MemError::WrongMrType
    );
    let info = t.query(k).unwrap();
    assert_eq!(
        (info.kind, info.state, info.iova, info.length),
        (MrKind::User, MrState::Valid, 0x1000, 100)
    );
}

#[test]
fn a10_reregister_without_remap_same_pages() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k1 = valid_fmr(&t, &r, 4, 0, ALL_RW);
    let io = iova(&t, k1);
    t.exec_local_inv(PD, k1).unwrap();
    let k2 = k1.inc();
    t.exec_reg_mr(PD, k2, ALL_RW, None, None).unwrap();
    let m = t
        .lookup(k2, PD, QPN, io + 2 * PG as u64 + 7, 3, Access::REMOTE_WRITE)
        .unwrap();
    m.copy_in(io + 2 * PG as u64 + 7, b"abc").unwrap();
    drop(m);
    assert_eq!(read(&r, 2 * PG + 7, 3), b"abc");
    assert_eq!(
        t.lookup(k1, PD, QPN, io, 1, Access::EMPTY).unwrap_err(),
        MemError::KeyMismatch
    );
}

#[test]
fn a10_reregister_before_any_map_is_not_mapped() {
    let t = table();
    let k = t.alloc_mr(PD, 4).unwrap();
    assert_eq!(
        t.exec_reg_mr(PD, k, ALL_RW, None, None).unwrap_err(),
        MemError::NotMapped
    );
}

#[test]
fn a11_remap_while_valid_only_stages() {
    let t = table();
    let old = aligned(2 * PG, PG);
    let new = aligned(2 * PG, PG);
    new.fill(0, 2 * PG, 0xee).unwrap();
    let k1 = valid_fmr(&t, &old, 2, 0, ALL_RW);
    let old_iova = iova(&t, k1);
    let sg = [SgEntry {
        region: &new,
        offset: 0,
        len: 2 * PG,
    }];
    assert_eq!(t.map_mr_sg(k1, &sg, 0, PG as u64).unwrap(), 1);
    assert!(t.query(k1).unwrap().staged);
    // k1 still writes the old pages.
    t.lookup(k1, PD, QPN, old_iova + 10, 1, Access::REMOTE_WRITE)
        .unwrap()
        .copy_in(old_iova + 10, &[0x55])
        .unwrap();
    assert_eq!(read(&old, 10, 1), [0x55]);
    assert_eq!(read(&new, 10, 1), [0xee]);
    t.exec_local_inv(PD, k1).unwrap();
    let k2 = k1.inc();
    t.exec_reg_mr(PD, k2, ALL_RW, None, None).unwrap();
    let io2 = iova(&t, k2);
    assert_eq!(io2, new.addr());
    t.lookup(k2, PD, QPN, io2 + 10, 1, Access::REMOTE_WRITE)
        .unwrap()
        .copy_in(io2 + 10, &[0x66])
        .unwrap();
    assert_eq!(read(&new, 10, 1), [0x66]);
    assert_eq!(read(&old, 10, 1), [0x55]);
}

#[test]
fn a12_xprtrdma_iova_rewrite() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = fmr(&t, &r, 4, 0x100);
    let mapped = t.query(k).unwrap().next_iova;
    let xid_iova = (0xdead_beefu64 << 32) | (mapped & 0xffff_ffff);
    // Changing the offset inside the first page would move the window: refused.
    assert_eq!(
        t.set_fast_reg_iova(k, xid_iova + 8).unwrap_err(),
        MemError::BadAlignment
    );
    t.set_fast_reg_iova(k, xid_iova).unwrap();
    let k1 = k.inc();
    t.exec_reg_mr(PD, k1, ALL_RW, None, None).unwrap();
    let info = t.query(k1).unwrap();
    assert_eq!(info.iova, xid_iova);
    let va = xid_iova + 5000;
    t.lookup(k1, PD, QPN, va, 100, Access::REMOTE_WRITE)
        .unwrap()
        .copy_in(va, &[9; 100])
        .unwrap();
    // page 1, offset 5000 - 4096 + 0x100
    assert_eq!(read(&r, PG + 5000 - 4096 + 0x100, 100), vec![9; 100]);
    // range end = iova + length
    let end = info.iova + info.length;
    assert!(t
        .lookup(k1, PD, QPN, end - 1, 1, Access::REMOTE_READ)
        .is_ok());
    assert_eq!(
        t.lookup(k1, PD, QPN, end - 1, 2, Access::REMOTE_READ)
            .unwrap_err(),
        MemError::OutOfRange
    );
}

#[test]
fn a12_iova_override_in_reg_mr_wr() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = fmr(&t, &r, 4, 0);
    let io = 0x7777_0000_0000_0000u64 | (r.addr() & 0xfff);
    assert_eq!(
        t.exec_reg_mr(PD, k, ALL_RW, Some(io), Some(5 * PG as u64))
            .unwrap_err(),
        MemError::OutOfRange
    );
    t.exec_reg_mr(PD, k, ALL_RW, Some(io), Some(PG as u64))
        .unwrap();
    assert_eq!((iova(&t, k), t.query(k).unwrap().length), (io, PG as u64));
    assert_eq!(
        t.lookup(k, PD, QPN, io, PG as u64 + 1, Access::REMOTE_READ)
            .unwrap_err(),
        MemError::OutOfRange
    );
}

#[test]
fn a13_range_end_and_wrap() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = valid_fmr(&t, &r, 4, 0, ALL_RW);
    let info = t.query(k).unwrap();
    let end = info.iova + info.length;
    assert_eq!(
        t.lookup(k, PD, QPN, end - 10, 11, Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::OutOfRange
    );
    assert_eq!(
        t.lookup(k, PD, QPN, info.iova - 1, 4, Access::REMOTE_READ)
            .unwrap_err(),
        MemError::OutOfRange
    );
    assert_eq!(
        t.lookup(k, PD, QPN, u64::MAX - 3, 8, Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::Overflow
    );
    // A user MR at the very top of the address space: end computed without wrapping.
    let top = t
        .reg_mr(PD, Region::zeroed(16), u64::MAX - 16, ALL_RW)
        .unwrap();
    assert!(t
        .lookup(top, PD, QPN, u64::MAX - 16, 16, Access::REMOTE_WRITE)
        .is_ok());
    assert_eq!(
        t.lookup(top, PD, QPN, u64::MAX - 8, 9, Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::Overflow
    );
    assert_eq!(
        t.reg_mr(PD, Region::zeroed(16), u64::MAX - 8, ALL_RW)
            .unwrap_err(),
        MemError::Overflow
    );
    // The wrap case wrote nothing.
    assert_eq!(
        read(&r, 0, 4 * PG),
        aligned(4 * PG, PG)
            .slice(0, 4 * PG)
            .map(|x| read(&x, 0, 4 * PG))
            .unwrap()
    );
    // The MrRef window is enforced too.
    let m = t
        .lookup(k, PD, QPN, info.iova + 8, 8, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(
        m.copy_out(info.iova, &mut [0; 8]).unwrap_err(),
        MemError::OutOfRange
    );
    assert_eq!(
        m.copy_out(info.iova + 8, &mut [0; 9]).unwrap_err(),
        MemError::OutOfRange
    );
}

#[test]
fn a14_remote_read_only_rejects_write() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = valid_fmr(&t, &r, 4, 0, Access::REMOTE_READ);
    let io = iova(&t, k);
    assert!(t.lookup(k, PD, QPN, io, 8, Access::REMOTE_READ).is_ok());
    assert_eq!(
        t.lookup(k, PD, QPN, io, 8, Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::AccessDenied
    );
    assert_eq!(
        t.lookup(k, PD, QPN, io, 8, Access::REMOTE_ATOMIC)
            .unwrap_err(),
        MemError::AccessDenied
    );
    assert_eq!(
        t.lookup(k, PD, QPN, io, 8, Access::LOCAL_WRITE)
            .unwrap_err(),
        MemError::AccessDenied
    );
    assert_eq!(
        t.lookup(k, OTHER_PD, QPN, io, 8, Access::REMOTE_READ)
            .unwrap_err(),
        MemError::PdMismatch
    );
}

#[test]
fn a15_remote_write_without_local_write_rejected() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = fmr(&t, &r, 4, 0);
    assert_eq!(
        t.exec_reg_mr(PD, k, Access::REMOTE_WRITE, None, None)
            .unwrap_err(),
        MemError::BadAccessCombo
    );
    assert_eq!(
        t.exec_reg_mr(PD, k, Access::REMOTE_ATOMIC, None, None)
            .unwrap_err(),
        MemError::BadAccessCombo
    );
    assert_eq!(t.query(k).unwrap().state, MrState::Free);
    assert_eq!(
        t.reg_mr(PD, Region::zeroed(8), 0, Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::BadAccessCombo
    );
    t.exec_reg_mr(
        PD,
        k,
        Access::REMOTE_WRITE | Access::LOCAL_WRITE,
        None,
        None,
    )
    .unwrap();
}

#[test]
fn a16_zero_length_needs_no_key() {
    let t = table();
    let m = t.lookup(Key(0), 0, 0, 0, 0, Access::REMOTE_WRITE).unwrap();
    m.copy_in(0, &[]).unwrap();
    m.copy_out(12345, &mut []).unwrap();
    assert_eq!(m.copy_in(0, &[1]).unwrap_err(), MemError::OutOfRange);
    assert_eq!(
        t.lookup(Key(0), 0, 0, 0, 1, Access::EMPTY).unwrap_err(),
        MemError::NoSuchKey
    );
}

// ---- B. Remote invalidation ---------------------------------------------------------------

#[test]
fn b1_remote_invalidate() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = valid_fmr(&t, &r, 4, 0, ALL_RW);
    let io = iova(&t, k);
    assert_eq!(
        t.remote_invalidate(PD, QPN, k.inc()).unwrap_err(),
        MemError::KeyMismatch
    ); // B2
    assert_eq!(
        t.remote_invalidate(OTHER_PD, QPN, k).unwrap_err(),
        MemError::PdMismatch
    );
    t.remote_invalidate(PD, QPN, k).unwrap();
    assert_eq!(t.query(k).unwrap().state, MrState::Free);
    assert_eq!(
        t.lookup(k, PD, QPN, io, 8, Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::NotValid
    );
    assert_eq!(
        t.remote_invalidate(PD, QPN, k).unwrap_err(),
        MemError::NotValid
    );
    // Re-register works after a remote invalidate (same pages).
    t.exec_reg_mr(PD, k.inc(), ALL_RW, None, None).unwrap();
}

// ---- Memory windows (§2.8, C10-72..75) ----------------------------------------------------

fn mw_setup(t: &MemTable, r: &Region) -> (Key, u64) {
    let k = valid_fmr(t, r, 4, 0, ALL_RW | Access::MW_BIND);
    (k, iova(t, k))
}

#[test]
fn mw_type2_bind_use_only_from_its_qp() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let (mr, io) = mw_setup(&t, &r);
    let mw = t.alloc_mw(PD, MwType::Type2).unwrap();
    assert_eq!(t.query(mw).unwrap().state, MrState::Free);
    let rk = mw.with_key_byte(0x42);
    t.exec_bind_mw(
        PD,
        QPN,
        mw,
        rk,
        mr,
        io + PG as u64,
        256,
        Access::REMOTE_WRITE,
    )
    .unwrap();
    assert_eq!(t.query(mr).unwrap().mw_bound, 1);
    let m = t
        .lookup(rk, PD, QPN, io + PG as u64 + 16, 4, Access::REMOTE_WRITE)
        .unwrap();
    m.copy_in(io + PG as u64 + 16, b"mwmw").unwrap();
    drop(m);
    assert_eq!(read(&r, PG + 16, 4), b"mwmw");
    assert_eq!(
        t.lookup(rk, PD, QPN + 1, io + PG as u64, 4, Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::QpMismatch
    );
    assert_eq!(
        t.lookup(rk, PD, QPN, io + PG as u64, 4, Access::REMOTE_READ)
            .unwrap_err(),
        MemError::AccessDenied
    );
    assert_eq!(
        t.lookup(rk, PD, QPN, io + PG as u64 + 250, 8, Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::OutOfRange
    );
    assert_eq!(
        t.lookup(mw, PD, QPN, io + PG as u64, 4, Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::KeyMismatch
    );
    // Bound type 2 cannot be bound again.
    assert_eq!(
        t.exec_bind_mw(PD, QPN, rk, rk.inc(), mr, io, 8, Access::REMOTE_READ)
            .unwrap_err(),
        MemError::NotFree
    );
    // Remote invalidate from another QP fails; from its QP succeeds.
    assert_eq!(
        t.remote_invalidate(PD, QPN + 1, rk).unwrap_err(),
        MemError::QpMismatch
    );
    t.remote_invalidate(PD, QPN, rk).unwrap();
    assert_eq!(t.query(mr).unwrap().mw_bound, 0);
    assert_eq!(
        t.lookup(rk, PD, QPN, io + PG as u64, 4, Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::NotValid
    );
}

#[test]
fn mw_bind_checks_c10_72_to_75() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let (mr, io) = mw_setup(&t, &r);
    let mw = t.alloc_mw(PD, MwType::Type2).unwrap();
    let b =
        |qp_pd, mr, addr, len, acc| t.exec_bind_mw(qp_pd, QPN, mw, mw.inc(), mr, addr, len, acc);
    assert_eq!(
        b(OTHER_PD, mr, io, 8, Access::REMOTE_READ).unwrap_err(),
        MemError::PdMismatch
    ); // C10-72
    assert_eq!(
        b(PD, mr, io, 0, Access::REMOTE_READ).unwrap_err(),
        MemError::ZeroLength
    );
    assert_eq!(
        b(PD, mr, io - 1, 8, Access::REMOTE_READ).unwrap_err(),
        MemError::OutOfRange
    ); // C10-75
    assert_eq!(
        b(PD, mr, io + 4 * PG as u64 - 4, 8, Access::REMOTE_READ).unwrap_err(),
        MemError::OutOfRange
    );
    assert_eq!(
        b(PD, mr, u64::MAX - 2, 8, Access::REMOTE_READ).unwrap_err(),
        MemError::Overflow
    );
    assert_eq!(
        b(PD, mr.inc(), io, 8, Access::REMOTE_READ).unwrap_err(),
        MemError::KeyMismatch
    );
    // C10-73: MR without MW_BIND.
    let r2 = aligned(PG, PG);
    let nobind = t.reg_mr(PD, r2.clone(), 0, ALL_RW).unwrap();
    assert_eq!(
        b(PD, nobind, 0, 8, Access::REMOTE_READ).unwrap_err(),
        MemError::AccessDenied
    );
    // C10-74: writable window on an MR without Local Write.
    let ro = t
        .reg_mr(PD, r2.clone(), 0, Access::REMOTE_READ | Access::MW_BIND)
        .unwrap();
    assert_eq!(
        b(PD, ro, 0, 8, Access::REMOTE_WRITE).unwrap_err(),
        MemError::BadAccessCombo
    );
    assert_eq!(
        b(PD, ro, 0, 8, Access::REMOTE_ATOMIC).unwrap_err(),
        MemError::BadAccessCombo
    );
    b(PD, ro, 0, 8, Access::REMOTE_READ).unwrap();
    // MR from another PD.
    let other = t.reg_mr(OTHER_PD, r2, 0, ALL_RW | Access::MW_BIND).unwrap();
    let mw2 = t.alloc_mw(PD, MwType::Type2).unwrap();
    assert_eq!(
        t.exec_bind_mw(PD, QPN, mw2, mw2, other, 0, 8, Access::REMOTE_READ)
            .unwrap_err(),
        MemError::PdMismatch
    );
    // new key must carry the MW's index
    assert_eq!(
        t.exec_bind_mw(PD, QPN, mw2, mr, mr, io, 8, Access::REMOTE_READ)
            .unwrap_err(),
        MemError::KeyMismatch
    );
    // MR not VALID
    t.exec_local_inv(PD, mr).unwrap();
    assert_eq!(
        t.exec_bind_mw(PD, QPN, mw2, mw2, mr, io, 8, Access::REMOTE_READ)
            .unwrap_err(),
        MemError::NotValid
    );
}

#[test]
fn mw_type1_rebind_unbind_not_invalidatable() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let (mr, io) = mw_setup(&t, &r);
    let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
    assert_eq!(t.query(mw).unwrap().state, MrState::Valid);
    assert_eq!(
        t.lookup(mw, PD, QPN, io, 1, Access::EMPTY).unwrap_err(),
        MemError::NotValid,
        "unbound"
    );
    let k1 = mw.inc();
    t.exec_bind_mw(PD, 0, mw, k1, mr, io, 64, Access::REMOTE_READ)
        .unwrap();
    // Type 1 is usable from any QP.
    assert!(t.lookup(k1, PD, 999, io, 8, Access::REMOTE_READ).is_ok());
    assert_eq!(t.exec_local_inv(PD, k1).unwrap_err(), MemError::WrongMrType);
    assert_eq!(
        t.exec_bind_mw(
            PD,
            0,
            k1,
            k1.inc(),
            mr,
            io,
            8,
            Access::REMOTE_READ | Access::ZERO_BASED
        )
        .unwrap_err(),
        MemError::BadAccessCombo
    );
    // Rebind moves the window and keeps the bound count at one.
    let k2 = k1.inc();
    t.exec_bind_mw(PD, 0, k1, k2, mr, io + 128, 64, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(t.query(mr).unwrap().mw_bound, 1);
    assert_eq!(
        t.lookup(k1, PD, 0, io, 8, Access::REMOTE_READ).unwrap_err(),
        MemError::KeyMismatch
    );
    assert!(t
        .lookup(k2, PD, 0, io + 128, 8, Access::REMOTE_READ)
        .is_ok());
    // len 0 unbinds.
    let k3 = k2.inc();
    t.exec_bind_mw(PD, 0, k2, k3, mr, io, 0, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(t.query(mr).unwrap().mw_bound, 0);
    assert_eq!(
        t.lookup(k3, PD, 0, io + 128, 8, Access::REMOTE_READ)
            .unwrap_err(),
        MemError::NotValid
    );
    // dealloc while bound releases the MR.
    t.exec_bind_mw(PD, 0, k3, k3.inc(), mr, io, 8, Access::REMOTE_READ)
        .unwrap();
    t.dealloc_mw(k3).unwrap();
    assert_eq!(t.query(mr).unwrap().mw_bound, 0);
    assert!(t.query(mw).is_none());
    t.dereg_mr(mr).unwrap();
}

#[test]
fn mw_type2_zero_based() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let (mr, io) = mw_setup(&t, &r);
    let mw = t.alloc_mw(PD, MwType::Type2).unwrap();
    t.exec_bind_mw(
        PD,
        QPN,
        mw,
        mw,
        mr,
        io + 100,
        50,
        Access::REMOTE_WRITE | Access::ZERO_BASED,
    )
    .unwrap();
    t.lookup(mw, PD, QPN, 10, 4, Access::REMOTE_WRITE)
        .unwrap()
        .copy_in(10, b"zero")
        .unwrap();
    assert_eq!(read(&r, 110, 4), b"zero");
    assert_eq!(
        t.lookup(mw, PD, QPN, 48, 4, Access::REMOTE_WRITE)
            .unwrap_err(),
        MemError::OutOfRange
    );
}

// ---- map_mr_sg rules (§2.3) ---------------------------------------------------------------

#[test]
fn map_mr_sg_gap_stops_and_short_last_element() {
    let t = table();
    let r = aligned(8 * PG, PG);
    let k = t.alloc_mr(PD, 16).unwrap();
    // page-aligned, contiguous-unaligned continuation, short last, then a gap.
    let sg = [
        SgEntry {
            region: &r,
            offset: 0,
            len: PG,
        },
        SgEntry {
            region: &r,
            offset: 2 * PG,
            len: 100,
        },
        SgEntry {
            region: &r,
            offset: 2 * PG + 100,
            len: 50,
        },
        SgEntry {
            region: &r,
            offset: 5 * PG,
            len: 10,
        }, // gap: previous ended mid-page
    ];
    assert_eq!(t.map_mr_sg(k, &sg, 0, PG as u64).unwrap(), 3);
    let info = t.query(k).unwrap();
    assert_eq!(
        (info.next_iova, info.next_length),
        (r.addr(), PG as u64 + 150)
    );
    t.exec_reg_mr(PD, k, ALL_RW, None, None).unwrap();
    let mut buf = [0u8; 150];
    t.lookup(k, PD, QPN, r.addr() + PG as u64, 150, Access::EMPTY)
        .unwrap()
        .copy_out(r.addr() + PG as u64, &mut buf)
        .unwrap();
    assert_eq!(buf.to_vec(), read(&r, 2 * PG, 150));
    // A middle element that starts unaligned (not contiguous) stops the mapping.
    t.exec_local_inv(PD, k).unwrap();
    let sg = [
        SgEntry {
            region: &r,
            offset: 0,
            len: PG,
        },
        SgEntry {
            region: &r,
            offset: 3 * PG + 8,
            len: 8,
        },
    ];
    assert_eq!(t.map_mr_sg(k, &sg, 0, PG as u64).unwrap(), 1);
}

#[test]
fn map_mr_sg_capacity_and_bad_args() {
    let t = table();
    let r = aligned(8 * PG, PG);
    let k = t.alloc_mr(PD, 2).unwrap();
    let sg: Vec<SgEntry> = (0..4)
        .map(|i| SgEntry {
            region: &r,
            offset: i * PG,
            len: PG,
        })
        .collect();
    assert_eq!(t.map_mr_sg(k, &sg, 0, PG as u64).unwrap(), 2);
    assert_eq!(
        t.map_mr_sg(
            k,
            &[SgEntry {
                region: &r,
                offset: 0,
                len: 3 * PG
            }],
            0,
            PG as u64
        )
        .unwrap_err(),
        MemError::TooManyPages
    );
    assert_eq!(
        t.map_mr_sg(k, &sg, 0, 3000).unwrap_err(),
        MemError::BadPageSize
    );
    assert_eq!(
        t.map_mr_sg(k, &sg, 0, 2048).unwrap_err(),
        MemError::BadPageSize
    );
    assert_eq!(
        t.map_mr_sg(
            k,
            &[SgEntry {
                region: &r,
                offset: 8 * PG - 4,
                len: 8
            }],
            0,
            PG as u64
        )
        .unwrap_err(),
        MemError::OutOfRange
    );
    assert_eq!(t.alloc_mr(PD, 513).unwrap_err(), MemError::TooManyPages);
    assert_eq!(t.alloc_mr(PD, 0).unwrap_err(), MemError::ZeroLength);
    let u = t.reg_mr(PD, r.clone(), 0, ALL_RW).unwrap();
    assert_eq!(
        t.map_mr_sg(u, &sg, 0, PG as u64).unwrap_err(),
        MemError::WrongMrType
    );
}

#[test]
fn page_size_2m_and_64k() {
    for ps in [64 * 1024usize, 2 << 20] {
        let t = table();
        let r = aligned(3 * ps, ps);
        let k = t.alloc_mr(PD, 4).unwrap();
        // page 2 then page 0 (non-adjacent pages, each page-aligned), first offset 0x1234.
        let sg = [
            SgEntry {
                region: &r,
                offset: 2 * ps,
                len: ps,
            },
            SgEntry {
                region: &r,
                offset: 0,
                len: ps / 2,
            },
        ];
        assert_eq!(t.map_mr_sg(k, &sg, 0x1234, ps as u64).unwrap(), 2);
        let io = 0xabcd_0000_0000_0000u64 | (0x1234 + (r.addr() & (ps as u64 - 1)));
        t.set_fast_reg_iova(k, io).unwrap();
        t.exec_reg_mr(PD, k, ALL_RW, None, None).unwrap();
        let info = t.query(k).unwrap();
        assert_eq!(
            (info.page_size, info.length),
            (ps as u64, (ps + ps / 2 - 0x1234) as u64)
        );
        // Last byte of the first element, then the first bytes of the second (page 0).
        let va = io + (ps - 0x1234 - 2) as u64;
        let mut buf = [0u8; 6];
        t.lookup(k, PD, QPN, va, 6, Access::EMPTY)
            .unwrap()
            .copy_out(va, &mut buf)
            .unwrap();
        let mut want = read(&r, 3 * ps - 2, 2);
        want.extend(read(&r, 0, 4));
        assert_eq!(buf.to_vec(), want);
    }
}

// ---- keys, slots, dereg -------------------------------------------------------------------

#[test]
fn dereg_frees_slot_and_new_key_differs() {
    let t = table();
    let k = t.reg_mr(PD, Region::zeroed(64), 0, ALL_RW).unwrap();
    t.dereg_mr(k).unwrap();
    assert!(t.query(k).is_none());
    assert_eq!(
        t.lookup(k, PD, QPN, 0, 1, Access::EMPTY).unwrap_err(),
        MemError::NoSuchKey
    );
    assert_eq!(t.dereg_mr(k).unwrap_err(), MemError::NoSuchKey);
    let k2 = t.reg_mr(PD, Region::zeroed(64), 0, ALL_RW).unwrap();
    assert_eq!(k2.index(), k.index());
    assert_ne!(k2, k);
    assert_eq!(
        t.lookup(k, PD, QPN, 0, 1, Access::EMPTY).unwrap_err(),
        MemError::KeyMismatch
    );
}

#[test]
fn mr_and_mw_index_spaces_disjoint_and_table_full() {
    let t = MemTable::new(MemLimits {
        max_mr: 2,
        max_mw: 1,
        page_slots: 8,
        ..MemLimits::default()
    });
    let a = t.alloc_mr(PD, 2).unwrap();
    let b = t.alloc_mr(PD, 2).unwrap();
    assert_eq!(t.alloc_mr(PD, 1).unwrap_err(), MemError::TableFull);
    t.dereg_mr(a).unwrap();
    assert_eq!(
        t.alloc_mr(PD, 3).unwrap_err(),
        MemError::TableFull,
        "page slots"
    );
    t.dereg_mr(b).unwrap();
    t.alloc_mr(PD, 4).unwrap();
    let w = t.alloc_mw(PD, MwType::Type2).unwrap();
    assert!(w.index() >= MW_INDEX_BASE && a.index() < MW_INDEX_BASE);
    assert_eq!(
        t.alloc_mw(PD, MwType::Type1).unwrap_err(),
        MemError::TableFull
    );
}

// ---- scatter / gather / atomics -----------------------------------------------------------

#[test]
fn gather_scatter_across_sges_and_keys() {
    let t = table();
    let r1 = aligned(PG, 8);
    let r2 = aligned(PG, 8);
    let k1 = t.reg_mr(PD, r1.clone(), 0x10000, ALL_RW).unwrap();
    let k2 = t.reg_mr(PD, r2.clone(), 0x90000, Access::EMPTY).unwrap();
    let sges = [
        Sge {
            addr: 0x10000 + 10,
            len: 20,
            lkey: k1,
        },
        Sge {
            addr: 0x90000,
            len: 30,
            lkey: k2,
        },
    ];
    assert_eq!(sge_total_len(&sges), 50);
    let mut out = [0u8; 25];
    gather(&t, PD, QPN, &sges, 5, &mut out).unwrap();
    let mut want = read(&r1, 15, 15);
    want.extend(read(&r2, 0, 10));
    assert_eq!(out.to_vec(), want);
    assert_eq!(
        gather(&t, PD, QPN, &sges, 40, &mut [0; 11]).unwrap_err(),
        MemError::OutOfRange
    );
    // scatter needs LOCAL_WRITE: first SGE fine, second key lacks it.
    assert_eq!(
        scatter(&t, PD, QPN, &sges, 0, &[1; 25]).unwrap_err(),
        MemError::AccessDenied
    );
    scatter(&t, PD, QPN, &sges, 2, &[7; 18]).unwrap();
    assert_eq!(read(&r1, 12, 18), vec![7; 18]);
    assert_eq!(
        gather(&t, OTHER_PD, QPN, &sges, 0, &mut [0; 1]).unwrap_err(),
        MemError::PdMismatch
    );
}

#[test]
fn atomics_fetch_add_cmp_swap_alignment() {
    let t = table();
    let r = aligned(PG, PG);
    r.write(8, &5u64.to_ne_bytes()).unwrap();
    let acc = ALL_RW | Access::REMOTE_ATOMIC;
    let k = t.reg_mr(PD, r.clone(), 0x4000, acc).unwrap();
    let m = t
        .lookup(k, PD, QPN, 0x4008, 8, Access::REMOTE_ATOMIC)
        .unwrap();
    assert_eq!(m.atomic_fetch_add(0x4008, 3).unwrap(), 5);
    assert_eq!(m.atomic_cmp_swap(0x4008, 7, 1).unwrap(), 8);
    assert_eq!(m.atomic_cmp_swap(0x4008, 8, 1).unwrap(), 8);
    let mut b = [0u8; 8];
    r.read(8, &mut b).unwrap();
    assert_eq!(u64::from_ne_bytes(b), 1);
    let m = t
        .lookup(k, PD, QPN, 0x4000, 32, Access::REMOTE_ATOMIC)
        .unwrap();
    assert_eq!(
        m.atomic_fetch_add(0x4004, 1).unwrap_err(),
        MemError::BadAlignment
    );
    // Translation misaligned even though the iova is aligned.
    let k2 = t.reg_mr(PD, r.slice(4, 64).unwrap(), 0x8000, acc).unwrap();
    let m = t
        .lookup(k2, PD, QPN, 0x8000, 8, Access::REMOTE_ATOMIC)
        .unwrap();
    assert_eq!(
        m.atomic_fetch_add(0x8000, 1).unwrap_err(),
        MemError::BadAlignment
    );
}

/// DESIGN invariant 3 on real threads: LOCAL_INV must not return while a copy holds the MR.
/// Deterministic: the test waits until the invalidator is observably draining (the slot is FREE
/// and still counts our reference), so the scenario is always the one under test; loom
/// (`tests/loom.rs`) covers every interleaving.
#[test]
fn invalidate_waits_for_inflight_ref() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let t = Arc::new(table());
    let r = aligned(4 * PG, PG);
    let k = valid_fmr(&t, &r, 4, 0, ALL_RW);
    let io = iova(&t, k);
    let m = t.lookup(k, PD, QPN, io, 8, Access::REMOTE_READ).unwrap();
    assert_eq!(t.slot_state(k), Some((MrState::Valid, 1)));
    let done = Arc::new(AtomicBool::new(false));
    let released = Arc::new(AtomicBool::new(false));
    let (t2, d2, r2) = (t.clone(), done.clone(), released.clone());
    let h = std::thread::spawn(move || {
        t2.exec_local_inv(PD, k).unwrap();
        let copy_released = r2.load(Ordering::SeqCst);
        d2.store(true, Ordering::SeqCst);
        copy_released
    });
    let t0 = Instant::now();
    while t.slot_state(k) != Some((MrState::Free, 1)) {
        assert!(t0.elapsed() < Duration::from_secs(60), "LOCAL_INV never started draining: {:?}", t.slot_state(k));
        std::thread::yield_now();
    }
    // The invalidator has blocked the key and is waiting for our reference.
    assert!(
        !done.load(Ordering::SeqCst),
        "LOCAL_INV returned while a copy was in flight"
    );
    assert!(t.lookup(k, PD, QPN, io, 8, Access::REMOTE_READ).is_err(), "new lookups fail");
    // The copy in flight still completes through its reference.
    m.copy_out(io, &mut [0; 8]).unwrap();
    released.store(true, Ordering::SeqCst);
    drop(m);
    assert!(h.join().unwrap(), "LOCAL_INV returned before the copy released the MR");
    assert!(done.load(Ordering::SeqCst));
    assert_eq!(t.slot_state(k), Some((MrState::Free, 0)));
}

/// Issue 13 item 6: after LOCAL_INV of a bound type-2 MW the window is FREE and belongs to no
/// QP any more: any QP of its PD may bind it again (rxe_do_invalidate_mw), and from then on it
/// is usable only from that new QP. The bind names the window as verbs does, through the
/// `ibv_mw`, whose `rkey` is still the allocation key: that name used to be compared with the
/// window's current key and the bind failed (MW_BIND_ERR).
#[test]
fn mw2_invalidated_can_be_rebound_from_another_qp() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let (mr, io) = mw_setup(&t, &r);
    let mw = t.alloc_mw(PD, MwType::Type2).unwrap();
    let k1 = mw.inc();
    t.exec_bind_mw(PD, QPN, mw, k1, mr, io, 256, Access::REMOTE_WRITE).unwrap();
    t.exec_local_inv(PD, k1).unwrap();
    assert_eq!(t.query(mw).unwrap().state, MrState::Free);
    assert_eq!(t.query(mw).unwrap().qpn, 0, "an invalidated window belongs to no QP");
    assert_eq!(t.query(mr).unwrap().mw_bound, 0);
    // Rebind from another QP of the same PD, with a new key, naming the MW by `ibv_mw.rkey`
    // (the allocation key `mw`).
    let other_qp = QPN + 1;
    let k2 = k1.inc();
    t.exec_bind_mw(PD, other_qp, mw, k2, mr, io + 64, 128, Access::REMOTE_WRITE).unwrap();
    assert_eq!(t.query(mw).unwrap().state, MrState::Valid);
    assert_eq!(t.query(mr).unwrap().mw_bound, 1);
    let m = t.lookup(k2, PD, other_qp, io + 64, 4, Access::REMOTE_WRITE).unwrap();
    m.copy_in(io + 64, b"qp2!").unwrap();
    drop(m);
    assert_eq!(read(&r, 64, 4), b"qp2!");
    // The new binding belongs to the new QP only; the old key is dead.
    assert_eq!(t.lookup(k2, PD, QPN, io + 64, 4, Access::REMOTE_WRITE).unwrap_err(), MemError::QpMismatch);
    assert_eq!(t.lookup(k1, PD, other_qp, io + 64, 4, Access::REMOTE_WRITE).unwrap_err(), MemError::KeyMismatch);
    // Remote invalidation follows the binding QP, and the window can go back to the first QP.
    assert_eq!(t.remote_invalidate(PD, QPN, k2).unwrap_err(), MemError::QpMismatch);
    t.remote_invalidate(PD, other_qp, k2).unwrap();
    let k3 = k2.inc();
    // Naming it by its last key works as well.
    t.exec_bind_mw(PD, QPN, k2, k3, mr, io, 8, Access::REMOTE_READ).unwrap();
    t.lookup(k3, PD, QPN, io, 8, Access::REMOTE_READ).unwrap();
    // Still refused: a bound type-2 window (whatever name), another PD.
    assert_eq!(t.exec_bind_mw(PD, other_qp, mw, k3.inc(), mr, io, 8, Access::REMOTE_READ).unwrap_err(), MemError::NotFree);
    t.exec_local_inv(PD, k3).unwrap();
    assert_eq!(t.exec_bind_mw(OTHER_PD, other_qp, mw, k3.inc(), mr, io, 8, Access::REMOTE_READ).unwrap_err(), MemError::PdMismatch);
}

/// Issue 13 item 8: `ibv_rereg_mr` that changes access, PD or translation keeps the MR's keys
/// (the rdma-core suite's peers cached the rkey before the rereg) and takes effect at once.
#[test]
fn rereg_keeps_keys_and_applies_access_pd_and_translation() {
    let t = table();
    let k = t.reg_mr(PD, Region::zeroed(4096), 0x1000, ALL_RW).unwrap();
    t.lookup(k, PD, QPN, 0x1000, 8, Access::REMOTE_WRITE).unwrap();
    // Access only: same key, remote write now refused.
    t.rereg_mr(k, PD, Region::zeroed(4096), 0x1000, Access(Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0)).unwrap();
    assert_eq!(t.lookup(k, PD, QPN, 0x1000, 8, Access::REMOTE_WRITE).unwrap_err(), MemError::AccessDenied);
    t.lookup(k, PD, QPN, 0x1000, 8, Access::REMOTE_READ).unwrap();
    // PD: same key, the old PD no longer reaches it.
    t.rereg_mr(k, OTHER_PD, Region::zeroed(4096), 0x1000, ALL_RW).unwrap();
    assert!(t.lookup(k, PD, QPN, 0x1000, 8, Access::REMOTE_WRITE).is_err());
    t.lookup(k, OTHER_PD, QPN, 0x1000, 8, Access::REMOTE_WRITE).unwrap();
    // Translation: same key over a new region and iova.
    t.rereg_mr(k, OTHER_PD, Region::zeroed(100), 0x9000, ALL_RW).unwrap();
    let info = t.query(k).unwrap();
    assert_eq!((info.state, info.iova, info.length), (MrState::Valid, 0x9000, 100));
    assert_eq!(t.lookup(k, OTHER_PD, QPN, 0x1000, 8, Access::REMOTE_READ).unwrap_err(), MemError::OutOfRange);
    // Not a user MR (or a stale key): refused, nothing changed.
    assert_eq!(t.rereg_mr(k.inc(), PD, Region::zeroed(10), 0, ALL_RW).unwrap_err(), MemError::NoSuchKey);
}

/// DESIGN invariant 3 with an epoch reader (the lcores' lookups, QSBR): LOCAL_INV must not
/// return while a copy holds the MR, i.e. before the reader that looked the key up has passed
/// a quiescent point. Deterministic: the test waits until the invalidator is observably
/// waiting (the slot is FREE, no counted reference, and the grace-period counter has moved
/// past what the reader announced), so the scenario is always the one under test; loom
/// (`tests/loom.rs`) covers every interleaving.
#[test]
fn invalidate_waits_for_reader_quiescent_point() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let t = Arc::new(table());
    let r = aligned(4 * PG, PG);
    let k = valid_fmr(&t, &r, 4, 0, ALL_RW);
    let io = iova(&t, k);
    let mut reader = t.reader().unwrap();
    assert!(!reader.is_online());
    let m = reader.lookup(k, PD, QPN, io, 8, Access::REMOTE_READ).unwrap();
    assert!(reader.is_online());
    // No counted reference: the reader wrote nothing to the slot.
    assert_eq!(t.slot_state(k), Some((MrState::Valid, 0)));
    let announced = reader.announced();
    assert_eq!(announced, t.grace_period());
    let done = Arc::new(AtomicBool::new(false));
    let released = Arc::new(AtomicBool::new(false));
    let (t2, d2, r2) = (t.clone(), done.clone(), released.clone());
    let h = std::thread::spawn(move || {
        t2.exec_local_inv(PD, k).unwrap();
        let copy_released = r2.load(Ordering::SeqCst);
        d2.store(true, Ordering::SeqCst);
        copy_released
    });
    let t0 = Instant::now();
    while t.slot_state(k) != Some((MrState::Free, 0)) || t.grace_period() <= announced {
        assert!(t0.elapsed() < Duration::from_secs(60), "LOCAL_INV never started waiting: {:?}", t.slot_state(k));
        std::thread::yield_now();
    }
    // The invalidator has blocked the key and waits for our quiescent point.
    assert!(!done.load(Ordering::SeqCst), "LOCAL_INV returned while a reader's copy was in flight");
    assert_eq!(reader.lookup(k, PD, QPN, io, 8, Access::REMOTE_READ).unwrap_err(), MemError::NotValid, "new lookups fail");
    // The copy in flight still completes through its reference.
    m.copy_out(io, &mut [0; 8]).unwrap();
    released.store(true, Ordering::SeqCst);
    drop(m);
    // Dropping the reference is not enough: the reader has not announced anything yet.
    assert!(!done.load(Ordering::SeqCst));
    reader.quiescent();
    assert!(reader.announced() > announced);
    assert!(h.join().unwrap(), "LOCAL_INV returned before the copy released the MR");
    assert!(done.load(Ordering::SeqCst));
    assert_eq!(t.slot_state(k), Some((MrState::Free, 0)));
}

/// An offline reader never delays an invalidation, and a reader that invalidates does not
/// wait for its own quiescent point: the control operation takes it offline first (it holds
/// no reference then), and its next lookup brings it back online.
#[test]
fn reader_invalidates_without_waiting_for_itself_and_offline_readers_do_not_block() {
    use std::sync::Arc;
    use std::time::Duration;
    let t = Arc::new(table());
    let r = aligned(4 * PG, PG);
    let k = valid_fmr(&t, &r, 4, 0, ALL_RW);
    let io = iova(&t, k);
    // Two lcores: `a` invalidates, `b` went offline (parked) after a copy.
    let a = t.reader().unwrap();
    let mut b = t.reader().unwrap();
    b.lookup(k, PD, QPN, io, 8, Access::REMOTE_READ).unwrap().copy_out(io, &mut [0; 8]).unwrap();
    b.offline();
    a.lookup(k, PD, QPN, io, 8, Access::REMOTE_WRITE).unwrap().copy_in(io, b"abcdefgh").unwrap();
    assert!(a.is_online());
    // On this thread: would hang if it waited for `a` (online, never quiescent) or `b`.
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        a.exec_local_inv(PD, k).unwrap();
        tx.send(a.is_online()).unwrap();
        // Back online with the next lookup, which sees the new state.
        let e = a.lookup(k, PD, QPN, io, 8, Access::REMOTE_READ).unwrap_err();
        (a.is_online(), e)
    });
    let online_after_inv = rx.recv_timeout(Duration::from_secs(60)).expect("LOCAL_INV through a reader waited for a reader");
    assert!(!online_after_inv, "a control operation takes the reader offline");
    assert_eq!(h.join().unwrap(), (true, MemError::NotValid));
    assert_eq!(read(&r, 0, 8), b"abcdefgh");
    // Re-register; the parked reader `b` comes back online with its next lookup.
    let k2 = k.inc();
    t.exec_reg_mr(PD, k2, ALL_RW, None, None).unwrap();
    b.lookup(k2, PD, QPN, io, 8, Access::REMOTE_READ).unwrap();
    assert!(b.is_online());
    assert_eq!(b.lookup(k, PD, QPN, io, 8, Access::REMOTE_READ).unwrap_err(), MemError::KeyMismatch);
}

/// Readers are a table resource: `max_readers` of them, slots reused after drop.
#[test]
fn reader_slots_are_limited_and_reused() {
    use std::sync::Arc;
    let t = Arc::new(MemTable::new(MemLimits { max_readers: 2, ..MemLimits::default() }));
    let a = t.reader().unwrap();
    let b = t.reader().unwrap();
    assert_eq!(t.reader().unwrap_err(), MemError::TableFull);
    drop(a);
    let _c = t.reader().unwrap();
    drop(b);
}

/// A control operation through a reader that still holds a reference is a bug (the copy could
/// outlive the invalidation): it panics instead of invalidating.
#[test]
#[should_panic(expected = "memory control operation through a Reader that holds an MrRef")]
fn reader_control_operation_with_a_live_reference_panics() {
    use std::sync::Arc;
    let t = Arc::new(table());
    let r = aligned(4 * PG, PG);
    let k = valid_fmr(&t, &r, 4, 0, ALL_RW);
    let io = iova(&t, k);
    let reader = t.reader().unwrap();
    let _m = reader.lookup(k, PD, QPN, io, 8, Access::REMOTE_READ).unwrap();
    let _ = reader.exec_local_inv(PD, k);
}

// ---- Carried translations (an lcore's responder, across a message's packets) -------------

/// A translation carried by an epoch reader is resumed without a lookup across quiescent
/// points and parking while no invalidation has begun, and copies through the same window.
/// Outside its window, or once an invalidation of any key of the table has begun
/// (conservative), `resume` looks the key up again with the lookup's own PD, QP and rights.
#[test]
fn carried_translation_resumes_until_any_invalidation() {
    use std::sync::Arc;
    let t = Arc::new(table());
    let r = aligned(4 * PG, PG);
    r.write(100, b"carried!").unwrap();
    let k = valid_fmr(&t, &r, 4, 0, ALL_RW);
    let other = valid_fmr(&t, &aligned(PG, PG), 1, 0, ALL_RW);
    let io = iova(&t, k);
    let mut reader = t.reader().unwrap();
    let tr = reader.lookup_carried(k, PD, QPN, io, 2 * PG as u64, Access::REMOTE_WRITE).unwrap();
    assert_eq!(tr.key(), k);
    reader.quiescent();
    assert!(reader.is_current(&tr, io + 100, 8));
    let mut got = [0u8; 8];
    reader.resume(&tr, io + 100, 8).unwrap().copy_out(io + 100, &mut got).unwrap();
    assert_eq!(&got, b"carried!");
    // Outside the window validated: looked up again (the MR is larger, so that succeeds)...
    assert!(!reader.is_current(&tr, io + 2 * PG as u64 - 4, 8));
    assert!(reader.resume(&tr, io + 2 * PG as u64 - 4, 8).is_ok());
    // ...and past the MR it fails as a lookup does.
    assert_eq!(reader.resume(&tr, io + 4 * PG as u64 - 4, 8).unwrap_err(), MemError::OutOfRange);
    reader.offline();
    assert!(reader.resume(&tr, io, 8).is_ok());
    assert!(reader.is_current(&tr, io, 8), "parking alone does not end it");
    reader.offline();
    // Another MR's deregistration: a grace period begins, every carried translation ends.
    t.dereg_mr(other).unwrap();
    reader.resume(&tr, io, 8).unwrap();
    assert!(!reader.is_current(&tr, io, 8));
    // A fresh lookup carries again.
    let tr2 = reader.lookup_carried(k, PD, QPN, io, 8, Access::REMOTE_WRITE).unwrap();
    reader.quiescent();
    assert!(reader.is_current(&tr2, io, 8));
}

/// LOCAL_INV, a new mapping, then REG_MR with the same key leaves the slot word as it was at
/// the lookup; the carried translation must still end (the reader's grace period moved, not
/// the word): a resume writes through the new registration's mapping, not the old one.
#[test]
fn carried_translation_is_not_resumed_after_local_inv_and_reregistration() {
    use std::sync::Arc;
    let t = Arc::new(table());
    let (old, new) = (aligned(PG, PG), aligned(PG, PG));
    let k = fmr(&t, &old, 1, 0).inc();
    t.exec_reg_mr(PD, k, ALL_RW, None, None).unwrap();
    let io = iova(&t, k);
    let mut reader = t.reader().unwrap();
    let tr = reader.lookup_carried(k, PD, QPN, io, 8, Access::REMOTE_WRITE).unwrap();
    reader.quiescent();
    let word = t.slot_state(k);
    // Through the reader (an lcore executing the WRs): it goes offline for each.
    reader.exec_local_inv(PD, k).unwrap();
    assert_eq!(t.map_mr_sg(k, &[SgEntry { region: &new, offset: 0, len: PG }], 0, PG as u64).unwrap(), 1);
    reader.exec_reg_mr_for(PD, k, k, ALL_RW, Some(io), None).unwrap();
    assert_eq!(t.slot_state(k), word, "the slot word repeats");
    assert!(!reader.is_current(&tr, io, 8), "a translation of the old registration is current");
    let before = read(&old, 0, 8);
    reader.resume(&tr, io, 8).unwrap().copy_in(io, b"new map!").unwrap();
    assert_eq!(read(&new, 0, 8), b"new map!");
    assert_eq!(read(&old, 0, 8), before, "written through the old registration's mapping");
}

/// Counted lookups (the table, any thread) are never carried: a count held across packets
/// would hold invalidations up. Their translation looks the key up on every resume, with the
/// lookup's own rights.
#[test]
fn counted_lookups_are_not_carried() {
    let t = std::sync::Arc::new(table());
    let r = aligned(PG, PG);
    let k = valid_fmr(&t, &r, 1, 0, ALL_RW);
    let io = iova(&t, k);
    let tr = MemAccess::lookup_carried(&*t, k, PD, QPN, io, 8, Access::REMOTE_WRITE).unwrap();
    let reader = t.reader().unwrap();
    assert!(!reader.is_current(&tr, io, 8));
    assert!(MemAccess::resume(&*t, &tr, io, 8).is_ok());
    t.exec_local_inv(PD, k).unwrap();
    assert_eq!(MemAccess::resume(&*t, &tr, io, 8).unwrap_err(), MemError::NotValid);
}

// ---- Revocation by the service (issue 37: a client's memory faulted under an lcore) -------

#[test]
fn revoked_user_mr_refuses_every_access_until_dereg() {
    let t = table();
    let r = aligned(2 * PG, PG);
    let k = t.reg_mr(PD, r.clone(), 0x1000, ALL_RW).unwrap();
    assert!(t.lookup(k, PD, QPN, 0x1000, 8, Access::REMOTE_WRITE).is_ok());
    assert_eq!(t.revoke_mr(k), Ok(PD));
    assert!(t.is_revoked(k));
    assert_eq!(t.query(k).unwrap().state, MrState::Free);
    for need in [Access::EMPTY, Access::LOCAL_WRITE, Access::REMOTE_WRITE, Access::REMOTE_READ] {
        assert_eq!(t.lookup(k, PD, QPN, 0x1000, 8, need).unwrap_err(), MemError::NotValid, "{need:?}");
    }
    // Revoking twice is harmless; deregistration still works and frees the slot.
    assert_eq!(t.revoke_mr(k), Ok(PD));
    t.dereg_mr(k).unwrap();
    assert!(!t.is_revoked(k));
    assert_eq!(t.revoke_mr(k), Err(MemError::NoSuchKey));
    // A new MR in the same slot is not revoked.
    let k2 = t.reg_mr(PD, r, 0x1000, ALL_RW).unwrap();
    assert_eq!(k2.index(), k.index());
    assert!(t.lookup(k2, PD, QPN, 0x1000, 8, Access::REMOTE_WRITE).is_ok());
}

#[test]
fn revoked_fast_reg_mr_cannot_be_reregistered_and_its_windows_are_blocked() {
    let t = table();
    let r = aligned(4 * PG, PG);
    let k = valid_fmr(&t, &r, 4, 0, ALL_RW | Access::MW_BIND);
    let io = iova(&t, k);
    let mw = t.alloc_mw(PD, MwType::Type2).unwrap();
    t.exec_bind_mw(PD, QPN, mw, mw.inc(), k, io, 64, Access::REMOTE_READ).unwrap();
    assert!(t.lookup(mw.inc(), PD, QPN, io, 8, Access::REMOTE_READ).is_ok());
    assert_eq!(t.revoke_mr(k), Ok(PD));
    assert_eq!(t.lookup(k, PD, QPN, io, 8, Access::EMPTY).unwrap_err(), MemError::NotValid);
    assert_eq!(t.lookup(mw.inc(), PD, QPN, io, 8, Access::REMOTE_READ).unwrap_err(), MemError::NotValid);
    // The window was unbound, so the client's usual teardown works (LOCAL_INV of the window
    // and of the MR); REG_MR (a revalidation would make the MR valid again) is refused.
    assert_eq!(t.query(k).unwrap().mw_bound, 0);
    t.exec_local_inv(PD, mw.inc()).unwrap();
    t.exec_local_inv(PD, k).unwrap();
    assert_eq!(t.exec_reg_mr(PD, k.inc(), ALL_RW, None, None), Err(MemError::NotValid));
    assert_eq!(t.lookup(k.inc(), PD, QPN, io, 8, Access::EMPTY).unwrap_err(), MemError::KeyMismatch);
    // A new bind to it fails too.
    let mw2 = t.alloc_mw(PD, MwType::Type2).unwrap();
    assert!(t.exec_bind_mw(PD, QPN, mw2, mw2.inc(), k, io, 64, Access::REMOTE_READ).is_err());
    t.dealloc_mw(mw).unwrap();
    t.dereg_mr(k).unwrap();
}
