//! ECN and CNP on the production path (issue 17): an lcore with two ECN-enabled devices moves
//! RDMA WRITE traffic through a "switch" (this test) that checks every RoCE frame leaves
//! ECT(0) and marks the data frames Congestion Experienced. The receiving QP's notification
//! point answers with a CNP (opcode 0x81, ECT(0), DSCP 48), the sending QP's reaction point
//! cuts its DCQCN rate, the WRITEs still complete, and the counters say so per QP and per
//! lcore. The CNP the lcore built passes the project's independent checker
//! `scripts/lib/icrc_check.py`.
mod common;

use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use common::{client_page, jumbo_buf, lock, rig, wire, QueuePort, Rig};
use crossbeam::channel::bounded;
use pmrxe_abi::{send_flags, wr_opcode, Doorbell, ShmSendWqe, ShmSge};
use pmrxe_mem::{MemLimits, MemTable};
use pmrxe_runtime::lcore::{Cmd, DeviceConfig, Lcore};
use pmrxe_port::PacketBuf;
use pmrxe_runtime::neigh::ip_to_gid;
use pmrxe_transport::sim::{bring_up, PairParams};
use pmrxe_transport::{CcConfig, DcqcnParams, Instant, NpParams, PathMtu};
use pmrxe_wire::{self as wire, ecn};

/// Rewrite an IPv4 frame's ECN field to CE and fix the header checksum (the ICRC masks TOS).
fn mark_ce(f: &mut [u8]) {
    f[15] = ecn::with_ecn(f[15], ecn::CE);
    f[24] = 0;
    f[25] = 0;
    let mut sum: u32 = f[14..34].chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

#[test]
fn ce_marks_become_cnps_that_cut_the_senders_rate() {
    let (a_tx, a_rx, b_tx, b_rx) = (wire(), wire(), wire(), wire());
    let ip0: IpAddr = "198.18.0.1".parse().unwrap();
    let ip1: IpAddr = "198.18.0.2".parse().unwrap();
    let (mac0, mac1) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let cc = CcConfig { np: Some(NpParams::default()), rp: Some(DcqcnParams { line_rate_bps: 10_000_000_000, ..DcqcnParams::default() }) };
    let d0 = DeviceConfig { index: 0, mac: mac0, gids: vec![ip_to_gid(ip0)], mtu: 9000, ecn: true, cc };
    let d1 = DeviceConfig { index: 1, mac: mac1, gids: vec![ip_to_gid(ip1)], mtu: 9000, ecn: true, cc };
    let mem = Arc::new(MemTable::new(MemLimits::default()));
    let idle = pmrxe_config::IdleConfig { mode: pmrxe_config::IdleMode::Busy, ..Default::default() };
    let links = vec![(QueuePort { rx: a_rx.clone(), tx: a_tx.clone(), new_buf: jumbo_buf }, d0), (QueuePort { rx: b_rx.clone(), tx: b_tx.clone(), new_buf: jumbo_buf }, d1)];
    let (mut lc, h) = Lcore::new(0, links, mem.clone(), &[(ip0, mac0), (ip1, mac1)], idle, Arc::new(AtomicBool::new(false)), None);

    // The QPs carry a GRH traffic class with DSCP 26 (AF31): the wire must keep it, plus ECT(0).
    let p = PairParams { mtu: PathMtu::Mtu4096, access: 0x7, traffic_class: 26 << 2, ..PairParams::default() };
    let Rig { page, events: _events, mut cq_rings, mut sqs, lkey, rkey, dst, .. } = rig(&mut lc, &h, &mem, [ip0, ip1], &p, bring_up, None);
    let cpage = client_page(&page);
    const N: u64 = 16;
    for i in 0..N {
        let mut w = ShmSendWqe { wr_id: i, opcode: wr_opcode::RDMA_WRITE, send_flags: send_flags::SIGNALED, num_sge: 1, remote_addr: 0x20_0000 + i * 65536, rkey: rkey.0, ..Default::default() };
        w.set_sge(0, ShmSge { addr: 0x10_0000 + i * 65536, length: 65536, lkey: lkey.0 });
        sqs[0].1.push(w).unwrap();
    }
    cpage.ring(Doorbell { lcore: 0, slot: 0 });

    // Run the lcore and the switch until every WRITE completed (bounded in simulated time).
    let (mut now, mut completed, mut data_frames, mut cnps) = (1_000u64, 0u64, 0u64, Vec::new());
    while completed < N {
        assert!(now < 2_000_000_000, "WRITEs did not complete ({completed}/{N})");
        lc.poll_once(Instant(now));
        now += 1_000;
        // 0 -> 1: requests; each must be ECT(0) with the QP's DSCP; the switch marks CE.
        let frames: Vec<_> = lock(&a_tx).drain(..).collect();
        for mut b in frames {
            let len = b.data().len();
            let f = b.resize(len).unwrap();
            assert_eq!((f[15] >> 2, ecn::ecn_of(f[15])), (26, ecn::ECT0), "request TOS {:#x}", f[15]);
            mark_ce(f);
            data_frames += 1;
            lock(&b_rx).push_back(b);
        }
        // 1 -> 0: acknowledgements (DSCP 26) and CNPs (DSCP 48), all ECT(0).
        let frames: Vec<_> = lock(&b_tx).drain(..).collect();
        for b in frames {
            let f = b.data();
            assert_eq!(ecn::ecn_of(f[15]), ecn::ECT0, "response TOS {:#x}", f[15]);
            if f[42] == wire::cnp::OPCODE.0 {
                assert_eq!(f[15] >> 2, 48, "CNP DSCP");
                let c = wire::parse_cnp_frame(f).expect("a valid CNP");
                assert_eq!(u32::from(c.cnp.dest_qp), 0x11, "CNP names the sending QP");
                cnps.push(f.to_vec());
            } else {
                assert_eq!(f[15] >> 2, 26);
            }
            lock(&a_rx).push_back(b);
        }
        while let Some(c) = cq_rings[0].1.pop().unwrap() {
            assert_eq!(c.status, 0, "WRITE {} failed: status {}", c.wr_id, c.status);
            completed += 1;
        }
    }
    let mut out = vec![0u8; 65536];
    for i in 0..N as usize {
        dst.read(i * 65536, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0xab), "WRITE {i} data intact");
    }
    // Counters: per lcore and per QP.
    let s = h.stats.snapshot();
    println!("data frames {data_frames}, CNPs {}, lcore {:?}", cnps.len(), (s.rx_ecn_ce, s.tx_cnp, s.rx_cnp));
    assert!(s.rx_ecn_ce >= data_frames, "every marked frame counted ({} < {data_frames})", s.rx_ecn_ce);
    assert!(!cnps.is_empty() && cnps.len() as u64 == s.tx_cnp && s.tx_cnp == s.rx_cnp, "CNPs sent == seen == received");
    // At most one CNP per QP per 50 µs of the lcore's clock (1 µs per poll here).
    assert!((cnps.len() as u64) <= now / 50_000 + 1, "{} CNPs in {now} ns", cnps.len());
    let (tx, rx) = bounded(1);
    h.cmds.send(Cmd::QpStats { done: tx }).unwrap();
    lc.poll_once(Instant(now));
    let qs = rx.recv().unwrap();
    let st = |qpn| qs.iter().find(|(q, _, _)| *q == qpn).unwrap().2.clone();
    let (snd, rcv) = (st(0x11), st(0x12));
    println!("sender: cnp_received {} decreases {} rate {} Mb/s; receiver: ecn_ce {} cnp_sent {}", snd.cnp_received, snd.cc_rate_decreases, snd.cc_rate_mbps, rcv.ecn_ce_received, rcv.cnp_sent);
    assert_eq!(snd.cnp_received, s.rx_cnp);
    assert_eq!(rcv.cnp_sent, s.tx_cnp);
    assert!(rcv.ecn_ce_received >= data_frames);
    assert!(snd.cc_rate_decreases >= 1, "the reaction point cut the rate");
    assert!(snd.cc_rate_mbps < 10_000, "rate {} Mb/s is below line rate", snd.cc_rate_mbps);

    // The CNP the lcore built verifies with the independent checker (python3: Debian's
    // `python3`, installed by scripts/setup.sh; a missing one fails the test).
    let checker = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lib/icrc_check.py");
    assert!(checker.is_file(), "the ICRC checker {} is missing from the repository", checker.display());
    let path = std::env::temp_dir().join(format!("pmrxe-cnp-{}.pcap", std::process::id()));
    let mut w = wire::PcapWriter::new(std::fs::File::create(&path).unwrap(), false).unwrap();
    w.write_frame(Duration::from_secs(1_700_000_000), &cnps[0]).unwrap();
    w.flush().unwrap();
    drop(w);
    let o = std::process::Command::new("python3").arg(&checker).args(["-v", "--strict-pad", "--check-ip-csum"]).arg(&path).output().expect("python3 (Debian package python3, scripts/setup.sh installs it)");
    let text = String::from_utf8_lossy(&o.stdout);
    println!("{text}");
    let _ = std::fs::remove_file(&path);
    assert!(o.status.success(), "icrc_check: {text}{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("checked 1 packets, 0 bad ICRC, 0 malformed") && text.contains("opcode 0x81 CNP"), "{text}");
    // Same layout as the ConnectX vector: 14 + 20 + 8 + 12 (BTH) + 16 + 4 (ICRC), BECN set.
    assert_eq!(cnps[0].len(), 74);
    assert_eq!(cnps[0][46] & 0x40, 0x40, "BECN");
}
