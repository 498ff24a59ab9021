//! The port smoke test: send N frames with a verifiable pattern from port A to port B and
//! check every byte and the order on arrival.
//!
//! Frame layout (`frame_len` bytes, 64..=1024 by default and never above `mtu + 14`):
//! `dst MAC | src MAC | ethertype 0x88B5 (IEEE local experimental) | seq u64 BE | pattern`,
//! where pattern byte `i` (offset from the start of the frame) is [`pattern_byte`]`(seq, i)`.
//!
//! [`run_pair`] works on any two [`Port`]s (so it is unit-tested on [`crate::SimPort`]);
//! [`run`] is the DPDK entry point used by `pmrxe port-test`; [`run_sender`] and
//! [`run_receiver`] split the test across two processes (memif, af_packet over veth).

use std::fmt;
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use pmrxe_config::{Config, ConfigError, MacAddr, PortKind};

use crate::{open_ports, Eal, EalConfig, EthPort, PacketBuf, Port, PortError, BURST};

/// Ethertype of test frames (IEEE 802 local experimental ethertype 1).
pub const ETHERTYPE: u16 = 0x88B5;
/// Offset of the sequence number.
const SEQ_OFF: usize = 14;
/// First pattern byte.
const PAT_OFF: usize = 22;
/// Default frame length.
pub const DEFAULT_FRAME_LEN: usize = 1024;
/// A test that makes no progress for this long fails.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Result of a port test. `Display` is one line containing `frames/s`.
#[derive(Clone, Debug, PartialEq)]
pub struct PortTestReport {
    /// Sending port name.
    pub tx_port: String,
    /// Receiving port name.
    pub rx_port: String,
    /// Frames sent (sender) or received and checked (receiver / pair).
    pub frames: u64,
    /// Bytes in those frames.
    pub bytes: u64,
    /// Frames with a wrong length, header, sequence number or pattern byte.
    pub errors: u64,
    /// Frame length.
    pub frame_len: usize,
    /// Wall time from the first send to the last check.
    pub elapsed: Duration,
}

impl PortTestReport {
    /// Frames per second.
    pub fn frames_per_sec(&self) -> f64 {
        self.frames as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Payload-inclusive frame bit rate in Gbit/s (no preamble/IFG/FCS).
    pub fn gbits_per_sec(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
}

impl fmt::Display for PortTestReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "port-test {} -> {}: {} frames of {} B, {} bytes, {} errors in {:.3} s: {:.0} frames/s, {:.3} Gbit/s",
            self.tx_port,
            self.rx_port,
            self.frames,
            self.frame_len,
            self.bytes,
            self.errors,
            self.elapsed.as_secs_f64(),
            self.frames_per_sec(),
            self.gbits_per_sec()
        )
    }
}

/// Pattern byte at frame offset `i` of frame `seq`.
#[inline]
pub fn pattern_byte(seq: u64, i: usize) -> u8 {
    (seq as u8).wrapping_mul(31).wrapping_add(i as u8) ^ ((i >> 8) as u8).wrapping_mul(0x5b)
}

/// Writes test frame `seq` into an empty buffer. `false` if it does not fit.
pub fn build_frame<B: PacketBuf>(buf: &mut B, dst: MacAddr, src: MacAddr, seq: u64, frame_len: usize) -> bool {
    let Some(d) = buf.append(frame_len) else { return false };
    d[0..6].copy_from_slice(&dst.0);
    d[6..12].copy_from_slice(&src.0);
    d[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    d[SEQ_OFF..PAT_OFF].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in d.iter_mut().enumerate().skip(PAT_OFF) {
        *b = pattern_byte(seq, i);
    }
    true
}

/// What is wrong with a received frame, if anything.
pub fn check_frame(d: &[u8], src: Option<MacAddr>, expect_seq: u64, frame_len: usize) -> Result<(), String> {
    if d.len() != frame_len {
        return Err(format!("frame {expect_seq}: length {} != {frame_len}", d.len()));
    }
    if d[12..14] != ETHERTYPE.to_be_bytes() {
        return Err(format!("frame {expect_seq}: ethertype {:02x}{:02x}", d[12], d[13]));
    }
    if let Some(s) = src {
        if d[6..12] != s.0 {
            return Err(format!("frame {expect_seq}: source MAC {}", MacAddr(d[6..12].try_into().unwrap_or([0; 6]))));
        }
    }
    let seq = u64::from_be_bytes(d[SEQ_OFF..PAT_OFF].try_into().unwrap_or([0; 8]));
    if seq != expect_seq {
        return Err(format!("frame {expect_seq}: got sequence number {seq} (order or loss)"));
    }
    if let Some(i) = (PAT_OFF..d.len()).find(|&i| d[i] != pattern_byte(seq, i)) {
        return Err(format!("frame {seq}: byte {i} is {:#04x}, want {:#04x}", d[i], pattern_byte(seq, i)));
    }
    Ok(())
}

/// The frame length for ports with these MTUs.
pub fn frame_len_for(mtu: u16) -> usize {
    DEFAULT_FRAME_LEN.min(usize::from(mtu) + 14).max(64)
}

/// Tracks progress and fails after [`STALL_TIMEOUT`] without any.
struct Stall {
    last: Instant,
    last_mark: (u64, u64),
    iter: u32,
}

impl Stall {
    fn new() -> Stall {
        Stall { last: Instant::now(), last_mark: (0, 0), iter: 0 }
    }
    fn check(&mut self, mark: (u64, u64), what: impl FnOnce() -> String) -> Result<(), PortError> {
        self.iter = self.iter.wrapping_add(1);
        if self.iter & 255 != 0 {
            return Ok(());
        }
        if mark != self.last_mark {
            self.last_mark = mark;
            self.last = Instant::now();
        } else if self.last.elapsed() > STALL_TIMEOUT {
            return Err(PortError::Timeout(what()));
        } else {
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// Sends `frames` test frames from `a` to `b` and verifies them all, in one thread.
pub fn run_pair<A: Port, B: Port>(
    a: &mut A,
    a_name: &str,
    b: &mut B,
    b_name: &str,
    frames: u64,
    frame_len: usize,
) -> Result<PortTestReport, PortError> {
    let (dst, src) = (b.mac(), a.mac());
    let mut pending: ArrayVec<A::Buf, BURST> = ArrayVec::new();
    let mut rx: ArrayVec<B::Buf, BURST> = ArrayVec::new();
    let (mut built, mut received, mut errors, mut bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut first_error = None;
    let mut stall = Stall::new();
    let start = Instant::now();
    while received < frames {
        while built < frames && !pending.is_full() {
            let Some(mut buf) = a.alloc() else { break };
            if !build_frame(&mut buf, dst, src, built, frame_len) {
                return Err(PortError::Verify(format!("frame of {frame_len} B does not fit a {a_name} buffer")));
            }
            pending.push(buf);
            built += 1;
        }
        a.tx_burst(&mut pending);
        b.rx_burst(&mut rx);
        for buf in rx.drain(..) {
            if let Err(e) = check_frame(buf.data(), Some(src), received, frame_len) {
                errors += 1;
                first_error.get_or_insert(e);
            }
            bytes += buf.len() as u64;
            received += 1;
        }
        let sent = built - pending.len() as u64;
        stall.check((sent, received), || format!("{a_name} -> {b_name}: sent {sent}, received {received} of {frames}"))?;
    }
    let report = PortTestReport {
        tx_port: a_name.into(),
        rx_port: b_name.into(),
        frames: received,
        bytes,
        errors,
        frame_len,
        elapsed: start.elapsed(),
    };
    match first_error {
        Some(e) => Err(PortError::Verify(format!("{errors} bad frames, first: {e}; {report}"))),
        None => Ok(report),
    }
}

/// Sends `frames` test frames to `dst` (no verification on this side).
pub fn send<P: Port>(p: &mut P, name: &str, dst: MacAddr, frames: u64, frame_len: usize) -> Result<PortTestReport, PortError> {
    let src = p.mac();
    let mut pending: ArrayVec<P::Buf, BURST> = ArrayVec::new();
    let (mut built, mut bytes) = (0u64, 0u64);
    let mut stall = Stall::new();
    let start = Instant::now();
    while built < frames || !pending.is_empty() {
        while built < frames && !pending.is_full() {
            let Some(mut buf) = p.alloc() else { break };
            if !build_frame(&mut buf, dst, src, built, frame_len) {
                return Err(PortError::Verify(format!("frame of {frame_len} B does not fit a {name} buffer")));
            }
            pending.push(buf);
            built += 1;
            bytes += frame_len as u64;
        }
        p.tx_burst(&mut pending);
        let sent = built - pending.len() as u64;
        stall.check((sent, 0), || format!("{name}: sent {sent} of {frames}"))?;
    }
    Ok(PortTestReport { tx_port: name.into(), rx_port: "peer".into(), frames, bytes, errors: 0, frame_len, elapsed: start.elapsed() })
}

/// Receives and verifies `frames` test frames (any source MAC; frames of other ethertypes
/// are ignored, as a kernel interface may inject its own traffic).
pub fn receive<P: Port>(p: &mut P, name: &str, frames: u64, frame_len: usize) -> Result<PortTestReport, PortError> {
    let mut rx: ArrayVec<P::Buf, BURST> = ArrayVec::new();
    let (mut received, mut errors, mut bytes) = (0u64, 0u64, 0u64);
    let mut first_error = None;
    let mut stall = Stall::new();
    let mut start = None;
    while received < frames {
        p.rx_burst(&mut rx);
        for buf in rx.drain(..) {
            let d = buf.data();
            if d.len() < 14 || d[12..14] != ETHERTYPE.to_be_bytes() {
                continue;
            }
            start.get_or_insert_with(Instant::now);
            if let Err(e) = check_frame(d, None, received, frame_len) {
                errors += 1;
                first_error.get_or_insert(e);
            }
            bytes += d.len() as u64;
            received += 1;
        }
        stall.check((received, 0), || format!("{name}: received {received} of {frames}"))?;
    }
    let report = PortTestReport {
        tx_port: "peer".into(),
        rx_port: name.into(),
        frames: received,
        bytes,
        errors,
        frame_len,
        elapsed: start.map(|s| s.elapsed()).unwrap_or_default(),
    };
    match first_error {
        Some(e) => Err(PortError::Verify(format!("{errors} bad frames, first: {e}; {report}"))),
        None => Ok(report),
    }
}

/// Waits until the port reports link up (memif/af_packet need a moment).
pub fn wait_link_up(p: &EthPort, timeout: Duration) -> Result<(), PortError> {
    let start = Instant::now();
    while !p.link().up {
        if start.elapsed() > timeout {
            return Err(PortError::Timeout(format!("link of {} still down after {:?}", p.name(), timeout)));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The DPDK port test: EAL from `cfg`, all ports opened, `frames` frames from the first
/// port to its ring-pair peer (or to the second port), every byte and the order checked.
pub fn run(cfg: &Config, frames: u64) -> Result<PortTestReport, PortError> {
    if cfg.ports.len() < 2 {
        return Err(ConfigError::invalid("ports", "port-test needs two ports in one process (use a ring_pair, or run_sender/run_receiver across processes)").into());
    }
    let eal = Eal::init(&EalConfig::from_config(cfg))?;
    let mut ports = open_ports(cfg, &eal)?;
    let j = match (cfg.ports[0].kind(), cfg.ports[0].peer.as_deref()) {
        (PortKind::RingPair, Some(peer)) => cfg.port(peer).map(|(j, _)| j).unwrap_or(1),
        _ => 1,
    };
    let mut b = ports.remove(j);
    let mut a = ports.remove(0);
    wait_link_up(&a, Duration::from_secs(10))?;
    wait_link_up(&b, Duration::from_secs(10))?;
    let frame_len = frame_len_for(a.mtu().min(b.mtu()));
    let (an, bn) = (a.name().to_string(), b.name().to_string());
    let report = run_pair(&mut a, &an, &mut b, &bn, frames, frame_len);
    drop((a, b, ports));
    drop(eal);
    report
}

fn first_port(cfg: &Config) -> Result<(Eal, EthPort), PortError> {
    let eal = Eal::init(&EalConfig::from_config(cfg))?;
    let mut ports = open_ports(cfg, &eal)?;
    if ports.is_empty() {
        return Err(ConfigError::invalid("ports", "no ports configured").into());
    }
    let p = ports.remove(0);
    wait_link_up(&p, Duration::from_secs(10))?;
    Ok((eal, p))
}

/// Sender half of a two-process port test: sends `frames` frames from the config's first
/// port to `dst` (default: the first `[[neighbors]]` MAC, else broadcast).
pub fn run_sender(cfg: &Config, frames: u64, dst: Option<MacAddr>) -> Result<PortTestReport, PortError> {
    let (eal, mut p) = first_port(cfg)?;
    let dst = dst.or_else(|| cfg.neighbors.first().map(|n| n.mac)).unwrap_or(MacAddr::BROADCAST);
    let name = p.name().to_string();
    let frame_len = frame_len_for(p.mtu());
    let r = send(&mut p, &name, dst, frames, frame_len);
    drop(p);
    drop(eal);
    r
}

/// Receiver half of a two-process port test: receives and verifies `frames` frames on the
/// config's first port. The sender's MTU must match.
pub fn run_receiver(cfg: &Config, frames: u64) -> Result<PortTestReport, PortError> {
    let (eal, mut p) = first_port(cfg)?;
    let name = p.name().to_string();
    let frame_len = frame_len_for(p.mtu());
    let r = receive(&mut p, &name, frames, frame_len);
    drop(p);
    drop(eal);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FaultyPort, Faults, SimPort};

    #[test]
    fn sim_pair_moves_and_checks_every_byte() {
        let (mut a, mut b) = SimPort::pair(1500, 256);
        let r = run_pair(&mut a, "a", &mut b, "b", 5000, 1024).unwrap();
        assert_eq!(r.frames, 5000);
        assert_eq!(r.bytes, 5000 * 1024);
        assert_eq!(r.errors, 0);
        assert!(r.to_string().contains("frames/s"));
        assert!(!r.to_string().contains('\n'));
    }

    #[test]
    fn corruption_is_detected() {
        let (a, b) = SimPort::pair(1500, 256);
        let mut a = a;
        let mut b = FaultyPort::new(b, Faults { corrupt: 0.01, seed: 3, ..Faults::default() });
        let e = run_pair(&mut a, "a", &mut b, "b", 2000, 1024).unwrap_err();
        assert!(matches!(e, PortError::Verify(_)), "{e}");
        assert!(b.stats().corrupted > 0);
    }

    #[test]
    fn reorder_is_detected() {
        let (mut a, b) = SimPort::pair(1500, 256);
        let mut b = FaultyPort::new(b, Faults { reorder: 0.05, seed: 9, ..Faults::default() });
        let e = run_pair(&mut a, "a", &mut b, "b", 2000, 256).unwrap_err();
        assert!(e.to_string().contains("sequence number"), "{e}");
    }

    #[test]
    fn check_frame_reports_the_byte() {
        let mut buf = crate::SimBuf::with_capacity(2048, 64);
        assert!(build_frame(&mut buf, MacAddr::BROADCAST, MacAddr([2, 0, 0, 0, 0, 1]), 7, 100));
        assert!(check_frame(buf.data(), None, 7, 100).is_ok());
        buf.data_mut()[50] ^= 1;
        let e = check_frame(buf.data(), None, 7, 100).unwrap_err();
        assert!(e.contains("byte 50"), "{e}");
        assert!(check_frame(buf.data(), None, 7, 99).unwrap_err().contains("length"));
    }
}
