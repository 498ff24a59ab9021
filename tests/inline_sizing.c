/* Inline capacity from the SGE space (issue 40): a QP created with cap.max_inline_data = 0 and one
 * send SGE reports at least 16 bytes of inline capacity back (as rxe and mlx5 do) and takes a
 * 16-byte IBV_SEND_INLINE SEND, whose bytes arrive; an inline post beyond the reported capacity
 * is refused with EINVAL. RC pmrxe0 <-> pmrxe1. Usage: inline_sizing pmrxe0 */
#define PROG "inline_sizing"
#include "rc_util.h"
#include <errno.h>

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq) {
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 0}};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp) DIE("create_qp: %s", strerror(errno));
	printf("reported max_inline_data %u\n", ia.cap.max_inline_data);
	if (ia.cap.max_inline_data < 16) DIE("inline capacity %u < 16 bytes of SGE space", ia.cap.max_inline_data);
	return qp;
}

int main(int argc, char **argv) {
	(void)argc;
	struct ibv_context *a = open_dev(argv[1]), *b = open_dev("pmrxe1");
	struct ibv_pd *pa = ibv_alloc_pd(a), *pb = ibv_alloc_pd(b);
	struct ibv_cq *ca = ibv_create_cq(a, 8, NULL, NULL, 0), *cb = ibv_create_cq(b, 8, NULL, NULL, 0);
	if (!pa || !pb || !ca || !cb) DIE("pd/cq");
	struct ibv_qp *qa = make_qp(pa, ca), *qb = make_qp(pb, cb);
	union ibv_gid ga, gb;
	if (ibv_query_gid(a, 1, 1, &ga) || ibv_query_gid(b, 1, 1, &gb)) DIE("query_gid");
	connect_qp(qa, qb->qp_num, &gb, IBV_MTU_1024, 0);
	connect_qp(qb, qa->qp_num, &ga, IBV_MTU_1024, IBV_ACCESS_LOCAL_WRITE);
	static char rbuf[64];
	struct ibv_mr *mr = ibv_reg_mr(pb, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE);
	if (!mr) DIE("reg_mr");
	struct ibv_sge rs = {.addr = (uintptr_t)rbuf, .length = sizeof rbuf, .lkey = mr->lkey};
	struct ibv_recv_wr rw = {.wr_id = 2, .sg_list = &rs, .num_sge = 1}, *rbad;
	if (ibv_post_recv(qb, &rw, &rbad)) DIE("post_recv");
	char msg[16] = "inline-16-bytes";
	struct ibv_sge ss = {.addr = (uintptr_t)msg, .length = 16, .lkey = 0};
	struct ibv_send_wr sw = {.wr_id = 1, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED}, *sbad;
	int r = ibv_post_send(qa, &sw, &sbad);
	if (r) DIE("16-byte inline post refused: %s", strerror(r));
	memset(msg, 0, sizeof msg); /* inline: the bytes were taken at post time */
	struct ibv_wc wc;
	int got = 0;
	for (long i = 0; i < 100000000 && got < 2; i++) {
		if (ibv_poll_cq(ca, 1, &wc) == 1) { if (wc.status) DIE("send status %d", wc.status); got++; }
		if (ibv_poll_cq(cb, 1, &wc) == 1) { if (wc.status || wc.byte_len != 16) DIE("recv status %d len %u", wc.status, wc.byte_len); got++; }
	}
	if (got != 2) DIE("completions: %d", got);
	if (memcmp(rbuf, "inline-16-bytes", 16)) DIE("payload differs");
	/* Beyond the capacity: EINVAL, nothing posted. */
	static char big[4096];
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	if (ibv_query_qp(qa, &qattr, IBV_QP_CAP, &qinit)) DIE("query_qp");
	ss.addr = (uintptr_t)big;
	ss.length = qinit.cap.max_inline_data + 1;
	r = ibv_post_send(qa, &sw, &sbad);
	if (r != EINVAL) DIE("an inline post of %u bytes (capacity %u) returned %d, not EINVAL", ss.length, qinit.cap.max_inline_data, r);
	printf("inline beyond capacity (%u bytes): EINVAL\n", ss.length);
	ibv_dereg_mr(mr);
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	close_side(ca, pa, a);
	close_side(cb, pb, b);
	printf("OK inline_sizing\n");
	return 0;
}
