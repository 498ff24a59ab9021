//! SIDR_REQ, Service ID Resolution Request (attribute 0x0017; IBTA 12.11.1): how a UD client
//! asks for the QPN and Q_Key behind a service ID. 216 bytes private data (the RDMA CM puts its
//! IP header at the start, as in a REQ).

use crate::bits::{cm_packet, rd16, rd32, rd64, wr16, wr32, wr64, wr_private};
use crate::Result;

/// Private-data bytes of a SIDR_REQ.
pub const PRIVATE_DATA_LEN: usize = 216;
/// CM data bytes.
pub const LEN: usize = 232;

mod field {
    use crate::bits::Field;
    pub const REQUEST_ID: Field = 0..4;
    pub const PKEY: Field = 4..6;
    pub const SERVICE_ID: Field = 8..16;
    pub const PRIVATE_DATA: Field = 16..232;
}

cm_packet!(LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Request ID (the requester's communication ID).
    pub fn request_id(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::REQUEST_ID)
    }
    /// Service ID.
    pub fn service_id(&self) -> u64 {
        rd64(self.buffer.as_ref(), field::SERVICE_ID)
    }
}

/// Parsed SIDR_REQ.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Request ID.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl Repr {
    /// Parse.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        let b = p.buffer.as_ref();
        Ok(Repr {
            request_id: p.request_id(),
            pkey: rd16(b, field::PKEY),
            service_id: p.service_id(),
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
        wr32(b, field::REQUEST_ID, self.request_id);
        wr16(b, field::PKEY, self.pkey);
        wr64(b, field::SERVICE_ID, self.service_id);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn test_layout_roundtrip() {
        let r = Repr { request_id: 7, pkey: 0xFFFF, service_id: 0x0000_0000_0111_1234, private_data: vec![4; PRIVATE_DATA_LEN] };
        let mut b = [0xEEu8; LEN];
        r.emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(&b[..17], &[0, 0, 0, 7, 0xFF, 0xFF, 0, 0, 0, 0, 0, 0, 0x01, 0x11, 0x12, 0x34, 4]);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])).unwrap(), r);
        assert_eq!(Packet::new_checked(&b[..16]).unwrap_err(), crate::Error::Truncated);
    }
}
