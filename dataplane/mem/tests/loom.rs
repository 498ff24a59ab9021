//! Loom models of the invalidate-vs-copy protocol (DESIGN invariant 3).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p pmrxe-mem --release --test loom`
//! (optionally `LOOM_MAX_PREEMPTIONS=3`). Without `--cfg loom` this file is empty.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

use pmrxe_mem::*;

const PD: PdHandle = 3;

fn small_table() -> (Arc<MemTable>, Key, u64, Region) {
    let t = MemTable::new(MemLimits {
        max_mr: 1,
        max_mw: 1,
        max_fast_reg_pages: 1,
        page_slots: 2,
        ..MemLimits::default()
    });
    // 64 bytes that never straddle a 4 KiB page (max_num_sg = 1).
    let big = Region::zeroed(128);
    let r = big.slice((64 - big.addr() as usize % 64) % 64, 64).unwrap();
    let k = t.alloc_mr(PD, 1).unwrap();
    t.map_mr_sg(
        k,
        &[SgEntry {
            region: &r,
            offset: 0,
            len: 64,
        }],
        0,
        4096,
    )
    .unwrap();
    t.exec_reg_mr(PD, k, Access::LOCAL_WRITE | Access::REMOTE_READ, None, None)
        .unwrap();
    let iova = t.query(k).unwrap().iova;
    (Arc::new(t), k, iova, r)
}

/// After `exec_local_inv` returns, no copy through the old state can still be running.
#[test]
fn loom_local_inv_waits_for_copy() {
    loom::model(|| {
        let (t, k, iova, _r) = small_table();
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (t, done) = (t.clone(), done.clone());
            thread::spawn(move || {
                if let Ok(m) = t.lookup(k, PD, 0, iova, 8, Access::REMOTE_READ) {
                    assert!(
                        !done.load(Ordering::SeqCst),
                        "copy started after invalidate returned"
                    );
                    m.copy_out(iova, &mut [0; 8]).unwrap();
                    assert!(
                        !done.load(Ordering::SeqCst),
                        "copy ran after invalidate returned"
                    );
                }
            })
        };
        t.exec_local_inv(PD, k).unwrap();
        done.store(true, Ordering::SeqCst);
        reader.join().unwrap();
    });
}

/// A lookup racing invalidate + re-register either sees the old key (and finishes before the
/// invalidate returns) or fails; it never gets the new translation under the old key.
#[test]
fn loom_reregister_new_key_old_key_never_valid_after_inv() {
    loom::model(|| {
        let (t, k, iova, _r) = small_table();
        let inv_done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (t, inv_done) = (t.clone(), inv_done.clone());
            thread::spawn(move || {
                if let Ok(_m) = t.lookup(k, PD, 0, iova, 8, Access::REMOTE_READ) {
                    assert!(!inv_done.load(Ordering::SeqCst));
                }
            })
        };
        t.exec_local_inv(PD, k).unwrap();
        inv_done.store(true, Ordering::SeqCst);
        t.exec_reg_mr(PD, k.inc(), Access::REMOTE_READ, None, None)
            .unwrap();
        reader.join().unwrap();
    });
}

/// dereg waits for in-flight copies too (the backing may be unmapped right after).
#[test]
fn loom_dereg_waits_for_copy() {
    loom::model(|| {
        let (t, k, iova, _r) = small_table();
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (t, done) = (t.clone(), done.clone());
            thread::spawn(move || {
                if let Ok(m) = t.lookup(k, PD, 0, iova, 8, Access::EMPTY) {
                    m.copy_out(iova, &mut [0; 8]).unwrap();
                    assert!(!done.load(Ordering::SeqCst));
                }
            })
        };
        t.dereg_mr(k).unwrap();
        done.store(true, Ordering::SeqCst);
        reader.join().unwrap();
    });
}
