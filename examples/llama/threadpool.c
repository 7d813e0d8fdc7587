/* SPDX-License-Identifier: MIT */
/* Fork-join pool: workers spin briefly on a generation counter (a decode step issues hundreds of small
 * matvecs, and a condvar wake costs more than one of them), then sleep on a condvar.
 *
 * On a shared machine a worker may be descheduled for a whole time slice. Jobs therefore hand out
 * work dynamically (an atomic chunk counter in the job), and the caller waits only for workers that
 * actually joined the job before it closed: a worker that wakes late finds the job closed and
 * skips it, instead of the caller waiting milliseconds for it. */
#include "threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define SPIN_ITERS 500
/* How long a worker yields its core after tpool_idle before it sleeps: a decode attend's round trip
 * (~0.1-0.2 ms) fits well inside; a long prefill attend does not need the worker back quickly. */
#define IDLE_YIELD_NS 1000000ull

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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
	atomic_int active;   /* workers inside the current job */
	atomic_int open;     /* 1 while workers may still join the current job */
	atomic_int stop;
	atomic_int idle;     /* set by tpool_idle: yield instead of spinning */
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
		/*
		 * The caller waits on another process (tpool_idle): yield the core,
		 * which that process takes at once when it runs here, and keep the
		 * vCPU from halting, so that the next job needs no wake-up either.
		 * On a busy machine a yield hands the core to whoever waits for it.
		 */
		if (g == seen && atomic_load_explicit(&p->idle, memory_order_relaxed)) {
			uint64_t end = now_ns() + IDLE_YIELD_NS;

			while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
			       !atomic_load(&p->stop) && now_ns() < end)
				sched_yield();
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
		/* Join, then check the job is still open (both seq_cst): either the caller sees our
		 * join and waits for us, or we see it closed and stay out. fn and ctx were written
		 * before open was set, so they belong to the open job. */
		atomic_fetch_add(&p->active, 1);
		if (atomic_load(&p->open))
			p->fn(p->ctx, w->ith, p->n);
		atomic_fetch_sub_explicit(&p->active, 1, memory_order_release);
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
	atomic_store(&p->open, 1);
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	fn(ctx, 0, p->n); /* returns when no work is left to claim */
	atomic_store(&p->open, 0);
	/* acquire pairs with each worker's release: their writes to the output are visible. A
	 * joined worker holds at most one chunk; yield so a descheduled one can finish it. */
	for (unsigned spins = 0; atomic_load_explicit(&p->active, memory_order_acquire) > 0; spins++) {
		if (spins < 2000)
			__builtin_ia32_pause();
		else
			sched_yield();
	}
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
