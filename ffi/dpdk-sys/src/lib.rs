//! pmrxe-dpdk-sys (being written).
