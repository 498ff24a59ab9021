//! pmrxe-runtime (being written).
