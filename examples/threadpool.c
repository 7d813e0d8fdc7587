/* SPDX-License-Identifier: MIT */
/* Fork-join pool: workers spin briefly on a generation counter (a decode step issues hundreds of small
 * matvecs, and a condvar wake costs more than one of them), then sleep on a condvar. */
#include "threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define SPIN_ITERS 4000

struct worker {
	struct tpool *p;
	pthread_t th;
	int ith;
};

struct tpool {
	int n;
	struct worker *w;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	atomic_uint gen;     /* bumped (release) after fn/ctx are set */
	atomic_int pending;  /* workers still running the current job */
	atomic_int stop;
	atomic_int idle;     /* set by tpool_idle: skip the spin phase */
	tpool_fn fn;
	void *ctx;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct tpool *p = w->p;
	unsigned seen = 0;
	for (;;) {
		unsigned g;
		int i = 0;
		while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && i < SPIN_ITERS &&
		       !atomic_load_explicit(&p->idle, memory_order_relaxed)) {
			__builtin_ia32_pause();
			i++;
		}
		if (g == seen) {
			pthread_mutex_lock(&p->mu);
			while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
			       !atomic_load(&p->stop))
				pthread_cond_wait(&p->cv, &p->mu);
			pthread_mutex_unlock(&p->mu);
		}
		if (atomic_load(&p->stop))
			return NULL;
		seen = g;
		/* acquire on gen pairs with the release in tpool_run: fn and ctx are visible. */
		p->fn(p->ctx, w->ith, p->n);
		atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
	}
}

int tpool_create(int n, struct tpool **out)
{
	struct tpool *p;
	if (n <= 0) {
		const char *e = getenv("PKV_THREADS");
		n = e ? atoi(e) : (int)sysconf(_SC_NPROCESSORS_ONLN);
		if (n <= 0)
			n = 1;
		if (n > 64)
			n = 64;
	}
	p = calloc(1, sizeof *p);
	if (!p)
		return -ENOMEM;
	p->n = n;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	p->w = calloc((size_t)n, sizeof *p->w);
	if (!p->w)
		goto err;
	for (int i = 1; i < n; i++) {
		p->w[i].p = p;
		p->w[i].ith = i;
		if (pthread_create(&p->w[i].th, NULL, worker_main, &p->w[i])) {
			p->n = i;
			tpool_destroy(p);
			return -EAGAIN;
		}
	}
	*out = p;
	return 0;
err:
	free(p);
	return -ENOMEM;
}

int tpool_size(const struct tpool *p)
{
	return p ? p->n : 1;
}

void tpool_run(struct tpool *p, tpool_fn fn, void *ctx)
{
	if (!p || p->n == 1) {
		fn(ctx, 0, 1);
		return;
	}
	p->fn = fn;
	p->ctx = ctx;
	atomic_store_explicit(&p->idle, 0, memory_order_relaxed);
	atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	fn(ctx, 0, p->n);
	/* acquire pairs with each worker's release: their writes to the output are visible. */
	while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
		__builtin_ia32_pause();
}

void tpool_idle(struct tpool *p)
{
	if (p)
		atomic_store_explicit(&p->idle, 1, memory_order_relaxed);
}

void tpool_destroy(struct tpool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->stop, 1);
	atomic_fetch_add(&p->gen, 1);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (int i = 1; i < p->n; i++)
		pthread_join(p->w[i].th, NULL);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p->w);
	free(p);
}
