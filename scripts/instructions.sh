#!/usr/bin/env bash
# Instructions per operation of the lcore, counted by callgrind: a figure this VM's 2x timing
# swings cannot move, for comparing two builds of the data path.
#
#   ./scripts/instructions.sh [--handoff] [SERVICE_BIN [CLIENT_BIN]] > out.json
#
# For each point (8 B WRITE and SEND, inline; 64 KiB WRITE) the service (SERVICE_BIN serve on
# the embedded loopback, busy idle) runs under callgrind and CLIENT_BIN's native harness drives
# it: a warm-up, then `bench --settle` holds the harness connected and idle while an empty
# pass is calibrated, then the measured point. Prints one JSON object per point
# (scripts/callgrind_ops.py explains the fields). CLIENT_BIN defaults to SERVICE_BIN; another
# build's service can be driven by this one's client while the shared-memory ABI is the same.
# Valgrind has no AVX-512 or VPCLMULQDQ: the CRC kernel counted is the PCLMUL one, forced
# (PMRXE_CRC_KERNEL=pclmul unless set) so that every point and build counts the same kernel.
# ~1 minute per point.
#
# --handoff: the same points on two lcores with the harness's sides in two clients
# (`bench --two-clients`), so the sides' QPs live on different lcores and every frame arrives
# on the lcore that does not own its QP and is handed over. The figures are the two lcores'
# instructions together, per operation ("lcores": 2): less the one-lcore figures, the cost of
# the hand-offs. The empty-pass calibration assumes both lcores' empty passes cost the same.
#
# Environment: ONE=1 measures only the first point (8 B WRITE); KEEP=1 keeps the work directory
# with the callgrind dumps (its path is in the dumps' names; per-function or per-line study).
set -uo pipefail
cd "$(dirname "$0")/.."
LCORES=1
DUR=3
if [ "${1:-}" = --handoff ]; then LCORES=2; DUR=15; shift; fi   # valgrind runs one thread at a time: two busy lcores need longer for as many operations
SVC_BIN=${1:-target/release/pmrxe}
CLI_BIN=${2:-$SVC_BIN}
command -v valgrind >/dev/null || { echo "instructions: valgrind is not installed (scripts/setup.sh)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/pmrxe-instr.XXXXXX)
export PMRXE_SOCKET=$WORK/pmrxe.sock
VG=
stop_vg() { # the service under valgrind: TERM, then KILL if it has not gone within 10 s
  [ -n "$VG" ] || return 0
  kill -TERM "$VG" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$VG" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$VG" 2>/dev/null; wait "$VG" 2>/dev/null; VG=
}
cleanup() { stop_vg; [ -n "${KEEP:-}" ] || rm -rf "$WORK"; }
trap cleanup EXIT
sed 's/^idle = .*/idle = { mode = "busy" }/' configs/loopback.toml >"$WORK/busy.toml"
HARNESS=()
if [ "$LCORES" = 2 ]; then
  # The second lcore shares CPU 0 with the main core: under valgrind threads run one at a time.
  sed -i -e 's/^cores = \[1\]/cores = [1, 0]/' -e 's/^main_core = 0/main_core = 0\nallow_main_core = true/' "$WORK/busy.toml"
  grep -q '^cores = \[1, 0\]' "$WORK/busy.toml" || { echo "instructions: configs/loopback.toml layout changed" >&2; exit 1; }
  HARNESS=(--two-clients)
fi

counters() { # send WQEs, busy passes, empty passes, frames received: all lcores together
  "$CLI_BIN" stats --json | python3 -c 'import json,sys; ls=json.load(sys.stdin)["lcores"]; print(*(sum(l["counters"][k] for l in ls) for k in ("sq_wqes", "busy_iterations", "idle_iterations", "rx_packets")))'
}
lcore_dump() { # the lcore threads' dumps in directory $1, comma separated, once all are there
  local d
  d=$(grep -l 'pmrxe_runtime::lcore::Lcore<L>::run' "$1"/cg.out.* 2>/dev/null | sort)
  [ "$(echo "$d" | grep -c .)" = "$LCORES" ] && echo "$d" | paste -sd,
}
wait_for() { # what, seconds, command...: poll the command until it succeeds or time runs out
  local what=$1 t=$2; shift 2
  for _ in $(seq $((t * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "instructions: timed out waiting for $what" >&2; return 1
}

point() { # name, bench arguments...
  local name=$1; shift
  rm -f "$WORK"/cg.out* "$PMRXE_SOCKET"; rm -rf "$WORK/idle"; mkdir -p "$WORK/idle"
  # The CRC kernel is forced: the service's start-up calibration times the kernels, and under
  # valgrind (which emulates PCLMULQDQ slowly and has no VPCLMULQDQ/AVX-512) it picked the
  # portable one on some starts and PCLMUL on others, so one point counted 1400 instructions of
  # portable short-frame CRC that the next did not.
  PMRXE_CRC_KERNEL=${PMRXE_CRC_KERNEL:-pclmul} valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$WORK/cg.out" \
    "$SVC_BIN" serve --config "$WORK/busy.toml" >"$WORK/serve.log" 2>&1 &
  VG=$!
  wait_for "the service's socket" 120 test -S "$PMRXE_SOCKET" || { cat "$WORK/serve.log" >&2; return 1; }
  "$CLI_BIN" bench --socket "$PMRXE_SOCKET" --suite quick --duration 1 "${HARNESS[@]}" "$@" >/dev/null 2>&1   # warm-up
  "$CLI_BIN" bench --socket "$PMRXE_SOCKET" --suite quick --duration "$DUR" --settle 5 "${HARNESS[@]}" "$@" >"$WORK/bench.log" 2>&1 &
  local b=$!
  wait_for "the harness to settle" 120 grep -q '^settling' "$WORK/bench.log" || return 1
  local c0 c1 c2
  c0=($(counters)); callgrind_control -z "$VG" >/dev/null 2>&1
  sleep 3   # the calibration window: empty passes with the harness connected
  c1=($(counters)); callgrind_control -d "$VG" >/dev/null 2>&1
  wait_for "the idle dump" 60 lcore_dump "$WORK" || return 1
  mv "$WORK"/cg.out.* "$WORK/idle/"
  wait $b || { echo "instructions: $name: bench failed" >&2; cat "$WORK/bench.log" >&2; return 1; }
  c2=($(counters)); callgrind_control -d "$VG" >/dev/null 2>&1
  wait_for "the measured dump" 60 lcore_dump "$WORK" || return 1
  stop_vg
  local m i
  m=$(lcore_dump "$WORK"); i=$(lcore_dump "$WORK/idle")
  [ -n "$m" ] && [ -n "$i" ] || { echo "instructions: $name: no lcore dump" >&2; return 1; }
  python3 scripts/callgrind_ops.py "$m" $((c2[0] - c1[0])) "$i" $((c1[2] - c0[2])) $((c2[2] - c1[2])) |
    python3 -c "import json,sys; d=json.load(sys.stdin); d['point']='$name'; d['lcores']=$LCORES; d['busy_passes_per_op']=round(($((c2[1] - c1[1])))/max(d['ops'],1),4); d['idle_passes_per_op']=round(($((c2[2] - c1[2])))/max(d['ops'],1),2); d['frames_per_op']=round(($((c2[3] - c1[3])))/max(d['ops'],1),3); print(json.dumps(d))"
}

point "WRITE 8" --only rate --ops write --rate-sizes 8
[ -n "${ONE:-}" ] || point "SEND 8" --only rate --ops send --rate-sizes 8
[ -n "${ONE:-}" ] || point "WRITE 64K" --only bw --ops write --sizes 64K
