//! pmrxe-service (being written).
