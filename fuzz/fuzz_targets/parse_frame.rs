//! Fuzz `parse_frame` (and the header/neighbour parsers it hands off to): must never
//! panic; anything it accepts must re-serialise to a frame that parses the same way.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmrxe_wire::{
    build_frame_vec, parse_arp_frame, parse_frame, parse_frame_with, parse_nd_frame, L3Info,
    ParseOptions, TransportHeaders,
};

fuzz_target!(|data: &[u8]| {
    let _ = TransportHeaders::parse(data);
    let _ = parse_arp_frame(data);
    let _ = parse_nd_frame(data);
    let _ = parse_frame_with(data, &ParseOptions { verify_icrc: false });
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
