//! The wire check of issue 14: a capture of connect/accept/RTU/disconnect, a reject, an MRA and
//! a SIDR exchange, built by the CM on the simulated wire, must decode in the real tshark as
//! InfiniBand CM with no malformed packet, carry the service ID and private-data addresses the
//! kernel CMA would send, and pass the project's independent ICRC checker
//! (scripts/lib/icrc_check.py). Fails, naming the Debian package, when tshark or python3 is
//! absent (scripts/setup.sh installs both).

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pmrxe_cm::msg::attr;
use pmrxe_cm::sim::Sim;
use pmrxe_cm::*;
use pmrxe_wire::PcapWriter;

const UDP_SID: u64 = 0x0000_0000_0111_1C06;

/// Fail the test unless `cmd` runs (scripts/setup.sh installs Debian's `package`).
fn require(cmd: &str, package: &str) {
    let ok = Command::new(cmd).arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(ok, "`{cmd}` is not installed: install Debian's `{package}` package (scripts/setup.sh does)");
}

fn capture() -> Vec<Vec<u8>> {
    let mut sim = Sim::new(2, 77, cfg());
    sim.capture = Some(Vec::new());
    sim.nodes[1].cm.listen(SID, 8).unwrap();
    sim.nodes[1].cm.listen(UDP_SID, 8).unwrap();
    let mut c = Consumer::auto();
    // 1. rping-like connect with the CMA header, accept, RTU, disconnect.
    let hdr = cma::Repr { src_ip: "10.0.0.1".parse().unwrap(), src_port: 0xC123, dst_ip: "10.0.0.2".parse().unwrap() };
    let mut p = params(&sim, 0, 1, 0x11);
    p.private_data = hdr.with_user_data(b"rping", msg::req::PRIVATE_DATA_LEN).unwrap();
    let now = sim.now;
    let a = sim.nodes[0].cm.connect(now, &p).unwrap();
    assert!(c.run(&mut sim, 200, |c, _| c.has(1, is_established)));
    let now = sim.now;
    sim.nodes[0].cm.disconnect(now, a, &[]).unwrap();
    assert!(c.run(&mut sim, 200, |c, _| c.has(0, is_tw_exit) && c.has(1, is_tw_exit)));
    // 2. A consumer reject with private data, after an MRA for a retransmitted REQ.
    c.auto_accept = false;
    let now = sim.now;
    let mut p = params(&sim, 0, 1, 0x12);
    p.private_data = hdr.with_user_data(b"", msg::req::PRIVATE_DATA_LEN).unwrap();
    sim.nodes[0].cm.connect(now, &p).unwrap();
    assert!(c.run(&mut sim, 200, |_, s| s.trace.iter().any(|t| t.attr_id == attr::MRA)));
    let b = c.log.iter().rev().find_map(|(n, e)| (*n == 1 && matches!(e, Event::ConnectRequest { .. })).then(|| e.id())).unwrap();
    let now = sim.now;
    sim.nodes[1].cm.reject(now, b, RejReason::CONSUMER_DEFINED, &[], b"busy").unwrap();
    assert!(c.run(&mut sim, 200, |c, _| c.has(0, |e| matches!(e, Event::Rejected { .. }))));
    // 3. No listener: REJ 8.
    let mut p = params(&sim, 0, 1, 0x13);
    p.service_id = cma::service_id(cma::PortSpace::TCP, 9);
    let now = sim.now;
    sim.nodes[0].cm.connect(now, &p).unwrap();
    sim.drive(100).unwrap();
    // 4. SIDR for UD.
    let mut path = sim.route(0, 1);
    path.packet_life_time = 8;
    let pd = hdr.with_user_data(b"", msg::sidr_req::PRIVATE_DATA_LEN).unwrap();
    let now = sim.now;
    sim.nodes[0].cm.sidr_resolve(now, &SidrParams { path, service_id: UDP_SID, timeout: 12, max_cm_retries: 3, private_data: pd }).unwrap();
    assert!(c.run(&mut sim, 200, |c, _| c.has(0, |e| matches!(e, Event::SidrReply { .. }))));
    sim.drive(1000).unwrap();
    sim.capture.take().unwrap().into_iter().map(|(_, f)| f).collect()
}

fn write_pcap(frames: &[Vec<u8>], path: &Path) {
    let f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut w = PcapWriter::new(f, false).unwrap();
    for (i, fr) in frames.iter().enumerate() {
        w.write_frame(Duration::new(1_700_000_000, i as u32 * 1000), fr).unwrap();
    }
    w.flush().unwrap();
}

fn out_path() -> PathBuf {
    std::env::var_os("PMRXE_CM_PCAP").map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join(format!("pmrxe-cm-{}.pcap", std::process::id())))
}

#[test]
fn capture_decodes_in_tshark_with_kernel_cma_values_and_valid_icrcs() {
    let frames = capture();
    let path = out_path();
    write_pcap(&frames, &path);
    let attrs: Vec<u16> = frames.iter().map(|f| {
        let (_, mad) = gsi::parse_mad_frame(f).unwrap();
        u16::from_be_bytes([mad[16], mad[17]])
    }).collect();
    for a in [attr::REQ, attr::REP, attr::RTU, attr::DREQ, attr::DREP, attr::MRA, attr::REJ, attr::SIDR_REQ, attr::SIDR_REP] {
        assert!(attrs.contains(&a), "capture lacks attribute {a:#06x}: {attrs:x?}");
    }

    require("tshark", "tshark");
    let out = Command::new("tshark")
        .args(["-r"]).arg(&path)
        .args(["-T", "fields", "-E", "separator=|", "-e", "infiniband.mad.mgmtclass", "-e", "infiniband.mad.attributeid",
            "-e", "infiniband.cm.req.serviceid", "-e", "infiniband.cm.req.ip_cm.sip4", "-e", "infiniband.cm.req.ip_cm.dip4",
            "-e", "infiniband.cm.req.ip_cm.sport", "-e", "infiniband.cm.req.localqpn", "-e", "infiniband.cm.req.prim_localgid_ipv4",
            "-e", "infiniband.cm.req.prim_remotegid_ipv4", "-e", "infiniband.cm.req.prim_locallid", "-e", "infiniband.cm.rej.reason",
            "-e", "infiniband.cm.rep.localqpn", "-e", "_ws.malformed", "-e", "_ws.expert.severity"])
        .output()
        .expect("run tshark");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('|').collect()).collect();
    eprintln!("{text}");
    assert_eq!(rows.len(), frames.len());
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[0], "0x07", "frame {} not a CM MAD: {r:?}", i + 1);
        assert_eq!(u16::from_str_radix(r[1].trim_start_matches("0x"), 16).unwrap(), attrs[i], "frame {}", i + 1);
        assert!(r[12].is_empty(), "frame {} malformed: {r:?}", i + 1);
    }
    let reqs: Vec<&Vec<&str>> = rows.iter().filter(|r| r[1] == "0x0010").collect();
    let first = reqs[0];
    assert_eq!(first[2], "0x0000000001061c06", "RDMA_PS_TCP port 7174");
    assert_eq!((first[3], first[4]), ("10.0.0.1", "10.0.0.2"), "cma_hdr addresses");
    assert_eq!(first[5], "0xc123", "cma_hdr source port");
    assert_eq!(first[6], "0x000011");
    assert_eq!((first[7], first[8]), ("10.0.0.1", "10.0.0.2"), "IPv4-mapped primary GIDs");
    assert_eq!(first[9], "65535", "permissive LID 0xFFFF on a routed RoCEv2 path");
    let rej_reasons: Vec<&str> = rows.iter().filter(|r| r[1] == "0x0012").map(|r| r[10]).collect();
    assert!(rej_reasons.contains(&"0x001c") && rej_reasons.contains(&"0x0008"), "consumer reject 28 and no-listener 8: {rej_reasons:?}");
    assert!(rows.iter().any(|r| r[1] == "0x0013" && r[11] == "0x001001"), "REP carries the accepted QPN");

    // The project's independent ICRC checker (Python standard library only).
    require("python3", "python3");
    let checker = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lib/icrc_check.py");
    assert!(checker.is_file(), "the ICRC checker {} is missing from the repository", checker.display());
    let out = Command::new("python3").arg(&checker).arg("--strict-pad").arg("--check-ip-csum").arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "icrc_check: {text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("checked {} packets, 0 bad ICRC, 0 malformed", frames.len())), "{text}");
    if std::env::var_os("PMRXE_CM_PCAP").is_none() {
        let _ = std::fs::remove_file(&path);
    }
}
