//! Where a QP's new work requests come from, as the engine pulls them: for the runtime's
//! lcore, the client's shared send and receive rings (WQEs converted in place); for the
//! simulator, the WRs a test rang in (`sim::Node::ring_send`). The engine decides
//! what happens to each ([`crate::Engine::pull`]): receive WRs first, so a SEND arriving in the
//! same burst finds them; a full queue leaves the WR in the source (the embedder retries);
//! a malformed WR or a corrupt queue moves the QP to ERROR. One implementation for production
//! and the seeded suites.

use crate::wqe::{RecvWr, SendWr};

/// Which of a QP's queues a [`WorkSource`] call is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// The send queue.
    Send,
    /// The receive queue.
    Recv,
}

/// What a source offers next from one queue.
#[derive(Debug)]
pub enum Offer<W> {
    /// The next work request, in order.
    Wr(W),
    /// Nothing new.
    Empty,
    /// The next entry is not a valid work request (bad opcode, SGE count, unknown address
    /// handle ...): the engine consumes it and moves the QP to ERROR (only a client that
    /// bypassed the shim's checks writes one).
    Malformed,
    /// The queue itself is corrupt (indices out of range): the engine moves the QP to ERROR
    /// and reads that queue no further in this pull.
    Corrupt,
}

/// A QP's queue of new work requests (see the module docs). `X` is the engine's attachment:
/// the lcore keeps the rings there.
pub trait WorkSource<X> {
    /// A send WR as the source offers it (borrowing the source's scratch).
    type Send<'a>: SendWr
    where
        Self: 'a;
    /// A receive WR as the source offers it.
    type Recv<'a>: RecvWr
    where
        Self: 'a;
    /// The next send WR of QP `qpn`, not yet consumed.
    fn next_send(&mut self, qpn: u32, ext: &mut X) -> Offer<Self::Send<'_>>;
    /// The next receive WR of QP `qpn`, not yet consumed (a QP without a receive queue of its
    /// own, i.e. on an SRQ, offers [`Offer::Empty`]).
    fn next_recv(&mut self, qpn: u32, ext: &mut X) -> Offer<Self::Recv<'_>>;
    /// The engine took the entry last offered from `queue` (posted, or refused as
    /// malformed): move past it.
    fn consume(&mut self, qpn: u32, ext: &mut X, queue: Queue);
    /// The pull of `queue` is over (the lcore publishes its consumer index once here).
    fn finish(&mut self, qpn: u32, ext: &mut X, queue: Queue);
    /// The QP went to RESET: drop what the queues still hold (IBTA: a reset QP's queues are
    /// empty).
    fn reset(&mut self, qpn: u32, ext: &mut X);
}

/// What one [`crate::Engine::pull`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pulled {
    /// Entries consumed (posted or refused).
    pub moved: u32,
    /// A queue of the QP was full: WRs wait in the source (retry after completions).
    pub full: bool,
    /// Entries refused as malformed.
    pub malformed: u32,
    /// Queues found corrupt.
    pub corrupt: u32,
}
