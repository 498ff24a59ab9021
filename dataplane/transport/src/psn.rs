//! PSN arithmetic: the engine uses `pmrxe_wire::Psn` (24-bit, wrapping, signed distance).
pub use pmrxe_wire::Psn;
