//! `write_sample` output: every frame parses back to its spec, and tshark dissects every
//! frame as InfiniBand with the intended field values, none malformed.

mod common;

use pmrxe_wire::sample::sample_specs;
use pmrxe_wire::{opcode::ALL, parse_frame, read_pcap, write_sample};

const SEED: u64 = 0x5EED;

#[test]
fn sample_has_every_opcode_and_parses_back() {
    let path = common::scratch("sample-parse.pcap");
    let n = write_sample(&path, SEED).unwrap();
    assert_eq!(n, 2 * ALL.len());
    let specs = sample_specs(SEED);
    let recs = read_pcap(&path).unwrap();
    assert_eq!(recs.len(), n);
    for (i, (r, s)) in recs.iter().zip(&specs).enumerate() {
        let f = parse_frame(&r.data).unwrap_or_else(|e| panic!("frame {}: {e}", i + 1));
        assert_eq!(f.headers, s.headers, "frame {}", i + 1);
        assert_eq!(f.payload, &s.payload[..]);
        assert_eq!((f.src_ip, f.dst_ip, f.src_mac, f.dst_mac), (s.l3.src_ip, s.l3.dst_ip, s.l3.src_mac, s.l3.dst_mac));
        assert_eq!((f.tclass, f.ttl, f.udp_sport), (s.l3.tclass, s.l3.ttl, s.l3.udp_sport));
        assert_eq!(f.is_ipv6(), i >= ALL.len());
        assert_eq!(f.headers.bth.opcode, ALL[i % ALL.len()]);
    }
}

#[test]
fn sample_dissects_in_tshark_with_intended_fields() {
    let path = common::scratch("sample-tshark.pcap");
    write_sample(&path, SEED).unwrap();
    let specs = sample_specs(SEED);
    let fields = [
        "frame.number",
        "frame.protocols",
        "_ws.malformed",
        "udp.srcport",
        "udp.dstport",
        "infiniband.bth.opcode",
        "infiniband.bth.se",
        "infiniband.bth.m",
        "infiniband.bth.padcnt",
        "infiniband.bth.tver",
        "infiniband.bth.p_key",
        "infiniband.bth.destqp",
        "infiniband.bth.a",
        "infiniband.bth.psn",
        "infiniband.reth.va",
        "infiniband.reth.r_key",
        "infiniband.reth.dmalen",
        "infiniband.aeth.syndrome",
        "infiniband.aeth.msn",
        "infiniband.immdt",
        "infiniband.ieth",
        "infiniband.atomiceth.swapdt",
        "infiniband.atomiceth.cmpdt",
        "infiniband.atomicacketh.origremdt",
        "infiniband.deth.q_key",
        "infiniband.deth.srcqp",
    ];
    let rows = common::tshark_fields(&path, &[], &fields);
    assert_eq!(rows.len(), specs.len());
    for (row, s) in rows.iter().zip(&specs) {
        let n = &row["frame.number"];
        let h = &s.headers;
        let b = &h.bth;
        let num = |f: &str| common::num(&row[f]);
        assert!(row["frame.protocols"].contains(":udp:infiniband"), "frame {n}: {}", row["frame.protocols"]);
        assert_eq!(row["_ws.malformed"], "", "frame {n} malformed");
        assert_eq!(num("udp.dstport"), Some(4791));
        assert_eq!(num("udp.srcport"), Some(u64::from(s.l3.udp_sport)), "frame {n}");
        assert_eq!(num("infiniband.bth.opcode"), Some(u64::from(b.opcode.0)), "frame {n}");
        assert_eq!(common::flag(&row["infiniband.bth.se"]), b.solicited, "frame {n}");
        assert_eq!(common::flag(&row["infiniband.bth.m"]), b.migreq, "frame {n}");
        assert_eq!(num("infiniband.bth.padcnt"), Some(u64::from(b.pad)), "frame {n}");
        assert_eq!(num("infiniband.bth.tver"), Some(0));
        assert_eq!(num("infiniband.bth.p_key"), Some(u64::from(b.pkey)), "frame {n}");
        assert_eq!(num("infiniband.bth.destqp"), Some(u64::from(b.dest_qp.value())), "frame {n}");
        assert_eq!(common::flag(&row["infiniband.bth.a"]), b.ack_req, "frame {n}");
        assert_eq!(num("infiniband.bth.psn"), Some(u64::from(b.psn.value())), "frame {n}");
        // tshark shows the AtomicETH VA/R_Key under the RETH fields.
        let (va, rkey) = match (h.reth, h.atomic_eth) {
            (Some(r), _) => (Some(r.va), Some(u64::from(r.rkey))),
            (_, Some(a)) => (Some(a.va), Some(u64::from(a.rkey))),
            _ => (None, None),
        };
        assert_eq!(num("infiniband.reth.va"), va, "frame {n}");
        assert_eq!(num("infiniband.reth.r_key"), rkey, "frame {n}");
        assert_eq!(num("infiniband.reth.dmalen"), h.reth.map(|r| u64::from(r.len)), "frame {n}");
        assert_eq!(num("infiniband.aeth.syndrome"), h.aeth.map(|a| u64::from(a.syndrome.to_u8())), "frame {n}");
        assert_eq!(num("infiniband.aeth.msn"), h.aeth.map(|a| u64::from(a.msn.value())), "frame {n}");
        assert_eq!(common::bytes32(&row["infiniband.immdt"]), h.imm, "frame {n}");
        assert_eq!(common::bytes32(&row["infiniband.ieth"]), h.ieth, "frame {n}");
        assert_eq!(num("infiniband.atomiceth.swapdt"), h.atomic_eth.map(|a| a.swap_add), "frame {n}");
        assert_eq!(num("infiniband.atomiceth.cmpdt"), h.atomic_eth.map(|a| a.compare), "frame {n}");
        assert_eq!(num("infiniband.atomicacketh.origremdt"), h.atomic_ack.map(|a| a.orig), "frame {n}");
        assert_eq!(num("infiniband.deth.q_key"), h.deth.map(|d| u64::from(d.qkey)), "frame {n}");
        assert_eq!(num("infiniband.deth.srcqp"), h.deth.map(|d| u64::from(d.src_qp.value())), "frame {n}");
    }
}
