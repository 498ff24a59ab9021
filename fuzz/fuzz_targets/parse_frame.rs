//! Fuzz `parse_frame` (and the header/neighbour parsers it hands off to): must never
//! panic; anything it accepts must re-serialise to a frame that parses the same way. Header
//! prediction too: a prediction recorded from the input predicts the input itself, with the
//! full parse's result.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmrxe_wire::{
    build_frame_vec, parse_arp_frame, parse_frame, parse_frame_routed, parse_frame_with, parse_nd_frame, BthRepr, L3Info,
    Opcode, ParseOptions, Psn, Qpn, RxFrame, RxPrediction, TransportHeaders,
};

fuzz_target!(|data: &[u8]| {
    let _ = TransportHeaders::parse(data);
    let _ = parse_arp_frame(data);
    let _ = parse_nd_frame(data);
    let _ = parse_frame_with(data, &ParseOptions { verify_icrc: false });
    let _ = RxPrediction::dest_qp(data);
    if let Some(r) = RxPrediction::record(data) {
        let blank = || TransportHeaders::new(BthRepr::new(Opcode(0), Qpn::new(0), Psn::new(0)));
        let (mut h, mut o) = (blank(), RxFrame::BLANK);
        assert!(r.parse_into(data, &mut h, &mut o), "a recorded frame predicts itself");
        let (mut hf, mut of) = (blank(), RxFrame::BLANK);
        assert_eq!(parse_frame_routed(data, &mut hf, &mut of, |_| true), Ok(true));
        assert_eq!(h, hf);
        assert_eq!((o.src_gid, o.dst_gid, o.tclass, o.udp_sport, o.check), (of.src_gid, of.dst_gid, of.tclass, of.udp_sport, of.check));
        assert!(std::ptr::eq(o.payload, of.payload));
    }
    if let Ok(f) = parse_frame(data) {
        let l3 = L3Info {
            src_mac: f.src_mac,
            dst_mac: f.dst_mac,
            src_ip: f.src_ip,
            dst_ip: f.dst_ip,
            tclass: f.tclass,
            ttl: f.ttl,
            flow_label: f.flow_label,
            udp_sport: f.udp_sport,
            ip_id: f.ip_id,
        };
        let again = build_frame_vec(&l3, &f.headers, f.payload).expect("accepted frame rebuilds");
        let g = parse_frame(&again).expect("rebuilt frame parses");
        assert_eq!(g.headers, f.headers);
        assert_eq!(g.payload, f.payload);
    }
});
