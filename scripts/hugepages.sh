#!/usr/bin/env bash
# Reserve 2 MiB hugepages for DPDK and put the old value back afterwards.
#
#   scripts/hugepages.sh reserve N   # nr_hugepages := N (records the previous value once)
#   scripts/hugepages.sh restore     # back to the recorded value, deletes the state file
#   scripts/hugepages.sh status
#
# State file: ${PMRXE_HUGEPAGES_STATE:-/run/pmrxe/hugepages.prev}. A second `reserve` keeps the
# first recorded value, so `restore` always returns to the state before pmrxe touched it.
# Also mounts hugetlbfs at /dev/hugepages if nothing is mounted there (unmounted again by
# restore). Needs root.
set -euo pipefail

NR=/proc/sys/vm/nr_hugepages
STATE=${PMRXE_HUGEPAGES_STATE:-/run/pmrxe/hugepages.prev}

free_pages() { awk '/^HugePages_Free:/ {print $2}' /proc/meminfo; }

case ${1:-} in
  reserve)
    n=${2:?usage: $0 reserve N}
    [[ $n =~ ^[0-9]+$ ]] || { echo "hugepages.sh: N must be a number" >&2; exit 2; }
    [ "$(id -u)" -eq 0 ] || { echo "hugepages.sh: must run as root" >&2; exit 1; }
    mkdir -p "$(dirname "$STATE")"
    [ -f "$STATE" ] || cat "$NR" >"$STATE"
    echo "$n" >"$NR"
    got=$(cat "$NR")
    if ! mountpoint -q /dev/hugepages 2>/dev/null; then
      mkdir -p /dev/hugepages && mount -t hugetlbfs -o pagesize=2M nodev /dev/hugepages
      touch "$STATE.mounted"   # we mounted it, so restore unmounts it
    fi
    echo "hugepages: nr_hugepages=$got (asked $n), free=$(free_pages), previous=$(cat "$STATE")"
    [ "$got" -ge "$n" ] || { echo "hugepages.sh: kernel reserved only $got of $n pages" >&2; exit 1; }
    ;;
  restore)
    [ "$(id -u)" -eq 0 ] || { echo "hugepages.sh: must run as root" >&2; exit 1; }
    if [ -f "$STATE" ]; then
      prev=$(cat "$STATE")
      echo "$prev" >"$NR"
      rm -f "$STATE"
      if [ -f "$STATE.mounted" ]; then
        umount /dev/hugepages 2>/dev/null || true
        rm -f "$STATE.mounted"
      fi
      echo "hugepages: restored nr_hugepages=$(cat "$NR") (wanted $prev)"
    else
      echo "hugepages: nothing to restore (nr_hugepages=$(cat "$NR"))"
    fi
    ;;
  status)
    echo "nr_hugepages=$(cat "$NR") free=$(free_pages) recorded=$(cat "$STATE" 2>/dev/null || echo none)"
    ;;
  *) echo "usage: $0 reserve N | restore | status" >&2; exit 2 ;;
esac
