//! The values the consumer (the service) exchanges with [`Cm`](crate::Cm): addresses, command
//! parameters, outputs and events.

use std::net::{IpAddr, Ipv6Addr};

use pmrxe_wire::{udp_sport, L3Info, MacAddr, Psn, Qpn};

use crate::msg::{req, rep, sidr_rep, sidr_req, Mad, MsgCode, RejReason, SidrStatus};

/// A port GID. RoCEv2 GIDs are IP addresses; IPv4 ones are IPv4-mapped (`::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The RoCEv2 GID of an IP address.
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v) => Gid(v.to_ipv6_mapped().octets()),
            IpAddr::V6(v) => Gid(v.octets()),
        }
    }
    /// The IP address of a RoCEv2 GID (IPv4-mapped → IPv4).
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
}

impl core::fmt::Debug for Gid {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Gid({})", self.to_ip())
    }
}

/// A connection (or SIDR request) handle: our local communication ID.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct ConnId(pub u32);

/// How to reach a peer's QP1 (the GSI), as a UD address vector.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct GsiPath {
    /// Our GID (source IP).
    pub sgid: Gid,
    /// The peer's GID (destination IP).
    pub dgid: Gid,
    /// Destination QP (1 for every CM MAD).
    pub dest_qp: Qpn,
    /// P_Key for the BTH.
    pub pkey: u16,
    /// Traffic class (IPv4 TOS / IPv6 traffic class).
    pub traffic_class: u8,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
}

impl GsiPath {
    /// Ethernet/IP/UDP addressing for a frame on this path (the UDP source port follows the
    /// RoCEv2 rule for QP1 ↔ QP1).
    pub fn l3(&self, src_mac: MacAddr, dst_mac: MacAddr) -> L3Info {
        L3Info {
            src_mac,
            dst_mac,
            src_ip: self.sgid.to_ip(),
            dst_ip: self.dgid.to_ip(),
            tclass: self.traffic_class,
            ttl: self.hop_limit.max(1),
            flow_label: self.flow_label,
            udp_sport: udp_sport(self.flow_label, Qpn::GSI.value(), self.dest_qp.value()),
            ip_id: 0,
        }
    }
}

/// Where a received MAD came from (filled by the service from the frame and its DETH).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MadSource {
    /// The sender's GID (source IP of the frame).
    pub sgid: Gid,
    /// Our GID the frame was sent to (destination IP).
    pub dgid: Gid,
    /// Source QP from the DETH (1 for a CM).
    pub src_qp: Qpn,
    /// P_Key from the BTH.
    pub pkey: u16,
    /// Traffic class of the frame.
    pub traffic_class: u8,
    /// Hop limit / TTL of the frame.
    pub hop_limit: u8,
}

impl MadSource {
    /// The path back to the sender (what the kernel builds with `ib_init_ah_from_wc`).
    pub fn reply_path(&self) -> GsiPath {
        GsiPath {
            sgid: self.dgid,
            dgid: self.sgid,
            dest_qp: self.src_qp,
            pkey: self.pkey,
            traffic_class: self.traffic_class,
            hop_limit: 64,
            flow_label: 0,
        }
    }
}

/// A MAD to send: wrap it with [`gsi::build_mad_frame`](crate::gsi::build_mad_frame).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Transmit {
    /// Where to.
    pub path: GsiPath,
    /// The 256-byte MAD.
    pub mad: Box<Mad>,
}

/// The route of a connection, as `rdma_resolve_route` gives it for RoCE (an SA path record
/// without an SA): it becomes the REQ's primary path.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RoutePath {
    /// Our GID.
    pub sgid: Gid,
    /// The peer's GID.
    pub dgid: Gid,
    /// P_Key (0xFFFF).
    pub pkey: u16,
    /// Traffic class (ToS from `rdma_set_option(RDMA_OPTION_ID_TOS)`).
    pub traffic_class: u8,
    /// Hop limit (the kernel uses the route's, 64; > 1 makes the LIDs permissive).
    pub hop_limit: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Service level (4 bits).
    pub sl: u8,
    /// Static rate code (6 bits).
    pub rate: u8,
    /// Path MTU (IBTA code 1..=5: 256..4096).
    pub mtu: u8,
    /// Packet lifetime (IBA exponent; the kernel CMA uses 16 for RoCE).
    pub packet_life_time: u8,
    /// Local ACK timeout for the QP (IBA exponent, 5 bits).
    pub local_ack_timeout: u8,
}

/// The CMA's packet lifetime for RoCE paths (`CMA_IBOE_PACKET_LIFETIME`).
pub const IBOE_PACKET_LIFETIME: u8 = 16;
/// The CMA's CM response timeout (`CMA_CM_RESPONSE_TIMEOUT`): 4.096 µs · 2^20 ≈ 4.3 s.
pub const CMA_CM_RESPONSE_TIMEOUT: u8 = 20;
/// The CMA's max CM retries (`CMA_MAX_CM_RETRIES`).
pub const CMA_MAX_CM_RETRIES: u8 = 15;
/// The service timeout the CMA puts in the MRAs it sends (`CMA_CM_MRA_SETTING` & 0x1f).
pub const CMA_MRA_SERVICE_TIMEOUT: u8 = 24;

/// The kernel's `cm_ack_timeout`: the QP local ACK timeout from the CA's ACK delay and the
/// path's packet lifetime (both IBA exponents), capped at 31.
pub const fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let mut t = packet_life_time as u16 + 1;
    let d = ca_ack_delay as u16;
    if t >= d {
        t += (d + 1 >= t) as u16;
    } else {
        t = d + (t + 1 >= d) as u16;
    }
    if t > 31 {
        31
    } else {
        t as u8
    }
}

impl RoutePath {
    /// A RoCEv2 route between two IP addresses with the kernel CMA's defaults.
    pub fn between(src: IpAddr, dst: IpAddr) -> RoutePath {
        RoutePath {
            sgid: Gid::from_ip(src),
            dgid: Gid::from_ip(dst),
            pkey: 0xFFFF,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            sl: 0,
            rate: 3,
            mtu: 3,
            packet_life_time: IBOE_PACKET_LIFETIME,
            local_ack_timeout: cm_ack_timeout(15, IBOE_PACKET_LIFETIME),
        }
    }
    /// The path to the peer's QP1.
    pub fn gsi(&self) -> GsiPath {
        GsiPath {
            sgid: self.sgid,
            dgid: self.dgid,
            dest_qp: Qpn::GSI,
            pkey: self.pkey,
            traffic_class: self.traffic_class,
            hop_limit: self.hop_limit,
            flow_label: self.flow_label,
        }
    }
    /// The REQ path block as the kernel fills it (permissive LIDs on a routed path).
    pub fn req_path(&self) -> req::PathRepr {
        let routed = self.hop_limit > 1;
        req::PathRepr {
            local_lid: if routed { req::LID_PERMISSIVE } else { 0 },
            remote_lid: if routed { req::LID_PERMISSIVE } else { 0 },
            local_gid: self.sgid.0,
            remote_gid: self.dgid.0,
            flow_label: self.flow_label,
            packet_rate: self.rate,
            traffic_class: self.traffic_class,
            hop_limit: self.hop_limit,
            sl: self.sl,
            subnet_local: !routed,
            local_ack_timeout: self.local_ack_timeout,
        }
    }
}

/// Enhanced Connection Establishment options (vendor ID in the message, options in the
/// MAD attribute modifier).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Ece {
    /// 24-bit vendor ID.
    pub vendor_id: u32,
    /// Options (the MAD attribute modifier).
    pub attr_mod: u32,
}

/// Transport of a connected QP (the REQ's transport service type).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Transport {
    /// Reliable connected.
    Rc = 0,
    /// Unreliable connected.
    Uc = 1,
}

/// Parameters of [`Cm::connect`](crate::Cm::connect) (`rdma_connect`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ConnectParams {
    /// Route (primary path).
    pub path: RoutePath,
    /// Service ID (see [`cma::service_id`](crate::cma::service_id)).
    pub service_id: u64,
    /// RC or UC.
    pub transport: Transport,
    /// Our QP.
    pub local_qpn: Qpn,
    /// Our starting PSN (the CMA uses a random 24-bit value).
    pub starting_psn: Psn,
    /// Responder resources we offer (our QP's max_dest_rd_atomic).
    pub responder_resources: u8,
    /// Initiator depth we want (our QP's max_rd_atomic).
    pub initiator_depth: u8,
    /// Retry count (0..=7).
    pub retry_count: u8,
    /// RNR retry count (0..=7, 7 = infinite).
    pub rnr_retry_count: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Our QP uses an SRQ.
    pub srq: bool,
    /// How long the peer may take to answer the REQ (IBA exponent, 0..=31).
    pub remote_cm_response_timeout: u8,
    /// How long we may take to answer the REP (IBA exponent, 0..=31).
    pub local_cm_response_timeout: u8,
    /// Retransmissions of the REQ (and later DREQ) before giving up (0..=15).
    pub max_cm_retries: u8,
    /// ECE.
    pub ece: Ece,
    /// Private data (≤ 92 bytes; through the RDMA CM: the `cma_hdr` plus ≤ 56 user bytes).
    pub private_data: Vec<u8>,
}

impl ConnectParams {
    /// RC to `service_id` over `path` with the kernel CMA's timeouts and retry counts.
    pub fn new(path: RoutePath, service_id: u64, local_qpn: Qpn, starting_psn: Psn) -> ConnectParams {
        ConnectParams {
            path,
            service_id,
            transport: Transport::Rc,
            local_qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            flow_control: true,
            srq: false,
            remote_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
            local_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
            max_cm_retries: CMA_MAX_CM_RETRIES,
            ece: Ece::default(),
            private_data: Vec::new(),
        }
    }
}

/// Parameters of [`Cm::accept`](crate::Cm::accept) (`rdma_accept`): the REP.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct AcceptParams {
    /// Our QP.
    pub local_qpn: Qpn,
    /// Our starting PSN.
    pub starting_psn: Psn,
    /// Responder resources we grant (our max_dest_rd_atomic).
    pub responder_resources: u8,
    /// Initiator depth we use (our max_rd_atomic).
    pub initiator_depth: u8,
    /// RNR retry count the peer's QP should use (0..=7).
    pub rnr_retry_count: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Our QP uses an SRQ.
    pub srq: bool,
    /// ECE.
    pub ece: Ece,
    /// Private data (≤ 196 bytes).
    pub private_data: Vec<u8>,
}

/// Parameters of [`Cm::sidr_resolve`](crate::Cm::sidr_resolve) (the UD side of `rdma_connect`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SidrParams {
    /// Route to the service.
    pub path: RoutePath,
    /// Service ID (RDMA_PS_UDP for librdmacm).
    pub service_id: u64,
    /// Wait per attempt (IBA exponent; the CMA waits 2^(20-8) ms ≈ 4.1 s).
    pub timeout: u8,
    /// Retransmissions before giving up (0..=15).
    pub max_cm_retries: u8,
    /// Private data (≤ 216 bytes; through the RDMA CM: the `cma_hdr` plus ≤ 180 user bytes).
    pub private_data: Vec<u8>,
}

/// Parameters of [`Cm::sidr_reply`](crate::Cm::sidr_reply).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SidrReplyParams {
    /// Status.
    pub status: SidrStatus,
    /// Our UD QP.
    pub qpn: Qpn,
    /// Its Q_Key (RDMA CM UDP port space: [`cma::UDP_QKEY`](crate::cma::UDP_QKEY)).
    pub qkey: u32,
    /// ECE vendor ID.
    pub vendor_id: u32,
    /// Additional information (≤ 72 bytes).
    pub info: Vec<u8>,
    /// Private data (≤ 136 bytes).
    pub private_data: Vec<u8>,
}

/// What the consumer needs to answer a REQ and bring up the passive QP.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ConnectRequest {
    /// The REQ as received (private data: all 92 bytes).
    pub req: req::Repr,
    /// Where it came from.
    pub source: MadSource,
}

impl ConnectRequest {
    /// The RDMA CM IP header and user private data, for RDMA CM service IDs.
    pub fn cma(&self) -> Option<(crate::cma::Repr, &[u8])> {
        crate::cma::split_private_data(self.req.service_id, &self.req.private_data)
    }
}

/// A SIDR_REQ for one of our listeners.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SidrRequest {
    /// The SIDR_REQ (private data: all 216 bytes).
    pub req: sidr_req::Repr,
    /// Where it came from.
    pub source: MadSource,
}

/// Which message went unanswered when retries ran out.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Waiting {
    /// REQ sent, no REP (librdmacm: UNREACHABLE, -ETIMEDOUT).
    Rep,
    /// REP sent, no RTU (librdmacm: UNREACHABLE on the passive id).
    Rtu,
    /// SIDR_REQ sent, no SIDR_REP (librdmacm: UNREACHABLE).
    SidrRep,
}

/// Outputs for the consumer, drained with [`Cm::poll_event`](crate::Cm::poll_event). After a
/// terminal event (Rejected, TimedOut, SidrReply, TimewaitExit) the id is gone.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Event {
    /// A REQ for a listener: answer with `accept`, `reject` or `destroy`.
    ConnectRequest {
        /// The new passive connection.
        id: ConnId,
        /// The REQ and its source.
        req: Box<ConnectRequest>,
    },
    /// The peer accepted our REQ: bring the QP to RTR/RTS with [`Cm::qp_attrs`](crate::Cm::qp_attrs),
    /// then call [`Cm::rtu`](crate::Cm::rtu) (or `reject`).
    ConnectResponse {
        /// The active connection.
        id: ConnId,
        /// The REP (private data: all 196 bytes).
        rep: Box<rep::Repr>,
    },
    /// The connection is established (passive: RTU received or `establish`; active: RTU sent).
    Established {
        /// Connection.
        id: ConnId,
        /// The RTU's private data on the passive side (empty otherwise).
        private_data: Vec<u8>,
    },
    /// The peer rejected (or the REQ hit no listener: reason 8, INVALID_SERVICE_ID).
    Rejected {
        /// Connection.
        id: ConnId,
        /// Reason.
        reason: RejReason,
        /// Which message the peer rejected.
        message: MsgCode,
        /// Additional reject information.
        ari: Vec<u8>,
        /// Private data (all 148 bytes).
        private_data: Vec<u8>,
    },
    /// Retries exhausted (librdmacm: RDMA_CM_EVENT_UNREACHABLE with -ETIMEDOUT).
    TimedOut {
        /// Connection or SIDR request.
        id: ConnId,
        /// What never arrived.
        waiting_for: Waiting,
    },
    /// The connection is down (DREQ received, or our DREQ answered or timed out). TIMEWAIT
    /// follows: the QP must not be reused before `TimewaitExit`.
    Disconnected {
        /// Connection.
        id: ConnId,
        /// Our DREQ went unanswered.
        timed_out: bool,
        /// The peer's DREQ/DREP private data (empty after a timeout).
        private_data: Vec<u8>,
    },
    /// TIMEWAIT is over; the id is gone.
    TimewaitExit {
        /// Connection.
        id: ConnId,
    },
    /// A SIDR_REQ for a listener: answer with `sidr_reply`.
    SidrRequest {
        /// The request.
        id: ConnId,
        /// The SIDR_REQ and its source.
        req: Box<SidrRequest>,
    },
    /// The answer to our `sidr_resolve`.
    SidrReply {
        /// The request.
        id: ConnId,
        /// The SIDR_REP.
        rep: Box<sidr_rep::Repr>,
    },
}

/// QP attributes for INIT→RTR→RTS of a connection, as the kernel's `ib_cm_init_qp_attr`
/// derives them from the REQ/REP exchange ([`Cm::qp_attrs`](crate::Cm::qp_attrs)).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct QpAttrs {
    /// RC or UC.
    pub transport: Transport,
    /// Our QP.
    pub local_qpn: Qpn,
    /// RTR: dest_qp_num.
    pub remote_qpn: Qpn,
    /// RTR: address vector (dgid = the peer, sgid = ours).
    pub path: GsiPath,
    /// RTR: path_mtu (IBTA code 1..=5).
    pub path_mtu: u8,
    /// RTR: rq_psn (the peer's starting PSN).
    pub rq_psn: Psn,
    /// RTR: max_dest_rd_atomic.
    pub max_dest_rd_atomic: u8,
    /// RTS: sq_psn (our starting PSN).
    pub sq_psn: Psn,
    /// RTS: max_rd_atomic.
    pub max_rd_atomic: u8,
    /// RTS: timeout (local ACK timeout exponent).
    pub timeout: u8,
    /// RTS: retry_cnt.
    pub retry_cnt: u8,
    /// RTS: rnr_retry.
    pub rnr_retry: u8,
}

/// Counters (monotonic).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct CmStats {
    /// MADs handed to `handle_mad`.
    pub rx_mads: u64,
    /// MADs that failed to parse (truncated, bad version, undefined field values).
    pub rx_malformed: u64,
    /// MADs of another management class.
    pub rx_not_cm: u64,
    /// CM attributes not implemented (LAP, APR, ClassPortInfo).
    pub rx_unsupported: u64,
    /// Duplicates answered or dropped (REQ, REP, DREQ, SIDR_REQ, MRA, RTU).
    pub rx_duplicates: u64,
    /// MADs for no known connection, or from the wrong peer, or in the wrong state.
    pub rx_stray: u64,
    /// REQs rejected: no listener.
    pub rej_no_listener: u64,
    /// REQs/SIDR_REQs refused because a table or a backlog was full.
    pub rej_no_resources: u64,
    /// REQs rejected as stale (remote QPN still in use).
    pub rej_stale: u64,
    /// MADs sent.
    pub tx_mads: u64,
    /// Retransmissions (REQ, REP, DREQ, SIDR_REQ).
    pub retransmits: u64,
    /// Retries exhausted.
    pub timeouts: u64,
    /// MADs dropped because the transmit queue was full.
    pub tx_dropped: u64,
}
