# Sourced by scripts: start a private `pmrxe serve` (embedded loopback config unless extra
# arguments are given) on a socket in a fresh scratch directory, stop it and remove the
# directory on exit. Sets: bin (the pmrxe binary), work (scratch dir), svc (service pid),
# PMRXE_SOCKET (exported, so `pmrxe run/stats` and the shim find the service).
# Usage: start_private_service TAG [serve args...]
start_private_service() {
  local tag=$1
  shift
  bin=$PWD/target/release/pmrxe
  work=$(mktemp -d "/tmp/pmrxe-$tag.XXXXXX")
  export PMRXE_SOCKET=$work/pmrxe.sock
  svc=
  trap 'stop_private_service' EXIT
  "$bin" serve "$@" >"$work/service.log" 2>&1 &
  svc=$!
  for _ in $(seq 300); do "$bin" stats >/dev/null 2>&1 && return 0; sleep 0.1; done
  "$bin" stats >/dev/null || { cat "$work/service.log"; exit 1; }
}

stop_private_service() {
  if [ -n "$svc" ]; then kill -TERM "$svc" 2>/dev/null && wait "$svc" 2>/dev/null; fi
  rm -rf "$work"
}
