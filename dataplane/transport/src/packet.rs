//! A received packet as the engine consumes it: parsed transport headers (from
//! `pmrxe_wire::parse_frame`, ICRC already checked, or `parse_frame_deferred`, ICRC check
//! carried along for the engine), the payload without pad and ICRC, and the source addressing
//! needed for UD (GRH, source QPN) and RC/UC path checks.

use pmrxe_wire::{IcrcCheck, TransportHeaders};

/// One received RoCEv2 packet, already validated by the wire layer.
#[derive(Clone, Copy, Debug)]
pub struct RxPacket<'a> {
    /// BTH and extension headers.
    pub hdr: TransportHeaders,
    /// Payload (pad and ICRC removed).
    pub payload: &'a [u8],
    /// Source GID (IPv6 address, or IPv4-mapped ::ffff:a.b.c.d).
    pub src_gid: [u8; 16],
    /// Destination GID.
    pub dst_gid: [u8; 16],
    /// UDP source port.
    pub src_udp_port: u16,
    /// IP traffic class / TOS.
    pub traffic_class: u8,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// IPv6 flow label (0 for IPv4).
    pub flow_label: u32,
    /// The ICRC check the receiver deferred to the engine (`pmrxe_wire::parse_frame_deferred`):
    /// the QP verifies it before the packet has any effect, or — for the payload of a message
    /// whose target range is already validated — while placing it (docs/reliability.md, "ICRC
    /// and placement"). `None`: verified before (`parse_frame`).
    pub icrc: Option<IcrcCheck>,
}

impl<'a> RxPacket<'a> {
    /// A packet with only headers and payload (addressing zeroed).
    pub fn new(hdr: TransportHeaders, payload: &'a [u8]) -> Self {
        RxPacket {
            hdr,
            payload,
            src_gid: [0; 16],
            dst_gid: [0; 16],
            src_udp_port: 0,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            icrc: None,
        }
    }

    /// The 40-byte GRH written at the start of a UD receive buffer (IBA 11.4.1.2): IPv6
    /// layout; for IPv4 RoCEv2 the GIDs are IPv4-mapped.
    pub fn grh(&self) -> [u8; 40] {
        let mut g = [0u8; 40];
        let plen = (self.payload.len() + self.hdr.header_len() + 4) as u16;
        let w0: u32 = (6 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0xF_FFFF);
        g[0..4].copy_from_slice(&w0.to_be_bytes());
        g[4..6].copy_from_slice(&plen.to_be_bytes());
        g[6] = 0x1B;
        g[7] = self.hop_limit;
        g[8..24].copy_from_slice(&self.src_gid);
        g[24..40].copy_from_slice(&self.dst_gid);
        g
    }
}
