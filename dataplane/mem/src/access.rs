//! Access flags, keys and protection-domain handles.

use core::fmt;

/// A protection domain, as numbered by the service.
pub type PdHandle = u32;

/// Access rights, with the `IBV_ACCESS_*` bit values of libibverbs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u32);

impl Access {
    /// No rights beyond local read (which every MR has).
    pub const EMPTY: Access = Access(0);
    /// `IBV_ACCESS_LOCAL_WRITE`.
    pub const LOCAL_WRITE: Access = Access(1);
    /// `IBV_ACCESS_REMOTE_WRITE`.
    pub const REMOTE_WRITE: Access = Access(2);
    /// `IBV_ACCESS_REMOTE_READ`.
    pub const REMOTE_READ: Access = Access(4);
    /// `IBV_ACCESS_REMOTE_ATOMIC`.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// `IBV_ACCESS_MW_BIND`.
    pub const MW_BIND: Access = Access(16);
    /// `IBV_ACCESS_ZERO_BASED`.
    pub const ZERO_BASED: Access = Access(32);
    /// Every bit this crate knows.
    pub const ALL: Access = Access(63);

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Keep only the known bits.
    pub const fn from_bits_truncate(bits: u32) -> Access {
        Access(bits & Self::ALL.0)
    }
    /// `Some` only if every bit is known.
    pub const fn from_bits(bits: u32) -> Option<Access> {
        if bits & !Self::ALL.0 == 0 {
            Some(Access(bits))
        } else {
            None
        }
    }
    /// All bits of `other` are set in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    /// Any bit of `other` is set in `self`.
    pub const fn intersects(self, other: Access) -> bool {
        self.0 & other.0 != 0
    }
    /// Bitwise or.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
    /// Bitwise and.
    pub const fn intersection(self, other: Access) -> Access {
        Access(self.0 & other.0)
    }
    /// No bits set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// IBTA C10-74 (and `ib_check_mr_access`): Remote Write or Remote Atomic needs Local Write.
    pub const fn combo_ok(self) -> bool {
        !self.intersects(Access(Self::REMOTE_WRITE.0 | Self::REMOTE_ATOMIC.0))
            || self.contains(Self::LOCAL_WRITE)
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}
impl core::ops::BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}
impl core::ops::BitAnd for Access {
    type Output = Access;
    fn bitand(self, rhs: Access) -> Access {
        self.intersection(rhs)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 6] = [
            "LOCAL_WRITE",
            "REMOTE_WRITE",
            "REMOTE_READ",
            "REMOTE_ATOMIC",
            "MW_BIND",
            "ZERO_BASED",
        ];
        write!(f, "Access(")?;
        let mut first = true;
        for (i, n) in NAMES.iter().enumerate() {
            if self.0 & (1 << i) != 0 {
                if !first {
                    write!(f, "|")?;
                }
                write!(f, "{n}")?;
                first = false;
            }
        }
        let unknown = self.0 & !Self::ALL.0;
        if unknown != 0 {
            write!(f, "{}{unknown:#x}", if first { "" } else { "|" })?;
        } else if first {
            write!(f, "0")?;
        }
        write!(f, ")")
    }
}

/// An lkey/rkey: upper 24 bits are the table index (driver-owned), the low 8 bits the
/// consumer-owned key byte (§2.4). MR and MW indexes are disjoint ranges of one space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Key(pub u32);

impl Key {
    /// Build from an index (< 2^24) and a key byte.
    pub const fn new(index: u32, key_byte: u8) -> Key {
        Key((index << 8) | key_byte as u32)
    }
    /// The 24-bit table index.
    pub const fn index(self) -> u32 {
        self.0 >> 8
    }
    /// The consumer key byte.
    pub const fn key_byte(self) -> u8 {
        (self.0 & 0xff) as u8
    }
    /// `ib_update_fast_reg_key`: same index, new key byte.
    pub const fn with_key_byte(self, b: u8) -> Key {
        Key((self.0 & !0xff) | b as u32)
    }
    /// `ib_inc_rkey`: key byte + 1 modulo 256.
    pub const fn inc(self) -> Key {
        self.with_key_byte(self.key_byte().wrapping_add(1))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Key({:#x}: idx {} byte {:#04x})",
            self.0,
            self.index(),
            self.key_byte()
        )
    }
}
