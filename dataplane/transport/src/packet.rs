//! A received packet as the engine consumes it: parsed transport headers (from
//! `pmrxe_wire::parse_frame`, ICRC already checked, or `parse_frame_deferred`, ICRC check
//! carried along for the engine), the payload without pad and ICRC, and the source addressing
//! needed for UD (GRH, source QPN) and RC/UC path checks.

use pmrxe_wire::{IcrcCheck, RxFrame, TransportHeaders};

/// One received RoCEv2 packet, already validated by the wire layer.
#[derive(Clone, Copy, Debug)]
pub struct RxPacket<'a> {
    /// BTH and extension headers.
    pub hdr: TransportHeaders,
    /// What the Ethernet/IP/UDP headers said (source and destination GIDs, UDP source port,
    /// traffic class, hop limit, flow label), the payload (pad and ICRC removed) and the ICRC
    /// check. The receiver parses into it in place (`pmrxe_wire::parse_frame_into`): no copy
    /// between the parse and the engine.
    pub frame: RxFrame<'a>,
    /// `frame.check` was deferred to the engine (`pmrxe_wire::parse_frame_deferred`): the QP
    /// verifies it before the packet has any effect, or — for the payload of a message whose
    /// target range is already validated — while placing it (docs/reliability.md, "ICRC and
    /// placement"). `false`: verified before (`parse_frame`), `frame.check` is not looked at.
    pub deferred: bool,
}

impl<'a> RxPacket<'a> {
    /// A packet with only headers and payload (addressing zeroed, hop limit 64).
    pub fn new(hdr: TransportHeaders, payload: &'a [u8]) -> Self {
        RxPacket { hdr, frame: RxFrame { payload, ttl: 64, ..RxFrame::BLANK }, deferred: false }
    }

    /// A packet of a parsed frame; `check`: its ICRC check when deferred, `None` when the
    /// parse verified it.
    pub fn of_frame(f: &pmrxe_wire::RoceFrame<'a>, check: Option<IcrcCheck>) -> Self {
        RxPacket { hdr: f.headers, frame: f.rx_frame(check.unwrap_or(IcrcCheck::BLANK)), deferred: check.is_some() }
    }

    /// Payload without pad and ICRC.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        self.frame.payload
    }

    /// The deferred ICRC check, if the engine is to make it.
    #[inline]
    pub fn icrc(&self) -> Option<IcrcCheck> {
        self.deferred.then_some(self.frame.check)
    }

    /// The 40-byte GRH written at the start of a UD receive buffer (IBA 11.4.1.2): IPv6
    /// layout; for IPv4 RoCEv2 the GIDs are IPv4-mapped.
    pub fn grh(&self) -> [u8; 40] {
        let f = &self.frame;
        let mut g = [0u8; 40];
        let plen = (f.payload.len() + self.hdr.header_len() + 4) as u16;
        let w0: u32 = (6 << 28) | (u32::from(f.tclass) << 20) | (f.flow_label & 0xF_FFFF);
        g[0..4].copy_from_slice(&w0.to_be_bytes());
        g[4..6].copy_from_slice(&plen.to_be_bytes());
        g[6] = 0x1B;
        g[7] = f.ttl;
        g[8..24].copy_from_slice(&f.src_gid);
        g[24..40].copy_from_slice(&f.dst_gid);
        g
    }
}
