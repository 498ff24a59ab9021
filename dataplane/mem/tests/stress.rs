//! Real-threads invalidate-vs-copy stress (DESIGN invariant 3).
//!
//! One thread copies through whatever key is currently registered (reads and writes); the other
//! invalidates, then *poisons* the memory, checks nothing overwrote the poison for a while,
//! restores it and re-registers under a new key. A copy through the old state after
//! `exec_local_inv` returned would either read poison (reader asserts) or overwrite poison
//! (invalidator asserts). Replacing the drain in `block_and_drain` with a no-op makes the
//! counted test fail within a few hundred iterations; replacing `Epochs::synchronize` with a
//! no-op makes the epoch-reader test fail the same way.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pmrxe_mem::*;

const PD: PdHandle = 1;
const LEN: usize = 4096;
const GOOD: u8 = 0x11;
const POISON: u8 = 0xdd;

#[test]
fn stress_invalidate_vs_copy_never_touches_poison() {
    stress(false);
}

/// The same with the copying thread as an lcore: lookups through an epoch [`Reader`], one
/// quiescent point per loop iteration, offline now and then (as an lcore parks).
#[test]
fn stress_invalidate_vs_epoch_reader_never_touches_poison() {
    stress(true);
}

fn stress(epoch: bool) {
    let table = Arc::new(MemTable::new(MemLimits {
        max_mr: 4,
        max_mw: 1,
        page_slots: 64,
        ..MemLimits::default()
    }));
    // Two pages so copies cross a page boundary of the page list.
    let big = Region::zeroed(2 * LEN + 4096);
    let off = (4096 - big.addr() as usize % 4096) % 4096;
    let mem = big.slice(off, 2 * LEN).unwrap();
    mem.fill(0, 2 * LEN, GOOD).unwrap();
    let k0 = table.alloc_mr(PD, 2).unwrap();
    let sg = [SgEntry {
        region: &mem,
        offset: 0,
        len: 2 * LEN,
    }];
    table.map_mr_sg(k0, &sg, 0, 4096).unwrap();
    let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut key = k0.inc();
    table.exec_reg_mr(PD, key, acc, None, None).unwrap();
    let iova = table.query(key).unwrap().iova;

    let cur = Arc::new(AtomicU32::new(key.0));
    let stop = Arc::new(AtomicBool::new(false));
    let copies = Arc::new(AtomicU64::new(0));
    let reader = {
        let (t, cur, stop, copies) = (table.clone(), cur.clone(), stop.clone(), copies.clone());
        std::thread::spawn(move || {
            let mut reader = epoch.then(|| t.reader().unwrap());
            let mut buf = vec![0u8; 512];
            let good = vec![GOOD; 512];
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let k = Key(cur.load(Ordering::Relaxed));
                let at = iova + LEN as u64 - 256 + (i % 7) * 8; // straddles the page boundary
                // (The reader's quiescent point below takes `&mut`: the borrow checker refuses
                // it while this reference lives.)
                if let Ok(m) = match &reader {
                    Some(r) => r.lookup(k, PD, 0, at, 512, Access::REMOTE_WRITE),
                    None => t.lookup(k, PD, 0, at, 512, Access::REMOTE_WRITE),
                } {
                    m.copy_out(at, &mut buf).unwrap();
                    assert!(
                        !buf.contains(&POISON),
                        "read poisoned memory through a live MrRef"
                    );
                    m.copy_in(at, &good).unwrap();
                    copies.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(r) = &mut reader {
                    if i.is_multiple_of(64) {
                        r.offline();
                    } else {
                        r.quiescent();
                    }
                }
            }
        })
    };

    let deadline = Instant::now() + Duration::from_millis(1500);
    let mut rounds = 0u32;
    let mut check = vec![0u8; 2 * LEN];
    while Instant::now() < deadline && rounds < 20_000 {
        rounds += 1;
        table.exec_local_inv(PD, key).unwrap();
        mem.fill(0, 2 * LEN, POISON).unwrap();
        for _ in 0..50 {
            std::hint::spin_loop();
        }
        if rounds & 15 == 0 {
            std::thread::yield_now(); // let the reader run against the FREE key
        }
        mem.read(0, &mut check).unwrap();
        assert!(
            check.iter().all(|&b| b == POISON),
            "a copy wrote through an invalidated key (round {rounds})"
        );
        mem.fill(0, 2 * LEN, GOOD).unwrap();
        key = key.inc();
        table.exec_reg_mr(PD, key, acc, None, None).unwrap();
        cur.store(key.0, Ordering::Relaxed);
        // Let the copier get going through the new key (bounded), so that the next
        // invalidation lands among copies in flight rather than on an idle key.
        let before = copies.load(Ordering::Relaxed);
        for _ in 0..20_000u32 {
            if copies.load(Ordering::Relaxed) > before {
                break;
            }
            std::hint::spin_loop();
        }
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader saw poison");
    eprintln!(
        "rounds {rounds}, successful copies {}",
        copies.load(Ordering::Relaxed)
    );
    assert!(rounds > 100);
    assert!(copies.load(Ordering::Relaxed) > 100, "the copier hardly ever ran: the test tested nothing");
}
