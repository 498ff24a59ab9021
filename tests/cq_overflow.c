/* CQ overflow through libibverbs. QP1 (send CQ: a small CQ of cq->cqe entries) posts more
 * signaled 8-byte RDMA WRITEs to QP2 than that CQ holds, without polling. pmrxe's policy
 * (docs/verbs-coverage.md): the overflowing CQ reports IBV_EVENT_CQ_ERR once, the QP that
 * overflowed it goes to ERROR, and nothing is lost: once the consumer polls, every WR completes exactly
 * once, in posting order, SUCCESS and then WR_FLUSH_ERR. Device argv[1]; QP1 and QP2 are RC
 * QPs on it connected to each other. Prints one line per step; exit 0 only if every step
 * behaves. */
#define PROG "cq_overflow"
#include "rc_util.h"
#include <poll.h>
#include <time.h>

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq) {
    struct ibv_qp_init_attr a = { .send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 128, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ibv_qp *q = ibv_create_qp(pd, &a);
    if (!q) DIE("ibv_create_qp");
    return q;
}

static double since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s DEVICE\n", argv[0]); return 2; }
    struct ibv_context *ctx = open_dev(argv[1]);
    if (!ctx) DIE("cannot open %s", argv[1]);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    char *buf = calloc(1, 8192);
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    struct ibv_cq *small = ibv_create_cq(ctx, 4, NULL, NULL, 0);
    struct ibv_cq *big = ibv_create_cq(ctx, 256, NULL, NULL, 0);
    if (!pd || !mr || !small || !big) { perror("setup"); return 12; }
    struct ibv_qp *q1 = make_qp(pd, small, big), *q2 = make_qp(pd, big, big);
    union ibv_gid gid;
    if (ibv_query_gid(ctx, 1, 1, &gid)) DIE("ibv_query_gid");
    connect_qp(q1, q2->qp_num, &gid, IBV_MTU_1024, IBV_ACCESS_REMOTE_WRITE);
    connect_qp(q2, q1->qp_num, &gid, IBV_MTU_1024, IBV_ACCESS_REMOTE_WRITE);
    int n = small->cqe + 16;
    if (n > 128) { printf("CQ of %d entries: too large for this test\n", small->cqe); return 12; }
    printf("small CQ holds %d; posting %d signaled WRITEs\n", small->cqe, n);
    for (int i = 0; i < n; i++) {
        struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
        struct ibv_send_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1,
                                  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
        wr.wr.rdma.remote_addr = (uintptr_t)buf + 4096 + 8 * (uint64_t)i;
        wr.wr.rdma.rkey = mr->rkey;
        if (ibv_post_send(q1, &wr, &bad)) { perror("ibv_post_send"); return 13; }
    }
    /* The overflow is reported on the device's async event queue. */
    struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
    if (poll(&p, 1, 10000) != 1) { printf("no async event in 10 s\n"); return 14; }
    struct ibv_async_event ev;
    if (ibv_get_async_event(ctx, &ev)) { perror("ibv_get_async_event"); return 14; }
    int cq_err = ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small;
    printf("async event: %s%s\n", ibv_event_type_str(ev.event_type), cq_err ? " on the small CQ" : "");
    ibv_ack_async_event(&ev);
    if (!cq_err) return 15;
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qi;
    if (ibv_query_qp(q1, &qa, IBV_QP_STATE, &qi)) { perror("ibv_query_qp"); return 16; }
    printf("QP1 state after the overflow: %s\n", qa.qp_state == IBV_QPS_ERR ? "ERROR" : "not ERROR");
    if (qa.qp_state != IBV_QPS_ERR) return 16;
    /* Every WR completes exactly once, in order: SUCCESS, then (from the ERROR on) FLUSH. */
    int got = 0, ok = 0, flushed = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (got < n && since(&t0) < 10.0) {
        struct ibv_wc wc[4];
        int k = ibv_poll_cq(small, 4, wc);
        if (k < 0) { printf("ibv_poll_cq failed\n"); return 17; }
        for (int j = 0; j < k; j++, got++) {
            if (wc[j].wr_id != (uint64_t)got || wc[j].qp_num != q1->qp_num) {
                printf("completion %d: wr_id %llu of qp %u, expected wr_id %d of qp %u\n", got,
                       (unsigned long long)wc[j].wr_id, wc[j].qp_num, got, q1->qp_num);
                return 18;
            }
            if (wc[j].status == IBV_WC_SUCCESS && !flushed) ok++;
            else if (wc[j].status == IBV_WC_WR_FLUSH_ERR) flushed++;
            else { printf("completion %d: %s\n", got, ibv_wc_status_str(wc[j].status)); return 18; }
        }
    }
    struct ibv_wc extra;
    int more = ibv_poll_cq(small, 1, &extra);
    printf("completions: %d of %d (%d SUCCESS, then %d WR_FLUSH_ERR), %d more\n", got, n, ok, flushed, more);
    if (got != n || more != 0 || ok < small->cqe) return 19;
    printf("every WR completed once, in order\n");
    if (ibv_destroy_qp(q1) || ibv_destroy_qp(q2) || ibv_dereg_mr(mr) || ibv_destroy_cq(small)) DIE("teardown");
    close_side(big, pd, ctx);
    free(buf);
    return 0;
}
