#!/usr/bin/env bash
# Runs Miri (undefined-behaviour checker, nightly) over the shared-memory ring and the wire
# parsers:
#   * pmrxe-abi `ring::` unit tests: push/pop/wrap/full, retain, corrupt indices, attach checks,
#     and two real threads moving 2 000 items through a 16-slot ring (Miri checks the atomics'
#     data-race freedom and every raw-pointer access);
#   * pmrxe-wire: every header's unit tests, tests/frames.rs (frame build/parse, ICRC, garbled
#     and truncated frames; proptest at PROPTEST_CASES=4) and the fuzz seed corpus through
#     `parse_frame` (tests/fuzz_corpus.rs; reads files, hence -Zmiri-disable-isolation).
# Not under Miri: the control protocol tests (SOCK_SEQPACKET and SCM_RIGHTS are not emulated)
# and anything that maps memfds or calls DPDK.
#
#   scripts/miri.sh [--ci]
#
# --ci: without a nightly toolchain with the miri and rust-src components this prints
# "skipped: no nightly miri" and succeeds (the project's scripts do not install toolchains;
# `rustup component add --toolchain nightly miri rust-src` does). Builds go to target/miri.
set -euo pipefail
cd "$(dirname "$0")/.."
ci=0
[ "${1:-}" = --ci ] && ci=1
if ! cargo +nightly miri --version >/dev/null 2>&1 \
   || ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
  if [ $ci = 1 ]; then echo "miri.sh: skipped: no nightly miri (rustup component add --toolchain nightly miri rust-src)"; exit 0; fi
  echo "miri.sh: needs nightly with miri and rust-src: rustup component add --toolchain nightly miri rust-src" >&2; exit 1
fi
t0=$SECONDS
cargo +nightly miri test -p pmrxe-abi --lib ring::
cargo +nightly miri test -p pmrxe-wire --lib
MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-disable-isolation" PROPTEST_CASES=${PROPTEST_CASES:-4} \
  cargo +nightly miri test -p pmrxe-wire --test frames --test fuzz_corpus
echo "miri.sh: no undefined behaviour found ($((SECONDS - t0)) s)"
