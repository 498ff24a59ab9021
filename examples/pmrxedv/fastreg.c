/* fastreg.c - pmrxedv fast registration end to end, in one process, across pmrxe0/pmrxe1.
 *
 * Side A (pmrxe0) owns a buffer and exposes it through a fast-registration MR; side B (pmrxe1)
 * is the remote peer that WRITEs and READs it. The program checks that the peer sees exactly
 * the rights and data expected at every step:
 *
 *   1. map 2 pages, key byte 1, rights REMOTE_WRITE|REMOTE_READ: B WRITEs a pattern, A's
 *      buffer holds it; B READs it back.
 *   2. LOCAL_INV the key; remap 1 page at a different offset, key byte 2, REMOTE_READ only:
 *      B READs (sees A's current bytes there), and B's WRITE with key 2 fails with
 *      IBV_WC_REM_ACCESS_ERR (A's bytes unchanged).
 *   3. Reconnect the QPs (the error moved them to ERR); B WRITEs with the invalidated key 1:
 *      IBV_WC_REM_ACCESS_ERR again, A's bytes unchanged.
 *
 * Run:  pmrxe run -- ./fastreg        (exit status 0 = all checks passed)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include "pmrxedv.h"

#define PAGE 4096
#define GID_INDEX 1

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	union ibv_gid gid;
};

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
	fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); failures++; } } while (0)
#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(2); } while (0)

static struct ibv_context *open_dev(const char *name)
{
	int n, i;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;

	if (!list)
		DIE("ibv_get_device_list: %s", strerror(errno));
	for (i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx)
		DIE("cannot open %s", name);
	return ctx;
}

static void setup(struct side *s, const char *dev)
{
	struct ibv_qp_init_attr qa = { 0 };

	s->ctx = open_dev(dev);
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	if (!s->pd || !s->cq)
		DIE("%s: pd/cq: %s", dev, strerror(errno));
	qa.send_cq = qa.recv_cq = s->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 32;
	qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	s->qp = ibv_create_qp(s->pd, &qa);
	if (!s->qp)
		DIE("%s: create_qp: %s", dev, strerror(errno));
	if (ibv_query_gid(s->ctx, 1, GID_INDEX, &s->gid))
		DIE("%s: query_gid", dev);
}

/* rq_psn must equal the peer's sq_psn. */
static void to_rts(struct side *s, struct side *peer, uint32_t rq_psn, uint32_t sq_psn)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RESET;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE))
		DIE("RESET");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		DIE("INIT: %s", strerror(errno));
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.sgid_index = GID_INDEX;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		DIE("RTR: %s", strerror(errno));
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = sq_psn;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		DIE("RTS: %s", strerror(errno));
}

static void connect_pair(struct side *a, struct side *b, uint32_t psn)
{
	to_rts(a, b, psn + 1000, psn);
	to_rts(b, a, psn, psn + 1000);
}

/* Wait for one completion on s->cq; return its status. */
static int wait_wc(struct side *s, uint64_t wr_id)
{
	struct ibv_wc wc;
	long spins = 0;
	int n;

	for (;;) {
		n = ibv_poll_cq(s->cq, 1, &wc);
		if (n < 0)
			DIE("poll_cq: %d", n);
		if (n == 1)
			break;
		if (++spins > 2000000000L)
			DIE("timeout waiting for wr_id %llu", (unsigned long long)wr_id);
	}
	if (wc.wr_id != wr_id)
		fprintf(stderr, "note: got wr_id %llu, expected %llu (%s)\n", (unsigned long long)wc.wr_id,
			(unsigned long long)wr_id, ibv_wc_status_str(wc.status));
	return wc.status;
}

static int rdma(struct side *s, enum ibv_wr_opcode op, struct ibv_mr *lmr, void *laddr, uint32_t len,
		uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)laddr, .length = len, .lkey = lmr->lkey };
	struct ibv_send_wr wr = { 0 }, *bad;

	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(s->qp, &wr, &bad))
		DIE("post_send: %s", strerror(errno));
	return wait_wc(s, wr_id);
}

int main(void)
{
	struct side A, B;
	unsigned char *abuf, *bbuf;
	struct ibv_mr *fmr, *bmr;
	struct ibv_sge sg;
	unsigned int off;
	uint32_t key1, key2;
	int st, i, n;

	setup(&A, "pmrxe0");
	setup(&B, "pmrxe1");
	connect_pair(&A, &B, 100);

	abuf = aligned_alloc(PAGE, 4 * PAGE);
	bbuf = aligned_alloc(PAGE, 4 * PAGE);
	memset(abuf, 0xAA, 4 * PAGE);
	memset(bbuf, 0, 4 * PAGE);
	bmr = ibv_reg_mr(B.pd, bbuf, 4 * PAGE, IBV_ACCESS_LOCAL_WRITE);
	fmr = pmrxedv_alloc_mr(A.pd, 4);
	if (!bmr || !fmr)
		DIE("reg/alloc_mr: %s", strerror(errno));

	/* 0. sanity: the pair works with an ordinary MR (separates transport from fast-reg) */
	{
		struct ibv_mr *amr = ibv_reg_mr(A.pd, abuf + 3 * PAGE, PAGE, IBV_ACCESS_LOCAL_WRITE |
						IBV_ACCESS_REMOTE_WRITE);
		if (!amr)
			DIE("reg_mr A: %s", strerror(errno));
		memset(bbuf, 0x11, 64);
		st = rdma(&B, IBV_WR_RDMA_WRITE, bmr, bbuf, 64, (uintptr_t)abuf + 3 * PAGE, amr->rkey, 5);
		CHECK(st == IBV_WC_SUCCESS && abuf[3 * PAGE] == 0x11, "WRITE into an ordinary MR: %s",
		      ibv_wc_status_str(st));
		CHECK(ibv_dereg_mr(amr) == 0, "dereg ordinary MR");
		if (failures)
			DIE("the QP pair does not work; not testing fast registration");
	}

	/* 1. two pages, RW, key byte 1 */
	sg.addr = (uintptr_t)abuf;
	sg.length = 2 * PAGE;
	sg.lkey = 0;
	off = 0;
	n = pmrxedv_map_mr_sg(fmr, &sg, 1, &off, PAGE);
	CHECK(n == 1, "map_mr_sg 1 returned %d", n);
	CHECK(fmr->addr == abuf && fmr->length == 2 * PAGE, "map 1: addr/length");
	pmrxedv_update_fast_reg_key(fmr, 1);
	key1 = fmr->rkey;
	CHECK(pmrxedv_post_reg_mr(A.qp, 1, fmr, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				  IBV_ACCESS_REMOTE_READ, IBV_SEND_SIGNALED) == 0, "post_reg_mr 1");
	CHECK(wait_wc(&A, 1) == IBV_WC_SUCCESS, "REG_MR 1 completion");

	for (i = 0; i < 2 * PAGE; i++)
		bbuf[i] = (unsigned char)(i * 13 + 1);
	st = rdma(&B, IBV_WR_RDMA_WRITE, bmr, bbuf, 2 * PAGE, (uintptr_t)abuf, key1, 10);
	CHECK(st == IBV_WC_SUCCESS, "WRITE with key1: %s", ibv_wc_status_str(st));
	for (i = 0; i < 2 * PAGE; i++)
		if (abuf[i] != (unsigned char)(i * 13 + 1)) {
			CHECK(0, "A's buffer byte %d after WRITE: %02x", i, abuf[i]);
			break;
		}
	CHECK(abuf[2 * PAGE] == 0xAA, "WRITE went past the MR");
	st = rdma(&B, IBV_WR_RDMA_READ, bmr, bbuf + 2 * PAGE, 100, (uintptr_t)abuf + 50, key1, 11);
	CHECK(st == IBV_WC_SUCCESS, "READ with key1: %s", ibv_wc_status_str(st));
	CHECK(!memcmp(bbuf + 2 * PAGE, abuf + 50, 100), "READ data with key1");

	/* 2. invalidate, remap page 3 read-only under key byte 2 */
	CHECK(pmrxedv_post_local_inv(A.qp, 2, key1, IBV_SEND_SIGNALED) == 0, "post_local_inv");
	CHECK(wait_wc(&A, 2) == IBV_WC_SUCCESS, "LOCAL_INV completion");
	memset(abuf + 3 * PAGE, 0x5C, PAGE);
	sg.addr = (uintptr_t)abuf + 3 * PAGE;
	sg.length = PAGE;
	off = 0;
	n = pmrxedv_map_mr_sg(fmr, &sg, 1, &off, PAGE);
	CHECK(n == 1, "map_mr_sg 2 returned %d", n);
	pmrxedv_update_fast_reg_key(fmr, 2);
	key2 = fmr->rkey;
	CHECK(key2 != key1 && (key2 >> 8) == (key1 >> 8), "key2 %x vs key1 %x", key2, key1);
	CHECK(pmrxedv_post_reg_mr(A.qp, 3, fmr, IBV_ACCESS_REMOTE_READ, IBV_SEND_SIGNALED) == 0, "post_reg_mr 2");
	CHECK(wait_wc(&A, 3) == IBV_WC_SUCCESS, "REG_MR 2 completion");
	st = rdma(&B, IBV_WR_RDMA_READ, bmr, bbuf, 64, (uintptr_t)abuf + 3 * PAGE, key2, 20);
	CHECK(st == IBV_WC_SUCCESS, "READ with key2: %s", ibv_wc_status_str(st));
	for (i = 0; i < 64; i++)
		CHECK(bbuf[i] == 0x5C, "READ key2 byte %d = %02x", i, bbuf[i]);
	st = rdma(&B, IBV_WR_RDMA_WRITE, bmr, bbuf, 64, (uintptr_t)abuf + 3 * PAGE, key2, 21);
	CHECK(st == IBV_WC_REM_ACCESS_ERR, "WRITE with read-only key2: %s", ibv_wc_status_str(st));
	CHECK(abuf[3 * PAGE] == 0x5C, "read-only MR was written");

	/* 3. the invalidated key stays dead */
	connect_pair(&A, &B, 5000);
	memset(bbuf, 0x77, 64);
	st = rdma(&B, IBV_WR_RDMA_WRITE, bmr, bbuf, 64, (uintptr_t)abuf, key1, 30);
	CHECK(st == IBV_WC_REM_ACCESS_ERR, "WRITE with invalidated key1: %s", ibv_wc_status_str(st));
	CHECK(abuf[0] == 1, "invalidated MR was written (byte 0 = %02x)", abuf[0]);

	connect_pair(&A, &B, 9000);
	CHECK(ibv_dereg_mr(fmr) == 0, "dereg fast MR");
	CHECK(ibv_dereg_mr(bmr) == 0, "dereg B MR");
	ibv_destroy_qp(A.qp);
	ibv_destroy_qp(B.qp);
	ibv_destroy_cq(A.cq);
	ibv_destroy_cq(B.cq);
	ibv_dealloc_pd(A.pd);
	ibv_dealloc_pd(B.pd);
	ibv_close_device(A.ctx);
	ibv_close_device(B.ctx);
	if (failures) {
		fprintf(stderr, "fastreg: %d check(s) failed\n", failures);
		return 1;
	}
	printf("fastreg: all checks passed\n");
	return 0;
}
