//! The simulated link both deterministic simulators share (the transport's [`crate::sim`] and
//! the connection manager's `pmrxe_cm::sim`): frames in flight ordered by delivery time, a
//! seeded RNG that drops, duplicates, corrupts and delays (reorders) them by rate, and filters
//! that decide the fate of specific frames first. The simulators own what differs — what a
//! node is, how a frame is built and parsed, what a filter sees (`I`) — and put every frame
//! through one [`Link`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use pmrxe_wire::ICRC_LEN;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::timers::Instant;

/// What happens to one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Deliver normally.
    Pass,
    /// Discard.
    Drop,
    /// Deliver after this many extra nanoseconds.
    Delay(u64),
    /// Deliver twice.
    Duplicate,
    /// Flip a bit of the last payload byte (the receiver's ICRC check drops it).
    Corrupt,
    /// Flip bit 4 of this byte of the RoCE part (0 = the first BTH byte), e.g. a RETH address
    /// byte; the receiver's ICRC check must drop the frame before it has any effect.
    CorruptAt(usize),
}

/// Random impairments (rates in 0..=1).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Impairments {
    /// Loss rate.
    pub drop: f64,
    /// Duplication rate.
    pub duplicate: f64,
    /// Rate of frames delayed by up to `reorder_ns` (reordering).
    pub reorder: f64,
    /// Max extra delay of reordered frames.
    pub reorder_ns: u64,
    /// Corruption rate.
    pub corrupt: f64,
}

type Filter<I> = Box<dyn FnMut(&I) -> Option<Fault>>;

/// A frame on the wire: (delivery time, send sequence number (ties keep send order),
/// destination node, frame bytes). Ordered by time, then sequence.
type InFlight = (Instant, u64, usize, Vec<u8>);

/// The wire between a simulator's nodes. `I` is what filters see of a frame.
pub struct Link<I> {
    rng: SmallRng,
    filters: Vec<Filter<I>>,
    in_flight: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
}

impl<I> core::fmt::Debug for Link<I> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Link").field("in_flight", &self.in_flight.len()).field("filters", &self.filters.len()).finish()
    }
}

impl<I> Link<I> {
    /// An empty link whose random faults come from `seed`.
    pub fn new(seed: u64) -> Self {
        Link { rng: SmallRng::seed_from_u64(seed), filters: Vec::new(), in_flight: BinaryHeap::new(), seq: 0 }
    }

    /// Add a filter; the first filter returning `Some` decides a frame's fate (before the
    /// random impairments). Filters keep their own state (e.g. "only once").
    pub fn add_filter(&mut self, f: impl FnMut(&I) -> Option<Fault> + 'static) {
        self.filters.push(Box::new(f));
    }

    /// Remove all filters.
    pub fn clear_filters(&mut self) {
        self.filters.clear();
    }

    /// The fate of the frame `info` describes: the first filter's verdict, else a draw from
    /// `impair` (one RNG draw per frame, a second for a delay).
    pub fn fate(&mut self, info: &I, impair: &Impairments) -> Fault {
        if let Some(f) = self.filters.iter_mut().find_map(|f| f(info)) {
            return f;
        }
        let im = impair;
        let r: f64 = self.rng.gen();
        if r < im.drop {
            Fault::Drop
        } else if r < im.drop + im.duplicate {
            Fault::Duplicate
        } else if r < im.drop + im.duplicate + im.corrupt {
            Fault::Corrupt
        } else if r < im.drop + im.duplicate + im.corrupt + im.reorder && im.reorder_ns > 0 {
            Fault::Delay(self.rng.gen_range(1..=im.reorder_ns))
        } else {
            Fault::Pass
        }
    }

    /// Put `frame` on the wire to node `dst`, due at `at`, with `fault` applied; `roce_at` is
    /// where the frame's RoCE part (the BTH) starts, for [`Fault::CorruptAt`].
    pub fn send(&mut self, at: Instant, dst: usize, mut frame: Vec<u8>, fault: Fault, roce_at: usize) {
        match fault {
            Fault::Pass => self.enqueue(at, dst, frame),
            Fault::Drop => {}
            Fault::Delay(d) => self.enqueue(at.add_ns(d), dst, frame),
            Fault::Duplicate => {
                self.enqueue(at, dst, frame.clone());
                self.enqueue(at.add_ns(1), dst, frame);
            }
            Fault::Corrupt => {
                if let Some(k) = frame.len().checked_sub(ICRC_LEN + 1) {
                    frame[k] ^= 0x10;
                }
                self.enqueue(at, dst, frame);
            }
            Fault::CorruptAt(k) => {
                if let Some(b) = frame.get_mut(roce_at + k) {
                    *b ^= 0x10;
                }
                self.enqueue(at, dst, frame);
            }
        }
    }

    fn enqueue(&mut self, at: Instant, dst: usize, frame: Vec<u8>) {
        self.seq += 1;
        self.in_flight.push(Reverse((at, self.seq, dst, frame)));
    }

    /// When the next frame arrives, if any is in flight.
    pub fn next_arrival(&self) -> Option<Instant> {
        self.in_flight.peek().map(|Reverse((t, ..))| *t)
    }

    /// The next frame due by `now` and its destination node, in delivery order (ties in send
    /// order).
    pub fn arrive(&mut self, now: Instant) -> Option<(usize, Vec<u8>)> {
        if self.next_arrival()? > now {
            return None;
        }
        let Reverse((_, _, dst, frame)) = self.in_flight.pop()?;
        Some((dst, frame))
    }

    /// Frames in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_arrive_in_time_order_ties_in_send_order_with_faults_applied() {
        let mut l: Link<u32> = Link::new(1);
        let roce = 4;
        l.send(Instant(10), 0, vec![1; 12], Fault::Pass, roce);
        l.send(Instant(5), 1, vec![2; 12], Fault::Delay(20), roce);
        l.send(Instant(10), 2, vec![3; 12], Fault::Pass, roce);
        l.send(Instant(10), 3, vec![4; 12], Fault::Drop, roce);
        l.send(Instant(7), 4, vec![0; 12], Fault::Duplicate, roce);
        l.send(Instant(30), 5, vec![0; 12], Fault::Corrupt, roce);
        l.send(Instant(30), 6, vec![0; 12], Fault::CorruptAt(2), roce);
        assert_eq!(l.in_flight(), 7);
        assert_eq!(l.arrive(Instant(6)), None);
        let mut got = Vec::new();
        while let Some((d, f)) = l.arrive(Instant(100)) {
            got.push((d, f));
        }
        let order: Vec<usize> = got.iter().map(|(d, _)| *d).collect();
        assert_eq!(order, [4, 4, 0, 2, 1, 5, 6]);
        // Corrupt: the last byte before the 4-byte ICRC; CorruptAt(2): the RoCE part's byte 2.
        assert_eq!(got[5].1[12 - ICRC_LEN - 1], 0x10);
        assert_eq!(got[6].1[roce + 2], 0x10);
        assert_eq!(got[6].1.iter().filter(|&&b| b != 0).count(), 1);
    }

    #[test]
    fn filters_decide_before_the_random_draw_and_the_draw_is_seeded() {
        let mut l: Link<u32> = Link::new(7);
        l.add_filter(|&i| (i == 3).then_some(Fault::Drop));
        let all_dup = Impairments { duplicate: 1.0, ..Default::default() };
        assert_eq!(l.fate(&3, &all_dup), Fault::Drop);
        assert_eq!(l.fate(&4, &all_dup), Fault::Duplicate);
        l.clear_filters();
        assert_eq!(l.fate(&3, &all_dup), Fault::Duplicate);
        let im = Impairments { drop: 0.3, duplicate: 0.1, reorder: 0.2, reorder_ns: 50, corrupt: 0.1 };
        let draw = |seed| {
            let mut l: Link<u32> = Link::new(seed);
            (0..200).map(|i| l.fate(&i, &im)).collect::<Vec<_>>()
        };
        let a = draw(9);
        assert_eq!(a, draw(9));
        assert_ne!(a, draw(10));
        for f in [Fault::Pass, Fault::Drop, Fault::Duplicate, Fault::Corrupt] {
            assert!(a.contains(&f), "{f:?} never drawn");
        }
        assert!(a.iter().any(|f| matches!(f, Fault::Delay(1..=50))));
    }
}
