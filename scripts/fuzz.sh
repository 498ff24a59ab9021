#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for a bounded time (libFuzzer + AddressSanitizer).
#
#   scripts/fuzz.sh [--ci] [--seconds N] [TARGET...]
#
# Default: every target (parse_frame, ctrl_decode, responder, crc) for 30 s each. --ci: 15 s
# each (60 s in all). Without a nightly toolchain (scripts/setup.sh checks it) the script FAILS,
# unless PMRXE_CI_ALLOW_SKIP names the step `fuzz` (scripts/lib/ci.sh). Uses `cargo fuzz`
# when cargo-fuzz is installed; otherwise builds the same instrumented binaries with
# `cargo +nightly build` and sanitizer-coverage flags (no network beyond crates.io).
# New corpus entries go to a scratch directory (the committed seed corpora stay small);
# crashes are written to fuzz/artifacts/TARGET/ and fail the script.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=30 ci=0 targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --ci) ci=1; secs=15 ;;
    --seconds) secs=$2; shift ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) targets+=("$1") ;;
  esac
  shift
done
[ ${#targets[@]} -gt 0 ] || targets=(parse_frame ctrl_decode responder crc)
. scripts/lib/ci.sh
if ! cargo +nightly --version >/dev/null 2>&1; then
  ci_cannot_run fuzz "no nightly toolchain (libFuzzer's instrumentation and ASan need -Z flags)" \
    "rustup toolchain install nightly (or run scripts/setup.sh)"
fi
triple=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR=${FUZZ_TARGET_DIR:-$PWD/fuzz/target}
scratch=$(mktemp -d /tmp/pmrxe-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Zsanitizer=address -Cdebug-assertions -Coverflow-checks"
if cargo fuzz --version >/dev/null 2>&1; then
  runner=cargo-fuzz
else
  runner=direct
  echo "fuzz.sh: building ${targets[*]} (instrumented, release, $triple)"
  (cd fuzz && RUSTFLAGS="$flags" cargo +nightly build --release --target "$triple" $(printf -- '--bin %s ' "${targets[@]}") 2>&1 | tail -n 3)
fi
status=0
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t" "fuzz/artifacts/$t"
  args=(-max_total_time="$secs" -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$t/")
  echo "fuzz.sh: $t for ${secs}s"
  if [ $runner = cargo-fuzz ]; then
    cmd=(cargo +nightly fuzz run --fuzz-dir fuzz "$t" "$scratch/$t" "fuzz/corpus/$t" -- "${args[@]}")
  else
    cmd=("$CARGO_TARGET_DIR/$triple/release/$t" "${args[@]}" "$scratch/$t" "fuzz/corpus/$t")
  fi
  if "${cmd[@]}" > "$scratch/$t.log" 2>&1; then
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$scratch/$t.log" | tr '\n' ' '; echo
  else
    status=1
    echo "fuzz.sh: $t FAILED; last lines:" >&2
    tail -n 40 "$scratch/$t.log" >&2
  fi
done
rmdir fuzz/artifacts/* fuzz/artifacts 2>/dev/null || true
[ $status = 0 ] && echo "fuzz.sh: all targets clean" || exit $status
