//! Errors: [`Error`] for the wire layer (parse/emit), [`CmError`] for consumer commands.

use core::fmt;

/// Result alias for the wire layer.
pub type Result<T> = core::result::Result<T, Error>;

/// Why a MAD (or a frame around it) could not be parsed or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// Shorter than the header or message.
    Truncated,
    /// MAD base version is not 1.
    BadBaseVersion(u8),
    /// Not the CM management class (0x07): hand it to another GSI agent or drop it.
    NotCm(u8),
    /// CM class version is not 2.
    BadClassVersion(u8),
    /// CM method other than Send (0x03).
    BadMethod(u8),
    /// A CM attribute this CM does not implement (LAP, APR, ClassPortInfo, ...).
    UnknownAttribute(u16),
    /// An enumerated field holds a value the spec does not define (MRA/REJ message code,
    /// REJ ARI length, SIDR additional-information length).
    BadField,
    /// Private data longer than the message's private-data field.
    PrivateDataTooLong,
    /// Not a UD SEND_ONLY to QP1 with the GSI Q_Key (frame level).
    NotGsi,
    /// The RoCEv2 frame itself is malformed.
    Frame(pmrxe_wire::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => f.write_str("truncated MAD"),
            Error::BadBaseVersion(v) => write!(f, "MAD base version {v}"),
            Error::NotCm(c) => write!(f, "management class {c:#04x} is not CM"),
            Error::BadClassVersion(v) => write!(f, "CM class version {v}"),
            Error::BadMethod(m) => write!(f, "CM method {m:#04x}"),
            Error::UnknownAttribute(a) => write!(f, "CM attribute {a:#06x} not supported"),
            Error::BadField => f.write_str("undefined value in an enumerated CM field"),
            Error::PrivateDataTooLong => f.write_str("private data longer than the message allows"),
            Error::NotGsi => f.write_str("not a GSI datagram (UD SEND_ONLY to QP1, Q_Key 0x80010000)"),
            Error::Frame(e) => write!(f, "frame: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<pmrxe_wire::Error> for Error {
    fn from(e: pmrxe_wire::Error) -> Error {
        Error::Frame(e)
    }
}

/// Why a consumer command was refused. Nothing was sent and no state changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmError {
    /// No connection with this id (never existed, finished, or destroyed).
    UnknownId,
    /// The command is not valid in the connection's current state.
    InvalidState,
    /// Private data longer than the IBTA limit for this message.
    PrivateDataTooLong,
    /// The connection/SIDR table or the listener table is full.
    TableFull,
    /// A listener for this service ID already exists.
    ListenerExists,
    /// No listener for this service ID.
    NoListener,
    /// A parameter is out of its field's range (retry count > 7, MTU code, ...).
    BadParam(&'static str),
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmError::UnknownId => f.write_str("unknown connection id"),
            CmError::InvalidState => f.write_str("invalid in the connection's state"),
            CmError::PrivateDataTooLong => f.write_str("private data too long"),
            CmError::TableFull => f.write_str("CM table full"),
            CmError::ListenerExists => f.write_str("service ID already listened on"),
            CmError::NoListener => f.write_str("no listener for this service ID"),
            CmError::BadParam(p) => write!(f, "parameter out of range: {p}"),
        }
    }
}

impl std::error::Error for CmError {}
