//! The lcore test rig shared by tests/congestion.rs and tests/fastpath.rs: one client with its
//! page, two CQs (10, 11), two connected RC QPs (0x11 on device 0 ↔ 0x12 on device 1, each on
//! its own CQ, 256-entry rings) and two 1 MiB MRs (source at iova 0x10_0000 filled with 0xab,
//! destination at 0x20_0000), set up through the lcore's commands exactly as the service does.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam::channel::{bounded, Receiver};
use pmrxe_abi::ctrl::AsyncEvent;
use pmrxe_abi::ring::{init_ring, Consumer, Producer};
use pmrxe_abi::{send_flags, wr_opcode, ClientPage, CqSegmentLayout, Doorbell, QpSegmentLayout, ShmCqe, ShmRecvWqe, ShmSendWqe, ShmSge, SrqSegmentLayout, CLIENT_PAGE_LEN};
use pmrxe_mem::{Access, Key, MemLimits, MemTable, Region};
use pmrxe_runtime::lcore::{Cmd, DeviceConfig, Lcore, LcoreHandle, QpSetup};
use pmrxe_port::{ArrayVec, MacAddr, Port, SimBuf};
use pmrxe_runtime::neigh::ip_to_gid;
use pmrxe_runtime::shm::Segment;
use pmrxe_transport::sim::PairParams;
use pmrxe_transport::{Instant, Qp, QpType, Srq, SrqAttr};

/// What [`rig`] set up; every segment stays alive as long as its ring handle.
pub struct Rig {
    /// The client page (doorbells): see [`client_page`].
    pub page: Arc<Segment>,
    /// The client's async-event queue (kept open for the lcore).
    pub events: Receiver<AsyncEvent>,
    /// CQ 10 (QP 0x11's) and CQ 11 (QP 0x12's).
    pub cq_rings: Vec<(Arc<Segment>, Consumer<ShmCqe>)>,
    /// The send queues of QP 0x11 (doorbell slot 0) and QP 0x12 (slot 1).
    pub sqs: Vec<(Arc<Segment>, Producer<ShmSendWqe>)>,
    /// Source MR (iova 0x10_0000, 1 MiB of 0xab).
    pub lkey: Key,
    /// Destination MR (iova 0x20_0000, 1 MiB, remote write).
    pub rkey: Key,
    /// The destination memory.
    pub dst: Region,
    /// With an SRQ: the SRQ QP 0x12 receives from (doorbell slot 2) and its ring.
    pub srq: Option<(Arc<Segment>, Producer<ShmRecvWqe>)>,
}

/// Set the rig up on lcore `lc` (devices 0 and 1 with addresses `ips`); `up` brings each QP
/// from RESET to RTS towards its peer (QPN, GID). With `srq`, QP 0x12 receives from that SRQ
/// (256 entries, doorbell slot 2) instead of its own receive queue.
pub fn rig<L: Port>(
    lc: &mut Lcore<L>,
    h: &LcoreHandle,
    mem: &MemTable,
    ips: [IpAddr; 2],
    p: &PairParams,
    up: impl Fn(&mut Qp, u32, [u8; 16], &PairParams),
    srq: Option<u32>,
) -> Rig {
    let [ip0, ip1] = ips;
    let page = Arc::new(Segment::create("page", CLIENT_PAGE_LEN as usize).unwrap());
    let (etx, events) = bounded(16);
    h.cmds.send(Cmd::AddClient { client: 1, page: page.clone(), events: etx, events_fd: None }).unwrap();
    let mut cq_rings = Vec::new();
    for cq in [10u32, 11] {
        let layout = CqSegmentLayout::new(1024);
        let seg = Arc::new(Segment::create("cq", layout.total_len as usize).unwrap());
        // SAFETY: fresh segment laid out by `layout`.
        unsafe { init_ring::<ShmCqe>(seg.as_ptr().add(layout.ring_offset as usize), 1024).unwrap() };
        // SAFETY: the ring was just initialised; `seg` outlives the consumer (kept in the vec).
        let c = unsafe { Consumer::<ShmCqe>::attach(seg.as_ptr().add(layout.ring_offset as usize), seg.len() - 64, 1024).unwrap() };
        let (tx, rx) = bounded(1);
        h.cmds.send(Cmd::AddCq { cq, client: 1, seg: seg.clone(), layout, channel: None, done: tx }).unwrap();
        lc.poll_once(Instant(0));
        rx.recv().unwrap().unwrap();
        cq_rings.push((seg, c));
    }
    let srq_ring = srq.map(|srqn| {
        let layout = SrqSegmentLayout::new(256);
        let seg = Arc::new(Segment::create("srq", layout.total_len as usize).unwrap());
        // SAFETY: fresh segment laid out by `layout`.
        unsafe { init_ring::<ShmRecvWqe>(seg.as_ptr(), 256).unwrap() };
        // SAFETY: as above; `seg` is returned beside the producer.
        let prod = unsafe { Producer::<ShmRecvWqe>::attach(seg.as_ptr(), seg.len(), 256).unwrap() };
        let s = Srq::new(srqn, SrqAttr { max_wr: 256, max_sge: 4, srq_limit: 0 }).unwrap();
        let (tx, rx) = bounded(1);
        h.cmds.send(Cmd::AddSrq { srq: Box::new(s), client: 1, seg: seg.clone(), layout, db_slot: 2, done: tx }).unwrap();
        lc.poll_once(Instant(0));
        rx.recv().unwrap().unwrap();
        (seg, prod)
    });
    let pd = p.pd;
    let mut sqs = Vec::new();
    for (dev, qpn, peer, peer_ip, cq) in [(0u32, 0x11u32, 0x12u32, ip1, 10u32), (1, 0x12, 0x11, ip0, 11)] {
        let mut qp = Qp::new(qpn, QpType::Rc, pd, p.caps, if qpn == 0x12 { srq } else { None }).unwrap();
        up(&mut qp, peer, ip_to_gid(peer_ip), p);
        let layout = QpSegmentLayout::new(256, 256);
        let seg = Arc::new(Segment::create("qp", layout.total_len as usize).unwrap());
        // SAFETY: fresh segment laid out by `layout`.
        unsafe {
            init_ring::<ShmSendWqe>(seg.as_ptr().add(layout.sq_offset as usize), 256).unwrap();
            init_ring::<ShmRecvWqe>(seg.as_ptr().add(layout.rq_offset as usize), 256).unwrap();
        }
        // SAFETY: as above; `seg` is kept alive in `sqs`.
        let prod = unsafe {
            Producer::<ShmSendWqe>::attach(seg.as_ptr().add(layout.sq_offset as usize), (layout.rq_offset - layout.sq_offset) as usize, 256).unwrap()
        };
        let (tx, rx) = bounded(1);
        let setup = QpSetup { qp, client: 1, device: dev, seg: seg.clone(), layout, send_cq: cq, recv_cq: cq, db_slot: dev as u16 };
        h.cmds.send(Cmd::AddQp { setup: Box::new(setup), done: tx }).unwrap();
        lc.poll_once(Instant(0));
        rx.recv().unwrap().unwrap();
        sqs.push((seg, prod));
    }
    // Source and destination memory, registered like the service does.
    let src = Region::zeroed(1 << 20);
    src.fill(0, 1 << 20, 0xab).unwrap();
    let dst = Region::zeroed(1 << 20);
    let lkey = mem.reg_mr(pd, src, 0x10_0000, Access::LOCAL_WRITE).unwrap();
    let rkey = mem.reg_mr(pd, dst.clone(), 0x20_0000, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    Rig { page, events, cq_rings, sqs, lkey, rkey, dst, srq: srq_ring }
}

/// The producer of a rig QP's own receive ring (the rig hands out only the send rings);
/// `seg` is that QP's segment (`Rig::sqs[i].0`), which must outlive the producer.
pub fn own_rq(seg: &Segment) -> Producer<ShmRecvWqe> {
    let layout = QpSegmentLayout::new(256, 256);
    // SAFETY: the rig initialised the receive ring at `rq_offset` of this segment; the caller
    // keeps the segment mapped for the producer's lifetime.
    unsafe { Producer::<ShmRecvWqe>::attach(seg.as_ptr().add(layout.rq_offset as usize), (layout.total_len - layout.rq_offset) as usize, 256).unwrap() }
}

/// QP 0x11 posts a signaled 8-byte SEND (wr_id 7) of the source MR (`lkey`, 0xab bytes) and
/// rings; one lcore pass at `now` puts it on the wire towards device 1 (`to_dev1`).
pub fn send_8_bytes<L: Port>(lc: &mut Lcore<L>, page: &ClientPage, sq: &mut Producer<ShmSendWqe>, lkey: Key, to_dev1: &Wire, now: Instant) {
    let mut send = ShmSendWqe { wr_id: 7, opcode: wr_opcode::SEND, send_flags: send_flags::SIGNALED, num_sge: 1, ..Default::default() };
    send.set_sge(0, ShmSge { addr: 0x10_0000, length: 8, lkey: lkey.0 });
    sq.push(send).unwrap();
    page.ring(Doorbell { lcore: 0, slot: 0 });
    lc.poll_once(now);
    assert_eq!(lock(to_dev1).len(), 1, "the SEND is on the wire");
}

/// QP 0x11 posts a signaled 64 KiB RDMA WRITE (`wr_id`) from the source MR's `src_off` to the
/// destination MR's `dst_off` and rings; the next lcore pass puts it on device 0's wire.
pub fn post_write_64k(r: &mut Rig, wr_id: u64, src_off: u64, dst_off: u64) {
    let mut w = ShmSendWqe { wr_id, opcode: wr_opcode::RDMA_WRITE, send_flags: send_flags::SIGNALED, num_sge: 1, remote_addr: 0x20_0000 + dst_off, rkey: r.rkey.0, ..Default::default() };
    w.set_sge(0, ShmSge { addr: 0x10_0000 + src_off, length: 65536, lkey: r.lkey.0 });
    r.sqs[0].1.push(w).unwrap();
    client_page(&r.page).ring(Doorbell { lcore: 0, slot: 0 });
}

/// Poll `lc` until `cq` has a completion (at most 200 passes, `now` advanced 2 µs before each);
/// returns it, or panics with the lcore's counters.
pub fn poll_completion<L: Port>(lc: &mut Lcore<L>, h: &LcoreHandle, cq: &mut Consumer<ShmCqe>, now: &mut u64) -> ShmCqe {
    for _ in 0..200 {
        *now += 2_000;
        lc.poll_once(Instant(*now));
        if let Some(c) = cq.pop().unwrap() {
            return c;
        }
    }
    panic!("no completion: {:?}", h.stats.snapshot())
}

/// An lcore serving two devices (0: 198.18.0.1, 1: 198.18.0.2, MTU 9000, busy idle mode) on
/// [`QueuePort`]s wired back to back: what device 0 sends, device 1 receives, and the reverse.
pub struct Pair {
    pub lc: Lcore<QueuePort>,
    pub h: LcoreHandle,
    pub mem: Arc<MemTable>,
    pub ips: [IpAddr; 2],
    /// Frames device 1 will receive (device 0's transmit queue), and the reverse.
    pub to_dev1: Wire,
    pub to_dev0: Wire,
}

/// Build a [`Pair`] whose ports make buffers with `new_buf`.
pub fn lcore_pair(new_buf: fn() -> SimBuf) -> Pair {
    let (q0, q1) = (wire(), wire());
    let l0 = QueuePort { rx: q0.clone(), tx: q1.clone(), new_buf };
    let l1 = QueuePort { rx: q1.clone(), tx: q0.clone(), new_buf };
    let ip0: IpAddr = "198.18.0.1".parse().unwrap();
    let ip1: IpAddr = "198.18.0.2".parse().unwrap();
    let (mac0, mac1) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let d0 = DeviceConfig { index: 0, mac: mac0, gids: vec![ip_to_gid(ip0)], mtu: 9000, ..Default::default() };
    let d1 = DeviceConfig { index: 1, mac: mac1, gids: vec![ip_to_gid(ip1)], mtu: 9000, ..Default::default() };
    let mem = Arc::new(MemTable::new(MemLimits::default()));
    let idle = pmrxe_config::IdleConfig { mode: pmrxe_config::IdleMode::Busy, ..Default::default() };
    let (lc, h) = Lcore::new(0, vec![(l0, d0), (l1, d1)], mem.clone(), &[(ip0, mac0), (ip1, mac1)], idle, Arc::new(AtomicBool::new(false)), None);
    Pair { lc, h, mem, ips: [ip0, ip1], to_dev1: q1, to_dev0: q0 }
}

/// The [`ClientPage`] in a client page segment (what the lcore reads doorbells from).
pub fn client_page(page: &Segment) -> &ClientPage {
    // SAFETY: the page segment holds the ClientPage (CLIENT_PAGE_LEN bytes, page-aligned), and
    // the reference lives no longer than the segment.
    unsafe { &*(page.as_ptr() as *const ClientPage) }
}

/// One direction of the test's wire: frames the lcore sent, which the test reads, rewrites or
/// delays before putting them on the other port's receive queue.
pub type Wire = Arc<Mutex<VecDeque<SimBuf>>>;

/// An empty wire with room for 4096 frames (pushing within it does not allocate).
pub fn wire() -> Wire {
    Arc::new(Mutex::new(VecDeque::with_capacity(4096)))
}

/// Lock a wire (a test thread never panics while holding it; poisoning is ignored).
pub fn lock(w: &Wire) -> MutexGuard<'_, VecDeque<SimBuf>> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port over two wires the test owns: `rx_burst` takes from `rx`, `tx_burst` appends to
/// `tx` while it has room (a full wire pushes back like a full TX ring), and `alloc` makes a
/// buffer with `new_buf` (the allocation-counting test keeps its buffers out of the count).
pub struct QueuePort {
    pub rx: Wire,
    pub tx: Wire,
    pub new_buf: fn() -> SimBuf,
}

/// A 9 KiB frame buffer with mbuf-like headroom.
pub fn jumbo_buf() -> SimBuf {
    SimBuf::with_capacity(128 + 9100, 128)
}

impl Port for QueuePort {
    type Buf = SimBuf;
    fn port_id(&self) -> u16 {
        0
    }
    fn mac(&self) -> MacAddr {
        MacAddr([2, 0, 0, 0, 0, 0])
    }
    fn mtu(&self) -> u16 {
        9000
    }
    fn alloc(&mut self) -> Option<SimBuf> {
        Some((self.new_buf)())
    }
    fn rx_burst<const N: usize>(&mut self, out: &mut ArrayVec<SimBuf, N>) -> usize {
        let mut q = lock(&self.rx);
        let n = out.remaining_capacity().min(q.len());
        out.extend(q.drain(..n));
        n
    }
    fn tx_burst<const N: usize>(&mut self, bufs: &mut ArrayVec<SimBuf, N>) -> usize {
        let mut q = lock(&self.tx);
        let n = bufs.len().min(q.capacity() - q.len());
        q.extend(bufs.drain(..n));
        n
    }
}
