//! Loom models of the invalidate-vs-copy protocols (DESIGN invariant 3): counted lookups
//! through the table, and epoch readers (QSBR, the lcores' lookups).
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
    let (t, k, iova, r) = table_with_mrs(1);
    (Arc::new(t), k[0], iova[0], r)
}

/// A table with `n` fast-reg MRs, each VALID over its own 64 bytes.
fn table_with_mrs(n: usize) -> (MemTable, Vec<Key>, Vec<u64>, Region) {
    let t = MemTable::new(MemLimits {
        max_mr: n as u32,
        max_mw: 1,
        max_fast_reg_pages: 1,
        page_slots: 2 * n as u32,
        max_readers: 2,
        ..MemLimits::default()
    });
    // 64 bytes per MR that never straddle a 4 KiB page (max_num_sg = 1).
    let big = Region::zeroed(64 * n + 64);
    let r = big.slice((64 - big.addr() as usize % 64) % 64, 64 * n).unwrap();
    let (mut keys, mut iovas) = (Vec::new(), Vec::new());
    for i in 0..n {
        let k = t.alloc_mr(PD, 1).unwrap();
        t.map_mr_sg(k, &[SgEntry { region: &r, offset: 64 * i, len: 64 }], 0, 4096).unwrap();
        t.exec_reg_mr(PD, k, Access::LOCAL_WRITE | Access::REMOTE_READ, None, None).unwrap();
        iovas.push(t.query(k).unwrap().iova);
        keys.push(k);
    }
    (t, keys, iovas, r)
}

/// One MR in a table shared the way the service shares it (`std::sync::Arc`: readers are
/// registered through `MemTable::reader`).
fn epoch_table() -> (std::sync::Arc<MemTable>, Key, u64, Region) {
    let (t, k, iova, r) = table_with_mrs(1);
    (std::sync::Arc::new(t), k[0], iova[0], r)
}

/// Copy through `m`, checking that the invalidation has not returned (`done`) before the copy
/// starts or while it runs.
fn copy_before_invalidate_returns(m: MrRef<'_>, iova: u64, done: &AtomicBool) {
    assert!(!done.load(Ordering::SeqCst), "copy started after invalidate returned");
    m.copy_out(iova, &mut [0; 8]).unwrap();
    assert!(!done.load(Ordering::SeqCst), "copy ran after invalidate returned");
}

/// Run `lcore` on a thread of its own while this thread executes a LOCAL_INV of `k`, then
/// raises the flag `lcore` is given (for `copy_before_invalidate_returns`).
fn race_local_inv(t: &MemTable, k: Key, lcore: impl FnOnce(Arc<AtomicBool>) + Send + 'static) {
    let done = Arc::new(AtomicBool::new(false));
    let h = {
        let done = done.clone();
        thread::spawn(move || lcore(done))
    };
    t.exec_local_inv(PD, k).unwrap();
    done.store(true, Ordering::SeqCst);
    h.join().unwrap();
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

/// Regression model for the VALID-transition bug (fixed by `set_word` in `exec_reg_mr`,
/// `reg_mr` and `bind`): a lookup that *fails* still takes a transient reference (fetch_add,
/// check, fetch_sub). If the re-register stored `pack(Valid, key)` with a plain store while
/// that reference was held, the count went to 0 under it and the failing lookup's release
/// left it at -1; the next successful lookup brought it back to 0 while a copy was live, so
/// the following invalidate drained early (or, with no such lookup, never drained at all).
///
/// Thread A (the model's main thread) looks the MR up with the stale key (always fails: FREE,
/// or the key moved on), then with the new key (succeeds only while the new registration is
/// VALID; before it, it fails the same transient way). Thread B re-registers under the new
/// key, invalidates it, and raises `inv_done`. Checked: whenever A holds an `MrRef`, B's
/// invalidate has not returned; whenever A holds no reference the count reads 0 (only A takes
/// references); B's invalidate returns (its drain ends); the count is 0 at the end.
///
/// Verified to fail with the old code: reverting `set_word(&slot.word, MrState::Valid,
/// wr_key)` in `exec_reg_mr` to `slot.word.store(pack(MrState::Valid, wr_key),
/// Ordering::Release)` fails this model within a fraction of a second (the other three
/// models still pass). Loom reports it as "Model exceeded maximum number of branches": in the
/// execution it finds, A has finished (both lookups failed, no reference held), yet B's
/// `set_word(Free)` carries a non-zero count (the drain read the word as `0x5_0000_0138`,
/// i.e. one reference, FREE) because the plain store did not compose with A's transient
/// increment/decrement, and B's drain spins on it forever (a `LOOM_LOG=trace` run shows ~300
/// re-reads of the word by B after A is done). With the fix the model passes.
#[test]
fn loom_failed_lookup_racing_reregister_keeps_the_count() {
    loom::model(|| {
        let (t, k, iova, _r) = small_table();
        // Start from FREE under the old key: the state a re-register leaves from.
        t.exec_local_inv(PD, k).unwrap();
        let k2 = k.inc();
        let inv_done = Arc::new(AtomicBool::new(false));
        // Thread B: re-register under the new key, then invalidate it.
        let registrar = {
            let (t, inv_done) = (t.clone(), inv_done.clone());
            thread::spawn(move || {
                t.exec_reg_mr(PD, k2, Access::REMOTE_READ, None, None)
                    .unwrap();
                t.exec_local_inv(PD, k2).unwrap();
                inv_done.store(true, Ordering::SeqCst);
            })
        };
        // Thread A. Stale key: never valid in this model, but takes a transient reference.
        assert!(t.lookup(k, PD, 0, iova, 8, Access::REMOTE_READ).is_err());
        assert_eq!(t.inflight(k), 0, "a VALID transition wiped a transient reference");
        if let Ok(m) = t.lookup(k2, PD, 0, iova, 8, Access::REMOTE_READ) {
            assert!(
                !inv_done.load(Ordering::SeqCst),
                "MrRef alive after exec_local_inv returned"
            );
            m.copy_out(iova, &mut [0; 8]).unwrap();
            assert!(
                !inv_done.load(Ordering::SeqCst),
                "copy ran after exec_local_inv returned"
            );
        }
        assert_eq!(t.inflight(k), 0, "a VALID transition wiped a transient reference");
        registrar.join().unwrap();
        assert_eq!(t.inflight(k2), 0, "reference count not back to 0");
    });
}

// ---- epoch readers (QSBR) ----------------------------------------------------------------------
//
// The table is shared through `std::sync::Arc` here: a `Reader` holds one (its reference count
// is not part of the protocol).

/// An lcore (registering, coming online with its first lookup, copying, announcing a quiescent
/// point, going offline on drop) against LOCAL_INV from the control thread: after
/// `exec_local_inv` returns, no copy through the old state is running, and a lookup that starts
/// after it fails. Covers registration and going online racing the invalidation's scan.
///
/// Verified to catch: coming online with a plain Release store instead of the `swap` in
/// `Epochs::online` ("copy ran after invalidate returned": the store-load race the RMW chain
/// excludes), and reading the scan bound with a plain load instead of `fetch_add(0)` in
/// `synchronize` (same failure: a reader registering during the scan is missed).
#[test]
fn loom_epoch_local_inv_waits_for_reader_quiescent_point() {
    loom::model(|| {
        let (t, k, iova, _r) = epoch_table();
        let t2 = t.clone();
        race_local_inv(&t, k, move |done| {
            let mut r = t2.reader().unwrap();
            if let Ok(m) = r.lookup(k, PD, 0, iova, 8, Access::REMOTE_READ) {
                copy_before_invalidate_returns(m, iova, &done);
            }
            r.quiescent();
        });
    });
}

/// An lcore that parks (goes offline) between two copies and comes back online with the second
/// lookup: offline it does not hold the invalidation up, and coming back online it either is
/// seen by the invalidation's scan (which then waits for it) or sees the new state.
#[test]
fn loom_epoch_reader_offline_then_online_races_invalidate() {
    loom::model(|| {
        let (t, k, iova, _r) = epoch_table();
        let mut r = t.reader().unwrap();
        // Online before the invalidation starts, then parked.
        r.lookup(k, PD, 0, iova, 8, Access::REMOTE_READ).unwrap().copy_out(iova, &mut [0; 8]).unwrap();
        r.offline();
        race_local_inv(&t, k, move |done| {
            if let Ok(m) = r.lookup(k, PD, 0, iova, 8, Access::REMOTE_READ) {
                copy_before_invalidate_returns(m, iova, &done);
            }
            r.quiescent();
            r.offline();
        });
    });
}

/// Two lcores, each copying through one MR and then executing a LOCAL_INV of the MR the other
/// copies through (the executor's LOCAL_INV runs on the lcore): neither waits for its own
/// quiescent point, they do not wait for each other forever (both go offline for the control
/// operation), and each invalidation still waits for the other lcore's copy.
///
/// Verified to catch: a control operation through the reader that does not take it offline
/// first (the two invalidations wait for each other: loom reports "Model exceeded maximum
/// number of branches" as both spin), and the two mutations listed above.
///
/// Three threads with two invalidations is a large model: it runs with a preemption bound
/// (every interleaving with at most `LOOM_MAX_PREEMPTIONS`, default 4, preemptions; about 3 s).
#[test]
fn loom_epoch_two_lcores_invalidate_each_others_mr() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(b.preemption_bound.unwrap_or(4));
    b.check(|| {
        let (t, k, iova, _r) = table_with_mrs(2);
        let t = std::sync::Arc::new(t);
        let done = [Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false))];
        let lcore = |mine: usize| {
            let theirs = 1 - mine;
            let (t, k, iova) = (t.clone(), k.clone(), iova.clone());
            let (my_done, their_done) = (done[mine].clone(), done[theirs].clone());
            thread::spawn(move || {
                let mut r = t.reader().unwrap();
                if let Ok(m) = r.lookup(k[mine], PD, 0, iova[mine], 8, Access::REMOTE_READ) {
                    assert!(!my_done.load(Ordering::SeqCst), "copy started after its MR's invalidate returned");
                    m.copy_out(iova[mine], &mut [0; 8]).unwrap();
                    assert!(!my_done.load(Ordering::SeqCst), "copy ran after its MR's invalidate returned");
                }
                r.quiescent();
                r.exec_local_inv(PD, k[theirs]).unwrap();
                their_done.store(true, Ordering::SeqCst);
            })
        };
        let a = lcore(0);
        let b = lcore(1);
        a.join().unwrap();
        b.join().unwrap();
    });
}

/// A translation carried past the reader's quiescent point (the responder carries one across
/// a WRITE's packets): once `exec_local_inv` returns, it is never resumed. (Registering the
/// key again at once would leave the slot word as it was at the lookup; the stamp does not
/// look at the word. That case is deterministic: `semantics.rs`,
/// `carried_translation_is_not_resumed_after_local_inv_and_reregistration`.)
///
/// Verified to catch: `resume` without its stamp compare (both carried-translation models
/// fail).
#[test]
fn loom_epoch_carried_translation_ends_with_invalidation() {
    loom::model(|| {
        let (t, k, iova, _r) = epoch_table();
        let t2 = t.clone();
        race_local_inv(&t, k, move |done| {
            let mut r = t2.reader().unwrap();
            let Ok(tr) = r.lookup_carried(k, PD, 0, iova, 8, Access::REMOTE_READ) else { return };
            r.quiescent();
            if let Ok(m) = r.resume(&tr, iova, 8) {
                copy_before_invalidate_returns(m, iova, &done);
            }
            r.quiescent();
        });
    });
}

/// The same with the reader parked (offline) between the lookup and the resume: the
/// invalidation's scan may skip it, so coming back online must announce a grace period that
/// covers the invalidation, or the stale translation would be resumed.
///
/// Verified to catch: `Epochs::online` without its second read of `gp` ("copy ran after
/// invalidate returned": the first read may be older than the scan that skipped the reader).
#[test]
fn loom_epoch_carried_translation_survives_parking_only_without_invalidation() {
    loom::model(|| {
        let (t, k, iova, _r) = epoch_table();
        let mut r = t.reader().unwrap();
        let tr = r.lookup_carried(k, PD, 0, iova, 8, Access::REMOTE_READ).unwrap();
        r.offline();
        race_local_inv(&t, k, move |done| {
            if let Ok(m) = r.resume(&tr, iova, 8) {
                copy_before_invalidate_returns(m, iova, &done);
            }
            r.quiescent();
            r.offline();
        });
    });
}
