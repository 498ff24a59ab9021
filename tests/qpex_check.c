/* The ibv_wr_* API's batch semantics through the shim (issue 38: the batch is staged in the send
 * ring's own slots and published at ibv_wr_complete, or dropped).
 *
 * QP1 (created with ibv_create_qp_ex, RDMA WRITE and SEND builders) and QP2 are RC QPs on
 * device argv[1] connected to each other. Every case ends with a marker WRITE posted with
 * ibv_post_send and polls until the marker completes: completions come in send-queue order, so
 * anything a dropped batch had let through would complete before the marker. Checks:
 *  A. a batch of three WRITEs completes in order (wr_ids, SUCCESS) and places its bytes;
 *  B. a builder error in the middle (more SGEs than max_send_sge) fails ibv_wr_complete with
 *     EINVAL and none of the batch runs, not even the WQE before the error;
 *  C. a batch of one more WQE than the send ring holds fails with ENOMEM and none of it runs;
 *  D. ibv_wr_abort drops the batch;
 *  E. ibv_wr_set_sge with no WQE in the batch fails the batch (EINVAL);
 *  F. inline data set with ibv_wr_set_inline_data is placed;
 *  G. after all of that a batch of exactly as many WQEs as the ring holds completes in order
 *     (the dropped batches gave their slots back).
 * Prints one line per case; exit 0 only if all hold. */
#define PROG "qpex_check"
#include "rc_util.h"
#include <errno.h>
#include <time.h>

#define SLOT 64
#define SLOTS 256

static struct ibv_cq *cq;
static struct ibv_qp *q1;
static struct ibv_qp_ex *qx;
static struct ibv_mr *mr;
static uint8_t *src, *dst; /* SLOTS slots of SLOT bytes each, both in one MR */
static int failures;

static void check(int ok, const char *what) {
	if (!ok) failures++;
	printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Poll until `n` completions are in (or 10 s pass); returns how many came. */
static int poll_n(struct ibv_wc *wc, int n) {
	int got = 0;
	double t0 = now();
	while (got < n && now() - t0 < 10.0) {
		int k = ibv_poll_cq(cq, n - got, wc + got);
		if (k < 0) DIE("ibv_poll_cq %d", k);
		got += k;
	}
	return got;
}

static void fill(int slot, uint8_t seed) {
	for (int i = 0; i < SLOT; i++) src[slot * SLOT + i] = (uint8_t)(seed + i * 7);
}

static void write_wqe(uint64_t wr_id, int slot) {
	qx->wr_id = wr_id;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, mr->rkey, (uintptr_t)(dst + slot * SLOT));
	ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)(src + slot * SLOT), SLOT);
}

/* A WRITE through ibv_post_send into `slot`; returns 1 if it is the next and only completion. */
static int marker(uint64_t wr_id, int slot) {
	struct ibv_sge sge = {.addr = (uintptr_t)(src + slot * SLOT), .length = SLOT, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED}, *bad = NULL;
	wr.wr.rdma.remote_addr = (uintptr_t)(dst + slot * SLOT);
	wr.wr.rdma.rkey = mr->rkey;
	if (ibv_post_send(q1, &wr, &bad)) DIE("ibv_post_send marker");
	struct ibv_wc wc[4];
	int got = poll_n(wc, 1);
	if (got != 1 || wc[0].wr_id != wr_id || wc[0].status != IBV_WC_SUCCESS) {
		printf("     marker %llu: got %d completion(s), first wr_id %llu status %d\n", (unsigned long long)wr_id, got,
		       got ? (unsigned long long)wc[0].wr_id : 0ull, got ? wc[0].status : -1);
		return 0;
	}
	return memcmp(src + slot * SLOT, dst + slot * SLOT, SLOT) == 0;
}

static int untouched(int first, int n) {
	for (int i = first * SLOT; i < (first + n) * SLOT; i++)
		if (dst[i]) return 0;
	return 1;
}

/* A batch of `n` WRITEs into slots first.. completes in order with its bytes placed. */
static int batch_ok(int first, int n, uint64_t id0, uint8_t seed) {
	ibv_wr_start(qx);
	for (int i = 0; i < n; i++) {
		fill(first + i, (uint8_t)(seed + i));
		write_wqe(id0 + (uint64_t)i, first + i);
	}
	int rc = ibv_wr_complete(qx);
	if (rc) {
		printf("     ibv_wr_complete: %d\n", rc);
		return 0;
	}
	struct ibv_wc wc[SLOTS];
	int got = poll_n(wc, n), ok = got == n;
	for (int i = 0; ok && i < n; i++) ok = wc[i].wr_id == id0 + (uint64_t)i && wc[i].status == IBV_WC_SUCCESS;
	return ok && memcmp(src + first * SLOT, dst + first * SLOT, (size_t)n * SLOT) == 0;
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: %s DEVICE\n", argv[0]);
		return 2;
	}
	struct ibv_context *ctx = open_dev(argv[1]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	src = calloc(2, SLOTS * SLOT);
	dst = src + SLOTS * SLOT;
	mr = ibv_reg_mr(pd, src, 2 * SLOTS * SLOT, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	cq = ibv_create_cq(ctx, 2 * SLOTS, NULL, NULL, 0);
	struct ibv_cq *cq2 = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !src || !mr || !cq || !cq2) DIE("setup");
	struct ibv_qp_init_attr_ex qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
					 .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					 .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND,
					 .cap = {.max_send_wr = 8, .max_recv_wr = 4, .max_send_sge = 2, .max_recv_sge = 1,
						 .max_inline_data = 16}};
	q1 = ibv_create_qp_ex(ctx, &qa);
	if (!q1) DIE("ibv_create_qp_ex: %s", strerror(errno));
	qx = ibv_qp_to_qp_ex(q1);
	struct ibv_qp_init_attr pa = {.send_cq = cq2, .recv_cq = cq2, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *q2 = ibv_create_qp(pd, &pa);
	if (!qx || !q2) DIE("create qp");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 1, &gid)) DIE("ibv_query_gid");
	connect_qp(q1, q2->qp_num, &gid, IBV_MTU_1024, IBV_ACCESS_REMOTE_WRITE);
	connect_qp(q2, q1->qp_num, &gid, IBV_MTU_1024, IBV_ACCESS_REMOTE_WRITE);
	/* The send ring holds max_send_wr rounded up to a power of two. */
	int ring = 1;
	while (ring < (int)qa.cap.max_send_wr) ring <<= 1;
	if (ring + 1 + 40 > SLOTS) DIE("send ring of %d too large for the test's %d slots", ring, SLOTS);
	printf("QP %u: max_send_wr %u (ring %d), max_send_sge %u, max_inline_data %u\n", q1->qp_num, qa.cap.max_send_wr, ring,
	       qa.cap.max_send_sge, qa.cap.max_inline_data);

	check(batch_ok(0, 3, 100, 1), "A: a batch of three WRITEs completes in order and places its bytes");

	ibv_wr_start(qx);
	fill(10, 11);
	write_wqe(200, 10);
	qx->wr_id = 201;
	ibv_wr_rdma_write(qx, mr->rkey, (uintptr_t)(dst + 11 * SLOT));
	uint32_t too_many = qa.cap.max_send_sge + 1;
	struct ibv_sge *sges = calloc(too_many, sizeof *sges);
	for (uint32_t i = 0; i < too_many; i++) sges[i] = (struct ibv_sge){.addr = (uintptr_t)(src + 11 * SLOT), .length = 8, .lkey = mr->lkey};
	ibv_wr_set_sge_list(qx, too_many, sges);
	free(sges);
	fill(12, 12);
	write_wqe(202, 12);
	int rc = ibv_wr_complete(qx);
	fill(13, 13);
	check(rc == EINVAL && marker(299, 13) && untouched(10, 3), "B: a builder error fails the batch with EINVAL and none of it runs");

	ibv_wr_start(qx);
	for (int i = 0; i < ring + 1; i++) {
		fill(20 + i, (uint8_t)(20 + i));
		write_wqe(300 + (uint64_t)i, 20 + i);
	}
	rc = ibv_wr_complete(qx);
	fill(19, 19);
	check(rc == ENOMEM && marker(399, 19) && untouched(20, ring + 1), "C: one WQE more than the ring holds fails with ENOMEM and none of it runs");

	ibv_wr_start(qx);
	fill(14, 14);
	write_wqe(400, 14);
	ibv_wr_abort(qx);
	fill(15, 15);
	check(marker(499, 15) && untouched(14, 1), "D: ibv_wr_abort drops the batch");

	ibv_wr_start(qx);
	ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)src, 8);
	rc = ibv_wr_complete(qx);
	fill(16, 16);
	check(rc == EINVAL && marker(599, 16), "E: ibv_wr_set_sge without a WQE fails the batch with EINVAL");

	uint8_t text[16];
	for (int i = 0; i < 16; i++) text[i] = (uint8_t)(0xa0 + i);
	ibv_wr_start(qx);
	qx->wr_id = 600;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_write(qx, mr->rkey, (uintptr_t)(dst + 17 * SLOT));
	ibv_wr_set_inline_data(qx, text, sizeof text);
	rc = ibv_wr_complete(qx);
	struct ibv_wc wc;
	int got = rc ? 0 : poll_n(&wc, 1);
	check(rc == 0 && got == 1 && wc.wr_id == 600 && wc.status == IBV_WC_SUCCESS && !memcmp(dst + 17 * SLOT, text, sizeof text) &&
		      dst[17 * SLOT + sizeof text] == 0,
	      "F: inline data set with ibv_wr_set_inline_data is placed");

	check(batch_ok(40, ring, 700, 40), "G: a batch of exactly the ring's size completes in order afterwards");

	struct ibv_wc extra;
	check(ibv_poll_cq(cq, 1, &extra) == 0, "no completion left over");
	if (failures) return 1;
	printf("OK qpex_check\n");
	if (ibv_destroy_qp(q1) || ibv_destroy_qp(q2) || ibv_dereg_mr(mr) || ibv_destroy_cq(cq2)) DIE("teardown");
	close_side(cq, pd, ctx);
	free(src);
	return 0;
}
