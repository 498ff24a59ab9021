#!/usr/bin/env bash
# Runs Miri (undefined-behaviour checker, nightly) over the unsafe code that runs without the OS:
#   * abi: pmrxe-abi's unit tests — `ring::` (push/pop/wrap/full, retain, corrupt indices, attach
#     checks, two real threads moving 2 000 items through a 16-slot ring: Miri checks the
#     atomics' data-race freedom and every raw-pointer access), the client core's pure parts
#     (errno mapping, empty-mapping refusal), the shared-memory layout (`layout::`: SGE and CQE
#     word accessors, doorbell rows), the QP state table (pmrxe-qp-table) and control-message decoding of
#     garbage; not the tests over sockets (SOCK_SEQPACKET and SCM_RIGHTS are not emulated);
#   * wire (not in the default set, and so not in CI: `scripts/miri.sh wire`): tests/frames.rs
#     (frame build/parse, ICRC, garbled and truncated frames) and the fuzz seed corpus through
#     `parse_frame` (tests/fuzz_corpus.rs). The crate has no unsafe code (`forbid(unsafe_code)`):
#     what Miri would check there is the CRC kernels it calls, which the crc part below covers
#     through their own entry points, so the ~90 s it added to every CI run bought nothing
#     (dropped 2026-12-07 to bring the run towards 30 minutes). Its unit tests (over 9 minutes
#     under Miri) are `scripts/miri.sh wire-lib`;
#   * mem: pmrxe-mem's unit tests and tests/crc.rs (copy-in/copy-out with the fused CRC through
#     scrambled pages: the raw-pointer `Region` accessors, `MrRef` walks, `copy_and_crc_raw`),
#     with -Zmiri-permissive-provenance (an MR's addresses are integers turned back into
#     pointers by design); not tests/semantics.rs nor tests/translation.rs (each over 15
#     minutes under Miri on the CI machine);
#   * crc: pmrxe-crc's short-copy and check-value unit tests and the pointer-level tests of
#     tests/props.rs (raw entry points, free functions, unequal lengths, the proptests of every
#     kernel against crc32fast and of the masked update). Every part is built with
#     `-Ctarget-feature=+pclmulqdq,+sse4.1,+ssse3`, so the runtime dispatch (under Miri
#     `is_x86_feature_detected!` reports the compile-time features) offers both the portable
#     slicing-by-8 kernel and the PCLMUL kernel, and the tests run both (Miri emulates the
#     intrinsics). Not the AVX-512 kernel (no Miri support for its 512-bit VPCLMULQDQ) nor
#     the length sweeps (minutes each under Miri);
#   * verbs: the shim's pure parts (pmrxe-verbs unit tests that make no system call): the
#     per-queue spinlock from four threads through its guard and its raw wr_start..wr_complete
#     span, WR -> WQE conversion (post::, incl. filling a used ring slot in place and inline
#     copies from integer addresses, hence -Zmiri-permissive-provenance), CQE conversion, the QP
#     state table checks, strings, pmrxedv's SG shape, CM event/sockaddr layouts (~15 s run);
#     not the tests that map memfds, read /proc or talk to a service.
# Proptest runs PROPTEST_CASES=4 cases (default) per property; isolation is off
# (-Zmiri-disable-isolation: proptest reads the clock and the working directory, the corpus
# test reads files). Not under Miri: the control protocol (SOCK_SEQPACKET and SCM_RIGHTS are not
# emulated) and anything that maps memfds or calls DPDK. Each part prints its time.
#
#   scripts/miri.sh [--ci] [PART...]      PART: abi mem crc verbs (default), wire, wire-lib
#
# Without a nightly toolchain with the miri and rust-src components the script FAILS (scripts/
# setup.sh installs them), unless PMRXE_CI_ALLOW_SKIP names the step `miri` (scripts/lib/ci.sh).
# Builds go to target/miri.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/ci.sh
parts=()
for a in "$@"; do
  case $a in
    --ci) ;;
    abi|wire|wire-lib|mem|crc|verbs) parts+=("$a") ;;
    *) echo "usage: scripts/miri.sh [--ci] [abi|wire|wire-lib|mem|crc|verbs ...]" >&2; exit 2 ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || parts=(abi crc mem verbs)
if ! cargo +nightly miri --version >/dev/null 2>&1 \
   || ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
  ci_cannot_run miri "no nightly toolchain with the miri and rust-src components" \
    "scripts/setup.sh (rustup component add miri rust-src --toolchain nightly)"
fi
export PROPTEST_CASES=${PROPTEST_CASES:-4}
export MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-disable-isolation"
export RUSTFLAGS="${RUSTFLAGS:-} -Ctarget-feature=+pclmulqdq,+sse4.1,+ssse3"
# The crc tests that reach the unsafe code through its pointer-level entry points (the others
# sweep thousands of lengths, minutes each under Miri).
crc_tests=(--lib --test props -- copy::test:: test::check_value raw_pointer_entry_points_agree
           free_functions_use_a_correct_kernel copy_with_unequal_lengths_panics
           kernels_match_crc32fast masked_update_matches_a_masked_copy)
t0=$SECONDS
times=()
part() {
  local name=$1 s=$SECONDS
  shift
  echo "miri.sh: $name: $*"
  "$@"
  times+=("$name $((SECONDS - s)) s")
  echo "miri.sh: $name done ($((SECONDS - s)) s)"
}
for p in "${parts[@]}"; do
  case $p in
    abi) part abi cargo +nightly miri test -p pmrxe-abi -p pmrxe-qp-table --lib -- ring:: layout:: \
           every_state_pair_of_every_type every_single_attribute_is_judged perftest_and_pingpong_masks \
           client::tests::errno_of_each_error client::tests::empty_mapping_is_einval \
           ctrl::tests::garbage_decodes_to_an_error ;;
    wire) part wire cargo +nightly miri test -p pmrxe-wire --test frames --test fuzz_corpus ;;
    wire-lib) part wire-lib cargo +nightly miri test -p pmrxe-wire --lib ;;
    mem) part mem env MIRIFLAGS="$MIRIFLAGS -Zmiri-permissive-provenance" \
           cargo +nightly miri test -p pmrxe-mem --lib --test crc ;;
    crc) part crc cargo +nightly miri test -p pmrxe-crc "${crc_tests[@]}" ;;
    verbs) part verbs env MIRIFLAGS="$MIRIFLAGS -Zmiri-permissive-provenance" \
           cargo +nightly miri test -p pmrxe-verbs --lib -- boundary:: post:: cq::tests qp_state:: \
           strings:: pmrxedv:: cm::tests cm::event::tests ;;
  esac
done
echo "miri.sh: no undefined behaviour found ($((SECONDS - t0)) s: ${times[*]})"
