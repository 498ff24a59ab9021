//! Whole-frame properties (SEMANTICS §7.F): build→parse round trip of every opcode, ICRC
//! masking (F1), segmentation (F4), garbage and truncation (F7), UDP encapsulation (F8).

use pmrxe_wire::opcode::ALL;
use pmrxe_wire::sample::{random_headers, random_l3};
use pmrxe_wire::{
    build_frame_vec, emit_frame_headers, finish_frame, frame_header_len, icrc, next_opcode, pad_for,
    parse_frame, parse_frame_routed, parse_frame_with, udp_sport, AethRepr, BthRepr, Error, L3Info, MacAddr, Msn,
    MsgPos, OpKind, Opcode, ParseOptions, Psn, QpType, Qpn, RethRepr, RxFrame, RxPrediction, Syndrome, TransportHeaders,
};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::net::IpAddr;

const ETH: usize = 14;

/// A random valid frame: (frame, ipv6, headers, payload).
fn frame(seed: u64, op_idx: usize, ipv6: bool) -> (Vec<u8>, L3Info, TransportHeaders, Vec<u8>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let op = ALL[op_idx % ALL.len()];
    let (h, p) = random_headers(&mut rng, op);
    let l3 = random_l3(&mut rng, ipv6, Qpn::new(7), h.bth.dest_qp);
    (build_frame_vec(&l3, &h, &p).unwrap(), l3, h, p)
}

fn udp_off(ipv6: bool) -> usize {
    ETH + if ipv6 { 40 } else { 20 }
}
fn bth_off(ipv6: bool) -> usize {
    udp_off(ipv6) + 8
}

/// Independent ICRC: zlib CRC-32 over 8×FF ‖ masked IP ‖ masked UDP ‖ masked BTH ‖ rest.
fn reference_icrc(frame: &[u8], ipv6: bool) -> u32 {
    let mut m = frame[ETH..frame.len() - 4].to_vec();
    if ipv6 {
        m[0] |= 0x0F;
        m[1..4].fill(0xFF);
        m[7] = 0xFF;
    } else {
        m[1] = 0xFF;
        m[8] = 0xFF;
        m[10..12].fill(0xFF);
    }
    let u = udp_off(ipv6) - ETH;
    m[u + 6..u + 8].fill(0xFF);
    m[u + 8 + 4] = 0xFF;
    let mut all = vec![0xFF; 8];
    all.extend_from_slice(&m);
    crc32fast::hash(&all)
}

fn stored_icrc(frame: &[u8]) -> u32 {
    u32::from_le_bytes(frame[frame.len() - 4..].try_into().unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_opcode_round_trips(seed: u64, op in 0..ALL.len(), ipv6: bool) {
        let (f, l3, h, p) = frame(seed, op, ipv6);
        let r = parse_frame(&f).unwrap();
        prop_assert_eq!(r.headers, h);
        prop_assert_eq!(r.payload, &p[..]);
        prop_assert_eq!((r.src_mac, r.dst_mac, r.src_ip, r.dst_ip), (l3.src_mac, l3.dst_mac, l3.src_ip, l3.dst_ip));
        prop_assert_eq!((r.tclass, r.ttl, r.udp_sport), (l3.tclass, l3.ttl, l3.udp_sport));
        if ipv6 { prop_assert_eq!(r.flow_label, l3.flow_label) } else { prop_assert_eq!(r.ip_id, l3.ip_id) }
        prop_assert_eq!(r.icrc, reference_icrc(&f, ipv6));
        prop_assert_eq!(r.bth_offset, bth_off(ipv6));
        // Ethernet minimum-size padding after the datagram is ignored.
        let mut padded = f.clone();
        padded.extend_from_slice(&[0xEE; 17]);
        prop_assert_eq!(parse_frame(&padded).unwrap().headers, h);
    }

    #[test]
    fn f1_masked_fields_keep_the_icrc(seed: u64, op in 0..ALL.len(), ipv6: bool, v: u8, fl in 0u32..(1 << 20)) {
        let (f, ..) = frame(seed, op, ipv6);
        let mut g = f.clone();
        let u = udp_off(ipv6);
        if ipv6 {
            // traffic class (DSCP/ECN) + flow label, hop limit
            let w = (6u32 << 28) | (u32::from(v) << 20) | fl;
            g[ETH..ETH + 4].copy_from_slice(&w.to_be_bytes());
            g[ETH + 7] = v.wrapping_add(1);
        } else {
            g[ETH + 1] = v; // DSCP/ECN
            g[ETH + 8] = v.wrapping_add(1); // TTL
            g[ETH + 10] ^= v; // header checksum
        }
        g[u + 6] = v; // UDP checksum
        g[u + 7] = !v;
        g[u + 8 + 4] = v & 0xC0 | (v >> 5); // FECN/BECN (+ reserved bits)
        prop_assert_eq!(stored_icrc(&g), stored_icrc(&f));
        prop_assert!(parse_frame(&g).is_ok());
    }

    #[test]
    fn f1_unmasked_fields_break_the_icrc(seed: u64, op in 0..ALL.len(), ipv6: bool, which in 0usize..9, bit in 0u8..8) {
        let (f, _, _, p) = frame(seed, op, ipv6);
        let b = bth_off(ipv6);
        let off = match which {
            0 => b + 9 + usize::from(bit % 3),           // PSN
            1 => b + 2 + usize::from(bit % 2),           // P_Key
            2 => { let mut g = f.clone(); g[b + 8] ^= 0x80; return check_bad(&g); } // A bit
            3 => b + 5 + usize::from(bit % 3),           // dest QP
            4 => ETH + if ipv6 { 8 } else { 12 } + usize::from(bit), // source address
            5 => ETH + if ipv6 { 24 } else { 16 } + usize::from(bit % 4), // destination address
            6 => { if p.is_empty() { return Ok(()); } f.len() - 5 - usize::from(f[b + 1] >> 4 & 3) } // payload
            7 => if ipv6 { ETH + 6 } else { ETH + 4 }, // IPv4 ID / IPv6 next header... see below
            _ => udp_off(ipv6),                          // UDP source port
        };
        let mut g = f.clone();
        if which == 7 && ipv6 {
            return Ok(()); // next header is not an ICRC-only field; covered by NotUdp tests
        }
        g[off] ^= 1 << bit;
        check_bad(&g)?;
    }

    #[test]
    fn f7_truncated_frames_error_never_panic(seed: u64, op in 0..ALL.len(), ipv6: bool, cut: usize) {
        let (f, ..) = frame(seed, op, ipv6);
        let n = cut % f.len();
        let e = parse_frame(&f[..n]).unwrap_err();
        prop_assert!(matches!(e, Error::Truncated | Error::BadLength), "{:?} at {}", e, n);
    }

    #[test]
    fn f7_garbled_frames_never_panic(seed: u64, op in 0..ALL.len(), ipv6: bool, edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let (mut f, ..) = frame(seed, op, ipv6);
        for (i, v) in edits {
            let n = f.len();
            f[i % n] = v;
        }
        let _ = parse_frame(&f);
        let _ = parse_frame_with(&f, &ParseOptions { verify_icrc: false });
        let _ = finish_frame(&mut f);
    }

    #[test]
    fn f7_random_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_frame(&data);
        let _ = TransportHeaders::parse(&data);
    }

    #[test]
    fn f8_udp_sport_constant_and_in_range(fl in 0u32..(1 << 20), a in 0u32..(1 << 24), b in 0u32..(1 << 24)) {
        let s = udp_sport(fl, a, b);
        prop_assert!(s >= 0xC000);
        prop_assert_eq!(s, udp_sport(fl, a, b));
        if fl == 0 { prop_assert_eq!(s, udp_sport(0, b, a)); }
    }
}

/// The full parse of `f` (`parse_frame_routed`, consuming every frame), if it accepts it.
fn routed(f: &[u8]) -> Option<(TransportHeaders, RxFrame<'_>)> {
    let mut h = TransportHeaders::new(BthRepr::new(Opcode(0), Qpn::new(0), Psn::new(0)));
    let mut o = RxFrame::BLANK;
    parse_frame_routed(f, &mut h, &mut o, |_| true).ok()?.then_some((h, o))
}

/// The MIDDLE opcodes header prediction records (bare BTH, full payload).
const MIDDLES: [Opcode; 5] =
    [Opcode::RC_SEND_MIDDLE, Opcode::RC_RDMA_WRITE_MIDDLE, Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, Opcode::UC_SEND_MIDDLE, Opcode::UC_RDMA_WRITE_MIDDLE];

proptest! {
    /// Header prediction's contract (`RxPrediction`): a frame it accepts parses in full to the
    /// same headers and frame fields (the payload by position and length, the ICRC check).
    /// The recorded frame is a random MIDDLE packet (opcode, addresses, traffic class, flow
    /// label, ports, P_Key, QPN); the frames offered are its successors (new PSN, AckReq, IPv4
    /// identification and checksums, payload bytes) with up to three bytes anywhere changed,
    /// which the prediction must accept when no byte was changed.
    #[test]
    fn predicted_frames_parse_in_full_to_the_same_result(
        seed: u64, op in 0..MIDDLES.len(), ipv6: bool, psn: u32, ack: bool, id: u16, sum: u16,
        edits in prop::collection::vec((0usize..120, 1u8..), 0..4),
    ) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (h, p) = random_headers(&mut rng, MIDDLES[op]);
        let l3 = random_l3(&mut rng, ipv6, Qpn::new(7), h.bth.dest_qp);
        let r = RxPrediction::record(&build_frame_vec(&l3, &h, &p).unwrap());
        // (A MIDDLE shorter than the 80 bytes compared is not recorded.)
        let Some(r) = r else { return Ok(()) };
        prop_assert_eq!(r.qpn(), h.bth.dest_qp.value());
        let mut h2 = h;
        h2.bth.psn = Psn::new(psn);
        h2.bth.ack_req = ack;
        let p2: Vec<u8> = p.iter().map(|b| b.wrapping_add(1)).collect();
        let mut f = build_frame_vec(&L3Info { ip_id: id, ..l3 }, &h2, &p2).unwrap();
        if !ipv6 {
            f[ETH + 10..ETH + 12].copy_from_slice(&sum.to_be_bytes());
        }
        let u = udp_off(ipv6);
        f[u + 6..u + 8].copy_from_slice(&sum.to_be_bytes());
        let untouched = edits.is_empty();
        for (at, x) in edits {
            if let Some(b) = f.get_mut(at) {
                *b ^= x;
            }
        }
        let mut hp = TransportHeaders::new(BthRepr::new(Opcode(0), Qpn::new(0), Psn::new(0)));
        let mut op_ = RxFrame::BLANK;
        let hit = r.parse_into(&f, &mut hp, &mut op_);
        if untouched {
            prop_assert!(hit, "a plain successor is predicted");
        }
        if hit {
            let whole = routed(&f);
            prop_assert!(whole.is_some(), "predicted, but the full parse refuses it");
            let (hw, ow) = whole.unwrap();
            prop_assert_eq!(hp, hw);
            prop_assert_eq!(
                (op_.src_mac, op_.src_gid, op_.dst_gid, op_.v6, op_.tclass, op_.ttl, op_.flow_label, op_.udp_sport, op_.check),
                (ow.src_mac, ow.src_gid, ow.dst_gid, ow.v6, ow.tclass, ow.ttl, ow.flow_label, ow.udp_sport, ow.check)
            );
            prop_assert!(std::ptr::eq(op_.payload, ow.payload));
        }
    }
}

fn check_bad(g: &[u8]) -> Result<(), TestCaseError> {
    prop_assert_eq!(parse_frame(g).unwrap_err(), Error::BadIcrc);
    Ok(())
}

fn l3(ipv6: bool) -> L3Info {
    let (s, d): (IpAddr, IpAddr) = if ipv6 {
        ("2001:db8::1".parse().unwrap(), "2001:db8::2".parse().unwrap())
    } else {
        ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap())
    };
    L3Info {
        src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        src_ip: s,
        dst_ip: d,
        tclass: 0x6A,
        ttl: 17,
        flow_label: 0x12345,
        udp_sport: udp_sport(0, 0x11, 0x12),
        ip_id: 0x1234,
    }
}

#[test]
fn f1_golden_vectors_match_independent_crc() {
    let bth = |op, psn| BthRepr { fecn: true, becn: true, ..BthRepr::new(op, Qpn::new(0x11), Psn::new(psn)) };
    let send = TransportHeaders::new(bth(Opcode::RC_SEND_ONLY, 103));
    let write_first = TransportHeaders {
        reth: Some(RethRepr { va: 0x7f00_0000_1000, rkey: 0x1234, len: 3000 }),
        ..TransportHeaders::new(bth(Opcode::RC_RDMA_WRITE_FIRST, 100))
    };
    let rr_middle = TransportHeaders::new(bth(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 105));
    let ack = TransportHeaders {
        aeth: Some(AethRepr { syndrome: Syndrome::ACK_UNLIMITED, msn: Msn::new(4) }),
        ..TransportHeaders::new(bth(Opcode::RC_ACKNOWLEDGE, 103))
    };
    let big: Vec<u8> = (0..1024u32).map(|i| i as u8).collect();
    for ipv6 in [false, true] {
        for (h, p) in [(send, &b"abc"[..]), (write_first, &big[..]), (rr_middle, &big[..]), (ack, &[][..])] {
            let f = build_frame_vec(&l3(ipv6), &h, p).unwrap();
            assert_eq!(stored_icrc(&f), reference_icrc(&f, ipv6), "{:?} v6={ipv6}", h.bth.opcode);
            let r = parse_frame(&f).unwrap();
            assert_eq!(r.payload, p);
            if p.len() == 3 {
                assert_eq!(r.headers.bth.pad, 1);
                assert_eq!(&f[f.len() - 5..f.len() - 4], &[0]); // pad byte is zero
            }
        }
    }
    // Changing the IPv4 ID or the UDP length changes the ICRC (computed directly, since a
    // changed UDP length is already a length error for the parser).
    let f = build_frame_vec(&l3(false), &send, b"abc").unwrap();
    let (ip, udp) = (&f[ETH..ETH + 20], &f[ETH + 20..f.len() - 4]);
    let base = icrc(ip, udp);
    assert_eq!(base, stored_icrc(&f));
    let mut ip2 = ip.to_vec();
    ip2[5] ^= 1;
    assert_ne!(icrc(&ip2, udp), base);
    let mut udp2 = udp.to_vec();
    udp2[5] ^= 4;
    assert_ne!(icrc(ip, &udp2), base);
}

#[test]
fn f4_write_of_two_mtu_plus_one() {
    const MTU: usize = 1024;
    let data: Vec<u8> = (0..2 * MTU + 1).map(|i| (i * 7) as u8).collect();
    let mut psn = Psn::new(0xFF_FFFF);
    let mut frames = Vec::new();
    #[allow(clippy::explicit_counter_loop)] // the PSN is the point of the test
    for (i, chunk) in data.chunks(MTU).enumerate() {
        let n = data.len().div_ceil(MTU);
        let pos = match (i, n) {
            (_, 1) => MsgPos::Only,
            (0, _) => MsgPos::First,
            (i, n) if i == n - 1 => MsgPos::Last,
            _ => MsgPos::Middle,
        };
        let op = next_opcode(QpType::Rc, OpKind::Write, pos, false, false).unwrap();
        let mut h = TransportHeaders::new(BthRepr::new(op, Qpn::new(0x11), psn));
        if pos.is_start() {
            h.reth = Some(RethRepr { va: 0x1000, rkey: 0x42, len: data.len() as u32 });
        }
        h.bth.ack_req = pos.is_end();
        h.bth.pad = pad_for(chunk.len());
        frames.push(build_frame_vec(&l3(false), &h, chunk).unwrap());
        psn += 1;
    }
    let parsed: Vec<_> = frames.iter().map(|f| parse_frame(f).unwrap()).collect();
    let ops: Vec<_> = parsed.iter().map(|r| r.headers.bth.opcode).collect();
    assert_eq!(ops, [Opcode::RC_RDMA_WRITE_FIRST, Opcode::RC_RDMA_WRITE_MIDDLE, Opcode::RC_RDMA_WRITE_LAST]);
    assert_eq!(parsed[0].headers.reth.unwrap().len, 2 * MTU as u32 + 1);
    assert!(parsed[1].headers.reth.is_none() && parsed[2].headers.reth.is_none());
    assert_eq!(parsed.iter().map(|r| r.payload.len()).collect::<Vec<_>>(), [MTU, MTU, 1]);
    assert_eq!(parsed[2].headers.bth.pad, 3);
    let psns: Vec<u32> = parsed.iter().map(|r| r.headers.bth.psn.value()).collect();
    assert_eq!(psns, [0xFF_FFFF, 0, 1]); // F5: wraps
}

#[test]
fn f7_unknown_opcode_and_short_packets_dropped_before_icrc() {
    let send = TransportHeaders::new(BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(1), Psn::new(1)));
    for ipv6 in [false, true] {
        let f = build_frame_vec(&l3(ipv6), &send, b"abcd").unwrap();
        let b = bth_off(ipv6);
        let mut g = f.clone();
        g[b] = 0xFF;
        assert_eq!(parse_frame(&g).unwrap_err(), Error::UnknownOpcode(0xFF));
        g[b] = 0x81; // CNP: not in our table
        assert_eq!(parse_frame(&g).unwrap_err(), Error::UnknownOpcode(0x81));
        g = f.clone();
        g[b + 1] |= 1; // TVer 1
        assert_eq!(parse_frame(&g).unwrap_err(), Error::BadTver);
        // A datagram shorter than BTH + ICRC, with consistent lengths.
        let l3 = l3(ipv6);
        let mut s = vec![0u8; frame_header_len(ipv6) + 12];
        emit_frame_headers(&mut s, &l3, 8).unwrap();
        assert_eq!(parse_frame(&s).unwrap_err(), Error::Truncated);
        // Headers longer than the packet: READ_REQUEST without a full RETH.
        let mut s = vec![0u8; frame_header_len(ipv6) + 12 + 8 + 4];
        emit_frame_headers(&mut s, &l3, 20).unwrap();
        BthRepr::new(Opcode::RC_RDMA_READ_REQUEST, Qpn::new(1), Psn::new(1))
            .emit(&mut pmrxe_wire::BthPacket::new_unchecked(&mut s[b..b + 12]));
        finish_frame(&mut s).unwrap();
        assert_eq!(parse_frame(&s).unwrap_err(), Error::Truncated);
    }
}

#[test]
fn malformed_pad_and_length_are_reported() {
    let l3 = l3(false);
    let b = bth_off(false);
    let build = |op: Opcode, pad: u8, body: &[u8]| {
        let mut h = TransportHeaders::new(BthRepr::new(op, Qpn::new(1), Psn::new(1)));
        h.bth.pad = pad;
        let hl = frame_header_len(false);
        let mut f = vec![0u8; hl + 12 + body.len() + 4];
        h.bth.emit(&mut pmrxe_wire::BthPacket::new_unchecked(&mut f[hl..hl + 12]));
        f[hl + 12..hl + 12 + body.len()].copy_from_slice(body);
        emit_frame_headers(&mut f, &l3, 12 + body.len()).unwrap();
        finish_frame(&mut f).unwrap();
        assert_eq!(hl, b);
        f
    };
    assert_eq!(parse_frame(&build(Opcode::RC_SEND_ONLY, 0, b"abc")).unwrap_err(), Error::BadPad);
    assert_eq!(parse_frame(&build(Opcode::RC_SEND_ONLY, 3, b"")).unwrap_err(), Error::BadPad);
    assert_eq!(parse_frame(&build(Opcode::RC_RDMA_WRITE_MIDDLE, 1, b"abcd")).unwrap_err(), Error::BadPad);
    assert_eq!(parse_frame(&build(Opcode::RC_ACKNOWLEDGE, 0, &[0x1F, 0, 0, 1, 9, 9, 9, 9])).unwrap_err(), Error::BadLength);
    assert_eq!(parse_frame(&build(Opcode::RC_SEND_ONLY, 1, b"abc\0")).unwrap().payload, b"abc");
    // F6 is the transport's: an empty WRITE_LAST parses (the responder NAKs it).
    assert!(parse_frame(&build(Opcode::RC_RDMA_WRITE_LAST, 0, b"")).unwrap().payload.is_empty());
    // UDP length != IP payload length.
    let mut f = build(Opcode::RC_SEND_ONLY, 0, b"abcd");
    let u = udp_off(false);
    f[u + 5] -= 4;
    assert_eq!(parse_frame(&f).unwrap_err(), Error::BadLength);
    // Wrong port / protocol / ethertype.
    let mut f = build(Opcode::RC_SEND_ONLY, 0, b"abcd");
    f[u + 3] ^= 1;
    assert_eq!(parse_frame(&f).unwrap_err(), Error::NotRoce);
    f[ETH + 9] = 6;
    assert_eq!(parse_frame(&f).unwrap_err(), Error::NotUdp);
    f[12] = 0x88;
    assert_eq!(parse_frame(&f).unwrap_err(), Error::NotIp);
}

#[test]
fn f8_encapsulation_dport_checksum_df() {
    let h = TransportHeaders::new(BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x12), Psn::new(1)));
    let a = build_frame_vec(&l3(false), &h, b"x").unwrap();
    let u = udp_off(false);
    assert_eq!(&a[u + 2..u + 4], &4791u16.to_be_bytes());
    assert_eq!(&a[u + 6..u + 8], &[0, 0]);
    assert_eq!(a[ETH + 6] & 0x40, 0x40); // DF
    assert!(pmrxe_wire::Ipv4Packet::new_checked(&a[ETH..]).unwrap().verify_checksum());
    assert_eq!(u16::from_be_bytes([a[u], a[u + 1]]), udp_sport(0, 0x11, 0x12));
    // Mixed address families are refused.
    let mut bad = l3(false);
    bad.dst_ip = "2001:db8::2".parse().unwrap();
    assert_eq!(build_frame_vec(&bad, &h, b"x").unwrap_err(), Error::BadAddress);
}

#[test]
fn headers_must_match_opcode() {
    let mut h = TransportHeaders::new(BthRepr::new(Opcode::RC_RDMA_WRITE_FIRST, Qpn::new(1), Psn::new(1)));
    let mut buf = [0u8; 64];
    assert_eq!(h.emit(&mut buf).unwrap_err(), Error::HeaderMismatch);
    h.reth = Some(RethRepr::default());
    assert_eq!(h.emit(&mut buf).unwrap(), 28);
    h.imm = Some(1);
    assert_eq!(h.emit(&mut buf).unwrap_err(), Error::HeaderMismatch);
    h.imm = None;
    assert_eq!(h.emit(&mut buf[..27]).unwrap_err(), Error::Truncated);
    assert_eq!(TransportHeaders::parse(&buf[..28]).unwrap(), (h, 28));
    assert_eq!(TransportHeaders::parse(&buf[..27]).unwrap_err(), Error::Truncated);
}
