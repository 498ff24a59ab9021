//! Receive header prediction (after Van Jacobson's for TCP): the MIDDLE packets of a long
//! message carry the same Ethernet, IP, UDP and BTH bytes as the one before them but for the
//! PSN and the AckReq bit. An [`RxPrediction`] holds the header of such a packet that the full
//! parse ([`parse_frame_routed`](crate::parse_frame_routed)) accepted; a later frame whose
//! header bytes equal it, except in the fields a sender changes per packet, and whose length
//! equals it, parses to the same result with those fields replaced — so the prediction writes
//! that result directly, with a handful of word compares instead of the parse.
//!
//! Equivalence is the contract: whenever [`RxPrediction::parse_into`] returns true, the full
//! parse of the same frame returns `Ok(true)` with the same headers and the same [`RxFrame`]
//! (tests below, and a property test in `tests/frames.rs`). A frame the prediction
//! does not match is simply parsed in full.
//!
//! Fields a sender may change per packet, not compared:
//! - BTH PSN and AckReq: copied from the frame into the headers;
//! - IPv4 identification and header checksum, UDP checksum: the full parse ignores them (the
//!   identification is covered by the ICRC, checked by the consumer as after a full parse).
//!
//! Everything else is compared: a CE mark, another source port or flow label, another
//! opcode, P_Key or destination QP, a VLAN or length change all make the frame take the
//! full parse.
use crate::frame::{outer, RxFrame};
use crate::icrc::{IcrcCheck, ICRC_LEN};
use crate::{bth, Psn, TransportHeaders};

/// Bytes of the frame's head that are compared (IPv6 without VLAN tags: 74 header bytes).
const HEAD: usize = 80;
const WORDS: usize = HEAD / 8;

/// The header of a frame the full parse accepted, to predict the next ones with (see the
/// module documentation).
#[derive(Debug, Clone)]
pub struct RxPrediction {
    /// The frame's first `HEAD` bytes, as native-endian words.
    image: [u64; WORDS],
    /// Which bits of `image` a frame must equal: the headers (Ethernet .. BTH) but for the
    /// per-packet fields; nothing past the BTH.
    mask: [u64; WORDS],
    /// Frame length.
    len: u32,
    /// Offsets in the frame: IP header, UDP header, BTH, payload, end of the UDP datagram.
    ip: u16,
    udp: u16,
    bth: u16,
    payload: u16,
    ip_end: u16,
    payload_len: u16,
    /// The full parse's results for the recorded frame (PSN and AckReq are replaced per frame;
    /// the frame's payload and ICRC check too).
    headers: TransportHeaders,
    frame: RxFrame<'static>,
}

#[inline(always)]
fn words(head: &[u8]) -> [u64; WORDS] {
    let mut w = [0u64; WORDS];
    for (i, x) in w.iter_mut().enumerate() {
        *x = u64::from_ne_bytes(head[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    }
    w
}

impl RxPrediction {
    /// A prediction from `frame`, which the full parse accepts: only for a packet that is
    /// nothing but a BTH and a full payload (a MIDDLE packet: SEND, WRITE or READ response)
    /// with its headers within the first 80 bytes. `None` for anything else, and for a frame
    /// the full parse refuses.
    pub fn record(frame: &[u8]) -> Option<RxPrediction> {
        let mut headers = TransportHeaders::new(crate::BthRepr::new(crate::Opcode(0), crate::Qpn::new(0), Psn::new(0)));
        let mut out = RxFrame::BLANK;
        if !crate::frame::parse_frame_routed(frame, &mut headers, &mut out, |_| true).ok()? {
            return None;
        }
        let info = headers.bth.opcode.info()?;
        if info.pos != crate::MsgPos::Middle || info.header_len() != bth::HEADER_LEN || out.payload.is_empty() {
            return None;
        }
        let o = outer(frame).ok()?;
        let head_end = o.bth_offset + bth::HEADER_LEN;
        // (A frame shorter than the compared head — a MIDDLE with a few bytes of payload, which
        // the parse accepts and the responder refuses — is not recorded.)
        if head_end > HEAD || frame.len() < HEAD || frame.len() > usize::from(u16::MAX) {
            return None;
        }
        // The payload follows the bare BTH; its length is the full parse's.
        let payload_at = o.bth_offset + bth::HEADER_LEN;
        let mut m = [0xFFu8; HEAD];
        m[head_end..].fill(0);
        if !o.v6 {
            m[o.ip + 4..o.ip + 6].fill(0); // identification
            m[o.ip + 10..o.ip + 12].fill(0); // header checksum
        }
        m[o.udp_off + 6..o.udp_off + 8].fill(0); // UDP checksum
        m[o.bth_offset + 8] &= 0x7F; // AckReq
        m[o.bth_offset + 9..o.bth_offset + 12].fill(0); // PSN
        let mask = words(&m);
        let mut image = words(&frame[..HEAD]);
        for (x, k) in image.iter_mut().zip(mask) {
            *x &= k;
        }
        Some(RxPrediction {
            image,
            mask,
            len: frame.len() as u32,
            ip: o.ip as u16,
            udp: o.udp_off as u16,
            bth: o.bth_offset as u16,
            payload: payload_at as u16,
            ip_end: o.ip_end as u16,
            payload_len: out.payload.len() as u16,
            headers,
            frame: RxFrame { payload: &[], check: IcrcCheck::BLANK, ..out },
        })
    }

    /// The destination QP of a frame a prediction could match: an untagged IPv4 (no options)
    /// or IPv6 frame whose BTH opcode is a MIDDLE one; `None` for anything else (most small
    /// packets: one compare each). Only a key to find the QP's prediction with:
    /// [`parse_into`](RxPrediction::parse_into) decides.
    #[inline]
    pub fn dest_qp(frame: &[u8]) -> Option<u32> {
        let bth = match frame.get(12..15)? {
            [0x08, 0x00, 0x45] => 14 + 20 + 8,
            [0x86, 0xDD, _] => 14 + 40 + 8,
            _ => return None,
        };
        match frame.get(bth..bth + 8)? {
            [op, _, _, _, _, a, b, c] if crate::Opcode(*op).info().is_some_and(|i| i.pos == crate::MsgPos::Middle) => Some(u32::from_be_bytes([0, *a, *b, *c])),
            _ => None,
        }
    }

    /// If `frame` is predicted, write what the full parse would ([`parse_frame_routed`]
    /// returning `Ok(true)`) into `headers` and `out` and return true; else return false with
    /// both untouched.
    ///
    /// [`parse_frame_routed`]: crate::parse_frame_routed
    #[inline]
    pub fn parse_into<'a>(&self, frame: &'a [u8], headers: &mut TransportHeaders, out: &mut RxFrame<'a>) -> bool {
        if frame.len() != self.len as usize {
            return false;
        }
        // (A recorded frame is at least HEAD bytes long, and so is one of the same length.)
        let mut diff = 0;
        for ((w, m), x) in words(&frame[..HEAD]).iter().zip(&self.mask).zip(&self.image) {
            diff |= (w & m) ^ x;
        }
        if diff != 0 {
            return false;
        }
        let b = usize::from(self.bth);
        let p = bth::Packet::new_unchecked(&frame[b..b + bth::HEADER_LEN]);
        // Built from the BTH (a bare-BTH packet's other headers are all absent): a copy of
        // the recorded 136-byte value would be a memcpy call.
        let mut bth = self.headers.bth;
        bth.ack_req = p.ack_req();
        bth.psn = p.psn();
        *headers = TransportHeaders::new(bth);
        let (ip, udp, end) = (usize::from(self.ip), usize::from(self.udp), usize::from(self.ip_end));
        let (at, n) = (usize::from(self.payload), usize::from(self.payload_len));
        let c = &frame[end - ICRC_LEN..end];
        let stored = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        *out = RxFrame {
            payload: &frame[at..at + n],
            check: IcrcCheck::new(&frame[ip..end - ICRC_LEN], udp - ip, at - udp, n, stored),
            ..self.frame
        };
        true
    }

    /// The destination QP of the recorded frame.
    pub fn qpn(&self) -> u32 {
        self.headers.bth.dest_qp.value()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build_frame_vec, BthRepr, L3Info, MacAddr, Opcode, Qpn};
    use std::net::IpAddr;

    fn l3(v6: bool, tclass: u8, sport: u16) -> L3Info {
        let (src, dst): (IpAddr, IpAddr) = if v6 {
            ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap())
        } else {
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap())
        };
        L3Info {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            src_ip: src,
            dst_ip: dst,
            tclass,
            ttl: 64,
            flow_label: 0,
            udp_sport: sport,
            ip_id: 0,
        }
    }

    fn frame(v6: bool, op: Opcode, psn: u32, ack: bool, payload: &[u8]) -> Vec<u8> {
        let mut h = TransportHeaders::new(BthRepr::new(op, Qpn::new(0x11), Psn::new(psn)));
        h.bth.ack_req = ack;
        build_frame_vec(&l3(v6, 2, 0xC000), &h, payload).unwrap()
    }

    fn full(f: &[u8]) -> Option<(TransportHeaders, RxFrame<'_>)> {
        let mut h = TransportHeaders::new(BthRepr::new(Opcode(0), Qpn::new(0), Psn::new(0)));
        let mut o = RxFrame::BLANK;
        crate::parse_frame_routed(f, &mut h, &mut o, |_| true).ok()?.then_some((h, o))
    }

    /// The two parses agree, field by field (the payload by position and length).
    fn same(a: &(TransportHeaders, RxFrame<'_>), b: &(TransportHeaders, RxFrame<'_>)) -> bool {
        let (x, y) = (&a.1, &b.1);
        a.0 == b.0
            && x.src_mac == y.src_mac
            && x.src_gid == y.src_gid
            && x.dst_gid == y.dst_gid
            && x.v6 == y.v6
            && x.tclass == y.tclass
            && x.ttl == y.ttl
            && x.flow_label == y.flow_label
            && x.udp_sport == y.udp_sport
            && std::ptr::eq(x.payload, y.payload)
            && x.check == y.check
    }

    #[test]
    fn only_bare_middle_packets_are_recorded() {
        let p = vec![7u8; 256];
        assert!(RxPrediction::record(&frame(false, Opcode::RC_RDMA_WRITE_MIDDLE, 5, false, &p)).is_some());
        assert!(RxPrediction::record(&frame(true, Opcode::RC_SEND_MIDDLE, 5, false, &p)).is_some());
        assert!(RxPrediction::record(&frame(false, Opcode::RC_RDMA_WRITE_LAST, 5, false, &p[..100])).is_none());
        // A MIDDLE shorter than the compared head (the parse accepts it; the responder will not).
        assert!(RxPrediction::record(&frame(false, Opcode::RC_RDMA_WRITE_MIDDLE, 5, false, &p[..4])).is_none());
        // (Over IPv6 the same packet's frame is 82 bytes: it holds the head and is recorded.)
        assert!(RxPrediction::record(&frame(true, Opcode::RC_RDMA_WRITE_MIDDLE, 5, false, &p[..4])).is_some());
        assert!(RxPrediction::record(&frame(false, Opcode::RC_SEND_ONLY, 5, false, &p)).is_none());
        let mut bad = frame(false, Opcode::RC_RDMA_WRITE_MIDDLE, 5, false, &p);
        bad[23] = 6; // IP protocol TCP: the full parse refuses it
        assert!(RxPrediction::record(&bad).is_none());
    }

    #[test]
    fn the_next_middle_packets_are_predicted_with_their_psn_and_ackreq() {
        for v6 in [false, true] {
            let p = vec![9u8; 1024];
            let r = RxPrediction::record(&frame(v6, Opcode::RC_RDMA_WRITE_MIDDLE, 5, false, &p)).unwrap();
            assert_eq!(r.qpn(), 0x11);
            for (psn, ack) in [(6, false), (7, true), (0xFF_FFFF, false)] {
                let f = frame(v6, Opcode::RC_RDMA_WRITE_MIDDLE, psn, ack, &p);
                assert_eq!(RxPrediction::dest_qp(&f), Some(0x11));
                let only = frame(v6, Opcode::RC_SEND_ONLY, psn, ack, &p);
                assert_eq!(RxPrediction::dest_qp(&only), None, "not a MIDDLE: no lookup");
                let mut h = TransportHeaders::new(BthRepr::new(Opcode(0), Qpn::new(0), Psn::new(0)));
                let mut o = RxFrame::BLANK;
                assert!(r.parse_into(&f, &mut h, &mut o), "v6 {v6} psn {psn}");
                assert_eq!(h.bth.psn, Psn::new(psn));
                assert_eq!(h.bth.ack_req, ack);
                assert!(same(&(h, o), &full(&f).unwrap()));
                assert!(o.check.verify(o.payload), "the ICRC check is the frame's own");
            }
            // Another opcode, length, or payload-carrying header is not predicted.
            let last = frame(v6, Opcode::RC_RDMA_WRITE_LAST, 6, false, &p);
            let short = frame(v6, Opcode::RC_RDMA_WRITE_MIDDLE, 6, false, &p[..512]);
            for f in [last, short] {
                let mut h = TransportHeaders::new(BthRepr::new(Opcode(0), Qpn::new(0), Psn::new(0)));
                let mut o = RxFrame::BLANK;
                assert!(!r.parse_into(&f, &mut h, &mut o));
            }
        }
    }

    /// Every single-bit change of a successor's first 80 bytes: predicted only where the
    /// change is in a field the prediction does not compare (IPv4 identification and checksum,
    /// UDP checksum, AckReq, PSN, the payload), and then parsed in full to the same result.
    #[test]
    #[cfg_attr(miri, ignore)] // 1280 frames built and parsed: slow under Miri, no unsafe code
    fn every_bit_of_the_compared_header_is_compared() {
        for v6 in [false, true] {
            let p: Vec<u8> = (0..256u32).map(|i| i as u8).collect();
            let r = RxPrediction::record(&frame(v6, Opcode::RC_RDMA_WRITE_MIDDLE, 5, false, &p)).unwrap();
            let (udp, bth) = if v6 { (54, 62) } else { (34, 42) };
            let free = |at: usize, bit: u8| {
                (!v6 && ((18..20).contains(&at) || (24..26).contains(&at)))
                    || (udp + 6..udp + 8).contains(&at)
                    || (at == bth + 8 && bit == 7)
                    || (bth + 9..bth + 12).contains(&at)
                    || at >= bth + 12
            };
            for at in 0..HEAD {
                for bit in 0..8 {
                    let mut f = frame(v6, Opcode::RC_RDMA_WRITE_MIDDLE, 6, false, &p);
                    f[at] ^= 1 << bit;
                    let mut h = TransportHeaders::new(BthRepr::new(Opcode(0), Qpn::new(0), Psn::new(0)));
                    let mut o = RxFrame::BLANK;
                    let hit = r.parse_into(&f, &mut h, &mut o);
                    assert_eq!(hit, free(at, bit), "v6 {v6}: byte {at} bit {bit}");
                    if hit {
                        let whole = full(&f).unwrap_or_else(|| panic!("v6 {v6}: byte {at} bit {bit}: predicted, refused in full"));
                        assert!(same(&(h, o), &whole), "v6 {v6}: byte {at} bit {bit}");
                    }
                }
            }
        }
    }
}
