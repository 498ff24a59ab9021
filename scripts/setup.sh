#!/usr/bin/env bash
# Installs everything pmrxe needs to build and test (Debian 12): the system packages below and
# the nightly toolchain's miri and rust-src components (scripts/miri.sh; the fuzz build uses
# nightly too). Idempotent: when everything is present it only runs `dpkg-query` and
# `rustup component list` and exits (well under 2 s). Needs root (or sudo) only when a package
# is missing. Every program a test spawns comes from one of these packages (tests fail, naming
# the package, when one is missing):
#   gcc libc6-dev (cc), ibverbs-utils (ibv_*), perftest (ib_*_bw, run_perftest_loopback),
#   rdmacm-utils (rping, ucmatose, udaddy, rdma_server, rstream, cmtime, mckey), qperf,
#   ucx-utils (ucx_info, ucx_perftest), libfabric-bin (fi_info, fi_pingpong), openmpi-bin
#   (mpirun), libopenmpi-dev (mpicc), tshark, python3 (scripts/lib/icrc_check.py),
#   python3-pyverbs + rdma-core (rdma-core's own test suite, /usr/share/doc/rdma-core/tests),
#   iproute2 (ip, tc), strace, util-linux (setpriv), passwd (userdel, groupdel), systemd
#   (systemd-analyze), coreutils (timeout), fio, iperf (v2), sockperf, mpich + libmpich-dev
#   (mpiexec.mpich, mpicc.mpich), hpcc, python3-mpi4py (tests/applications.rs), tgt (tgtd,
#   tgtadm) and libiscsi-bin (iscsi-inq; tests/deployments.rs, iSER), slurm-wlm + munge
#   (slurmctld, slurmd, srun --mpi=pmix, munged: tests/deployments.rs), libopenblas-dev,
#   python3-setuptools and curl (HPC Challenge and mpi4py built for MPICH: scripts/lib/mpich-apps.sh).
set -euo pipefail

PKGS=(libdpdk-dev dpdk dpdk-dev libclang-dev pkg-config gcc libc6-dev libibverbs-dev
      ibverbs-utils rdma-core perftest tshark qperf iproute2 strace python3 util-linux passwd
      systemd coreutils python3-matplotlib iperf3 ucx-utils libfabric-bin python3-pyverbs
      rdmacm-utils librdmacm-dev openmpi-bin libopenmpi-dev valgrind
      fio iperf sockperf mpich libmpich-dev hpcc python3-mpi4py libopenblas-dev python3-setuptools curl
      tgt libiscsi-bin slurm-wlm munge)

# Nightly miri + rust-src (Miri's sysroot is built from rust-src on first use).
if ! command -v rustup >/dev/null; then
  echo "setup: rustup is not installed (https://rustup.rs); the nightly toolchain needs it" >&2
  exit 1
fi
have_components() {
  local c
  c=$(rustup component list --toolchain nightly --installed 2>/dev/null) || return 1
  grep -q '^miri' <<<"$c" && grep -q '^rust-src' <<<"$c"
}
if ! have_components; then
  if rustup toolchain list | grep -q '^nightly'; then
    echo "setup: adding miri and rust-src to the nightly toolchain"
    rustup component add miri rust-src --toolchain nightly
  else
    echo "setup: installing the nightly toolchain with miri and rust-src"
    rustup toolchain install nightly --profile minimal --component miri,rust-src
  fi
  have_components || { echo "setup: nightly miri/rust-src still missing after rustup" >&2; exit 1; }
fi

missing=()
for p in "${PKGS[@]}"; do
  # dpkg -s succeeds for removed-but-configured packages too; require "install ok installed".
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

# HPC Challenge and mpi4py for MPICH (Debian builds both for Open MPI only), built once into
# /var/cache/pmrxe/mpich from their verified sources (scripts/lib/mpich-apps.sh).
mpich_apps() {
  bash "$(dirname "$0")/lib/mpich-apps.sh"
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages and nightly miri + rust-src present"
  mpich_apps
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
mpich_apps
echo "setup: done"
