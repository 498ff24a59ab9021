//! pmrxe-wire (being written).
