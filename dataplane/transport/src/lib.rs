//! pmrxe-transport (being written).
