/* ibv_fork_init and the shared-object import verbs through the pmrxe shim (run under
 * `pmrxe run --`). Built and driven by tests/fork_import.rs.
 *
 *   fork_import MODE    MODE: early (ibv_fork_init, then register)
 *                             late  (register, then ibv_fork_init: EINVAL as rdma-core 44)
 *                             env   (RDMAV_FORK_SAFE set by the caller, no ibv_fork_init)
 *                             import (ibv_import_device/pd/mr and their errors; the provider
 *                                     interface on pmrxe objects: EOPNOTSUPP, no fault)
 *
 * Any failure: message, exit 1; success: "OK MODE", exit 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define DIE(...) do { fprintf(stderr, "fork_import: " __VA_ARGS__); fprintf(stderr, " (errno %d)\n", errno); exit(1); } while (0)
#define CHECK(c) do { if (!(c)) DIE("%s:%d: %s", __FILE__, __LINE__, #c); } while (0)

static long page;

/* Provider interface (IBVERBS_PRIVATE_34, no public header): on a pmrxe object the real
 * functions would follow the context's private part; the shim answers EOPNOTSUPP. */
int ibv_cmd_dealloc_pd(struct ibv_pd *pd);
int ibv_cmd_poll_cq(struct ibv_cq *cq, int ne, struct ibv_wc *wc);
int ibv_cmd_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);

/* Is `a` mapped in a child forked now? */
static int child_has_page(void *a) {
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		unsigned char v;
		_exit(mincore(a, page, &v) == 0 ? 0 : 1);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st));
	return WEXITSTATUS(st) == 0;
}

static struct ibv_context *open_dev(void) {
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	CHECK(l && n > 0);
	struct ibv_context *c = ibv_open_device(l[0]);
	CHECK(c);
	ibv_free_device_list(l);
	return c;
}

/* Three pages; the first two registered. */
static void fork_mode(const char *mode) {
	int early = !strcmp(mode, "early"), env = !strcmp(mode, "env");
	if (early) {
		CHECK(ibv_is_fork_initialized() == IBV_FORK_DISABLED);
		CHECK(ibv_fork_init() == 0);
	}
	struct ibv_context *ctx = open_dev();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	unsigned char *buf;
	CHECK(posix_memalign((void **)&buf, page, 3 * page) == 0);
	memset(buf, 0x5a, 3 * page);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 2 * page, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	if (early || env) {
		CHECK(ibv_is_fork_initialized() == IBV_FORK_ENABLED);
		CHECK(!child_has_page(buf));
		CHECK(!child_has_page(buf + page));
		CHECK(child_has_page(buf + 2 * page));
		/* The parent's registered memory is unaffected. */
		for (long i = 0; i < 3 * page; i++)
			CHECK(buf[i] == 0x5a);
		/* A second MR on the same pages, then both gone: inherited again. */
		struct ibv_mr *mr2 = ibv_reg_mr(pd, buf + 10, 100, IBV_ACCESS_LOCAL_WRITE);
		CHECK(mr2);
		CHECK(ibv_dereg_mr(mr2) == 0);
		CHECK(!child_has_page(buf));
		CHECK(ibv_dereg_mr(mr) == 0);
		CHECK(child_has_page(buf));
	} else {
		int e = ibv_fork_init();
		if (e != EINVAL)
			DIE("ibv_fork_init after ibv_reg_mr = %d, want EINVAL", e);
		CHECK(ibv_is_fork_initialized() == IBV_FORK_DISABLED);
		/* Unprotected: the child has the registered pages, and they are shared. */
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			buf[1] = 0x77;
			_exit(0);
		}
		int st;
		CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
		CHECK(buf[1] == 0x77);
		CHECK(ibv_dereg_mr(mr) == 0);
	}
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
}

static void import_mode(void) {
	struct ibv_context *ctx = open_dev();
	CHECK(ctx->cmd_fd >= 0);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	static char buf[8192];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr);

	/* Not a context fd: EINVAL; a closed fd: EINVAL. */
	int null = open("/dev/null", O_RDWR);
	CHECK(null >= 0);
	errno = 0;
	CHECK(!ibv_import_device(null) && errno == EINVAL);
	int p[2];
	CHECK(pipe(p) == 0);
	errno = 0;
	CHECK(!ibv_import_device(p[0]) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_import_device(p[0] + 100) && errno == EINVAL);
	/* The cmd_fd of this process, from a child: not its session (EOPNOTSUPP), fd untouched. */
	int dup_fd = dup(ctx->cmd_fd);
	CHECK(dup_fd >= 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		errno = 0;
		struct ibv_context *c = ibv_import_device(dup_fd);
		_exit(!c && errno == EOPNOTSUPP && fcntl(dup_fd, F_GETFD) >= 0 ? 0 : 1);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);

	struct ibv_context *ctx2 = ibv_import_device(dup_fd);
	CHECK(ctx2 && ctx2 != ctx);
	CHECK(ctx2->cmd_fd == dup_fd && ctx2->device == ctx->device);
	errno = 0;
	CHECK(!ibv_import_pd(ctx2, pd->handle + 1000) && errno == EINVAL);
	struct ibv_pd *pd2 = ibv_import_pd(ctx2, pd->handle);
	CHECK(pd2 && pd2 != pd && pd2->handle == pd->handle && pd2->context == ctx2);
	errno = 0;
	CHECK(!ibv_import_mr(pd2, mr->handle + 1000) && errno == EINVAL);
	struct ibv_mr *mr2 = ibv_import_mr(pd2, mr->handle);
	CHECK(mr2 && mr2 != mr);
	CHECK(mr2->handle == mr->handle && mr2->lkey == mr->lkey && mr2->rkey == mr->rkey);
	CHECK(mr2->length == mr->length && mr2->addr == NULL && mr2->pd == pd2 && mr2->context == ctx2);
	/* An MR of another PD is not importable into this one. */
	struct ibv_pd *other = ibv_alloc_pd(ctx);
	CHECK(other);
	errno = 0;
	CHECK(!ibv_import_mr(other, mr->handle) && errno == EINVAL);
	CHECK(ibv_dealloc_pd(other) == 0);
	/* The imported context and PD make objects on the same session. */
	struct ibv_cq *cq = ibv_create_cq(ctx2, 4, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd2, &qa);
	CHECK(qp);
	CHECK(ibv_cmd_dealloc_pd(pd2) == EOPNOTSUPP);
	struct ibv_wc wc;
	errno = 0;
	CHECK(ibv_cmd_poll_cq(cq, 1, &wc) == -1 && errno == EOPNOTSUPP);
	struct ibv_send_wr swr = { .opcode = IBV_WR_SEND }, *bad = NULL;
	CHECK(ibv_cmd_post_send(qp, &swr, &bad) == EOPNOTSUPP && bad == &swr);
	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	/* Unimport frees only the wrappers: the originals still work and are destroyed once. */
	ibv_unimport_mr(mr2);
	ibv_unimport_pd(pd2);
	CHECK(ibv_close_device(ctx2) == 0);
	CHECK(fcntl(dup_fd, F_GETFD) == -1 && errno == EBADF); /* the context owned it */
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
}

int main(int argc, char **argv) {
	page = sysconf(_SC_PAGESIZE);
	if (argc != 2)
		DIE("usage: fork_import early|late|env|import");
	if (!strcmp(argv[1], "import"))
		import_mode();
	else if (!strcmp(argv[1], "early") || !strcmp(argv[1], "late") || !strcmp(argv[1], "env"))
		fork_mode(argv[1]);
	else
		DIE("unknown mode %s", argv[1]);
	printf("OK %s\n", argv[1]);
	return 0;
}
