//! pmrxe-port (being written).
