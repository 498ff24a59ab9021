//! Raw Ethernet peers for the tests that write hand-made RoCEv2 frames at a service
//! (tests/adversary.rs, tests/congestion_netns.rs): an AF_PACKET socket on the far end of a
//! [`NetnsPair`](super::NetnsPair), and sending/receiving whole frames through it.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use pmrxe_wire::{BthRepr, L3Info, MacAddr, Opcode, Psn, Qpn};

/// A raw AF_PACKET socket (every protocol, 20 ms receive timeout) bound to `ifname` inside
/// network namespace `ns` (opened from a thread that joined the namespace; the fd keeps working
/// from any thread).
pub fn socket(ns: &str, ifname: &str) -> OwnedFd {
    let (ns, ifname) = (ns.to_string(), ifname.to_string());
    std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
        // SAFETY: setns on this thread with a namespace fd we hold.
        assert_eq!(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns");
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket syscall.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto as i32) };
        assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
        // SAFETY: fresh fd.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let name = std::ffi::CString::new(ifname.as_str()).unwrap();
        // SAFETY: NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert!(ifindex > 0, "if_nametoindex {ifname}");
        // SAFETY: sockaddr_ll is plain data.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: valid sockaddr_ll.
        let r = unsafe { libc::bind(fd.as_raw_fd(), (&sll as *const libc::sockaddr_ll).cast(), std::mem::size_of_val(&sll) as u32) };
        assert_eq!(r, 0, "bind AF_PACKET");
        let tv = libc::timeval { tv_sec: 0, tv_usec: 20_000 };
        // SAFETY: valid timeval option.
        unsafe {
            libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&tv as *const libc::timeval).cast(), std::mem::size_of_val(&tv) as u32)
        };
        fd
    })
    .join()
    .unwrap()
}

/// Send one whole frame on a [`socket`].
pub fn send(fd: &OwnedFd, frame: &[u8]) {
    // SAFETY: sending from a live buffer on our bound socket.
    let n = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(n, frame.len() as isize, "send: {}", std::io::Error::last_os_error());
}

/// Frames from source MAC `from` (the service's port) until `done` accepts the collection or
/// `wait` passes.
pub fn recv_until(fd: &OwnedFd, from: [u8; 6], wait: Duration, done: impl Fn(&[Vec<u8>]) -> bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let t0 = Instant::now();
    let mut buf = vec![0u8; 10000];
    while t0.elapsed() < wait && !done(&out) {
        // SAFETY: receiving into a live buffer.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n > 0 && n as usize > 12 && buf[6..12] == from {
            out.push(buf[..n as usize].to_vec());
        }
    }
    out
}

/// The start of a service config for a raw-peer test: one lcore (CPU 1, idle back-off), no
/// hugepages, EAL file prefix `prefix`, and port `pmrxe0` = DPDK `net_af_packet` on `iface`
/// with `mac`, `ipv4` (CIDR) and MTU 1500. The caller appends the rest: more keys of that port,
/// further ports, neighbours.
pub fn af_packet_config(prefix: &str, iface: &str, mac: &str, ipv4: &str) -> String {
    format!(
        r#"
[service]
log = "info"
idle = {{ mode = "backoff", spin_iterations = 1000, max_sleep_us = 200 }}
[eal]
hugepages = false
memory_mb = 256
file_prefix = "{prefix}"
[lcores]
cores = [1]
main_core = 0
[[ports]]
name = "pmrxe0"
kind = "vdev"
devargs = "net_af_packet0,iface={iface},qpairs=1"
mac = "{mac}"
ipv4 = "{ipv4}"
mtu = 1500
"#
    )
}

/// Addressing of a frame the raw peer (`mac`/`ip`) sends to the service's port
/// (`svc_mac`/`svc_ip`): IPv4, traffic class `tclass`, UDP source port 0xd00d.
pub fn l3_v4(mac: [u8; 6], ip: Ipv4Addr, svc_mac: [u8; 6], svc_ip: Ipv4Addr, tclass: u8) -> L3Info {
    L3Info { src_mac: MacAddr(mac), dst_mac: MacAddr(svc_mac), src_ip: IpAddr::V4(ip), dst_ip: IpAddr::V4(svc_ip), tclass, udp_sport: 0xd00d, ..Default::default() }
}

/// A BTH with the default partition key and no flags but `ack_req`.
pub fn bth(opcode: Opcode, qpn: u32, psn: Psn, ack_req: bool) -> BthRepr {
    BthRepr { opcode, solicited: false, migreq: false, pad: 0, tver: 0, pkey: 0xffff, fecn: false, becn: false, dest_qp: Qpn::new(qpn), ack_req, psn }
}
