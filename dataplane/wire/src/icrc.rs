//! RoCEv2 invariant CRC (SEMANTICS.md §5.7).
//!
//! CRC-32 (zlib/Ethernet: reflected 0xEDB88320, init and final XOR 0xFFFFFFFF) over, in order:
//! 8 bytes of 0xFF (the masked LRH), the IP header with its variant fields set to ones
//! (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop limit), the UDP
//! header with its checksum set to 0xFFFF, the BTH with byte 4 (FECN, BECN, resv6) set to
//! 0xFF, then the rest of the datagram up to (not including) the ICRC. Stored little-endian.
//!
//! Only the masked copies of the first bytes are made (on the stack); the payload is hashed
//! in place.

use crate::{bth, ipv4, udp};

/// ICRC length.
pub const ICRC_LEN: usize = 4;

/// Longest IPv4 header (IHL 15).
const IPV4_MAX_HDR: usize = 60;

/// Compute the ICRC.
///
/// `ip_header` is the whole IP header (IPv4 with options, or the 40-byte IPv6 header; the
/// version nibble decides). `udp_datagram` is the UDP header and payload **without** the
/// trailing 4 ICRC bytes. Never panics: headers shorter than expected are hashed as given
/// (a caller that validated lengths never passes those).
pub fn icrc(ip_header: &[u8], udp_datagram: &[u8]) -> u32 {
    // One stack buffer holds the masked IP header, UDP header and BTH, so the CRC sees
    // two updates (masked prefix, then the payload in place): small updates are the
    // expensive part for short packets.
    const HEAD: usize = udp::HEADER_LEN + bth::HEADER_LEN;
    let mut buf = [0u8; IPV4_MAX_HDR + HEAD];
    let mut h = crc32fast::Hasher::new_with_initial(CRC_OF_8_FF);

    let n = ip_header.len().min(IPV4_MAX_HDR);
    buf[..n].copy_from_slice(&ip_header[..n]);
    if n > 0 && buf[0] >> 4 == 6 {
        if n >= 8 {
            buf[0] |= 0x0F; // low nibble of byte 0 is the top of the traffic class
            buf[1] = 0xFF;
            buf[2] = 0xFF;
            buf[3] = 0xFF;
            buf[7] = 0xFF; // hop limit
        }
    } else {
        for &o in &ipv4::ICRC_MASKED {
            if o < n {
                buf[o] = 0xFF;
            }
        }
    }
    if n < ip_header.len() {
        // Longer than any valid IPv4 header: hash as given (only reachable with garbage).
        h.update(&buf[..n]);
        h.update(&ip_header[n..]);
        return finish_udp(h, udp_datagram);
    }

    let m = udp_datagram.len().min(HEAD);
    buf[n..n + m].copy_from_slice(&udp_datagram[..m]);
    for o in [udp::CHECKSUM_OFFSET, udp::CHECKSUM_OFFSET + 1, udp::HEADER_LEN + bth::FECN_BECN_OFFSET] {
        if o < m {
            buf[n + o] = 0xFF;
        }
    }
    h.update(&buf[..n + m]);
    h.update(&udp_datagram[m..]);
    h.finalize()
}

/// CRC-32 of 8 bytes of 0xFF (the masked LRH); `!` of rxe's seed 0xDEBB20E3.
const CRC_OF_8_FF: u32 = !0xDEBB_20E3;

#[cold]
fn finish_udp(mut h: crc32fast::Hasher, udp_datagram: &[u8]) -> u32 {
    const HEAD: usize = udp::HEADER_LEN + bth::HEADER_LEN;
    let mut head = [0u8; HEAD];
    let m = udp_datagram.len().min(HEAD);
    head[..m].copy_from_slice(&udp_datagram[..m]);
    for o in [udp::CHECKSUM_OFFSET, udp::CHECKSUM_OFFSET + 1, udp::HEADER_LEN + bth::FECN_BECN_OFFSET] {
        if o < m {
            head[o] = 0xFF;
        }
    }
    h.update(&head[..m]);
    h.update(&udp_datagram[m..]);
    h.finalize()
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn seed_matches_rxe_constant() {
        // rxe seeds its CRC with 0xDEBB20E3 = the raw state after 8 x 0xFF.
        assert_eq!(!crc32fast::hash(&[0xFF; 8]), 0xDEBB20E3);
        assert_eq!(crc32fast::hash(&[0xFF; 8]), CRC_OF_8_FF);
    }

    #[test]
    fn f1_scapy_uc_send_only_vector() {
        // Independent vector from icrc_check.py's selftest (scapy's UC SEND_ONLY example):
        // ICRC bytes 78 f3 53 f3.
        let pl: &[u8] = b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00";
        let mut ib = vec![0x24, 0x40 | (2 << 4), 0xFF, 0xFF, 0, 0, 0, 211, 0];
        ib.extend_from_slice(&13571856u32.to_be_bytes()[1..]);
        ib.extend_from_slice(pl);
        let udp_len = (8 + ib.len() + 4) as u16;
        let mut udp = vec![0xC0, 0x00, 0x12, 0xB7];
        udp.extend_from_slice(&udp_len.to_be_bytes());
        udp.extend_from_slice(&[0, 0]);
        udp.extend_from_slice(&ib);
        let tl = (20 + udp_len).to_be_bytes();
        let ip = [
            0x45, 1, tl[0], tl[1], 0x04, 0x78, 0x40, 0, 64, 17, 0, 0, 192, 168, 0, 7, 192, 168, 0, 7,
        ];
        assert_eq!(icrc(&ip, &udp).to_le_bytes(), [0x78, 0xf3, 0x53, 0xf3]);
    }
}
