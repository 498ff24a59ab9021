/* pthread_cancel of threads blocked in ibv_get_cq_event, ibv_get_async_event and
 * rdma_get_cm_event: as with libibverbs/librdmacm (read(2) is a cancellation point) the thread
 * ends, its cleanup handlers run, and the process goes on (rping -P cancels its CQ thread when
 * an accept fails; the shim used to abort with "FATAL: exception not rethrown").
 * Prints "OK cancel" on success. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static struct ibv_context *ctx;
static struct ibv_comp_channel *ch;
static struct rdma_event_channel *ech;
static volatile int cleaned[3];

static void cleanup(void *a) { cleaned[(long)a] = 1; }

static void *cq_thread(void *a)
{
	struct ibv_cq *cq;
	void *c;
	pthread_cleanup_push(cleanup, (void *)0);
	ibv_get_cq_event(ch, &cq, &c);
	pthread_cleanup_pop(0);
	return NULL;
}

static void *async_thread(void *a)
{
	struct ibv_async_event e;
	pthread_cleanup_push(cleanup, (void *)1);
	ibv_get_async_event(ctx, &e);
	pthread_cleanup_pop(0);
	return NULL;
}

static void *cm_thread(void *a)
{
	struct rdma_cm_event *e;
	pthread_cleanup_push(cleanup, (void *)2);
	rdma_get_cm_event(ech, &e);
	pthread_cleanup_pop(0);
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
		usleep(200000); /* let it block; cancellation works at any point anyway */
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
	if (bad)
		return 1;
	printf("OK cancel\n");
	return 0;
}
