//! pmrxe-verbs shim (being written).
