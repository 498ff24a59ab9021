/* Registers memory of one kind and RDMA-WRITEs into it from another QP, through the pmrxe
 * shim (run under `pmrxe run --`). Built and driven by tests/shared_memory.rs.
 *
 *   shared_mr KIND     KIND: memfd file sysv anon_shared memfd_huge sysv_huge anon_huge
 *                            memfd_shrunk
 *
 * The destination MR is registered on pmrxe0 over an unaligned part of the KIND memory; a
 * QP on pmrxe1 writes a pattern into it. Checked here: the application sees the bytes, and
 * for memory with a second view (the memfd/file mapped again, the SysV segment attached
 * again) the second view sees them too, i.e. the service wrote the file's own pages. Then it
 * prints "MAPPED <major>:<minor> <inode>" (the file backing the registration, as
 * /proc/self/maps shows it), waits for a line on stdin (the test inspects the service's
 * /proc/PID/smaps meanwhile), deregisters and exits 0. Any failure: message, exit 1.
 * memfd_shrunk: the memfd is truncated to 0 right after the registration, so the service's
 * WRITE lands beyond the end of the file: the service must survive; the WRITE completes, or
 * fails with a remote access error once the service has revoked the MR whose memory vanished
 * (issue 37); the application cannot look at those pages any more (SIGBUS), so no checks. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

#define PROG "shared_mr"
#include "rc_util.h"
#define HUGE (2UL << 20)

int main(int argc, char **argv) {
	if (argc != 2) DIE("usage: shared_mr KIND");
	const char *kind = argv[1];
	int huge = strstr(kind, "huge") != NULL;
	size_t page = huge ? HUGE : 4096;
	size_t size = huge ? 2 * HUGE : 16 * 4096;
	off_t foff = page; /* file offset of the mapping, where the kind has one */
	char *buf = NULL, *view = NULL;
	int shrunk = !strcmp(kind, "memfd_shrunk"), memfd = -1;
	if (shrunk) kind = "memfd";

	if (!strcmp(kind, "memfd") || !strcmp(kind, "memfd_huge") || !strcmp(kind, "file")) {
		int fd;
		char path[] = "/dev/shm/pmrxe-shared-mr-XXXXXX"; /* tmpfs: a disk file is refused (issue 37) */
		if (!strcmp(kind, "file")) {
			fd = mkstemp(path);
			unlink(path);
		} else {
			fd = memfd_create("app-region", huge ? MFD_HUGETLB : 0);
		}
		if (fd < 0 || ftruncate(fd, foff + size)) DIE("%s: create/size failed", kind);
		memfd = fd;
		buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, foff);
		view = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, foff);
		if (buf == MAP_FAILED || view == MAP_FAILED) DIE("%s: mmap failed", kind);
	} else if (!strcmp(kind, "sysv") || !strcmp(kind, "sysv_huge")) {
		int id = shmget(IPC_PRIVATE, size, IPC_CREAT | 0600 | (huge ? SHM_HUGETLB : 0));
		if (id < 0) DIE("%s: shmget failed", kind);
		buf = shmat(id, NULL, 0);
		view = shmat(id, NULL, 0);
		shmctl(id, IPC_RMID, NULL); /* like perftest: freed on the last detach */
		if (buf == (void *)-1 || view == (void *)-1) DIE("%s: shmat failed", kind);
	} else if (!strcmp(kind, "anon_shared")) {
		buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	} else if (!strcmp(kind, "anon_huge")) {
		buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	} else {
		DIE("unknown kind %s", kind);
	}
	if (buf == MAP_FAILED) DIE("%s: mmap failed", kind);
	memset(buf, 0x11, size);

	/* Unaligned, starting and ending inside a (huge) page. */
	size_t off = 4096 + 8, len = size / 2 + 12345;
	struct ibv_context *c0 = open_dev("pmrxe0"), *c1 = open_dev("pmrxe1");
	if (!c0 || !c1) DIE("open devices");
	struct ibv_pd *pd0 = ibv_alloc_pd(c0), *pd1 = ibv_alloc_pd(c1);
	struct ibv_cq *cq0 = ibv_create_cq(c0, 16, NULL, NULL, 0), *cq1 = ibv_create_cq(c1, 16, NULL, NULL, 0);
	if (!pd0 || !pd1 || !cq0 || !cq1) DIE("pd/cq");
	struct ibv_mr *dst = ibv_reg_mr(pd0, buf + off, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!dst) DIE("%s: ibv_reg_mr failed: %m", kind);
	/* The registration must not have moved the application's data. */
	for (size_t i = 0; i < size; i++)
		if ((unsigned char)buf[i] != 0x11) DIE("%s: byte %zu changed by the registration", kind, i);
	if (shrunk && ftruncate(memfd, 0)) DIE("ftruncate");
	char *src_buf = malloc(len);
	for (size_t i = 0; i < len; i++) src_buf[i] = (char)(i * 13 + 7);
	struct ibv_mr *src = ibv_reg_mr(pd1, src_buf, len, IBV_ACCESS_LOCAL_WRITE);
	if (!src) DIE("src ibv_reg_mr failed");

	struct ibv_qp *q0, *q1;
	rc_pair(c0, pd0, cq0, c1, pd1, cq1, 4, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, &q0, &q1);

	struct ibv_sge sge = {.addr = (uintptr_t)src_buf, .length = (uint32_t)len, .lkey = src->lkey};
	struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED}, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)(buf + off);
	wr.wr.rdma.rkey = dst->rkey;
	if (ibv_post_send(q1, &wr, &bad)) DIE("post_send");
	struct ibv_wc wc;
	int n;
	for (long spins = 0; (n = ibv_poll_cq(cq1, 1, &wc)) == 0; spins++)
		if (spins > 2000000000L) DIE("no completion");
	/* memfd_shrunk: the first page the WRITE touches faults in the service; the guard rescues
	 * it and the service revokes the MR (issue 37), so the rest of a multi-packet WRITE may be
	 * NAKed: success or a remote access error, never a dead service. */
	if (n < 0 || (wc.status != IBV_WC_SUCCESS && !(shrunk && wc.status == IBV_WC_REM_ACCESS_ERR)))
		DIE("WRITE failed: %s", ibv_wc_status_str(wc.status));
	if (shrunk) fprintf(stderr, PROG ": memfd_shrunk: WRITE %s\n", ibv_wc_status_str(wc.status));

	for (size_t i = 0; i < len && !shrunk; i++) {
		if (buf[off + i] != src_buf[i]) DIE("%s: app view byte %zu wrong", kind, i);
		if (view && view[off + i] != src_buf[i]) DIE("%s: second view of the file, byte %zu wrong: the service wrote a copy", kind, i);
	}
	if (!shrunk && ((unsigned char)buf[off - 1] != 0x11 || (unsigned char)buf[off + len] != 0x11)) DIE("%s: bytes around the MR changed", kind);

	/* The file now backing the registered pages. */
	FILE *m = fopen("/proc/self/maps", "r");
	char line[512];
	unsigned long a = (unsigned long)(buf + off), s, e, ino = 0;
	char dev[32] = "";
	while (m && fgets(line, sizeof line, m))
		if (sscanf(line, "%lx-%lx %*s %*s %31s %lu", &s, &e, dev, &ino) == 4 && s <= a && a < e) break;
	printf("MAPPED %s %lu\n", dev, ino);
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin)) { /* the test closed stdin: carry on */ }

	if (ibv_destroy_qp(q0) || ibv_destroy_qp(q1) || ibv_dereg_mr(dst) || ibv_dereg_mr(src)) DIE("teardown");
	close_side(cq0, pd0, c0);
	close_side(cq1, pd1, c1);
	printf("OK %s\n", shrunk ? "memfd_shrunk" : kind);
	return 0;
}
