//! REQ, ConnectRequest (attribute 0x0010; IBTA vol.1 12.6.5, the kernel's "Table 106"):
//! 232 bytes of CM data, 92 of them private data.

use pmrxe_wire::{Psn, Qpn};

use crate::bits::{cm_packet, get_bits, rd16, rd24, rd32, rd64, rd_gid, set_bits, wr16, wr24, wr32, wr64, wr_private, Bits};
use crate::Result;

/// Private-data bytes of a REQ.
pub const PRIVATE_DATA_LEN: usize = 92;
/// Bytes of CM data a REQ uses (all of them).
pub const LEN: usize = 232;
/// The permissive LID, which the kernel puts in both LID fields of a routed (RoCEv2) path.
pub const LID_PERMISSIVE: u16 = 0xFFFF;

mod field {
    use crate::bits::{Bits, Field};
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const VENDOR_ID: Field = 5..8;
    pub const SERVICE_ID: Field = 8..16;
    pub const LOCAL_CA_GUID: Field = 16..24;
    pub const LOCAL_QKEY: Field = 28..32;
    pub const LOCAL_QPN: Field = 32..35;
    pub const RESPONDER_RESOURCES: usize = 35;
    pub const LOCAL_EECN: Field = 36..39;
    pub const INITIATOR_DEPTH: usize = 39;
    pub const REMOTE_EECN: Field = 40..43;
    pub const REMOTE_CM_RESPONSE_TIMEOUT: Bits = Bits::new(43, 0, 5);
    pub const TRANSPORT_SERVICE_TYPE: Bits = Bits::new(43, 5, 2);
    pub const FLOW_CONTROL: Bits = Bits::new(43, 7, 1);
    pub const STARTING_PSN: Field = 44..47;
    pub const LOCAL_CM_RESPONSE_TIMEOUT: Bits = Bits::new(47, 0, 5);
    pub const RETRY_COUNT: Bits = Bits::new(47, 5, 3);
    pub const PKEY: Field = 48..50;
    pub const PATH_MTU: Bits = Bits::new(50, 0, 4);
    pub const RDC_EXISTS: Bits = Bits::new(50, 4, 1);
    pub const RNR_RETRY_COUNT: Bits = Bits::new(50, 5, 3);
    pub const MAX_CM_RETRIES: Bits = Bits::new(51, 0, 4);
    pub const SRQ: Bits = Bits::new(51, 4, 1);
    pub const EXTENDED_TRANSPORT_TYPE: Bits = Bits::new(51, 5, 3);
    /// Primary path information block (44 bytes).
    pub const PRIMARY_PATH: usize = 52;
    /// Alternate path information block (44 bytes).
    pub const ALTERNATE_PATH: usize = 96;
    pub const PRIVATE_DATA: Field = 140..232;

    /// Offsets inside a 44-byte path block.
    pub mod path {
        pub const LOCAL_LID: usize = 0;
        pub const REMOTE_LID: usize = 2;
        pub const LOCAL_GID: usize = 4;
        pub const REMOTE_GID: usize = 20;
        /// Flow label: the top 20 bits of the 32-bit word here; packet rate: low 6 bits of
        /// its last byte.
        pub const FLOW_WORD: usize = 36;
        pub const PACKET_RATE_BYTE: usize = 39;
        pub const TRAFFIC_CLASS: usize = 40;
        pub const HOP_LIMIT: usize = 41;
        /// SL (4 bits) | SubnetLocal (1) | reserved (3).
        pub const SL_BYTE: usize = 42;
        /// LocalAckTimeout (5) | reserved (3).
        pub const ACK_TIMEOUT_BYTE: usize = 43;
        pub const LEN: usize = 44;
    }
}

/// One path information block of a REQ (primary or alternate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRepr {
    /// Local port LID (0xFFFF = permissive on a routed RoCEv2 path).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (RoCEv2 over IPv4: IPv4-mapped `::ffff:a.b.c.d`).
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, IBTA rate code).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local (the kernel sets it iff hop limit <= 1).
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits) the passive side uses for its QP's `timeout`.
    pub local_ack_timeout: u8,
}

impl PathRepr {
    fn parse(b: &[u8]) -> PathRepr {
        use field::path as f;
        let w = rd32(b, f::FLOW_WORD..f::FLOW_WORD + 4);
        PathRepr {
            local_lid: rd16(b, f::LOCAL_LID..f::LOCAL_LID + 2),
            remote_lid: rd16(b, f::REMOTE_LID..f::REMOTE_LID + 2),
            local_gid: rd_gid(b, f::LOCAL_GID..f::LOCAL_GID + 16),
            remote_gid: rd_gid(b, f::REMOTE_GID..f::REMOTE_GID + 16),
            flow_label: w >> 12,
            packet_rate: get_bits(b, Bits::new(f::PACKET_RATE_BYTE, 2, 6)),
            traffic_class: b[f::TRAFFIC_CLASS],
            hop_limit: b[f::HOP_LIMIT],
            sl: get_bits(b, Bits::new(f::SL_BYTE, 0, 4)),
            subnet_local: get_bits(b, Bits::new(f::SL_BYTE, 4, 1)) != 0,
            local_ack_timeout: get_bits(b, Bits::new(f::ACK_TIMEOUT_BYTE, 0, 5)),
        }
    }
    fn emit(&self, b: &mut [u8]) {
        use field::path as f;
        b[..f::LEN].fill(0);
        wr16(b, f::LOCAL_LID..f::LOCAL_LID + 2, self.local_lid);
        wr16(b, f::REMOTE_LID..f::REMOTE_LID + 2, self.remote_lid);
        b[f::LOCAL_GID..f::LOCAL_GID + 16].copy_from_slice(&self.local_gid);
        b[f::REMOTE_GID..f::REMOTE_GID + 16].copy_from_slice(&self.remote_gid);
        wr32(b, f::FLOW_WORD..f::FLOW_WORD + 4, (self.flow_label & 0xF_FFFF) << 12);
        set_bits(b, Bits::new(f::PACKET_RATE_BYTE, 2, 6), self.packet_rate);
        b[f::TRAFFIC_CLASS] = self.traffic_class;
        b[f::HOP_LIMIT] = self.hop_limit;
        set_bits(b, Bits::new(f::SL_BYTE, 0, 4), self.sl);
        set_bits(b, Bits::new(f::SL_BYTE, 4, 1), u8::from(self.subnet_local));
        set_bits(b, Bits::new(f::ACK_TIMEOUT_BYTE, 0, 5), self.local_ack_timeout);
    }
    fn is_empty(b: &[u8]) -> bool {
        b[..field::path::LEN].iter().all(|&x| x == 0)
    }
}

cm_packet!(LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Local communication ID.
    pub fn local_comm_id(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::LOCAL_COMM_ID)
    }
    /// ECE vendor ID (24 bits in the reserved word after the local comm ID).
    pub fn vendor_id(&self) -> u32 {
        rd24(self.buffer.as_ref(), field::VENDOR_ID)
    }
    /// Service ID.
    pub fn service_id(&self) -> u64 {
        rd64(self.buffer.as_ref(), field::SERVICE_ID)
    }
    /// Local CA GUID.
    pub fn local_ca_guid(&self) -> u64 {
        rd64(self.buffer.as_ref(), field::LOCAL_CA_GUID)
    }
    /// Local QPN.
    pub fn local_qpn(&self) -> Qpn {
        Qpn::new(rd24(self.buffer.as_ref(), field::LOCAL_QPN))
    }
    /// Starting PSN.
    pub fn starting_psn(&self) -> Psn {
        Psn::new(rd24(self.buffer.as_ref(), field::STARTING_PSN))
    }
    /// The private data (always 92 bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA]
    }
}

/// Parsed REQ.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// ECE vendor ID (24 bits).
    pub vendor_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Sender's CA (node) GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key (0 for RC/UC).
    pub local_qkey: u32,
    /// Sender's QPN.
    pub local_qpn: Qpn,
    /// Responder resources the sender offers (its max_dest_rd_atomic).
    pub responder_resources: u8,
    /// Local EECN (RD only; 0).
    pub local_eecn: u32,
    /// Initiator depth the sender wants (its max_rd_atomic).
    pub initiator_depth: u8,
    /// Remote EECN (RD only; 0).
    pub remote_eecn: u32,
    /// How long (IBA exponent) the passive side may take to answer this REQ.
    pub remote_cm_response_timeout: u8,
    /// Transport service type: 0 RC, 1 UC, 2 RD, 3 = see extended type (XRC).
    pub transport: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Sender's starting PSN (the passive QP's rq_psn).
    pub starting_psn: Psn,
    /// How long (IBA exponent) the sender may take to answer the REP.
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (IBTA code: 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; XRC = 1 with transport 3).
    pub extended_transport: u8,
    /// Primary path.
    pub primary: PathRepr,
    /// Alternate path, if the block is not all zeros.
    pub alternate: Option<PathRepr>,
    /// Private data (parse: all 92 bytes; emit: up to 92, zero-filled).
    pub private_data: Vec<u8>,
}

impl Repr {
    /// Parse (never panics after `new_checked`).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        let b = p.buffer.as_ref();
        let alt = &b[field::ALTERNATE_PATH..field::ALTERNATE_PATH + field::path::LEN];
        Ok(Repr {
            local_comm_id: p.local_comm_id(),
            vendor_id: p.vendor_id(),
            service_id: p.service_id(),
            local_ca_guid: p.local_ca_guid(),
            local_qkey: rd32(b, field::LOCAL_QKEY),
            local_qpn: p.local_qpn(),
            responder_resources: b[field::RESPONDER_RESOURCES],
            local_eecn: rd24(b, field::LOCAL_EECN),
            initiator_depth: b[field::INITIATOR_DEPTH],
            remote_eecn: rd24(b, field::REMOTE_EECN),
            remote_cm_response_timeout: get_bits(b, field::REMOTE_CM_RESPONSE_TIMEOUT),
            transport: get_bits(b, field::TRANSPORT_SERVICE_TYPE),
            flow_control: get_bits(b, field::FLOW_CONTROL) != 0,
            starting_psn: p.starting_psn(),
            local_cm_response_timeout: get_bits(b, field::LOCAL_CM_RESPONSE_TIMEOUT),
            retry_count: get_bits(b, field::RETRY_COUNT),
            pkey: rd16(b, field::PKEY),
            path_mtu: get_bits(b, field::PATH_MTU),
            rdc_exists: get_bits(b, field::RDC_EXISTS) != 0,
            rnr_retry_count: get_bits(b, field::RNR_RETRY_COUNT),
            max_cm_retries: get_bits(b, field::MAX_CM_RETRIES),
            srq: get_bits(b, field::SRQ) != 0,
            extended_transport: get_bits(b, field::EXTENDED_TRANSPORT_TYPE),
            primary: PathRepr::parse(&b[field::PRIMARY_PATH..]),
            alternate: if PathRepr::is_empty(alt) { None } else { Some(PathRepr::parse(alt)) },
            private_data: p.private_data().to_vec(),
        })
    }
    /// 232.
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
    /// Emit every byte of the message (reserved bytes zeroed). `Err(PrivateDataTooLong)`
    /// if the private data exceeds 92 bytes; values wider than their field are masked.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let b = &mut p.buffer.as_mut()[..LEN];
        wr_private(b, field::PRIVATE_DATA, &self.private_data)?;
        b[..field::PRIVATE_DATA.start].fill(0);
        wr32(b, field::LOCAL_COMM_ID, self.local_comm_id);
        wr24(b, field::VENDOR_ID, self.vendor_id & 0xFF_FFFF);
        wr64(b, field::SERVICE_ID, self.service_id);
        wr64(b, field::LOCAL_CA_GUID, self.local_ca_guid);
        wr32(b, field::LOCAL_QKEY, self.local_qkey);
        b[field::LOCAL_QPN].copy_from_slice(&self.local_qpn.to_be24());
        b[field::RESPONDER_RESOURCES] = self.responder_resources;
        wr24(b, field::LOCAL_EECN, self.local_eecn & 0xFF_FFFF);
        b[field::INITIATOR_DEPTH] = self.initiator_depth;
        wr24(b, field::REMOTE_EECN, self.remote_eecn & 0xFF_FFFF);
        set_bits(b, field::REMOTE_CM_RESPONSE_TIMEOUT, self.remote_cm_response_timeout);
        set_bits(b, field::TRANSPORT_SERVICE_TYPE, self.transport);
        set_bits(b, field::FLOW_CONTROL, u8::from(self.flow_control));
        b[field::STARTING_PSN].copy_from_slice(&self.starting_psn.to_be24());
        set_bits(b, field::LOCAL_CM_RESPONSE_TIMEOUT, self.local_cm_response_timeout);
        set_bits(b, field::RETRY_COUNT, self.retry_count);
        wr16(b, field::PKEY, self.pkey);
        set_bits(b, field::PATH_MTU, self.path_mtu);
        set_bits(b, field::RDC_EXISTS, u8::from(self.rdc_exists));
        set_bits(b, field::RNR_RETRY_COUNT, self.rnr_retry_count);
        set_bits(b, field::MAX_CM_RETRIES, self.max_cm_retries);
        set_bits(b, field::SRQ, u8::from(self.srq));
        set_bits(b, field::EXTENDED_TRANSPORT_TYPE, self.extended_transport);
        self.primary.emit(&mut b[field::PRIMARY_PATH..]);
        if let Some(a) = &self.alternate {
            a.emit(&mut b[field::ALTERNATE_PATH..]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    /// A REQ as the kernel CMA sends it for rping to 10.0.0.2:7174 from 10.0.0.1 (the cma
    /// header at the start of the private data is tested in `cma.rs`).
    fn sample() -> Repr {
        let gid = |d: u8| std::net::Ipv4Addr::new(10, 0, 0, d).to_ipv6_mapped().octets();
        Repr {
            local_comm_id: 0x1a2b_3c4d,
            vendor_id: 0x0002c9,
            service_id: 0x0000_0000_0106_1c06,
            local_ca_guid: 0x0202_03ff_fe04_0506,
            local_qpn: Qpn::new(0x000011),
            responder_resources: 1,
            initiator_depth: 1,
            remote_cm_response_timeout: 20,
            transport: 0,
            flow_control: true,
            starting_psn: Psn::new(0xabcdef),
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xFFFF,
            path_mtu: 3,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            primary: PathRepr {
                local_lid: LID_PERMISSIVE,
                remote_lid: LID_PERMISSIVE,
                local_gid: gid(1),
                remote_gid: gid(2),
                flow_label: 0x12345,
                packet_rate: 0x3f,
                traffic_class: 0x60,
                hop_limit: 64,
                sl: 3,
                subnet_local: false,
                local_ack_timeout: 18,
            },
            private_data: vec![0xAB; PRIVATE_DATA_LEN],
            ..Repr::default()
        }
    }

    #[test]
    fn test_emit_bytes_match_the_ibta_layout() {
        let mut b = [0xEEu8; LEN];
        sample().emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(&b[0..4], &[0x1a, 0x2b, 0x3c, 0x4d]);
        assert_eq!(&b[4..8], &[0, 0x00, 0x02, 0xc9]);
        assert_eq!(&b[8..16], &[0, 0, 0, 0, 0x01, 0x06, 0x1c, 0x06]);
        assert_eq!(&b[32..36], &[0, 0, 0x11, 1]); // QPN | responder resources
        assert_eq!(&b[36..40], &[0, 0, 0, 1]); // EECN | initiator depth
        assert_eq!(b[43], (20 << 3) | 1); // remote resp timeout | RC | flow control
        assert_eq!(&b[44..48], &[0xab, 0xcd, 0xef, (20 << 3) | 7]);
        assert_eq!(&b[48..52], &[0xff, 0xff, (3 << 4) | 7, 15 << 4]);
        assert_eq!(&b[52..56], &[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&b[56..72], &sample().primary.local_gid);
        assert_eq!(&b[88..92], &[0x12, 0x34, 0x50, 0x3f]);
        assert_eq!(&b[92..96], &[0x60, 64, 3 << 4, 18 << 3]);
        assert!(b[96..140].iter().all(|&x| x == 0), "no alternate path");
        assert!(b[140..].iter().all(|&x| x == 0xAB));
    }

    #[test]
    fn test_parse_roundtrip_and_truncated() {
        let mut b = [0u8; LEN];
        let r = sample();
        r.emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(), r);
        assert_eq!(Packet::new_checked(&b[..LEN - 1]).unwrap_err(), crate::Error::Truncated);
        let long = Repr { private_data: vec![0; PRIVATE_DATA_LEN + 1], ..r };
        assert_eq!(long.emit(&mut Packet::new_unchecked(&mut b[..])), Err(crate::Error::PrivateDataTooLong));
    }
}
