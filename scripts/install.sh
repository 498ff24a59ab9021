#!/usr/bin/env bash
# Install pmrxe on this host: the binary, the verbs shim, the pmrxedv.h header, the docs, a
# configuration (only if none exists) and the systemd unit.
#
#   cargo build --release
#   sudo scripts/install.sh [--prefix /usr/local] [--hugepages N] [--enable] [--dry-run]
#
#   --prefix DIR     where bin/, lib/, include/, share/doc/pmrxe go (default /usr/local).
#                    The unit's ExecStart follows the prefix.
#   --hugepages N    reserve N 2 MiB hugepages now (scripts/hugepages.sh reserve N; undo with
#                    scripts/hugepages.sh restore). To keep them across reboots, also write
#                    /etc/sysctl.d/80-pmrxe-hugepages.conf (vm.nr_hugepages = N): add --persist.
#   --persist        with --hugepages: write that sysctl.d file.
#   --enable         systemctl enable --now pmrxe (default: only daemon-reload).
#   --no-systemd     do not install the unit.
#   --dry-run        print what would be done; change nothing.
#
# Binaries come from $PMRXE_BIN_DIR (default: target/release of this checkout).
# The configuration is /etc/pmrxe/pmrxe.toml: a copy of configs/loopback.toml when absent,
# never overwritten (edit it, then `pmrxe config check /etc/pmrxe/pmrxe.toml`).
#
# A real NIC: binding it to vfio-pci is the operator's decision (it takes the interface away
# from the kernel; do not do it to the NIC you are logged in through). This script never
# does it. With DPDK's tool (package dpdk, /usr/bin/dpdk-devbind.py):
#   modprobe vfio-pci
#   dpdk-devbind.py --status-dev net                 # find the PCI address, e.g. 0000:3b:00.0
#   ip link set dev ens1f0 down
#   dpdk-devbind.py --bind=vfio-pci 0000:3b:00.0
#   # back to the kernel: dpdk-devbind.py --bind=<kernel driver, e.g. ice> 0000:3b:00.0
# Mellanox/NVIDIA ConnectX NICs use their bifurcated mlx5 driver and need no rebinding.
# Then set [[ports]] devargs = "0000:3b:00.0" and [eal] hugepages = true (configs/nic-example.toml).
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX=/usr/local
HUGEPAGES=
PERSIST=0
ENABLE=0
SYSTEMD=1
DRY=0
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) PREFIX=${2:?--prefix needs a directory}; shift 2 ;;
    --hugepages) HUGEPAGES=${2:?--hugepages needs a number}; shift 2 ;;
    --persist) PERSIST=1; shift ;;
    --enable) ENABLE=1; shift ;;
    --no-systemd) SYSTEMD=0; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -n "$HUGEPAGES" ] && ! [[ $HUGEPAGES =~ ^[0-9]+$ ]]; then
  echo "install.sh: --hugepages N: N must be a number" >&2; exit 2
fi

BIN_DIR=${PMRXE_BIN_DIR:-target/release}
ETC=${PMRXE_ETC:-/etc/pmrxe}
UNIT_DIR=${PMRXE_UNIT_DIR:-/etc/systemd/system}

run() {
  echo "+ $*"
  [ "$DRY" = 1 ] || "$@"
}

for f in pmrxe libpmrxe_verbs.so; do
  [ -f "$BIN_DIR/$f" ] || { echo "install.sh: $BIN_DIR/$f is missing: run \`cargo build --release\` first (or set PMRXE_BIN_DIR)" >&2; exit 1; }
done
if [ "$DRY" = 0 ] && [ "$(id -u)" -ne 0 ] && [ "$PREFIX" = /usr/local ]; then
  echo "install.sh: must run as root (or use --prefix DIR, --dry-run)" >&2; exit 1
fi

# The group whose members may use the devices (service.group, default pmrxe): created once,
# never changed afterwards. Add users with `usermod -aG pmrxe USER` (they log in again).
if ! getent group pmrxe >/dev/null; then
  run groupadd --system pmrxe
fi

# Binary and shim. `pmrxe run` finds the shim next to the binary or in ../lib.
run install -D -m 0755 "$BIN_DIR/pmrxe" "$PREFIX/bin/pmrxe"
run install -D -m 0755 "$BIN_DIR/libpmrxe_verbs.so" "$PREFIX/lib/libpmrxe_verbs.so"
run install -D -m 0644 ffi/verbs/include/pmrxedv.h "$PREFIX/include/pmrxedv.h"
for d in docs/*.md configs/README.md; do
  if [ -f "$d" ]; then run install -D -m 0644 "$d" "$PREFIX/share/doc/pmrxe/$(basename "$d")"; fi
done
for c in configs/*.toml; do
  run install -D -m 0644 "$c" "$PREFIX/share/doc/pmrxe/examples/$(basename "$c")"
done

# Configuration: never overwrite the operator's file.
if [ -e "$ETC/pmrxe.toml" ]; then
  echo "= $ETC/pmrxe.toml exists; left unchanged"
else
  run install -D -m 0644 configs/loopback.toml "$ETC/pmrxe.toml"
fi

# systemd unit, ExecStart pointing at this prefix.
if [ "$SYSTEMD" = 1 ]; then
  echo "+ install scripts/pmrxe.service -> $UNIT_DIR/pmrxe.service (binary $PREFIX/bin/pmrxe, config $ETC/pmrxe.toml)"
  if [ "$DRY" = 0 ]; then
    mkdir -p "$UNIT_DIR"
    sed -e "s#/usr/local/bin/pmrxe#$PREFIX/bin/pmrxe#g" \
        -e "s#/usr/local/share/doc/pmrxe#$PREFIX/share/doc/pmrxe#g" \
        -e "s#/etc/pmrxe/pmrxe.toml#$ETC/pmrxe.toml#g" scripts/pmrxe.service >"$UNIT_DIR/pmrxe.service"
    chmod 0644 "$UNIT_DIR/pmrxe.service"
  fi
  if [ -d /run/systemd/system ]; then
    run systemctl daemon-reload
    if [ "$ENABLE" = 1 ]; then run systemctl enable --now pmrxe; fi
  else
    echo "= systemd is not running here: unit installed, not loaded"
  fi
fi

# Hugepages (optional).
if [ -n "$HUGEPAGES" ]; then
  run scripts/hugepages.sh reserve "$HUGEPAGES"
  if [ "$PERSIST" = 1 ]; then
    echo "+ echo 'vm.nr_hugepages = $HUGEPAGES' > /etc/sysctl.d/80-pmrxe-hugepages.conf"
    [ "$DRY" = 1 ] || echo "vm.nr_hugepages = $HUGEPAGES" >/etc/sysctl.d/80-pmrxe-hugepages.conf
  fi
fi

cat <<MSG
pmrxe installed under $PREFIX$( [ "$DRY" = 1 ] && echo " (dry run: nothing was changed)").
  config:  $ETC/pmrxe.toml   (check: $PREFIX/bin/pmrxe config check $ETC/pmrxe.toml)
  service: systemctl enable --now pmrxe; journalctl -u pmrxe -f
  use:     $PREFIX/bin/pmrxe run -- ibv_devinfo -v;  $PREFIX/bin/pmrxe stats
A NIC is bound to vfio-pci only by you (see the comment at the top of scripts/install.sh).
MSG
