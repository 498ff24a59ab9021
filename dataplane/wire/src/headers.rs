//! [`TransportHeaders`]: the BTH plus the extension headers its opcode implies, as one
//! value. This is what the transport engine builds and consumes.

use crate::opcode::ExtSet;
use crate::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, reth, AethRepr, AtomicAckEthRepr,
    AtomicEthRepr, BthRepr, DethRepr, Error, RethRepr, Result,
};

/// BTH and extension headers of one RoCE packet. Exactly the `Option`s named by the
/// opcode's [`crate::ExtSet`] are `Some` (checked by `emit`, guaranteed by `parse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransportHeaders {
    /// Base transport header.
    pub bth: BthRepr,
    /// RDMA ETH (WRITE FIRST/ONLY, READ request).
    pub reth: Option<RethRepr>,
    /// ACK ETH (ACK, atomic ACK, READ response FIRST/LAST/ONLY).
    pub aeth: Option<AethRepr>,
    /// Atomic ETH (CMP_SWP, FETCH_ADD).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// Atomic ACK ETH.
    pub atomic_ack: Option<AtomicAckEthRepr>,
    /// Immediate data (as the 32-bit big-endian value on the wire).
    pub imm: Option<u32>,
    /// IETH: the R_Key to invalidate.
    pub ieth: Option<u32>,
    /// Datagram ETH (UD).
    pub deth: Option<DethRepr>,
}

impl TransportHeaders {
    /// A value to parse into ([`parse_into`](TransportHeaders::parse_into)): a zero BTH
    /// (opcode 0, QP 0, PSN 0) and no extension headers.
    pub const BLANK: TransportHeaders =
        TransportHeaders::new(BthRepr::new(crate::Opcode(0), crate::Qpn::new(0), crate::Psn::new(0)));

    /// Headers with only a BTH (fill in the extension headers the opcode needs).
    pub const fn new(bth: BthRepr) -> TransportHeaders {
        TransportHeaders {
            bth,
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack: None,
            imm: None,
            ieth: None,
            deth: None,
        }
    }

    /// The set of extension headers present.
    pub fn ext_set(&self) -> ExtSet {
        // Branch-free: one OR per header (a call per header cost more than the headers).
        let bit = |present: bool, h: ExtSet| u8::from(present) * h.0;
        ExtSet(
            bit(self.deth.is_some(), ExtSet::DETH)
                | bit(self.reth.is_some(), ExtSet::RETH)
                | bit(self.atomic_eth.is_some(), ExtSet::ATOMIC_ETH)
                | bit(self.aeth.is_some(), ExtSet::AETH)
                | bit(self.atomic_ack.is_some(), ExtSet::ATOMIC_ACK)
                | bit(self.imm.is_some(), ExtSet::IMMDT)
                | bit(self.ieth.is_some(), ExtSet::IETH),
        )
    }

    /// BTH + extension headers present (for a consistent value, equals the opcode's
    /// `header_len()`).
    pub fn header_len(&self) -> usize {
        bth::HEADER_LEN + self.ext_set().wire_len()
    }

    /// Check that the opcode is known and the present headers are exactly its set.
    pub fn check(&self) -> Result<()> {
        let info = self.bth.opcode.info().ok_or(Error::UnknownOpcode(self.bth.opcode.0))?;
        if info.ext != self.ext_set() {
            return Err(Error::HeaderMismatch);
        }
        Ok(())
    }

    /// Write the BTH and extension headers at the start of `buf`; returns the length
    /// written. `Err(HeaderMismatch)` if the headers do not match the opcode,
    /// `Err(Truncated)` if `buf` is too short. The pad count is `bth.pad` as given.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let info = self.bth.opcode.info().ok_or(Error::UnknownOpcode(self.bth.opcode.0))?;
        if info.ext != self.ext_set() {
            return Err(Error::HeaderMismatch);
        }
        let len = info.header_len();
        if buf.len() < len {
            return Err(Error::Truncated);
        }
        let Some((b, mut rest)) = buf[..len].split_first_chunk_mut::<{ bth::HEADER_LEN }>() else {
            return Err(Error::Truncated); // unreachable: every opcode's headers hold a BTH
        };
        self.bth.emit_bytes(b);
        // Wire order: DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
        if let Some(d) = &self.deth {
            let (h, r) = rest.split_at_mut(deth::HEADER_LEN);
            d.emit(&mut deth::Packet::new_unchecked(h));
            rest = r;
        }
        if let Some(x) = &self.reth {
            let (h, r) = rest.split_at_mut(reth::HEADER_LEN);
            x.emit(&mut reth::Packet::new_unchecked(h));
            rest = r;
        }
        if let Some(x) = &self.atomic_eth {
            let (h, r) = rest.split_at_mut(atomic_eth::HEADER_LEN);
            x.emit(&mut atomic_eth::Packet::new_unchecked(h));
            rest = r;
        }
        if let Some(x) = &self.aeth {
            let (h, r) = rest.split_at_mut(aeth::HEADER_LEN);
            x.emit(&mut aeth::Packet::new_unchecked(h));
            rest = r;
        }
        if let Some(x) = &self.atomic_ack {
            let (h, r) = rest.split_at_mut(atomic_ack_eth::HEADER_LEN);
            x.emit(&mut atomic_ack_eth::Packet::new_unchecked(h));
            rest = r;
        }
        if let Some(x) = self.imm {
            let (h, r) = rest.split_at_mut(immdt::HEADER_LEN);
            immdt::emit(x, &mut immdt::Packet::new_unchecked(h));
            rest = r;
        }
        if let Some(x) = self.ieth {
            let (h, r) = rest.split_at_mut(ieth::HEADER_LEN);
            ieth::emit(x, &mut ieth::Packet::new_unchecked(h));
            rest = r;
        }
        debug_assert!(rest.is_empty());
        Ok(len)
    }

    /// Parse the BTH and the extension headers its opcode implies from the start of `buf`
    /// (which begins at the BTH). Returns the headers and their total length. Checks TVer
    /// (`BadTver`), the opcode (`UnknownOpcode`) and that `buf` holds every header
    /// (`Truncated`). Payload, pad and ICRC are not looked at here (see
    /// [`parse_frame`](crate::parse_frame)).
    pub fn parse(buf: &[u8]) -> Result<(TransportHeaders, usize)> {
        let mut h = TransportHeaders::BLANK;
        let len = h.parse_into(buf)?;
        Ok((h, len))
    }

    /// [`parse`](TransportHeaders::parse) into `self` (every field is written; on error `self`
    /// holds no meaning): the receive path parses into the packet it hands on, so the headers
    /// (136 bytes) are written once instead of being built and then moved through each layer.
    #[inline]
    pub fn parse_into(&mut self, buf: &[u8]) -> Result<usize> {
        self.bth = BthRepr::parse(&bth::Packet::new_checked(buf)?)?;
        // Known: BthRepr::parse rejects unknown opcodes.
        let info = self.bth.opcode.info().ok_or(Error::UnknownOpcode(self.bth.opcode.0))?;
        let len = info.header_len();
        if buf.len() < len {
            return Err(Error::Truncated);
        }
        let e = info.ext;
        // Wire order: DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH; `at` walks it.
        // `buf` holds all `len` header bytes (checked above), so each present header's slice
        // is in bounds; absent ones are `None` without a look at the buffer.
        let mut at = bth::HEADER_LEN;
        #[inline(always)]
        fn take<'b>(buf: &'b [u8], at: &mut usize, n: usize) -> &'b [u8] {
            let s = &buf[*at..*at + n];
            *at += n;
            s
        }
        let mut next = |n: usize| take(buf, &mut at, n);
        self.deth = if e.contains(ExtSet::DETH) { Some(DethRepr::parse(&deth::Packet::new_unchecked(next(deth::HEADER_LEN)))?) } else { None };
        self.reth = if e.contains(ExtSet::RETH) { Some(RethRepr::parse(&reth::Packet::new_unchecked(next(reth::HEADER_LEN)))?) } else { None };
        self.atomic_eth = if e.contains(ExtSet::ATOMIC_ETH) {
            Some(AtomicEthRepr::parse(&atomic_eth::Packet::new_unchecked(next(atomic_eth::HEADER_LEN)))?)
        } else {
            None
        };
        self.aeth = if e.contains(ExtSet::AETH) { Some(AethRepr::parse(&aeth::Packet::new_unchecked(next(aeth::HEADER_LEN)))?) } else { None };
        self.atomic_ack = if e.contains(ExtSet::ATOMIC_ACK) {
            Some(AtomicAckEthRepr::parse(&atomic_ack_eth::Packet::new_unchecked(next(atomic_ack_eth::HEADER_LEN)))?)
        } else {
            None
        };
        self.imm = if e.contains(ExtSet::IMMDT) { Some(immdt::parse(&immdt::Packet::new_unchecked(next(immdt::HEADER_LEN)))?) } else { None };
        self.ieth = if e.contains(ExtSet::IETH) { Some(ieth::parse(&ieth::Packet::new_unchecked(next(ieth::HEADER_LEN)))?) } else { None };
        debug_assert_eq!(at, len);
        Ok(len)
    }
}
