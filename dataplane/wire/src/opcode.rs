//! The BTH opcode table, as const data (IBA Vol 1 §9.2 / table 38; the set rxe supports for
//! RC, UC and UD).
//!
//! Each row gives the extension headers (in wire order), the message position, the kind and
//! flags. Header offsets and lengths are computed from the row ([`OpInfo::header_len`]);
//! nothing else in the crate switches on opcode values.

use core::fmt;

/// QP transport type carried in the top 3 bits of the opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected (0b000).
    Rc,
    /// Unreliable connected (0b001).
    Uc,
    /// Unreliable datagram (0b011).
    Ud,
}

impl QpType {
    /// The first opcode of this QP type's block (the table test checks every row against it).
    #[cfg(test)]
    const fn base(self) -> u8 {
        match self {
            QpType::Rc => 0x00,
            QpType::Uc => 0x20,
            QpType::Ud => 0x60,
        }
    }
}

/// Position of a packet inside its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MsgPos {
    /// First of several.
    First,
    /// Neither first nor last.
    Middle,
    /// Last of several.
    Last,
    /// The whole message (also every ACK, READ request and atomic).
    Only,
}

impl MsgPos {
    /// First or Only: starts a message.
    pub const fn is_start(self) -> bool {
        matches!(self, MsgPos::First | MsgPos::Only)
    }
    /// Last or Only: ends a message.
    pub const fn is_end(self) -> bool {
        matches!(self, MsgPos::Last | MsgPos::Only)
    }
}

/// What the packet does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// SEND (optionally with immediate or invalidate).
    Send,
    /// RDMA WRITE (optionally with immediate).
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// ACKNOWLEDGE (ACK or NAK).
    Ack,
    /// ATOMIC ACKNOWLEDGE.
    AtomicAck,
    /// CMP_SWP.
    CompareSwap,
    /// FETCH_ADD.
    FetchAdd,
}

/// A set of extension headers (after the BTH), as bit flags.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtSet(pub u8);

impl ExtSet {
    /// No extension headers.
    pub const NONE: ExtSet = ExtSet(0);
    /// Datagram ETH (8 bytes).
    pub const DETH: ExtSet = ExtSet(1 << 0);
    /// RDMA ETH (16 bytes).
    pub const RETH: ExtSet = ExtSet(1 << 1);
    /// Atomic ETH (28 bytes).
    pub const ATOMIC_ETH: ExtSet = ExtSet(1 << 2);
    /// ACK ETH (4 bytes).
    pub const AETH: ExtSet = ExtSet(1 << 3);
    /// Atomic ACK ETH (8 bytes).
    pub const ATOMIC_ACK: ExtSet = ExtSet(1 << 4);
    /// Immediate data (4 bytes).
    pub const IMMDT: ExtSet = ExtSet(1 << 5);
    /// Invalidate ETH (4 bytes).
    pub const IETH: ExtSet = ExtSet(1 << 6);

    /// Every header in wire order with its length. IBA order: DETH, RETH, AtomicETH, AETH,
    /// AtomicAckETH, ImmDt, IETH.
    pub const ORDER: [(ExtSet, usize); 7] = [
        (ExtSet::DETH, crate::deth::HEADER_LEN),
        (ExtSet::RETH, crate::reth::HEADER_LEN),
        (ExtSet::ATOMIC_ETH, crate::atomic_eth::HEADER_LEN),
        (ExtSet::AETH, crate::aeth::HEADER_LEN),
        (ExtSet::ATOMIC_ACK, crate::atomic_ack_eth::HEADER_LEN),
        (ExtSet::IMMDT, crate::immdt::HEADER_LEN),
        (ExtSet::IETH, crate::ieth::HEADER_LEN),
    ];

    /// Union.
    pub const fn with(self, o: ExtSet) -> ExtSet {
        ExtSet(self.0 | o.0)
    }
    /// Whether every header of `o` is in `self`.
    pub const fn contains(self, o: ExtSet) -> bool {
        self.0 & o.0 == o.0
    }
    /// Total length of the headers in the set.
    pub const fn wire_len(self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < ExtSet::ORDER.len() {
            if self.contains(ExtSet::ORDER[i].0) {
                n += ExtSet::ORDER[i].1;
            }
            i += 1;
        }
        n
    }
    /// Offset (from the end of the BTH) of header `h` inside a packet carrying `self`, or
    /// `None` if `h` is not in the set.
    pub const fn offset_of(self, h: ExtSet) -> Option<usize> {
        if !self.contains(h) {
            return None;
        }
        let mut n = 0;
        let mut i = 0;
        while i < ExtSet::ORDER.len() {
            if ExtSet::ORDER[i].0 .0 == h.0 {
                return Some(n);
            }
            if self.contains(ExtSet::ORDER[i].0) {
                n += ExtSet::ORDER[i].1;
            }
            i += 1;
        }
        None
    }
}

impl fmt::Debug for ExtSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 7] = ["DETH", "RETH", "AtomicETH", "AETH", "AtomicAckETH", "ImmDt", "IETH"];
        let mut first = true;
        f.write_str("ExtSet(")?;
        for (i, n) in NAMES.iter().enumerate() {
            if self.0 & (1 << i) != 0 {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(n)?;
                first = false;
            }
        }
        f.write_str(")")
    }
}

/// One row of the opcode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpInfo {
    /// IBA name, e.g. `RC_SEND_FIRST`.
    pub name: &'static str,
    /// Transport.
    pub qp: QpType,
    /// What the packet does.
    pub kind: OpKind,
    /// Position within the message.
    pub pos: MsgPos,
    /// Extension headers after the BTH.
    pub ext: ExtSet,
    /// Carries immediate data.
    pub imm: bool,
    /// Carries an IETH (SEND with invalidate).
    pub inv: bool,
    /// BTH + extension headers, precomputed from `ext` (every packet parsed or built asks).
    hlen: u8,
}

impl OpInfo {
    /// BTH + extension headers.
    #[inline]
    pub const fn header_len(&self) -> usize {
        self.hlen as usize
    }
    /// May carry payload (SEND, WRITE, READ response).
    pub const fn has_payload(&self) -> bool {
        matches!(self.kind, OpKind::Send | OpKind::Write | OpKind::ReadResponse)
    }
    /// A request (requester → responder); the others are responses (responder → requester).
    pub const fn is_request(&self) -> bool {
        matches!(
            self.kind,
            OpKind::Send | OpKind::Write | OpKind::ReadRequest | OpKind::CompareSwap | OpKind::FetchAdd
        )
    }
    /// A response (ACK, atomic ACK, READ response).
    pub const fn is_response(&self) -> bool {
        !self.is_request()
    }
    /// Consumes a receive WQE at the responder: every SEND packet, and the last/only
    /// packet of a WRITE with immediate (the WQE is consumed when the message completes).
    pub const fn needs_recv_wqe(&self) -> bool {
        match self.kind {
            OpKind::Send => true,
            OpKind::Write => self.imm,
            _ => false,
        }
    }
    /// Atomic request (CMP_SWP or FETCH_ADD).
    pub const fn is_atomic(&self) -> bool {
        matches!(self.kind, OpKind::CompareSwap | OpKind::FetchAdd)
    }
    /// Starts a message.
    pub const fn is_start(&self) -> bool {
        self.pos.is_start()
    }
    /// Ends a message.
    pub const fn is_end(&self) -> bool {
        self.pos.is_end()
    }
    /// FIRST/MIDDLE payload must be exactly the path MTU and carry no pad.
    pub const fn full_mtu_payload(&self) -> bool {
        self.has_payload() && matches!(self.pos, MsgPos::First | MsgPos::Middle)
    }
}

/// A BTH opcode (8 bits). Unknown values are representable; [`Opcode::info`] returns
/// `None` for them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

macro_rules! opcodes {
    ($( $c:ident = $v:expr => $qp:ident, $kind:ident, $pos:ident, [$($ext:ident)|*], $imm:expr, $inv:expr; )*) => {
        impl Opcode {
            $(
                #[doc = concat!("`", stringify!($c), "`")]
                pub const $c: Opcode = Opcode($v);
            )*
        }
        /// Every supported opcode, in numeric order.
        pub const ALL: &[Opcode] = &[$(Opcode::$c),*];
        const fn build_table() -> [Option<OpInfo>; 256] {
            let mut t: [Option<OpInfo>; 256] = [None; 256];
            $(
                let ext = ExtSet(0 $(| ExtSet::$ext.0)*);
                t[$v as usize] = Some(OpInfo {
                    name: stringify!($c),
                    qp: QpType::$qp,
                    kind: OpKind::$kind,
                    pos: MsgPos::$pos,
                    ext,
                    imm: $imm,
                    inv: $inv,
                    hlen: (crate::bth::HEADER_LEN + ext.wire_len()) as u8,
                });
            )*
            t
        }
    };
}

// name = value => qp, kind, position, [ext headers], imm, inv
opcodes! {
    RC_SEND_FIRST = 0x00 => Rc, Send, First, [], false, false;
    RC_SEND_MIDDLE = 0x01 => Rc, Send, Middle, [], false, false;
    RC_SEND_LAST = 0x02 => Rc, Send, Last, [], false, false;
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03 => Rc, Send, Last, [IMMDT], true, false;
    RC_SEND_ONLY = 0x04 => Rc, Send, Only, [], false, false;
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05 => Rc, Send, Only, [IMMDT], true, false;
    RC_RDMA_WRITE_FIRST = 0x06 => Rc, Write, First, [RETH], false, false;
    RC_RDMA_WRITE_MIDDLE = 0x07 => Rc, Write, Middle, [], false, false;
    RC_RDMA_WRITE_LAST = 0x08 => Rc, Write, Last, [], false, false;
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09 => Rc, Write, Last, [IMMDT], true, false;
    RC_RDMA_WRITE_ONLY = 0x0A => Rc, Write, Only, [RETH], false, false;
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B => Rc, Write, Only, [RETH | IMMDT], true, false;
    RC_RDMA_READ_REQUEST = 0x0C => Rc, ReadRequest, Only, [RETH], false, false;
    RC_RDMA_READ_RESPONSE_FIRST = 0x0D => Rc, ReadResponse, First, [AETH], false, false;
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0E => Rc, ReadResponse, Middle, [], false, false;
    RC_RDMA_READ_RESPONSE_LAST = 0x0F => Rc, ReadResponse, Last, [AETH], false, false;
    RC_RDMA_READ_RESPONSE_ONLY = 0x10 => Rc, ReadResponse, Only, [AETH], false, false;
    RC_ACKNOWLEDGE = 0x11 => Rc, Ack, Only, [AETH], false, false;
    RC_ATOMIC_ACKNOWLEDGE = 0x12 => Rc, AtomicAck, Only, [AETH | ATOMIC_ACK], false, false;
    RC_COMPARE_SWAP = 0x13 => Rc, CompareSwap, Only, [ATOMIC_ETH], false, false;
    RC_FETCH_ADD = 0x14 => Rc, FetchAdd, Only, [ATOMIC_ETH], false, false;
    RC_SEND_LAST_WITH_INVALIDATE = 0x16 => Rc, Send, Last, [IETH], false, true;
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17 => Rc, Send, Only, [IETH], false, true;
    UC_SEND_FIRST = 0x20 => Uc, Send, First, [], false, false;
    UC_SEND_MIDDLE = 0x21 => Uc, Send, Middle, [], false, false;
    UC_SEND_LAST = 0x22 => Uc, Send, Last, [], false, false;
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23 => Uc, Send, Last, [IMMDT], true, false;
    UC_SEND_ONLY = 0x24 => Uc, Send, Only, [], false, false;
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25 => Uc, Send, Only, [IMMDT], true, false;
    UC_RDMA_WRITE_FIRST = 0x26 => Uc, Write, First, [RETH], false, false;
    UC_RDMA_WRITE_MIDDLE = 0x27 => Uc, Write, Middle, [], false, false;
    UC_RDMA_WRITE_LAST = 0x28 => Uc, Write, Last, [], false, false;
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29 => Uc, Write, Last, [IMMDT], true, false;
    UC_RDMA_WRITE_ONLY = 0x2A => Uc, Write, Only, [RETH], false, false;
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2B => Uc, Write, Only, [RETH | IMMDT], true, false;
    UD_SEND_ONLY = 0x64 => Ud, Send, Only, [DETH], false, false;
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65 => Ud, Send, Only, [DETH | IMMDT], true, false;
}

static TABLE: [Option<OpInfo>; 256] = build_table();

impl Opcode {
    /// The table row, or `None` for an opcode we do not support.
    #[inline]
    pub fn info(self) -> Option<&'static OpInfo> {
        TABLE[self.0 as usize].as_ref()
    }
    /// The IBA name, or `"UNKNOWN"`.
    pub fn name(self) -> &'static str {
        self.info().map_or("UNKNOWN", |i| i.name)
    }
    /// BTH + extension header length, `None` if unknown.
    #[inline]
    pub fn header_len(self) -> Option<usize> {
        self.info().map(OpInfo::header_len)
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#04x})", self.name(), self.0)
    }
}
impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
impl From<u8> for Opcode {
    fn from(v: u8) -> Opcode {
        Opcode(v)
    }
}
impl From<Opcode> for u8 {
    fn from(v: Opcode) -> u8 {
        v.0
    }
}

/// The opcode for a packet of `kind` at `pos` on a `qp` QP, with immediate data (`imm`) or
/// invalidate (`inv`) on its last/only packet; `None` if no such opcode exists (e.g. a
/// UC READ, a UD WRITE, a multi-packet UD SEND, immediate on a FIRST packet). One
/// table-driven function for RC, UC and UD (rxe has two near-copies).
///
/// `imm`/`inv` describe the *message*: they select the `_WITH_*` variant only on
/// `Last`/`Only` and are ignored on `First`/`Middle`.
pub fn next_opcode(qp: QpType, kind: OpKind, pos: MsgPos, imm: bool, inv: bool) -> Option<Opcode> {
    let (imm, inv) = if pos.is_end() { (imm, inv) } else { (false, false) };
    NEXT[next_index(qp, kind, pos, imm, inv)]
}

/// [`next_opcode`]'s answers, computed at build time from the opcode table: every packet the
/// requester builds and every request the responder checks asks, and a scan of a QP type's 32
/// rows was 2 % of the lcore at 8 B messages.
static NEXT: [Option<Opcode>; NEXT_LEN] = build_next();

const NEXT_LEN: usize = 3 * 8 * 4 * 2 * 2;

const fn next_index(qp: QpType, kind: OpKind, pos: MsgPos, imm: bool, inv: bool) -> usize {
    (((qp as usize * 8 + kind as usize) * 4 + pos as usize) * 2 + imm as usize) * 2 + inv as usize
}

/// For each (QP type, kind, position, immediate, invalidate) the lowest opcode whose row says
/// so, as a scan of the table in opcode order finds it (immediate with invalidate: none).
const fn build_next() -> [Option<Opcode>; NEXT_LEN] {
    let t = build_table();
    let mut out = [None; NEXT_LEN];
    let mut v = 0;
    while v < 256 {
        if let Some(r) = &t[v] {
            let i = next_index(r.qp, r.kind, r.pos, r.imm, r.inv);
            if out[i].is_none() && !(r.imm && r.inv) {
                out[i] = Some(Opcode(v as u8));
            }
        }
        v += 1;
    }
    out
}

#[cfg(test)]
mod test {
    use super::*;

    /// The precomputed answers equal a scan of the table in opcode order, for every input.
    #[test]
    fn next_opcode_equals_a_table_scan() {
        for qp in [QpType::Rc, QpType::Uc, QpType::Ud] {
            for kind in [OpKind::Send, OpKind::Write, OpKind::ReadRequest, OpKind::ReadResponse, OpKind::Ack, OpKind::AtomicAck, OpKind::CompareSwap, OpKind::FetchAdd] {
                for pos in [MsgPos::First, MsgPos::Middle, MsgPos::Last, MsgPos::Only] {
                    for (imm, inv) in [(false, false), (true, false), (false, true), (true, true)] {
                        let (i2, v2) = if pos.is_end() { (imm, inv) } else { (false, false) };
                        let scan = if i2 && v2 {
                            None
                        } else {
                            (0..=255u8).map(Opcode).find(|o| {
                                o.info().is_some_and(|r| r.qp == qp && r.kind == kind && r.pos == pos && r.imm == i2 && r.inv == v2)
                            })
                        };
                        assert_eq!(next_opcode(qp, kind, pos, imm, inv), scan, "{qp:?} {kind:?} {pos:?} imm {imm} inv {inv}");
                    }
                }
            }
        }
    }

    #[test]
    fn all_256_opcodes() {
        let mut known = 0;
        for v in 0..=255u8 {
            let op = Opcode(v);
            match op.info() {
                None => assert_eq!(op.header_len(), None),
                Some(i) => {
                    known += 1;
                    assert_eq!(ALL.iter().filter(|o| **o == op).count(), 1);
                    assert_eq!(i.qp.base(), v & 0xE0);
                    assert!(i.name.starts_with(match i.qp {
                        QpType::Rc => "RC_",
                        QpType::Uc => "UC_",
                        QpType::Ud => "UD_",
                    }));
                    assert_eq!(i.imm, i.ext.contains(ExtSet::IMMDT));
                    assert_eq!(i.inv, i.ext.contains(ExtSet::IETH));
                    // The opcode is what next_opcode picks for its own row.
                    assert_eq!(next_opcode(i.qp, i.kind, i.pos, i.imm, i.inv), Some(op));
                }
            }
        }
        assert_eq!(known, ALL.len());
        assert_eq!(known, 23 + 12 + 2);
    }

    #[test]
    fn header_lengths_match_iba() {
        // BTH 12 + ext, as in IBA table 38 (and icrc_check.py).
        let want: &[(Opcode, usize)] = &[
            (Opcode::RC_SEND_FIRST, 12),
            (Opcode::RC_SEND_LAST_WITH_IMMEDIATE, 16),
            (Opcode::RC_RDMA_WRITE_FIRST, 28),
            (Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 32),
            (Opcode::RC_RDMA_READ_REQUEST, 28),
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 16),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 12),
            (Opcode::RC_ACKNOWLEDGE, 16),
            (Opcode::RC_ATOMIC_ACKNOWLEDGE, 24),
            (Opcode::RC_COMPARE_SWAP, 40),
            (Opcode::RC_FETCH_ADD, 40),
            (Opcode::RC_SEND_ONLY_WITH_INVALIDATE, 16),
            (Opcode::UD_SEND_ONLY, 20),
            (Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, 24),
        ];
        for (op, n) in want {
            assert_eq!(op.header_len(), Some(*n), "{op:?}");
        }
        // The precomputed length of every row is its extension set's.
        for v in 0..=255u8 {
            if let Some(i) = Opcode(v).info() {
                assert_eq!(i.header_len(), crate::bth::HEADER_LEN + i.ext.wire_len(), "{}", i.name);
            }
        }
        let e = ExtSet::RETH.with(ExtSet::IMMDT);
        assert_eq!(e.offset_of(ExtSet::IMMDT), Some(16));
        assert_eq!(ExtSet::AETH.with(ExtSet::ATOMIC_ACK).offset_of(ExtSet::ATOMIC_ACK), Some(4));
        assert_eq!(ExtSet::DETH.with(ExtSet::IMMDT).offset_of(ExtSet::IMMDT), Some(8));
    }

    #[test]
    fn f4_next_opcode_segments() {
        use MsgPos::*;
        assert_eq!(next_opcode(QpType::Rc, OpKind::Write, First, true, false), Some(Opcode::RC_RDMA_WRITE_FIRST));
        assert_eq!(next_opcode(QpType::Rc, OpKind::Write, Middle, false, false), Some(Opcode::RC_RDMA_WRITE_MIDDLE));
        assert_eq!(next_opcode(QpType::Rc, OpKind::Write, Last, true, false), Some(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE));
        assert_eq!(next_opcode(QpType::Uc, OpKind::Send, Only, false, true), None);
        assert_eq!(next_opcode(QpType::Rc, OpKind::Send, Last, false, true), Some(Opcode::RC_SEND_LAST_WITH_INVALIDATE));
        assert_eq!(next_opcode(QpType::Uc, OpKind::ReadRequest, Only, false, false), None);
        assert_eq!(next_opcode(QpType::Ud, OpKind::Send, First, false, false), None);
        assert_eq!(next_opcode(QpType::Ud, OpKind::Send, Only, true, false), Some(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE));
        assert_eq!(next_opcode(QpType::Rc, OpKind::ReadResponse, Middle, false, false), Some(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE));
        assert_eq!(next_opcode(QpType::Rc, OpKind::Send, Only, true, true), None);
    }
}
