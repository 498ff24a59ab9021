//! `pmrxe wire sample`: one frame of every opcode (RC, UC, UD) over IPv4 and IPv6, with
//! randomised field values and valid ICRCs.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::opcode::{ExtSet, MsgPos, ALL};
use crate::{
    build_frame_vec, udp_sport, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr,
    L3Info, MacAddr, Msn, NakCode, Opcode, PcapWriter, Psn, Qpn, RethRepr, Syndrome,
    TransportHeaders,
};

/// What one sample frame was built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleSpec {
    /// Addressing.
    pub l3: L3Info,
    /// Headers (`bth.pad` already matches the payload).
    pub headers: TransportHeaders,
    /// Payload.
    pub payload: Vec<u8>,
}

fn rand_syndrome(rng: &mut SmallRng) -> Syndrome {
    match rng.gen_range(0..3) {
        0 => Syndrome::Ack { credits: rng.gen_range(0..32) },
        1 => Syndrome::RnrNak { timer: rng.gen_range(0..32) },
        _ => Syndrome::Nak(match rng.gen_range(0..5) {
            0 => NakCode::PsnSeqErr,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccess,
            3 => NakCode::RemoteOpErr,
            _ => NakCode::InvalidRdRequest,
        }),
    }
}

fn rand_mac(rng: &mut SmallRng) -> MacAddr {
    let mut m: [u8; 6] = rng.gen();
    m[0] = (m[0] & 0xFC) | 0x02; // unicast, locally administered
    MacAddr(m)
}

/// Headers and payload for `op` with random field values.
pub fn random_headers(rng: &mut SmallRng, op: Opcode) -> (TransportHeaders, Vec<u8>) {
    let info = op.info().expect("known opcode");
    let payload_len = if !info.has_payload() {
        0
    } else {
        match info.pos {
            MsgPos::First | MsgPos::Middle => 4 * rng.gen_range(1..=64),
            MsgPos::Last => rng.gen_range(1..=256),
            MsgPos::Only => rng.gen_range(0..=256),
        }
    };
    let payload: Vec<u8> = (0..payload_len).map(|_| rng.gen()).collect();
    let mut bth = BthRepr::new(op, Qpn::new(rng.gen()), Psn::new(rng.gen()));
    bth.solicited = info.is_end() && rng.gen();
    bth.migreq = rng.gen();
    bth.pkey = if rng.gen() { 0xFFFF } else { rng.gen::<u16>() | 0x8000 };
    bth.fecn = rng.gen();
    bth.becn = rng.gen();
    bth.ack_req = info.is_request() && rng.gen();
    bth.pad = crate::pad_for(payload_len);
    let mut h = TransportHeaders::new(bth);
    let e = info.ext;
    if e.contains(ExtSet::DETH) {
        h.deth = Some(DethRepr { qkey: rng.gen(), src_qp: Qpn::new(rng.gen()) });
    }
    if e.contains(ExtSet::RETH) {
        h.reth = Some(RethRepr { va: rng.gen(), rkey: rng.gen(), len: rng.gen_range(0..1 << 20) });
    }
    if e.contains(ExtSet::ATOMIC_ETH) {
        h.atomic_eth = Some(AtomicEthRepr {
            va: rng.gen::<u64>() & !7,
            rkey: rng.gen(),
            swap_add: rng.gen(),
            compare: rng.gen(),
        });
    }
    if e.contains(ExtSet::AETH) {
        let syndrome = if info.kind == crate::OpKind::Ack {
            rand_syndrome(rng)
        } else {
            Syndrome::Ack { credits: rng.gen_range(0..32) }
        };
        h.aeth = Some(AethRepr { syndrome, msn: Msn::new(rng.gen()) });
    }
    if e.contains(ExtSet::ATOMIC_ACK) {
        h.atomic_ack = Some(AtomicAckEthRepr { orig: rng.gen() });
    }
    if e.contains(ExtSet::IMMDT) {
        h.imm = Some(rng.gen());
    }
    if e.contains(ExtSet::IETH) {
        h.ieth = Some(rng.gen());
    }
    (h, payload)
}

/// Random addressing for IPv4 (`ipv6 == false`) or IPv6.
pub fn random_l3(rng: &mut SmallRng, ipv6: bool, src_qpn: Qpn, dst_qpn: Qpn) -> L3Info {
    let (src_ip, dst_ip) = if ipv6 {
        let mut a = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        rng.fill(&mut a[8..]);
        let mut b = a;
        rng.fill(&mut b[8..]);
        (IpAddr::V6(Ipv6Addr::from(a)), IpAddr::V6(Ipv6Addr::from(b)))
    } else {
        (
            IpAddr::V4(Ipv4Addr::new(198, 18, rng.gen(), rng.gen_range(1..255))),
            IpAddr::V4(Ipv4Addr::new(198, 18, rng.gen(), rng.gen_range(1..255))),
        )
    };
    let flow_label = if ipv6 && rng.gen() { rng.gen_range(1..1 << 20) } else { 0 };
    L3Info {
        src_mac: rand_mac(rng),
        dst_mac: rand_mac(rng),
        src_ip,
        dst_ip,
        tclass: rng.gen(),
        ttl: rng.gen_range(1..=255),
        flow_label,
        udp_sport: udp_sport(flow_label, src_qpn.value(), dst_qpn.value()),
        ip_id: rng.gen(),
    }
}

/// The specs behind [`sample_frames`]: every opcode over IPv4, then every opcode over IPv6.
pub fn sample_specs(seed: u64) -> Vec<SampleSpec> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(2 * ALL.len());
    for ipv6 in [false, true] {
        for &op in ALL {
            let (headers, payload) = random_headers(&mut rng, op);
            let src_qpn = Qpn::new(rng.gen());
            let l3 = random_l3(&mut rng, ipv6, src_qpn, headers.bth.dest_qp);
            out.push(SampleSpec { l3, headers, payload });
        }
    }
    out
}

/// One frame of every opcode over IPv4 and IPv6 (deterministic for a seed).
pub fn sample_frames(seed: u64) -> Vec<Vec<u8>> {
    sample_specs(seed)
        .iter()
        .map(|s| build_frame_vec(&s.l3, &s.headers, &s.payload).expect("sample frame builds"))
        .collect()
}

/// Write [`sample_frames`] to a pcap file (microsecond timestamps); returns the number of
/// frames written.
pub fn write_sample(path: &Path, seed: u64) -> io::Result<usize> {
    let frames = sample_frames(seed);
    let f = io::BufWriter::new(std::fs::File::create(path)?);
    let mut w = PcapWriter::new(f, false)?;
    for (i, fr) in frames.iter().enumerate() {
        w.write_frame(Duration::new(1_700_000_000 + i as u64, 0), fr)?;
    }
    w.flush()?;
    Ok(frames.len())
}
