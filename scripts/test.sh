#!/usr/bin/env bash
# Sets up, builds and runs every test of pmrxe: clippy (-D warnings), unit, property,
# conformance (A1-F8 on the simulated wire), concurrency stress, real DPDK ports, integration
# tests that start the real service and drive unmodified Debian verbs binaries through the
# shim, the loom models, Miri over the shared ring and the wire parsers, rdma-core's pyverbs
# suite and short fuzzing. About 20 minutes on the 2-core CI machine.
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export CARGO_TERM_COLOR=never
t0=$SECONDS
step() { echo "test.sh: $1 done ($((SECONDS - t0)) s)"; }
# Lints first (fast failure): every crate, every target, warnings are errors.
cargo clippy --workspace --all-targets -- -D warnings
step clippy
# The release build produces target/release/pmrxe and target/release/libpmrxe_verbs.so, which
# the integration tests start; tests run optimised too (the soak and stress tests are CPU-bound).
cargo build --release --workspace --all-targets
cargo test --release --workspace "$@"
step "cargo test"
# Loom models of the MR table and the shared ring (`--cfg loom`, own target dir target/loom).
./scripts/loom.sh
step loom
# Miri over the shared ring and the wire parsers (skipped with a message without nightly miri).
./scripts/miri.sh --ci
step miri
# rdma-core's own verbs test suite (pyverbs, unmodified), one process per test and then whole,
# against a private service; skipped with a message when the suite is not next to the project.
./scripts/rdma-core-tests.sh "${RDMA_CORE_TESTS:-../shared/conformance/rdma-core-v44}"
step rdma-core
# Short bounded fuzzing (15 s per target, libFuzzer + ASan; skipped without a nightly toolchain).
./scripts/fuzz.sh --ci
step fuzz
echo "test.sh: all tests passed ($((SECONDS - t0)) s)"
