//! Base Transport Header (IBA 9.2), 12 bytes.
//!
//! ```text
//! 0: OpCode | 1: SE M PadCnt(2) TVer(4) | 2-3: P_Key
//! 4: FECN BECN resv6 | 5-7: DestQP | 8: A resv7 | 9-11: PSN
//! ```

use crate::{fixed_packet, rd16, wr16, Error, Opcode, Psn, Qpn, Result};

/// BTH length.
pub const HEADER_LEN: usize = 12;

mod field {
    use crate::Field;
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1; // SE | M | PadCnt(2) | TVer(4)
    pub const PKEY: Field = 2..4;
    pub const FECN_BECN: usize = 4; // FECN | BECN | resv6 (masked in the ICRC)
    pub const DEST_QP: Field = 5..8;
    pub const ACK_REQ: usize = 8; // A | resv7
    pub const PSN: Field = 9..12;

    pub const SE: u8 = 0x80;
    pub const M: u8 = 0x40;
    pub const PAD_SHIFT: u8 = 4;
    pub const PAD_MASK: u8 = 0x30;
    pub const TVER_MASK: u8 = 0x0F;
    pub const FECN: u8 = 0x80;
    pub const BECN: u8 = 0x40;
    pub const A: u8 = 0x80;
}

/// Byte offset of the FECN/BECN/resv byte (masked to 0xFF in the ICRC).
pub const FECN_BECN_OFFSET: usize = field::FECN_BECN;

fixed_packet!(HEADER_LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// OpCode.
    #[inline]
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }
    /// Solicited event.
    #[inline]
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & field::SE != 0
    }
    /// MigReq.
    #[inline]
    pub fn migreq(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & field::M != 0
    }
    /// Pad count (0..=3).
    #[inline]
    pub fn pad(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] & field::PAD_MASK) >> field::PAD_SHIFT
    }
    /// Transport header version (must be 0).
    #[inline]
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & field::TVER_MASK
    }
    /// P_Key.
    #[inline]
    pub fn pkey(&self) -> u16 {
        rd16(self.buffer.as_ref(), field::PKEY)
    }
    /// FECN.
    #[inline]
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & field::FECN != 0
    }
    /// BECN.
    #[inline]
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & field::BECN != 0
    }
    /// Destination QP.
    #[inline]
    pub fn dest_qp(&self) -> Qpn {
        Qpn::from_be24(&self.buffer.as_ref()[field::DEST_QP])
    }
    /// AckReq.
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & field::A != 0
    }
    /// PSN.
    #[inline]
    pub fn psn(&self) -> Psn {
        Psn::from_be24(&self.buffer.as_ref()[field::PSN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the OpCode.
    #[inline]
    pub fn set_opcode(&mut self, v: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = v.0
    }
    /// Set SE, M, PadCnt and TVer in one go.
    #[inline]
    pub fn set_flags(&mut self, se: bool, m: bool, pad: u8, tver: u8) {
        self.buffer.as_mut()[field::FLAGS] = (if se { field::SE } else { 0 })
            | (if m { field::M } else { 0 })
            | ((pad << field::PAD_SHIFT) & field::PAD_MASK)
            | (tver & field::TVER_MASK);
    }
    /// Set the pad count (0..=3).
    #[inline]
    pub fn set_pad(&mut self, pad: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !field::PAD_MASK) | ((pad << field::PAD_SHIFT) & field::PAD_MASK);
    }
    /// Set the P_Key.
    #[inline]
    pub fn set_pkey(&mut self, v: u16) {
        wr16(self.buffer.as_mut(), field::PKEY, v)
    }
    /// Set FECN/BECN (the reserved bits are cleared).
    #[inline]
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::FECN_BECN] =
            (if fecn { field::FECN } else { 0 }) | (if becn { field::BECN } else { 0 });
    }
    /// Set the destination QP.
    #[inline]
    pub fn set_dest_qp(&mut self, v: Qpn) {
        self.buffer.as_mut()[field::DEST_QP].copy_from_slice(&v.to_be24())
    }
    /// Set AckReq (the reserved bits are cleared).
    #[inline]
    pub fn set_ack_req(&mut self, v: bool) {
        self.buffer.as_mut()[field::ACK_REQ] = if v { field::A } else { 0 };
    }
    /// Set the PSN.
    #[inline]
    pub fn set_psn(&mut self, v: Psn) {
        self.buffer.as_mut()[field::PSN].copy_from_slice(&v.to_be24())
    }
}

/// Parsed BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// OpCode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// MigReq.
    pub migreq: bool,
    /// Pad count (0..=3).
    pub pad: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// P_Key (0xFFFF default).
    pub pkey: u16,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl Repr {
    /// A BTH with defaults: no flags, pad 0, TVer 0, P_Key 0xFFFF.
    pub const fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Repr {
        Repr {
            opcode,
            solicited: false,
            migreq: false,
            pad: 0,
            tver: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parse. Checks TVer == 0 and that the opcode is in the table; reserved bits are
    /// ignored (IBA: ignore on receive). Always inlined: every received frame parses a BTH,
    /// and a `Result<Repr>` returned through memory is read back wider than it was written
    /// (a store-forwarding stall per frame).
    #[inline(always)]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        if p.tver() != 0 {
            return Err(Error::BadTver);
        }
        let opcode = p.opcode();
        if opcode.info().is_none() {
            return Err(Error::UnknownOpcode(opcode.0));
        }
        Ok(Repr {
            opcode,
            solicited: p.solicited(),
            migreq: p.migreq(),
            pad: p.pad(),
            tver: p.tver(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }

    /// 12.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Emit (reserved bits written as zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        let b: &mut [u8; HEADER_LEN] = (&mut p.buffer.as_mut()[..HEADER_LEN]).try_into().expect("a checked BTH");
        self.emit_bytes(b);
    }

    /// Emit into exactly 12 bytes, as three big-endian words (one store each, not seven
    /// field setters: the transmit path writes a BTH per packet). Always inlined: called, it
    /// read the `Repr` its caller had just stored field by field in wider loads, which wait
    /// for the store buffer to drain (behind a frame's payload, on the transmit path).
    #[inline(always)]
    pub fn emit_bytes(&self, b: &mut [u8; HEADER_LEN]) {
        let bit = |v: bool, m: u8| if v { u32::from(m) } else { 0 };
        let flags = bit(self.solicited, field::SE)
            | bit(self.migreq, field::M)
            | ((u32::from(self.pad) << field::PAD_SHIFT) & u32::from(field::PAD_MASK))
            | (u32::from(self.tver) & u32::from(field::TVER_MASK));
        let w0 = (u32::from(self.opcode.0) << 24) | (flags << 16) | u32::from(self.pkey);
        let w1 = ((bit(self.fecn, field::FECN) | bit(self.becn, field::BECN)) << 24) | self.dest_qp.value();
        let w2 = (bit(self.ack_req, field::A) << 24) | self.psn.value();
        b[0..4].copy_from_slice(&w0.to_be_bytes());
        b[4..8].copy_from_slice(&w1.to_be_bytes());
        b[8..12].copy_from_slice(&w2.to_be_bytes());
    }
}

#[cfg(test)]
mod test {
    use super::*;

    static PACKET_BYTES: [u8; 12] =
        [0x0a, 0xe0, 0xff, 0xff, 0x40, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56];

    fn repr() -> Repr {
        Repr {
            solicited: true,
            migreq: true,
            pad: 2,
            becn: true,
            ack_req: true,
            ..Repr::new(Opcode::RC_RDMA_WRITE_ONLY, Qpn::new(0x11), Psn::new(0x123456))
        }
    }

    #[test]
    fn test_deconstruct() {
        let p = Packet::new_checked(&PACKET_BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RC_RDMA_WRITE_ONLY);
        assert!(p.solicited() && p.migreq() && p.becn() && !p.fecn() && p.ack_req());
        assert_eq!((p.pad(), p.tver(), p.pkey()), (2, 0, 0xFFFF));
        assert_eq!(p.dest_qp(), Qpn::new(0x11));
        assert_eq!(p.psn(), Psn::new(0x123456));
    }

    #[test]
    fn test_construct_parse_emit() {
        let mut buf = [0xAAu8; 12];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, PACKET_BYTES);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&PACKET_BYTES[..])).unwrap(), repr());
    }

    /// The word emit writes exactly what the field setters write, for every flag and random
    /// opcodes, P_Keys, QPNs, PSNs, pads and TVers (reserved bits zero).
    #[test]
    fn word_emit_equals_the_field_setters() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..4096u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let r = Repr {
                opcode: Opcode(x as u8),
                solicited: i & 1 != 0,
                migreq: i & 2 != 0,
                pad: (x >> 8) as u8 & 3,
                tver: (x >> 10) as u8 & 0xF,
                pkey: (x >> 16) as u16,
                fecn: i & 4 != 0,
                becn: i & 8 != 0,
                dest_qp: Qpn::new((x >> 32) as u32),
                ack_req: i & 16 != 0,
                psn: Psn::new((x >> 40) as u32 ^ i),
            };
            let mut want = [0xAAu8; 12];
            let mut p = Packet::new_unchecked(&mut want[..]);
            p.set_opcode(r.opcode);
            p.set_flags(r.solicited, r.migreq, r.pad, r.tver);
            p.set_pkey(r.pkey);
            p.set_ecn(r.fecn, r.becn);
            p.set_dest_qp(r.dest_qp);
            p.set_ack_req(r.ack_req);
            p.set_psn(r.psn);
            let mut got = [0x55u8; 12];
            r.emit(&mut Packet::new_unchecked(&mut got[..]));
            assert_eq!(got, want, "{r:?}");
        }
    }

    #[test]
    fn test_truncated_and_bad() {
        assert_eq!(Packet::new_checked(&PACKET_BYTES[..11]).unwrap_err(), Error::Truncated);
        let mut b = PACKET_BYTES;
        b[1] |= 1;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadTver));
        b = PACKET_BYTES;
        b[0] = 0xFF;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::UnknownOpcode(0xFF)));
    }
}
