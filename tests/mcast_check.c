/* UD multicast through the verbs (tests/multicast.rs), on the loopback config's two devices.
 * A sender QP on pmrxe0 sends to group 239.1.2.3; attached are R1 and R2 on pmrxe1 and R3 on
 * pmrxe0 (the sender's own port: the copy a NIC loops back); R4 on pmrxe1 is attached with
 * another Q_Key and R5 on pmrxe1 is not attached: both must receive nothing.
 *   1. the verbs' refusals: an RC QP, a unicast GID, detaching what is not attached (EINVAL);
 *      attaching twice is accepted; ibv_query_device reports the limits;
 *   2. N datagrams of 1..mtu bytes, each with its sequence number as immediate data and a
 *      pattern derived from it: every attached QP gets all of them, in order, bytes, lengths,
 *      GRH destination (the group) and source QPN checked;
 *   3. R2 detaches: the next N reach R1 and R3 only;
 *   4. max_mcast_qp_attach QPs attach to a second group, one more is refused with ENOMEM;
 *   5. R1 is destroyed while attached (the service detaches it).
 * Prints "mcast_check OK <datagrams placed>" on success.
 * Usage: mcast_check [N] */
#define PROG "mcast_check"
#include "rc_util.h"
#include <errno.h>
#include <unistd.h>
#include <time.h>
#include <arpa/inet.h>

#define QKEY 0x11110000u
#define MAXN 256
#define MAXLEN 1024

struct rx {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *buf; /* MAXN slots of 40 + MAXLEN */
	int got;
};

static struct ibv_qp *ud_qp(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t qkey) {
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = MAXN, .max_recv_wr = MAXN, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp) DIE("create_qp: %s", strerror(errno));
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = qkey};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) DIE("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) DIE("RTR");
	a.qp_state = IBV_QPS_RTS;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) DIE("RTS");
	return qp;
}

static void rx_init(struct rx *r, struct ibv_context *c, struct ibv_pd *pd, uint32_t qkey) {
	r->cq = ibv_create_cq(c, 2 * MAXN, NULL, NULL, 0);
	if (!r->cq) DIE("create_cq");
	r->qp = ud_qp(pd, r->cq, qkey);
	r->buf = calloc(MAXN, 40 + MAXLEN);
	r->mr = ibv_reg_mr(pd, r->buf, (size_t)MAXN * (40 + MAXLEN), IBV_ACCESS_LOCAL_WRITE);
	if (!r->buf || !r->mr) DIE("rx buffers");
	for (int i = 0; i < MAXN; i++) {
		struct ibv_sge sge = {.addr = (uintptr_t)(r->buf + (size_t)i * (40 + MAXLEN)), .length = 40 + MAXLEN, .lkey = r->mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad;
		if (ibv_post_recv(r->qp, &wr, &bad)) DIE("post_recv");
	}
	r->got = 0;
}

static size_t len_of(int seq) { return (size_t)(1 + (seq * 37) % MAXLEN); }
static uint8_t byte_of(int seq, size_t i) { return (uint8_t)(seq * 13 + i * 7 + 1); }

static double now_s(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Take the completions of `r` for datagrams first..first+n-1 (2 s at most); check each. */
static void expect(struct rx *r, const char *name, int first, int n, uint32_t src_qpn, const union ibv_gid *group) {
	double until = now_s() + 2.0;
	while (r->got < first + n && now_s() < until) {
		struct ibv_wc wc;
		int k = ibv_poll_cq(r->cq, 1, &wc);
		if (k < 0) DIE("%s: poll_cq", name);
		if (k == 0) continue;
		if (wc.status != IBV_WC_SUCCESS) DIE("%s: status %s", name, ibv_wc_status_str(wc.status));
		int seq = (int)ntohl(wc.imm_data);
		if (seq != r->got) DIE("%s: datagram %d arrived where %d was expected", name, seq, r->got);
		if (!(wc.wc_flags & IBV_WC_WITH_IMM) || !(wc.wc_flags & IBV_WC_GRH)) DIE("%s: flags %#x", name, wc.wc_flags);
		if (wc.src_qp != src_qpn) DIE("%s: src_qp %u, sender %u", name, wc.src_qp, src_qpn);
		size_t len = len_of(seq);
		if (wc.byte_len != 40 + len) DIE("%s: byte_len %u for %zu bytes", name, wc.byte_len, len);
		const uint8_t *slot = r->buf + wc.wr_id * (40 + MAXLEN);
		/* RoCEv2 over IPv4: the IPv4 header is in the last 20 bytes of the GRH area. */
		if (memcmp(slot + 20 + 16, group->raw + 12, 4)) DIE("%s: IP destination is not the group", name);
		for (size_t i = 0; i < len; i++)
			if (slot[40 + i] != byte_of(seq, i)) DIE("%s: datagram %d byte %zu", name, seq, i);
		/* The slot is posted again for the next round. */
		struct ibv_sge sge = {.addr = (uintptr_t)slot, .length = 40 + MAXLEN, .lkey = r->mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = wc.wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
		if (ibv_post_recv(r->qp, &wr, &bad)) DIE("repost");
		r->got++;
	}
	if (r->got != first + n) DIE("%s: %d of %d datagrams", name, r->got - first, n);
}

static void expect_none(struct rx *r, const char *name) {
	struct ibv_wc wc;
	int k = ibv_poll_cq(r->cq, 1, &wc);
	if (k != 0) DIE("%s: received a datagram it must not (status %d, imm %u)", name, k < 0 ? -1 : (int)wc.status, ntohl(wc.imm_data));
}

int main(int argc, char **argv) {
	(void)connect_qp;
	(void)close_side;
	int n = argc > 1 ? atoi(argv[1]) : 64;
	if (n < 1 || n > MAXN) DIE("N in 1..%d", MAXN);
	struct ibv_context *c0 = open_dev("pmrxe0"), *c1 = open_dev("pmrxe1");
	if (!c0 || !c1) DIE("open");
	struct ibv_device_attr da;
	if (ibv_query_device(c0, &da)) DIE("query_device");
	printf("limits: max_mcast_grp %d max_mcast_qp_attach %d max_total_mcast_qp_attach %d\n", da.max_mcast_grp, da.max_mcast_qp_attach, da.max_total_mcast_qp_attach);
	if (da.max_mcast_grp <= 0 || da.max_mcast_qp_attach <= 0 || da.max_total_mcast_qp_attach < da.max_mcast_qp_attach) DIE("limits");
	struct ibv_pd *pd0 = ibv_alloc_pd(c0), *pd1 = ibv_alloc_pd(c1);
	if (!pd0 || !pd1) DIE("pd");

	union ibv_gid group = {.raw = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3}};
	union ibv_gid unicast;
	if (ibv_query_gid(c1, 1, 1, &unicast)) DIE("query_gid");

	struct ibv_cq *scq = ibv_create_cq(c0, 2 * MAXN, NULL, NULL, 0);
	if (!scq) DIE("send cq");
	struct ibv_qp *s = ud_qp(pd0, scq, QKEY);
	struct rx r1, r2, r3, r4, r5;
	rx_init(&r1, c1, pd1, QKEY);
	rx_init(&r2, c1, pd1, QKEY);
	rx_init(&r3, c0, pd0, QKEY);
	rx_init(&r4, c1, pd1, QKEY + 1);
	rx_init(&r5, c1, pd1, QKEY);

	/* 1. Refusals. */
	struct ibv_qp_init_attr rcia = {.send_cq = scq, .recv_cq = scq, .qp_type = IBV_QPT_RC, .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *rc = ibv_create_qp(pd0, &rcia);
	if (!rc) DIE("rc qp");
	int e = ibv_attach_mcast(rc, &group, 0);
	printf("attach RC: %d\n", e);
	if (e != EINVAL) DIE("an RC QP attached: %d", e);
	e = ibv_attach_mcast(r1.qp, &unicast, 0);
	printf("attach unicast: %d\n", e);
	if (e != EINVAL) DIE("a unicast GID attached: %d", e);
	e = ibv_detach_mcast(r1.qp, &group, 0);
	if (e != EINVAL) DIE("detached what was not attached: %d", e);
	if (ibv_attach_mcast(r1.qp, &group, 0) || ibv_attach_mcast(r1.qp, &group, 0)) DIE("attach R1 (twice)");
	if (ibv_attach_mcast(r2.qp, &group, 0) || ibv_attach_mcast(r3.qp, &group, 0) || ibv_attach_mcast(r4.qp, &group, 0)) DIE("attach");

	/* 2. N datagrams to the group. */
	struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1, .grh = {.dgid = group, .sgid_index = 1, .hop_limit = 1}};
	struct ibv_ah *ah = ibv_create_ah(pd0, &aa);
	if (!ah) DIE("create_ah");
	uint8_t *sbuf = malloc((size_t)MAXN * MAXLEN);
	struct ibv_mr *smr = ibv_reg_mr(pd0, sbuf, (size_t)MAXN * MAXLEN, 0);
	if (!sbuf || !smr) DIE("send buffers");
	int sent = 0;
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < n; i++, sent++) {
			uint8_t *p = sbuf + (size_t)(sent % MAXN) * MAXLEN;
			for (size_t k = 0; k < len_of(sent); k++) p[k] = byte_of(sent, k);
			struct ibv_sge sge = {.addr = (uintptr_t)p, .length = (uint32_t)len_of(sent), .lkey = smr->lkey};
			struct ibv_send_wr wr = {.wr_id = (uint64_t)sent, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
						 .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl((uint32_t)sent),
						 .wr = {.ud = {.ah = ah, .remote_qpn = 0xffffff, .remote_qkey = QKEY}}}, *bad;
			if (ibv_post_send(s, &wr, &bad)) DIE("post_send: %s", strerror(errno));
			struct ibv_wc wc;
			int k;
			while ((k = ibv_poll_cq(scq, 1, &wc)) == 0) {}
			if (k < 0 || wc.status != IBV_WC_SUCCESS) DIE("send %d: %s", sent, k < 0 ? "poll" : ibv_wc_status_str(wc.status));
			/* Paced by the receivers: a UD receiver drops what it has no WQE for. */
			expect(&r1, "R1", sent, 1, s->qp_num, &group);
			expect(&r3, "R3 (the sender's port)", sent, 1, s->qp_num, &group);
			if (round == 0) expect(&r2, "R2", sent, 1, s->qp_num, &group);
		}
		if (round == 0) {
			/* 3. R2 leaves. */
			if (ibv_detach_mcast(r2.qp, &group, 0)) DIE("detach R2");
			printf("round 1: %d datagrams to R1, R2, R3\n", n);
		}
	}
	/* No wait needed: R2, R4 and R5 are on pmrxe1 with R1, and the lcore places a datagram for
	 * every QP of the port in one pass, so R1 holding the last one means theirs are settled. */
	expect_none(&r2, "R2 after detaching");
	expect_none(&r4, "R4 (another Q_Key)");
	expect_none(&r5, "R5 (not attached)");
	printf("round 2: %d datagrams to R1, R3; none to R2 (detached), R4 (Q_Key), R5 (not attached)\n", n);

	/* 4. max_mcast_qp_attach on a second group, from QPs of this client. */
	union ibv_gid g2 = group;
	g2.raw[15] = 4;
	struct ibv_qp **many = calloc((size_t)da.max_mcast_qp_attach + 1, sizeof *many);
	struct ibv_cq *mcq = ibv_create_cq(c1, 4, NULL, NULL, 0);
	if (!many || !mcq) DIE("many");
	for (int i = 0; i <= da.max_mcast_qp_attach; i++) {
		struct ibv_qp_init_attr ia = {.send_cq = mcq, .recv_cq = mcq, .qp_type = IBV_QPT_UD, .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
		many[i] = ibv_create_qp(pd1, &ia);
		if (!many[i]) DIE("qp %d", i);
		e = ibv_attach_mcast(many[i], &g2, 0);
		if (i < da.max_mcast_qp_attach && e) DIE("attach %d: %d", i, e);
		if (i == da.max_mcast_qp_attach && e != ENOMEM) DIE("attach beyond max_mcast_qp_attach: %d", e);
	}
	printf("attach %d+1 QPs to one group: the last refused with ENOMEM\n", da.max_mcast_qp_attach);
	for (int i = 0; i <= da.max_mcast_qp_attach; i++)
		if (ibv_destroy_qp(many[i])) DIE("destroy attached qp %d", i);

	/* 5. Destroyed while attached. */
	if (ibv_destroy_qp(r1.qp)) DIE("destroy R1 while attached");
	if (ibv_destroy_qp(rc)) DIE("destroy rc");
	printf("mcast_check OK %d\n", r1.got + r2.got + r3.got);
	return 0;
}
