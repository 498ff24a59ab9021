//! A CNP built by pmrxe (IPv4 and IPv6) verifies with the project's independent checker
//! `scripts/lib/icrc_check.py` (whose self-test holds the ConnectX-4 Lx hardware vector).

mod common;

use std::net::IpAddr;
use std::time::Duration;

use pmrxe_wire::{build_cnp_frame, parse_cnp_frame, CnpRepr, L3Info, MacAddr, PcapWriter, Qpn};

#[test]
fn pmrxe_cnp_passes_icrc_check_py() {
    let v4 = L3Info {
        src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        src_ip: IpAddr::V4("198.18.0.2".parse().unwrap()),
        dst_ip: IpAddr::V4("198.18.0.1".parse().unwrap()),
        tclass: 0xc2,
        ..L3Info::default()
    };
    let v6 = L3Info { src_ip: "fd00::2".parse().unwrap(), dst_ip: "fd00::1".parse().unwrap(), flow_label: 0x12345, ..v4 };
    let path = common::scratch("cnp.pcap");
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap(), false).unwrap();
    for (i, l3) in [v4, v6].iter().enumerate() {
        let mut buf = [0u8; 128];
        let n = build_cnp_frame(&mut buf, l3, &CnpRepr::new(Qpn::new(0x11 + i as u32))).unwrap();
        assert_eq!(parse_cnp_frame(&buf[..n]).unwrap().cnp.dest_qp, Qpn::new(0x11 + i as u32));
        w.write_frame(Duration::from_secs(1_700_000_000 + i as u64), &buf[..n]).unwrap();
    }
    w.flush().unwrap();
    drop(w);
    let (ok, text) = common::icrc_check(&path, &["-v", "--strict-pad", "--check-ip-csum"]);
    println!("{text}");
    assert!(ok, "icrc_check: {text}");
    assert!(text.contains("checked 2 packets, 0 bad ICRC, 0 malformed"), "{text}");
    assert!(text.contains("opcode 0x81 CNP"), "{text}");
    let _ = std::fs::remove_file(&path);
}

/// The checker itself is right: its self-test (hardware and scapy known-answer vectors, masked
/// and covered bytes, every malformation it reports, pcap and pcapng) passes.
#[test]
fn icrc_check_py_self_test_passes() {
    let checker = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lib/icrc_check.py");
    let out = std::process::Command::new("python3")
        .arg(&checker)
        .arg("--selftest")
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}): install Debian's `python3` package (scripts/setup.sh does)"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("selftest: PASSED"), "{text}{}", String::from_utf8_lossy(&out.stderr));
}
