//! The CM messages (IBTA vol.1 12.6 and 12.11), one file each, and the whole-MAD codec:
//! [`parse_mad`] validates the common header and parses the message its attribute ID names;
//! [`emit_mad`] writes a complete 256-byte MAD.
//!
//! Each message's `Packet` is a view over the 232-byte CM data area that follows the MAD
//! header, so the offsets in every `mod field` are the offsets of the IBTA tables.

pub mod dreq;
pub mod mra;
pub mod rej;
pub mod rep;
pub mod req;
pub mod rtu_drep;
pub mod sidr_rep;
pub mod sidr_req;

pub use mra::MsgCode;
pub use rej::RejReason;
pub use sidr_rep::SidrStatus;

use crate::mad::{self, DATA_LEN, HEADER_LEN, MAD_LEN};
use crate::{Error, Result};

/// One whole MAD.
pub type Mad = [u8; MAD_LEN];

/// CM attribute IDs (IBTA Table "CM attributes").
pub mod attr {
    /// ClassPortInfo (not implemented here).
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp.
    pub const SIDR_REP: u16 = 0x0018;
    /// LoadAlternatePath (not implemented).
    pub const LAP: u16 = 0x0019;
    /// AlternatePathResponse (not implemented).
    pub const APR: u16 = 0x001A;
}

/// A parsed CM message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CmMsg {
    /// REQ.
    Req(req::Repr),
    /// MRA.
    Mra(mra::Repr),
    /// REJ.
    Rej(rej::Repr),
    /// REP.
    Rep(rep::Repr),
    /// RTU.
    Rtu(rtu_drep::Repr),
    /// DREQ.
    Dreq(dreq::Repr),
    /// DREP.
    Drep(rtu_drep::Repr),
    /// SIDR_REQ.
    SidrReq(sidr_req::Repr),
    /// SIDR_REP.
    SidrRep(sidr_rep::Repr),
}

impl CmMsg {
    /// The attribute ID of this message.
    pub const fn attr_id(&self) -> u16 {
        match self {
            CmMsg::Req(_) => attr::REQ,
            CmMsg::Mra(_) => attr::MRA,
            CmMsg::Rej(_) => attr::REJ,
            CmMsg::Rep(_) => attr::REP,
            CmMsg::Rtu(_) => attr::RTU,
            CmMsg::Dreq(_) => attr::DREQ,
            CmMsg::Drep(_) => attr::DREP,
            CmMsg::SidrReq(_) => attr::SIDR_REQ,
            CmMsg::SidrRep(_) => attr::SIDR_REP,
        }
    }
    /// Short name ("REQ", "REP", ...).
    pub const fn name(&self) -> &'static str {
        match attr_name(self.attr_id()) {
            Some(n) => n,
            None => "?",
        }
    }
}

/// Name of a CM attribute ID.
pub const fn attr_name(id: u16) -> Option<&'static str> {
    Some(match id {
        attr::REQ => "REQ",
        attr::MRA => "MRA",
        attr::REJ => "REJ",
        attr::REP => "REP",
        attr::RTU => "RTU",
        attr::DREQ => "DREQ",
        attr::DREP => "DREP",
        attr::SIDR_REQ => "SIDR_REQ",
        attr::SIDR_REP => "SIDR_REP",
        attr::LAP => "LAP",
        attr::APR => "APR",
        attr::CLASS_PORT_INFO => "ClassPortInfo",
        _ => return None,
    })
}

/// Parse a whole CM MAD (at least 256 bytes; trailing bytes are ignored). Never panics.
pub fn parse_mad(buf: &[u8]) -> Result<(mad::Repr, CmMsg)> {
    let h = mad::Repr::parse(&mad::Packet::new_checked(buf)?)?;
    if buf.len() < MAD_LEN {
        return Err(Error::Truncated);
    }
    let d = &buf[HEADER_LEN..MAD_LEN];
    let m = match h.attr_id {
        attr::REQ => CmMsg::Req(req::Repr::parse(&req::Packet::new_checked(d)?)?),
        attr::MRA => CmMsg::Mra(mra::Repr::parse(&mra::Packet::new_checked(d)?)?),
        attr::REJ => CmMsg::Rej(rej::Repr::parse(&rej::Packet::new_checked(d)?)?),
        attr::REP => CmMsg::Rep(rep::Repr::parse(&rep::Packet::new_checked(d)?)?),
        attr::RTU => CmMsg::Rtu(rtu_drep::Repr::parse(&rtu_drep::Packet::new_checked(d)?)?),
        attr::DREQ => CmMsg::Dreq(dreq::Repr::parse(&dreq::Packet::new_checked(d)?)?),
        attr::DREP => CmMsg::Drep(rtu_drep::Repr::parse(&rtu_drep::Packet::new_checked(d)?)?),
        attr::SIDR_REQ => CmMsg::SidrReq(sidr_req::Repr::parse(&sidr_req::Packet::new_checked(d)?)?),
        attr::SIDR_REP => CmMsg::SidrRep(sidr_rep::Repr::parse(&sidr_rep::Packet::new_checked(d)?)?),
        other => return Err(Error::UnknownAttribute(other)),
    };
    Ok((h, m))
}

/// Emit a complete MAD for `msg` with transaction ID `tid` and attribute modifier `attr_mod`
/// (ECE options; 0 otherwise). Errors: private data or ARI/info too long.
pub fn emit_mad(tid: u64, attr_mod: u32, msg: &CmMsg) -> Result<Mad> {
    let mut out = [0u8; MAD_LEN];
    let (h, d) = out.split_at_mut(HEADER_LEN);
    debug_assert_eq!(d.len(), DATA_LEN);
    mad::Repr { status: 0, tid, attr_id: msg.attr_id(), attr_mod }.emit(&mut mad::Packet::new_unchecked(h));
    match msg {
        CmMsg::Req(r) => r.emit(&mut req::Packet::new_unchecked(d))?,
        CmMsg::Mra(r) => r.emit(&mut mra::Packet::new_unchecked(d))?,
        CmMsg::Rej(r) => r.emit(&mut rej::Packet::new_unchecked(d))?,
        CmMsg::Rep(r) => r.emit(&mut rep::Packet::new_unchecked(d))?,
        CmMsg::Rtu(r) | CmMsg::Drep(r) => r.emit(&mut rtu_drep::Packet::new_unchecked(d))?,
        CmMsg::Dreq(r) => r.emit(&mut dreq::Packet::new_unchecked(d))?,
        CmMsg::SidrReq(r) => r.emit(&mut sidr_req::Packet::new_unchecked(d))?,
        CmMsg::SidrRep(r) => r.emit(&mut sidr_rep::Packet::new_unchecked(d))?,
    }
    Ok(out)
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn whole_mad_roundtrip_and_errors() {
        let m = CmMsg::Drep(rtu_drep::Repr { local_comm_id: 1, remote_comm_id: 2, private_data: vec![0; rtu_drep::PRIVATE_DATA_LEN] });
        let b = emit_mad(0xAA, 0, &m).unwrap();
        assert_eq!(&b[..4], &[1, 7, 2, 3]);
        assert_eq!(&b[16..18], &[0x00, 0x16]);
        let (h, back) = parse_mad(&b).unwrap();
        assert_eq!(h.tid, 0xAA);
        assert_eq!(back, m);
        assert_eq!(back.name(), "DREP");
        assert_eq!(parse_mad(&b[..255]), Err(Error::Truncated));
        let mut lap = b;
        lap[17] = 0x19;
        assert_eq!(parse_mad(&lap), Err(Error::UnknownAttribute(0x19)));
    }
}
