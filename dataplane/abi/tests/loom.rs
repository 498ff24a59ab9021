//! Loom models of the shared-memory SPSC ring (`src/ring.rs`), of the doorbells
//! need-wakeup protocol (`src/layout.rs`, `DoorbellRow::ring` / `sleep_begin`) and of the CQ
//! arm/notify pair (`CqNotify::arm` / `take_armed`).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p pmrxe-abi --release --test loom`
//! (optionally `LOOM_MAX_PREEMPTIONS=3`). Without `--cfg loom` this file is empty.
//!
//! Under `cfg(loom)` the ring's slots are `loom::cell::UnsafeCell`s (see `ring.rs`), so besides
//! the assertions below loom itself checks every payload hand-off: a slot read not ordered
//! after its write, or a slot write not ordered after the previous read of that slot (an
//! overwrite of an unconsumed entry), aborts the model.
//!
//! Verified to fail when an ordering is weakened, and to pass again once restored:
//! * the producer's index store in `Producer::publish` `Release` → `Relaxed`: both models fail
//!   (loom reports the consumer's slot read racing the producer's slot write);
//! * the consumer's index store in `Consumer::release` `Release` → `Relaxed`: both models fail
//!   (loom reports the producer's slot write racing the consumer's read of the old entry);
//! * the full check in `Producer::stage` `used >= cap` → `used > cap` (overwrite an unconsumed
//!   slot): (b) fails on `push` returning `Ok` instead of `Full(item)`, (a) with loom's
//!   "Concurrent read and write accesses".
#![cfg(loom)]

use loom::thread;
use pmrxe_abi::ring::{init_ring, ring_bytes, Consumer, Pod, Producer, PushError};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct E {
    seq: u64,
    /// Derived from `seq`, so a torn or stale slot shows up as a mismatch.
    payload: u64,
}
// SAFETY: repr(C) of integers, every bit pattern valid.
unsafe impl Pod for E {}

fn item(seq: u64) -> E {
    E { seq, payload: !seq ^ 0x5a5a_0000 }
}

const CAP: u32 = 2;

/// A 64-byte-aligned segment big enough for a `CAP`-entry ring (loom slots included).
#[repr(C, align(64))]
struct Seg([u8; 1024]);

fn ring(seg: &mut Seg) -> (Producer<E>, Consumer<E>) {
    let len = ring_bytes::<E>(CAP);
    assert!(len <= seg.0.len());
    let base = seg.0.as_mut_ptr();
    // SAFETY: `seg` is aligned, large enough, and outlives both handles (every model joins
    // its threads before the segment is dropped); one producer and one consumer.
    unsafe {
        init_ring::<E>(base, CAP).unwrap();
        (
            Producer::attach(base, len, CAP).unwrap(),
            Consumer::attach(base, len, CAP).unwrap(),
        )
    }
}

/// Push `e`, yielding while the ring is full; a full push hands back exactly `e`.
fn push_blocking(p: &mut Producer<E>, e: E) {
    loop {
        match p.push(e) {
            Ok(()) => return,
            Err(PushError::Full(back)) => {
                assert_eq!(back, e, "Full must hand the item back unchanged");
                thread::yield_now();
            }
            Err(PushError::Corrupt(_)) => panic!("ring reported corrupt indices"),
        }
    }
}

/// (a) Three items through a two-slot ring while the consumer pops concurrently: each arrives
/// exactly once, in order, with its payload intact, and the ring ends empty.
#[test]
fn loom_three_items_through_two_slots_in_order() {
    loom::model(|| {
        let mut seg = Box::new(Seg([0; 1024]));
        let (mut p, mut c) = ring(&mut seg);
        let producer = thread::spawn(move || {
            for seq in 0..3 {
                push_blocking(&mut p, item(seq));
            }
            p
        });
        let mut want = 0;
        while want < 3 {
            match c.pop().unwrap() {
                Some(e) => {
                    assert_eq!(e, item(want), "lost, duplicated, reordered or torn entry");
                    want += 1;
                }
                None => thread::yield_now(),
            }
        }
        let mut p = producer.join().unwrap();
        assert_eq!(c.pop().unwrap(), None, "an item arrived twice");
        assert_eq!(p.free().unwrap(), CAP);
        drop((p, c));
        drop(seg);
    });
}

/// (b) The boundaries. Empty: a pop before anything is published returns `None` and does not
/// advance. Full: with two unconsumed entries the third push returns `Full` with the item, and
/// never overwrites slot 0 while the consumer has not released it; once the consumer frees a
/// slot (concurrently) the push goes through and everything arrives in order.
#[test]
fn loom_full_and_empty_boundaries() {
    loom::model(|| {
        let mut seg = Box::new(Seg([0; 1024]));
        let (mut p, mut c) = ring(&mut seg);

        // Empty boundary, single-threaded: nothing published, nothing popped.
        assert_eq!(c.pop().unwrap(), None);
        assert_eq!(c.available().unwrap(), 0);
        // Staged but not published is invisible.
        p.stage(item(0)).unwrap();
        assert_eq!(c.pop().unwrap(), None);
        p.publish();
        p.push(item(1)).unwrap();
        // Full boundary, single-threaded: the item comes back, nothing is overwritten.
        assert_eq!(p.push(item(2)), Err(PushError::Full(item(2))));
        assert_eq!(p.free().unwrap(), 0);

        // Concurrent: the producer retries item 2 while the consumer drains.
        let producer = thread::spawn(move || {
            let mut fulls = 0u32;
            loop {
                match p.push(item(2)) {
                    Ok(()) => break,
                    Err(PushError::Full(back)) => {
                        assert_eq!(back, item(2));
                        fulls += 1;
                        thread::yield_now();
                    }
                    Err(PushError::Corrupt(_)) => panic!("ring reported corrupt indices"),
                }
            }
            // One more push may only succeed once the consumer freed a second slot.
            let fourth = p.push(item(3));
            (p, fulls, fourth)
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            match c.pop().unwrap() {
                Some(e) => got.push(e),
                None => thread::yield_now(),
            }
        }
        let (mut p, _fulls, fourth) = producer.join().unwrap();
        assert_eq!(&got[..], &[item(0), item(1), item(2)]);
        match fourth {
            Ok(()) => assert_eq!(c.pop().unwrap(), Some(item(3))),
            Err(e) => assert_eq!(e, PushError::Full(item(3))),
        }
        assert_eq!(c.pop().unwrap(), None);
        assert_eq!(p.free().unwrap(), CAP);
        drop((p, c));
        drop(seg);
    });
}

// ---- need-wakeup: a client posting into a sleeping lcore -----------------------------------

use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use loom::sync::{Arc, Notify};
use pmrxe_abi::DoorbellRow;

fn row() -> DoorbellRow {
    DoorbellRow { summary: AtomicU64::new(0), _pad: [0; 7], words: std::array::from_fn(|_| AtomicU64::new(0)) }
}

/// (c) One client posts two WQEs (ring tail store, then `DoorbellRow::ring`, then one wake-up
/// when it says the lcore sleeps); one lcore drains its doorbells as `doorbells.rs` does and,
/// finding none, announces a sleep (`sleep_begin`: the flag in the summary word) and blocks on
/// its "eventfd" (a loom `Notify`: a signal given before the wait is kept, as an eventfd's
/// counter is; loom also wakes it spuriously, and the lcore then just looks again) unless the
/// announcement found a doorbell. The lcore must see both WQEs: a lost wake-up leaves it
/// blocked forever, which loom reports as a deadlock.
///
/// Verified to fail when weakened: with the client testing a stale load of the summary
/// instead of the value its `fetch_or` returned, or with `sleep_begin` ignoring the doorbell
/// bits it returns, loom reports "deadlock".
#[test]
fn loom_need_wakeup_never_loses_a_post() {
    loom::model(|| {
        let row = Arc::new(row());
        let tail = Arc::new(AtomicU64::new(0));
        let efd = Arc::new(Notify::new());
        let client = {
            let (row, tail, efd) = (row.clone(), tail.clone(), efd.clone());
            thread::spawn(move || {
                let mut wakes = 0;
                for n in 1..=2u64 {
                    tail.store(n, Ordering::Release); // the WQE is published
                    if row.ring(3) {
                        efd.notify();
                        wakes += 1;
                    }
                }
                wakes
            })
        };
        let mut seen = 0u64;
        loop {
            // doorbells.rs: the rung slots, taken from the summary and its words.
            let mut rung = false;
            row.take(|slot| {
                assert_eq!(slot, 3, "only doorbell 3 is rung");
                rung = true;
            });
            if rung {
                seen = tail.load(Ordering::Acquire);
            }
            if seen == 2 {
                break;
            }
            // Idle: announce the sleep; a doorbell rung meanwhile cancels it.
            if row.sleep_begin() {
                row.sleep_end();
                continue;
            }
            efd.wait();
            row.sleep_end();
        }
        let wakes = client.join().unwrap();
        assert_eq!(seen, 2);
        assert!(wakes <= 2, "one call per post at most");
    });
}

// ---- CQ arm/notify: an application sleeping on its completion channel ----------------------

use pmrxe_abi::{CqNotify, ShmCqe};

fn notify() -> CqNotify {
    CqNotify { armed: AtomicU32::new(0), events: AtomicU32::new(0), overflow: AtomicU32::new(0) }
}

/// (d) The lcore writes one completion into a CQ ring and publishes it, then (after the fence
/// every pass makes once, `CqNotify::fence_after_publish`) takes the arm and, if it was armed,
/// signals the channel (a loom `Notify` standing for the eventfd). The application does what
/// `ibv_get_cq_event` users do: poll; on an empty ring arm (`CqNotify::arm`) and poll again;
/// still empty, sleep on the channel, then poll. It must get the completion: a missed arm
/// leaves it asleep for ever (loom: deadlock). Every event fired is counted once.
///
/// Verified to fail when weakened: without the service's fence, or with the client's arm as a
/// plain store and no fence, loom reports "deadlock" (each side's load passes its store).
#[test]
fn loom_cq_arm_never_misses_a_completion() {
    loom::model(|| {
        let mut seg = Box::new(Seg([0; 1024]));
        let len = ring_bytes::<ShmCqe>(CAP);
        assert!(len <= seg.0.len());
        let base = seg.0.as_mut_ptr();
        // SAFETY: `seg` is aligned, large enough, and outlives both handles (the lcore thread
        // is joined before it is dropped); one producer and one consumer.
        let (mut prod, mut cons) = unsafe {
            init_ring::<ShmCqe>(base, CAP).unwrap();
            (Producer::<ShmCqe>::attach(base, len, CAP).unwrap(), Consumer::<ShmCqe>::attach(base, len, CAP).unwrap())
        };
        let n = Arc::new(notify());
        let channel = Arc::new(Notify::new());
        let lcore = {
            let (n, channel) = (n.clone(), channel.clone());
            thread::spawn(move || {
                prod.push(ShmCqe { wr_id: 7, byte_len: 8, ..Default::default() }).unwrap();
                CqNotify::fence_after_publish();
                let fired = n.take_armed();
                if fired {
                    channel.notify();
                }
                drop(prod);
                fired
            })
        };
        let got = loop {
            if let Some(c) = cons.pop().unwrap() {
                break c;
            }
            n.arm(false);
            if let Some(c) = cons.pop().unwrap() {
                break c;
            }
            // The channel: loom may also wake it spuriously; the loop then just looks again.
            channel.wait();
        };
        assert_eq!(got.wr_id, 7);
        let fired = lcore.join().unwrap();
        assert_eq!(n.events.load(Ordering::Relaxed), u32::from(fired));
        drop(cons);
        drop(seg);
    });
}
