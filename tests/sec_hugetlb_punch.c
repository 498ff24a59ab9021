/* Attacks on the service through a client's own memory (issue 37), run under the pmrxe shim by
 * tests/security_memory.rs. Each mode prints what happened and exits 0 only if the service
 * answered the way a kernel would have.
 *
 *   sec_hugetlb_punch send    the hugetlb punch-hole attack on a SEND gather
 *   sec_hugetlb_punch write   the same on a loopback RDMA WRITE scatter
 *   sec_hugetlb_punch disk PATH   register a MAP_SHARED mapping of the file PATH (on a disk
 *                                 filesystem): ibv_reg_mr must fail with EFAULT
 *
 * send/write: a hugetlb memfd of two huge pages, sealed against shrinking and growing (the
 * seals the service used to trust), is registered on pmrxe0. The program punches the second
 * huge page out (fallocate PUNCH_HOLE|KEEP_SIZE: no seal forbids it), then takes every free
 * huge page of the machine (MAP_HUGETLB mappings until the kernel refuses), so the service's
 * mapping cannot get a page back: the lcore's next touch of the hole raises SIGBUS. It then
 * makes the lcore touch the hole: a SEND from the hole (pmrxe0 -> pmrxe1) or an RDMA WRITE
 * into it (pmrxe1 -> pmrxe0). Expected: the service survives (the guard rescues the fault),
 * the MR is revoked and this client gets the async event 0x2001 (element: the MR's key), and
 * the next use of the MR fails like a kernel's invalid key: a SEND from it completes with
 * LOC_PROT_ERR (the QP goes to ERROR), a WRITE into it with REM_ACCESS_ERR. Lines printed:
 * "FREE n" (free huge pages after the grab: must be 0), "FIRST status", "EVENT type element",
 * "SECOND status state", "OK mode". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PROG "sec_hugetlb_punch"
#include "rc_util.h"
#define HUGE (2UL << 20)
#define EVENT_MR_REVOKED 0x2001

static long free_huge(void) {
	FILE *f = fopen("/proc/meminfo", "r");
	char l[256];
	long v = -1;
	while (f && fgets(l, sizeof l, f))
		if (sscanf(l, "HugePages_Free: %ld", &v) == 1) break;
	if (f) fclose(f);
	return v;
}

static struct ibv_wc wait_wc(struct ibv_cq *cq, const char *what) {
	struct ibv_wc wc;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0) DIE("%s: poll_cq failed", what);
		if (n == 1) return wc;
		usleep(50); /* leave the 2-core test box to the lcore and the bystander pair */
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 20) DIE("%s: no completion in 20 s", what);
	}
}

/* The next async event of `c` whose type is `type` (others are acknowledged and skipped). */
static struct ibv_async_event wait_event(struct ibv_context *c, int type) {
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		struct pollfd p = {.fd = c->async_fd, .events = POLLIN};
		if (poll(&p, 1, 1000) > 0) {
			struct ibv_async_event ev;
			if (ibv_get_async_event(c, &ev) == 0) {
				ibv_ack_async_event(&ev);
				printf("event %d element %d\n", (int)ev.event_type, ev.element.port_num);
				if ((int)ev.event_type == type) return ev;
			}
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10) DIE("no async event %#x in 10 s", type);
	}
}

static int disk(const char *path) {
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || ftruncate(fd, 4 * 4096)) DIE("disk: create %s: %m", path);
	char *buf = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (buf == MAP_FAILED) DIE("disk: mmap: %m");
	memset(buf, 1, 4 * 4096);
	struct ibv_context *c = open_dev("pmrxe0");
	struct ibv_pd *pd = c ? ibv_alloc_pd(c) : NULL;
	if (!pd) DIE("disk: pd");
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf + 100, 8000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	int e = errno;
	if (mr) DIE("disk: ibv_reg_mr of a MAP_SHARED mapping of %s succeeded", path);
	printf("REFUSED errno=%d (%s)\n", e, strerror(e));
	if (e != EFAULT && e != EINVAL) DIE("disk: refused with errno %d, not EFAULT/EINVAL", e);
	/* The same pages made private are ordinary anonymous memory again: they register. */
	char *priv = malloc(8192);
	memset(priv, 2, 8192);
	mr = ibv_reg_mr(pd, priv, 8192, IBV_ACCESS_LOCAL_WRITE);
	if (!mr) DIE("disk: private memory no longer registers: %m");
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(c);
	printf("OK disk\n");
	return 0;
}

int main(int argc, char **argv) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && !strcmp(argv[1], "disk")) return disk(argv[2]);
	if (argc != 2 || (strcmp(argv[1], "send") && strcmp(argv[1], "write"))) DIE("usage: " PROG " send|write|disk PATH");
	int send_mode = !strcmp(argv[1], "send");

	/* The attacker's memory: a sealed hugetlb memfd, two huge pages, mapped shared. */
	int fd = memfd_create("attacker", MFD_HUGETLB | MFD_ALLOW_SEALING | MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, 2 * HUGE)) DIE("hugetlb memfd: %m (are huge pages reserved?)");
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)) DIE("seal: %m");
	char *buf = mmap(NULL, 2 * HUGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (buf == MAP_FAILED) DIE("mmap hugetlb memfd: %m");
	memset(buf, 0x5a, 2 * HUGE);

	struct ibv_context *c0 = open_dev("pmrxe0"), *c1 = open_dev("pmrxe1");
	if (!c0 || !c1) DIE("open devices");
	struct ibv_pd *pd0 = ibv_alloc_pd(c0), *pd1 = ibv_alloc_pd(c1);
	struct ibv_cq *cq0 = ibv_create_cq(c0, 16, NULL, NULL, 0), *cq1 = ibv_create_cq(c1, 16, NULL, NULL, 0);
	if (!pd0 || !pd1 || !cq0 || !cq1) DIE("pd/cq");
	struct ibv_mr *mr = ibv_reg_mr(pd0, buf, 2 * HUGE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr) DIE("ibv_reg_mr of the hugetlb memfd: %m");
	char *other = malloc(HUGE);
	memset(other, 0x33, HUGE);
	struct ibv_mr *omr = ibv_reg_mr(pd1, other, HUGE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!omr) DIE("ibv_reg_mr (peer buffer): %m");
	struct ibv_qp *q0, *q1;
	rc_pair(c0, pd0, cq0, c1, pd1, cq1, 8, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, &q0, &q1);
	printf("REGISTERED lkey %#x\n", mr->lkey);

	/* The attack: punch the second huge page out, then take every free huge page. */
	if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, HUGE, HUGE)) DIE("punch hole: %m");
	int grabbed = 0;
	for (;;) {
		void *p = mmap(NULL, HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1, 0);
		if (p == MAP_FAILED) break;
		memset(p, 1, 64);
		grabbed++;
	}
	printf("GRABBED %d FREE %ld\n", grabbed, free_huge());
	if (free_huge() != 0) DIE("could not take every free huge page");

	struct ibv_sge rs = {.addr = (uintptr_t)other, .length = 4096, .lkey = omr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 9, .sg_list = &rs, .num_sge = 1}, *rbad;
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	if (send_mode) {
		/* SEND gather from the hole (pmrxe0 -> pmrxe1). */
		for (int i = 0; i < 2; i++)
			if (ibv_post_recv(q1, &rwr, &rbad)) DIE("post_recv");
		struct ibv_sge s = {.addr = (uintptr_t)(buf + HUGE + 4096), .length = 256, .lkey = mr->lkey};
		struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
		if (ibv_post_send(q0, &wr, &bad)) DIE("post_send");
		wc = wait_wc(cq0, "first SEND");
		printf("FIRST %s\n", ibv_wc_status_str(wc.status));
	} else {
		/* RDMA WRITE scatter into the hole (pmrxe1 -> pmrxe0). */
		struct ibv_sge s = {.addr = (uintptr_t)other, .length = 8192, .lkey = omr->lkey};
		struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
		wr.wr.rdma.remote_addr = (uintptr_t)(buf + HUGE + 4096);
		wr.wr.rdma.rkey = mr->rkey;
		if (ibv_post_send(q1, &wr, &bad)) DIE("post_send");
		wc = wait_wc(cq1, "first WRITE");
		printf("FIRST %s\n", ibv_wc_status_str(wc.status));
	}
	/* The service revoked the MR and told us. */
	struct ibv_async_event ev = wait_event(c0, EVENT_MR_REVOKED);
	printf("EVENT %#x %#x\n", (unsigned)ev.event_type, (unsigned)ev.element.port_num);
	if ((uint32_t)ev.element.port_num != mr->lkey) DIE("the revocation event names %#x, not the MR %#x", (unsigned)ev.element.port_num, mr->lkey);

	/* Every later use of the MR fails as with an invalid key, even on the page still there. */
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	if (send_mode) {
		struct ibv_sge s = {.addr = (uintptr_t)buf + 64, .length = 256, .lkey = mr->lkey};
		struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
		if (ibv_post_send(q0, &wr, &bad)) DIE("post_send 2");
		wc = wait_wc(cq0, "second SEND");
		if (ibv_query_qp(q0, &qattr, IBV_QP_STATE, &qinit)) DIE("query_qp");
		printf("SECOND %s state %d\n", ibv_wc_status_str(wc.status), qattr.qp_state);
		if (wc.status != IBV_WC_LOC_PROT_ERR) DIE("a SEND from the revoked MR completed with %s, not LOC_PROT_ERR", ibv_wc_status_str(wc.status));
		if (qattr.qp_state != IBV_QPS_ERR) DIE("the QP is in state %d, not ERROR", qattr.qp_state);
	} else {
		struct ibv_sge s = {.addr = (uintptr_t)other, .length = 64, .lkey = omr->lkey};
		struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
		wr.wr.rdma.remote_addr = (uintptr_t)buf + 64;
		wr.wr.rdma.rkey = mr->rkey;
		if (ibv_post_send(q1, &wr, &bad)) DIE("post_send 2");
		wc = wait_wc(cq1, "second WRITE");
		if (ibv_query_qp(q1, &qattr, IBV_QP_STATE, &qinit)) DIE("query_qp");
		printf("SECOND %s state %d\n", ibv_wc_status_str(wc.status), qattr.qp_state);
		if (wc.status != IBV_WC_REM_ACCESS_ERR) DIE("a WRITE into the revoked MR completed with %s, not REM_ACCESS_ERR", ibv_wc_status_str(wc.status));
		if (qattr.qp_state != IBV_QPS_ERR) DIE("the requester QP is in state %d, not ERROR", qattr.qp_state);
	}
	/* Teardown works as usual (the revoked MR deregisters). */
	if (ibv_destroy_qp(q0) || ibv_destroy_qp(q1)) DIE("destroy qp");
	if (ibv_dereg_mr(mr)) DIE("dereg of the revoked MR: %m");
	if (ibv_dereg_mr(omr)) DIE("dereg");
	close_side(cq0, pd0, c0);
	close_side(cq1, pd1, c1);
	printf("OK %s\n", argv[1]);
	return 0;
}
