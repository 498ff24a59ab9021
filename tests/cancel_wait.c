/* pthread_cancel of threads blocked in ibv_get_cq_event, ibv_get_async_event and
 * rdma_get_cm_event: as with libibverbs/librdmacm (read(2) is a cancellation point) the thread
 * ends, its cleanup handlers run, and the process goes on (rping -P cancels its CQ thread when
 * an accept fails; the shim used to abort with "FATAL: exception not rethrown").
 * Then a thread blocked in rdma_get_cm_event while another destroys its id and the channel
 * (rping 44's CM thread at exit): the event of the destroyed id is not returned (the kernel
 * purges it) and the reader stays blocked instead of reading a freed channel (EBADF).
 * Prints "OK cancel" on success. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <sys/syscall.h>
#include <arpa/inet.h>

static struct ibv_context *ctx;
static struct ibv_comp_channel *ch;
static struct rdma_event_channel *ech;
static volatile int cleaned[3];

static void cleanup(void *a) { cleaned[(long)a] = 1; }

/* The thread about to block says who it is; the main thread waits until the kernel shows it
 * sleeping (state S in /proc/self/task/TID/stat), at most 10 s: it is then blocked in the call. */
static volatile pid_t waiter;

static void i_am_waiting(void) { waiter = (pid_t)syscall(SYS_gettid); }

static int wait_blocked(void)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		char path[64], buf[512], *p;
		FILE *f;
		pid_t tid = waiter;
		if (tid) {
			snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
			f = fopen(path, "r");
			if (f) {
				size_t n = fread(buf, 1, sizeof(buf) - 1, f);
				fclose(f);
				buf[n] = 0;
				p = strrchr(buf, ')');
				if (p && p[1] == ' ' && p[2] == 'S') {
					waiter = 0;
					return 0;
				}
			}
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10) {
			printf("the thread never blocked\n");
			return -1;
		}
		sched_yield();
	}
}

static void *cq_thread(void *a)
{
	struct ibv_cq *cq;
	void *c;
	pthread_cleanup_push(cleanup, (void *)0);
	i_am_waiting();
	ibv_get_cq_event(ch, &cq, &c);
	pthread_cleanup_pop(0);
	return NULL;
}

static void *async_thread(void *a)
{
	struct ibv_async_event e;
	pthread_cleanup_push(cleanup, (void *)1);
	i_am_waiting();
	ibv_get_async_event(ctx, &e);
	pthread_cleanup_pop(0);
	return NULL;
}

static void *cm_thread(void *a)
{
	struct rdma_cm_event *e;
	pthread_cleanup_push(cleanup, (void *)2);
	i_am_waiting();
	rdma_get_cm_event(ech, &e);
	pthread_cleanup_pop(0);
	return NULL;
}

static struct rdma_event_channel *ech2;
static volatile int returned;

static void *late_reader(void *a)
{
	struct rdma_cm_event *e;
	i_am_waiting();
	if (rdma_get_cm_event(ech2, &e) == 0)
		printf("rdma_get_cm_event returned event %d of a destroyed id\n", e->event);
	else
		perror("rdma_get_cm_event on a destroyed channel");
	returned = 1;
	return NULL;
}

int main(void)
{
	static const char *names[3] = { "ibv_get_cq_event", "ibv_get_async_event", "rdma_get_cm_event" };
	void *(*fns[3])(void *) = { cq_thread, async_thread, cm_thread };
	struct ibv_device **l;
	struct ibv_cq *cq, *cq2;
	int i, n, bad = 0;

	l = ibv_get_device_list(&n);
	if (!l || !n) {
		printf("no devices\n");
		return 1;
	}
	ctx = ibv_open_device(l[0]);
	ch = ctx ? ibv_create_comp_channel(ctx) : NULL;
	cq = ch ? ibv_create_cq(ctx, 16, NULL, ch, 0) : NULL;
	ech = rdma_create_event_channel();
	if (!cq || !ech || ibv_req_notify_cq(cq, 0)) {
		printf("setup failed\n");
		return 1;
	}
	for (i = 0; i < 3; i++) {
		pthread_t t;
		void *r;
		if (pthread_create(&t, NULL, fns[i], NULL))
			return 1;
		if (wait_blocked())
			return 1;
		pthread_cancel(t);
		pthread_join(t, &r);
		printf("%s: %s, cleanup handler %s\n", names[i], r == PTHREAD_CANCELED ? "cancelled" : "returned",
		       cleaned[i] ? "ran" : "did not run");
		bad |= r != PTHREAD_CANCELED || !cleaned[i];
	}
	cq2 = ibv_create_cq(ctx, 16, NULL, ch, 0);
	if (!cq2) {
		printf("ibv_create_cq after the cancellations failed\n");
		return 1;
	}
	ibv_destroy_cq(cq2);
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(ch);
	rdma_destroy_event_channel(ech);
	ibv_close_device(ctx);
	ibv_free_device_list(l);
	/* An event queued for an id that is destroyed before it is read. */
	{
		struct rdma_cm_id *id;
		struct sockaddr_in dst;
		pthread_t t;
		ech2 = rdma_create_event_channel();
		if (!ech2 || rdma_create_id(ech2, &id, NULL, RDMA_PS_TCP))
			return 1;
		memset(&dst, 0, sizeof(dst));
		dst.sin_family = AF_INET;
		dst.sin_port = htons(7471);
		dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 1000) || rdma_destroy_id(id)) {
			perror("rdma_resolve_addr/rdma_destroy_id");
			return 1;
		}
		if (pthread_create(&t, NULL, late_reader, NULL))
			return 1;
		if (wait_blocked())
			return 1;
		rdma_destroy_event_channel(ech2);
		/* The negative check needs a window: a reader that wrongly returns does so at once. */
		usleep(200000);
		printf("reader on a destroyed channel: %s\n", returned ? "returned" : "still blocked");
		bad |= returned;
	}
	if (bad)
		return 1;
	printf("OK cancel\n");
	return 0;
}
