#!/bin/sh
# Run one program in a rootless container that reaches the host's pmrxe service (docs/operations.md,
# "Containers"): its own user (mapped root = the caller's uid), mount, network and pid namespaces,
# an empty root with the image's /usr and /etc read-only (here the host's, standing in for an image
# with rdma-core and the application), and from pmrxe only three things bind-mounted:
#   the control socket's directory -> /run/pmrxe, the shim -> /opt/pmrxe/libpmrxe_verbs.so (ro),
#   /dev/infiniband (the pmrxe_uverbs* links UCX looks for, ro).
# Env inside: PMRXE_SOCKET, LD_PRELOAD=the shim, PMRXE_SERVICE_USER=nobody (in a user namespace the
# host's root, who owns the socket's directory and runs the service, shows as the overflow uid:
# see "Containers"), PATH, HOME=/tmp. Nothing else from the host's environment.
#
# Usage: scripts/container.sh [--socket-dir DIR] [--shim SO] -- PROG [ARGS...]
#   defaults: the directory of $PMRXE_SOCKET (else /run/pmrxe), the shim next to the pmrxe binary
#   or in /usr/local/lib. Run it as the user who owns the job (a member of service.group): the
#   container keeps that user's supplementary groups, which is what the service admits.
set -eu
if [ "${1:-}" = "--inside" ]; then
	shift
	R=$1 SOCKDIR=$2 SHIM=$3
	shift 3
	mount -t tmpfs -o mode=755 tmpfs "$R"
	mkdir -p "$R/usr" "$R/etc" "$R/proc" "$R/dev/infiniband" "$R/tmp" "$R/run/pmrxe" "$R/opt/pmrxe"
	mount --rbind -o ro /usr "$R/usr"
	mount --rbind -o ro /etc "$R/etc"
	for l in bin sbin lib lib64; do [ -e "/$l" ] && ln -s "usr/$l" "$R/$l"; done
	for d in null zero urandom random; do
		touch "$R/dev/$d"
		mount --bind "/dev/$d" "$R/dev/$d"
	done
	[ -d /dev/infiniband ] && mount --bind -o ro /dev/infiniband "$R/dev/infiniband"
	mount --bind "$SOCKDIR" "$R/run/pmrxe"
	touch "$R/opt/pmrxe/libpmrxe_verbs.so"
	mount --bind -o ro "$SHIM" "$R/opt/pmrxe/libpmrxe_verbs.so"
	mount -t proc proc "$R/proc"
	ip link set lo up
	exec chroot "$R" env -i PATH=/usr/local/bin:/usr/bin:/usr/sbin HOME=/tmp \
		PMRXE_SOCKET=/run/pmrxe/pmrxe.sock PMRXE_SERVICE_USER=nobody \
		LD_PRELOAD=/opt/pmrxe/libpmrxe_verbs.so "$@"
fi

sockdir=$(dirname "${PMRXE_SOCKET:-/run/pmrxe/pmrxe.sock}")
shim=""
while [ $# -gt 0 ]; do
	case $1 in
	--socket-dir) sockdir=$2; shift 2 ;;
	--shim) shim=$2; shift 2 ;;
	--) shift; break ;;
	*) echo "usage: $0 [--socket-dir DIR] [--shim SO] -- PROG [ARGS...]" >&2; exit 2 ;;
	esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--socket-dir DIR] [--shim SO] -- PROG [ARGS...]" >&2; exit 2; }
if [ -z "$shim" ]; then
	bin=$(command -v pmrxe || true)
	for c in "${bin%/*}/libpmrxe_verbs.so" "${bin%/*}/../lib/libpmrxe_verbs.so" /usr/local/lib/libpmrxe_verbs.so; do
		[ -f "$c" ] && { shim=$c; break; }
	done
fi
[ -f "$shim" ] || { echo "container.sh: no shim found (--shim SO)" >&2; exit 2; }
[ -S "$sockdir/pmrxe.sock" ] || { echo "container.sh: no socket $sockdir/pmrxe.sock (--socket-dir DIR)" >&2; exit 2; }
root=$(mktemp -d "${TMPDIR:-/tmp}/pmrxe-ct.XXXXXX")
rc=0
unshare --user --map-root-user --mount --net --pid --fork \
	"$0" --inside "$root" "$(realpath "$sockdir")" "$(realpath "$shim")" "$@" || rc=$?
rmdir "$root" 2>/dev/null || true
exit $rc
