#!/usr/bin/env bash
# Off the loopback: pmrxe through a kernel interface, beside kernel TCP over the same kind of
# link, in one run on this machine (scripts/bench.sh calls it; it also runs alone).
#
#   ./scripts/bench_offhost.sh OUTDIR        # QUICK=1: short runs; BENCH_RT=1: real-time
#                                            # scheduling as in scripts/bench.sh
#
# 1. kernel path, one service, no CPU contention: the service's two ports pmrxe0/pmrxe1 are the
#    two ends of one veth pair (DPDK af_xdp at MTU 3500 -> RoCE path MTU 2048; af_packet at MTU
#    1500 -> 1024), one busy lcore on CPU 1, the native harness on CPU 0: 64 KiB WRITE, 8 B
#    WRITE rate, 8 B WRITE/SEND latency (`pmrxe bench --config`).
# 2. kernel TCP over a veth pair between two namespaces at the same MTUs: iperf3 (64 KiB
#    writes; client on CPU 0, server on CPU 1), qperf tcp_bw/tcp_lat (one-way), and at MTU
#    3500 UCX over its tcp transport (ucx_perftest tag_bw 64 KiB, tag_lat 8 B).
# 3. two hosts: two services in two namespaces joined by a veth (af_xdp, MTU 3500), each in its
#    default `wait` idle mode: perftest over rdma_cm (ib_write_bw -R 64 KiB, ib_send_lat -R 8 B),
#    qperf -cm1 rc_bw 64 KiB / rc_lat 8 B (both qperf processes in a third namespace whose lo
#    carries host 1's address for qperf's TCP control connection), ucx_perftest over rc_verbs
#    (tag_bw 64 KiB, tag_lat 8 B; UCX wires up over 127.0.0.1). fi_pingpong cannot connect
#    between two hosts over the verbs provider (docs/limits.md): no row.
# 4. idle: a `wait`-mode service with no client, its CPU time over a few seconds (% of one
#    core); the wake-up latency (`pmrxe bench --only wake`: the first 8 B WRITE round trip after
#    1 s of silence) and the same service's warm latency (`--only lat`), then both again in
#    `busy`.
#
# Raw outputs in OUTDIR, and OUTDIR/offhost.json (bench_report.py renders it). Needs root
# (namespaces, af_xdp). Every namespace, veth and service this script makes is removed on exit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bench_offhost.sh OUTDIR}
QUICK=${QUICK:-0}
BIN=${PMRXE_BIN:-target/release/pmrxe}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
[ "$(id -u)" -eq 0 ] || { echo "bench_offhost: must run as root (namespaces, af_xdp)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "bench_offhost: $BIN not built (cargo build --release)" >&2; exit 1; }
for t in iperf3 qperf ib_write_bw ib_send_lat ucx_perftest; do
  command -v "$t" >/dev/null || { echo "bench_offhost: $t missing (scripts/setup.sh installs it)" >&2; exit 1; }
done
[ -z "${OFFHOST_PARTS:-}" ] && rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# Each service here listens where its generated configuration says: an inherited PMRXE_SOCKET
# (scripts/bench.sh exports one for its own service) would override that.
unset PMRXE_SOCKET
RT=() RR=()
[ "${BENCH_RT:-0}" = 1 ] && RT=(chrt -f 10) RR=(nice -n -15)
# OFFHOST_PARTS: which parts run (default all): kpath tcp two idle. OFFHOST_TWO_IDLE: the idle
# mode of the two-host services (default wait). OFFHOST_PROFILE=1: also
# profile the lcore's CPU (perf, kernel symbols) under 64 KiB WRITE on each kernel path
# (kpath-PMD-profile.txt by function, -profile-dso.txt by binary/kernel).
PARTS=" ${OFFHOST_PARTS:-kpath tcp two idle} "
part() { [[ $PARTS == *" $1 "* ]]; }
if [ $QUICK = 1 ]; then D=1; N=2000; WAKES=5; IDLE_S=2; else D=3; N=20000; WAKES=20; IDLE_S=5; fi
# Outside scripts/bench.sh (which holds it), take the integration tests' lock: they pin CPU 1.
if [ -z "${PMRXE_BENCH_LOCKED:-}" ]; then
  exec 9>/tmp/pmrxe-itest.lock
  flock 9
fi
WORK=$(mktemp -d /tmp/pmrxe-offhost.XXXXXX)
chmod 0755 "$WORK"
NSS=(pmrxe-bo pmrxe-bt1 pmrxe-bt2 pmrxe-bh1 pmrxe-bh2 pmrxe-bq)
PIDS=()
SERVED=
log() { echo "== $*" >&2; }
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null
  done
  for ns in "${NSS[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# veth NAME_A NAME_B NS_A NS_B MTU [IP_A IP_B]: a veth pair, ends in the namespaces (one
# namespace for both ends when NS_A = NS_B), fixed MACs, IPv6 off; kernel IPs only if given.
veth() {
  local a=$1 b=$2 na=$3 nb=$4 mtu=$5 ipa=${6:-} ipb=${7:-}
  for ns in "$na" "$nb"; do ip netns list | awk '{print $1}' | grep -qx "$ns" || ip netns add "$ns"; done
  ip -n "$na" link del "$a" 2>/dev/null
  ip link add "$a" netns "$na" type veth peer name "$b" netns "$nb" || return 1
  local i=1
  for end in "$na:$a" "$nb:$b"; do
    local ns=${end%%:*} dev=${end#*:}
    ip -n "$ns" link set "$dev" address "02:00:0a:4f:00:0$i" mtu "$mtu"
    ip netns exec "$ns" sysctl -qw "net.ipv6.conf.$dev.disable_ipv6=1" >/dev/null 2>&1
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$dev" up
    i=$((i + 1))
  done
  [ -n "$ipa" ] && ip -n "$na" addr add "$ipa/24" dev "$a"
  [ -n "$ipb" ] && ip -n "$nb" addr add "$ipb/24" dev "$b"
  return 0
}

# config FILE SOCKET PREFIX IDLE CORE ITEM...: a service configuration. Each ITEM is a port,
# port:NAME|DEVARGS|MAC|IP|MTU, or a static neighbour, neigh:IP|MAC. LCORE_NICE sets
# [lcores] nice (default 0).
config() {
  local file=$1 sock=$2 prefix=$3 idle=$4 core=$5; shift 5
  {
    echo "[service]"; echo "socket = \"$sock\""; echo "log = \"warn\""; echo "idle = $idle"
    echo "[eal]"; echo "hugepages = false"; echo "memory_mb = 512"; echo "file_prefix = \"$prefix\""
    echo "[lcores]"; echo "cores = [$core]"; echo "main_core = $((1 - core))"; echo "nice = ${LCORE_NICE:-0}"
    local item name dev mac ip mtu
    for item in "$@"; do
      case $item in
        port:*) IFS='|' read -r name dev mac ip mtu <<<"${item#port:}"
          printf '[[ports]]\nname = "%s"\nkind = "vdev"\ndevargs = "%s"\nmac = "%s"\nipv4 = "%s/24"\nmtu = %s\n' "$name" "$dev" "$mac" "$ip" "$mtu" ;;
      esac
    done
    for item in "$@"; do
      case $item in
        neigh:*) IFS='|' read -r ip mac <<<"${item#neigh:}"
          printf '[[neighbors]]\nip = "%s"\nmac = "%s"\n' "$ip" "$mac" ;;
      esac
    done
  } >"$file"
  "$BIN" config check "$file" >/dev/null 2>"$file.err" || { echo "bench_offhost: generated $file is invalid:" >&2; cat "$file.err" >&2; return 1; }
}

# serve NS CONFIG LOG: start a service in a namespace (- for this one), wait until it answers;
# its pid is left in SERVED.
serve() {
  local ns=$1 cfg=$2 logf=$3 sock
  sock=$(sed -n 's/^socket = "\(.*\)"/\1/p' "$cfg")
  local pre=()
  [ "$ns" != - ] && pre=(ip netns exec "$ns")
  "${pre[@]}" "${RT[@]}" "$BIN" serve --config "$cfg" >"$logf" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  # Up to 60 s: under load, loading the XDP program and setting up the sockets has taken >15 s.
  for _ in $(seq 600); do
    PMRXE_SOCKET=$sock "$BIN" stats >/dev/null 2>&1 && { SERVED=$pid; return 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "bench_offhost: service in $ns did not start:" >&2; cat "$logf" >&2
  return 1
}

stop() { # pid
  kill -TERM "$1" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null; wait "$1" 2>/dev/null
}

# cpu_ticks PID: user+system clock ticks of every thread of a process so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# ---- 1. kernel path, one service ------------------------------------------------------------------
part kpath && for pmd in af_xdp af_packet; do
  if [ $pmd = af_xdp ]; then mtu=3500; d0="net_af_xdp0,iface=pmrxe-o0,start_queue=0,queue_count=1"; d1="net_af_xdp1,iface=pmrxe-o1,start_queue=0,queue_count=1"
  else mtu=1500; d0="net_af_packet0,iface=pmrxe-o0,qpairs=1"; d1="net_af_packet1,iface=pmrxe-o1,qpairs=1"; fi
  log "kernel path, one service: $pmd, veth MTU $mtu"
  veth pmrxe-o0 pmrxe-o1 pmrxe-bo pmrxe-bo "$mtu" || { log "veth failed"; exit 1; }
  config "$WORK/kpath-$pmd.toml" "$WORK/kpath.sock" "pmrxe-offhost-k" '{ mode = "busy" }' 1 \
    "port:pmrxe0|$d0|02:00:0a:4f:00:01|10.79.0.1|$mtu" "port:pmrxe1|$d1|02:00:0a:4f:00:02|10.79.0.2|$mtu" \
    "neigh:10.79.0.1|02:00:0a:4f:00:01" "neigh:10.79.0.2|02:00:0a:4f:00:02" || exit 1
  timeout 300 ip netns exec pmrxe-bo "${RT[@]}" "$BIN" bench --config "$WORK/kpath-$pmd.toml" --suite quick --sizes 64K \
    --only rate,bw,lat --ops write --rate-sizes 8 --duration "$D" --iters "$N" --cpu 0 \
    --json "$OUT/kpath-$pmd.json" >"$OUT/kpath-$pmd.txt" 2>&1 || log "kernel path $pmd: bench failed (see $OUT/kpath-$pmd.txt)"
  if [ "${OFFHOST_PROFILE:-0}" = 1 ]; then
    # Where the lcore CPU's time goes at 64 KiB WRITE: a timer-sampled profile of CPU 1 (the
    # lcore, and the kernel work of its system calls and softirqs) with kernel symbols, split
    # by user / kernel and by function.
    log "kernel path $pmd: profile of CPU 1 under 64 KiB WRITE"
    timeout 120 ip netns exec pmrxe-bo "$BIN" bench --config "$WORK/kpath-$pmd.toml" --suite quick --sizes 64K \
      --only bw --ops write --duration 6 --cpu 0 >"$OUT/kpath-$pmd-profiled.txt" 2>&1 &
    b=$!
    sleep 2
    perf record -C 1 -e cpu-clock -F 4999 -g -o "$OUT/kpath-$pmd.perf.data" -- sleep 3 >/dev/null 2>&1
    wait "$b"
    perf report -i "$OUT/kpath-$pmd.perf.data" --no-children --sort sym --stdio -g none --percent-limit 0.7 \
      >"$OUT/kpath-$pmd-profile.txt" 2>/dev/null
    perf report -i "$OUT/kpath-$pmd.perf.data" --no-children --sort dso --stdio -g none \
      >"$OUT/kpath-$pmd-profile-dso.txt" 2>/dev/null
  fi
  ip netns del pmrxe-bo
done

# ---- 2. kernel TCP over a veth pair, same MTUs ------------------------------------------------------
part tcp && for mtu in 3500 1500; do
  log "kernel TCP over a veth pair between two namespaces, MTU $mtu"
  veth pmrxe-t1 pmrxe-t2 pmrxe-bt1 pmrxe-bt2 "$mtu" 10.79.1.1 10.79.1.2 || { log "veth failed"; exit 1; }
  ip netns exec pmrxe-bt1 "${RR[@]}" taskset -c 1 iperf3 -s -1 -p 15202 >/dev/null 2>&1 &
  s=$!; PIDS+=("$s")
  for _ in $(seq 50); do ip netns exec pmrxe-bt1 ss -ltn 2>/dev/null | grep -q ':15202 ' && break; sleep 0.1; done
  timeout 60 ip netns exec pmrxe-bt2 "${RR[@]}" taskset -c 0 iperf3 -c 10.79.1.1 -p 15202 -l 64K -t "$D" -J >"$OUT/tcp-iperf3-$mtu.json" 2>&1 \
    || log "iperf3 at MTU $mtu failed"
  wait "$s" 2>/dev/null
  ip netns exec pmrxe-bt1 "${RR[@]}" qperf >/dev/null 2>&1 &
  s=$!; PIDS+=("$s")
  for _ in $(seq 50); do ip netns exec pmrxe-bt1 ss -ltn 2>/dev/null | grep -q ':19765 ' && break; sleep 0.1; done
  timeout 60 ip netns exec pmrxe-bt2 "${RR[@]}" qperf -t "$D" -m 8 10.79.1.1 tcp_lat >"$OUT/tcp-qperf-lat-$mtu.txt" 2>&1 || log "qperf tcp_lat at MTU $mtu failed"
  timeout 60 ip netns exec pmrxe-bt2 "${RR[@]}" qperf -t "$D" -m 64K 10.79.1.1 tcp_bw >"$OUT/tcp-qperf-bw-$mtu.txt" 2>&1 || log "qperf tcp_bw at MTU $mtu failed"
  stop "$s"
  # UCX's own tcp transport over the same veth: the counterpart of ucx_perftest over rc_verbs.
  if [ "$mtu" = 3500 ]; then
    for t in "tag_bw 65536" "tag_lat 8"; do
      set -- $t
      ip netns exec pmrxe-bt1 env UCX_TLS=tcp,self UCX_NET_DEVICES=pmrxe-t1 taskset -c 1 ucx_perftest -p 15204 >/dev/null 2>&1 &
      s=$!; PIDS+=("$s")
      for _ in $(seq 50); do ip netns exec pmrxe-bt1 ss -ltn 2>/dev/null | grep -q ':15204 ' && break; sleep 0.1; done
      timeout 60 ip netns exec pmrxe-bt2 env UCX_TLS=tcp,self UCX_NET_DEVICES=pmrxe-t2 taskset -c 0 ucx_perftest 10.79.1.1 -p 15204 -t "$1" -s "$2" -n "$N" \
        >"$OUT/tcp-ucx-$1.txt" 2>&1 || log "ucx_perftest $1 over tcp failed"
      stop "$s"
    done
  fi
  ip netns del pmrxe-bt1; ip netns del pmrxe-bt2
done

# ---- 3. two hosts: two services in two namespaces, af_xdp, wait mode --------------------------------
if part two; then
  log "two hosts: two services (af_xdp, MTU 3500, idle wait) in two namespaces, perftest over rdma_cm"
  veth pmrxe-h1 pmrxe-h2 pmrxe-bh1 pmrxe-bh2 3500 || { log "veth failed"; exit 1; }
  # Each CPU is shared by one host's lcore and the other host's busy-polling perftest: the
  # case `[lcores] nice` is for (docs/operations.md, "Sharing CPUs with applications").
  export LCORE_NICE=-10
  config "$WORK/host1.toml" "$WORK/host1.sock" "pmrxe-offhost-h1" "{ mode = \"${OFFHOST_TWO_IDLE:-wait}\" }" 1 \
    "port:pmrxe0|net_af_xdp0,iface=pmrxe-h1,start_queue=0,queue_count=1|02:00:0a:4f:00:01|10.79.2.1|3500" \
    "neigh:10.79.2.2|02:00:0a:4f:00:02" || exit 1
  config "$WORK/host2.toml" "$WORK/host2.sock" "pmrxe-offhost-h2" "{ mode = \"${OFFHOST_TWO_IDLE:-wait}\" }" 0 \
    "port:pmrxe0|net_af_xdp0,iface=pmrxe-h2,start_queue=0,queue_count=1|02:00:0a:4f:00:02|10.79.2.2|3500" \
    "neigh:10.79.2.1|02:00:0a:4f:00:01" || exit 1
  unset LCORE_NICE
  serve pmrxe-bh1 "$WORK/host1.toml" "$OUT/host1.log" || exit 1
  h1=$SERVED
  serve pmrxe-bh2 "$WORK/host2.toml" "$OUT/host2.log" || exit 1
  h2=$SERVED
  # The programs stay SCHED_OTHER even with BENCH_RT=1: each shares its CPU with the other host's
  # lcore, which in `wait` mode must preempt a spinning program when it wakes (an RR program
  # queued it for a whole time slice: 2 MB/s).
  across() { # NAME SERVER-ARGS... -- CLIENT-ARGS...: server in host 1 (pinned CPU 0), client in host 2 (CPU 1)
    local name=$1; shift
    local srv=() cli=()
    while [ "$1" != "--" ]; do srv+=("$1"); shift; done; shift; cli=("$@")
    PMRXE_SOCKET=$WORK/host1.sock timeout 120 ip netns exec pmrxe-bh1 taskset -c 0 "$BIN" run -- "${srv[@]}" >"$OUT/$name.server.txt" 2>&1 &
    local s=$!
    PIDS+=("$s")
    for _ in $(seq 100); do grep -q "Waiting for client" "$OUT/$name.server.txt" 2>/dev/null && break; sleep 0.1; done
    PMRXE_SOCKET=$WORK/host2.sock timeout 120 ip netns exec pmrxe-bh2 taskset -c 1 "$BIN" run -- "${cli[@]}" >"$OUT/$name.txt" 2>&1 || log "$name: client failed"
    wait "$s" 2>/dev/null
  }
  across two-ib_write_bw ib_write_bw -R -d pmrxe0 -F -s 65536 -D "$D" -- ib_write_bw -R -d pmrxe0 -F -s 65536 -D "$D" 10.79.2.1
  across two-ib_send_lat ib_send_lat -R -d pmrxe0 -F -s 8 -n "$N" -- ib_send_lat -R -d pmrxe0 -F -s 8 -n "$N" 10.79.2.1
  # qperf -cm1: its client reaches the server's TCP control port and its rdma_cm address by one
  # name, so both run in a namespace whose lo carries 10.79.2.1; their QPs live on hosts 1 and 2.
  ip netns add pmrxe-bq && ip -n pmrxe-bq link set lo up && ip -n pmrxe-bq addr add 10.79.2.1/32 dev lo
  PMRXE_SOCKET=$WORK/host1.sock ip netns exec pmrxe-bq taskset -c 0 "$BIN" run -- qperf -lp 19766 >"$OUT/two-qperf.server.txt" 2>&1 &
  s=$!; PIDS+=("$s")
  for _ in $(seq 100); do ip netns exec pmrxe-bq ss -ltn 2>/dev/null | grep -q ':19766 ' && break; sleep 0.1; done
  PMRXE_SOCKET=$WORK/host2.sock timeout 60 ip netns exec pmrxe-bq taskset -c 1 "$BIN" run -- qperf 10.79.2.1 -lp 19766 -cm1 -t "$D" -m 64K rc_bw \
    >"$OUT/two-qperf-rc_bw.txt" 2>&1 || log "qperf rc_bw failed"
  PMRXE_SOCKET=$WORK/host2.sock timeout 60 ip netns exec pmrxe-bq taskset -c 1 "$BIN" run -- qperf 10.79.2.1 -lp 19766 -cm1 -t "$D" -m 8 rc_lat \
    >"$OUT/two-qperf-rc_lat.txt" 2>&1 || log "qperf rc_lat failed"
  stop "$s"
  ip netns del pmrxe-bq
  # UCX over rc_verbs: server on host 1, client on host 2 (UCX's wire-up over 127.0.0.1).
  for t in "tag_bw 65536" "tag_lat 8"; do
    set -- $t
    PMRXE_SOCKET=$WORK/host1.sock taskset -c 0 "$BIN" run -- env UCX_TLS=rc_verbs,ud_verbs:aux,self UCX_NET_DEVICES=pmrxe0:1 ucx_perftest -p 15205 \
      >"$OUT/two-ucx-$1.server.txt" 2>&1 &
    s=$!; PIDS+=("$s")
    for _ in $(seq 100); do ss -ltn 2>/dev/null | grep -q ':15205 ' && break; sleep 0.1; done
    PMRXE_SOCKET=$WORK/host2.sock timeout 60 taskset -c 1 "$BIN" run -- env UCX_TLS=rc_verbs,ud_verbs:aux,self UCX_NET_DEVICES=pmrxe0:1 \
      ucx_perftest 127.0.0.1 -p 15205 -t "$1" -s "$2" -n "$N" >"$OUT/two-ucx-$1.txt" 2>&1 || log "ucx_perftest $1 over rc_verbs failed"
    stop "$s"
  done
  stop "$h1"; stop "$h2"
  ip netns del pmrxe-bh1; ip netns del pmrxe-bh2
fi

# ---- 4. idle cost and wake-up latency --------------------------------------------------------------
part idle && for mode in wait busy; do
  log "idle: the embedded loopback configuration in $mode mode"
  "$BIN" config default | sed "s|^socket = .*|socket = \"$WORK/idle.sock\"|; s|^idle *=.*|idle = { mode = \"$mode\" }|" >"$WORK/idle-$mode.toml"
  serve - "$WORK/idle-$mode.toml" "$OUT/idle-$mode.log" || exit 1
  pid=$SERVED
  # Past start-up: the lcore has run empty passes (and, in wait mode, gone to sleep), bounded.
  for _ in $(seq 100); do
    PMRXE_SOCKET=$WORK/idle.sock "$BIN" stats --json 2>/dev/null | "$PY" -c '
import json, sys
c = json.load(sys.stdin)["lcores"][0]["counters"]
sys.exit(0 if c["idle_iterations"] > 0 and (sys.argv[1] == "busy" or c["idle_sleeps"] > 0) else 1)' "$mode" && break
    sleep 0.1
  done
  t0=$(cpu_ticks "$pid"); s0=$(date +%s.%N)
  sleep "$IDLE_S"
  t1=$(cpu_ticks "$pid"); s1=$(date +%s.%N)
  echo "{\"mode\": \"$mode\", \"ticks\": $((t1 - t0)), \"hz\": $(getconf CLK_TCK), \"seconds\": $(echo "$s1 - $s0" | bc)}" >"$OUT/idle-cpu-$mode.json"
  PMRXE_SOCKET=$WORK/idle.sock "${RT[@]}" "$BIN" bench --socket "$WORK/idle.sock" --suite quick --only wake --wakes "$WAKES" --wake-gap-ms 1000 --cpu 0 \
    --json "$OUT/wake-$mode.json" >"$OUT/wake-$mode.txt" 2>&1 || log "wake-up latency ($mode) failed"
  PMRXE_SOCKET=$WORK/idle.sock "${RT[@]}" "$BIN" bench --socket "$WORK/idle.sock" --suite quick --only lat --iters "$N" --cpu 0 \
    --json "$OUT/lat-$mode.json" >"$OUT/lat-$mode.txt" 2>&1 || log "warm latency ($mode) failed"
  stop "$pid"
done

echo "bench_offhost: results in $OUT" >&2
