//! rdma_cm over IPv6 (issue 14): the loopback configuration with an IPv6 address on each port
//! (fd00:77::1 on pmrxe0, fd00:77::2 on pmrxe1), unmodified rdmacm-utils through
//! `pmrxe run --` binding and resolving IPv6 addresses (and `::1`), and a capture of the CM
//! exchange checked with tshark: RoCEv2 over IPv6, the RDMA_PS_TCP service ID, the CMA
//! private-data header with IP version 6 and both IPv6 addresses (what the kernel's CMA
//! sends), valid ICRCs.
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const A6: &str = "fd00:77::1";
const B6: &str = "fd00:77::2";
const T: Duration = Duration::from_secs(60);

fn port(i: u16) -> u16 {
    port_for(520 + i)
}

/// configs/loopback.toml plus an IPv6 address (and static neighbour) per port.
fn ipv6_config(dir: &Path) -> PathBuf {
    let base = std::fs::read_to_string(repo_root().join("configs/loopback.toml")).expect("configs/loopback.toml");
    let text = base
        .replace("ipv4 = \"198.18.0.1/24\"", &format!("ipv4 = \"198.18.0.1/24\"\nipv6 = \"{A6}/64\""))
        .replace("ipv4 = \"198.18.0.2/24\"", &format!("ipv4 = \"198.18.0.2/24\"\nipv6 = \"{B6}/64\""));
    assert_ne!(text, base, "configs/loopback.toml no longer has the IPv4 lines this test extends");
    let text = format!("{text}\n[[neighbors]]\nip = \"{A6}\"\nmac = \"02:00:c6:12:00:01\"\n\n[[neighbors]]\nip = \"{B6}\"\nmac = \"02:00:c6:12:00:02\"\n");
    let p = dir.join("loopback-ipv6.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// tshark's view of the CM MADs in `pcap`: (IPv6 src, dst, attribute ID, service ID, IP CM
/// version, source port, source IP, destination IP, malformed).
fn cm_fields(pcap: &Path) -> Vec<Vec<String>> {
    let fields = [
        "ipv6.src",
        "ipv6.dst",
        "infiniband.mad.attributeid",
        "infiniband.cm.req.serviceid",
        "infiniband.cm.req.ip_cm.ipv",
        "infiniband.cm.req.ip_cm.sport",
        "infiniband.cm.req.ip_cm.sip6",
        "infiniband.cm.req.ip_cm.dip6",
        "_ws.malformed",
    ];
    let mut cmd = Command::new(require_tool("tshark"));
    cmd.arg("-r").arg(pcap).args(["-T", "fields", "-E", "separator=|"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let o = cmd.output().expect("tshark");
    assert!(o.status.success(), "tshark: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).lines().map(|l| l.split('|').map(str::to_string).collect()).collect()
}

#[test]
fn rping_ucmatose_udaddy_over_ipv6_with_the_cma_header_on_the_wire() {
    for t in ["rping", "ucmatose", "udaddy", "tshark"] {
        require_tool(t);
    }
    let _l = heavy_lock();
    let dir = TempDir::new("cm-ipv6");
    let svc = Service::start(Some(&ipv6_config(dir.path())), None);

    // The 5 MADs of one rping connection (REQ, REP, RTU, DREQ, DREP), each seen sent and
    // received on the ring pair: 10 frames of QP 1.
    let pcap = svc.dir.join("cm6.pcap");
    let mut cap = svc.capture(&["--qp", "1", "--count", "10"], &pcap);
    let p = port(0).to_string();
    let r = run_cm_pair(&svc, &["rping", "-s", "-a", A6, "-p", &p, "-C", "10", "-v"], &["rping", "-c", "-a", A6, "-I", B6, "-p", &p, "-C", "10", "-v"], T);
    r.assert_ok();
    assert!(r.client.output.contains("ping data: rdma-ping-9: ") && r.server.output.contains("server ping data: rdma-ping-9: "), "{}", r.client.describe());
    let st = wait_timeout(&mut cap, Duration::from_secs(20)).expect("pmrxe capture --count 10 still running after the connection");
    assert!(st.success(), "pmrxe capture: {st}");

    let rows = cm_fields(&pcap);
    assert_eq!(rows.len(), 10, "{rows:?}");
    let text = format!("{rows:#?}");
    for r in &rows {
        assert!(r[8].is_empty(), "malformed: {r:?}");
        // Every MAD is RoCEv2 over IPv6 between the two ports' addresses.
        assert!((r[0] == B6 && r[1] == A6) || (r[0] == A6 && r[1] == B6), "not between {A6} and {B6}: {r:?}");
    }
    let attrs: Vec<&str> = rows.iter().map(|r| r[2].as_str()).collect();
    for (a, name) in [("0x0010", "REQ"), ("0x0013", "REP"), ("0x0014", "RTU"), ("0x0015", "DREQ"), ("0x0016", "DREP")] {
        assert!(attrs.contains(&a), "no {name}:\n{text}");
    }
    for req in rows.iter().filter(|r| r[2] == "0x0010") {
        assert_eq!((req[0].as_str(), req[1].as_str()), (B6, A6), "REQ from the client's port");
        assert_eq!(req[3], format!("0x000000000106{:04x}", port(0)), "RDMA_PS_TCP service ID of the port");
        // The CMA header (cma_hdr): IP version 6, the client's source port and both addresses.
        assert_eq!(req[4], "0x06", "IP CM version: {req:?}");
        let sport = u16::from_str_radix(req[5].trim_start_matches("0x"), 16).expect("IP CM source port");
        assert!(sport >= 32768, "ephemeral source port: {req:?}");
        assert_eq!((req[6].as_str(), req[7].as_str()), (B6, A6), "IP CM addresses");
    }
    let (ok, out) = icrc_check(&pcap, &["--strict-pad", "--check-ip-csum"]);
    assert!(ok && out.contains(" 0 bad ICRC, 0 malformed"), "icrc_check: {out}");

    // `::1` binds and resolves to pmrxe0 (the kernel CMA's loopback rule) and uses its IPv6 GID.
    let p = port(1).to_string();
    let r = run_cm_pair(&svc, &["rping", "-s", "-a", "::1", "-p", &p, "-C", "3", "-v"], &["rping", "-c", "-a", "::1", "-p", &p, "-C", "3", "-v"], T);
    r.assert_ok();
    assert!(r.client.output.contains("ping data: rdma-ping-2: "), "{}", r.client.describe());

    // ucmatose with 2 connections and udaddy (UD through SIDR, AH with an IPv6 GRH).
    let p = port(2).to_string();
    let r = run_cm_pair(&svc, &["ucmatose", "-b", A6, "-p", &p, "-c", "2"], &["ucmatose", "-s", A6, "-p", &p, "-c", "2"], T);
    r.assert_ok();
    assert!(r.client.output.contains("data transfers complete"), "{}", r.client.describe());
    let r = run_cm_pair(&svc, &["udaddy", "-b", A6], &["udaddy", "-s", A6], T);
    r.assert_ok();
    assert!(r.client.output.contains("data transfers complete"), "{}", r.client.describe());
    // The SIDR server keeps its reply 8.6 s for retransmitted SIDR_REQs.
    assert_nothing_left(&svc, Duration::from_secs(30), "rdma_cm over IPv6");
}
