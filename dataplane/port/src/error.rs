//! [`PortError`]: failures of the port layer, each with enough context to act on.

use pmrxe_config::ConfigError;

/// An error from EAL, a mempool, a port or the port test.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// EAL was already initialised in this process (it can be initialised once per process,
    /// and never again after cleanup).
    #[error("DPDK EAL is already initialised in this process (EAL can initialise only once per process; run each DPDK test in its own process)")]
    EalAlreadyInitialized,
    /// `rte_eal_init` failed.
    #[error("rte_eal_init failed: {reason} (rte_errno {errno}); args: {args}")]
    EalInit {
        /// `rte_strerror(rte_errno)`.
        reason: String,
        /// `rte_errno`.
        errno: i32,
        /// The EAL argument vector, space separated.
        args: String,
    },
    /// A DPDK call failed.
    #[error("{call} failed: {reason} (errno {errno})")]
    Dpdk {
        /// Which call, with its main argument (`rte_eth_dev_configure(port 0)`).
        call: String,
        /// `rte_strerror` of the error.
        reason: String,
        /// The positive errno.
        errno: i32,
    },
    /// A port named in the config or by the caller does not exist.
    #[error("no DPDK port named {0:?} (known ports: {1})")]
    NoSuchPort(String, String),
    /// The configuration cannot be used for this operation.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A string argument contained a NUL byte.
    #[error("argument {0:?} contains a NUL byte")]
    Nul(String),
    /// The thread is already registered with EAL, or registration failed.
    #[error("rte_thread_register failed: {0}")]
    ThreadRegister(String),
    /// The port test saw wrong or missing frames.
    #[error("port test failed: {0}")]
    Verify(String),
    /// A port test made no progress for too long (link down, peer gone).
    #[error("port test timed out: {0}")]
    Timeout(String),
    /// Other I/O (runtime directory, helper files).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl PortError {
    /// Builds [`PortError::Dpdk`] from a negative DPDK return code (or a positive errno).
    pub fn dpdk(call: impl Into<String>, rc: i32) -> PortError {
        let errno = rc.abs();
        PortError::Dpdk { call: call.into(), reason: crate::eal::strerror(errno), errno }
    }

    /// Builds [`PortError::Dpdk`] from the current `rte_errno` (for calls returning NULL).
    pub fn from_rte_errno(call: impl Into<String>) -> PortError {
        PortError::dpdk(call, crate::eal::rte_errno())
    }
}
