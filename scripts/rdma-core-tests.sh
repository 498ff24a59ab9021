#!/usr/bin/env bash
# Runs rdma-core's own pyverbs test suite (unmodified, from DIR/tests) against pmrxe: starts a
# private `pmrxe serve` on the embedded loopback config, runs every test in its own process
# through `pmrxe run --` with a timeout (scripts/rdma-core-tests.py), then the whole suite in
# one process. Prints pass/fail/error/skip per test and a summary; exit 1 on any failure.
# Usage: scripts/rdma-core-tests.sh DIR [runner args: --only SUBSTR..., --timeout S, --no-single]
# DIR: a directory holding rdma-core's tests/ (CI: ../shared/conformance/rdma-core-v44).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/rdma-core-tests.sh DIR [args]}
shift
if [ ! -f "$dir/tests/run_tests.py" ]; then
  echo "rdma-core-tests: SKIPPED: $dir/tests (rdma-core's test suite) is not here"
  exit 0
fi
if [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import pyverbs' 2>/dev/null; then
  echo "rdma-core-tests: python3-pyverbs is missing (scripts/setup.sh installs it)" >&2
  exit 1
fi
single=--single
args=()
for a in "$@"; do
  if [ "$a" = --no-single ]; then single=; else args+=("$a"); fi
done
. scripts/lib/service.sh
start_private_service rdmacore
set +e
/usr/bin/python3 scripts/rdma-core-tests.py "$dir" --pmrxe "$bin" $single "${args[@]}"
rc=$?
set -e
if ! kill -0 "$svc" 2>/dev/null; then
  echo "rdma-core-tests: the service died during the suite; log:" >&2
  tail -30 "$work/service.log" >&2
  rc=1
fi
exit $rc
