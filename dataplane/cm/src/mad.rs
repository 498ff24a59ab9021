//! The 24-byte common MAD header (IBTA vol.1 13.4.3) and the CM's use of it.
//!
//! ```text
//! 0 BaseVersion  1 MgmtClass  2 ClassVersion  3 R|Method
//! 4..6 Status    6..8 ClassSpecific   8..16 TransactionID
//! 16..18 AttributeID   18..20 reserved   20..24 AttributeModifier
//! ```
//! A CM MAD is always 256 bytes: this header plus the 232-byte CM data area.

use crate::bits::{rd16, rd32, rd64, wr16, wr32, wr64, Field};
use crate::{Error, Result};

/// Whole MAD length (UD payload on QP1).
pub const MAD_LEN: usize = 256;
/// Common header length.
pub const HEADER_LEN: usize = 24;
/// CM data area length (`MAD_LEN - HEADER_LEN`).
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;

/// `BaseVersion` of every IBTA MAD.
pub const BASE_VERSION: u8 = 1;
/// Management class of the Communication Manager.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// CM class version (IBTA 1.2 and later; the kernel's `IB_CM_CLASS_VERSION`).
pub const CM_CLASS_VERSION: u8 = 2;
/// Method `Send`: every CM message is an unsolicited Send.
pub const METHOD_SEND: u8 = 0x03;

mod field {
    use super::Field;
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Field = 4..6;
    pub const CLASS_SPECIFIC: Field = 6..8;
    pub const TID: Field = 8..16;
    pub const ATTR_ID: Field = 16..18;
    pub const RESERVED: Field = 18..20;
    pub const ATTR_MOD: Field = 20..24;
}

/// A view of the common MAD header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap without checking.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }
    /// Wrap and `check_len`.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }
    /// `Err(Truncated)` below 24 bytes. After `Ok`, no accessor panics.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }
    /// BaseVersion.
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }
    /// MgmtClass.
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[field::MGMT_CLASS]
    }
    /// ClassVersion.
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }
    /// R bit and method.
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[field::METHOD]
    }
    /// Status.
    pub fn status(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::STATUS)
    }
    /// ClassSpecific.
    pub fn class_specific(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::CLASS_SPECIFIC)
    }
    /// TransactionID.
    pub fn tid(&self) -> u64 {
        rd64(self.buffer.as_ref(), field::TID)
    }
    /// AttributeID.
    pub fn attr_id(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::ATTR_ID)
    }
    /// AttributeModifier (the CM carries the ECE options of REQ/REP/SIDR_REP here).
    pub fn attr_mod(&self) -> u32 {
        rd32(self.buffer.as_ref(), field::ATTR_MOD)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set BaseVersion, MgmtClass, ClassVersion and Method.
    pub fn set_class(&mut self, base: u8, class: u8, class_version: u8, method: u8) {
        let b = self.buffer.as_mut();
        b[field::BASE_VERSION] = base;
        b[field::MGMT_CLASS] = class;
        b[field::CLASS_VERSION] = class_version;
        b[field::METHOD] = method;
    }
    /// Set Status.
    pub fn set_status(&mut self, v: u16) {
        wr16(self.buffer.as_mut(), field::STATUS, v)
    }
    /// Set ClassSpecific.
    pub fn set_class_specific(&mut self, v: u16) {
        wr16(self.buffer.as_mut(), field::CLASS_SPECIFIC, v)
    }
    /// Set the TransactionID.
    pub fn set_tid(&mut self, v: u64) {
        wr64(self.buffer.as_mut(), field::TID, v)
    }
    /// Set the AttributeID (the reserved bytes after it are cleared).
    pub fn set_attr_id(&mut self, v: u16) {
        let b = self.buffer.as_mut();
        wr16(b, field::ATTR_ID, v);
        wr16(b, field::RESERVED, 0);
    }
    /// Set the AttributeModifier.
    pub fn set_attr_mod(&mut self, v: u32) {
        wr32(self.buffer.as_mut(), field::ATTR_MOD, v)
    }
}

/// A validated CM MAD header: base version 1, class CM, class version 2, method Send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Status (0 on every CM message).
    pub status: u16,
    /// Transaction ID.
    pub tid: u64,
    /// Attribute ID (which CM message).
    pub attr_id: u16,
    /// Attribute modifier (ECE options on REQ/REP/SIDR_REP, else 0).
    pub attr_mod: u32,
}

impl Repr {
    /// Parse and validate the header of a CM MAD. Errors in the order a GSI dispatcher wants
    /// them: `Truncated`, `BadBaseVersion`, `NotCm` (another class: not for us), then
    /// `BadClassVersion` and `BadMethod`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        if p.base_version() != BASE_VERSION {
            return Err(Error::BadBaseVersion(p.base_version()));
        }
        if p.mgmt_class() != MGMT_CLASS_CM {
            return Err(Error::NotCm(p.mgmt_class()));
        }
        if p.class_version() != CM_CLASS_VERSION {
            return Err(Error::BadClassVersion(p.class_version()));
        }
        if p.method() != METHOD_SEND {
            return Err(Error::BadMethod(p.method()));
        }
        Ok(Repr { status: p.status(), tid: p.tid(), attr_id: p.attr_id(), attr_mod: p.attr_mod() })
    }
    /// 24.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit (class fields are always the CM's).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_class(BASE_VERSION, MGMT_CLASS_CM, CM_CLASS_VERSION, METHOD_SEND);
        p.set_status(self.status);
        p.set_class_specific(0);
        p.set_tid(self.tid);
        p.set_attr_id(self.attr_id);
        p.set_attr_mod(self.attr_mod);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    static HDR: [u8; 24] = [
        0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, // versions, method, status, class specific
        0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, // TID
        0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, // REQ, reserved, attr mod
    ];

    #[test]
    fn test_parse_emit() {
        let r = Repr::parse(&Packet::new_unchecked(&HDR[..])).unwrap();
        assert_eq!(r, Repr { status: 0, tid: 0x1234_5678_9abc_def0, attr_id: 0x0010, attr_mod: 5 });
        let mut b = [0xFFu8; 24];
        r.emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, HDR);
    }
    #[test]
    fn test_truncated_and_foreign() {
        assert_eq!(Packet::new_checked(&HDR[..23]).unwrap_err(), Error::Truncated);
        let mut b = HDR;
        b[1] = 0x04; // PerfMgmt
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::NotCm(4)));
        let mut b = HDR;
        b[0] = 2;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadBaseVersion(2)));
        let mut b = HDR;
        b[2] = 1;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadClassVersion(1)));
        let mut b = HDR;
        b[3] = 0x81;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadMethod(0x81)));
    }
}
