"""mpi4py over whatever MPI it is built for (issue 40): two ranks exchange NumPy-free byte
buffers of several sizes with every byte checked, then an allreduce checked against its
closed form. Prints "OK mpi4py" on rank 0. Run with /usr/bin/python3 (Debian's mpi4py)."""
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 2, "needs exactly 2 ranks"
peer = 1 - rank


def pattern(n, it, who):
    return bytes((i * 7 + it * 13 + who * 101 + n) & 0xFF for i in range(n))


t0 = MPI.Wtime()
for n in (1, 4096, 65536, 1 << 20):
    expect = pattern(n, 0, peer)
    mine = pattern(n, 0, rank)
    for it in range(10):
        buf = bytearray(n)
        if rank == 0:
            comm.Send([mine, MPI.BYTE], dest=peer, tag=it)
            comm.Recv([buf, MPI.BYTE], source=peer, tag=it)
        else:
            comm.Recv([buf, MPI.BYTE], source=peer, tag=it)
            comm.Send([mine, MPI.BYTE], dest=peer, tag=it)
        if bytes(buf) != expect:
            bad = next(i for i in range(n) if buf[i] != expect[i])
            raise SystemExit(f"rank {rank}: {n} B message {it}: byte {bad} wrong")
total = comm.allreduce(sum(range(rank * 1000, rank * 1000 + 1000)), op=MPI.SUM)
if total != sum(range(2000)):
    raise SystemExit(f"allreduce {total} != {sum(range(2000))}")
objs = comm.allgather({"rank": rank, "data": list(range(rank, rank + 100))})
if [o["data"][0] for o in objs] != [0, 1]:
    raise SystemExit(f"allgather {objs!r}")
if rank == 0:
    print(f"OK mpi4py {MPI.Get_library_version().splitlines()[0]} in {MPI.Wtime() - t0:.2f} s")
