//! The send queue's storage: compact entries and their side arrays.

use pmrxe_mem::Sge;
use pmrxe_wire::Psn;

use crate::attr::{QpCaps, QpType};
use crate::cq::WcStatus;
use crate::wqe::{SendFlags, SendOp, SendWr, UdDest};

/// One SQ slot: the compact part of the WQE and its progress (about a hundred bytes, not the
/// 512 B of a [`SendWqe`]). The gather list, inline data and UD destination live in the QP's
/// side arrays ([`SqSide`]) at the same slot and are written once, at post; nothing copies
/// them again on transmit, ACK or retire.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SqEntry {
    pub wr_id: u64,
    pub op: SendOp,
    pub flags: SendFlags,
    /// Remote address and key (WRITE/READ/atomics).
    pub remote_addr: u64,
    pub rkey: u32,
    /// Gather entries in the side array (0 for inline and local ops).
    pub num_sge: u8,
    /// Message length.
    pub len: u64,
    /// PSN of the first packet (valid once `started`).
    pub first_psn: Psn,
    /// PSNs consumed (packets, READ responses).
    pub npsn: u32,
    /// First transmission started: PSNs assigned, credit taken.
    pub started: bool,
    /// Next packet index to (re)transmit (SEND/WRITE); READ: packet index the next request
    /// starts from; atomic: 0 or 1.
    pub tx_pkt: u32,
    /// READ request for `tx_pkt..` has been sent.
    pub read_req_out: bool,
    /// READ response packets placed.
    pub rcvd: u32,
    /// Holds an rd_atomic credit.
    pub credit: bool,
    /// Final status once known.
    pub done: Option<WcStatus>,
}

// The point of the compact entry: an ACK walk or a transmit touches two cache lines, not nine.
const _: () = assert!(core::mem::size_of::<SqEntry>() <= 128);

impl SqEntry {
    /// What an unused slot holds; its progress fields are those of a WQE just posted.
    pub(crate) const NOT_STARTED: SqEntry = SqEntry {
        wr_id: 0,
        op: SendOp::Send,
        flags: SendFlags(0),
        remote_addr: 0,
        rkey: 0,
        num_sge: 0,
        len: 0,
        first_psn: Psn::new(0),
        npsn: 0,
        started: false,
        tx_pkt: 0,
        read_req_out: false,
        rcvd: 0,
        credit: false,
        done: None,
    };

    pub(crate) fn signaled(&self) -> bool {
        self.flags.contains(SendFlags::SIGNALED)
    }

    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.wrapping_add(self.npsn.saturating_sub(1))
    }
    pub(crate) fn contains_psn(&self, p: Psn) -> bool {
        self.started && p.distance(self.first_psn) >= 0 && p.distance(self.last_psn()) <= 0
    }
}

/// The SQ's entries: a ring of [`SqEntry`] over absolute WQE indices (`head..end`), the slot
/// count a power of two at least the queue's depth, allocated once at create. A WQE is written
/// into its slot where it stays until it retires: `push` stores the fields straight into the
/// slot (a `VecDeque::push_back` built the entry on the stack and copied it in, and the copy's
/// loads stalled on the narrow stores just made: 4 % of the lcore's time at 8 B WRITE).
#[derive(Debug)]
pub(crate) struct SqRing {
    entries: Box<[SqEntry]>,
    /// Slots − 1.
    mask: u64,
    head: u64,
    end: u64,
}

impl SqRing {
    pub(crate) fn new(depth: u32) -> SqRing {
        let slots = (depth.max(1) as usize).next_power_of_two();
        SqRing { entries: vec![SqEntry::NOT_STARTED; slots].into_boxed_slice(), mask: slots as u64 - 1, head: 0, end: 0 }
    }
    /// Absolute index of the oldest WQE.
    #[inline]
    pub(crate) fn head(&self) -> u64 {
        self.head
    }
    /// Absolute index one past the newest WQE.
    #[inline]
    pub(crate) fn end(&self) -> u64 {
        self.end
    }
    #[inline]
    pub(crate) fn len(&self) -> usize {
        (self.end - self.head) as usize
    }
    /// Append `e`; the caller has checked the queue's depth (`len() < depth`).
    #[inline(always)]
    pub(crate) fn push(&mut self, e: SqEntry) {
        assert!(self.len() < self.entries.len(), "SQ ring overrun");
        let slot = (self.end & self.mask) as usize;
        self.entries[slot] = e;
        self.end += 1;
    }
    /// The entry of WQE `idx` (`head() <= idx < end()`).
    #[inline]
    pub(crate) fn get(&self, idx: u64) -> &SqEntry {
        debug_assert!((self.head..self.end).contains(&idx), "SQ index {idx} outside {}..{}", self.head, self.end);
        &self.entries[(idx & self.mask) as usize]
    }
    #[inline]
    pub(crate) fn get_mut(&mut self, idx: u64) -> &mut SqEntry {
        debug_assert!((self.head..self.end).contains(&idx), "SQ index {idx} outside {}..{}", self.head, self.end);
        &mut self.entries[(idx & self.mask) as usize]
    }
    /// The oldest entry, if any.
    #[inline]
    pub(crate) fn front(&self) -> Option<&SqEntry> {
        (self.head != self.end).then(|| self.get(self.head))
    }
    /// Drop the oldest entry, returning a copy of it.
    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<SqEntry> {
        let e = *self.front()?;
        self.head += 1;
        Some(e)
    }
    /// Drop every entry and restart the indices at 0 (a QP reset).
    pub(crate) fn clear(&mut self) {
        self.head = 0;
        self.end = 0;
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = &SqEntry> + '_ {
        (self.head..self.end).map(|i| self.get(i))
    }
}

/// The SQ's side arrays: per slot (absolute WQE index modulo the slot count, the SQ depth
/// rounded up to a power of two) the gather list,
/// the inline bytes and, on UD, the destination. Sized once from the QP's capabilities; a
/// slot is written by `post_send` and read until the WQE retires (the SQ never holds more
/// than `max_send_wr` WQEs, so a live slot is never reused).
#[derive(Debug)]
pub(crate) struct SqSide {
    /// Slots − 1 (the slot count is a power of two).
    mask: u64,
    sge_stride: usize,
    inline_stride: usize,
    sges: Box<[Sge]>,
    inline: Box<[u8]>,
    ud: Box<[Option<UdDest>]>,
}

impl SqSide {
    pub(crate) fn new(caps: &QpCaps, qp_type: QpType) -> SqSide {
        // A power of two of slots (at least the queue's depth): WQE `idx` is in slot
        // `idx & mask`, a mask where `idx % depth` was a 64-bit division, two or three per WQE.
        let depth = (caps.max_send_wr.max(1) as usize).next_power_of_two();
        let sge_stride = caps.max_send_sge as usize;
        let inline_stride = caps.max_inline_data as usize;
        SqSide {
            mask: depth as u64 - 1,
            sge_stride,
            inline_stride,
            sges: vec![Sge::default(); depth * sge_stride].into_boxed_slice(),
            inline: vec![0; depth * inline_stride].into_boxed_slice(),
            ud: vec![None; if qp_type == QpType::Ud { depth } else { 0 }].into_boxed_slice(),
        }
    }
    #[inline]
    fn slot(&self, idx: u64) -> usize {
        (idx & self.mask) as usize
    }
    /// Gather list of WQE `idx` (`n` entries, as its `SqEntry::num_sge` says).
    pub(crate) fn sges(&self, idx: u64, n: u8) -> &[Sge] {
        let at = self.slot(idx) * self.sge_stride;
        &self.sges[at..at + usize::from(n).min(self.sge_stride)]
    }
    /// Inline bytes of WQE `idx` (`n` of them).
    pub(crate) fn inline(&self, idx: u64, n: usize) -> &[u8] {
        let at = self.slot(idx) * self.inline_stride;
        &self.inline[at..at + n.min(self.inline_stride)]
    }
    /// UD destination of WQE `idx`.
    pub(crate) fn ud(&self, idx: u64) -> Option<&UdDest> {
        self.ud.get(self.slot(idx)).and_then(Option::as_ref)
    }
    /// Store the out-of-line parts of `w` (validated against the caps) at WQE `idx`'s slot:
    /// its inline bytes or its gather list, and on a UD QP its destination. Returns the sum of
    /// the gather entries' lengths (0 for inline).
    #[inline]
    pub(crate) fn store<W: SendWr + ?Sized>(&mut self, idx: u64, w: &W, inline: bool) -> u64 {
        let s = self.slot(idx);
        let mut gathered = 0;
        if inline {
            let b = w.inline();
            let at = s * self.inline_stride;
            pmrxe_crc::copy_short(&mut self.inline[at..at + b.len()], b);
        } else {
            let at = s * self.sge_stride;
            let n = w.num_sge();
            for (i, d) in self.sges[at..at + n].iter_mut().enumerate() {
                *d = w.sge(i);
                gathered += u64::from(d.len);
            }
        }
        // Only a UD QP has the array.
        if let Some(u) = self.ud.get_mut(s) {
            *u = w.ud();
        }
        gathered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wqe::{SendOp, SendWqe};

    /// A depth that is not a power of two gets the next one of slots: every window of `depth`
    /// consecutive WQE indices maps to distinct slots, so a live WQE's inline bytes and gather
    /// list survive the posts after it, across many laps of the ring.
    #[test]
    fn slots_of_a_window_never_collide() {
        for depth in [1u32, 3, 5, 7, 100, 128] {
            let caps = QpCaps { max_send_wr: depth, max_send_sge: 2, max_inline_data: 8, ..Default::default() };
            let mut side = SqSide::new(&caps, QpType::Rc);
            for idx in 0..20 * u64::from(depth) + 7 {
                let mut w = SendWqe::new(idx, SendOp::Send);
                w.inline_len = 8;
                w.inline[..8].copy_from_slice(&idx.to_le_bytes());
                side.store(idx, &w, true);
                // The oldest WQE still in a full queue is intact.
                let oldest = idx.saturating_sub(u64::from(depth) - 1);
                assert_eq!(side.inline(oldest, 8), &oldest.to_le_bytes(), "depth {depth} idx {idx}");
            }
        }
    }
}
