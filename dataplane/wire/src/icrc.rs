//! RoCEv2 invariant CRC (SEMANTICS.md §5.7).
//!
//! CRC-32 (zlib/Ethernet: reflected 0xEDB88320, init and final XOR 0xFFFFFFFF) over, in order:
//! 8 bytes of 0xFF (the masked LRH), the IP header with its variant fields set to ones
//! (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop limit), the UDP
//! header with its checksum set to 0xFFFF, the BTH with byte 4 (FECN, BECN, resv6) set to
//! 0xFF, then the rest of the datagram up to (not including) the ICRC. Stored little-endian.
//!
//! Where the IP header and the datagram are one span of a frame (every data-path caller:
//! [`icrc_span`]) nothing is copied: the CRC kernel ORs the masked bytes into the header words
//! as it loads them (`pmrxe_crc::crc_update_masked`). [`icrc`], for separate slices, hashes a
//! masked copy of the headers.
//!
//! # One pass per byte on the data path
//! The CRC kernels are `pmrxe_crc`'s (AVX-512/VPCLMULQDQ, PCLMULQDQ or portable, chosen at
//! run time). The data path does not hash the payload separately from copying it:
//!
//! * **send**: a packet with at most 128 payload bytes is copied and its finished frame hashed
//!   whole, in one update, once its burst is built ([`crate::seal_frame`]). A longer one's
//!   payload is hashed from zero while it is gathered into the frame (`pmrxe_crc::copy_and_crc`),
//!   then the pad, then the transport headers ([`transport_crc`], BTH byte 4 masked: hashed
//!   last, their stores have settled), joined by CRC combination into the *tail CRC*;
//!   [`crate::finish_frame_with_tail_crc`] (or the path's header template) hashes only the
//!   masked IP/UDP prefix and joins the two ([`icrc_from_tail`]);
//! * **receive**: [`crate::parse_frame_deferred`] validates everything but the ICRC and returns
//!   an [`IcrcCheck`]: the CRC up to the payload ([`IcrcCheck::seed`]), which the transport
//!   continues while scattering the payload into memory and then tests with
//!   [`IcrcCheck::matches`] — or, where memory must not change before the check, tests up front
//!   with [`IcrcCheck::verify`] (docs/reliability.md, "ICRC and placement").

use pmrxe_crc::{crc_update, crc_update_masked, CrcShift, Mask};

use crate::{bth, ipv4, ipv6, udp};

/// ICRC length.
pub const ICRC_LEN: usize = 4;

/// Longest IPv4 header (IHL 15).
const IPV4_MAX_HDR: usize = 60;

/// Longest set of extension headers one opcode carries (AtomicETH).
const MAX_EXT_LEN: usize = 28;

/// Compute the ICRC.
///
/// `ip_header` is the whole IP header (IPv4 with options, or the 40-byte IPv6 header; the
/// version nibble decides). `udp_datagram` is the UDP header and payload **without** the
/// trailing 4 ICRC bytes. Never panics: headers shorter than expected are hashed as given
/// (a caller that validated lengths never passes those).
pub fn icrc(ip_header: &[u8], udp_datagram: &[u8]) -> u32 {
    // One stack buffer holds the masked IP header, the UDP header, the BTH and up to 28 more
    // bytes (the longest set of extension headers, or the start of the payload), so the CRC of
    // a receive check's headers, or of a whole small datagram, is one update: small updates are
    // the expensive part for short packets.
    const HEAD: usize = udp::HEADER_LEN + bth::HEADER_LEN + MAX_EXT_LEN;
    let mut buf = [0u8; IPV4_MAX_HDR + HEAD];
    let h = CRC_OF_8_FF;

    let n = ip_header.len().min(IPV4_MAX_HDR);
    buf[..n].copy_from_slice(&ip_header[..n]);
    if n > 0 && buf[0] >> 4 == 6 {
        if n >= 8 {
            buf[0] |= 0x0F; // low nibble of byte 0 is the top of the traffic class
            buf[1] = 0xFF;
            buf[2] = 0xFF;
            buf[3] = 0xFF;
            buf[7] = 0xFF; // hop limit
        }
    } else {
        for &o in &ipv4::ICRC_MASKED {
            if o < n {
                buf[o] = 0xFF;
            }
        }
    }
    if n < ip_header.len() {
        // Longer than any valid IPv4 header: hash as given (only reachable with garbage).
        let h = crc_update(crc_update(h, &buf[..n]), &ip_header[n..]);
        return finish_udp(h, udp_datagram);
    }

    let m = udp_datagram.len().min(HEAD);
    buf[n..n + m].copy_from_slice(&udp_datagram[..m]);
    for o in [udp::CHECKSUM_OFFSET, udp::CHECKSUM_OFFSET + 1, udp::HEADER_LEN + bth::FECN_BECN_OFFSET] {
        if o < m {
            buf[n + o] = 0xFF;
        }
    }
    crc_update(crc_update(h, &buf[..n + m]), &udp_datagram[m..])
}

/// The ICRC of `span` = an IP header of `ip_len` bytes followed by its UDP datagram without
/// the ICRC (one slice of a frame): equal to [`icrc`]`(&span[..ip_len], &span[ip_len..])`.
///
/// For IPv4 without options and IPv6 the bytes the ICRC sets to ones are ORed in by the CRC
/// kernel as it loads the header words ([`V4_MASK`], [`V6_MASK`]): no masked copy, and so no
/// store-forwarding stall on one (a copy masked with byte stores stalled the kernel's 16-byte
/// loads; one built from masked words cost ~100 instructions a frame to build and store).
#[inline]
pub fn icrc_span(span: &[u8], ip_len: usize) -> u32 {
    let mask = match (span.first().map(|b| b >> 4), ip_len) {
        (Some(4), ipv4::HEADER_LEN) => &V4_MASK,
        (Some(6), ipv6::HEADER_LEN) => &V6_MASK,
        _ => {
            let (ip, udp) = span.split_at(ip_len.min(span.len()));
            return icrc(ip, udp);
        }
    };
    crc_update_masked(CRC_OF_8_FF, span, mask)
}

/// The bytes the ICRC sets to ones in IPv4 (IHL 5) ‖ UDP ‖ BTH, as 16-byte little-endian lanes:
/// TOS (1), TTL (8), header checksum (10, 11); UDP checksum (20 + 6, 20 + 7); BTH byte 4
/// (20 + 8 + 4). A test checks them against the byte offsets the general path uses.
const V4_MASK: Mask = [(0xFF << 8) | (0xFF << 64) | (0xFFFF << 80), 0xFFFF << 80, 0xFF, 0];

/// The same for IPv6 ‖ UDP ‖ BTH: traffic class and flow label (the low nibble of byte 0,
/// bytes 1..4), hop limit (7); UDP checksum (40 + 6, 40 + 7); BTH byte 4 (40 + 8 + 4).
const V6_MASK: Mask = [0x0F | (0xFF_FFFF << 8) | (0xFF << 56), 0, 0xFFFF << 112, 0xFF << 32];

/// CRC-32 of 8 bytes of 0xFF (the masked LRH); `!` of rxe's seed 0xDEBB20E3.
const CRC_OF_8_FF: u32 = !0xDEBB_20E3;

#[cold]
fn finish_udp(h: u32, udp_datagram: &[u8]) -> u32 {
    const HEAD: usize = udp::HEADER_LEN + bth::HEADER_LEN;
    let mut head = [0u8; HEAD];
    let m = udp_datagram.len().min(HEAD);
    head[..m].copy_from_slice(&udp_datagram[..m]);
    for o in [udp::CHECKSUM_OFFSET, udp::CHECKSUM_OFFSET + 1, udp::HEADER_LEN + bth::FECN_BECN_OFFSET] {
        if o < m {
            head[o] = 0xFF;
        }
    }
    crc_update(crc_update(h, &head[..m]), &udp_datagram[m..])
}

/// CRC (zlib convention, from 0) of RoCE transport-header bytes (BTH and extension headers) as
/// the ICRC sees them: BTH byte 4 (FECN, BECN, resv6) as 0xFF. A sender continues it through
/// the payload and the pad (the *tail CRC* of [`icrc_from_tail`]), or joins it to the
/// payload's CRC by combination.
///
/// Byte 4 is ORed in by the CRC kernel as it loads the first word: setting it with a byte
/// store, in a copy or in place, made the kernel's first 16-byte load wait for that store (a
/// store-forwarding stall per packet).
#[inline]
pub fn transport_crc(headers: &[u8]) -> u32 {
    const BTH_MASK: Mask = [0xFF << (8 * bth::FECN_BECN_OFFSET), 0, 0, 0];
    crc_update_masked(0, headers, &BTH_MASK)
}

/// The ICRC of a datagram from `prefix` = its IP header (`ip_len` bytes) and 8-byte UDP
/// header, and the CRC (zlib, from 0, BTH byte 4 masked) of the `tail_len` bytes after the UDP
/// header up to the ICRC: the masked prefix is hashed and joined with `tail_crc` by CRC
/// combination. Equal to [`icrc_span`]`(prefix ‖ tail, ip_len)`.
pub fn icrc_from_tail(prefix: &[u8], ip_len: usize, tail_crc: u32, tail_len: u64) -> u32 {
    CrcShift::new(tail_len).combine(icrc_span(prefix, ip_len), tail_crc)
}

/// The ICRC check of a received frame, deferred to where its payload is consumed: the CRC of
/// everything before the payload, the pad bytes and the ICRC as stored. Made by
/// [`crate::parse_frame_deferred`].
///
/// A short datagram (at most [`SETTLE_LEN`] bytes before the ICRC) is checked at once, in one
/// CRC pass over all of it: deferring would cost more CRC calls than bytes. Such a check is
/// [`settled`](IcrcCheck::settled); [`verify`](IcrcCheck::verify) and
/// [`matches`](IcrcCheck::matches) then give its result whatever they are passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcrcCheck {
    seed: u32,
    pad: [u8; 3],
    pad_len: u8,
    stored: u32,
    /// 0: open (deferred); 1: checked, good; 2: checked, bad.
    settled: u8,
}

/// Datagrams (UDP header .. pad) up to this length are checked when parsed.
pub const SETTLE_LEN: usize = 128;

impl IcrcCheck {
    /// A placeholder to be overwritten (it matches nothing in particular).
    pub const BLANK: IcrcCheck = IcrcCheck { seed: 0, pad: [0; 3], pad_len: 0, stored: 0, settled: 0 };

    /// `span` = the IP header (`ip_len` bytes) and the UDP datagram without its ICRC, where the
    /// payload starts in the datagram and how long it is (the pad follows), and the stored
    /// ICRC.
    #[inline]
    pub(crate) fn new(span: &[u8], ip_len: usize, payload_off: usize, payload_len: usize, stored: u32) -> IcrcCheck {
        let udp_datagram = &span[ip_len..];
        if udp_datagram.len() <= SETTLE_LEN {
            let good = icrc_span(span, ip_len) == stored;
            return IcrcCheck { seed: 0, pad: [0; 3], pad_len: 0, stored, settled: if good { 1 } else { 2 } };
        }
        let pad_bytes = &udp_datagram[payload_off + payload_len..];
        let mut pad = [0u8; 3];
        let pad_len = pad_bytes.len().min(3);
        // Byte by byte, unrolled: a slice copy (or a loop, which LLVM turns back into one) of
        // 0..=3 bytes was a memcpy call per frame.
        for (i, d) in pad.iter_mut().enumerate() {
            if i < pad_len {
                *d = pad_bytes[i];
            }
        }
        IcrcCheck { seed: icrc_span(&span[..ip_len + payload_off], ip_len), pad, pad_len: pad_len as u8, stored, settled: 0 }
    }

    /// Already checked (a short datagram): the result. A consumer places such a packet's
    /// payload only after a good check, with a plain copy.
    #[inline]
    pub fn settled(&self) -> Option<bool> {
        (self.settled != 0).then_some(self.settled == 1)
    }

    /// The CRC up to the first payload byte: fold the payload into it (e.g. while copying it
    /// with `pmrxe_crc::copy_and_crc`) and give the result to [`matches`](IcrcCheck::matches).
    #[inline]
    pub fn seed(&self) -> u32 {
        self.seed
    }

    /// Does the stored ICRC match, given `after_payload` = the [`seed`](IcrcCheck::seed) with
    /// the whole payload folded in?
    #[inline]
    pub fn matches(&self, after_payload: u32) -> bool {
        if let Some(good) = self.settled() {
            return good;
        }
        // Full-MTU payloads have no pad: no CRC update of zero bytes.
        let crc = if self.pad_len == 0 { after_payload } else { crc_update(after_payload, &self.pad[..usize::from(self.pad_len)]) };
        crc == self.stored
    }

    /// Check now, hashing `payload` (the frame's payload, without pad): for packets whose
    /// effects must wait for the check.
    #[inline]
    pub fn verify(&self, payload: &[u8]) -> bool {
        if let Some(good) = self.settled() {
            return good;
        }
        self.matches(crc_update(self.seed, payload))
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn seed_matches_rxe_constant() {
        // rxe seeds its CRC with 0xDEBB20E3 = the raw state after 8 x 0xFF.
        assert_eq!(!crc32fast::hash(&[0xFF; 8]), 0xDEBB20E3);
        assert_eq!(crc32fast::hash(&[0xFF; 8]), CRC_OF_8_FF);
    }

    /// The span path (masks ORed in by the kernel) equals the byte-by-byte masked copy for
    /// IPv4 and IPv6, every datagram length, random bytes (the masks too: V4_MASK and V6_MASK
    /// against the offsets the general path sets).
    #[test]
    fn span_masks_equal_the_byte_path() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        };
        for v6 in [false, true] {
            let il = if v6 { 40 } else { 20 };
            for len in 0..300 {
                for _ in 0..4 {
                    let mut ip: Vec<u8> = (0..il).map(|_| rnd()).collect();
                    ip[0] = if v6 { 0x60 | (ip[0] & 0x0F) } else { 0x45 };
                    let udp: Vec<u8> = (0..len).map(|_| rnd()).collect();
                    let mut m = ip.clone();
                    if v6 {
                        m[0] |= 0x0F;
                        for o in [1, 2, 3, 7] {
                            m[o] = 0xFF;
                        }
                    } else {
                        for &o in &ipv4::ICRC_MASKED {
                            m[o] = 0xFF;
                        }
                    }
                    let mut u = udp.clone();
                    for o in [udp::CHECKSUM_OFFSET, udp::CHECKSUM_OFFSET + 1, udp::HEADER_LEN + bth::FECN_BECN_OFFSET] {
                        if o < len {
                            u[o] = 0xFF;
                        }
                    }
                    let want = crc32fast::hash(&[&[0xFFu8; 8][..], &m, &u].concat());
                    assert_eq!(icrc_span(&[&ip[..], &udp].concat(), il), want, "v6 {v6} {len} bytes");
                    assert_eq!(icrc(&ip, &udp), want, "v6 {v6} {len} bytes");
                }
            }
        }
    }

    #[test]
    fn transport_crc_masks_byte_4_only() {
        let mut h = [0x11u8; 28];
        let base = transport_crc(&h);
        h[bth::FECN_BECN_OFFSET] = 0x00;
        assert_eq!(transport_crc(&h), base);
        h[3] ^= 1;
        assert_ne!(transport_crc(&h), base);
        let mut masked = [0x11u8; 28];
        masked[bth::FECN_BECN_OFFSET] = 0xFF;
        assert_eq!(base, crc32fast::hash(&masked));
        // Longer than the stack copy: the rest is hashed in place.
        let long = [0x22u8; 100];
        let mut m = long;
        m[bth::FECN_BECN_OFFSET] = 0xFF;
        assert_eq!(transport_crc(&long), crc32fast::hash(&m));
        // Every length, through the word path (12..=64) and the byte path: byte 4 masked.
        for n in 0..=100usize {
            let p: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(37).wrapping_add(1)).collect();
            let mut m = p.clone();
            if n > bth::FECN_BECN_OFFSET {
                m[bth::FECN_BECN_OFFSET] = 0xFF;
            }
            assert_eq!(transport_crc(&p), crc32fast::hash(&m), "{n} bytes");
        }
    }

    #[test]
    fn f1_scapy_uc_send_only_vector() {
        // Independent vector from icrc_check.py's selftest (scapy's UC SEND_ONLY example):
        // ICRC bytes 78 f3 53 f3.
        let pl: &[u8] = b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00";
        let mut ib = vec![0x24, 0x40 | (2 << 4), 0xFF, 0xFF, 0, 0, 0, 211, 0];
        ib.extend_from_slice(&13571856u32.to_be_bytes()[1..]);
        ib.extend_from_slice(pl);
        let udp_len = (8 + ib.len() + 4) as u16;
        let mut udp = vec![0xC0, 0x00, 0x12, 0xB7];
        udp.extend_from_slice(&udp_len.to_be_bytes());
        udp.extend_from_slice(&[0, 0]);
        udp.extend_from_slice(&ib);
        let tl = (20 + udp_len).to_be_bytes();
        let ip = [
            0x45, 1, tl[0], tl[1], 0x04, 0x78, 0x40, 0, 64, 17, 0, 0, 192, 168, 0, 7, 192, 168, 0, 7,
        ];
        assert_eq!(icrc(&ip, &udp).to_le_bytes(), [0x78, 0xf3, 0x53, 0xf3]);
    }
}
