#!/usr/bin/env bash
# Runs rdma-core's own pyverbs test suite (unmodified) against pmrxe: starts a private
# `pmrxe serve` on the embedded loopback config, runs every test in its own process through
# `pmrxe run --` with a timeout (scripts/rdma-core-tests.py), then the whole suite in one
# process. Prints pass/fail/error/skip per test and a summary; exit 1 on any failure.
# Usage: scripts/rdma-core-tests.sh [DIR] [runner args: --only SUBSTR..., --timeout S, --no-single]
#
# The suite: DIR/tests when DIR is given, else Debian's copy in the rdma-core package
# (/usr/share/doc/rdma-core/tests, some files gzipped; scripts/setup.sh installs it), copied to
# a scratch directory and gunzipped. Either way the files must be rdma-core v44's, the version
# of Debian 12's python3-pyverbs: scripts/lib/rdma-core-v44-tests.sha256 lists the SHA-256 of
# every file the project runs (hashes only; the test code is not in the repository). No suite,
# or a different one, FAILS the step unless PMRXE_CI_ALLOW_SKIP names `rdma-core`
# (scripts/lib/ci.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/ci.sh
sums=$PWD/scripts/lib/rdma-core-v44-tests.sha256
dir=
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  dir=$1
  shift
fi
suite=$(mktemp -d /tmp/pmrxe-rdma-core-suite.XXXXXX)
trap 'rm -rf "$suite"' EXIT
if [ -n "$dir" ]; then
  [ -f "$dir/tests/run_tests.py" ] || ci_cannot_run rdma-core "$dir/tests/run_tests.py (rdma-core's test suite) is not there" \
    "give a directory holding rdma-core v44's tests/, or no DIR to use Debian's copy (package rdma-core)"
  cp -r "$dir/tests" "$suite/"
  from="$dir/tests"
else
  deb=/usr/share/doc/rdma-core/tests
  [ -e "$deb/run_tests.py" ] || ci_cannot_run rdma-core "$deb (rdma-core's test suite, Debian package rdma-core) is not installed" \
    "scripts/setup.sh (apt-get install rdma-core)"
  cp -r "$deb" "$suite/"
  gunzip -f "$suite"/tests/*.gz
  from="$deb (Debian rdma-core $(dpkg-query -W -f='${Version}' rdma-core 2>/dev/null || echo '?'))"
fi
# Exactly the v44 files: every listed file present and identical, and no other Python file.
if ! bad=$(cd "$suite" && sha256sum --quiet -c "$sums" 2>&1); then
  ci_cannot_run rdma-core "the suite in $from is not rdma-core v44's (checked against scripts/lib/rdma-core-v44-tests.sha256): $bad" \
    "use Debian 12's rdma-core 44.0 package, or point RDMA_CORE_TESTS at rdma-core v44.0's tests"
fi
extra=$(cd "$suite" && find tests -name '*.py' | sort | comm -23 - <(awk '{print $2}' "$sums" | sort))
if [ -n "$extra" ]; then
  ci_cannot_run rdma-core "the suite in $from has files rdma-core v44 lacks: $extra" \
    "use Debian 12's rdma-core 44.0 package, or point RDMA_CORE_TESTS at rdma-core v44.0's tests"
fi
echo "rdma-core-tests: rdma-core v44 test suite from $from ($(wc -l < "$sums") files verified)"
if [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import pyverbs' 2>/dev/null; then
  echo "rdma-core-tests: FAILED: python3-pyverbs is missing (Debian package python3-pyverbs; scripts/setup.sh installs it)" >&2
  exit 1
fi
single=--single
args=()
for a in "$@"; do
  if [ "$a" = --no-single ]; then single=; else args+=("$a"); fi
done
. scripts/lib/service.sh
start_private_service rdmacore
trap 'stop_private_service; rm -rf "$suite"' EXIT
set +e
/usr/bin/python3 scripts/rdma-core-tests.py "$suite" --pmrxe "$bin" $single "${args[@]}"
rc=$?
set -e
if ! kill -0 "$svc" 2>/dev/null; then
  echo "rdma-core-tests: the service died during the suite; log:" >&2
  tail -30 "$work/service.log" >&2
  rc=1
fi
exit $rc
