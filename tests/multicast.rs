//! UD multicast: `ibv_attach_mcast`/`ibv_detach_mcast` and `rdma_join_multicast`/
//! `rdma_leave_multicast` through the shim, on the loopback service and between two services in
//! two namespaces (af_packet on a veth pair), with IGMP on the wire checked by tshark.
//!
//! - tests/mcast_check.c: every attached QP gets every datagram, bytes/lengths/order/GRH/source
//!   checked, including the sender's own port (the looped-back copy); a QP with another Q_Key,
//!   a detached QP and one never attached get nothing; the verbs' refusals and the
//!   `max_mcast_qp_attach` limit.
//! - rdmacm-utils' `mckey`, unmodified: two receivers and a sender.
mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(40);

/// The sum over the lcores of counter `name`.
fn counter(svc: &Service, name: &str) -> u64 {
    let v = svc.stats_json();
    v["lcores"].as_array().into_iter().flatten().map(|l| l["counters"][name].as_u64().unwrap_or(0)).sum()
}

#[test]
fn ud_multicast_through_the_verbs_with_data_checked() {
    let cc = require_tool("cc");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let prog = svc.dir.join("mcast_check");
    compile_c("tests/mcast_check.c", &prog, &cc, &["-libverbs"]);
    let n = 64;
    let o = run_verbs(&svc, &[prog.to_str().unwrap(), &n.to_string()], T);
    assert!(o.ok() && o.output.contains("mcast_check OK"), "{}", o.describe());
    // Two rounds of n: R1, R2, R3 in the first, R1 and R3 in the second.
    assert!(o.output.contains(&format!("mcast_check OK {}", 5 * n)), "{}", o.describe());
    // On the wire: every datagram left pmrxe0 once and arrived on pmrxe1 once (rx_multicast
    // counts the sender's looped-back copies too: 2n more), and copies were placed per QP.
    let rx = counter(&svc, "rx_multicast");
    let copies = counter(&svc, "rx_multicast_copies");
    let looped = counter(&svc, "tx_multicast_loopback");
    assert_eq!(looped, 2 * n, "the sender's port looped each datagram back to R3 once");
    assert_eq!(rx, 4 * n, "2n datagrams on pmrxe1 and 2n looped back on pmrxe0");
    // pmrxe1: R1, R2, R4 in round one, R1 and R4 in round two; pmrxe0: R3 both rounds.
    assert_eq!(copies, 3 * n + 2 * n + 2 * n, "copies placed");
    // A report when each group appeared on a port, a leave when it went.
    assert!(counter(&svc, "igmp_sent") >= 4, "igmp_sent {}", counter(&svc, "igmp_sent"));
    eprintln!("mcast_check: {}", o.output.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; "));
}

/// Two `mckey` receivers and one sender. mckey sleeps 3 s after joining, so the receivers
/// (started first) are attached and have their receive WQEs posted when the sender sends.
fn mckey_fan_out(sender: &Service, send_from: &str, receivers: &Service, recv_on: &str, group: &str, count: u32) -> (ProgOutput, ProgOutput, ProgOutput) {
    let c = count.to_string();
    let (o1, o2) = (receivers.dir.join("mckey-r1.out"), receivers.dir.join("mckey-r2.out"));
    let mut r1 = spawn_verbs(receivers, &["mckey", "-m", group, "-b", recv_on, "-C", &c], &o1);
    let mut r2 = spawn_verbs(receivers, &["mckey", "-m", group, "-b", recv_on, "-C", &c], &o2);
    // A head start for the receivers' joins, not a condition: mckey's stdout goes to a file,
    // buffered until it exits, and the service shows no per-id join. The sender's own 3 s
    // pause after joining is what mckey relies on; this only orders the three starts.
    std::thread::sleep(Duration::from_millis(1500));
    let s = run_verbs(sender, &["mckey", "-m", group, "-b", send_from, "-s", "-C", &c], T);
    let done = |child: &mut std::process::Child, out: &std::path::Path, name: &str| {
        let status = wait_timeout(child, Duration::from_secs(15)).or_else(|| {
            let _ = child.kill();
            child.wait().ok();
            None
        });
        ProgOutput { cmdline: name.to_string(), status, output: read_to_string_lossy(out) }
    };
    (s, done(&mut r1, &o1, "mckey receiver 1"), done(&mut r2, &o2, "mckey receiver 2"))
}

fn assert_mckey(s: &ProgOutput, r1: &ProgOutput, r2: &ProgOutput, group: &str) {
    for o in [s, r1, r2] {
        assert!(o.ok() && o.output.contains(&format!("joined dgid: ::ffff:{group}")) && o.output.contains("data transfers complete"), "{}", o.describe());
        assert!(o.output.contains("return status 0"), "{}", o.describe());
    }
}

#[test]
fn mckey_two_receivers_and_a_sender_on_the_loopback_service() {
    require_tool("mckey");
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    let (s, r1, r2) = mckey_fan_out(&svc, "198.18.0.1", &svc, "198.18.0.2", "239.1.1.1", 20);
    assert_mckey(&s, &r1, &r2, "239.1.1.1");
    // 20 datagrams reached pmrxe1, each placed for both receivers' QPs (mckey's receivers poll
    // until they have all 20 completions: none lost).
    assert!(counter(&svc, "rx_multicast_copies") >= 40, "{}", counter(&svc, "rx_multicast_copies"));
    assert_nothing_left(&svc, Duration::from_secs(10), "mckey");
}

/// tshark capturing IGMP on `iface` in namespace `ns` into `pcap`, started.
fn capture_igmp(ns: &str, iface: &str, pcap: &std::path::Path) -> std::process::Child {
    let c = std::process::Command::new(require_tool("ip"))
        .args(["netns", "exec", ns])
        .arg(require_tool("tshark"))
        .args(["-q", "-i", iface, "-f", "igmp", "-w"])
        .arg(pcap)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tshark");
    assert!(poll_until(Duration::from_secs(10), || std::fs::metadata(pcap).is_ok_and(|m| m.len() > 0)), "tshark did not start on {iface}");
    c
}

/// The IGMP messages of a capture: (source, destination, type, group, TTL, Router Alert).
fn igmp_rows(pcap: &std::path::Path) -> Vec<Vec<String>> {
    let o = std::process::Command::new(require_tool("tshark"))
        .args(["-r"])
        .arg(pcap)
        .args(["-T", "fields", "-e", "ip.src", "-e", "ip.dst", "-e", "igmp.type", "-e", "igmp.maddr", "-e", "ip.ttl", "-e", "ip.opt.ra"])
        .output()
        .expect("tshark -r");
    assert!(o.status.success(), "tshark -r: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).lines().map(|l| l.split('\t').map(str::to_string).collect()).collect()
}

#[test]
fn mckey_between_two_namespaces_with_igmp_on_the_wire() {
    require_tool("mckey");
    require_tool("tshark");
    let _l = heavy_lock();
    let ns = NetnsPair::up("mc");
    let dir = TempDir::new("mcast-netns");
    let (a, b) = ns.services(&dir);
    // IGMP captured at each end of the veth: what the *other* service sent (the PMD's own
    // frames bypass the sending side's taps: PACKET_QDISC_BYPASS).
    let (pa, pb) = (dir.join("igmp-at-a.pcap"), dir.join("igmp-at-b.pcap"));
    let mut caps = [capture_igmp(&ns.a, &ns.if_a, &pa), capture_igmp(&ns.b, &ns.if_b, &pb)];
    let (s, r1, r2) = mckey_fan_out(&a, "10.77.0.1", &b, "10.77.0.2", "239.1.1.7", 20);
    assert_mckey(&s, &r1, &r2, "239.1.1.7");
    assert!(counter(&b, "rx_multicast") >= 20 && counter(&b, "rx_multicast_copies") >= 40, "B: {} datagrams, {} copies", counter(&b, "rx_multicast"), counter(&b, "rx_multicast_copies"));
    // The leaves go out when the QPs are destroyed.
    assert_nothing_left(&a, Duration::from_secs(10), "mckey sender");
    assert_nothing_left(&b, Duration::from_secs(10), "mckey receivers");
    assert!(poll_until(Duration::from_secs(5), || counter(&a, "igmp_sent") >= 2 && counter(&b, "igmp_sent") >= 2), "IGMP sent: A {}, B {}", counter(&a, "igmp_sent"), counter(&b, "igmp_sent"));
    // Until each capture holds the other service's report and leave (tshark writes as it goes).
    let want = |pcap: &std::path::Path, from: &str| {
        let rows = igmp_rows(pcap);
        ["0x16", "0x17"].iter().all(|t| rows.iter().any(|r| r.len() >= 3 && r[0] == from && r[2] == *t))
    };
    let _ = poll_until(Duration::from_secs(10), || want(&pa, "10.77.0.2") && want(&pb, "10.77.0.1"));
    for c in &mut caps {
        sigterm(c.id());
        let _ = wait_timeout(c, Duration::from_secs(10));
    }
    // IGMPv2 Membership Report (0x16) to the group and Leave Group (0x17) to 224.0.0.2, TTL 1,
    // with the Router Alert option: what RFC 2236 requires and a snooping switch reads.
    for (pcap, from) in [(&pa, "10.77.0.2"), (&pb, "10.77.0.1")] {
        let rows = igmp_rows(pcap);
        let has = |dst: &str, ty: &str| rows.iter().any(|r| r.len() >= 6 && r[0] == from && r[1] == dst && r[2] == ty && r[3] == "239.1.1.7" && r[4] == "1" && !r[5].is_empty());
        assert!(has("239.1.1.7", "0x16") && has("224.0.0.2", "0x17"), "IGMP from {from} (src, dst, type, group, ttl, router alert): {rows:?}");
    }
    eprintln!("mckey across namespaces: 2 receivers x 20 datagrams; IGMP at A {:?}, at B {:?}", igmp_rows(&pa), igmp_rows(&pb));
    drop((a, b));
}

/// Two lcores sharing both ports (tests/multi_lcore.rs's layout): the two receivers are two
/// clients, so their QPs live on different lcores; a datagram received on either lcore's queue
/// is placed for its own member and handed, as a copy, to the other lcore.
#[test]
fn mckey_receivers_on_two_lcores_get_every_datagram() {
    require_tool("mckey");
    let _l = heavy_lock();
    let dir = TempDir::new("mcast-twolc");
    let base = std::fs::read_to_string(repo_root().join("configs/loopback.toml")).unwrap();
    let cfg = base.replace("cores = [1]", "cores = [1, 0]").replace("main_core = 0", "main_core = 0\nallow_main_core = true");
    assert_ne!(cfg, base, "loopback.toml layout changed: update this test");
    let path = dir.join("two.toml");
    std::fs::write(&path, cfg).unwrap();
    let svc = Service::start(Some(&path), None);
    let (s, r1, r2) = mckey_fan_out(&svc, "198.18.0.1", &svc, "198.18.0.2", "239.1.1.9", 20);
    assert_mckey(&s, &r1, &r2, "239.1.1.9");
    let st = svc.stats_json();
    let per = |n: &str| -> Vec<u64> { st["lcores"].as_array().expect("lcores").iter().map(|l| l["counters"][n].as_u64().unwrap_or(0)).collect() };
    assert_eq!(per("rx_multicast").len(), 2, "two lcores: {st}");
    assert!(per("rx_multicast_copies").iter().all(|&c| c >= 20), "each lcore placed copies for its receiver: {:?}", per("rx_multicast_copies"));
    assert!(per("handoff_out").iter().sum::<u64>() >= 20, "copies handed between the lcores: {:?}", per("handoff_out"));
    assert_nothing_left(&svc, Duration::from_secs(10), "mckey on two lcores");
}
