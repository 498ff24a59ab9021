//! ECN/CNP on the real path (issue 17): a service whose `pmrxe0` is DPDK `net_af_packet` on a
//! veth end in namespace `pmrxe-cc-a` (a NIC port: ECN on by default); the test is the peer,
//! writing and reading raw frames with an AF_PACKET socket on the other end in `pmrxe-cc-b`.
//!
//! 1. The service's RC requests leave ECN-capable: ECT(0) in the IP TOS.
//! 2. A CNP built like the ConnectX-4 Lx vector of `scripts/lib/icrc_check.py`
//!    (DSCP 48 + ECT(0), UDP source port 0, BECN, 16 reserved bytes, hardware ICRC layout),
//!    addressed to the service's QP, cuts that QP's DCQCN rate: `pmrxe stats --json` shows the
//!    CNP received (per QP and per lcore) and the rate below line rate.
//! 3. A CE-marked WRITE to the QP is ACKed and answered with a CNP (notification point) that
//!    verifies with `icrc_check.py` and has the hardware vector's layout.
mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::raw;
use common::*;
use pmrxe_service::native::{access, wqe, AhAttr, Buffer, Context, Cq, Mr, Pd, Qp, QpOptions};
use pmrxe_wire::{build_cnp_frame, build_frame_vec, ecn, parse_cnp_frame, parse_frame, AethRepr, CnpRepr, L3Info, Msn, Opcode, Psn, Qpn, RethRepr, Syndrome, TransportHeaders};

const NS_A: &str = "pmrxe-cc-a";
const NS_B: &str = "pmrxe-cc-b";
const IF_A: &str = "pmrxe-ca";
const IF_B: &str = "pmrxe-cb";
const MAC_A: [u8; 6] = [2, 0, 0x0a, 0x4e, 0, 1];
const MAC_B: [u8; 6] = [2, 0, 0x0a, 0x4e, 0, 2];
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
/// The peer's (this test's) QP number.
const PEER_QPN: u32 = 0x118;

/// `ecn` left at its NIC-port default (on). Line rate 1 Gb/s and a 1 s rate-increase timer
/// with a huge byte counter, so one CNP's cut (α = 1: half the rate) is still visible when
/// the test reads the stats a few milliseconds later.
fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("congestion.toml");
    std::fs::write(
        &p,
        raw::af_packet_config("pmrxe-cc", IF_A, "02:00:0a:4e:00:01", "10.78.0.1/24")
            + r#"congestion = { line_rate_mbps = 1000, rate_increase_timer_us = 1000000, byte_counter = 1000000000000 }
[[neighbors]]
ip = "10.78.0.2"
mac = "02:00:0a:4e:00:02"
"#,
    )
    .unwrap();
    p
}

fn l3(tclass: u8) -> L3Info {
    raw::l3_v4(MAC_B, IP_B, MAC_A, IP_A, tclass)
}

fn qp_stats(svc: &Service, qpn: u32) -> serde_json::Value {
    let v = svc.stats_json();
    v["lcores"][0]["qps"].as_array().unwrap().iter().find(|q| q["qpn"] == qpn).cloned().unwrap_or_default()
}

fn lcore_ctr(svc: &Service, name: &str) -> u64 {
    svc.stats_json()["lcores"][0]["counters"][name].as_u64().unwrap_or(0)
}

#[test]
fn cnp_and_ecn_on_the_wire() {
    require_root();
    let _lock = heavy_lock();
    let t_start = Instant::now();
    let _ns = NetnsPair::named(NS_A, NS_B, IF_A, IF_B);
    let dir = TempDir::new("congestion");
    let cfg = config(dir.path());
    let svc = Service::start(Some(&cfg), Some(NS_A));
    let fd = raw::socket(NS_B, IF_B);
    eprintln!("congestion_netns: service up after {:.1} s", t_start.elapsed().as_secs_f64());

    let ctx = Context::connect(&svc.socket).expect("native connect");
    let pd = Pd::alloc(&ctx, 0).expect("pd");
    let mut cq = Cq::create(&ctx, 0, 256).expect("cq");
    let buf = Buffer::new(&ctx, 4096).expect("buffer");
    buf.fill(0x5a);
    let mr = Mr::register(&pd, &buf, access::ALL).expect("mr");
    let mut qp = Qp::create(&pd, &cq, &cq, QpOptions::default()).expect("qp");
    let mut dgid = [0u8; 16];
    dgid[10] = 0xff;
    dgid[11] = 0xff;
    dgid[12..].copy_from_slice(&IP_B.octets());
    // GRH traffic class: DSCP 26 (AF31), ECN bits 0 — the wire must carry DSCP 26 + ECT(0).
    let av = AhAttr { dgid, sgid_index: 1, hop_limit: 64, traffic_class: 26 << 2, is_global: true, port_num: 1, ..Default::default() };
    qp.connect(PEER_QPN, av, 3, 4).expect("connect");
    let qpn = qp.qpn;

    // 1. The QP runs: a WRITE to the peer leaves ECN-capable with the GRH's DSCP.
    qp.post_send(&[wqe::write_inline(1, &[7u8; 32], 0x1000, 0x77, true)]).expect("post WRITE");
    let frames = raw::recv_until(&fd, MAC_A, Duration::from_secs(5), |v| v.iter().any(|f| parse_frame(f).is_ok_and(|r| r.headers.bth.opcode == Opcode::RC_RDMA_WRITE_ONLY)));
    let w = frames.iter().find(|f| parse_frame(f).is_ok_and(|r| r.headers.bth.opcode == Opcode::RC_RDMA_WRITE_ONLY)).expect("the WRITE reached the peer");
    assert_eq!((w[15] >> 2, ecn::ecn_of(w[15])), (26, ecn::ECT0), "TOS {:#04x}: DSCP 26 + ECT(0)", w[15]);
    // The peer ACKs it, so the QP stays in RTS (no retry exhaustion while the test runs).
    let wpsn = parse_frame(w).unwrap().headers.bth.psn;
    let mut ack = TransportHeaders::new(raw::bth(Opcode::RC_ACKNOWLEDGE, qpn, wpsn, false));
    ack.aeth = Some(AethRepr { syndrome: Syndrome::Ack { credits: 0x1f }, msn: Msn::new(1) });
    raw::send(&fd, &build_frame_vec(&l3(26 << 2), &ack, &[]).expect("build ACK"));
    let mut c = [pmrxe_service::native::ShmCqe::default(); 4];
    wait_until(Duration::from_secs(5), "the WRITE completing after the ACK", || cq.poll(&mut c).expect("poll") > 0);
    let done = c[0];
    assert_eq!((done.wr_id, done.status), (1, 0), "WRITE completed with success");
    eprintln!("congestion_netns: WRITE ACKed after {:.1} s", t_start.elapsed().as_secs_f64());
    let before = qp_stats(&svc, qpn);
    assert_eq!(before["cc_rate_mbps"], 1000, "unlimited: line rate {before}");
    assert_eq!(before["cnp_received"], 0);

    // 2. A hardware-layout CNP for the QP cuts its rate.
    let hw = L3Info { tclass: 0xc2, udp_sport: 0, ip_id: 0x718c, ..l3(0) };
    let mut cnp = [0u8; 128];
    let n = build_cnp_frame(&mut cnp, &hw, &CnpRepr::new(Qpn::new(qpn))).unwrap();
    assert_eq!(n, 74, "the ConnectX vector's length");
    raw::send(&fd, &cnp[..n]);
    // (A miss is reported by the exact asserts below.)
    poll_until(Duration::from_secs(5), || lcore_ctr(&svc, "rx_cnp") > 0);
    let after = qp_stats(&svc, qpn);
    println!("QP {qpn:#x} before: rate {} Mb/s; after the injected CNP: cnp_received {} decreases {} rate {} Mb/s", before["cc_rate_mbps"], after["cnp_received"], after["cc_rate_decreases"], after["cc_rate_mbps"]);
    assert_eq!(lcore_ctr(&svc, "rx_cnp"), 1, "lcore rx_cnp");
    assert_eq!(after["cnp_received"], 1);
    assert_eq!(after["cc_rate_decreases"], 1);
    let rate = after["cc_rate_mbps"].as_u64().unwrap();
    assert!(rate <= 750, "rate {rate} Mb/s: cut from 1000 (α = 1 halves it; at most one fast-recovery step since)");
    // A CNP with a bad ICRC or for another QP changes nothing.
    let mut bad = cnp;
    bad[n - 1] ^= 1;
    let icrc0 = lcore_ctr(&svc, "rx_icrc_errors");
    raw::send(&fd, &bad[..n]);
    poll_until(Duration::from_secs(5), || lcore_ctr(&svc, "rx_icrc_errors") > icrc0);
    assert_eq!(lcore_ctr(&svc, "rx_icrc_errors"), icrc0 + 1, "the corrupt CNP is counted as a bad ICRC");
    assert_eq!(qp_stats(&svc, qpn)["cnp_received"], 1, "a corrupt CNP is dropped");

    eprintln!("congestion_netns: CNP checks done after {:.1} s", t_start.elapsed().as_secs_f64());
    // 3. Notification point: a CE-marked WRITE into our MR is ACKed and answered with a CNP —
    // and `pmrxe capture` shows all three (the WRITE received, the ACK and the CNP sent).
    let cap_pcap = dir.path().join("capture.pcap");
    let qp_arg = qpn.to_string();
    let mut cap = svc.capture(&["--qp", &qp_arg, "--count", "3"], &cap_pcap);
    let mut h = TransportHeaders::new(raw::bth(Opcode::RC_RDMA_WRITE_ONLY, qpn, Psn::new(0), true));
    h.reth = Some(RethRepr { va: mr.addr, rkey: mr.key, len: 64 });
    let f = build_frame_vec(&l3(ecn::with_ecn(26 << 2, ecn::CE)), &h, &[0xc3; 64]).expect("build WRITE");
    raw::send(&fd, &f);
    let got = raw::recv_until(&fd, MAC_A, Duration::from_secs(5), |v| v.iter().any(|f| f.len() > 42 && f[42] == 0x81));
    let cnp_out = got.iter().find(|f| f.len() > 42 && f[42] == 0x81).expect("a CNP for the CE-marked WRITE");
    let c = parse_cnp_frame(cnp_out).expect("valid CNP");
    assert_eq!(u32::from(c.cnp.dest_qp), PEER_QPN, "addressed to the sending QP");
    assert_eq!((c.tclass >> 2, ecn::ecn_of(c.tclass)), (48, ecn::ECT0), "DSCP 48 + ECT(0) as the NIC");
    assert_eq!(cnp_out.len(), 74);
    assert_eq!(cnp_out[46] & 0x40, 0x40, "BECN");
    assert!(buf.to_vec(0, 64).iter().all(|&b| b == 0xc3), "the CE-marked WRITE was placed");
    let st = qp_stats(&svc, qpn);
    assert_eq!((st["ecn_ce_received"].as_u64(), st["cnp_sent"].as_u64()), (Some(1), Some(1)), "{st}");
    assert_eq!((lcore_ctr(&svc, "rx_ecn_ce"), lcore_ctr(&svc, "tx_cnp")), (1, 1));

    let st = wait_timeout(&mut cap, Duration::from_secs(10)).expect("pmrxe capture stops after its 3 frames");
    assert!(st.success(), "pmrxe capture: {st}");
    let captured: Vec<Vec<u8>> = pmrxe_wire::pcap::read_pcap(&cap_pcap).expect("a classic pcap").into_iter().map(|r| r.data).collect();
    let ops: Vec<u8> = captured.iter().filter(|f| f.len() > 42).map(|f| f[42]).collect();
    assert_eq!(captured.len(), 3, "WRITE in, ACK and CNP out: opcodes {ops:02x?}");
    assert!(ops.contains(&0x81), "pmrxe capture shows the CNP: opcodes {ops:02x?}");
    assert!(captured.iter().any(|f| f.as_slice() == cnp_out.as_slice()), "the captured CNP is the frame that went on the wire");
    let o = std::process::Command::new(require_tool("tshark")).args(["-r"]).arg(&cap_pcap).args(["-Y", "_ws.malformed || _ws.expert.severity >= error", "-T", "fields", "-e", "frame.number"]).output().expect("run tshark");
    assert!(o.status.success(), "tshark: {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "", "tshark: no malformed frames in the capture");

    let (ok, text) = icrc_check(&cap_pcap, &["-v", "--strict-pad", "--check-ip-csum"]);
    println!("pmrxe capture:\n{text}");
    assert!(ok && text.contains("checked 3 packets, 0 bad ICRC, 0 malformed") && text.contains("CNP"), "icrc_check on the capture: {text}");
    let pcap = dir.path().join("cnp.pcap");
    let mut wtr = pmrxe_wire::PcapWriter::new(std::fs::File::create(&pcap).unwrap(), false).unwrap();
    wtr.write_frame(Duration::from_secs(1_700_000_000), cnp_out).unwrap();
    wtr.write_frame(Duration::from_secs(1_700_000_001), &cnp[..n]).unwrap();
    wtr.flush().unwrap();
    drop(wtr);
    let (ok, text) = icrc_check(&pcap, &["-v", "--strict-pad", "--check-ip-csum"]);
    println!("{text}");
    assert!(ok, "icrc_check: {text}");
    assert!(text.contains("checked 2 packets, 0 bad ICRC, 0 malformed"), "{text}");
}
