//! The General Services Interface datagram on RoCEv2 (IBTA Annex A17): a CM MAD travels as a
//! UD SEND_ONLY from QP1 to QP1, DETH Q_Key 0x80010000, 256-byte payload, over UDP 4791 with
//! an ICRC, built and parsed with `pmrxe_wire`'s frame functions.

use pmrxe_wire::{
    build_frame, frame_len, parse_frame, BthRepr, DethRepr, MacAddr, Opcode, Psn, Qpn, TransportHeaders,
};

use crate::mad::MAD_LEN;
use crate::msg::Mad;
use crate::types::{Gid, GsiPath, MadSource};
use crate::{Error, Result};

/// The well-known GSI Q_Key (IBTA 10.2.4; the kernel's `IB_QP1_QKEY`).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// Transport headers of a GSI datagram (BTH + DETH).
pub fn gsi_headers(path: &GsiPath, psn: Psn) -> TransportHeaders {
    let mut bth = BthRepr::new(Opcode::UD_SEND_ONLY, path.dest_qp, psn);
    bth.pkey = path.pkey;
    let mut h = TransportHeaders::new(bth);
    h.deth = Some(DethRepr { qkey: GSI_QKEY, src_qp: Qpn::GSI });
    h
}

/// Length of a GSI frame over IPv4 or IPv6.
pub const fn mad_frame_len(ipv6: bool) -> usize {
    frame_len(ipv6, pmrxe_wire::bth::HEADER_LEN + pmrxe_wire::deth::HEADER_LEN, MAD_LEN)
}

/// Build a complete RoCEv2 frame carrying `mad` on `path` into `buf`; returns its length.
/// `psn` is the sending QP1's PSN (any value; the receiver's GSI does not check it).
pub fn build_mad_frame_into(buf: &mut [u8], path: &GsiPath, src_mac: MacAddr, dst_mac: MacAddr, psn: Psn, mad: &Mad) -> Result<usize> {
    Ok(build_frame(buf, &path.l3(src_mac, dst_mac), &gsi_headers(path, psn), mad)?)
}

/// [`build_mad_frame_into`] into a new `Vec`.
pub fn build_mad_frame(path: &GsiPath, src_mac: MacAddr, dst_mac: MacAddr, psn: Psn, mad: &Mad) -> Result<Vec<u8>> {
    let l3 = path.l3(src_mac, dst_mac);
    let mut v = vec![0u8; mad_frame_len(l3.is_ipv6()?)];
    let n = build_mad_frame_into(&mut v, path, src_mac, dst_mac, psn, mad)?;
    v.truncate(n);
    Ok(v)
}

/// Parse a RoCEv2 frame (ICRC verified) that should carry a MAD for QP1: returns where it came
/// from and the MAD bytes (not yet parsed: see [`parse_mad`](crate::msg::parse_mad)).
/// `NotGsi` if it is not a UD SEND_ONLY to QP1 with the GSI Q_Key.
pub fn parse_mad_frame(frame: &[u8]) -> Result<(MadSource, &[u8])> {
    let f = parse_frame(frame)?;
    let h = &f.headers;
    let deth = h.deth.ok_or(Error::NotGsi)?;
    if h.bth.opcode != Opcode::UD_SEND_ONLY || h.bth.dest_qp != Qpn::GSI || deth.qkey != GSI_QKEY {
        return Err(Error::NotGsi);
    }
    let src = MadSource {
        sgid: Gid::from_ip(f.src_ip),
        dgid: Gid::from_ip(f.dst_ip),
        src_qp: deth.src_qp,
        pkey: h.bth.pkey,
        traffic_class: f.tclass,
        hop_limit: f.ttl,
    };
    Ok((src, f.payload))
}

#[cfg(test)]
mod test {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn frame_roundtrip_ipv4_ipv6() {
        for (a, b) in [("10.0.0.1", "10.0.0.2"), ("fd00::1", "fd00::2")] {
            let path = GsiPath {
                sgid: Gid::from_ip(a.parse::<IpAddr>().unwrap()),
                dgid: Gid::from_ip(b.parse::<IpAddr>().unwrap()),
                dest_qp: Qpn::GSI,
                pkey: 0xFFFF,
                traffic_class: 0,
                hop_limit: 64,
                flow_label: 0,
            };
            let mut mad = [0u8; MAD_LEN];
            mad[0] = 1;
            mad[255] = 0x5A;
            let fr = build_mad_frame(&path, MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]), Psn::new(7), &mad).unwrap();
            assert_eq!(fr.len(), mad_frame_len(a.contains(':')));
            let (src, m) = parse_mad_frame(&fr).unwrap();
            assert_eq!(m, &mad[..]);
            assert_eq!(src.sgid, path.sgid);
            assert_eq!(src.dgid, path.dgid);
            assert_eq!(src.src_qp, Qpn::GSI);
            assert_eq!(src.reply_path().dgid, path.sgid);
            let mut bad = fr.clone();
            let n = bad.len();
            bad[n - 10] ^= 1;
            assert!(matches!(parse_mad_frame(&bad), Err(Error::Frame(pmrxe_wire::Error::BadIcrc))));
        }
    }
}
