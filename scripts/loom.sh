#!/usr/bin/env bash
# Runs the loom models: the MR table's invalidate-vs-copy protocol (dataplane/mem/tests/loom.rs)
# and the shared-memory SPSC ring (dataplane/abi/tests/loom.rs).
#
#   scripts/loom.sh
#
# The models need `--cfg loom`, which changes every crate's fingerprint, so they build in their
# own target directory (target/loom) and never invalidate the main build. The models explore
# every interleaving (no preemption bound: each finishes in about a second on the 2-core CI
# machine); set LOOM_MAX_PREEMPTIONS=N to bound a larger model. First build ≈ 4 min, then
# incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=${LOOM_TARGET_DIR:-$PWD/target/loom}
t0=$SECONDS
cargo test --release -p pmrxe-mem -p pmrxe-abi --test loom
echo "loom.sh: every model passed ($((SECONDS - t0)) s)"
