#!/usr/bin/python3
"""Block I/O over iSER with data checks, through libiscsi 1.19 (Debian's libiscsi7) by ctypes:
libiscsi-bin has no iscsi-dd, and libiscsi-dev is not needed this way (tests/deployments.rs).

Usage: iser_check.py URL INITIATOR BACKING_FILE
  URL: iser://ADDR/TARGET-IQN/LUN (the LUN backed by BACKING_FILE, 512-byte blocks).
1. WRITE(10) a random 64 KiB at LBA 2048 over iSER; the backing file holds it.
2. The file gets another random 64 KiB at LBA 4096; READ(10) over iSER returns it.
3. READ(10) of LBA 2048 returns what step 1 wrote.
Prints "OK iser_check wrote N read N" or exits 1 naming the step."""
import ctypes
import os
import sys

url, initiator, backing = sys.argv[1], sys.argv[2], sys.argv[3]
lib = ctypes.CDLL("libiscsi.so.7")
lib.iscsi_create_context.restype = ctypes.c_void_p
lib.iscsi_create_context.argtypes = [ctypes.c_char_p]
lib.iscsi_parse_full_url.restype = ctypes.c_void_p
lib.iscsi_parse_full_url.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
lib.iscsi_get_error.restype = ctypes.c_char_p
lib.iscsi_get_error.argtypes = [ctypes.c_void_p]
for f in ("iscsi_set_targetname",):
    getattr(lib, f).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
lib.iscsi_set_session_type.argtypes = [ctypes.c_void_p, ctypes.c_int]
lib.iscsi_full_connect_sync.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
lib.iscsi_write10_sync.restype = ctypes.c_void_p
lib.iscsi_write10_sync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int] + [ctypes.c_int] * 5
lib.iscsi_read10_sync.restype = ctypes.c_void_p
lib.iscsi_read10_sync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int] + [ctypes.c_int] * 5
lib.scsi_free_scsi_task.argtypes = [ctypes.c_void_p]
lib.iscsi_logout_sync.argtypes = [ctypes.c_void_p]
lib.iscsi_destroy_context.argtypes = [ctypes.c_void_p]

BS, N = 512, 65536
rest = url.split("://", 1)[1]
portal, target, lun = rest.split("/")
lun = int(lun)


def die(step):
    print(f"FAIL iser_check {step}: {lib.iscsi_get_error(ctx).decode(errors='replace')}", flush=True)
    sys.exit(1)


def datain(task):
    """struct scsi_task's datain {int size; unsigned char *data} (libiscsi 1.19 on x86_64: offset 64);
    the size is checked against the request, so a different layout fails, not misreads."""
    size = ctypes.c_int.from_address(task + 64).value
    ptr = ctypes.c_void_p.from_address(task + 72).value
    if size != N or not ptr:
        print(f"FAIL iser_check datain: size {size} (struct scsi_task layout?)", flush=True)
        sys.exit(1)
    return ctypes.string_at(ptr, size)


def status(task):
    return ctypes.c_int.from_address(task).value


ctx = lib.iscsi_create_context(initiator.encode())
if not ctx or not lib.iscsi_parse_full_url(ctx, url.encode()):  # selects the iSER transport
    die("parse url")
lib.iscsi_set_targetname(ctx, target.encode())
lib.iscsi_set_session_type(ctx, 2)  # ISCSI_SESSION_NORMAL
if lib.iscsi_full_connect_sync(ctx, portal.encode(), lun) != 0:
    die("login")

a = os.urandom(N)
t = lib.iscsi_write10_sync(ctx, lun, 2048, a, N, BS, 0, 0, 1, 0, 0)
if not t or status(t) != 0:
    die("write10")
lib.scsi_free_scsi_task(t)
with open(backing, "rb") as f:
    f.seek(2048 * BS)
    if f.read(N) != a:
        print("FAIL iser_check: the backing file does not hold what WRITE(10) sent", flush=True)
        sys.exit(1)

b = os.urandom(N)
with open(backing, "r+b") as f:
    f.seek(4096 * BS)
    f.write(b)
    f.flush()
    os.fsync(f.fileno())
for lba, want, what in ((4096, b, "the file's"), (2048, a, "the written")):
    t = lib.iscsi_read10_sync(ctx, lun, lba, N, BS, 0, 0, 0, 0, 0)
    if not t or status(t) != 0:
        die(f"read10 lba {lba}")
    if datain(t) != want:
        print(f"FAIL iser_check: READ(10) at LBA {lba} differs from {what} data", flush=True)
        sys.exit(1)
    lib.scsi_free_scsi_task(t)
lib.iscsi_logout_sync(ctx)
lib.iscsi_destroy_context(ctx)
print(f"OK iser_check wrote {N} read {2 * N}", flush=True)
