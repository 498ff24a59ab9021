//! The one-pass ICRC paths agree with the two-pass ones for every opcode, IPv4 and IPv6:
//! sending (tail CRC folded while writing, joined to the prefix by combination) stores the same
//! ICRC as `finish_frame`; receiving (`parse_frame_deferred`, CRC continued while copying the
//! payload) accepts exactly the frames `parse_frame` accepts.

use pmrxe_crc::{copy_and_crc, crc_update};
use pmrxe_wire::frame::HeaderTemplate;
use pmrxe_wire::icrc::transport_crc;
use pmrxe_wire::opcode::ALL;
use pmrxe_wire::sample::{random_headers, random_l3};
use pmrxe_wire::{
    build_frame_vec, emit_frame_headers, finish_frame, finish_frame_with_tail_crc, frame_header_len, frame_len, pad_for,
    parse_frame, parse_frame_deferred, parse_frame_into, parse_frame_routed, seal_frame, Error, Qpn, RxFrame, TransportHeaders,
};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn tail_crc_finish_equals_finish_frame(seed: u64, op in 0..ALL.len(), ipv6: bool, becn: bool) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (mut h, p) = random_headers(&mut rng, ALL[op]);
        h.bth.becn = becn;
        h.bth.pad = pad_for(p.len());
        let l3 = random_l3(&mut rng, ipv6, Qpn::new(3), h.bth.dest_qp);
        let hl = frame_header_len(ipv6);
        let total = frame_len(ipv6, h.header_len(), p.len());
        let mut f = vec![0xEEu8; total];
        // As the data path builds it: transport headers, payload copied while hashed, pad.
        let n = h.emit(&mut f[hl..]).unwrap();
        let mut crc = transport_crc(&f[hl..hl + n]);
        crc = copy_and_crc(crc, &mut f[hl + n..hl + n + p.len()], &p);
        let pad_at = hl + n + p.len();
        let pad_len = usize::from(h.bth.pad);
        f[pad_at..pad_at + pad_len].fill(0);
        crc = crc_update(crc, &f[pad_at..pad_at + pad_len]);
        emit_frame_headers(&mut f, &l3, n + p.len() + pad_len).unwrap();
        finish_frame_with_tail_crc(&mut f, crc).unwrap();
        let mut g = f.clone();
        finish_frame(&mut g).unwrap();
        prop_assert_eq!(&f, &g);
        // A prebuilt header template for this path and length finishes the same frame from
        // the same tail CRC (whatever the header room held before), and rejects other lengths.
        let roce_len = n + p.len() + pad_len;
        let t = HeaderTemplate::new(&l3, roce_len).unwrap();
        prop_assert_eq!((t.header_len(), t.roce_len()), (hl, roce_len));
        let mut k = f.clone();
        k[..hl].fill(0x5A);
        let icrc_at = k.len() - 4;
        k[icrc_at..].fill(0x5A);
        t.finish(&mut k, Some(crc)).unwrap();
        prop_assert_eq!(&k, &f);
        prop_assert_eq!(t.finish(&mut k[..total - 1], Some(crc)), Err(Error::BadLength));
        // Without a tail CRC (a short packet): the header only, then `seal_frame` hashes the
        // finished frame: the same bytes.
        k[..hl].fill(0x5A);
        k[icrc_at..].fill(0x5A);
        t.finish(&mut k, None).unwrap();
        prop_assert_eq!(&k[icrc_at..], &[0x5A; 4]);
        seal_frame(&mut k, hl).unwrap();
        prop_assert_eq!(&k, &f);
        prop_assert_eq!(seal_frame(&mut k, hl + 1), Err(Error::BadLength));
        prop_assert_eq!(seal_frame(&mut k[..hl + 3], hl), Err(Error::BadLength));
        prop_assert_eq!(f, build_frame_vec(&l3, &h, &p).unwrap());
    }

    #[test]
    fn deferred_check_accepts_good_frames(seed: u64, op in 0..ALL.len(), ipv6: bool) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (h, p) = random_headers(&mut rng, ALL[op]);
        let l3 = random_l3(&mut rng, ipv6, Qpn::new(3), h.bth.dest_qp);
        let f = build_frame_vec(&l3, &h, &p).unwrap();
        let (d, check) = parse_frame_deferred(&f).unwrap();
        prop_assert_eq!(d, parse_frame(&f).unwrap());
        prop_assert!(check.verify(d.payload));
        let mut out = vec![0u8; d.payload.len()];
        prop_assert!(check.matches(copy_and_crc(check.seed(), &mut out, d.payload)));
        prop_assert_eq!(&out[..], d.payload);
    }

    #[test]
    fn deferred_check_rejects_exactly_what_parse_frame_rejects(seed: u64, op in 0..ALL.len(), ipv6: bool, at: usize, bit in 0u8..8) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (h, p) = random_headers(&mut rng, ALL[op]);
        let l3 = random_l3(&mut rng, ipv6, Qpn::new(3), h.bth.dest_qp);
        let mut f = build_frame_vec(&l3, &h, &p).unwrap();
        let i = at % f.len();
        f[i] ^= 1 << bit;
        // The receive path's in-place parse agrees with the deferred parse on every frame.
        let (mut hdr, mut r) = (TransportHeaders::BLANK, RxFrame::BLANK);
        match (parse_frame_deferred(&f), parse_frame_into(&f, &mut hdr, &mut r)) {
            (Ok((d, check)), Ok(())) => {
                prop_assert_eq!(hdr, d.headers);
                prop_assert_eq!((r.src_mac, r.src_ip(), r.dst_ip(), r.tclass, r.ttl), (d.src_mac, d.src_ip, d.dst_ip, d.tclass, d.ttl));
                prop_assert_eq!((r.flow_label, r.udp_sport, r.payload, r.check), (d.flow_label, d.udp_sport, d.payload, check));
            }
            (Err(e), Err(g)) => prop_assert_eq!(e, g),
            (a, b) => prop_assert!(false, "deferred {:?} vs into {:?}", a.err(), b.err()),
        }
        match (parse_frame(&f), parse_frame_deferred(&f)) {
            (Ok(a), Ok((b, check))) => {
                // A masked field (or the Ethernet header): still valid.
                prop_assert_eq!(a, b);
                prop_assert!(check.verify(b.payload));
            }
            (Err(Error::BadIcrc), Ok((b, check))) => {
                prop_assert!(!check.verify(b.payload));
                let mut out = vec![0u8; b.payload.len()];
                prop_assert!(!check.matches(copy_and_crc(check.seed(), &mut out, b.payload)));
            }
            (Err(e), Err(g)) => prop_assert_eq!(e, g),
            (a, b) => prop_assert!(false, "parse_frame {:?} vs deferred {:?}", a.err(), b.err()),
        }
    }

    /// A receiver that routes (`parse_frame_routed`) sees every frame the full parse accepts
    /// with its BTH.DestQP, and when it declines the frame nothing else is parsed: headers and
    /// frame stay as they were. When it keeps the frame the result is `parse_frame_into`'s.
    /// A frame refused before routing is refused for the same reason as by the full parse.
    #[test]
    fn routed_parse_routes_on_dest_qp_before_anything_else(seed: u64, op in 0..ALL.len(), ipv6: bool, at: usize, bit in 0u8..8, corrupt: bool) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (h, p) = random_headers(&mut rng, ALL[op]);
        let l3 = random_l3(&mut rng, ipv6, Qpn::new(3), h.bth.dest_qp);
        let mut f = build_frame_vec(&l3, &h, &p).unwrap();
        if corrupt {
            let i = at % f.len();
            f[i] ^= 1 << bit;
        }
        let (mut hdr, mut r) = (TransportHeaders::BLANK, RxFrame::BLANK);
        let mut seen = None;
        let declined = parse_frame_routed(&f, &mut hdr, &mut r, |q| {
            seen = Some(q);
            false
        });
        let (mut hdr2, mut r2) = (TransportHeaders::BLANK, RxFrame::BLANK);
        let full = parse_frame_into(&f, &mut hdr2, &mut r2);
        match (&declined, &full) {
            (Ok(false), _) => {
                prop_assert_eq!(hdr, TransportHeaders::BLANK);
                prop_assert_eq!(r.payload, RxFrame::BLANK.payload);
                if full.is_ok() {
                    prop_assert_eq!(seen, Some(u32::from(hdr2.bth.dest_qp)));
                }
            }
            (Err(e), Err(g)) => {
                prop_assert_eq!(e, g);
                prop_assert!(seen.is_none(), "refused after routing: {:?}", e);
            }
            (a, b) => prop_assert!(false, "routed {:?} vs into {:?}", a, b),
        }
        let (mut hdr3, mut r3) = (TransportHeaders::BLANK, RxFrame::BLANK);
        match (parse_frame_routed(&f, &mut hdr3, &mut r3, |_| true), full) {
            (Ok(true), Ok(())) => {
                prop_assert_eq!(hdr3, hdr2);
                prop_assert_eq!((r3.payload, r3.check, r3.udp_sport), (r2.payload, r2.check, r2.udp_sport));
            }
            (Err(e), Err(g)) => prop_assert_eq!(e, g),
            (a, b) => prop_assert!(false, "routed {:?} vs into {:?}", a, b),
        }
    }
}
