//! SIDR_REP, Service ID Resolution Response (attribute 0x0018; IBTA 12.11.2): status, QPN,
//! Q_Key, up to 72 bytes of additional information, 136 bytes private data. The ECE vendor ID
//! lives in the reserved bytes (16 bits at 6, 8 bits at 11), as the kernel puts it.

use pmrxe_wire::Qpn;

use crate::bits::{cm_packet, rd16, rd24, rd32, rd64, wr16, wr24, wr32, wr64, wr_private};
use crate::{Error, Result};

/// Private-data bytes of a SIDR_REP.
pub const PRIVATE_DATA_LEN: usize = 136;
/// Additional-information bytes.
pub const INFO_LEN: usize = 72;
/// CM data bytes.
pub const LEN: usize = 232;

mod field {
    use crate::bits::Field;
    pub const REQUEST_ID: Field = 0..4;
    pub const STATUS: usize = 4;
    pub const INFO_LENGTH: usize = 5;
    pub const VENDOR_ID_H: Field = 6..8;
    pub const QPN: Field = 8..11;
    pub const VENDOR_ID_L: usize = 11;
    pub const SERVICE_ID: Field = 12..20;
    pub const QKEY: Field = 20..24;
    pub const INFO: Field = 24..96;
    pub const PRIVATE_DATA: Field = 96..232;
}

/// SIDR_REP status (IBTA Table "SIDR_REP status"; the kernel's `enum ib_cm_sidr_status`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// 0: the QPN and Q_Key are valid.
    pub const SUCCESS: SidrStatus = SidrStatus(0);
    /// 1: service ID not supported (no listener).
    pub const UNSUPPORTED: SidrStatus = SidrStatus(1);
    /// 2: rejected by the service.
    pub const REJECT: SidrStatus = SidrStatus(2);
    /// 3: no QP available.
    pub const NO_QP: SidrStatus = SidrStatus(3);
    /// 4: redirect (ClassPortInfo in the additional information).
    pub const REDIRECT: SidrStatus = SidrStatus(4);
    /// 5: unsupported class version.
    pub const UNSUPPORTED_VERSION: SidrStatus = SidrStatus(5);
}

cm_packet!(LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Request ID (echoes the SIDR_REQ).
    pub fn request_id(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::REQUEST_ID)
    }
    /// Status.
    pub fn status(&self) -> SidrStatus {
        SidrStatus(self.buffer.as_ref()[field::STATUS])
    }
}

/// Parsed SIDR_REP.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Request ID.
    pub request_id: u32,
    /// Status.
    pub status: SidrStatus,
    /// ECE vendor ID (24 bits).
    pub vendor_id: u32,
    /// The service's QPN.
    pub qpn: Qpn,
    /// Service ID.
    pub service_id: u64,
    /// The service's Q_Key.
    pub qkey: u32,
    /// Additional information (≤ 72 bytes).
    pub info: Vec<u8>,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl Repr {
    /// Parse; `BadField` if the additional-information length exceeds 72.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        let b = p.buffer.as_ref();
        let info_len = usize::from(b[field::INFO_LENGTH]);
        if info_len > INFO_LEN {
            return Err(Error::BadField);
        }
        Ok(Repr {
            request_id: p.request_id(),
            status: p.status(),
            vendor_id: (u32::from(rd16(b, field::VENDOR_ID_H)) << 8) | u32::from(b[field::VENDOR_ID_L]),
            qpn: Qpn::new(rd24(b, field::QPN)),
            service_id: rd64(b, field::SERVICE_ID),
            qkey: rd32(b, field::QKEY),
            info: b[field::INFO.start..field::INFO.start + info_len].to_vec(),
            private_data: b[field::PRIVATE_DATA].to_vec(),
        })
    }
    /// 232.
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
    /// Emit; `BadField` if `info` exceeds 72 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        if self.info.len() > INFO_LEN {
            return Err(Error::BadField);
        }
        let b = &mut p.buffer.as_mut()[..LEN];
        wr_private(b, field::PRIVATE_DATA, &self.private_data)?;
        b[..field::PRIVATE_DATA.start].fill(0);
        wr32(b, field::REQUEST_ID, self.request_id);
        b[field::STATUS] = self.status.0;
        b[field::INFO_LENGTH] = self.info.len() as u8;
        wr16(b, field::VENDOR_ID_H, (self.vendor_id >> 8) as u16);
        wr24(b, field::QPN, self.qpn.value());
        b[field::VENDOR_ID_L] = self.vendor_id as u8;
        wr64(b, field::SERVICE_ID, self.service_id);
        wr32(b, field::QKEY, self.qkey);
        b[field::INFO.start..field::INFO.start + self.info.len()].copy_from_slice(&self.info);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    #[test]
    fn test_layout_roundtrip() {
        let r = Repr {
            request_id: 9,
            status: SidrStatus::SUCCESS,
            vendor_id: 0x112233,
            qpn: Qpn::new(0x000042),
            service_id: 0x0000_0000_0111_1234,
            qkey: 0x0123_4567,
            info: vec![],
            private_data: vec![5; PRIVATE_DATA_LEN],
        };
        let mut b = [0xEEu8; LEN];
        r.emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(&b[..24], &[0, 0, 0, 9, 0, 0, 0x11, 0x22, 0, 0, 0x42, 0x33, 0, 0, 0, 0, 0x01, 0x11, 0x12, 0x34, 0x01, 0x23, 0x45, 0x67]);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])).unwrap(), r);
        b[5] = 73;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadField));
    }
}
