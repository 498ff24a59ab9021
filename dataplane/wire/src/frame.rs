//! Whole frames: Ethernet / IPv4|IPv6 / UDP 4791 / BTH .. payload, pad / ICRC.
//!
//! # Building (no intermediate copy)
//!
//! ```text
//! let hl = frame_header_len(ipv6);                       // Eth + IP + UDP
//! let n  = headers.emit(&mut buf[hl..])?;                // BTH .. last ext header
//! buf[hl + n..][..len].copy_from_slice(payload);         // or DMA/copy from the MR
//! zero pad_for(len) bytes; roce_len = n + len + pad
//! emit_frame_headers(&mut buf, &l3, roce_len)?;          // Eth/IP/UDP in front
//! finish_frame(&mut buf[..hl + roce_len + ICRC_LEN])?;   // ICRC in the last 4 bytes
//! ```
//! [`build_frame`] does exactly that for a payload slice.
//!
//! # Parsing
//!
//! [`parse_frame`] validates everything before anything is used: Ethernet (up to two VLAN
//! tags skipped), IP version/length/fragment, UDP length == IP payload length, destination
//! port 4791, the BTH (TVer, opcode), the length of every header the opcode implies, the
//! pad rules, and finally the ICRC (last, so garbage never costs a CRC pass — F7).
//! Trailing bytes after the IP datagram (Ethernet minimum-size padding) are ignored.
//! Responder-level length rules (FIRST/MIDDLE == MTU, LAST ≥ 1 byte) are the transport's,
//! because it must NAK them rather than drop them (F6).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::eth::{self, EtherType, MacAddr};
use crate::icrc::IcrcCheck;
use crate::{ipv4, ipv6, udp, Error, Result, TransportHeaders, ICRC_LEN, ROCE_PORT};

/// Everything below the transport needed to build a frame: an address vector plus MACs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct L3Info {
    /// Source MAC.
    pub src_mac: MacAddr,
    /// Destination MAC.
    pub dst_mac: MacAddr,
    /// Source IP; IPv4 and IPv6 must not be mixed with `dst_ip`.
    pub src_ip: IpAddr,
    /// Destination IP.
    pub dst_ip: IpAddr,
    /// Traffic class (DSCP << 2 | ECN): IPv4 TOS or IPv6 traffic class.
    pub tclass: u8,
    /// TTL / hop limit.
    pub ttl: u8,
    /// IPv6 flow label (20 bits; ignored for IPv4).
    pub flow_label: u32,
    /// UDP source port (see [`udp_sport`]).
    pub udp_sport: u16,
    /// IPv4 identification (ignored for IPv6; 0 is fine since DF is set).
    pub ip_id: u16,
}

impl Default for L3Info {
    fn default() -> L3Info {
        L3Info {
            src_mac: MacAddr::default(),
            dst_mac: MacAddr::default(),
            src_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            dst_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            tclass: 0,
            ttl: 64,
            flow_label: 0,
            udp_sport: 0xC000,
            ip_id: 0,
        }
    }
}

impl L3Info {
    /// Whether this builds IPv6 frames (`BadAddress` if the families differ).
    pub fn is_ipv6(&self) -> Result<bool> {
        match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) => Ok(false),
            (IpAddr::V6(_), IpAddr::V6(_)) => Ok(true),
            _ => Err(Error::BadAddress),
        }
    }
}

/// The RoCEv2 UDP source port for a QP pair, `rdma_get_udp_sport` style (F8): if
/// `flow_label` is 0 a 20-bit label is derived from the QP numbers (product, folded by
/// xor-shifts of 20 and 40 bits); the label's top 6 bits are xor-folded into its low 14
/// bits and the result is put in the range 0xC000..=0xFFFF. Constant per QP pair.
pub fn udp_sport(flow_label: u32, src_qpn: u32, dst_qpn: u32) -> u16 {
    const FLOW_MASK: u32 = 0xF_FFFF;
    let fl = if flow_label & FLOW_MASK != 0 {
        flow_label & FLOW_MASK
    } else {
        let mut v = u64::from(src_qpn) * u64::from(dst_qpn);
        v ^= v >> 20;
        v ^= v >> 40;
        (v as u32) & FLOW_MASK
    };
    let low = (fl & 0x3FFF) ^ ((fl & 0xF_C000) >> 14);
    (low as u16) | 0xC000
}

/// Ethernet + IP + UDP header length.
pub const fn frame_header_len(ipv6: bool) -> usize {
    eth::HEADER_LEN + if ipv6 { ipv6::HEADER_LEN } else { ipv4::HEADER_LEN } + udp::HEADER_LEN
}

/// Pad count for a payload of `len` bytes: (−len) mod 4.
pub const fn pad_for(len: usize) -> u8 {
    (len.wrapping_neg() & 3) as u8
}

/// Total frame length for transport headers of `header_len` bytes and a payload of
/// `payload_len` bytes (pad and ICRC included).
pub const fn frame_len(ipv6: bool, header_len: usize, payload_len: usize) -> usize {
    frame_header_len(ipv6) + header_len + payload_len + pad_for(payload_len) as usize + ICRC_LEN
}

/// Write Ethernet, IP (IPv4: DF, checksum) and UDP (dport 4791, checksum 0) headers at the
/// start of `buf` for a RoCE part of `roce_len` bytes (BTH .. payload + pad; the ICRC is
/// added by the lengths here and stored by [`finish_frame`]). Returns the header length
/// (= `frame_header_len`). Errors: `BadAddress` (mixed families), `Truncated` (short
/// buffer), `BadLength` (too long for the IP length field).
pub fn emit_frame_headers(buf: &mut [u8], l3: &L3Info, roce_len: usize) -> Result<usize> {
    let v6 = l3.is_ipv6()?;
    let hl = frame_header_len(v6);
    if buf.len() < hl {
        return Err(Error::Truncated);
    }
    let udp_payload = roce_len.checked_add(ICRC_LEN).ok_or(Error::BadLength)?;
    let (e, rest) = buf[..hl].split_at_mut(eth::HEADER_LEN);
    let (ip, u) = rest.split_at_mut(hl - eth::HEADER_LEN - udp::HEADER_LEN);
    match (l3.src_ip, l3.dst_ip) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => ipv4::Repr {
            src,
            dst,
            protocol: ipv4::PROTO_UDP,
            payload_len: udp::HEADER_LEN + udp_payload,
            tos: l3.tclass,
            ttl: l3.ttl,
            ident: l3.ip_id,
        }
        .emit(&mut ipv4::Packet::new_unchecked(ip))?,
        (IpAddr::V6(src), IpAddr::V6(dst)) => ipv6::Repr {
            src,
            dst,
            next_header: ipv4::PROTO_UDP,
            payload_len: udp::HEADER_LEN + udp_payload,
            tclass: l3.tclass,
            flow_label: l3.flow_label,
            hop_limit: l3.ttl,
        }
        .emit(&mut ipv6::Packet::new_unchecked(ip))?,
        _ => return Err(Error::BadAddress),
    }
    udp::Repr { src_port: l3.udp_sport, dst_port: ROCE_PORT, payload_len: udp_payload }
        .emit(&mut udp::Packet::new_unchecked(u))?;
    eth::Repr {
        src: l3.src_mac,
        dst: l3.dst_mac,
        ethertype: if v6 { EtherType::IPV6 } else { EtherType::IPV4 },
    }
    .emit(&mut eth::Packet::new_unchecked(e));
    Ok(hl)
}

/// Where the layers of a frame are (after length validation).
#[derive(Debug, Clone, Copy)]
struct Layout {
    ip: usize,
    udp: usize,
    /// End of the UDP datagram (the ICRC is its last 4 bytes).
    end: usize,
}

/// Skip Ethernet and up to two VLAN tags; returns (EtherType, offset of L3).
#[inline]
fn l2(frame: &[u8]) -> Result<(EtherType, usize)> {
    let e = eth::Packet::new_checked(frame)?;
    let mut et = e.ethertype();
    let mut off = eth::HEADER_LEN;
    for _ in 0..2 {
        if et != EtherType::VLAN && et != EtherType::QINQ {
            break;
        }
        let tag = frame.get(off..off + 4).ok_or(Error::Truncated)?;
        et = EtherType(u16::from_be_bytes([tag[2], tag[3]]));
        off += 4;
    }
    Ok((et, off))
}

/// The IP destination of a frame as a GID (IPv4-mapped for IPv4); `None` if it is not IP.
pub fn dst_gid(frame: &[u8]) -> Option<[u8; 16]> {
    let (et, ip) = l2(frame).ok()?;
    match et {
        EtherType::IPV4 => Some(v4_gid(ipv4::Packet::new_checked(&frame[ip..]).ok()?.dst_addr())),
        EtherType::IPV6 => Some(ipv6::Packet::new_checked(&frame[ip..]).ok()?.dst_addr().octets()),
        _ => None,
    }
}

/// Compute the ICRC of a complete frame and store it in the last 4 bytes of the UDP
/// datagram (= of `frame`, for frames built here). All lengths must already be set.
pub fn finish_frame(frame: &mut [u8]) -> Result<()> {
    let l = layout(frame)?;
    let c = crate::icrc::icrc_span(&frame[l.ip..l.end - ICRC_LEN], l.udp - l.ip);
    frame[l.end - ICRC_LEN..l.end].copy_from_slice(&c.to_le_bytes());
    Ok(())
}

/// [`finish_frame`] for a frame whose RoCE part (BTH .. pad, everything between the UDP header
/// and the ICRC) the sender already hashed while writing it: `tail_crc` is
/// [`crate::icrc::transport_crc`] of the transport headers continued through the payload and the
/// pad. Only the masked IP/UDP prefix is hashed here; the two CRCs are joined by combination.
/// The result is exactly [`finish_frame`]'s.
pub fn finish_frame_with_tail_crc(frame: &mut [u8], tail_crc: u32) -> Result<()> {
    let l = layout(frame)?;
    let tail = l.udp + udp::HEADER_LEN;
    let tail_len = (l.end - ICRC_LEN - tail) as u64;
    let c = crate::icrc::icrc_from_tail(&frame[l.ip..tail], l.udp - l.ip, tail_crc, tail_len);
    frame[l.end - ICRC_LEN..l.end].copy_from_slice(&c.to_le_bytes());
    Ok(())
}

/// The Eth/IP/UDP header of one path at one RoCE length, prebuilt, with the ICRC's state over its
/// masked IP/UDP prefix. A QP's packets of one length (every MTU-sized packet of a bulk
/// transfer, every 8-byte WRITE) then cost a copy of these bytes and one CRC combination,
/// instead of emitting three headers, hashing the prefix and re-parsing the frame
/// ([`emit_frame_headers`] + [`finish_frame_with_tail_crc`], which it equals).
#[derive(Debug, Clone, Copy)]
pub struct HeaderTemplate {
    bytes: [u8; frame_header_len(true)],
    hl: u8,
    roce_len: usize,
    prefix_crc: u32,
    shift: pmrxe_crc::CrcShift,
}

impl HeaderTemplate {
    /// The header for `l3` and a RoCE part (BTH .. pad, no ICRC) of `roce_len` bytes.
    pub fn new(l3: &L3Info, roce_len: usize) -> Result<HeaderTemplate> {
        let mut bytes = [0u8; frame_header_len(true)];
        let hl = emit_frame_headers(&mut bytes, l3, roce_len)?;
        let udp = hl - udp::HEADER_LEN;
        let prefix_crc = crate::icrc::icrc_span(&bytes[eth::HEADER_LEN..hl], udp - eth::HEADER_LEN);
        Ok(HeaderTemplate { bytes, hl: hl as u8, roce_len, prefix_crc, shift: pmrxe_crc::CrcShift::new(roce_len as u64) })
    }

    /// The RoCE length it was built for.
    pub fn roce_len(&self) -> usize {
        self.roce_len
    }

    /// Eth + IP + UDP bytes.
    pub fn header_len(&self) -> usize {
        usize::from(self.hl)
    }

    /// Complete `frame` = header room ‖ the `roce_len` bytes already written ‖ 4 bytes for the
    /// ICRC: copy the header in front and, given `tail_crc` (the CRC of the RoCE bytes, BTH
    /// byte 4 masked, as `Transmit::tail_crc`), store the ICRC joined from the prefix state and
    /// it. Without a tail CRC the ICRC is left for [`seal_frame`].
    pub fn finish(&self, frame: &mut [u8], tail_crc: Option<u32>) -> Result<()> {
        let hl = self.header_len();
        let n = frame.len();
        if n != hl + self.roce_len + ICRC_LEN {
            return Err(Error::BadLength);
        }
        pmrxe_crc::copy_short(&mut frame[..hl], &self.bytes[..hl]);
        if let Some(t) = tail_crc {
            let icrc = self.shift.combine(self.prefix_crc, t);
            frame[n - ICRC_LEN..].copy_from_slice(&icrc.to_le_bytes());
        }
        Ok(())
    }
}

/// Store the ICRC of a frame laid out as [`HeaderTemplate`] and [`emit_frame_headers`] lay
/// frames out (Ethernet without VLAN tag, IP and UDP headers: `header_len` bytes, then the
/// RoCE bytes and the ICRC), hashing its IP/UDP/RoCE bytes in one pass (the masked bytes ORed
/// in by the CRC kernel as it loads them, as a receiver checks it). Equal to [`finish_frame`] on such a frame, without
/// parsing it. The transmit path seals a burst's short frames after building them all, when
/// their stores have long settled.
pub fn seal_frame(frame: &mut [u8], header_len: usize) -> Result<()> {
    let n = frame.len();
    if (header_len != frame_header_len(false) && header_len != frame_header_len(true)) || n < header_len + ICRC_LEN {
        return Err(Error::BadLength);
    }
    let udp = header_len - udp::HEADER_LEN;
    let c = crate::icrc::icrc_span(&frame[eth::HEADER_LEN..n - ICRC_LEN], udp - eth::HEADER_LEN);
    frame[n - ICRC_LEN..].copy_from_slice(&c.to_le_bytes());
    Ok(())
}

fn layout(frame: &[u8]) -> Result<Layout> {
    let (et, ip) = l2(frame)?;
    let (udp_off, ip_end) = match et {
        EtherType::IPV4 => {
            let p = ipv4::Packet::new_checked(&frame[ip..])?;
            if p.version() != 4 {
                return Err(Error::BadIpHeader);
            }
            (ip + p.header_len(), ip + usize::from(p.total_len()))
        }
        EtherType::IPV6 => {
            let p = ipv6::Packet::new_checked(&frame[ip..])?;
            (ip + ipv6::HEADER_LEN, ip + ipv6::HEADER_LEN + usize::from(p.payload_len()))
        }
        _ => return Err(Error::NotIp),
    };
    let u = udp::Packet::new_checked(&frame[udp_off..ip_end])?;
    let end = udp_off + usize::from(u.len());
    if end != ip_end {
        return Err(Error::BadLength);
    }
    if usize::from(u.len()) < udp::HEADER_LEN + crate::bth::HEADER_LEN + ICRC_LEN {
        return Err(Error::Truncated);
    }
    Ok(Layout { ip, udp: udp_off, end })
}

/// Options for [`parse_frame_with`] (offload knobs are parameters, not globals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseOptions {
    /// Verify the ICRC (turn off only when hardware already did).
    pub verify_icrc: bool,
}

impl Default for ParseOptions {
    fn default() -> ParseOptions {
        ParseOptions { verify_icrc: true }
    }
}

/// A validated RoCEv2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceFrame<'a> {
    /// Source MAC.
    pub src_mac: MacAddr,
    /// Destination MAC.
    pub dst_mac: MacAddr,
    /// Source IP.
    pub src_ip: IpAddr,
    /// Destination IP.
    pub dst_ip: IpAddr,
    /// IPv4 TOS / IPv6 traffic class (DSCP << 2 | ECN).
    pub tclass: u8,
    /// TTL / hop limit.
    pub ttl: u8,
    /// IPv6 flow label (0 for IPv4).
    pub flow_label: u32,
    /// IPv4 identification (0 for IPv6).
    pub ip_id: u16,
    /// UDP source port.
    pub udp_sport: u16,
    /// BTH and extension headers.
    pub headers: TransportHeaders,
    /// Payload without pad and ICRC.
    pub payload: &'a [u8],
    /// The ICRC as stored (verified unless `ParseOptions::verify_icrc` was off).
    pub icrc: u32,
    /// Offset of the BTH in the frame.
    pub bth_offset: usize,
}

impl<'a> RoceFrame<'a> {
    /// Whether the frame is IPv6.
    pub fn is_ipv6(&self) -> bool {
        self.src_ip.is_ipv6()
    }

    /// The receive view of this frame ([`RxFrame`]), with `check` as its ICRC check
    /// ([`IcrcCheck::BLANK`] when the ICRC was verified by the parse).
    pub fn rx_frame(&self, check: IcrcCheck) -> RxFrame<'a> {
        let gid = |ip: IpAddr| match ip {
            IpAddr::V4(v) => v4_gid(v),
            IpAddr::V6(v) => v.octets(),
        };
        RxFrame {
            src_mac: self.src_mac,
            src_gid: gid(self.src_ip),
            dst_gid: gid(self.dst_ip),
            v6: self.is_ipv6(),
            tclass: self.tclass,
            ttl: self.ttl,
            flow_label: self.flow_label,
            udp_sport: self.udp_sport,
            payload: self.payload,
            check,
        }
    }
}

/// Parse and fully validate a RoCEv2 frame (ICRC verified). See the module doc for the
/// checks and their order. ARP and ICMPv6 frames give `Err(Arp)` / `Err(Icmpv6)`.
pub fn parse_frame(frame: &[u8]) -> Result<RoceFrame<'_>> {
    parse_frame_with(frame, &ParseOptions::default())
}

/// Ethernet/IP/UDP of a RoCEv2 frame, validated: addresses, where the RoCE part is, and what
/// the ICRC needs. Shared by [`parse_frame_with`] and [`crate::cnp::parse_cnp_frame`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outer {
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
    /// Source and destination as GIDs (IPv4 as ::ffff:a.b.c.d): plain bytes, cheap to copy
    /// (an `IpAddr` moved on is a 17-byte enum read back wider than it was written).
    pub src_gid: [u8; 16],
    pub dst_gid: [u8; 16],
    pub v6: bool,
    pub tclass: u8,
    pub ttl: u8,
    pub flow_label: u32,
    pub ip_id: u16,
    pub udp_sport: u16,
    /// Offset of the IP header.
    pub ip: usize,
    /// Offset of the UDP header.
    pub udp_off: usize,
    /// End of the UDP datagram (the ICRC is its last 4 bytes).
    pub ip_end: usize,
    /// Offset of the BTH.
    pub bth_offset: usize,
}

impl Outer {
    pub(crate) fn src_ip(&self) -> IpAddr {
        gid_to_ip(&self.src_gid, self.v6)
    }
    pub(crate) fn dst_ip(&self) -> IpAddr {
        gid_to_ip(&self.dst_gid, self.v6)
    }
    /// The stored ICRC (little-endian in the last 4 bytes of the datagram).
    #[inline]
    pub(crate) fn stored_icrc(&self, frame: &[u8]) -> u32 {
        let c = &frame[self.ip_end - ICRC_LEN..self.ip_end];
        u32::from_le_bytes([c[0], c[1], c[2], c[3]])
    }
    /// Does the stored ICRC match?
    pub(crate) fn icrc_ok(&self, frame: &[u8]) -> bool {
        crate::icrc::icrc_span(&frame[self.ip..self.ip_end - ICRC_LEN], self.udp_off - self.ip) == self.stored_icrc(frame)
    }
}

/// Validate Ethernet (VLANs skipped), IP and UDP (port 4791, lengths) and that the datagram
/// holds at least a BTH and an ICRC.
#[inline]
pub(crate) fn outer(frame: &[u8]) -> Result<Outer> {
    let (et, ip) = l2(frame)?;
    let e = eth::Packet::new_unchecked(frame);
    let (src_mac, dst_mac) = (e.src(), e.dst());
    let l3 = &frame[ip..];
    let (src_gid, dst_gid, v6, tclass, ttl, flow_label, ip_id, udp_off, ip_end);
    // The checks of `ipv4::Repr::parse` / `ipv6::Repr::parse` / `udp::Repr::parse`, in their
    // order, reading the fields straight from the checked packets (a `Repr` returned through a
    // `Result` and read back cost a store-forwarding stall per frame).
    match et {
        EtherType::IPV4 => {
            let p = ipv4::Packet::new_checked(l3)?;
            if p.version() != 4 {
                return Err(Error::BadIpHeader);
            }
            if p.is_fragment() {
                return Err(Error::Fragment);
            }
            if p.protocol() != ipv4::PROTO_UDP {
                return Err(Error::NotUdp);
            }
            (src_gid, dst_gid, v6) = (v4_gid(p.src_addr()), v4_gid(p.dst_addr()), false);
            (tclass, ttl, flow_label, ip_id) = (p.tos(), p.ttl(), 0, p.ident());
            udp_off = ip + p.header_len();
            ip_end = ip + usize::from(p.total_len());
        }
        EtherType::IPV6 => {
            let p = ipv6::Packet::new_checked(l3)?;
            if p.version() != 6 {
                return Err(Error::BadIpHeader);
            }
            match p.next_header() {
                ipv4::PROTO_UDP => {}
                crate::icmpv6::NEXT_HEADER => return Err(Error::Icmpv6),
                _ => return Err(Error::NotUdp),
            }
            (src_gid, dst_gid, v6) = (p.src_addr().octets(), p.dst_addr().octets(), true);
            (tclass, ttl, flow_label, ip_id) = (p.traffic_class(), p.hop_limit(), p.flow_label(), 0);
            udp_off = ip + ipv6::HEADER_LEN;
            ip_end = udp_off + usize::from(p.payload_len());
        }
        EtherType::ARP => return Err(Error::Arp),
        _ => return Err(Error::NotIp),
    }
    let u = udp::Packet::new_checked(&frame[udp_off..ip_end])?;
    if u.dst_port() != ROCE_PORT {
        return Err(Error::NotRoce);
    }
    if usize::from(u.len()) != ip_end - udp_off {
        return Err(Error::BadLength);
    }
    let bth_offset = udp_off + udp::HEADER_LEN;
    if ip_end - bth_offset < crate::bth::HEADER_LEN + ICRC_LEN {
        return Err(Error::Truncated);
    }
    let udp_sport = u.src_port();
    Ok(Outer { src_mac, dst_mac, src_gid, dst_gid, v6, tclass, ttl, flow_label, ip_id, udp_sport, ip, udp_off, ip_end, bth_offset })
}

/// [`parse_frame`] with options.
pub fn parse_frame_with<'a>(frame: &'a [u8], opts: &ParseOptions) -> Result<RoceFrame<'a>> {
    let (f, o, _) = parse_unverified(frame)?;
    if opts.verify_icrc && !o.icrc_ok(frame) {
        return Err(Error::BadIcrc);
    }
    Ok(f)
}

/// [`parse_frame`] with the ICRC check deferred to the consumer of the payload: every other
/// check is made (so garbage costs no CRC pass), and the returned [`IcrcCheck`] carries the CRC
/// of everything before the payload, to be continued over the payload while it is copied (one
/// pass per byte) or checked at once with [`IcrcCheck::verify`]. Nothing may act on the frame
/// before its check passed (see docs/reliability.md, "ICRC and placement").
pub fn parse_frame_deferred(frame: &[u8]) -> Result<(RoceFrame<'_>, IcrcCheck)> {
    let (f, o, payload_off) = parse_unverified(frame)?;
    let check = IcrcCheck::new(&frame[o.ip..o.ip_end - ICRC_LEN], o.udp_off - o.ip, payload_off - o.udp_off, f.payload.len(), f.icrc);
    Ok((f, check))
}

/// Everything but the ICRC; also returns the outer layout and the payload's frame offset.
fn parse_unverified(frame: &[u8]) -> Result<(RoceFrame<'_>, Outer, usize)> {
    let o = outer(frame)?;
    let body = &frame[o.bth_offset..o.ip_end - ICRC_LEN];
    let mut headers = TransportHeaders::BLANK;
    let hlen = headers.parse_into(body)?;
    let payload = payload_of(&headers, body, hlen)?;
    let f = RoceFrame {
        src_mac: o.src_mac,
        dst_mac: o.dst_mac,
        src_ip: o.src_ip(),
        dst_ip: o.dst_ip(),
        tclass: o.tclass,
        ttl: o.ttl,
        flow_label: o.flow_label,
        ip_id: o.ip_id,
        udp_sport: o.udp_sport,
        headers,
        payload,
        icrc: o.stored_icrc(frame),
        bth_offset: o.bth_offset,
    };
    Ok((f, o, o.bth_offset + hlen))
}

/// The payload of a RoCE `body` (BTH .. pad, no ICRC) whose `hlen` bytes of transport headers
/// are `h`, after the pad rules: IBA 9.7.7, payload + pad is a whole number of 4-byte words,
/// FIRST/MIDDLE carry full-MTU payloads and so never a pad, opcodes without payload have none.
#[inline]
fn payload_of<'a>(h: &TransportHeaders, body: &'a [u8], hlen: usize) -> Result<&'a [u8]> {
    let info = h.bth.opcode.info().ok_or(Error::UnknownOpcode(h.bth.opcode.0))?;
    let rest = body.len() - hlen; // payload + pad
    let pad = usize::from(h.bth.pad);
    if !info.has_payload() {
        if rest != 0 {
            return Err(Error::BadLength);
        }
        if pad != 0 {
            return Err(Error::BadPad);
        }
    } else {
        #[allow(clippy::manual_is_multiple_of)] // MSRV 1.80
        if rest % 4 != 0 || pad > rest || (info.full_mtu_payload() && pad != 0) {
            return Err(Error::BadPad);
        }
    }
    Ok(&body[hlen..hlen + rest - pad])
}

/// A received RoCEv2 frame as the data path consumes it ([`parse_frame_into`]): what the
/// Ethernet/IP/UDP headers say, the payload and the deferred ICRC check. Its transport
/// headers were parsed into the caller's [`TransportHeaders`].
#[derive(Debug, Clone, Copy)]
pub struct RxFrame<'a> {
    /// Source MAC.
    pub src_mac: MacAddr,
    /// Source IP as a GID (IPv4 as ::ffff:a.b.c.d; [`RxFrame::src_ip`] gives the address).
    pub src_gid: [u8; 16],
    /// Destination IP as a GID.
    pub dst_gid: [u8; 16],
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// IPv4 TOS / IPv6 traffic class (DSCP << 2 | ECN).
    pub tclass: u8,
    /// TTL / hop limit.
    pub ttl: u8,
    /// IPv6 flow label (0 for IPv4).
    pub flow_label: u32,
    /// UDP source port.
    pub udp_sport: u16,
    /// Payload without pad and ICRC.
    pub payload: &'a [u8],
    /// The ICRC check, deferred as by [`parse_frame_deferred`].
    pub check: IcrcCheck,
}

impl RxFrame<'_> {
    /// A value to parse into ([`parse_frame_into`]).
    pub const BLANK: RxFrame<'static> = RxFrame {
        src_mac: MacAddr([0; 6]),
        src_gid: [0; 16],
        dst_gid: [0; 16],
        v6: false,
        tclass: 0,
        ttl: 0,
        flow_label: 0,
        udp_sport: 0,
        payload: &[],
        check: IcrcCheck::BLANK,
    };

    /// Source IP.
    pub fn src_ip(&self) -> IpAddr {
        gid_to_ip(&self.src_gid, self.v6)
    }

    /// Destination IP.
    pub fn dst_ip(&self) -> IpAddr {
        gid_to_ip(&self.dst_gid, self.v6)
    }
}

/// An IPv4 address as a GID (::ffff:a.b.c.d), built in two words: written byte by byte, it was
/// read back in words by the GID compares a store-forwarding stall per frame later.
#[inline(always)]
fn v4_gid(a: Ipv4Addr) -> [u8; 16] {
    ((0xFFFF_u128 << 32) | u128::from(u32::from(a))).to_be_bytes()
}

/// The IP address of a GID as `outer` writes them (IPv4 in the last four bytes).
fn gid_to_ip(gid: &[u8; 16], v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(*gid))
    } else {
        IpAddr::V4(Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
    }
}

/// [`parse_frame_deferred`] for the receive path: the same checks in the same order, but the
/// transport headers are parsed straight into `headers` (the packet the caller hands on) and
/// the rest into `out`, so no 136-byte header value or frame value is built and then moved
/// through each layer (those moves, and the store-forwarding stalls of reading back in wide
/// words what was just written field by field, were most of the parse's cost per small
/// packet). On error `headers` and `out` hold no meaning.
#[inline]
pub fn parse_frame_into<'a>(frame: &'a [u8], headers: &mut TransportHeaders, out: &mut RxFrame<'a>) -> Result<()> {
    parse_frame_routed(frame, headers, out, |_| true).map(|_| ())
}

/// [`parse_frame_into`] with a routing decision before the transport headers are parsed and
/// before any ICRC work: once the Ethernet, IP and UDP headers and the lengths have been
/// checked, `here(dest_qp)` (BTH.DestQP) says whether this receiver consumes the frame. If not,
/// the parse stops there and returns `Ok(false)` with `headers` and `out` untouched and no
/// byte hashed: the receiver that owns the QP parses the frame again, checks everything else
/// and verifies the ICRC once, there.
#[inline]
pub fn parse_frame_routed<'a>(frame: &'a [u8], headers: &mut TransportHeaders, out: &mut RxFrame<'a>, here: impl FnOnce(u32) -> bool) -> Result<bool> {
    let o = outer(frame)?;
    let span = &frame[o.ip..o.ip_end - ICRC_LEN];
    let body = &frame[o.bth_offset..o.ip_end - ICRC_LEN];
    // A body too short for a BTH is left to `parse_into` to refuse.
    if let [_, _, _, _, _, q0, q1, q2, ..] = *body {
        if !here(u32::from_be_bytes([0, q0, q1, q2])) {
            return Ok(false);
        }
    }
    let hlen = headers.parse_into(body)?;
    let payload = payload_of(headers, body, hlen)?;
    let payload_off = o.bth_offset + hlen - o.udp_off;
    out.check = IcrcCheck::new(span, o.udp_off - o.ip, payload_off, payload.len(), o.stored_icrc(frame));
    out.src_mac = o.src_mac;
    out.src_gid = o.src_gid;
    out.dst_gid = o.dst_gid;
    out.v6 = o.v6;
    out.tclass = o.tclass;
    out.ttl = o.ttl;
    out.flow_label = o.flow_label;
    out.udp_sport = o.udp_sport;
    out.payload = payload;
    Ok(true)
}

/// Build a complete frame into `buf`: headers, payload, zero pad, ICRC. The BTH pad count
/// is set from `payload.len()` (whatever `headers.bth.pad` says). Returns the frame length.
pub fn build_frame(buf: &mut [u8], l3: &L3Info, headers: &TransportHeaders, payload: &[u8]) -> Result<usize> {
    let v6 = l3.is_ipv6()?;
    let mut h = *headers;
    h.bth.pad = pad_for(payload.len());
    h.check()?;
    let hl = frame_header_len(v6);
    let total = frame_len(v6, h.header_len(), payload.len());
    if buf.len() < total {
        return Err(Error::Truncated);
    }
    let n = h.emit(&mut buf[hl..])?;
    let p = hl + n;
    buf[p..p + payload.len()].copy_from_slice(payload);
    let pad_end = p + payload.len() + usize::from(h.bth.pad);
    buf[p + payload.len()..pad_end].fill(0);
    emit_frame_headers(buf, l3, pad_end - hl)?;
    finish_frame(&mut buf[..total])?;
    Ok(total)
}

/// [`build_frame`] into a new `Vec` (tests, samples, control path).
pub fn build_frame_vec(l3: &L3Info, headers: &TransportHeaders, payload: &[u8]) -> Result<Vec<u8>> {
    let mut v = vec![0u8; frame_len(l3.is_ipv6()?, headers.header_len(), payload.len())];
    let n = build_frame(&mut v, l3, headers, payload)?;
    v.truncate(n);
    Ok(v)
}
