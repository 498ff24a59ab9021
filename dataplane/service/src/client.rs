//! A minimal control-socket client (`pmrxe stats`, `pmrxe capture`, tests): the client core's
//! raw [`Channel`](pmrxe_abi::client::Channel) (no `Hello`; `Response::Err` comes back as a
//! reply, not an error).
pub use pmrxe_abi::client::Channel as Client;
