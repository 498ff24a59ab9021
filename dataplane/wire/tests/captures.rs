//! F1 cross-check: every RoCEv2 frame of a capture made by another RoCEv2 implementation
//! (tests/data/roce-send-ack.pcap, see tests/data/README.md) parses, its ICRC verifies
//! and recomputes to the same bytes, and our decoding agrees with tshark's.

mod common;

use pmrxe_wire::{finish_frame, parse_frame, read_pcap, Error, Syndrome};
use std::path::Path;

const CAPTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/roce-send-ack.pcap");

#[test]
fn f1_reference_capture_parses_and_icrc_agrees() {
    let recs = read_pcap(Path::new(CAPTURE)).unwrap();
    assert_eq!(recs.len(), 123);
    let mut roce = 0;
    for (i, r) in recs.iter().enumerate() {
        match parse_frame(&r.data) {
            Ok(_) => {
                roce += 1;
                let mut copy = r.data.clone();
                finish_frame(&mut copy).unwrap();
                assert_eq!(copy, r.data, "frame {}: recomputed ICRC differs", i + 1);
            }
            Err(Error::NotRoce | Error::NotUdp | Error::Arp | Error::Icmpv6 | Error::NotIp) => {}
            Err(e) => panic!("frame {}: {e}", i + 1),
        }
    }
    assert_eq!(roce, 105);
}

#[test]
fn f1_reference_capture_agrees_with_tshark() {
    let fields = [
        "frame.number",
        "udp.dstport",
        "infiniband.bth.opcode",
        "infiniband.bth.destqp",
        "infiniband.bth.psn",
        "infiniband.bth.padcnt",
        "infiniband.immdt",
        "infiniband.aeth.syndrome",
        "infiniband.aeth.msn",
        "infiniband.invariant.crc",
    ];
    // Some frames use UDP source port 69: tell tshark both ports are InfiniBand.
    let extra = ["-d", "udp.port==4791,infiniband", "-d", "udp.port==69,infiniband"];
    let rows = common::tshark_fields(Path::new(CAPTURE), &extra, &fields);
    let recs = read_pcap(Path::new(CAPTURE)).unwrap();
    assert_eq!(rows.len(), recs.len());
    let mut checked = 0;
    for (r, row) in recs.iter().zip(&rows) {
        let Ok(f) = parse_frame(&r.data) else {
            assert_ne!(row["udp.dstport"], "4791", "frame {} is RoCE for tshark", row["frame.number"]);
            continue;
        };
        let h = &f.headers;
        let n = &row["frame.number"];
        assert_eq!(common::num(&row["infiniband.bth.opcode"]), Some(u64::from(h.bth.opcode.0)), "frame {n}");
        assert_eq!(common::num(&row["infiniband.bth.destqp"]), Some(u64::from(h.bth.dest_qp.value())), "frame {n}");
        assert_eq!(common::num(&row["infiniband.bth.psn"]), Some(u64::from(h.bth.psn.value())), "frame {n}");
        assert_eq!(common::num(&row["infiniband.bth.padcnt"]), Some(u64::from(h.bth.pad)), "frame {n}");
        assert_eq!(common::bytes32(&row["infiniband.immdt"]), h.imm, "frame {n}");
        assert_eq!(
            common::num(&row["infiniband.aeth.syndrome"]),
            h.aeth.map(|a| u64::from(a.syndrome.to_u8())),
            "frame {n}"
        );
        assert_eq!(common::num(&row["infiniband.aeth.msn"]), h.aeth.map(|a| u64::from(a.msn.value())), "frame {n}");
        // tshark shows the trailing 4 bytes read big-endian; we store/read little-endian.
        assert_eq!(common::num(&row["infiniband.invariant.crc"]), Some(u64::from(f.icrc.swap_bytes())), "frame {n}");
        if let Some(a) = h.aeth {
            assert!(matches!(a.syndrome, Syndrome::Ack { .. }), "frame {n}");
        }
        checked += 1;
    }
    assert_eq!(checked, 105);
}
