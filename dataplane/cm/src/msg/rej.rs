//! REJ, Reject (attribute 0x0012; IBTA 12.6.7): reason, up to 72 bytes of Additional Reject
//! Information (ARI), 148 bytes private data.

use crate::bits::{cm_packet, get_bits, rd16, rd32, set_bits, wr16, wr32, wr_private};
use crate::msg::MsgCode;
use crate::{Error, Result};

/// Private-data bytes of a REJ.
pub const PRIVATE_DATA_LEN: usize = 148;
/// ARI bytes.
pub const ARI_LEN: usize = 72;
/// CM data bytes.
pub const LEN: usize = 232;

mod field {
    use crate::bits::{Bits, Field};
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const MESSAGE_REJECTED: Bits = Bits::new(8, 0, 2);
    pub const REJECT_INFO_LENGTH: Bits = Bits::new(9, 0, 7);
    pub const REASON: Field = 10..12;
    pub const ARI: Field = 12..84;
    pub const PRIVATE_DATA: Field = 84..232;
}

/// A REJ reason code (IBTA Table "Reject Reason"; the kernel's `enum ib_cm_rej_reason`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RejReason(pub u16);

macro_rules! reasons {
    ($( $name:ident = $v:expr, $s:expr; )*) => {
        impl RejReason {
            $( #[doc = $s] pub const $name: RejReason = RejReason($v); )*
            /// Short name of a defined reason.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 { $( $v => Some($s), )* _ => None }
            }
        }
    };
}

reasons! {
    NO_QP = 1, "no QP available";
    NO_EEC = 2, "no EEC available";
    NO_RESOURCES = 3, "no resources available";
    TIMEOUT = 4, "timeout";
    UNSUPPORTED = 5, "unsupported request";
    INVALID_COMM_ID = 6, "invalid communication ID";
    INVALID_COMM_INSTANCE = 7, "invalid communication instance";
    INVALID_SERVICE_ID = 8, "invalid service ID";
    INVALID_TRANSPORT_TYPE = 9, "invalid transport service type";
    STALE_CONN = 10, "stale connection";
    RDC_NOT_EXIST = 11, "RDC does not exist";
    INVALID_GID = 12, "primary remote port GID rejected";
    INVALID_LID = 13, "primary remote port LID rejected";
    INVALID_SL = 14, "invalid primary SL";
    INVALID_TRAFFIC_CLASS = 15, "invalid primary traffic class";
    INVALID_HOP_LIMIT = 16, "invalid primary hop limit";
    INVALID_PACKET_RATE = 17, "invalid primary packet rate";
    INVALID_ALT_GID = 18, "alternate remote port GID rejected";
    INVALID_ALT_LID = 19, "alternate remote port LID rejected";
    INVALID_ALT_SL = 20, "invalid alternate SL";
    INVALID_ALT_TRAFFIC_CLASS = 21, "invalid alternate traffic class";
    INVALID_ALT_HOP_LIMIT = 22, "invalid alternate hop limit";
    INVALID_ALT_PACKET_RATE = 23, "invalid alternate packet rate";
    PORT_CM_REDIRECT = 24, "port redirection (CM)";
    PORT_REDIRECT = 25, "port redirection";
    INVALID_MTU = 26, "invalid path MTU";
    INSUFFICIENT_RESP_RESOURCES = 27, "insufficient responder resources";
    CONSUMER_DEFINED = 28, "consumer defined";
    INVALID_RNR_RETRY = 29, "invalid RNR NAK retry count";
    DUPLICATE_LOCAL_COMM_ID = 30, "duplicate local communication ID";
    INVALID_CLASS_VERSION = 31, "invalid class version";
    INVALID_FLOW_LABEL = 32, "invalid primary flow label";
    INVALID_ALT_FLOW_LABEL = 33, "invalid alternate flow label";
    VENDOR_OPTION_NOT_SUPPORTED = 35, "vendor option not supported";
}

cm_packet!(LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Sender's communication ID (0 if the sender had none, e.g. "no listener").
    pub fn local_comm_id(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::LOCAL_COMM_ID)
    }
    /// Receiver's communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::REMOTE_COMM_ID)
    }
    /// Reason.
    pub fn reason(&self) -> RejReason {
        RejReason(rd16(self.buffer.as_ref(), field::REASON))
    }
}

/// Parsed REJ.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub message_rejected: MsgCode,
    /// Reason.
    pub reason: RejReason,
    /// Additional reject information (length = the "Reject Info Length" field, ≤ 72).
    pub ari: Vec<u8>,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl Repr {
    /// Parse; `BadField` for message code 3 or an ARI length above 72.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        let b = p.buffer.as_ref();
        let ari_len = usize::from(get_bits(b, field::REJECT_INFO_LENGTH));
        if ari_len > ARI_LEN {
            return Err(Error::BadField);
        }
        Ok(Repr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            message_rejected: MsgCode::from_code(get_bits(b, field::MESSAGE_REJECTED))?,
            reason: p.reason(),
            ari: b[field::ARI.start..field::ARI.start + ari_len].to_vec(),
            private_data: b[field::PRIVATE_DATA].to_vec(),
        })
    }
    /// 232.
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
    /// Emit; `BadField` if the ARI exceeds 72 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        if self.ari.len() > ARI_LEN {
            return Err(Error::BadField);
        }
        let b = &mut p.buffer.as_mut()[..LEN];
        wr_private(b, field::PRIVATE_DATA, &self.private_data)?;
        b[..field::PRIVATE_DATA.start].fill(0);
        wr32(b, field::LOCAL_COMM_ID, self.local_comm_id);
        wr32(b, field::REMOTE_COMM_ID, self.remote_comm_id);
        set_bits(b, field::MESSAGE_REJECTED, self.message_rejected as u8);
        set_bits(b, field::REJECT_INFO_LENGTH, self.ari.len() as u8);
        wr16(b, field::REASON, self.reason.0);
        b[field::ARI.start..field::ARI.start + self.ari.len()].copy_from_slice(&self.ari);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn test_layout_roundtrip_bad_lengths() {
        let r = Repr {
            local_comm_id: 0,
            remote_comm_id: 0x01020304,
            message_rejected: MsgCode::Req,
            reason: RejReason::INVALID_SERVICE_ID,
            ari: vec![1, 2, 3, 4, 5, 6, 7, 8],
            private_data: vec![9; PRIVATE_DATA_LEN],
        };
        let mut b = [0xEEu8; LEN];
        r.emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(&b[..14], &[0, 0, 0, 0, 1, 2, 3, 4, 0x00, 8 << 1, 0, 8, 1, 2]);
        assert!(b[20..84].iter().all(|&x| x == 0));
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])).unwrap(), r);
        b[9] = 73 << 1;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadField));
        assert_eq!(RejReason::CONSUMER_DEFINED.name(), Some("consumer defined"));
        assert_eq!(RejReason::TIMEOUT.0, 4);
        assert_eq!(RejReason(34).name(), None);
    }
}
