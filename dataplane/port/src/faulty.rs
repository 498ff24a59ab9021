//! [`FaultyPort`]: wraps any [`Port`] and injects seeded faults into what it receives: loss,
//! duplication, reordering (a frame is held back and delivered after the next one) and
//! corruption (one bit flipped). Faulting the receive side keeps `tx_burst`'s ownership
//! contract intact; wrap both ends to fault both directions. Same seed, same input → same
//! faults.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrayvec::ArrayVec;
use pmrxe_config::{FaultConfig, MacAddr};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::{PacketBuf, Port};

/// Fault probabilities, each a fraction in 0..=1, and the RNG seed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Fraction of frames dropped.
    pub loss: f64,
    /// Fraction of frames delivered twice.
    pub duplicate: f64,
    /// Fraction of frames delivered after the following frame.
    pub reorder: f64,
    /// Fraction of frames with one bit flipped.
    pub corrupt: f64,
    /// RNG seed.
    pub seed: u64,
}

impl From<&FaultConfig> for Faults {
    fn from(c: &FaultConfig) -> Faults {
        Faults { loss: c.loss, duplicate: c.duplicate, reorder: c.reorder, corrupt: c.corrupt, seed: c.seed }
    }
}

/// Counts of injected faults (a snapshot of [`FaultCounters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Frames received from the inner port.
    pub seen: u64,
    /// Frames dropped.
    pub dropped: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Frames held back behind a later one.
    pub reordered: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
}

/// The live injected-fault counters of one [`FaultyPort`]: written only by the thread that
/// owns the port (relaxed load + store, no read-modify-write), read by any thread (the
/// service's `pmrxe stats --json`).
#[derive(Debug, Default)]
pub struct FaultCounters {
    seen: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    corrupted: AtomicU64,
}

impl FaultCounters {
    /// Reads every counter.
    pub fn snapshot(&self) -> FaultStats {
        FaultStats {
            seen: self.seen.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            duplicated: self.duplicated.load(Ordering::Relaxed),
            reordered: self.reordered.load(Ordering::Relaxed),
            corrupted: self.corrupted.load(Ordering::Relaxed),
        }
    }
}

/// Adds one to a counter that only the calling thread writes.
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// A [`Port`] wrapper that injects [`Faults`] on receive.
pub struct FaultyPort<P: Port> {
    inner: P,
    faults: Faults,
    rng: SmallRng,
    held: Option<P::Buf>,
    overflow: VecDeque<P::Buf>,
    stats: Arc<FaultCounters>,
}

impl<P: Port> FaultyPort<P> {
    /// Wraps `inner`.
    pub fn new(inner: P, faults: Faults) -> FaultyPort<P> {
        FaultyPort {
            inner,
            rng: SmallRng::seed_from_u64(faults.seed),
            faults,
            held: None,
            overflow: VecDeque::with_capacity(64),
            stats: Arc::default(),
        }
    }
    /// Injected-fault counters.
    pub fn stats(&self) -> FaultStats {
        self.stats.snapshot()
    }
    /// The live counters, for readers on other threads.
    pub fn counters(&self) -> Arc<FaultCounters> {
        self.stats.clone()
    }
    /// The wrapped port.
    pub fn inner(&self) -> &P {
        &self.inner
    }
    /// The wrapped port, mutable.
    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }
    /// Unwraps, dropping any held-back frames.
    pub fn into_inner(self) -> P {
        self.inner
    }

    fn hit(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.gen::<f64>() < p
    }

    fn emit<const N: usize>(&mut self, out: &mut ArrayVec<P::Buf, N>, b: P::Buf, n: &mut usize) {
        if out.is_full() {
            self.overflow.push_back(b);
        } else {
            out.push(b);
            *n += 1;
        }
    }
}

impl<P: Port> Port for FaultyPort<P> {
    type Buf = P::Buf;
    fn port_id(&self) -> u16 {
        self.inner.port_id()
    }
    fn mac(&self) -> MacAddr {
        self.inner.mac()
    }
    fn mtu(&self) -> u16 {
        self.inner.mtu()
    }
    fn alloc(&mut self) -> Option<P::Buf> {
        self.inner.alloc()
    }
    fn alloc_bulk<const N: usize>(&mut self, out: &mut ArrayVec<P::Buf, N>) -> usize {
        self.inner.alloc_bulk(out)
    }
    fn tx_burst<const N: usize>(&mut self, bufs: &mut ArrayVec<P::Buf, N>) -> usize {
        self.inner.tx_burst(bufs)
    }
    fn kick(&mut self) -> bool {
        self.inner.kick()
    }
    fn rx_ring_drops(&mut self) -> u64 {
        self.inner.rx_ring_drops()
    }
    /// The inner port's: a frame held back for reordering or left in `overflow` comes out on
    /// the next receive pass, which an lcore makes before it sleeps.
    fn rx_wake(&self) -> crate::RxWake {
        self.inner.rx_wake()
    }
    fn rx_burst<const N: usize>(&mut self, out: &mut ArrayVec<P::Buf, N>) -> usize {
        let mut n = 0;
        while !out.is_full() {
            let Some(b) = self.overflow.pop_front() else { break };
            out.push(b);
            n += 1;
        }
        if out.is_full() {
            return n;
        }
        let mut got: ArrayVec<P::Buf, N> = ArrayVec::new();
        // `got` may hold more than `out` has room for; the rest waits in `overflow`.
        self.inner.rx_burst(&mut got);
        if got.is_empty() {
            // Idle link: release a held-back frame rather than holding it forever.
            if let Some(h) = self.held.take() {
                self.emit(out, h, &mut n);
            }
            return n;
        }
        for mut b in got.drain(..) {
            bump(&self.stats.seen);
            if self.hit(self.faults.loss) {
                bump(&self.stats.dropped);
                continue;
            }
            if self.hit(self.faults.corrupt) && !b.is_empty() {
                let i = self.rng.gen_range(0..b.len());
                let bit = self.rng.gen_range(0..8);
                b.data_mut()[i] ^= 1 << bit;
                bump(&self.stats.corrupted);
            }
            if self.held.is_none() && self.hit(self.faults.reorder) {
                self.held = Some(b);
                bump(&self.stats.reordered);
                continue;
            }
            let dup = if self.hit(self.faults.duplicate) {
                self.inner.alloc().and_then(|mut c| c.extend_from_slice(b.data()).then_some(c))
            } else {
                None
            };
            self.emit(out, b, &mut n);
            if let Some(c) = dup {
                bump(&self.stats.duplicated);
                self.emit(out, c, &mut n);
            }
            if let Some(h) = self.held.take() {
                self.emit(out, h, &mut n);
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Burst, SimBuf, SimPort};

    fn pump(faults: Faults, frames: u32) -> (Vec<u32>, FaultStats) {
        let (mut a, b) = SimPort::pair(1500, 4096);
        let mut b = FaultyPort::new(b, faults);
        let live = b.counters();
        let mut seen = Vec::new();
        let mut rx: Burst<SimBuf> = Burst::new();
        for chunk in (0..frames).collect::<Vec<_>>().chunks(16) {
            let mut tx: Burst<SimBuf> = chunk.iter().map(|i| SimBuf::from_slice(&i.to_be_bytes())).collect();
            assert_eq!(a.tx_burst(&mut tx), chunk.len());
            while b.rx_burst(&mut rx) > 0 {
                seen.extend(rx.drain(..).map(|b| u32::from_be_bytes(b.data()[..4].try_into().unwrap())));
            }
        }
        while b.rx_burst(&mut rx) > 0 {
            seen.extend(rx.drain(..).map(|b| u32::from_be_bytes(b.data()[..4].try_into().unwrap())));
        }
        assert_eq!(live.snapshot(), b.stats(), "the shared counters are the port's");
        (seen, b.stats())
    }

    #[test]
    fn no_faults_is_transparent() {
        let (seen, st) = pump(Faults::default(), 1000);
        assert_eq!(seen, (0..1000).collect::<Vec<_>>());
        assert_eq!(st, FaultStats { seen: 1000, ..Default::default() });
    }

    #[test]
    fn loss_drops_exactly_the_counted_frames() {
        let (seen, st) = pump(Faults { loss: 0.1, seed: 1, ..Default::default() }, 2000);
        assert!(st.dropped > 100 && st.dropped < 300, "{st:?}");
        assert_eq!(seen.len() as u64, 2000 - st.dropped);
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "loss alone keeps order");
    }

    #[test]
    fn duplicate_and_reorder_keep_every_frame() {
        let (seen, st) = pump(Faults { duplicate: 0.05, reorder: 0.05, seed: 2, ..Default::default() }, 2000);
        assert!(st.duplicated > 0 && st.reordered > 0, "{st:?}");
        assert_eq!(seen.len() as u64, 2000 + st.duplicated);
        let mut uniq = seen.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq, (0..2000).collect::<Vec<_>>());
        assert!(seen.windows(2).any(|w| w[0] > w[1]), "something arrived out of order");
    }

    #[test]
    fn same_seed_same_faults() {
        let f = Faults { loss: 0.1, duplicate: 0.1, reorder: 0.1, corrupt: 0.1, seed: 42 };
        assert_eq!(pump(f, 500), pump(f, 500));
        let (_, st) = pump(f, 500);
        assert!(st.corrupted > 0);
    }
}
