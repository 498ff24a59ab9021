//! pmrxe-config (being written).
