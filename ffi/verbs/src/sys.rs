//! bindgen output for rdma-core 44 `verbs.h` (types only).
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, dead_code, missing_docs)]
#![allow(clippy::all, clippy::undocumented_unsafe_blocks)]
include!(concat!(env!("OUT_DIR"), "/verbs.rs"));
