//! MRA, Message Receipt Acknowledgement (attribute 0x0011; IBTA 12.6.6): "I got your REQ/REP
//! (or LAP) but need up to 4.096 µs · 2^service_timeout to answer". 222 bytes private data.

use crate::bits::{cm_packet, get_bits, rd32, set_bits, wr32, wr_private};
use crate::{Error, Result};

/// Private-data bytes of an MRA.
pub const PRIVATE_DATA_LEN: usize = 222;
/// CM data bytes.
pub const LEN: usize = 232;

mod field {
    use crate::bits::{Bits, Field};
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const MESSAGE_MRAED: Bits = Bits::new(8, 0, 2);
    pub const SERVICE_TIMEOUT: Bits = Bits::new(9, 0, 5);
    pub const PRIVATE_DATA: Field = 10..232;
}

/// Which message an MRA (or a REJ) answers: the 2-bit "Message MRAed"/"Message REJected" code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MsgCode {
    /// 0: the REQ.
    Req = 0,
    /// 1: the REP.
    Rep = 1,
    /// 2: LAP for MRA; "other / no message" for REJ.
    Other = 2,
}

impl MsgCode {
    /// From the 2-bit code (3 is undefined → `BadField`).
    pub fn from_code(c: u8) -> Result<MsgCode> {
        match c {
            0 => Ok(MsgCode::Req),
            1 => Ok(MsgCode::Rep),
            2 => Ok(MsgCode::Other),
            _ => Err(Error::BadField),
        }
    }
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
}

/// Parsed MRA.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID (for an MRA of a REQ: the REQ's local comm ID).
    pub remote_comm_id: u32,
    /// Which message is acknowledged.
    pub message_mraed: MsgCode,
    /// Service timeout (IBA exponent, 5 bits).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl Repr {
    /// Parse; `BadField` for message code 3.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        let b = p.buffer.as_ref();
        Ok(Repr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            message_mraed: MsgCode::from_code(get_bits(b, field::MESSAGE_MRAED))?,
            service_timeout: get_bits(b, field::SERVICE_TIMEOUT),
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
        set_bits(b, field::MESSAGE_MRAED, self.message_mraed as u8);
        set_bits(b, field::SERVICE_TIMEOUT, self.service_timeout);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn test_layout_roundtrip_bad_code() {
        let r = Repr { local_comm_id: 1, remote_comm_id: 2, message_mraed: MsgCode::Rep, service_timeout: 24, private_data: vec![7; PRIVATE_DATA_LEN] };
        let mut b = [0xEEu8; LEN];
        r.emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(&b[..10], &[0, 0, 0, 1, 0, 0, 0, 2, 0x40, 24 << 3]);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])).unwrap(), r);
        b[8] = 0xC0;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadField));
        assert_eq!(Packet::new_checked(&b[..100]).unwrap_err(), Error::Truncated);
    }
}
