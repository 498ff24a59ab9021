#!/usr/bin/env bash
# Sets up, builds and runs the main job on the embedded default configuration
# (configs/loopback.toml: one service, devices pmrxe0 <-> pmrxe1 on an in-process DPDK ring
# pair, no NIC, no hugepages): starts `pmrxe serve`, then runs unmodified verbs programs
# through `pmrxe run --`: ibv_devinfo, ibv_rc_pingpong with buffer checking, and ib_write_bw.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --release --workspace
. scripts/lib/service.sh
start_private_service demo
echo "== pmrxe serve is up (embedded loopback config); devices:"
"$bin" run -- ibv_devices
pair() { # server args -- client args
  local srv=() cli=()
  while [ "$1" != "--" ]; do srv+=("$1"); shift; done; shift; cli=("$@")
  timeout 60 "$bin" run -- "${srv[@]}" >"$work/server.out" 2>&1 & local s=$!
  sleep 1
  timeout 60 "$bin" run -- "${cli[@]}"
  wait $s
}
echo "== ibv_rc_pingpong -c (buffer check) between pmrxe0 and pmrxe1"
pair ibv_rc_pingpong -d pmrxe0 -g 1 -c -n 200 -- ibv_rc_pingpong -d pmrxe1 -g 1 -c -n 200 127.0.0.1
echo "== ib_write_bw 64 KiB between pmrxe0 and pmrxe1"
pair ib_write_bw -d pmrxe0 -F -- ib_write_bw -d pmrxe1 -F 127.0.0.1
echo "== pmrxe stats"
"$bin" stats
