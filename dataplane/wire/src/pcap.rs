//! Classic pcap (libpcap 2.4) writer and reader, Ethernet link type. Used by capture, by
//! `pmrxe wire sample`, and by tests. Not on the fast path (the reader allocates).

use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

/// LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u32 = 1;
const MAGIC_US: u32 = 0xA1B2_C3D4;
const MAGIC_NS: u32 = 0xA1B2_3C4D;
const SNAPLEN: u32 = 262_144;

/// Writes a classic pcap stream.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    w: W,
    nanos: bool,
}

impl<W: Write> PcapWriter<W> {
    /// Write the global header. `nanos` selects nanosecond timestamps.
    pub fn new(mut w: W, nanos: bool) -> io::Result<PcapWriter<W>> {
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&(if nanos { MAGIC_NS } else { MAGIC_US }).to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone 0, sigfigs 0
        h[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        w.write_all(&h)?;
        Ok(PcapWriter { w, nanos })
    }
    /// Append one frame with timestamp `ts` (since the Unix epoch).
    pub fn write_frame(&mut self, ts: Duration, frame: &[u8]) -> io::Result<()> {
        self.write_frame_truncated(ts, frame, frame.len())
    }
    /// Append a frame captured with `frame.len()` bytes of an original `orig_len`.
    pub fn write_frame_truncated(&mut self, ts: Duration, frame: &[u8], orig_len: usize) -> io::Result<()> {
        let len = |n: usize| u32::try_from(n).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too long"));
        let sub = if self.nanos { ts.subsec_nanos() } else { ts.subsec_micros() };
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&(ts.as_secs() as u32).to_le_bytes());
        h[4..8].copy_from_slice(&sub.to_le_bytes());
        h[8..12].copy_from_slice(&len(frame.len())?.to_le_bytes());
        h[12..16].copy_from_slice(&len(orig_len)?.to_le_bytes());
        self.w.write_all(&h)?;
        self.w.write_all(frame)
    }
    /// Flush the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.w
    }
}

/// One record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcapRecord {
    /// Timestamp since the epoch.
    pub ts: Duration,
    /// Captured bytes.
    pub data: Vec<u8>,
    /// Original length on the wire.
    pub orig_len: u32,
}

/// Reads a classic pcap held in memory (either byte order, µs or ns).
#[derive(Debug)]
pub struct PcapReader<'a> {
    data: &'a [u8],
    off: usize,
    big: bool,
    nanos: bool,
    /// Link type from the global header.
    pub linktype: u32,
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

impl<'a> PcapReader<'a> {
    /// Parse the global header.
    pub fn new(data: &'a [u8]) -> io::Result<PcapReader<'a>> {
        if data.len() < 24 {
            return Err(bad("truncated pcap header"));
        }
        let m = [data[0], data[1], data[2], data[3]];
        let (big, nanos) = match (u32::from_le_bytes(m), u32::from_be_bytes(m)) {
            (MAGIC_US, _) => (false, false),
            (MAGIC_NS, _) => (false, true),
            (_, MAGIC_US) => (true, false),
            (_, MAGIC_NS) => (true, true),
            _ => return Err(bad("not a classic pcap file")),
        };
        let mut r = PcapReader { data, off: 24, big, nanos, linktype: 0 };
        r.linktype = r.u32_at(20) & 0x0FFF_FFFF;
        Ok(r)
    }
    fn u32_at(&self, o: usize) -> u32 {
        let b = [self.data[o], self.data[o + 1], self.data[o + 2], self.data[o + 3]];
        if self.big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }
}

impl Iterator for PcapReader<'_> {
    type Item = io::Result<PcapRecord>;
    fn next(&mut self) -> Option<io::Result<PcapRecord>> {
        if self.off == self.data.len() {
            return None;
        }
        if self.off + 16 > self.data.len() {
            self.off = self.data.len();
            return Some(Err(bad("truncated record header")));
        }
        let o = self.off;
        let (s, sub, cap, orig) = (self.u32_at(o), self.u32_at(o + 4), self.u32_at(o + 8), self.u32_at(o + 12));
        let start = o + 16;
        let end = start.saturating_add(cap as usize);
        if end > self.data.len() {
            self.off = self.data.len();
            return Some(Err(bad("truncated record")));
        }
        self.off = end;
        let ts = Duration::from_secs(u64::from(s))
            + if self.nanos { Duration::from_nanos(u64::from(sub)) } else { Duration::from_micros(u64::from(sub)) };
        Some(Ok(PcapRecord { ts, data: self.data[start..end].to_vec(), orig_len: orig }))
    }
}

/// Read every record of a classic pcap file.
pub fn read_pcap(path: &Path) -> io::Result<Vec<PcapRecord>> {
    let data = std::fs::read(path)?;
    PcapReader::new(&data)?.collect()
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn write_read_round_trip() {
        for nanos in [false, true] {
            let mut w = PcapWriter::new(Vec::new(), nanos).unwrap();
            w.write_frame(Duration::new(1_700_000_000, 123_456_000), &[1, 2, 3]).unwrap();
            w.write_frame(Duration::new(1_700_000_001, 0), &[4; 70]).unwrap();
            let v = w.into_inner();
            let r = PcapReader::new(&v).unwrap();
            assert_eq!(r.linktype, LINKTYPE_ETHERNET);
            let recs: Vec<_> = r.collect::<io::Result<_>>().unwrap();
            assert_eq!(recs.len(), 2);
            assert_eq!(recs[0].data, [1, 2, 3]);
            assert_eq!(recs[0].ts, Duration::new(1_700_000_000, 123_456_000));
            assert_eq!(recs[1].orig_len, 70);
            assert!(PcapReader::new(&v[..v.len() - 1]).unwrap().any(|r| r.is_err()));
        }
    }
}
