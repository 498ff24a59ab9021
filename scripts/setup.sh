#!/usr/bin/env bash
# Installs the system packages pmrxe needs to build and test (Debian 12). Idempotent: when
# everything is already installed it only runs `dpkg -s` and exits (well under 2 s).
# Needs root (or sudo) only when something is missing.
set -euo pipefail

PKGS=(libdpdk-dev dpdk dpdk-dev libclang-dev pkg-config libibverbs-dev ibverbs-utils rdma-core
      perftest tshark qperf iproute2 strace python3
      python3-matplotlib iperf3 ucx-utils libfabric-bin python3-pyverbs rdmacm-utils librdmacm-dev
      openmpi-bin libopenmpi-dev valgrind)

missing=()
for p in "${PKGS[@]}"; do
  # dpkg -s succeeds for removed-but-configured packages too; require "install ok installed".
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# tshark asks whether non-root users may capture; answer "no" so the install never prompts.
echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
