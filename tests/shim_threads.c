/* Several application threads on ONE QP and ONE CQ through the shim at the same time, as verbs
 * allows (the shim's per-queue spinlocks; issue 38: its handles are shared, never `&mut`).
 *
 * QP1 and QP2 are RC QPs on device argv[1] connected to each other; QP1's send CQ is shared by
 * every thread. THREADS threads each post PER_THREAD signaled 8-byte RDMA WRITEs on QP1 (one WR
 * per call, or two linked WRs, inline or from a registered source slot, alternating), each to
 * its own 8-byte target slot with its own value, keeping at most WINDOW of its own WRs
 * outstanding, and all of them poll the shared CQ meanwhile. Checks:
 *  - every WR completes exactly once, SUCCESS, on QP1 (wr_id = thread << 32 | seq);
 *  - completions come in send-queue order: a thread's WRs were posted in seq order, so every
 *    poller sees each posting thread's seqs strictly increasing across its own polls;
 *  - every target slot holds the value its WR wrote.
 * Prints one line per check; exit 0 only if all hold. */
#define PROG "shim_threads"
#include "rc_util.h"
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#ifndef THREADS
#define THREADS 4
#endif
#define PER_THREAD 10000
#define WINDOW 24
#define DEPTH 256

static struct ibv_qp *q1;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static uint64_t *src, *dst; /* one slot per WR each, inside the MR */
static int inline_ok;
static atomic_int completed[THREADS];
static atomic_int seen[THREADS * PER_THREAD];
static atomic_int failures;
static atomic_int total_done;

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint64_t value(int t, int i) { return 0x9e3779b97f4a7c15ull * (uint64_t)(t * PER_THREAD + i + 1); }

static void fail(const char *what, uint64_t a, uint64_t b) {
	if (atomic_fetch_add(&failures, 1) < 10) printf("FAIL %s (%llu, %llu)\n", what, (unsigned long long)a, (unsigned long long)b);
}

/* Poll once; `last` is this poller's last seq seen per posting thread. */
static void poll_once(int *last) {
	struct ibv_wc wc[8];
	int n = ibv_poll_cq(cq, 8, wc);
	if (n < 0) {
		fail("ibv_poll_cq", (uint64_t)-n, 0);
		return;
	}
	for (int k = 0; k < n; k++) {
		uint64_t id = wc[k].wr_id;
		int t = (int)(id >> 32), i = (int)(id & 0xffffffff);
		if (t < 0 || t >= THREADS || i < 0 || i >= PER_THREAD) {
			fail("unknown wr_id", id, 0);
			continue;
		}
		if (wc[k].status != IBV_WC_SUCCESS || wc[k].qp_num != q1->qp_num) fail("status/qp_num", wc[k].status, wc[k].qp_num);
		if (atomic_fetch_add(&seen[t * PER_THREAD + i], 1) != 0) fail("completed twice", id, 0);
		if (i <= last[t]) fail("out of send-queue order (thread seq, after seq)", id, (uint64_t)last[t]);
		last[t] = i;
		atomic_fetch_add(&completed[t], 1);
		atomic_fetch_add(&total_done, 1);
	}
}

static void build(struct ibv_send_wr *wr, struct ibv_sge *sge, int t, int i) {
	int slot = t * PER_THREAD + i;
	src[slot] = value(t, i);
	memset(wr, 0, sizeof *wr);
	*sge = (struct ibv_sge){.addr = (uintptr_t)&src[slot], .length = 8, .lkey = mr->lkey};
	wr->wr_id = (uint64_t)t << 32 | (uint64_t)i;
	wr->sg_list = sge;
	wr->num_sge = 1;
	wr->opcode = IBV_WR_RDMA_WRITE;
	wr->send_flags = IBV_SEND_SIGNALED | (inline_ok && (i & 2) ? IBV_SEND_INLINE : 0);
	wr->wr.rdma.remote_addr = (uintptr_t)&dst[slot];
	wr->wr.rdma.rkey = mr->rkey;
}

static void *worker(void *arg) {
	int t = (int)(intptr_t)arg;
	int last[THREADS];
	for (int k = 0; k < THREADS; k++) last[k] = -1;
	double t0 = now();
	int i = 0;
	while (i < PER_THREAD && now() - t0 < 30.0) {
		if (i - atomic_load(&completed[t]) + 2 > WINDOW) {
			poll_once(last);
			continue;
		}
		struct ibv_send_wr wr[2], *bad = NULL;
		struct ibv_sge sge[2];
		int two = (i % 3 == 0) && i + 1 < PER_THREAD; /* a linked list of two WRs now and then */
		build(&wr[0], &sge[0], t, i);
		if (two) {
			build(&wr[1], &sge[1], t, i + 1);
			wr[0].next = &wr[1];
		}
		int rc = ibv_post_send(q1, &wr[0], &bad);
		if (rc == ENOMEM) { /* the shared send queue is full for now: the first `bad` WRs went */
			i += bad == &wr[1] ? 1 : 0;
			poll_once(last);
			continue;
		}
		if (rc) {
			fail("ibv_post_send", (uint64_t)rc, (uint64_t)i);
			return NULL;
		}
		i += two ? 2 : 1;
		poll_once(last);
	}
	/* Keep polling until every thread's WRs are in (any poller may take anyone's). */
	while (atomic_load(&total_done) < THREADS * PER_THREAD && now() - t0 < 30.0 && atomic_load(&failures) == 0) poll_once(last);
	return NULL;
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: %s DEVICE\n", argv[0]);
		return 2;
	}
	struct ibv_context *ctx = open_dev(argv[1]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	size_t bytes = 2 * sizeof(uint64_t) * THREADS * PER_THREAD;
	src = calloc(1, bytes);
	dst = src + THREADS * PER_THREAD;
	mr = ibv_reg_mr(pd, src, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	cq = ibv_create_cq(ctx, 2 * DEPTH, NULL, NULL, 0);
	struct ibv_cq *cq2 = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !src || !mr || !cq || !cq2) DIE("setup");
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = DEPTH, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 8}};
	q1 = ibv_create_qp(pd, &qa);
	inline_ok = q1 && qa.cap.max_inline_data >= 8;
	qa.send_cq = qa.recv_cq = cq2;
	struct ibv_qp *q2 = ibv_create_qp(pd, &qa);
	if (!q1 || !q2) DIE("create qp");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 1, &gid)) DIE("ibv_query_gid");
	connect_qp(q1, q2->qp_num, &gid, IBV_MTU_1024, IBV_ACCESS_REMOTE_WRITE);
	connect_qp(q2, q1->qp_num, &gid, IBV_MTU_1024, IBV_ACCESS_REMOTE_WRITE);
	printf("%d threads x %d WRITEs on one QP and one CQ (inline %s)\n", THREADS, PER_THREAD, inline_ok ? "every other pair" : "unavailable");
	pthread_t th[THREADS];
	for (int t = 0; t < THREADS; t++)
		if (pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t)) DIE("pthread_create");
	for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
	int missing = 0, wrong = 0;
	for (int k = 0; k < THREADS * PER_THREAD; k++) {
		if (atomic_load(&seen[k]) != 1) missing++;
		if (dst[k] != value(k / PER_THREAD, k % PER_THREAD)) wrong++;
	}
	struct ibv_wc extra;
	int more = ibv_poll_cq(cq, 1, &extra);
	printf("completions: %d of %d, %d missing or repeated, %d more; target slots wrong: %d; failures: %d\n",
	       atomic_load(&total_done), THREADS * PER_THREAD, missing, more, wrong, atomic_load(&failures));
	if (missing || more || wrong || atomic_load(&failures) || !inline_ok) return 1;
	printf("OK shim_threads: every WR completed once, in send-queue order, data intact\n");
	if (ibv_destroy_qp(q1) || ibv_destroy_qp(q2) || ibv_dereg_mr(mr) || ibv_destroy_cq(cq2)) DIE("teardown");
	close_side(cq, pd, ctx);
	free(src);
	return 0;
}
