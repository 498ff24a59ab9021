//! Errors of the memory layer. Mapping to work-completion statuses or NAK codes belongs to the
//! transport (it knows whether the access was local, remote, a bind or a local op).

/// Why a memory operation failed. Each variant is one precise cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum MemError {
    /// The key's index names no allocated MR or MW.
    #[error("no MR/MW with this key index")]
    NoSuchKey,
    /// The object exists but the full 32-bit key differs (stale key byte, or wrong index for REG_MR).
    #[error("key mismatch")]
    KeyMismatch,
    /// The object is not VALID (FREE, being torn down, or an unbound window).
    #[error("MR/MW not valid")]
    NotValid,
    /// REG_MR / type-2 bind on an object that is not FREE (A3).
    #[error("MR/MW not free")]
    NotFree,
    /// Protection domain of the QP/caller differs from the object's.
    #[error("protection domain mismatch")]
    PdMismatch,
    /// Requested access is not a subset of the granted access.
    #[error("access denied")]
    AccessDenied,
    /// The range is not inside the MR/MW/region.
    #[error("range out of bounds")]
    OutOfRange,
    /// Address arithmetic wrapped 2^64 (va + len).
    #[error("address arithmetic overflow")]
    Overflow,
    /// Operation not allowed on this kind of object (e.g. LOCAL_INV of a user MR, invalidate of a type-1 MW).
    #[error("wrong MR/MW type for this operation")]
    WrongMrType,
    /// Refused while memory windows are bound to the MR.
    #[error("memory windows are bound to the MR")]
    MwBound,
    /// A type-2 MW used from a QP other than the one it was bound on.
    #[error("type-2 MW used from another QP")]
    QpMismatch,
    /// A length that must be non-zero is zero.
    #[error("zero length")]
    ZeroLength,
    /// Remote Write / Remote Atomic without Local Write (C10-74), or zero-based where not allowed.
    #[error("invalid access flag combination")]
    BadAccessCombo,
    /// More pages than the MR's `max_num_sg` (or the device limit).
    #[error("too many pages")]
    TooManyPages,
    /// Page size is not a supported power of two.
    #[error("unsupported page size")]
    BadPageSize,
    /// Misaligned address (atomics need 8 bytes; an iova rewrite must keep the page offset).
    #[error("bad alignment")]
    BadAlignment,
    /// No free MR/MW slot or page-list space.
    #[error("table full")]
    TableFull,
    /// The MR has no mapping (alloc_mr without any map_mr_sg before REG_MR).
    #[error("MR has no page list")]
    NotMapped,
    /// An argument outside its documented domain.
    #[error("invalid argument")]
    InvalidArgument,
}
