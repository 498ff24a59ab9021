//! Fixed-size entries and segment layouts shared between the shim and the service.
//!
//! Numeric values of opcodes, flags and statuses are the libibverbs ones (rdma-core 44
//! `verbs.h`), so the shim copies fields across without translation tables and the service
//! validates them in one place.
use crate::ring::{ring_bytes, Pod, Prefixed};
use crate::sync::{AtomicU32, AtomicU64};

/// Protocol/ABI version; the control handshake refuses a mismatch. (3: one padded doorbell
/// row per lcore, 64 lcores; 4: the need-wakeup flag in each row and the lcores' wake-up
/// eventfds at Hello.)
pub const ABI_VERSION: u32 = 4;

/// Multicast limits of every pmrxe device: reported by `ibv_query_device` and enforced by the
/// service (`ibv_attach_mcast` fails with ENOMEM beyond them).
pub struct McastLimits;

impl McastLimits {
    /// Groups with at least one attached QP, per device (`max_mcast_grp`).
    pub const GROUPS: u32 = 1024;
    /// QPs attached to one group (`max_mcast_qp_attach`; rxe's figure).
    pub const QPS_PER_GROUP: u32 = 56;
    /// Attachments on one device (`max_total_mcast_qp_attach`).
    pub const TOTAL: u32 = 4096;
    /// Attachments one client may hold on one device: a quarter of the total, so that no
    /// client can take every attachment from the others.
    pub const PER_CLIENT: u32 = Self::TOTAL / 4;
    /// Groups one client's QPs may be members of on one device: a quarter of the groups.
    pub const GROUPS_PER_CLIENT: u32 = Self::GROUPS / 4;
}

/// The QPN a multicast datagram carries (BTH destination QP 0xFFFFFF).
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;

/// Maximum scatter/gather entries in a send WQE.
pub const MAX_SEND_SGE: usize = 16;
/// Maximum scatter/gather entries in a receive WQE.
pub const MAX_RECV_SGE: usize = 8;
/// Bytes of the send WQE area shared by SGEs and inline data.
pub const WQE_DATA_BYTES: usize = MAX_SEND_SGE * 16;
/// Maximum inline data in a send WQE.
pub const MAX_INLINE_DATA: usize = WQE_DATA_BYTES;
/// Maximum poll-mode lcores of a service: a client page has one doorbell row per lcore (the
/// config refuses more lcores; a port has at most 64 queue pairs, one per lcore).
pub const MAX_LCORES: usize = 64;
/// Doorbell bitmap words per lcore (64 bits each): doorbell slots per lcore per client.
pub const DOORBELL_WORDS: usize = 32;
/// Doorbell slots per lcore per client.
pub const DOORBELL_SLOTS: usize = DOORBELL_WORDS * 64;

/// libibverbs `enum ibv_wr_opcode` values.
pub mod wr_opcode {
    pub const RDMA_WRITE: u32 = 0;
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    pub const SEND: u32 = 2;
    pub const SEND_WITH_IMM: u32 = 3;
    pub const RDMA_READ: u32 = 4;
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    pub const LOCAL_INV: u32 = 7;
    pub const BIND_MW: u32 = 8;
    pub const SEND_WITH_INV: u32 = 9;
    pub const TSO: u32 = 10;
    pub const DRIVER1: u32 = 11;
    /// pmrxe extension (pmrxedv): fast-register an MR (kernel IB_WR_REG_MR semantics).
    pub const PMRXE_REG_MR: u32 = 0x100;
}

/// libibverbs `enum ibv_send_flags` values.
pub mod send_flags {
    pub const FENCE: u32 = 1;
    pub const SIGNALED: u32 = 2;
    pub const SOLICITED: u32 = 4;
    pub const INLINE: u32 = 8;
    pub const IP_CSUM: u32 = 16;
}

/// One scatter/gather element (`struct ibv_sge` layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShmSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}
// SAFETY: repr(C) of integers.
unsafe impl Pod for ShmSge {}

/// A send work request as posted by the client. 352 bytes.
///
/// Field use by opcode:
/// * all: `wr_id`, `opcode`, `send_flags`;
/// * SEND/WRITE/READ/atomics: `num_sge` + `data` as SGEs, or inline bytes (`inline_len`) when
///   `send_flags & INLINE`; `imm_or_inv` carries the immediate (network order as the app gave
///   it) or the rkey to invalidate;
/// * WRITE/READ/atomics: `remote_addr`, `rkey`; atomics: `compare_add`, `swap`;
/// * UD: `ah`, `remote_qpn`, `remote_qkey`;
/// * LOCAL_INV: `imm_or_inv` = key;
/// * PMRXE_REG_MR: `mr_key` (the MR), `new_key`, `access`, `remote_addr` = iova, `length`
///   (0 = keep the mapped length), `send_flags`;
/// * BIND_MW: `mr_key` = bound MR lkey, `mw_key` = the MW, `new_key` = new rkey, `remote_addr`
///   = addr, `length`, `access`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ShmSendWqe {
    pub wr_id: u64,
    pub opcode: u32,
    pub send_flags: u32,
    pub num_sge: u32,
    pub inline_len: u32,
    pub imm_or_inv: u32,
    pub rkey: u32,
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub length: u64,
    pub ah: u32,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    pub mr_key: u32,
    pub mw_key: u32,
    pub new_key: u32,
    pub access: u32,
    pub _reserved: u32,
    pub data: [u8; WQE_DATA_BYTES],
}
// SAFETY: repr(C) of integers and a byte array.
unsafe impl Pod for ShmSendWqe {}
// SAFETY: `data` starts at 96 (a multiple of 8), the struct is 352 bytes, 8-aligned (u64s).
unsafe impl Prefixed for ShmSendWqe {
    const HEAD: usize = core::mem::offset_of!(ShmSendWqe, data);
    fn live_tail(&self) -> usize {
        if self.send_flags & send_flags::INLINE != 0 {
            self.inline_len as usize
        } else {
            self.num_sge as usize * 16
        }
    }
}

impl Default for ShmSendWqe {
    fn default() -> Self {
        // SAFETY: all-zero is a valid value of a Pod struct.
        unsafe { core::mem::zeroed() }
    }
}

impl ShmSendWqe {
    /// The SGE at `i` (`i < MAX_SEND_SGE`).
    pub fn sge(&self, i: usize) -> ShmSge {
        let o = i * 16;
        let b = &self.data[o..o + 16];
        ShmSge {
            addr: u64::from_ne_bytes(b[0..8].try_into().unwrap()),
            length: u32::from_ne_bytes(b[8..12].try_into().unwrap()),
            lkey: u32::from_ne_bytes(b[12..16].try_into().unwrap()),
        }
    }
    /// Store the SGE at `i` (`i < MAX_SEND_SGE`).
    pub fn set_sge(&mut self, i: usize, s: ShmSge) {
        let o = i * 16;
        self.data[o..o + 8].copy_from_slice(&s.addr.to_ne_bytes());
        self.data[o + 8..o + 12].copy_from_slice(&s.length.to_ne_bytes());
        self.data[o + 12..o + 16].copy_from_slice(&s.lkey.to_ne_bytes());
    }
}

/// A receive work request. 144 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ShmRecvWqe {
    pub wr_id: u64,
    pub num_sge: u32,
    pub _reserved: u32,
    pub sge: [ShmSge; MAX_RECV_SGE],
}
// SAFETY: repr(C) of integers.
unsafe impl Pod for ShmRecvWqe {}
// SAFETY: `sge` starts at 16, the struct is 144 bytes, 8-aligned (u64s).
unsafe impl Prefixed for ShmRecvWqe {
    const HEAD: usize = core::mem::offset_of!(ShmRecvWqe, sge);
    fn live_tail(&self) -> usize {
        self.num_sge as usize * core::mem::size_of::<ShmSge>()
    }
}

/// A completion as the client reads it (field meanings as `struct ibv_wc`). 64 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShmCqe {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Immediate data (network order as on the wire) or the invalidated rkey.
    pub imm_or_inv: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
    pub _reserved: [u8; 18],
}
// SAFETY: repr(C) of integers.
unsafe impl Pod for ShmCqe {}

impl ShmCqe {
    /// The completion as its eight little-endian 64-bit words, in slot order (what
    /// [`crate::ring::Producer::stage_words`] stores, one word at a time, straight from
    /// registers). Reserved bytes are zero.
    #[inline]
    pub fn to_words(&self) -> [u64; 8] {
        const { assert!(cfg!(target_endian = "little")) };
        let w = |lo: u32, hi: u32| u64::from(lo) | u64::from(hi) << 32;
        [
            self.wr_id,
            w(self.status, self.opcode),
            w(self.vendor_err, self.byte_len),
            w(self.imm_or_inv, self.qp_num),
            w(self.src_qp, self.wc_flags),
            u64::from(self.pkey_index) | u64::from(self.slid) << 16 | u64::from(self.sl) << 32 | u64::from(self.dlid_path_bits) << 40,
            0,
            0,
        ]
    }
}

const _: () = assert!(core::mem::size_of::<ShmSendWqe>() == 352);
const _: () = assert!(core::mem::size_of::<ShmRecvWqe>() == 144);
const _: () = assert!(core::mem::size_of::<ShmCqe>() == 64);

/// Where the rings of a QP live inside its segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QpSegmentLayout {
    pub sq_offset: u64,
    pub sq_capacity: u32,
    pub rq_offset: u64,
    /// 0 when the QP uses an SRQ.
    pub rq_capacity: u32,
    pub total_len: u64,
}

impl QpSegmentLayout {
    /// Bytes of the [`QpShared`] header at the start of a QP segment (the rings follow).
    pub const HEADER: u64 = 64;

    /// Layout for the given ring capacities (powers of two; `rq_capacity` may be 0).
    pub fn new(sq_capacity: u32, rq_capacity: u32) -> Self {
        let sq_len = ring_bytes::<ShmSendWqe>(sq_capacity) as u64;
        let rq_len = if rq_capacity == 0 { 0 } else { ring_bytes::<ShmRecvWqe>(rq_capacity) as u64 };
        let total = page_round(Self::HEADER + sq_len + rq_len);
        QpSegmentLayout { sq_offset: Self::HEADER, sq_capacity, rq_offset: Self::HEADER + sq_len, rq_capacity, total_len: total }
    }
}

/// State shared by the client and the service at the start of a QP segment.
///
/// A receive WQE occupies the receive queue from `ibv_post_recv` until its completion (success
/// or flush), not just while it sits in the ring: the service moves WQEs from the ring into the
/// engine's queue as it drains it. So the client counts what it posted and the service counts
/// what it completed; the difference is the queue's occupancy, which `ibv_post_recv` keeps at or
/// below the `max_recv_wr` the QP reported (ENOMEM beyond, as hardware does).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct QpShared {
    /// Receive WQEs completed into the CQ (service increments, wrapping).
    pub rq_retired: AtomicU32,
}

/// Notification state at the start of a CQ segment (the ring follows at
/// [`CqSegmentLayout::ring_offset`]).
#[repr(C, align(64))]
pub struct CqNotify {
    /// 0 = not armed, 1 = next completion, 2 = solicited only. Written by the client
    /// (req_notify_cq), swapped to 0 by the service when it fires an event.
    pub armed: AtomicU32,
    /// Events fired (service increments).
    pub events: AtomicU32,
    /// Set by the service when the CQ overflowed (the client reports it).
    pub overflow: AtomicU32,
}

/// The CQ arm/notify protocol, both sides. It is a Dekker pair: the client stores `armed` and
/// then reads the ring's producer index (its next poll); the service publishes the ring's
/// producer index and then reads `armed`. Each side's store must be globally visible before
/// its load, or both can miss each other (x86 lets a load pass an earlier store to another
/// location): the application then sleeps on its channel with a completion in the ring and no
/// event coming. So both sides put a full fence between the two; with it, either the service
/// sees the arm and fires, or the client's poll sees the completion.
/// (`dataplane/abi/tests/loom.rs`, `loom_cq_arm_never_misses_a_completion`.)
impl CqNotify {
    /// Client side (`ibv_req_notify_cq`): arm for the next completion, or for the next
    /// solicited one (which "next completion" already covers: an existing arm is not
    /// narrowed). The full fence orders the arm before the caller's next poll of the ring.
    #[inline]
    pub fn arm(&self, solicited_only: bool) {
        use crate::sync::Ordering;
        if solicited_only {
            let _ = self.armed.compare_exchange(0, 2, Ordering::AcqRel, Ordering::Relaxed);
        } else {
            self.armed.store(1, Ordering::SeqCst);
        }
        crate::sync::fence(Ordering::SeqCst);
    }

    /// Service side, after [`Producer::publish`](crate::ring::Producer::publish) of this CQ's
    /// new completions and one [`CqNotify::fence_after_publish`] (one fence serves every CQ
    /// published in the same pass): disarm and count an event if the client had armed. True:
    /// the caller signals the CQ's completion channel.
    #[inline]
    pub fn take_armed(&self) -> bool {
        use crate::sync::Ordering;
        if self.armed.load(Ordering::Relaxed) != 0 && self.armed.swap(0, Ordering::AcqRel) != 0 {
            self.events.fetch_add(1, Ordering::Release);
            return true;
        }
        false
    }

    /// Service side: the full fence between publishing completions and reading `armed`
    /// ([`CqNotify::take_armed`]).
    #[inline]
    pub fn fence_after_publish() {
        crate::sync::fence(crate::sync::Ordering::SeqCst);
    }
}

/// Where the ring of a CQ lives inside its segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CqSegmentLayout {
    pub ring_offset: u64,
    pub capacity: u32,
    pub total_len: u64,
}

impl CqSegmentLayout {
    /// Layout for a CQ ring of `capacity` entries (a power of two).
    pub fn new(capacity: u32) -> Self {
        let ring = ring_bytes::<ShmCqe>(capacity) as u64;
        CqSegmentLayout { ring_offset: 64, capacity, total_len: page_round(64 + ring) }
    }
}

/// Layout of an SRQ segment: one receive ring at offset 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SrqSegmentLayout {
    pub capacity: u32,
    pub total_len: u64,
}

impl SrqSegmentLayout {
    /// Layout for an SRQ ring of `capacity` entries (a power of two).
    pub fn new(capacity: u32) -> Self {
        SrqSegmentLayout { capacity, total_len: page_round(ring_bytes::<ShmRecvWqe>(capacity) as u64) }
    }
}

/// The doorbells of one client for one lcore. The summary word has a cache line of its own: it
/// is what the lcore polls every iteration, and no other lcore's row shares its line.
#[repr(C, align(64))]
pub struct DoorbellRow {
    /// Bit `w` set = doorbell word `w` may be non-zero: one load tells the lcore whether this
    /// client rang anything at all.
    /// Bit [`SUMMARY_SLEEPING`] is the need-wakeup flag (as AF_XDP's `XDP_USE_NEED_WAKEUP`
    /// and io_uring SQPOLL's `IORING_SQ_NEED_WAKEUP`): set while the lcore sleeps, see
    /// [`ClientPage::ring`].
    pub summary: AtomicU64,
    pub _pad: [u64; 7],
    /// Bit `slot % 64` of word `slot / 64`: a queue with doorbell `slot` has new WQEs.
    pub words: [AtomicU64; DOORBELL_WORDS],
}

/// The per-client page: doorbells. The client sets bit `slot` of lcore `lcore`'s row (a
/// `fetch_or` with release ordering) after publishing WQEs on an SQ, RQ or SRQ; the owning
/// lcore swaps each non-zero word to 0 and services exactly those queues, so an idle lcore
/// never scans every QP. One row per possible lcore ([`MAX_LCORES`]).
#[repr(C, align(64))]
pub struct ClientPage {
    pub magic: u32,
    pub version: u32,
    /// Set to 1 by the service when it is shutting down (the shim reports errors instead of
    /// posting into a dead service).
    pub service_down: AtomicU32,
    pub _pad: [u32; 13],
    pub rows: [DoorbellRow; MAX_LCORES],
}

/// Magic of a [`ClientPage`] ("PMRC").
pub const CLIENT_PAGE_MAGIC: u32 = 0x504d_5243;
/// Size of the client page segment (page rounded).
pub const CLIENT_PAGE_LEN: u64 = (core::mem::size_of::<ClientPage>() as u64 + 4095) & !4095;
const _: () = assert!(core::mem::size_of::<DoorbellRow>() == 64 + 8 * DOORBELL_WORDS);
const _: () = assert!(core::mem::size_of::<ClientPage>() <= CLIENT_PAGE_LEN as usize);

/// Where a queue's doorbell is: lcore index and bit slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Doorbell {
    pub lcore: u16,
    pub slot: u16,
}

impl ClientPage {
    /// Lcore `lcore`'s doorbell row (lcore side; `lcore < MAX_LCORES`, which the config
    /// guarantees).
    #[inline]
    pub fn row(&self, lcore: usize) -> &DoorbellRow {
        &self.rows[lcore]
    }

    /// Ring a doorbell (client side). Returns true when the lcore sleeps and the caller must
    /// signal its wake-up eventfd (once; [`crate::client::Connection::ring`] does).
    ///
    /// The need-wakeup flag lives in the summary word itself ([`SUMMARY_SLEEPING`]), so the
    /// protocol is two read-modify-writes of one location, totally ordered: the client's
    /// `fetch_or` of its summary bit returns the word as it was; the lcore's `fetch_or` of the
    /// flag ([`DoorbellRow::sleep_begin`]) returns it too. Whichever comes second sees the
    /// other: the client sees the flag and wakes the lcore, or the lcore sees the doorbell and
    /// does not sleep. No fence, no extra load: while the lcore is awake the post path is the
    /// two `fetch_or`s it always was (the summary's now returns its old value) and a bit test.
    /// (`dataplane/abi/tests/loom.rs`, `loom_need_wakeup_never_loses_a_post`.)
    #[inline]
    pub fn ring(&self, db: Doorbell) -> bool {
        let Some(row) = self.rows.get(db.lcore as usize) else {
            debug_assert!(false, "doorbell of lcore {} >= MAX_LCORES", db.lcore);
            return false;
        };
        row.ring(db.slot as usize)
    }
}

/// Bit of [`DoorbellRow::summary`] the lcore sets while it sleeps (above the doorbell-word
/// bits, `DOORBELL_WORDS <= 63`).
pub const SUMMARY_SLEEPING: u64 = 1 << 63;
const _: () = assert!(DOORBELL_WORDS < 63);

impl DoorbellRow {
    /// Ring doorbell `slot` of this row (client side; see [`ClientPage::ring`]). Returns true
    /// when the caller must wake the lcore.
    #[inline]
    pub fn ring(&self, slot: usize) -> bool {
        let slot = slot % DOORBELL_SLOTS;
        self.words[slot / 64].fetch_or(1u64 << (slot % 64), crate::sync::Ordering::Release);
        // After the doorbell bit: an lcore that clears the summary and then reads the word
        // sees the bit, or sees the summary bit again on its next pass.
        let old = self.summary.fetch_or(1u64 << (slot / 64), crate::sync::Ordering::Release);
        old & SUMMARY_SLEEPING != 0 && self.claim_wake()
    }

    /// Lcore side: take every doorbell rung since the last call and call `rung(slot)` for each,
    /// in slot order. The summary is looked at with a plain load first (the lcore polls every
    /// row every pass; an untouched row costs one load), swapped to 0 when non-zero, then each
    /// word it names is swapped to 0: a bit rung after the summary swap sets the summary again,
    /// so it is taken on the next call. The sleep flag is left alone. Returns whether any
    /// doorbell word was named.
    #[inline]
    pub fn take(&self, mut rung: impl FnMut(usize)) -> bool {
        use crate::sync::Ordering;
        if self.summary.load(Ordering::Relaxed) & !SUMMARY_SLEEPING == 0 {
            return false;
        }
        let mut words = self.summary.fetch_and(SUMMARY_SLEEPING, Ordering::Acquire) & ((1u64 << DOORBELL_WORDS) - 1);
        let any = words != 0;
        while words != 0 {
            let w = words.trailing_zeros() as usize;
            words &= words - 1;
            let mut bits = self.words[w].swap(0, Ordering::Acquire);
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                rung(w * 64 + b);
            }
        }
        any
    }

    /// Client side, having seen the flag: claim the wake-up (clear the flag) so that only
    /// one of several posters makes the system call. True: the caller signals the lcore.
    #[cold]
    fn claim_wake(&self) -> bool {
        self.summary.fetch_and(!SUMMARY_SLEEPING, crate::sync::Ordering::Relaxed) & SUMMARY_SLEEPING != 0
    }

    /// Lcore side: announce a sleep. Returns true if a doorbell is pending (rung since the
    /// lcore last swapped the summary): then it must not sleep ([`DoorbellRow::sleep_end`],
    /// and poll). False: any later doorbell sees the flag and signals the lcore's eventfd.
    #[inline]
    pub fn sleep_begin(&self) -> bool {
        self.summary.fetch_or(SUMMARY_SLEEPING, crate::sync::Ordering::AcqRel) & !SUMMARY_SLEEPING != 0
    }

    /// Lcore side: awake again (posts need no signal).
    #[inline]
    pub fn sleep_end(&self) {
        self.summary.fetch_and(!SUMMARY_SLEEPING, crate::sync::Ordering::Relaxed);
    }

    /// Client side: the lcore has not run since it announced a sleep — it sleeps, or was woken
    /// (by anyone: another client's post, a frame) and waits for a CPU. A client whose rung
    /// doorbell claimed the wake-up sees its own row cleared at once.
    #[inline]
    pub fn lcore_sleeping(&self) -> bool {
        self.summary.load(crate::sync::Ordering::Relaxed) & SUMMARY_SLEEPING != 0
    }
}

fn page_round(n: u64) -> u64 {
    (n + 4095) & !4095
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::Ordering;

    #[test]
    fn sge_accessors_round_trip() {
        let mut w = ShmSendWqe::default();
        for i in 0..MAX_SEND_SGE {
            w.set_sge(i, ShmSge { addr: 0x1000 * i as u64 + 7, length: i as u32 * 3, lkey: 0xabcd00 + i as u32 });
        }
        for i in 0..MAX_SEND_SGE {
            assert_eq!(w.sge(i), ShmSge { addr: 0x1000 * i as u64 + 7, length: i as u32 * 3, lkey: 0xabcd00 + i as u32 });
        }
    }

    /// What a polling client reads to decide whether to yield its CPU: its row says the lcore
    /// sleeps from `sleep_begin` until the lcore runs again (`sleep_end`), whoever woke it; a
    /// client whose doorbell claimed the wake-up stops seeing it at once, the others keep
    /// seeing it until the lcore runs.
    #[test]
    fn a_client_sees_the_lcore_asleep_until_it_runs_again() {
        // SAFETY: all-zero bytes are a valid ClientPage (integers and atomics).
        let pages: Vec<Box<ClientPage>> = (0..2).map(|_| unsafe { Box::new_zeroed().assume_init() }).collect();
        let (a, b) = (pages[0].row(0), pages[1].row(0));
        assert!(!a.lcore_sleeping() && !b.lcore_sleeping());
        assert!(!a.sleep_begin() && !b.sleep_begin(), "no doorbell pending: the lcore sleeps");
        assert!(a.lcore_sleeping() && b.lcore_sleeping());
        assert!(pages[0].ring(Doorbell { lcore: 0, slot: 5 }), "client A's post claims the wake-up");
        assert!(!a.lcore_sleeping(), "A woke it: A does not wait on it");
        assert!(b.lcore_sleeping(), "B's row still says asleep: the woken lcore has not run");
        a.sleep_end();
        b.sleep_end();
        assert!(!a.lcore_sleeping() && !b.lcore_sleeping(), "running again");
        assert!(a.take(|_| {}), "A's doorbell is still there for the lcore");
    }

    /// Issue 15: with `MAX_LCORES = 4` the doorbells of lcore k and k + 4 landed in the same
    /// words (`lcore % 4`), so lcore k + 4 never saw its queues' doorbells. Every lcore now has
    /// its own row.
    #[test]
    fn every_lcore_has_its_own_doorbell_row() {
        // SAFETY: all-zero bytes are a valid ClientPage (integers and atomics), as the
        // service's fresh zeroed segment is.
        let page: Box<ClientPage> = unsafe { Box::new_zeroed().assume_init() };
        assert_eq!(CLIENT_PAGE_LEN % 4096, 0);
        assert!(core::mem::size_of::<ClientPage>() as u64 <= CLIENT_PAGE_LEN);
        for lc in [0usize, 3, 4, 5, 8, 63] {
            page.ring(Doorbell { lcore: lc as u16, slot: 130 });
        }
        for lc in 0..MAX_LCORES {
            let rung = [0, 3, 4, 5, 8, 63].contains(&lc);
            let row = page.row(lc);
            let (s, w) = (row.summary.load(Ordering::Relaxed), row.words[2].load(Ordering::Relaxed));
            assert_eq!((s, w), if rung { (1 << 2, 1 << 2) } else { (0, 0) }, "lcore {lc}");
            assert!(row.words.iter().enumerate().all(|(i, x)| i == 2 || x.load(Ordering::Relaxed) == 0));
        }
        // Summaries of different lcores never share a cache line.
        let a = &page.row(0).summary as *const _ as usize;
        let b = &page.row(1).summary as *const _ as usize;
        assert!(b - a >= 64 && a.is_multiple_of(64) && b.is_multiple_of(64));
    }

    #[test]
    fn layouts_are_page_rounded_and_disjoint() {
        let l = QpSegmentLayout::new(128, 512);
        // The QpShared header comes first, the rings after it.
        assert!(core::mem::size_of::<QpShared>() as u64 <= QpSegmentLayout::HEADER);
        assert_eq!(l.sq_offset, QpSegmentLayout::HEADER);
        assert_eq!(l.rq_offset, QpSegmentLayout::HEADER + ring_bytes::<ShmSendWqe>(128) as u64);
        assert!(l.rq_offset + ring_bytes::<ShmRecvWqe>(512) as u64 <= l.total_len);
        assert_eq!(l.total_len % 4096, 0);
        let c = CqSegmentLayout::new(256);
        assert!(c.ring_offset as usize >= core::mem::size_of::<CqNotify>());
    }
}

#[cfg(test)]
mod cqe_words_tests {
    use super::*;

    /// The words are the struct's bytes: every field distinct, reserved bytes zero.
    #[test]
    fn cqe_words_are_the_struct_layout() {
        let c = ShmCqe {
            wr_id: 0x0102_0304_0506_0708,
            status: 0x1112_1314,
            opcode: 0x2122_2324,
            vendor_err: 0x3132_3334,
            byte_len: 0x4142_4344,
            imm_or_inv: 0x5152_5354,
            qp_num: 0x6162_6364,
            src_qp: 0x7172_7374,
            wc_flags: 0x8182_8384,
            pkey_index: 0x9192,
            slid: 0xa1a2,
            sl: 0xb1,
            dlid_path_bits: 0xc1,
            _reserved: [0; 18],
        };
        let mut bytes = [0u8; 64];
        // SAFETY: ShmCqe is 64 bytes of plain integers (Pod).
        unsafe { core::ptr::copy_nonoverlapping((&c as *const ShmCqe).cast::<u8>(), bytes.as_mut_ptr(), 64) };
        let from_words: Vec<u8> = c.to_words().iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(from_words, bytes.to_vec());
    }
}
