#!/usr/bin/env bash
# Two network namespaces joined by a veth pair, for multi-host tests on one machine.
#
#   scripts/netns.sh up   NS_A NS_B     # create (idempotent)
#   scripts/netns.sh down NS_A NS_B     # delete (idempotent), unmounts /run/netns if unused
#
# The veth ends are IF_A (default pmrxe-va) in NS_A and IF_B (default pmrxe-vb) in NS_B, up,
# without IP addresses (pmrxe owns L3 through DPDK af_packet/af_xdp), IPv6 disabled so the
# kernel sends nothing on its own. MAC_A/MAC_B (defaults match configs/netns-{a,b}.toml) set
# the interface MACs. Needs root.
set -euo pipefail

usage() { echo "usage: $0 up|down NS_A NS_B" >&2; exit 2; }
[ $# -eq 3 ] || usage
cmd=$1 A=$2 B=$3
IF_A=${IF_A:-pmrxe-va}
IF_B=${IF_B:-pmrxe-vb}
MAC_A=${MAC_A:-02:00:0a:4d:00:01}
MAC_B=${MAC_B:-02:00:0a:4d:00:02}
[ "$(id -u)" -eq 0 ] || { echo "netns.sh: must run as root" >&2; exit 1; }

ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1"; }

up() {
  for ns in "$A" "$B"; do ns_exists "$ns" || ip netns add "$ns"; done
  if ! ip -n "$A" link show "$IF_A" >/dev/null 2>&1; then
    # A half-made pair from an interrupted run may still sit in the root namespace.
    ip link del "$IF_A" >/dev/null 2>&1 || true
    ip -n "$B" link del "$IF_B" >/dev/null 2>&1 || true
    ip link add "$IF_A" type veth peer name "$IF_B"
    ip link set "$IF_A" netns "$A"
    ip link set "$IF_B" netns "$B"
  fi
  ip -n "$A" link set "$IF_A" address "$MAC_A"
  ip -n "$B" link set "$IF_B" address "$MAC_B"
  for pair in "$A:$IF_A" "$B:$IF_B"; do
    ns=${pair%%:*} dev=${pair#*:}
    ip netns exec "$ns" sysctl -qw "net.ipv6.conf.$dev.disable_ipv6=1" >/dev/null 2>&1 || true
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$dev" up
  done
  echo "netns: $A/$IF_A ($MAC_A) <-> $B/$IF_B ($MAC_B) up"
}

down() {
  for ns in "$A" "$B"; do
    if ns_exists "$ns"; then ip netns del "$ns"; fi   # deleting a netns deletes its veth end
  done
  ip link del "$IF_A" >/dev/null 2>&1 || true          # leftovers in the root namespace
  # `ip netns add` bind-mounts /run/netns onto itself; undo that once no namespace is left.
  if [ -d /run/netns ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
    while mountpoint -q /run/netns 2>/dev/null; do umount /run/netns || break; done
    rmdir /run/netns 2>/dev/null || true
  fi
  echo "netns: $A $B down"
}

case $cmd in
  up) up ;;
  down) down ;;
  *) usage ;;
esac
