//! pmrxe's port layer: a safe wrapper over DPDK (EAL, mempools, mbufs, ethdev ports) and the
//! [`Port`]/[`PacketBuf`] traits the runtime and transport tests are written against.
//!
//! Layers, bottom up:
//! - [`eal`]: [`Eal::init`] from an [`EalConfig`] (once per process), thread registration,
//!   cleanup on the last handle.
//! - [`Mempool`] and the owned [`Mbuf`].
//! - [`EthPort`]: a configured, started port; [`open_ports`] builds every port of a
//!   [`pmrxe_config::Config`] (ring pairs in-process, vdevs, PCI devices).
//! - [`Port`]: allocation-free bursts of owned buffers, implemented by [`EthPort`], the
//!   in-memory [`SimPort`] pair and the seeded fault injector [`FaultyPort`].
//! - [`port_test`]: the frame-verifying smoke test behind `pmrxe port-test`.
//!
//! Global state: only `eal::EAL_STATE` (EAL is a process singleton) and two name counters
//! (DPDK object names must be unique per process).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, clippy::undocumented_unsafe_blocks)]

pub mod eal;
mod error;
mod ethdev;
mod faulty;
mod mbuf;
mod mempool;
pub mod port_test;
mod sim;
mod traits;

pub use eal::{Eal, EalConfig, LcoreGuard};
pub use error::PortError;
pub use ethdev::{devargs_name, find_port, open_ports, port_name, EthPort, LinkStatus, PortSettings, PortStats};
pub use faulty::{FaultCounters, FaultStats, FaultyPort, Faults};
pub use mbuf::Mbuf;
pub use mempool::{Mempool, MBUF_HEADROOM};
pub use port_test::PortTestReport;
pub use sim::{SimBuf, SimPort};
pub use traits::{ArrayVec, Burst, MacAddr, PacketBuf, Port, RxWake, BURST};
