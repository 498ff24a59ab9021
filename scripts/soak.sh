#!/usr/bin/env bash
# Soak: one `pmrxe serve` (loopback config + seeded faults) under a loop of unmodified verbs
# workloads (ibv_rc_pingpong -c, ib_write_bw, ib_read_bw, ib_send_bw) for a bounded time.
# Every iteration samples the service's VmRSS, open fds, client count and HugePages_Free; the
# soak fails if a workload fails, the service dies, or resources grow past the bounds.
#
#   scripts/soak.sh [--minutes N] [--loss F] [--no-faults] [--rss-growth-mb M]
#
# Defaults: 3 minutes (CI-like), loss 0.005 (+ reorder 0.005, duplicate 0.002, corrupt 0.002),
# RSS may grow at most 64 MiB over the first iteration, fds at most 16, and at the end the
# client list must be empty and HugePages_Free back at its start value. For people:
# `scripts/soak.sh --minutes 240`. Needs a release build (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=3 loss=0.005 faults=1 rss_growth_mb=64 fd_growth=16
while [ $# -gt 0 ]; do
  case $1 in
    --minutes) minutes=$2; shift ;;
    --loss) loss=$2; shift ;;
    --no-faults) faults=0 ;;
    --rss-growth-mb) rss_growth_mb=$2; shift ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
bin=${PMRXE_BIN:-${CARGO_TARGET_DIR:-target}/release/pmrxe}
[ -x "$bin" ] || { echo "soak.sh: $bin missing: cargo build --release" >&2; exit 1; }
for t in ibv_rc_pingpong ib_write_bw ib_read_bw ib_send_bw; do
  command -v $t >/dev/null || { echo "soak.sh: $t missing: scripts/setup.sh" >&2; exit 1; }
done
# Serialise with the integration tests (they pin CPU 1 too).
exec 9>/tmp/pmrxe-itest.lock
flock 9
dir=$(mktemp -d /tmp/pmrxe-soak.XXXXXX)
export PMRXE_SOCKET=$dir/pmrxe.sock
cp configs/loopback.toml "$dir/soak.toml"
if [ $faults = 1 ]; then
  printf '\n[faults]\nloss = %s\nreorder = %s\nduplicate = 0.002\ncorrupt = 0.002\nseed = 7\n' "$loss" "$loss" >> "$dir/soak.toml"
fi
"$bin" serve --config "$dir/soak.toml" > "$dir/serve.log" 2>&1 &
svc=$!
cleanup() {
  kill -TERM $svc 2>/dev/null || true
  wait $svc 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 100); do "$bin" stats >/dev/null 2>&1 && break; sleep 0.1; done
"$bin" stats >/dev/null || { echo "soak.sh: service did not start"; tail "$dir/serve.log"; exit 1; }

listening() { # port -> 0 when something listens on it
  local hex; hex=$(printf ':%04X' "$1")
  awk -v h="$hex" '$4 == "0A" && $2 ~ h"$" {f=1} END {exit !f}' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
pair() { # name port server-args... -- client-args...
  local name=$1 port=$2; shift 2
  local sargs=() cargs=()
  while [ "$1" != "--" ]; do sargs+=("$1"); shift; done; shift
  cargs=("$@")
  timeout 90 "$bin" run -- "${sargs[@]}" -p "$port" > "$dir/$name.server" 2>&1 &
  local s=$!
  for _ in $(seq 200); do listening "$port" && break; sleep 0.05; done
  if ! timeout 90 "$bin" run -- "${cargs[@]}" -p "$port" 127.0.0.1 > "$dir/$name.client" 2>&1; then
    echo "soak.sh: $name client failed:"; tail -n 15 "$dir/$name.client"; tail -n 15 "$dir/$name.server"; return 1
  fi
  wait $s || { echo "soak.sh: $name server failed:"; tail -n 15 "$dir/$name.server"; return 1; }
}
sample() {
  rss=$(awk '/^VmRSS/ {print $2}' /proc/$svc/status)
  fds=$(ls /proc/$svc/fd | wc -l)
  huge=$(awk '/^HugePages_Free/ {print $2}' /proc/meminfo)
  nclients=$("$bin" stats --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["clients"]))')
}
sample
huge0=$huge
end=$(( $(date +%s) + minutes * 60 ))
iter=0 base_rss=0 base_fds=0 fail=0
echo "soak.sh: service pid $svc, $minutes min, faults=$faults loss=$loss; dir $dir"
printf '%5s %8s %10s %5s %8s %7s\n' iter secs rss_kb fds huge_free clients
t0=$(date +%s)
while [ "$(date +%s)" -lt $end ]; do
  iter=$((iter + 1))
  p=$(( 20000 + (iter * 4) % 4000 ))
  pair pp $p ibv_rc_pingpong -d pmrxe0 -g 1 -c -n 300 -- ibv_rc_pingpong -d pmrxe1 -g 1 -c -n 300 || { fail=1; break; }
  pair wbw $((p + 1)) ib_write_bw -d pmrxe0 -F -n 300 -- ib_write_bw -d pmrxe1 -F -n 300 || { fail=1; break; }
  pair rbw $((p + 2)) ib_read_bw -d pmrxe0 -F -n 200 -- ib_read_bw -d pmrxe1 -F -n 200 || { fail=1; break; }
  pair sbw $((p + 3)) ib_send_bw -d pmrxe0 -F -n 300 -- ib_send_bw -d pmrxe1 -F -n 300 || { fail=1; break; }
  kill -0 $svc 2>/dev/null || { echo "soak.sh: the service died"; fail=1; break; }
  sample
  printf '%5d %8d %10d %5d %8d %7d\n' $iter $(( $(date +%s) - t0 )) "$rss" "$fds" "$huge" "$nclients"
  if [ $iter = 1 ]; then base_rss=$rss base_fds=$fds; fi
  if [ "$rss" -gt $(( base_rss + rss_growth_mb * 1024 )) ]; then echo "soak.sh: RSS grew from $base_rss to $rss kB"; fail=1; break; fi
  if [ "$fds" -gt $(( base_fds + fd_growth )) ]; then echo "soak.sh: fds grew from $base_fds to $fds"; fail=1; break; fi
done
sleep 0.5
sample
if [ $fail = 0 ] && [ "$nclients" != 0 ]; then echo "soak.sh: $nclients clients still listed after the workloads"; fail=1; fi
if [ $fail = 0 ] && [ "$huge" != "$huge0" ]; then echo "soak.sh: HugePages_Free $huge0 -> $huge"; fail=1; fi
"$bin" stats | head -n 30 > "$dir/final-stats.txt" || true
kill -TERM $svc
if ! wait $svc; then echo "soak.sh: service exited with an error"; fail=1; fi
trap - EXIT
grep "injected faults" "$dir/serve.log" | sed 's/\x1b\[[0-9;]*m//g' | sed 's/^.*injected faults/injected faults:/' || true
if [ $fail = 0 ]; then
  echo "soak.sh: PASS: $iter iterations, RSS $base_rss -> $rss kB, fds $base_fds -> $fds, HugePages_Free $huge0 -> $huge"
  rm -rf "$dir"
else
  echo "soak.sh: FAIL (logs in $dir)"; exit 1
fi
