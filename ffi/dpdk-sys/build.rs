//! Build script for `pmrxe-dpdk-sys`.
//!
//! 1. Finds the system DPDK through pkg-config (`libdpdk`, shared linking; PMDs are
//!    dlopen'ed by EAL from its compiled-in plugin dir, so no `--whole-archive` is needed,
//!    reference/PLATFORM.md §3 pitfall 3).
//! 2. Runs bindgen over `csrc/wrapper.h` with a narrow allowlist (build time matters on 2 vCPUs).
//! 3. Compiles `csrc/shim.c`, out-of-line wrappers for DPDK's static-inline fast path, with
//!    exactly the same cflags as bindgen saw.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc/wrapper.h");
    println!("cargo:rerun-if-changed=csrc/shim.h");
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    // Shared linking: emits `cargo:rustc-link-lib=rte_*` for the libs rustc keeps NEEDED.
    let lib = match pkg_config::Config::new()
        .atleast_version("22.11")
        .cargo_metadata(true)
        .probe("libdpdk")
    {
        Ok(lib) => lib,
        Err(e) => {
            // A one-line actionable error instead of a wall of bindgen/clang noise.
            panic!("pmrxe-dpdk-sys: libdpdk >= 22.11 not found via pkg-config ({e}); run scripts/setup.sh (installs libdpdk-dev)");
        }
    };

    // `rte_eth_from_rings` lives in the net_ring PMD library, which pkg-config's --libs
    // does not list (PMDs are normally only dlopen'ed). The linked .so is the same file EAL
    // autoloads from pmds-23.0 (a symlink), so glibc maps it once.
    println!("cargo:rustc-link-lib=dylib=rte_net_ring");

    // The raw cflags tokens, in order. `-include rte_config.h` must stay a pair, and
    // `-march=corei7` is required by the inline SSE code in the headers.
    let cflags = pkg_config::get_variable("libdpdk", "cflags").ok();
    let cflag_tokens: Vec<String> = match std::process::Command::new("pkg-config")
        .args(["--cflags", "libdpdk"])
        .output()
    {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
        _ => {
            // Fall back to the include paths pkg-config-rs parsed (loses -include/-march).
            let _ = cflags;
            lib.include_paths.iter().map(|p| format!("-I{}", p.display())).collect()
        }
    };

    let bindings = bindgen::Builder::default()
        .header("csrc/wrapper.h")
        // Same flags for the parser as for the C shim.
        .clang_args(&cflag_tokens)
        // Re-run the build script when any included header changes.
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        // Only the subsystems pmrxe-port uses: EAL, lcore/thread registration, cycles, logs,
        // ethdev, ether, mbuf, mempool, ring, net_ring's rte_eth_from_rings, dev/vdev hotplug.
        // Types are pulled in transitively from these signatures.
        .allowlist_function("rte_eal_.*")
        .allowlist_function("rte_eth_.*")
        .allowlist_function("rte_pktmbuf_pool_create.*")
        .allowlist_function("rte_mempool_(free|lookup|avail_count|in_use_count|dump)")
        .allowlist_function("rte_ring_(create|free|lookup|count|dump)")
        .allowlist_function("rte_lcore_.*")
        .allowlist_function("rte_thread_(register|unregister)")
        .allowlist_function("rte_socket_id")
        .allowlist_function("rte_strerror")
        .allowlist_function("rte_log_set_global_level")
        .allowlist_function("rte_dev_(probe|remove)")
        .allowlist_function("rte_vdev_(init|uninit)")
        .allowlist_function("rte_get_main_lcore")
        // Our own out-of-line wrappers (csrc/shim.h): their decls come from bindgen too, so
        // Rust and C can never disagree on a signature.
        .allowlist_function("pmrxe_.*")
        // Constants: flags and limits of the allowlisted subsystems.
        .allowlist_var("RTE_ETH_.*")
        .allowlist_var("RTE_MBUF_.*")
        .allowlist_var("RTE_PKTMBUF_.*")
        .allowlist_var("RTE_MAX_.*")
        .allowlist_var("RTE_RING_.*")
        .allowlist_var("RING_F_.*")
        .allowlist_var("RTE_ETHER_.*")
        .allowlist_var("RTE_LOG_.*")
        .allowlist_var("SOCKET_ID_ANY")
        .allowlist_type("rte_mbuf")
        .allowlist_type("rte_eth_.*")
        .allowlist_type("rte_ether_addr")
        // DPDK 22.11 flow headers: a packed struct containing a repr(align) type (E0588) and a
        // packed bitfield struct that cannot derive Debug (E0277). Opaque blobs are enough.
        .opaque_type("rte_l2tpv2_combined_msg_hdr")
        .opaque_type("rte_gtp_psc_generic_hdr")
        // glibc's max_align_t is a u128-aligned struct bindgen cannot lay out portably.
        .blocklist_type("max_align_t")
        // Zero-initialised conf structs (`rte_eth_conf`, `rte_eth_rxconf`) are the DPDK idiom.
        .derive_default(true)
        // Compile-time size/align/offset asserts against the C layout.
        .layout_tests(true)
        // Enums as plain integer constants: C may hand us values Rust enums cannot hold.
        .default_enum_style(bindgen::EnumVariation::Consts)
        // Keep `size_t` as `usize` (the default) and emit no comments: faster, smaller output.
        .generate_comments(false)
        // Generated `unsafe fn` bodies use explicit `unsafe {}` blocks, so the crate can keep
        // the workspace-wide `deny(unsafe_op_in_unsafe_fn)`.
        .wrap_unsafe_ops(true)
        .generate()
        .unwrap_or_else(|e| panic!("pmrxe-dpdk-sys: bindgen failed: {e}"));

    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .unwrap_or_else(|e| panic!("pmrxe-dpdk-sys: writing bindings.rs failed: {e}"));

    // The C shim, with the same flags. `-include` needs its argument as a separate token.
    let mut build = cc::Build::new();
    build.file("csrc/shim.c").include("csrc").opt_level(2);
    for tok in &cflag_tokens {
        build.flag(tok);
    }
    // Experimental-API warnings from inline headers are noise for a pure forwarder.
    build.flag_if_supported("-Wno-deprecated-declarations");
    build.compile("pmrxe_dpdk_shim");
}
