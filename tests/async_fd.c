/* async_fd readiness through the shim (issue 14): the context's async_fd is readable exactly
 * when an asynchronous event is pending, so epoll loops (UCX, libfabric) work.
 * Event source: an RC QP attached to an SRQ entering ERR raises IBV_EVENT_QP_LAST_WQE_REACHED.
 * Checks: non-blocking EAGAIN and no readiness when nothing is pending; epoll wakes for the
 * event; the event names our QP; after it, a call finds nothing (EAGAIN) and the fd is quiet
 * again; a blocking ibv_get_async_event (O_NONBLOCK cleared) returns the next one. */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#define CHECK(c, ...)                                   \
    do {                                                \
        if (!(c)) {                                     \
            fprintf(stderr, "FAIL line %d: ", __LINE__); \
            fprintf(stderr, __VA_ARGS__);               \
            fprintf(stderr, "\n");                      \
            exit(1);                                    \
        }                                               \
    } while (0)

static int readable(int fd, int ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) > 0;
}

static struct ibv_qp *srq_qp(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_srq *srq) {
    struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 4, .max_send_sge = 1}};
    struct ibv_qp *qp = ibv_create_qp(pd, &ia);
    CHECK(qp, "create_qp: %s", strerror(errno));
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
    CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), "INIT");
    return qp;
}

static void to_err(struct ibv_qp *qp) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "ERR");
}

int main(void) {
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    CHECK(l && n > 0, "no devices");
    struct ibv_context *ctx = ibv_open_device(l[0]);
    CHECK(ctx, "open_device");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    struct ibv_srq_init_attr sa = {.attr = {.max_wr = 8, .max_sge = 1}};
    struct ibv_srq *srq = ibv_create_srq(pd, &sa);
    CHECK(pd && cq && srq, "pd/cq/srq: %s", strerror(errno));

    int fd = ctx->async_fd;
    int fl = fcntl(fd, F_GETFL);
    CHECK(fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK");
    struct ibv_async_event ev;
    CHECK(!readable(fd, 50), "async_fd readable with nothing pending");
    CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN, "expected EAGAIN, errno %d", errno);

    int ep = epoll_create1(0);
    struct epoll_event ee = {.events = EPOLLIN};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ee) == 0, "epoll_ctl");

    struct ibv_qp *qp1 = srq_qp(pd, cq, srq);
    to_err(qp1);
    struct epoll_event out;
    CHECK(epoll_wait(ep, &out, 1, 5000) == 1, "epoll: async_fd did not become readable in 5 s");
    CHECK(ibv_get_async_event(ctx, &ev) == 0, "get_async_event after epoll: errno %d", errno);
    CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == qp1, "event %d qp %p (want %d, %p)",
          ev.event_type, (void *)ev.element.qp, IBV_EVENT_QP_LAST_WQE_REACHED, (void *)qp1);
    ibv_ack_async_event(&ev);
    /* Drain: at most one more wake-up that finds nothing, then quiet. */
    CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN, "second event? errno %d", errno);
    CHECK(!readable(fd, 50), "async_fd still readable after EAGAIN");

    /* Blocking mode: the call waits for the next event. */
    CHECK(fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0, "clear O_NONBLOCK");
    struct ibv_qp *qp2 = srq_qp(pd, cq, srq);
    to_err(qp2);
    CHECK(ibv_get_async_event(ctx, &ev) == 0, "blocking get_async_event: errno %d", errno);
    CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == qp2, "blocking: event %d", ev.event_type);
    ibv_ack_async_event(&ev);

    ibv_destroy_qp(qp1);
    ibv_destroy_qp(qp2);
    ibv_destroy_srq(srq);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(l);
    printf("OK async_fd\n");
    return 0;
}
