/* MPI ping-pong + allreduce with data checks (issue 14: Open MPI over UCX over pmrxe).
 * Rank 0 and 1 exchange ITERS messages of every size in SIZES, each filled with a pattern
 * that depends on (iteration, size, sender) and checked byte by byte on receipt; then an
 * MPI_Allreduce of a vector checked against the closed-form sum. Prints "OK mpi" on rank 0.
 * One untimed 1 B exchange comes first (lazy connection set-up is not latency).
 * An optional argument sets ITERS (default 100), for launchers whose tests must stay short. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ITERS = 100;

static void fill(unsigned char *b, int n, int it, int who) {
    for (int i = 0; i < n; i++) b[i] = (unsigned char)(i * 7 + it * 13 + who * 101 + n);
}

static int check(const unsigned char *b, int n, int it, int who) {
    for (int i = 0; i < n; i++)
        if (b[i] != (unsigned char)(i * 7 + it * 13 + who * 101 + n)) return i;
    return -1;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 1) ITERS = atoi(argv[1]);
    if (ITERS < 1) {
        if (rank == 0) fprintf(stderr, "iterations must be >= 1\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (size != 2) {
        if (rank == 0) fprintf(stderr, "needs exactly 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const int sizes[] = {1, 64, 4096, 65536, 1 << 20};
    unsigned char *buf = malloc(1 << 20);
    int peer = 1 - rank;
    /* One untimed exchange first: MPI libraries connect lazily (UCX wires up an endpoint on
     * its first send), and the 1 B row would otherwise time the connection. */
    unsigned char w = (unsigned char)rank;
    if (rank == 0) {
        MPI_Send(&w, 1, MPI_BYTE, peer, 32767, MPI_COMM_WORLD);
        MPI_Recv(&w, 1, MPI_BYTE, peer, 32767, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(&w, 1, MPI_BYTE, peer, 32767, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(&w, 1, MPI_BYTE, peer, 32767, MPI_COMM_WORLD);
    }
    double t0 = MPI_Wtime();
    for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        int n = sizes[s];
        double ts = MPI_Wtime();
        for (int it = 0; it < ITERS; it++) {
            if (rank == 0) {
                fill(buf, n, it, 0);
                MPI_Send(buf, n, MPI_BYTE, peer, it, MPI_COMM_WORLD);
                memset(buf, 0, (size_t)(unsigned)n);
                MPI_Recv(buf, n, MPI_BYTE, peer, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                int bad = check(buf, n, it, 1);
                if (bad >= 0) {
                    fprintf(stderr, "rank 0: size %d iter %d: byte %d wrong\n", n, it, bad);
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
            } else {
                memset(buf, 0, (size_t)(unsigned)n);
                MPI_Recv(buf, n, MPI_BYTE, peer, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                int bad = check(buf, n, it, 0);
                if (bad >= 0) {
                    fprintf(stderr, "rank 1: size %d iter %d: byte %d wrong\n", n, it, bad);
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
                fill(buf, n, it, 1);
                MPI_Send(buf, n, MPI_BYTE, peer, it, MPI_COMM_WORLD);
            }
        }
        double dt = MPI_Wtime() - ts;
        if (rank == 0)
            printf("pingpong %7d B: %8.2f us half round trip, %8.1f MB/s\n", n, dt / ITERS / 2 * 1e6,
                   2.0 * n * ITERS / dt / 1e6);
    }
    enum { N = 100000 };
    double *v = malloc(N * sizeof(double)), *r = malloc(N * sizeof(double));
    for (int i = 0; i < N; i++) v[i] = (double)i * (rank + 1);
    MPI_Allreduce(v, r, N, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < N; i++)
        if (r[i] != 3.0 * i) {
            fprintf(stderr, "rank %d: allreduce[%d] = %f, want %f\n", rank, i, r[i], 3.0 * i);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    if (rank == 0) printf("allreduce of %d doubles checked; total %.2f s\nOK mpi\n", N, MPI_Wtime() - t0);
    free(v);
    free(r);
    free(buf);
    MPI_Finalize();
    return 0;
}
