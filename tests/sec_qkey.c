/* The privileged Q_Key attack (tests/security_access.rs): a UD QP on pmrxe0 tries to speak as the
 * connection manager.
 *   1. ibv_modify_qp to INIT with Q_Key 0x80010000 (GSI's, most significant bit set): the kernel
 *      refuses it without CAP_NET_RAW; prints "modify_privileged errno N" (0 = accepted).
 *   2. The QP is then brought up with an ordinary Q_Key (0x11111111) and posts one UD SEND to QP1
 *      of pmrxe1 with wr.ud.remote_qkey = 0x80010000 and a CM-looking payload: IBTA sends the QP's
 *      own Q_Key instead of a privileged WR Q_Key, so the receiver's QP1 must drop it. Prints
 *      "send_status S" (the send completes locally either way: UD is unreliable).
 * Usage: sec_qkey */
#define PROG "sec_qkey"
#include "rc_util.h"
#include <errno.h>
#include <unistd.h>

int main(void) {
	(void)connect_qp; /* rc_util.h's RC helper: not needed for a UD QP */
	struct ibv_context *c = open_dev("pmrxe0");
	struct ibv_context *peer = open_dev("pmrxe1");
	if (!c || !peer) DIE("open");
	union ibv_gid dgid;
	if (ibv_query_gid(peer, 1, 1, &dgid)) DIE("query_gid");
	struct ibv_pd *pd = ibv_alloc_pd(c);
	struct ibv_cq *cq = ibv_create_cq(c, 16, NULL, NULL, 0);
	if (!pd || !cq) DIE("pd/cq");
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp) DIE("create_qp");

	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x80010000u};
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	printf("modify_privileged errno %d\n", r);
	if (r == 0) {
		/* Accepted (a privileged client): back to RESET to continue the same way. */
		struct ibv_qp_attr z = {.qp_state = IBV_QPS_RESET};
		if (ibv_modify_qp(qp, &z, IBV_QP_STATE)) DIE("RESET");
	}
	a.qkey = 0x11111111u;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) DIE("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) DIE("RTR");
	a.qp_state = IBV_QPS_RTS;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) DIE("RTS");

	struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1, .grh = {.dgid = dgid, .sgid_index = 1, .hop_limit = 1}};
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah) DIE("create_ah");
	/* 256 bytes shaped like a CM REQ MAD (base version 1, class 0x07, version 2, method SEND,
	 * attribute 0x0010): what a forger would send. */
	static uint8_t mad[256];
	mad[0] = 1; mad[1] = 0x07; mad[2] = 2; mad[3] = 0x03; mad[16] = 0x00; mad[17] = 0x10;
	struct ibv_mr *mr = ibv_reg_mr(pd, mad, sizeof mad, 0);
	if (!mr) DIE("reg_mr");
	struct ibv_sge sge = {.addr = (uintptr_t)mad, .length = sizeof mad, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 7, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
				 .wr = {.ud = {.ah = ah, .remote_qpn = 1, .remote_qkey = 0x80010000u}}};
	struct ibv_send_wr *bad;
	if (ibv_post_send(qp, &wr, &bad)) DIE("post_send: %s", strerror(errno));
	struct ibv_wc wc;
	int n = 0;
	for (int i = 0; i < 10000000 && n == 0; i++) n = ibv_poll_cq(cq, 1, &wc);
	if (n != 1) DIE("no completion");
	printf("send_status %d\n", wc.status);
	ibv_dereg_mr(mr);
	ibv_destroy_ah(ah);
	ibv_destroy_qp(qp);
	close_side(cq, pd, c);
	ibv_close_device(peer);
	printf("OK sec_qkey\n");
	return 0;
}
