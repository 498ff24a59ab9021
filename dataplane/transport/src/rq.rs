//! The receive queue of a QP without an SRQ: a ring of receive WQEs, written once when posted
//! and read in place while a message fills them: a post copies only the used fields from
//! whatever [`RecvWr`] it is given, and nothing copies a whole 144-byte `RecvWqe` (the
//! compiler does that with a `memcpy` call).
//!
//! The WQE a message is filling (the head, once [`RecvQueue::start`]ed) keeps its slot, and
//! counts against the queue's capacity, until the message completes or the queue is flushed:
//! as in hardware, where the completion frees the slot.

use crate::wqe::{RecvWqe, RecvWr, MAX_SGE};

/// A QP's receive queue (see the module doc). The default has no slots (holds nothing).
#[derive(Debug, Default)]
pub(crate) struct RecvQueue {
    slots: Vec<RecvWqe>,
    /// Slot of the oldest WQE.
    head: usize,
    /// WQEs held, the current one included.
    len: usize,
    /// The head WQE is being filled by a message.
    current: bool,
}

/// `i % n` for `i < 2n` (a ring index one lap ahead at most).
#[inline]
fn wrap(i: usize, n: usize) -> usize {
    if i >= n {
        i - n
    } else {
        i
    }
}

impl RecvQueue {
    /// A queue for `cap` WQEs (at least one slot is allocated).
    pub(crate) fn with_capacity(cap: usize) -> RecvQueue {
        RecvQueue { slots: vec![RecvWqe::new(0); cap.max(1)], head: 0, len: 0, current: false }
    }

    /// WQEs held, the current one included.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Append a copy of `w`'s used fields; false (nothing changed) if the queue is full.
    #[inline]
    pub(crate) fn push<W: RecvWr + ?Sized>(&mut self, w: &W) -> bool {
        if self.len == self.slots.len() {
            return false;
        }
        let n = w.num_sge().min(MAX_SGE);
        // head < slots and len < slots here: one conditional subtraction, not a division.
        let i = wrap(self.head + self.len, self.slots.len());
        let s = &mut self.slots[i];
        s.wr_id = w.wr_id();
        s.num_sge = n;
        // Entry by entry (the usual receive has one: one 16-byte move, no memcpy call).
        for (k, d) in s.sges[..n].iter_mut().enumerate() {
            *d = w.sge(k);
        }
        self.len += 1;
        true
    }

    /// Is there a WQE a new message could take?
    pub(crate) fn has_next(&self) -> bool {
        self.len > usize::from(self.current)
    }

    /// Make the head WQE the current one; false if there is none to take or one already is.
    pub(crate) fn start(&mut self) -> bool {
        if self.current || self.len == 0 {
            return false;
        }
        self.current = true;
        true
    }

    /// The WQE a message is filling.
    pub(crate) fn current(&self) -> Option<&RecvWqe> {
        self.current.then(|| &self.slots[self.head])
    }

    /// The current WQE completed (or was flushed): free its slot. Returns its `wr_id`.
    pub(crate) fn finish(&mut self) -> Option<u64> {
        if !self.current {
            return None;
        }
        self.current = false;
        self.pop()
    }

    /// Remove the oldest WQE (current or not), returning its `wr_id`: for flushing.
    pub(crate) fn pop(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let id = self.slots[self.head].wr_id;
        self.current = false;
        self.head = wrap(self.head + 1, self.slots.len());
        self.len -= 1;
        Some(id)
    }

    /// Empty the queue (QP reset), keeping the allocation.
    pub(crate) fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
        self.current = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmrxe_mem::{Key, Sge};

    fn wqe(id: u64, n: u32) -> RecvWqe {
        (0..n).fold(RecvWqe::new(id), |w, k| w.sge(Sge { addr: u64::from(k) * 100, len: 10 + k, lkey: Key(k) }))
    }

    #[test]
    fn fifo_with_a_current_wqe_that_keeps_its_slot() {
        let mut q = RecvQueue::with_capacity(2);
        assert!(!q.has_next() && !q.start() && q.current().is_none());
        assert!(q.push(&wqe(1, 2)) && q.push(&wqe(2, 1)));
        assert!(!q.push(&wqe(3, 1)), "full at max_recv_wr");
        assert!(q.start());
        assert!(!q.start(), "one current WQE at a time");
        let c = q.current().unwrap();
        assert_eq!((c.wr_id, c.sg_list().len(), c.capacity()), (1, 2, 21));
        assert!(q.has_next());
        assert!(!q.push(&wqe(3, 1)), "the current WQE still holds its slot");
        assert_eq!(q.finish(), Some(1));
        assert_eq!(q.finish(), None);
        // Wraps around: slot 0 is reused with the new WQE's fields only.
        assert!(q.push(&wqe(3, 1)));
        assert!(q.start());
        assert_eq!(q.current().unwrap().wr_id, 2);
        assert_eq!(q.finish(), Some(2));
        assert!(q.start());
        let c = q.current().unwrap();
        assert_eq!((c.wr_id, c.sg_list().len(), c.capacity()), (3, 1, 10));
        assert_eq!(q.pop(), Some(3));
        assert_eq!((q.len(), q.has_next(), q.current().is_none()), (0, false, true));
    }

    /// Many laps of a ring whose capacity is not a power of two: FIFO order throughout.
    #[test]
    fn fifo_over_many_laps() {
        let mut q = RecvQueue::with_capacity(3);
        let (mut next_in, mut next_out) = (0u64, 0u64);
        for round in 0..50u64 {
            while q.push(&wqe(next_in, 1)) {
                next_in += 1;
            }
            assert_eq!(q.len(), 3);
            for _ in 0..1 + round % 3 {
                assert_eq!(q.pop(), Some(next_out));
                next_out += 1;
            }
        }
    }
}
