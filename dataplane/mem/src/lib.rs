//! pmrxe-mem (being written).
