//! The control protocol between a verbs client (the shim) and the service.
//!
//! Transport: a Unix `SOCK_SEQPACKET` socket (one datagram per message, ordered, reliable),
//! bincode-encoded [`Request`]/[`Response`] values, file descriptors (shared-memory segments,
//! completion-channel eventfds) passed with `SCM_RIGHTS` beside the message. The service
//! learns the client's pid/uid with `SO_PEERCRED`; the first message must be
//! [`Request::Hello`] with [`crate::ABI_VERSION`].
//!
//! Every request gets exactly one response. Errors carry an errno the shim returns to the
//! application as-is, plus a message for logs.
use serde::{Deserialize, Serialize};
use rustix::io::Errno;
use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
    SocketAddrUnix, SocketFlags, SocketType,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use crate::layout::{CqSegmentLayout, Doorbell, QpSegmentLayout, SrqSegmentLayout};

/// Largest control message (bytes).
pub const MAX_MSG: usize = 64 * 1024;
/// Largest number of fds passed with one request (what the service accepts).
pub const MAX_FDS: usize = 4;
/// Largest number of fds passed with one reply: `Hello` carries the client page, the
/// async-event eventfd and one wake-up eventfd per lcore.
pub const MAX_REPLY_FDS: usize = 2 + crate::layout::MAX_LCORES;

/// Device attributes reported by `ibv_query_device` (subset the service fills honestly).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceAttr {
    pub fw_ver: String,
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub device_cap_flags: u32,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub atomic_cap: u32,
    pub max_mw: u32,
    pub max_ah: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_pkeys: u16,
    pub max_fast_reg_page_list_len: u32,
    pub max_inline_data: u32,
}

/// Port attributes (`ibv_query_port`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PortAttr {
    /// `enum ibv_port_state` (4 = ACTIVE).
    pub state: u32,
    /// `enum ibv_mtu` (1 = 256 .. 5 = 4096).
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: u32,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub pkey_tbl_len: u16,
    pub active_width: u8,
    pub active_speed: u8,
    /// `enum ibv_port_phys_state`-ish (5 = LINKUP).
    pub phys_state: u8,
    /// 2 = Ethernet.
    pub link_layer: u8,
}

/// One GID table entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GidEntry {
    pub index: u32,
    pub gid: [u8; 16],
    /// `enum ibv_gid_type` of `verbs.h`: 0 = IB, 1 = RoCE v1, 2 = RoCE v2 (the shim derives the
    /// sysfs flavour for `ibv_query_gid_type` from it).
    pub gid_type: u32,
}

/// `ibv_device.dev_name` of device `index` (`pmrxe_uverbs<index>`): the shim reports it and the
/// service keeps `/dev/infiniband/<it>` while it runs (UCX probes that path; the service's
/// `devnodes` module). Never a kernel `uverbsN` name, so no real device node is shadowed.
pub fn dev_node_name(index: u32) -> String {
    format!("pmrxe_uverbs{index}")
}

/// A device as the shim presents it (`pmrxe0`, ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub index: u32,
    pub name: String,
    pub guid: u64,
    pub mac: [u8; 6],
    pub attr: DeviceAttr,
    pub port: PortAttr,
    pub gids: Vec<GidEntry>,
}

/// Address vector (`struct ibv_ah_attr` with its GRH), as given by the application.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AhAttr {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub is_global: bool,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr` fields the service understands (values as in libibverbs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

/// `struct ibv_qp_cap`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// A page-aligned piece of a registration: `len` bytes at `seg_offset` inside segment `seg`.
/// The pieces of a [`Request::RegMr`] cover the page-aligned span of the MR in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub seg: u64,
    pub seg_offset: u64,
    pub len: u64,
}

/// Client → service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    Hello { abi_version: u32, pid: u32, program: String },
    AllocPd { device: u32 },
    DeallocPd { pd: u32 },
    CreateCompChannel { device: u32 },
    DestroyCompChannel { channel: u32 },
    CreateCq { device: u32, cqe: u32, channel: Option<u32> },
    DestroyCq { cq: u32 },
    /// Hand the service a shared-memory segment (fd 0, a memfd) that now backs the client's
    /// pages `base..base+len` (page aligned). `seg` is chosen by the client, unique per client.
    AddSegment { seg: u64, base: u64, len: u64 },
    /// The client no longer uses segment `seg` for new registrations; the service closes it
    /// once no MR maps it.
    ReleaseSegment { seg: u64 },
    /// Register application memory `addr..addr+len` (client addresses). `pieces` cover the
    /// page-aligned span `[addr & !4095, round_up(addr+len, 4096))` in order. The service maps
    /// the pieces contiguously in its own address space (one map per MR).
    RegMr { pd: u32, addr: u64, len: u64, iova: u64, access: u32, pieces: Vec<Piece> },
    DeregMr { key: u32 },
    /// pmrxedv: fast-registration MR with `max_num_sg` page slots (FREE).
    AllocMr { pd: u32, max_num_sg: u32 },
    /// pmrxedv: map a scatter list into the MR's staging translation. Entries are
    /// (client address, length); each must lie in a segment the client added.
    MapMrSg { key: u32, sg: Vec<(u64, u64)>, sg_offset: u64, page_size: u64 },
    AllocMw { pd: u32, mw_type: u32 },
    DeallocMw { key: u32 },
    CreateQp { device: u32, pd: u32, qp_type: u32, send_cq: u32, recv_cq: u32, srq: Option<u32>, cap: QpCap, sq_sig_all: bool },
    ModifyQp { qpn: u32, attr: QpAttr, mask: u32 },
    QueryQp { qpn: u32 },
    DestroyQp { qpn: u32 },
    CreateSrq { device: u32, pd: u32, max_wr: u32, max_sge: u32, srq_limit: u32 },
    ModifySrq { srq: u32, max_wr: u32, srq_limit: u32, mask: u32 },
    QuerySrq { srq: u32 },
    DestroySrq { srq: u32 },
    CreateAh { pd: u32, attr: AhAttr },
    DestroyAh { ah: u32 },
    /// Async events queued for this client (non-blocking).
    GetAsyncEvent,
    /// Service statistics (text or JSON).
    Stats { json: bool },
    /// Start a live capture into a pcap stream written to the passed fd.
    Capture { count: u64, qpn: Option<u32> },
    /// Hand the service memory that is already shareable, as it is (no copy): fd 0 is the file
    /// that backs the client's shared mapping `base..base+len` (a hugetlbfs file, a memfd, a
    /// SysV SHM segment, a `MAP_SHARED` regular file or shared anonymous memory) and `offset`
    /// the file offset mapped at `base`. `base`, `len` and `offset` are aligned to the file's
    /// page size (2 MiB on a 2 MiB hugetlbfs). The service maps the same pages `MAP_SHARED`;
    /// the file is not sealed (the client may use it as before). `seg` shares the `AddSegment`
    /// id space. (Appended last so the encoding of every older request is unchanged.)
    AddSharedSegment { seg: u64, base: u64, len: u64, offset: u64 },
    /// `ibv_rereg_mr`: MR `key` gets the PD, access and translation described as in `RegMr`
    /// (the client sends the whole new description, changed or not); its keys stay the same.
    ReregMr { key: u32, pd: u32, addr: u64, len: u64, iova: u64, access: u32, pieces: Vec<Piece> },
    /// `ibv_resize_cq` to `cqe` entries within the CQ's ring (EOPNOTSUPP beyond it, EINVAL below
    /// the completions waiting to be polled).
    ResizeCq { cq: u32, cqe: u32 },
    // ---- rdma_cm (issue 14; docs/cm.md "Integration"). Ids are the service's handles. ----
    /// `rdma_create_event_channel`: answered with `Response::CmChannel` and fd 0, the client's
    /// end of a `SOCK_SEQPACKET` pair on which the service writes one encoded [`CmEventMsg`]
    /// per datagram (the fd `rdma_event_channel.fd` is; pollable). Closing it destroys the
    /// channel; events of its ids are then dropped.
    CmOpenChannel,
    /// `rdma_create_id`: `ps` is the RDMA_PS_* port space, `qp_type` the IBV_QPT_* the id will
    /// use, `context` is echoed in every event of the id. → `Response::CmId`.
    CmCreateId { channel: u32, ps: u16, qp_type: u32, context: u64 },
    /// `rdma_migrate_id`.
    CmMigrateId { id: u32, channel: u32 },
    /// `rdma_bind_addr`: wildcard address = every device; port 0 = pick one. → `Response::CmAddr`.
    CmBindAddr { id: u32, addr: CmSockAddr },
    /// `rdma_resolve_addr`: picks the device that owns or routes to `dst` (and binds `src` if
    /// given); event ADDR_RESOLVED (or ADDR_ERROR) follows. → `Response::CmAddr` (source).
    CmResolveAddr { id: u32, src: Option<CmSockAddr>, dst: CmSockAddr, timeout_ms: u32 },
    /// `rdma_resolve_route`: event ROUTE_RESOLVED (or ROUTE_ERROR) follows.
    CmResolveRoute { id: u32, timeout_ms: u32 },
    /// `rdma_listen`.
    CmListen { id: u32, backlog: u32 },
    /// `rdma_connect` (RC/UC: REQ; UD: SIDR_REQ). The active side's QP is in INIT; on the REP
    /// the client gets the internal event CONNECT_RESPONSE, moves its QP to RTR/RTS with
    /// `CmInitQpAttr` and sends `CmEstablish` (RTU), then reports ESTABLISHED, as librdmacm.
    CmConnect { id: u32, qpn: u32, conn: CmConnParam },
    /// `rdma_accept`: the client moved its QP to RTR and RTS first (`CmInitQpAttr`).
    CmAccept { id: u32, qpn: u32, conn: CmConnParam },
    /// `rdma_reject` with private data.
    CmReject { id: u32, private_data: Vec<u8> },
    /// `rdma_establish` / the RTU after CONNECT_RESPONSE.
    CmEstablish { id: u32 },
    /// `rdma_disconnect` (DREQ, or DREP to a received DREQ).
    CmDisconnect { id: u32 },
    /// `rdma_init_qp_attr`: the attributes and mask for moving the id's QP to `qp_state`
    /// (IBV_QPS_*). → `Response::CmQpAttr`.
    CmInitQpAttr { id: u32, qp_state: u32 },
    /// `rdma_set_option` (level/optname as librdmacm; value bytes as given).
    CmSetOption { id: u32, level: i32, name: i32, value: Vec<u8> },
    /// `rdma_destroy_id`: sends what the kernel's destroy would (REJ/DREQ), drops the id.
    CmDestroyId { id: u32 },
    // ---- multicast (appended: the encoding of every request above is unchanged) ----
    /// `ibv_attach_mcast`: UD QP `qpn` also receives the datagrams sent to the multicast GID
    /// `gid` (IPv4-mapped 224.0.0.0/4, or ff00::/8) on its device. EINVAL for another QP type
    /// or a unicast GID, ENOMEM beyond [`crate::McastLimits`]; attaching twice is a no-op.
    AttachMcast { qpn: u32, gid: [u8; 16] },
    /// `ibv_detach_mcast` (EINVAL when `qpn` is not attached to `gid`).
    DetachMcast { qpn: u32, gid: [u8; 16] },
    /// `rdma_join_multicast` of the IPv4 group `addr` by an id bound to a device: event
    /// MULTICAST_JOIN follows, with `dst` = the group and the UD parameters a sender needs (the
    /// group's GID, QPN 0xFFFFFF, the port space's Q_Key). The client attaches the id's QP
    /// itself when the event arrives, as librdmacm does.
    CmJoinMulticast { id: u32, addr: CmSockAddr },
    /// `rdma_leave_multicast` (EADDRNOTAVAIL when the id did not join `addr`).
    CmLeaveMulticast { id: u32, addr: CmSockAddr },
}

/// A socket address as rdma_cm carries it: IPv4 as an IPv4-mapped IPv6 address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmSockAddr {
    pub ip: [u8; 16],
    pub v6: bool,
    /// Host order.
    pub port: u16,
}

/// `struct rdma_conn_param` (plus the peer's QPN on events).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmConnParam {
    pub private_data: Vec<u8>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param` of a UD event (SIDR reply / request).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmUdParam {
    pub private_data: Vec<u8>,
    pub ah_attr: AhAttr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// One rdma_cm event, as written on a channel's socket (encoded like the control messages).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmEventMsg {
    /// The id the event is for; for CONNECT_REQUEST the new id of the connection.
    pub id: u32,
    /// The `context` given at CmCreateId (the listener's for CONNECT_REQUEST).
    pub context: u64,
    /// For CONNECT_REQUEST: the listening id.
    pub listen_id: Option<u32>,
    /// RDMA_CM_EVENT_* (librdmacm values), or [`CM_EVENT_CONNECT_RESPONSE`] (internal).
    pub event: u32,
    /// 0, or a negative errno / the REJ reason for REJECTED (as librdmacm reports it).
    pub status: i32,
    /// Device index (pmrxeN) the id is bound to, once known.
    pub device: Option<u32>,
    pub src: CmSockAddr,
    pub dst: CmSockAddr,
    pub conn: CmConnParam,
    pub ud: Option<CmUdParam>,
}

/// Client → service, on an event channel's socket (the only datagram a client writes there):
/// the client retrieved (`rdma_get_cm_event`, `rdma_get_request`) the CONNECT_REQUEST of the
/// new id `id`. The listener's `rdma_listen` backlog counts requests from their arrival until
/// this acknowledgement (or any request naming `id`), as the kernel's ucma counts them until
/// the event is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmEventAck {
    pub id: u32,
}

/// Internal event: a REP arrived for the client's `rdma_connect`; the client moves the QP to
/// RTR/RTS and answers `CmEstablish` before it reports ESTABLISHED (never shown to the user).
pub const CM_EVENT_CONNECT_RESPONSE: u32 = 0x1000;

/// pmrxe's own asynchronous event (beyond `enum ibv_event_type`, as vendors' are): the
/// service revoked an MR because its memory faulted (a client truncated or punched a hole in
/// the file behind it); `element` is the MR's key (`ibv_async_event.element.port_num`). Every
/// later use of the MR fails with an access error. `pmrxedv.h`: `PMRXEDV_EVENT_MR_REVOKED`.
pub const EVENT_MR_REVOKED: u32 = 0x2001;

/// An asynchronous event (`enum ibv_event_type` values, or [`EVENT_MR_REVOKED`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AsyncEvent {
    pub event_type: u32,
    /// QPN, CQ handle, SRQ handle or port number, depending on the event.
    pub element: u32,
}

/// Service → client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Response {
    /// Handshake accepted; fd 0 = the client page (doorbells).
    Hello { abi_version: u32, client_id: u32, devices: Vec<DeviceInfo> },
    Pd { pd: u32 },
    /// fd 0 = the eventfd the client waits on.
    CompChannel { channel: u32 },
    /// fd 0 = the CQ segment.
    Cq { cq: u32, cqe: u32, layout: CqSegmentLayout },
    Mr { key: u32 },
    /// Number of SG entries mapped.
    Mapped { n: u32 },
    Mw { key: u32 },
    /// fd 0 = the QP segment.
    Qp { qpn: u32, cap: QpCap, layout: QpSegmentLayout, doorbell: Doorbell },
    QpAttr { attr: QpAttr, init_cap: QpCap },
    /// fd 0 = the SRQ segment.
    Srq { srq: u32, max_wr: u32, max_sge: u32, layout: SrqSegmentLayout, doorbell: Doorbell },
    SrqAttr { max_wr: u32, max_sge: u32, srq_limit: u32 },
    Ah { ah: u32 },
    AsyncEvent(Option<AsyncEvent>),
    Stats(String),
    Ok,
    Err { errno: i32, msg: String },
    /// `CmOpenChannel` (fd 0: the event socket).
    CmChannel { channel: u32 },
    /// `CmCreateId`.
    CmId { id: u32 },
    /// `CmBindAddr` / `CmResolveAddr`: the bound source address and device (None: wildcard).
    CmAddr { addr: CmSockAddr, device: Option<u32> },
    /// `CmInitQpAttr`: attributes and IBV_QP_* mask for `ibv_modify_qp`.
    CmQpAttr { attr: QpAttr, mask: u32 },
}

/// Encode a message.
pub fn encode<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    bincode::serialize(msg).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Decode a message; hostile input gives an error, never a panic or an unbounded allocation.
pub fn decode<'a, T: Deserialize<'a>>(buf: &'a [u8]) -> io::Result<T> {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(MAX_MSG as u64)
        .deserialize(buf)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Run `f` with `fds` — raw descriptors a caller passed in — borrowed for the length of the
/// call. A negative number is `EBADF`, as the kernel would answer.
pub(crate) fn with_borrowed<R>(fds: &[RawFd], f: impl FnOnce(&[BorrowedFd<'_>]) -> io::Result<R>) -> io::Result<R> {
    if fds.iter().any(|&fd| fd < 0) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: each fd is non-negative (never the -1 niche) and is a descriptor the caller
    // holds open while it calls us (the contract of every function here that takes a raw fd);
    // the borrows live only inside `f`, within that call.
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|&fd| unsafe { BorrowedFd::borrow_raw(fd) }).collect();
    f(&borrowed)
}

/// Bytes of control message for `n` fds (`CMSG_SPACE`: a 16-byte header, 4 bytes per fd,
/// rounded up to 8).
const fn cmsg_space(n: usize) -> usize {
    (16 + 4 * n + 7) & !7
}

/// The control-message buffer of one datagram, room for [`MAX_REPLY_FDS`] fds, aligned for
/// `cmsghdr` so none of it is lost to alignment. A receiver offers only the part for the fds
/// it accepts (a peer that sends more gets `MSG_CTRUNC`).
#[repr(C, align(8))]
struct CmsgBuf([MaybeUninit<u8>; cmsg_space(MAX_REPLY_FDS)]);

/// Send one message with optional fds over a SEQPACKET socket.
pub fn send_msg(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if bytes.len() > MAX_MSG || fds.len() > MAX_REPLY_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "control message too large"));
    }
    with_borrowed(&[sock], |sock| {
        with_borrowed(fds, |fds| {
            let mut space = CmsgBuf([MaybeUninit::uninit(); cmsg_space(MAX_REPLY_FDS)]);
            let mut control = SendAncillaryBuffer::new(&mut space.0);
            if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "control message too large"));
            }
            loop {
                match net::sendmsg(sock[0], &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL) {
                    Ok(_) => return Ok(()),
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        })
    })
}

/// Receive one request and its fds (at most [`MAX_FDS`]). `Ok(None)` on orderly shutdown by
/// the peer.
pub fn recv_msg(sock: RawFd, buf: &mut Vec<u8>) -> io::Result<Option<Vec<OwnedFd>>> {
    recv_msg_fds(sock, buf, MAX_FDS)
}

/// Receive one message and up to `max_fds` fds (at most [`MAX_REPLY_FDS`]; more is an error).
/// `Ok(None)` on orderly shutdown by the peer.
pub fn recv_msg_fds(sock: RawFd, buf: &mut Vec<u8>, max_fds: usize) -> io::Result<Option<Vec<OwnedFd>>> {
    buf.resize(MAX_MSG, 0);
    with_borrowed(&[sock], |sock| {
        let mut space = CmsgBuf([MaybeUninit::uninit(); cmsg_space(MAX_REPLY_FDS)]);
        let mut control = RecvAncillaryBuffer::new(&mut space.0[..cmsg_space(max_fds.min(MAX_REPLY_FDS))]);
        let got = loop {
            match net::recvmsg(sock[0], &mut [IoSliceMut::new(buf)], &mut control, RecvFlags::CMSG_CLOEXEC) {
                Ok(got) => break got,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        let mut fds = Vec::new();
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = m {
                fds.extend(received);
            }
        }
        if got.flags.contains(ReturnFlags::CTRUNC) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "control message fds truncated"));
        }
        if got.bytes == 0 && fds.is_empty() {
            return Ok(None);
        }
        buf.truncate(got.bytes);
        Ok(Some(fds))
    })
}

/// The `sockaddr_un` of `path`; `InvalidInput` if the path does not fit with its NUL.
fn sockaddr(path: &std::path::Path) -> io::Result<SocketAddrUnix> {
    use std::os::unix::ffi::OsStrExt;
    // sun_path is 108 bytes; the path must fit with its terminating NUL.
    if path.as_os_str().as_bytes().len() >= 108 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"));
    }
    Ok(SocketAddrUnix::new(path)?)
}

fn seqpacket_socket() -> io::Result<OwnedFd> {
    Ok(net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?)
}

/// Connect a `SOCK_SEQPACKET` socket to the service at `path` (std has no constructor for
/// SEQPACKET Unix sockets).
pub fn seqpacket_connect(path: &std::path::Path) -> io::Result<OwnedFd> {
    let addr = sockaddr(path)?;
    let fd = seqpacket_socket()?;
    net::connect(&fd, &addr)?;
    Ok(fd)
}

/// A listening `SOCK_SEQPACKET` socket bound at `path` (which must not exist).
pub fn seqpacket_listen(path: &std::path::Path, backlog: i32) -> io::Result<OwnedFd> {
    let addr = sockaddr(path)?;
    let fd = seqpacket_socket()?;
    net::bind(&fd, &addr)?;
    net::listen(&fd, backlog)?;
    Ok(fd)
}

/// A connected `SOCK_SEQPACKET` pair (close-on-exec).
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?)
}

/// The peer's credentials (`SO_PEERCRED`): (pid, uid, gid).
///
/// Still libc: rustix's `socket_peercred` returns the pid as a non-zero `Pid`, but the kernel
/// reports pid 0 for a peer in a pid namespace we cannot see, which that type cannot hold.
pub fn peer_cred(sock: &impl AsRawFd) -> io::Result<(i32, u32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = core::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred`/`len` are valid out-parameters of the declared size.
    let r = unsafe {
        libc::getsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid, cred.gid))
}

/// `SO_PEERGROUPS` (Linux 4.13; generic/x86 value — the libc crate does not export it here).
const SO_PEERGROUPS: libc::c_int = 59;

/// The peer's supplementary groups at `connect` time (`SO_PEERGROUPS`), as the kernel recorded
/// them: what a group-based admission must check (the primary gid alone misses `usermod -aG`).
pub fn peer_groups(sock: &impl AsRawFd) -> io::Result<Vec<u32>> {
    let mut groups = vec![0u32; 64];
    loop {
        let mut len = (groups.len() * 4) as libc::socklen_t;
        // SAFETY: `groups` is a writable buffer of `len` bytes; the kernel writes at most `len`
        // bytes and sets `len` to the size it needs (ERANGE when the buffer is too small).
        let r = unsafe { libc::getsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, SO_PEERGROUPS, groups.as_mut_ptr().cast(), &mut len) };
        if r == 0 {
            groups.truncate(len as usize / 4);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) || len as usize <= groups.len() * 4 || len > 1 << 20 {
            return Err(e);
        }
        groups.resize(len as usize / 4, 0);
    }
}

/// Why a client must not trust the control socket at `path`: its directory is writable by
/// users other than its owner (anyone could replace the socket with their own service), or is
/// owned by someone other than root, the client itself or `service_uid`. `None`: trusted.
pub fn untrusted_socket_dir(path: &std::path::Path, my_uid: u32, service_uid: Option<u32>) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let md = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) => return Some(format!("cannot inspect its directory {}: {e}", dir.display())),
    };
    if md.mode() & 0o022 != 0 {
        return Some(format!(
            "its directory {} is writable by others (mode {:o}): anyone could put their own service there",
            dir.display(),
            md.mode() & 0o7777
        ));
    }
    let owner = md.uid();
    if owner != 0 && owner != my_uid && Some(owner) != service_uid {
        return Some(format!("its directory {} belongs to uid {owner}, neither root, you nor the service user", dir.display()));
    }
    None
}

/// Set send and receive timeouts on a socket (`SO_SNDTIMEO`/`SO_RCVTIMEO`): a call that
/// exceeds them fails with `EAGAIN` instead of blocking forever.
pub fn set_timeouts(sock: &impl rustix::fd::AsFd, t: std::time::Duration) -> io::Result<()> {
    net::sockopt::set_socket_timeout(sock, net::sockopt::Timeout::Recv, Some(t))?;
    net::sockopt::set_socket_timeout(sock, net::sockopt::Timeout::Send, Some(t))?;
    Ok(())
}

/// The uid of user `name` (`getpwnam_r`), if the host has one.
pub fn user_uid(name: &str) -> Option<u32> {
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: zeroed passwd is a valid out-parameter; `buf` is writable for its length.
    let mut pw: libc::passwd = unsafe { core::mem::zeroed() };
    let mut out: *mut libc::passwd = core::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; the result points into `pw`/`buf`.
    let r = unsafe { libc::getpwnam_r(cname.as_ptr(), &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
    (r == 0 && !out.is_null()).then_some(pw.pw_uid)
}

/// The gid of group `name` (`getgrnam_r`), if the host has one.
pub fn group_gid(name: &str) -> Option<u32> {
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: zeroed group is a valid out-parameter; `buf` is writable for its length.
    let mut gr: libc::group = unsafe { core::mem::zeroed() };
    let mut out: *mut libc::group = core::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; the result points into `gr`/`buf`.
    let r = unsafe { libc::getgrnam_r(cname.as_ptr(), &mut gr, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
    (r == 0 && !out.is_null()).then_some(gr.gr_gid)
}

/// The name of group `gid` (`getgrgid_r`), if the host has one.
pub fn group_name(gid: u32) -> Option<String> {
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: zeroed group is a valid out-parameter; `buf` is writable for its length.
    let mut gr: libc::group = unsafe { core::mem::zeroed() };
    let mut out: *mut libc::group = core::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; on success `gr_name` points into `buf`, a
    // NUL-terminated string read before `buf` goes.
    unsafe {
        let r = libc::getgrgid_r(gid, &mut gr, buf.as_mut_ptr().cast(), buf.len(), &mut out);
        (r == 0 && !out.is_null()).then(|| std::ffi::CStr::from_ptr(gr.gr_name).to_string_lossy().into_owned())
    }
}

/// Resolve the control socket path: `$PMRXE_SOCKET`, else `default`.
pub fn socket_path(default: &str) -> std::path::PathBuf {
    std::env::var_os("PMRXE_SOCKET").map(Into::into).unwrap_or_else(|| default.into())
}

/// Default control socket path when neither the config nor `PMRXE_SOCKET` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/pmrxe/pmrxe.sock";

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn messages_round_trip_with_fds() {
        // A SEQPACKET pair (std has no constructor for it).
        let (s0, s1) = seqpacket_pair().unwrap();
        let req = Request::RegMr { pd: 3, addr: 0x7f00_0000_1000, len: 8192, iova: 0x1000, access: 7, pieces: vec![Piece { seg: 1, seg_offset: 4096, len: 8192 }] };
        let (d0, _d1) = UnixDatagram::pair().unwrap();
        send_msg(s0.as_raw_fd(), &encode(&req).unwrap(), &[d0.as_raw_fd()]).unwrap();
        let mut buf = Vec::new();
        let fds = recv_msg(s1.as_raw_fd(), &mut buf).unwrap().unwrap();
        assert_eq!(fds.len(), 1);
        assert_eq!(decode::<Request>(&buf).unwrap(), req);
        drop(s0);
        assert!(recv_msg(s1.as_raw_fd(), &mut buf).unwrap().is_none());
    }

    #[test]
    fn fds_arrive_in_order_close_on_exec_and_excess_is_refused() {
        use rustix::fs::{fstat, ftruncate, memfd_create, MemfdFlags};
        use std::os::fd::AsFd;
        let (s0, s1) = seqpacket_pair().unwrap();
        // MAX_FDS memfds told apart by their sizes.
        let mem: Vec<OwnedFd> = (0..MAX_FDS).map(|_| memfd_create(c"ctrl-test", MemfdFlags::CLOEXEC).unwrap()).collect();
        for (i, f) in mem.iter().enumerate() {
            ftruncate(f, (i as u64 + 1) * 4096).unwrap();
        }
        let raw: Vec<RawFd> = mem.iter().map(|f| f.as_raw_fd()).collect();
        send_msg(s0.as_raw_fd(), b"four", &raw).unwrap();
        let mut buf = Vec::new();
        let got = recv_msg(s1.as_raw_fd(), &mut buf).unwrap().unwrap();
        assert_eq!(buf, b"four");
        assert_eq!(got.len(), MAX_FDS);
        for (i, f) in got.iter().enumerate() {
            assert_eq!(fstat(f).unwrap().st_size as u64, (i as u64 + 1) * 4096, "fd {i} out of order");
            assert!(rustix::io::fcntl_getfd(f).unwrap().contains(rustix::io::FdFlags::CLOEXEC), "received fds are close-on-exec");
        }
        // Our side refuses more than MAX_REPLY_FDS and bad descriptors before any system call.
        let err = send_msg(s0.as_raw_fd(), b"x", &[raw[0]; MAX_REPLY_FDS + 1]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(send_msg(s0.as_raw_fd(), b"x", &[-1]).unwrap_err().raw_os_error(), Some(libc::EBADF));
        assert_eq!(recv_msg(-1, &mut buf).unwrap_err().raw_os_error(), Some(libc::EBADF));
        // A hostile peer that sends more fds than a request may carry (MAX_FDS): an error (the kernel truncated the list); the fds that did arrive drop with it.
        let many = [mem[0].as_fd(); 16];
        let mut big = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(16))];
        let mut control = SendAncillaryBuffer::new(&mut big);
        assert!(control.push(SendAncillaryMessage::ScmRights(&many)));
        net::sendmsg(&s0, &[IoSlice::new(b"many")], &mut control, SendFlags::NOSIGNAL).unwrap();
        let err = recv_msg(s1.as_raw_fd(), &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn garbage_decodes_to_an_error() {
        for seed in 0u32..200 {
            let bytes: Vec<u8> = (0..(seed % 61)).map(|i| (i.wrapping_mul(2654435761u32.wrapping_add(seed)) >> 7) as u8).collect();
            let _ = decode::<Request>(&bytes); // must not panic or allocate unboundedly
        }
        // A huge declared length must not allocate.
        let mut evil = vec![9u8, 0, 0, 0];
        evil.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode::<Request>(&evil).is_err());
    }
}
