//! REP, Reply to request for communication (attribute 0x0013; IBTA 12.6.8): 196 bytes private
//! data. The ECE vendor ID is spread over the three reserved bytes after QPN, EECN and PSN.

use pmrxe_wire::{Psn, Qpn};

use crate::bits::{cm_packet, get_bits, rd24, rd32, rd64, set_bits, wr24, wr32, wr64, wr_private};
use crate::Result;

/// Private-data bytes of a REP.
pub const PRIVATE_DATA_LEN: usize = 196;
/// CM data bytes.
pub const LEN: usize = 232;

mod field {
    use crate::bits::{Bits, Field};
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const LOCAL_QKEY: Field = 8..12;
    pub const LOCAL_QPN: Field = 12..15;
    pub const VENDOR_ID_H: usize = 15;
    pub const LOCAL_EECN: Field = 16..19;
    pub const VENDOR_ID_M: usize = 19;
    pub const STARTING_PSN: Field = 20..23;
    pub const VENDOR_ID_L: usize = 23;
    pub const RESPONDER_RESOURCES: usize = 24;
    pub const INITIATOR_DEPTH: usize = 25;
    pub const TARGET_ACK_DELAY: Bits = Bits::new(26, 0, 5);
    pub const FAILOVER_ACCEPTED: Bits = Bits::new(26, 5, 2);
    pub const FLOW_CONTROL: Bits = Bits::new(26, 7, 1);
    pub const RNR_RETRY_COUNT: Bits = Bits::new(27, 0, 3);
    pub const SRQ: Bits = Bits::new(27, 3, 1);
    pub const LOCAL_CA_GUID: Field = 28..36;
    pub const PRIVATE_DATA: Field = 36..232;
}

cm_packet!(LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Sender's communication ID.
    pub fn local_comm_id(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::LOCAL_COMM_ID)
    }
    /// Receiver's communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::REMOTE_COMM_ID)
    }
    /// Sender's QPN.
    pub fn local_qpn(&self) -> Qpn {
        Qpn::new(rd24(self.buffer.as_ref(), field::LOCAL_QPN))
    }
}

/// Parsed REP.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID (the REQ's local comm ID).
    pub remote_comm_id: u32,
    /// Local Q_Key (0 for RC/UC).
    pub local_qkey: u32,
    /// Sender's QPN.
    pub local_qpn: Qpn,
    /// ECE vendor ID (24 bits).
    pub vendor_id: u32,
    /// Local EECN (RD/XRC target; 0).
    pub local_eecn: u32,
    /// Sender's starting PSN (the active QP's rq_psn).
    pub starting_psn: Psn,
    /// Responder resources the sender grants.
    pub responder_resources: u8,
    /// Initiator depth the sender uses.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count (3 bits) the active side's QP uses.
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl Repr {
    /// Parse.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        let b = p.buffer.as_ref();
        Ok(Repr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            local_qkey: rd32(b, field::LOCAL_QKEY),
            local_qpn: p.local_qpn(),
            vendor_id: (u32::from(b[field::VENDOR_ID_H]) << 16) | (u32::from(b[field::VENDOR_ID_M]) << 8) | u32::from(b[field::VENDOR_ID_L]),
            local_eecn: rd24(b, field::LOCAL_EECN),
            starting_psn: Psn::new(rd24(b, field::STARTING_PSN)),
            responder_resources: b[field::RESPONDER_RESOURCES],
            initiator_depth: b[field::INITIATOR_DEPTH],
            target_ack_delay: get_bits(b, field::TARGET_ACK_DELAY),
            failover_accepted: get_bits(b, field::FAILOVER_ACCEPTED),
            flow_control: get_bits(b, field::FLOW_CONTROL) != 0,
            rnr_retry_count: get_bits(b, field::RNR_RETRY_COUNT),
            srq: get_bits(b, field::SRQ) != 0,
            local_ca_guid: rd64(b, field::LOCAL_CA_GUID),
            private_data: b[field::PRIVATE_DATA].to_vec(),
        })
    }
    /// 232.
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let b = &mut p.buffer.as_mut()[..LEN];
        wr_private(b, field::PRIVATE_DATA, &self.private_data)?;
        b[..field::PRIVATE_DATA.start].fill(0);
        wr32(b, field::LOCAL_COMM_ID, self.local_comm_id);
        wr32(b, field::REMOTE_COMM_ID, self.remote_comm_id);
        wr32(b, field::LOCAL_QKEY, self.local_qkey);
        b[field::LOCAL_QPN].copy_from_slice(&self.local_qpn.to_be24());
        b[field::VENDOR_ID_H] = (self.vendor_id >> 16) as u8;
        wr24(b, field::LOCAL_EECN, self.local_eecn & 0xFF_FFFF);
        b[field::VENDOR_ID_M] = (self.vendor_id >> 8) as u8;
        b[field::STARTING_PSN].copy_from_slice(&self.starting_psn.to_be24());
        b[field::VENDOR_ID_L] = self.vendor_id as u8;
        b[field::RESPONDER_RESOURCES] = self.responder_resources;
        b[field::INITIATOR_DEPTH] = self.initiator_depth;
        set_bits(b, field::TARGET_ACK_DELAY, self.target_ack_delay);
        set_bits(b, field::FAILOVER_ACCEPTED, self.failover_accepted);
        set_bits(b, field::FLOW_CONTROL, u8::from(self.flow_control));
        set_bits(b, field::RNR_RETRY_COUNT, self.rnr_retry_count);
        set_bits(b, field::SRQ, u8::from(self.srq));
        wr64(b, field::LOCAL_CA_GUID, self.local_ca_guid);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn test_layout_roundtrip() {
        let r = Repr {
            local_comm_id: 0x11,
            remote_comm_id: 0x22,
            local_qpn: Qpn::new(0x123456),
            vendor_id: 0xA1B2C3,
            starting_psn: Psn::new(0x654321),
            responder_resources: 4,
            initiator_depth: 2,
            target_ack_delay: 15,
            failover_accepted: 0,
            flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: 0x0102_0304_0506_0708,
            private_data: vec![3; PRIVATE_DATA_LEN],
            ..Repr::default()
        };
        let mut b = [0xEEu8; LEN];
        r.emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(&b[12..16], &[0x12, 0x34, 0x56, 0xA1]);
        assert_eq!(&b[16..20], &[0, 0, 0, 0xB2]);
        assert_eq!(&b[20..24], &[0x65, 0x43, 0x21, 0xC3]);
        assert_eq!(&b[24..28], &[4, 2, (15 << 3) | 1, (7 << 5) | (1 << 4)]);
        assert_eq!(&b[28..36], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])).unwrap(), r);
        assert_eq!(Packet::new_checked(&b[..35]).unwrap_err(), crate::Error::Truncated);
    }
}
