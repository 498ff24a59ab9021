//! Build script for `pmrxe-verbs`: bindgen over the system `infiniband/verbs.h` and `rdma/rdma_cma.h` +
//! `rdma/rdma_verbs.h` (rdma-core 44) for the ABI structs the shim hands to applications.
//!
//! Types only: the shim *defines* the `ibv_*` functions, so no function declarations are
//! generated (they would clash with our `#[no_mangle]` definitions). bindgen's layout
//! assertions are kept on, and `tests/layout.rs` pins the sizes measured on the target
//! (reference/probe-data/sizes.txt).
use std::env;
use std::path::PathBuf;

fn main() {
    // `VERBS_INCLUDE_DIR` overrides the header location (cross builds, vendored headers).
    println!("cargo:rerun-if-env-changed=VERBS_INCLUDE_DIR");
    println!("cargo:rerun-if-changed=src/verbs_wrapper.h");
    let mut b = bindgen::Builder::default()
        .header("src/verbs_wrapper.h")
        // Re-run when the included headers change.
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        // Only the verbs ABI: structs, unions and enums (dependencies such as pthread types
        // come in transitively).
        .allowlist_type("ibv_.*")
        .allowlist_type("verbs_.*")
        .allowlist_type("_ibv_.*")
        .allowlist_var("IBV_.*")
        // librdmacm (rdma_cma.h, rdma_verbs.h): its structs and constants, no functions (the
        // shim defines rdma_* itself; the rdma_verbs.h inlines stay the application's).
        .allowlist_type("rdma_.*")
        .allowlist_var("RDMA_.*")
        .allowlist_var("RAI_.*")
        .allowlist_type("sockaddr_in6?")
        .allowlist_type("sockaddr_storage")
        // Enum values as plain constants named like the C enumerators (`IBV_WR_SEND`), so
        // values coming from C are never transmuted into a Rust enum.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        // The shim builds these structs field by field from zeroed memory.
        .derive_default(true)
        .derive_debug(false)
        // Keep layout tests (compile-time asserts) for every generated struct.
        .layout_tests(true);
    if let Ok(dir) = env::var("VERBS_INCLUDE_DIR") {
        b = b.clang_arg(format!("-I{dir}"));
    }
    let bindings = b.generate().expect("pmrxe-verbs: bindgen failed on infiniband/verbs.h / rdma/rdma_cma.h (install libibverbs-dev librdmacm-dev)");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    bindings.write_to_file(out.join("verbs.rs")).expect("write bindings");
}
