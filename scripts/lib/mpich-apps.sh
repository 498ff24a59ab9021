#!/usr/bin/env bash
# HPC Challenge 1.5.0 and mpi4py 3.1.4 built for MPICH (tests/applications.rs): Debian 12
# packages both for Open MPI only. Sources are Debian's own hpcc upstream tarball and mpi4py's
# release on PyPI, checked against the SHA-256 below; the builds go to /var/cache/pmrxe/mpich
# (PMRXE_MPICH_APPS overrides) once, and are reused while their stamp matches this script's
# versions. Needs mpich + libmpich-dev, libopenblas-dev, python3-setuptools and curl.
# Takes about 40 s (mpi4py's generated C is compiled at -O0: the test needs correctness, not
# speed).
set -euo pipefail
dest=${PMRXE_MPICH_APPS:-/var/cache/pmrxe/mpich}
HPCC_URL=http://deb.debian.org/debian/pool/main/h/hpcc/hpcc_1.5.0.orig.tar.gz
HPCC_SHA=0a6fef7ab9f3347e549fed65ebb98234feea9ee18aea0c8f59baefbe3cf7ffb8
MPI4PY_URL=https://files.pythonhosted.org/packages/bc/f2/749af7fd0e7703ddca6cea525ab40f26c3ca6cbe6c23658441c6f9705860/mpi4py-3.1.4.tar.gz
MPI4PY_SHA=17858f2ebc623220d0120d1fa8d428d033dde749c4bc35b33d81a66ad7f93480
stamp="hpcc-1.5.0 $HPCC_SHA mpi4py-3.1.4 $MPI4PY_SHA"
if [ -x "$dest/bin/hpcc" ] && [ -f "$dest/python/mpi4py/MPI.cpython-311-x86_64-linux-gnu.so" ] && [ "$(cat "$dest/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "mpich-apps: hpcc and mpi4py for MPICH present in $dest"
  exit 0
fi
for t in mpicc.mpich curl /usr/bin/python3; do
  command -v "$t" >/dev/null || { echo "mpich-apps: $t is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done
work=$(mktemp -d /tmp/pmrxe-mpich-apps.XXXXXX)
trap 'rm -rf "$work"' EXIT
fetch() { # URL SHA256 FILE
  curl -fsSL --retry 3 -o "$3" "$1"
  echo "$2  $3" | sha256sum -c --quiet - || { echo "mpich-apps: $1 does not match its SHA-256" >&2; exit 1; }
}
echo "mpich-apps: building HPC Challenge 1.5.0 and mpi4py 3.1.4 for MPICH into $dest"
fetch "$HPCC_URL" "$HPCC_SHA" "$work/hpcc.tar.gz"
fetch "$MPI4PY_URL" "$MPI4PY_SHA" "$work/mpi4py.tar.gz"
tar xzf "$work/hpcc.tar.gz" -C "$work"
tar xzf "$work/mpi4py.tar.gz" -C "$work"
# HPL's make include: MPICH's compiler wrapper, OpenBLAS through its CBLAS interface.
cat > "$work/hpcc-1.5.0/hpl/Make.pmrxe" <<'MK'
SHELL        = /bin/sh
CD           = cd
CP           = cp
LN_S         = ln -s
MKDIR        = mkdir
RM           = /bin/rm -f
TOUCH        = touch
ARCH         = pmrxe
TOPdir       = ../../..
INCdir       = $(TOPdir)/include
BINdir       = $(TOPdir)/bin/$(ARCH)
LIBdir       = $(TOPdir)/lib/$(ARCH)
HPLlib       = $(LIBdir)/libhpl.a
LAlib        = -lopenblas
HPL_INCLUDES = -I$(INCdir) -I$(INCdir)/$(ARCH)
HPL_LIBS     = $(HPLlib) $(LAlib) -lm
HPL_DEFS     = -DHPL_CALL_CBLAS $(HPL_INCLUDES)
CC           = mpicc.mpich
CCNOOPT      = $(HPL_DEFS)
CCFLAGS      = $(HPL_DEFS) -O2
LINKER       = mpicc.mpich
LINKFLAGS    = $(CCFLAGS)
ARCHIVER     = ar
ARFLAGS      = r
RANLIB       = echo
MK
make -C "$work/hpcc-1.5.0" arch=pmrxe -j"$(nproc)" > "$work/hpcc.log" 2>&1 || { tail -30 "$work/hpcc.log" >&2; exit 1; }
(cd "$work/mpi4py-3.1.4" && env MPICC=mpicc.mpich CFLAGS="-O0 -g0" /usr/bin/python3 setup.py -q build > "$work/mpi4py.log" 2>&1) || { tail -30 "$work/mpi4py.log" >&2; exit 1; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO rm -rf "$dest.new"
$SUDO mkdir -p "$dest.new/bin" "$dest.new/python"
$SUDO cp "$work/hpcc-1.5.0/hpcc" "$dest.new/bin/hpcc"
$SUDO cp -r "$work"/mpi4py-3.1.4/build/lib.*/mpi4py "$dest.new/python/"
echo "$stamp" | $SUDO tee "$dest.new/stamp" >/dev/null
$SUDO rm -rf "$dest"
$SUDO mv "$dest.new" "$dest"
echo "mpich-apps: done ($dest/bin/hpcc, $dest/python/mpi4py)"
