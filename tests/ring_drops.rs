//! Frames the kernel drops before pmrxe sees them are counted, not lost silently: a service
//! whose `pmrxe0` is `net_af_packet` (a 64-frame ring, set in its devargs) on a veth end in
//! namespace A is stopped (SIGSTOP: no thread drains the ring) while a raw socket in namespace
//! B sends 5000 frames at it, far more than the ring and the kernel's queues before it hold;
//! once it runs again, every frame is accounted for: received (`rx_packets`) or dropped by the
//! kernel (`rx_ring_drops`, the sockets' `PACKET_STATISTICS`, read by the idle lcore every
//! 100 ms). The same through af_xdp, whose sockets report `XDP_STATISTICS`.
mod common;

use std::time::Duration;

use common::raw;
use common::*;

/// Start a service with `text` as its config in namespace A, stop it, send 5000 frames at it
/// from B, resume it: every frame must be received or counted as dropped, exactly once.
fn every_frame_received_or_counted(ns: &NetnsPair, dir: &TempDir, text: &str) {
    let cfg = dir.join("ring-drops.toml");
    std::fs::write(&cfg, text).unwrap();
    let svc = Service::start(Some(&cfg), Some(&ns.a));
    let fd = raw::socket(&ns.b, &ns.if_b);
    let j0 = svc.stats_json();
    assert_eq!(sum_counter(&j0, "rx_ring_drops"), 0, "drops before any traffic");
    let seen0 = sum_counter(&j0, "rx_packets");
    const SENT: u64 = 5000;

    // SAFETY: signalling the service process this test started.
    assert_eq!(unsafe { libc::kill(svc.pid as i32, libc::SIGSTOP) }, 0);
    // To the service's MAC, a local experimental EtherType: frames the lcore would drop as not
    // for it, had it seen them.
    let mut frame = [0u8; 128];
    frame[..6].copy_from_slice(&[2, 0, 0x0a, 0x4d, 0, 1]);
    frame[6..12].copy_from_slice(&[2, 0, 0x0a, 0x4d, 0, 2]);
    frame[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    for _ in 0..SENT {
        raw::send(&fd, &frame);
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(svc.pid as i32, libc::SIGCONT) }, 0);

    let (mut drops, mut seen) = (0, 0);
    let counted = poll_until(Duration::from_secs(20), || {
        let j = svc.stats_json();
        drops = sum_counter(&j, "rx_ring_drops");
        seen = sum_counter(&j, "rx_packets") - seen0;
        drops + seen >= SENT
    });
    eprintln!("{SENT} frames at a stopped service: {drops} dropped by the kernel, {seen} received after SIGCONT");
    assert!(counted, "{SENT} frames sent, {seen} received and {drops} counted as dropped: {}", svc.stats_text());
    assert_eq!(drops + seen, SENT, "every frame received or counted as dropped, once");
    assert!(drops > 0, "a 64-frame ring took all {SENT} frames");
}

#[test]
fn frames_dropped_by_a_full_af_packet_ring_show_in_pmrxe_stats() {
    let _l = heavy_lock();
    let ns = NetnsPair::up("rd");
    let dir = TempDir::new("ring-drops");
    let text = raw::af_packet_config(&format!("pmrxe-rd-{}", std::process::id()), &ns.if_a, "02:00:0a:4d:00:01", "10.77.0.1/24");
    let text = text.replace("qpairs=1\"", "qpairs=1,framecnt=64\"");
    assert!(text.contains("framecnt=64"), "{text}");
    every_frame_received_or_counted(&ns, &dir, &text);
}

/// The same through `net_af_xdp` (copy mode on the veth): the kernel drops what finds no
/// buffer on the socket's fill ring or a full RX ring, and says so in `XDP_STATISTICS`
/// (cumulative; pmrxe counts the difference since its last read).
#[test]
fn frames_dropped_by_a_full_af_xdp_socket_show_in_pmrxe_stats() {
    let _l = heavy_lock();
    let ns = NetnsPair::up("rx");
    let dir = TempDir::new("ring-drops-xdp");
    let text = raw::af_packet_config(&format!("pmrxe-rx-{}", std::process::id()), &ns.if_a, "02:00:0a:4d:00:01", "10.77.0.1/24");
    let af_xdp = format!("net_af_xdp0,iface={},start_queue=0,queue_count=1", ns.if_a);
    let text = text.replace(&format!("net_af_packet0,iface={},qpairs=1", ns.if_a), &af_xdp);
    assert!(text.contains("net_af_xdp0"), "{text}");
    every_frame_received_or_counted(&ns, &dir, &text);
}
