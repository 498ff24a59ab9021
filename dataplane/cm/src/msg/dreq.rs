//! DREQ, Request for Communication Release (attribute 0x0015; IBTA 12.6.10): the IDs, the
//! receiver's QPN (so a stale DREQ cannot tear down a newer connection) and 220 bytes of
//! private data.

use pmrxe_wire::Qpn;

use crate::bits::{cm_packet, rd24, rd32, wr32, wr_private};
use crate::Result;

/// Private-data bytes of a DREQ.
pub const PRIVATE_DATA_LEN: usize = 220;
/// CM data bytes.
pub const LEN: usize = 232;

mod field {
    use crate::bits::Field;
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const REMOTE_QPN: Field = 8..11;
    pub const RESERVED: usize = 11;
    pub const PRIVATE_DATA: Field = 12..232;
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
    /// The receiver's QPN/EECN.
    pub fn remote_qpn(&self) -> Qpn {
        Qpn::new(rd24(self.buffer.as_ref(), field::REMOTE_QPN))
    }
}

/// Parsed DREQ.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QPN.
    pub remote_qpn: Qpn,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl Repr {
    /// Parse.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            remote_qpn: p.remote_qpn(),
            private_data: p.buffer.as_ref()[field::PRIVATE_DATA].to_vec(),
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
        wr32(b, field::LOCAL_COMM_ID, self.local_comm_id);
        wr32(b, field::REMOTE_COMM_ID, self.remote_comm_id);
        b[field::REMOTE_QPN].copy_from_slice(&self.remote_qpn.to_be24());
        b[field::RESERVED] = 0;
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn test_layout_roundtrip() {
        let r = Repr { local_comm_id: 5, remote_comm_id: 6, remote_qpn: Qpn::new(0xABCDEF), private_data: vec![2; PRIVATE_DATA_LEN] };
        let mut b = [0xEEu8; LEN];
        r.emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(&b[..13], &[0, 0, 0, 5, 0, 0, 0, 6, 0xAB, 0xCD, 0xEF, 0, 2]);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])).unwrap(), r);
        assert_eq!(Packet::new_checked(&b[..12]).unwrap_err(), crate::Error::Truncated);
    }
}
