//! pmrxe-abi (being written).
