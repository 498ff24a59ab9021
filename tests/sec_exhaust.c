/* tests/security_limits.rs: one client creating objects until the service refuses.
 *
 *   sec_exhaust DEVICE HOLD_MS KIND:MAX...
 *
 * Opens DEVICE, allocates a base PD and CQ (counted by the service like any other), then for
 * each KIND (pd cq qp srq mr mw ah) creates objects until one is refused or MAX were created,
 * and prints "KIND created N errno E" (E = 0 when MAX were created). Everything stays held.
 * Then prints "HOLDING", sleeps HOLD_MS (or until stdin reaches EOF when HOLD_MS is -1) and
 * exits without destroying anything: the service must release it all when the client goes. */
#define PROG "sec_exhaust"
#include "rc_util.h"

#include <errno.h>
#include <unistd.h>

static char buf[4096];

int main(int argc, char **argv) {
	if (argc < 3) DIE("usage: sec_exhaust DEVICE HOLD_MS KIND:MAX...");
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ibv_context *ctx = open_dev(argv[1]);
	if (!ctx) DIE("open %s", argv[1]);
	long hold = atol(argv[2]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd) DIE("base PD: errno %d", errno);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!cq) DIE("base CQ: errno %d", errno);
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 1, &gid)) DIE("query_gid");
	for (int i = 3; i < argc; i++) {
		char kind[16] = {0};
		long max = 0;
		if (sscanf(argv[i], "%15[a-z]:%ld", kind, &max) != 2) DIE("bad argument %s", argv[i]);
		long n = 0;
		int err = 0;
		for (; n < max; n++) {
			void *o = NULL;
			errno = 0;
			if (!strcmp(kind, "pd")) {
				o = ibv_alloc_pd(ctx);
			} else if (!strcmp(kind, "cq")) {
				o = ibv_create_cq(ctx, 16, NULL, NULL, 0);
			} else if (!strcmp(kind, "qp")) {
				struct ibv_qp_init_attr a = {0};
				a.send_cq = cq;
				a.recv_cq = cq;
				a.qp_type = IBV_QPT_RC;
				a.cap.max_send_wr = 4;
				a.cap.max_recv_wr = 4;
				a.cap.max_send_sge = 1;
				a.cap.max_recv_sge = 1;
				o = ibv_create_qp(pd, &a);
			} else if (!strcmp(kind, "srq")) {
				struct ibv_srq_init_attr a = {0};
				a.attr.max_wr = 4;
				a.attr.max_sge = 1;
				o = ibv_create_srq(pd, &a);
			} else if (!strcmp(kind, "mr")) {
				o = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
			} else if (!strcmp(kind, "mw")) {
				o = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
			} else if (!strcmp(kind, "ah")) {
				struct ibv_ah_attr a = {0};
				a.is_global = 1;
				a.grh.dgid = gid;
				a.grh.sgid_index = 1;
				a.grh.hop_limit = 64;
				a.port_num = 1;
				o = ibv_create_ah(pd, &a);
			} else {
				DIE("unknown kind %s", kind);
			}
			if (!o) {
				err = errno ? errno : -1;
				break;
			}
		}
		printf("%s created %ld errno %d\n", kind, n, err);
	}
	printf("HOLDING\n");
	if (hold < 0) {
		char c;
		while (read(0, &c, 1) > 0) {
		}
	} else if (hold > 0) {
		usleep((useconds_t)hold * 1000);
	}
	(void)connect_qp; /* rc_util.h helpers this program does not need */
	(void)close_side;
	return 0;
}
