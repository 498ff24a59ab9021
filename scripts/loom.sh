#!/usr/bin/env bash
# Runs the loom models: the MR table's invalidate-vs-copy protocols, counted lookups and the
# lcores' epoch readers (QSBR) (dataplane/mem/tests/loom.rs), and the shared-memory SPSC ring
# (dataplane/abi/tests/loom.rs).
#
#   scripts/loom.sh
#
# The models need `--cfg loom`, which changes every crate's fingerprint, so they build in their
# own target directory (target/loom) and never invalidate the main build. The models explore
# every interleaving (no preemption bound: each finishes in about a second on the 2-core CI
# machine), except the three-thread model of two lcores invalidating each other's MR, which
# runs with a preemption bound of 4 (about 3 s); LOOM_MAX_PREEMPTIONS=N sets a bound for every
# model. First build ≈ 4 min, then incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=${LOOM_TARGET_DIR:-$PWD/target/loom}
t0=$SECONDS
cargo test --release -p pmrxe-mem -p pmrxe-abi --test loom
echo "loom.sh: every model passed ($((SECONDS - t0)) s)"
