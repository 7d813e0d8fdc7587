/* SPDX-License-Identifier: MIT */
/* Host services for plugins: logging, aligned allocation and a persistent thread pool. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loader/loader.h"

#define MAX_THREADS 256u
/* Workers spin this long after a job before sleeping: per-layer calls come back-to-back. */
#define SPIN_NS 50000LL

struct pkv_host {
	struct pkv_host_api api;
	_Atomic int log_level;
	pkv_log_sink sink;
	void *sink_ud;
	unsigned nthreads;           /* caller included */
	unsigned nworkers;           /* threads actually started */
	pthread_t *workers;

	pthread_mutex_t call_lock;   /* one parallel_for at a time; others run inline */
	pthread_mutex_t lock;        /* guards sleeping on the condvars */
	pthread_cond_t cv_work;
	pthread_cond_t cv_done;
	/* The current job. Written by the caller before gen is bumped (release). */
	pkv_task_fn fn;
	void *arg;
	uint32_t n_tasks;
	atomic_uint next_task;
	atomic_uint gen;
	atomic_uint pending;         /* workers that have not finished the current job */
	atomic_int stop;
};

struct worker_arg {
	struct pkv_host *h;
	uint32_t index;
};

/* Set on pool threads and inside parallel_for, so a nested call runs inline instead of deadlocking. */
static _Thread_local int in_pool;

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static const char *level_name(int level)
{
	switch (level) {
	case PKV_LOG_ERROR: return "error";
	case PKV_LOG_WARN: return "warning";
	case PKV_LOG_INFO: return "info";
	default: return "debug";
	}
}

static void host_log(void *host, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void host_log(void *host, int level, const char *fmt, ...)
{
	struct pkv_host *h = host;
	char msg[1024];
	va_list ap;
	size_t n;

	if (!h || level > atomic_load(&h->log_level))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	n = strlen(msg);
	while (n && msg[n - 1] == '\n')
		msg[--n] = '\0';
	if (h->sink)
		h->sink(h->sink_ud, level, msg);
	else
		fprintf(stderr, "pagedkv: %s: %s\n", level_name(level), msg);
}

static void *host_alloc_aligned(void *host, size_t align, size_t size)
{
	void *p = NULL;

	if (align < sizeof(void *) || (align & (align - 1)) || size == 0)
		return NULL;
	if (posix_memalign(&p, align, size))
		return NULL;
	return p;
}

static void host_free_aligned(void *host, void *ptr)
{
	free(ptr);
}

static uint32_t host_num_threads(void *host)
{
	return ((struct pkv_host *)host)->nthreads;
}

static void run_tasks(struct pkv_host *h, uint32_t thread)
{
	uint32_t t;

	while ((t = atomic_fetch_add_explicit(&h->next_task, 1, memory_order_relaxed)) < h->n_tasks)
		h->fn(h->arg, t, thread);
}

static void *worker_main(void *p)
{
	struct worker_arg *wa = p;
	struct pkv_host *h = wa->h;
	uint32_t index = wa->index, seen = 0;

	free(wa);
	in_pool = 1;
	for (;;) {
		uint32_t g = atomic_load_explicit(&h->gen, memory_order_acquire);

		if (g == seen && !atomic_load(&h->stop)) {
			long long until = now_ns() + SPIN_NS;
			unsigned spins = 0;

			/* Spin briefly: the next layer's call usually follows within microseconds. */
			while ((g = atomic_load_explicit(&h->gen, memory_order_acquire)) == seen &&
			       !atomic_load(&h->stop)) {
				cpu_relax();
				if ((++spins & 63) == 0 && now_ns() > until)
					break;
			}
			if (g == seen) {
				pthread_mutex_lock(&h->lock);
				/* gen is bumped under lock, so this check cannot miss a broadcast. */
				while ((g = atomic_load_explicit(&h->gen, memory_order_acquire)) == seen &&
				       !atomic_load(&h->stop))
					pthread_cond_wait(&h->cv_work, &h->lock);
				pthread_mutex_unlock(&h->lock);
			}
		}
		if (atomic_load(&h->stop))
			break;
		seen = g;
		run_tasks(h, index);
		/* Release pairs with the caller's acquire: our task writes are visible once it sees 0. */
		if (atomic_fetch_sub_explicit(&h->pending, 1, memory_order_acq_rel) == 1) {
			pthread_mutex_lock(&h->lock);
			pthread_cond_broadcast(&h->cv_done);
			pthread_mutex_unlock(&h->lock);
		}
	}
	return NULL;
}

static int host_parallel_for(void *host, uint32_t n_tasks, pkv_task_fn fn, void *arg)
{
	struct pkv_host *h = host;
	long long until;
	uint32_t t;

	if (!h || !fn)
		return -EINVAL;
	if (n_tasks == 0)
		return 0;
	if (h->nworkers == 0 || n_tasks == 1 || in_pool || pthread_mutex_trylock(&h->call_lock)) {
		for (t = 0; t < n_tasks; t++)
			fn(arg, t, 0);
		return 0;
	}
	in_pool = 1;
	h->fn = fn;
	h->arg = arg;
	h->n_tasks = n_tasks;
	atomic_store_explicit(&h->next_task, 0, memory_order_relaxed);
	atomic_store_explicit(&h->pending, h->nworkers, memory_order_relaxed);
	pthread_mutex_lock(&h->lock);
	/* Release: the job fields above are visible to a worker that sees the new gen. */
	atomic_fetch_add_explicit(&h->gen, 1, memory_order_release);
	pthread_cond_broadcast(&h->cv_work);
	pthread_mutex_unlock(&h->lock);

	run_tasks(h, 0);

	until = now_ns() + SPIN_NS;
	t = 0;
	while (atomic_load_explicit(&h->pending, memory_order_acquire)) {
		cpu_relax();
		if ((++t & 63) == 0 && now_ns() > until)
			break;
	}
	if (atomic_load_explicit(&h->pending, memory_order_acquire)) {
		pthread_mutex_lock(&h->lock);
		while (atomic_load_explicit(&h->pending, memory_order_acquire))
			pthread_cond_wait(&h->cv_done, &h->lock);
		pthread_mutex_unlock(&h->lock);
	}
	in_pool = 0;
	pthread_mutex_unlock(&h->call_lock);
	return 0;
}

int pkv_host_create(unsigned num_threads, int log_level, struct pkv_host **out)
{
	struct pkv_host *h;
	unsigned i;
	int ret;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (num_threads == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		num_threads = n > 0 ? (unsigned)n : 1;
	}
	if (num_threads > MAX_THREADS)
		num_threads = MAX_THREADS;
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->api.abi_version = PKV_BACKEND_ABI_VERSION;
	h->api.struct_size = sizeof(h->api);
	h->api.host = h;
	h->api.log = host_log;
	h->api.alloc_aligned = host_alloc_aligned;
	h->api.free_aligned = host_free_aligned;
	h->api.num_threads = host_num_threads;
	h->api.parallel_for = host_parallel_for;
	atomic_init(&h->log_level, log_level);
	h->nthreads = num_threads;
	pthread_mutex_init(&h->call_lock, NULL);
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->cv_work, NULL);
	pthread_cond_init(&h->cv_done, NULL);
	if (num_threads > 1) {
		h->workers = calloc(num_threads - 1, sizeof(*h->workers));
		if (!h->workers) {
			ret = -ENOMEM;
			goto err_destroy;
		}
	}
	for (i = 1; i < num_threads; i++) {
		struct worker_arg *wa = malloc(sizeof(*wa));

		if (!wa) {
			ret = -ENOMEM;
			goto err_destroy;
		}
		wa->h = h;
		wa->index = i;
		ret = pthread_create(&h->workers[i - 1], NULL, worker_main, wa);
		if (ret) {
			free(wa);
			ret = -ret;
			goto err_destroy;
		}
		h->nworkers++;
	}
	*out = h;
	return 0;

err_destroy:
	pkv_host_destroy(h);
	return ret;
}

void pkv_host_destroy(struct pkv_host *h)
{
	unsigned i;

	if (!h)
		return;
	pthread_mutex_lock(&h->lock);
	atomic_store(&h->stop, 1);
	pthread_cond_broadcast(&h->cv_work);
	pthread_mutex_unlock(&h->lock);
	for (i = 0; i < h->nworkers; i++)
		pthread_join(h->workers[i], NULL);
	free(h->workers);
	pthread_cond_destroy(&h->cv_work);
	pthread_cond_destroy(&h->cv_done);
	pthread_mutex_destroy(&h->lock);
	pthread_mutex_destroy(&h->call_lock);
	free(h);
}

const struct pkv_host_api *pkv_host_api(struct pkv_host *h)
{
	return h ? &h->api : NULL;
}

void pkv_host_set_log_sink(struct pkv_host *h, pkv_log_sink fn, void *ud)
{
	if (!h)
		return;
	h->sink = fn;
	h->sink_ud = ud;
}

void pkv_host_set_log_level(struct pkv_host *h, int level)
{
	if (h)
		atomic_store(&h->log_level, level);
}
