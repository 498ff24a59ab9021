//! Invariant 9: the lcore loop makes no heap allocation on the fast path (post → wire →
//! completion), proven by counting allocations made by the lcore's thread while it moves
//! steady-state RDMA WRITE traffic between two devices through real client rings.
//! (System calls are proven absent by the integration test that straces the live service's
//! lcore thread; this test covers allocation, which strace cannot see.)
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::{client_page, rig, Rig};
use pmrxe_abi::{send_flags, wr_opcode, Doorbell, ShmSendWqe, ShmSge};
use pmrxe_port::SimBuf;
use pmrxe_transport::sim::{bring_up, PairParams};
use pmrxe_transport::{Instant, PathMtu};

struct Counting;
thread_local! {
    static COUNT: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}
// SAFETY: forwards to the system allocator; only bumps a thread-local counter on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = COUNT.try_with(|c| {
            if c.get() {
                ALLOCS.with(|a| a.set(a.get() + 1));
            }
        });
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = COUNT.try_with(|c| {
            if c.get() {
                ALLOCS.with(|a| a.set(a.get() + 1));
            }
        });
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static A: Counting = Counting;

/// Buffers of the test's wire do not count (the DPDK port takes them from a mempool; this test
/// measures the lcore loop, not the test's wire).
fn uncounted<R>(f: impl FnOnce() -> R) -> R {
    let was = COUNT.with(|c| c.replace(false));
    let r = f();
    COUNT.with(|c| c.set(was));
    r
}
fn uncounted_buf() -> SimBuf {
    uncounted(common::jumbo_buf)
}

#[test]
fn lcore_loop_allocates_nothing_in_steady_state_write_traffic() {
    let common::Pair { mut lc, h, mem, ips: [ip0, ip1], .. } = common::lcore_pair(uncounted_buf);

    // Client page, CQs, QPs and memory exactly as the service sets them up.
    let p = PairParams { mtu: PathMtu::Mtu4096, access: 0x7, ..PairParams::default() };
    let Rig { page, events: _events, mut cq_rings, mut sqs, lkey, rkey, dst, .. } = rig(&mut lc, &h, &mem, [ip0, ip1], &p, bring_up, None);
    let cpage = client_page(&page);

    let write = |i: u64| {
        let mut w = ShmSendWqe { wr_id: i, opcode: wr_opcode::RDMA_WRITE, send_flags: send_flags::SIGNALED, num_sge: 1, remote_addr: 0x20_0000 + (i % 16) * 65536, rkey: rkey.0, ..Default::default() };
        w.set_sge(0, ShmSge { addr: 0x10_0000 + (i % 16) * 65536, length: 65536, lkey: lkey.0 });
        w
    };
    let mut now = 1_000u64;
    let mut posted = 0u64;
    let mut completed = 0u64;
    let mut run = |rounds: usize, posted: &mut u64, completed: &mut u64, now: &mut u64| {
        for _ in 0..rounds {
            while *posted - *completed < 8 {
                sqs[0].1.push(write(*posted)).unwrap();
                cpage.ring(Doorbell { lcore: 0, slot: 0 });
                *posted += 1;
            }
            COUNT.with(|c| c.set(true));
            lc.poll_once(Instant(*now));
            COUNT.with(|c| c.set(false));
            *now += 2_000;
            while let Some(c) = cq_rings[0].1.pop().unwrap() {
                assert_eq!(c.status, 0, "WRITE {} failed: status {}", c.wr_id, c.status);
                *completed += 1;
            }
        }
    };
    // Warm-up: first packets create neighbour entries, hash slots, engine queues.
    run(2_000, &mut posted, &mut completed, &mut now);
    assert!(completed > 100, "traffic flows during warm-up ({completed} WRITEs): {:?}", h.stats.snapshot());
    ALLOCS.with(|a| a.set(0));
    let before = completed;
    run(5_000, &mut posted, &mut completed, &mut now);
    let moved = completed - before;
    let allocs = ALLOCS.with(|a| a.get());
    assert!(moved > 500, "steady state moved {moved} 64 KiB WRITEs");
    assert_eq!(allocs, 0, "the lcore loop allocated {allocs} times while moving {moved} WRITEs");
    // And the bytes landed.
    let mut b = [0u8; 64];
    dst.read(65536 * 3, &mut b).unwrap();
    assert_eq!(b, [0xab; 64]);
}
