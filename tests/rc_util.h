/* Shared by the C test programs that set RC QPs up by hand (tests/many_qp_write.c,
 * tests/shared_mr.c): open a device by name, and RESET -> INIT -> RTR -> RTS towards a peer QP
 * on a RoCE GID (index 1: the IPv4-mapped GID) with perftest's timeouts; also tests/cq_overflow.c. Define PROG (the
 * program's name for messages) before including. close_side() tears one device's objects down. */
#ifndef PMRXE_TESTS_RC_UTIL_H
#define PMRXE_TESTS_RC_UTIL_H
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PROG
#error "define PROG before including rc_util.h"
#endif

#define DIE(...) do { fprintf(stderr, PROG ": " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

static struct ibv_context *open_dev(const char *name) {
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l) DIE("no device list");
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(l[i]), name)) {
			struct ibv_context *c = ibv_open_device(l[i]);
			ibv_free_device_list(l);
			return c;
		}
	DIE("no device %s", name);
}

static void connect_qp(struct ibv_qp *qp, uint32_t dqpn, const union ibv_gid *dgid, enum ibv_mtu mtu, int access) {
	struct ibv_qp_attr a = {0};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = access;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) DIE("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dqpn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		DIE("RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14; /* perftest's defaults */
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		DIE("RTS");
}

/* Two RC QPs, q0 on (pd0, cq0) of device c0 and q1 on (pd1, cq1) of device c1, each with `depth`
 * send and receive WRs and one SGE, connected to each other on GID index 1 with `access`. */
static inline void rc_pair(struct ibv_context *c0, struct ibv_pd *pd0, struct ibv_cq *cq0, struct ibv_context *c1,
			   struct ibv_pd *pd1, struct ibv_cq *cq1, uint32_t depth, int access, struct ibv_qp **q0,
			   struct ibv_qp **q1) {
	struct ibv_qp_init_attr qa = {.send_cq = cq0, .recv_cq = cq0, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = depth, .max_recv_wr = depth, .max_send_sge = 1, .max_recv_sge = 1}};
	*q0 = ibv_create_qp(pd0, &qa);
	qa.send_cq = qa.recv_cq = cq1;
	*q1 = ibv_create_qp(pd1, &qa);
	if (!*q0 || !*q1) DIE("create qp");
	union ibv_gid g0, g1;
	if (ibv_query_gid(c0, 1, 1, &g0) || ibv_query_gid(c1, 1, 1, &g1)) DIE("query gid");
	connect_qp(*q0, (*q1)->qp_num, &g1, IBV_MTU_1024, access);
	connect_qp(*q1, (*q0)->qp_num, &g0, IBV_MTU_1024, access);
}

/* Destroy one side's CQ and PD and close its device (after its QPs and MRs are gone). */
static void close_side(struct ibv_cq *cq, struct ibv_pd *pd, struct ibv_context *c) {
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(c);
}

#endif
