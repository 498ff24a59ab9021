/* Many RC QPs with deep send queues of large RDMA WRITEs, every byte checked. Through the
 * pmrxe shim (run under `pmrxe run --`); built and driven by tests/overload.rs (issue 17:
 * overload must not become failure, and perftest does not check data).
 *
 *   many_qp_write NQP DEPTH ROUNDS SIZE
 *
 * NQP QPs on pmrxe0 each write into their own QP on pmrxe1. A round posts DEPTH signalled
 * WRITEs of SIZE bytes on every QP at once (NQP x DEPTH x SIZE bytes outstanding), waits for
 * every completion (all must be SUCCESS), then compares every destination slot with the
 * source bytes it was written from. Every WRITE of a round takes its source at its own offset
 * (64-byte steps) of a random pattern, and every round moves them, so a slot that missed a
 * round's WRITE or got another slot's data does not match. Prints "OK NQP DEPTH ROUNDS SIZE MB/s" (bytes written / time from the first post to
 * the last completion, summed over rounds); any failure: message on stderr, exit 1. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG "many_qp_write"
#include "rc_util.h"

static double now_s(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static size_t g_slots;
static int g_depth;

/* Source offset of (round, qp, slot): distinct for every slot of a round, moved every round. */
static size_t src_off(int r, int q, int j) {
	return (((size_t)q * g_depth + j + (size_t)r * 97) % (g_slots + 101)) * 64;
}

int main(int argc, char **argv) {
	if (argc != 5) DIE("usage: many_qp_write NQP DEPTH ROUNDS SIZE");
	int nqp = atoi(argv[1]), depth = atoi(argv[2]), rounds = atoi(argv[3]);
	size_t size = strtoul(argv[4], NULL, 0);
	if (nqp < 1 || depth < 1 || rounds < 1 || size < 1) DIE("bad arguments");
	size_t slots = (size_t)nqp * depth, src_len = size + (slots + 101) * 64;
	g_slots = slots;
	g_depth = depth;

	char *src = aligned_alloc(4096, (src_len + 4095) & ~4095UL);
	char *dst = aligned_alloc(4096, (slots * size + 4095) & ~4095UL);
	if (!src || !dst) DIE("out of memory");
	uint64_t x = 0x9E3779B97F4A7C15ULL;
	for (size_t i = 0; i < src_len; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		src[i] = (char)x;
	}
	memset(dst, 0, slots * size);

	struct ibv_context *c0 = open_dev("pmrxe0"), *c1 = open_dev("pmrxe1");
	if (!c0 || !c1) DIE("open devices");
	struct ibv_port_attr pa;
	if (ibv_query_port(c0, 1, &pa)) DIE("query port");
	struct ibv_pd *pd0 = ibv_alloc_pd(c0), *pd1 = ibv_alloc_pd(c1);
	struct ibv_cq *cq0 = ibv_create_cq(c0, (int)slots, NULL, NULL, 0), *cq1 = ibv_create_cq(c1, 16, NULL, NULL, 0);
	if (!pd0 || !pd1 || !cq0 || !cq1) DIE("pd/cq");
	struct ibv_mr *smr = ibv_reg_mr(pd0, src, src_len, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd1, dst, slots * size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!smr || !dmr) DIE("ibv_reg_mr: %m");
	union ibv_gid g0, g1;
	if (ibv_query_gid(c0, 1, 1, &g0) || ibv_query_gid(c1, 1, 1, &g1)) DIE("query gid");

	struct ibv_qp **qs = calloc(nqp, sizeof *qs), **qd = calloc(nqp, sizeof *qd);
	for (int q = 0; q < nqp; q++) {
		struct ibv_qp_init_attr qa = {.send_cq = cq0, .recv_cq = cq0, .qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = depth, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
		qs[q] = ibv_create_qp(pd0, &qa);
		qa.send_cq = qa.recv_cq = cq1;
		qa.cap.max_send_wr = 1;
		qd[q] = ibv_create_qp(pd1, &qa);
		if (!qs[q] || !qd[q]) DIE("create qp %d: %m", q);
	}
	for (int q = 0; q < nqp; q++) {
		connect_qp(qs[q], qd[q]->qp_num, &g1, pa.active_mtu, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE);
		connect_qp(qd[q], qs[q]->qp_num, &g0, pa.active_mtu, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE);
	}

	struct ibv_wc *wc = calloc(256, sizeof *wc);
	double busy = 0;
	for (int r = 0; r < rounds; r++) {
		double t0 = now_s();
		/* Breadth first: every QP gets its j-th WRITE before any gets its (j+1)-th. */
		for (int j = 0; j < depth; j++)
			for (int q = 0; q < nqp; q++) {
				size_t slot = (size_t)q * depth + j;
				struct ibv_sge sge = {.addr = (uintptr_t)(src + src_off(r, q, j)), .length = (uint32_t)size, .lkey = smr->lkey};
				struct ibv_send_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
							 .send_flags = IBV_SEND_SIGNALED}, *bad;
				wr.wr.rdma.remote_addr = (uintptr_t)(dst + slot * size);
				wr.wr.rdma.rkey = dmr->rkey;
				if (ibv_post_send(qs[q], &wr, &bad)) DIE("round %d: post_send qp %d slot %d: %m", r, q, j);
			}
		size_t done = 0;
		double last = now_s();
		while (done < slots) {
			int n = ibv_poll_cq(cq0, 256, wc);
			if (n < 0) DIE("poll_cq");
			for (int i = 0; i < n; i++)
				if (wc[i].status != IBV_WC_SUCCESS)
					DIE("round %d: WRITE to slot %lu failed: %s (%d)", r, (unsigned long)wc[i].wr_id,
					    ibv_wc_status_str(wc[i].status), wc[i].status);
			done += n;
			if (n > 0) last = now_s();
			else if (now_s() - last > 60) DIE("round %d: no completion for 60 s (%zu of %zu)", r, done, slots);
		}
		busy += now_s() - t0;
		for (int q = 0; q < nqp; q++)
			for (int j = 0; j < depth; j++) {
				size_t slot = (size_t)q * depth + j;
				if (memcmp(dst + slot * size, src + src_off(r, q, j), size))
					DIE("round %d: qp %d slot %d: data differs from what was written", r, q, j);
			}
	}
	double mbs = (double)slots * size * rounds / busy / 1e6;
	for (int q = 0; q < nqp; q++)
		if (ibv_destroy_qp(qs[q]) || ibv_destroy_qp(qd[q])) DIE("destroy qp");
	if (ibv_dereg_mr(smr) || ibv_dereg_mr(dmr)) DIE("dereg");
	close_side(cq0, pd0, c0);
	close_side(cq1, pd1, c1);
	printf("OK %d %d %d %zu %.1f\n", nqp, depth, rounds, size, mbs);
	return 0;
}
