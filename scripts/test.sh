#!/usr/bin/env bash
# Sets up, builds and runs every test of pmrxe: unit, property, conformance (A1-F8 on the
# simulated wire), loom-free concurrency stress, real DPDK ports, and integration tests that
# start the real service and drive unmodified Debian verbs binaries through the shim.
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export CARGO_TERM_COLOR=never
# The release build produces target/release/pmrxe and target/release/libpmrxe_verbs.so, which
# the integration tests start; tests run optimised too (the soak and stress tests are CPU-bound).
cargo build --release --workspace --all-targets
cargo test --release --workspace "$@"
# rdma-core's own verbs test suite (pyverbs, unmodified), one process per test and then whole,
# against a private service; skipped with a message when the suite is not next to the project.
./scripts/rdma-core-tests.sh "${RDMA_CORE_TESTS:-../shared/conformance/rdma-core-v44}"
# Short bounded fuzzing (15 s per target, libFuzzer + ASan; skipped without a nightly toolchain).
./scripts/fuzz.sh --ci
echo "test.sh: all tests passed"
