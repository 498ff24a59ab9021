/* Issue 13 item 6 through libibverbs: a type-2 MW bound on QP1, invalidated with LOCAL_INV,
 * is bound again with a new key from QP2 of the same PD, naming the MW by its ibv_mw (whose
 * rkey stays the allocation key). QP1 and QP2 are RC QPs on device argv[1] connected to each
 * other. Then an RDMA WRITE from QP1 through the new key lands (the responder, QP2, owns the
 * window), and one from QP2 (responder QP1) is refused. Prints one line per step; exit 0 only
 * if every step behaves. */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct ibv_cq *cq;

static int poll1(const char *what, struct ibv_wc *wc) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int n = ibv_poll_cq(cq, 1, wc);
        if (n < 0) { printf("%s: poll_cq failed\n", what); exit(10); }
        if (n == 1) break;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 10) { printf("%s: no completion in 10 s\n", what); exit(11); }
    }
    printf("%s: %s (qp %u)\n", what, ibv_wc_status_str(wc->status), wc->qp_num);
    return wc->status;
}

static struct ibv_qp *make_qp(struct ibv_pd *pd) {
    struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ibv_qp *q = ibv_create_qp(pd, &a);
    if (!q) { perror("ibv_create_qp"); exit(12); }
    struct ibv_qp_attr x = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
    if (ibv_modify_qp(q, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) { perror("INIT"); exit(12); }
    return q;
}

static void connect_to(struct ibv_context *ctx, struct ibv_qp *q, uint32_t peer) {
    union ibv_gid gid;
    if (ibv_query_gid(ctx, 1, 1, &gid)) { perror("ibv_query_gid"); exit(12); }
    struct ibv_qp_attr x = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = peer,
        .max_dest_rd_atomic = 1, .min_rnr_timer = 12 };
    x.ah_attr.is_global = 1;
    x.ah_attr.grh.dgid = gid;
    x.ah_attr.grh.sgid_index = 1;
    x.ah_attr.grh.hop_limit = 1;
    x.ah_attr.port_num = 1;
    if (ibv_modify_qp(q, &x, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
                                 | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) { perror("RTR"); exit(12); }
    struct ibv_qp_attr y = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1 };
    if (ibv_modify_qp(q, &y, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN
                                 | IBV_QP_MAX_QP_RD_ATOMIC)) { perror("RTS"); exit(12); }
}

static void post(struct ibv_qp *q, struct ibv_send_wr *wr) {
    struct ibv_send_wr *bad;
    if (ibv_post_send(q, wr, &bad)) { perror("ibv_post_send"); exit(13); }
}

static int bind_mw(struct ibv_qp *q, struct ibv_mw *mw, struct ibv_mr *mr, uint32_t new_key, const char *what) {
    struct ibv_send_wr wr = { .wr_id = 1, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED };
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = new_key;
    wr.bind_mw.bind_info.mr = mr;
    wr.bind_mw.bind_info.addr = (uintptr_t)mr->addr;
    wr.bind_mw.bind_info.length = 4096;
    wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    post(q, &wr);
    struct ibv_wc wc;
    return poll1(what, &wc);
}

static int write_through(struct ibv_qp *q, struct ibv_mr *src, uint64_t raddr, uint32_t rkey, const char *what) {
    struct ibv_sge sge = { .addr = (uintptr_t)src->addr, .length = 64, .lkey = src->lkey };
    struct ibv_send_wr wr = { .wr_id = 3, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                              .send_flags = IBV_SEND_SIGNALED };
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    post(q, &wr);
    struct ibv_wc wc;
    return poll1(what, &wc);
}

int main(int argc, char **argv) {
    const char *dev = argc > 1 ? argv[1] : "pmrxe0";
    int n;
    struct ibv_device **list = ibv_get_device_list(&n);
    struct ibv_device *d = NULL;
    for (int i = 0; list && i < n; i++)
        if (!strcmp(ibv_get_device_name(list[i]), dev)) d = list[i];
    if (!d) { printf("no device %s\n", dev); return 12; }
    struct ibv_context *ctx = ibv_open_device(d);
    struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
    cq = pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
    char *win = aligned_alloc(4096, 4096), *src = aligned_alloc(4096, 4096);
    if (!cq || !win || !src) { perror("setup"); return 12; }
    memset(win, 0, 4096);
    for (int i = 0; i < 64; i++) src[i] = (char)(i * 7 + 1);
    struct ibv_mr *mr = ibv_reg_mr(pd, win, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
    struct ibv_mr *smr = ibv_reg_mr(pd, src, 4096, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    if (!mr || !smr || !mw) { perror("reg_mr/alloc_mw"); return 12; }
    struct ibv_qp *q1 = make_qp(pd), *q2 = make_qp(pd);
    connect_to(ctx, q1, q2->qp_num);
    connect_to(ctx, q2, q1->qp_num);
    uint32_t k1 = ibv_inc_rkey(mw->rkey), k2 = ibv_inc_rkey(k1);

    if (bind_mw(q1, mw, mr, k1, "bind on QP1")) return 1;
    struct ibv_send_wr inv = { .wr_id = 2, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED };
    inv.invalidate_rkey = k1;
    post(q1, &inv);
    struct ibv_wc wc;
    if (poll1("local_inv on QP1", &wc)) return 2;
    if (bind_mw(q2, mw, mr, k2, "bind again on QP2")) return 3;
    if (write_through(q1, smr, (uintptr_t)win + 128, k2, "write QP1->QP2 through the new key")) return 4;
    if (memcmp(win + 128, src, 64)) { printf("the data did not land\n"); return 5; }
    if (write_through(q2, smr, (uintptr_t)win, k2, "write QP2->QP1 through the new key") != IBV_WC_REM_ACCESS_ERR) {
        printf("QP1 is no longer the window's QP: expected a remote access error\n");
        return 6;
    }
    printf("OK\n");
    return 0;
}
