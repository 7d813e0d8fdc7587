/* SPDX-License-Identifier: MIT */
/* Host services for plugins: logging, aligned allocation and a persistent thread pool. */
#include "config.h"
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/spin.h"
#include "loader/loader.h"

#define MAX_THREADS 256u
/*
 * Workers spin this long after a job before sleeping (per-layer calls come
 * back-to-back), and the caller as long for tasks others claimed; in
 * shared-machine mode only while a core would otherwise idle
 * (pkv_spin_worthwhile): where threads wait for a core, every spin is taken
 * from one with work.
 */
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
	/*
	 * The current job. fn and arg are written before claim is published
	 * (release); a thread reads them only after claiming a task with a CAS
	 * on claim (acquire), which cannot succeed once the job is complete, so
	 * it never pairs one job's task with another job's function.
	 */
	pkv_task_fn fn;
	void *arg;
	_Atomic uint64_t claim;      /* job tag (16 bits) | n_tasks (24) | next task (24) */
	atomic_uint done;            /* tasks of the current job completed */
	atomic_uint gen;             /* bumped per job: wakes sleeping workers */
	atomic_int caller_waiting;
	atomic_int stop;
	atomic_int shared_cpus;      /* pkv_host_set_shared_cpus */
	atomic_int cpus_claimed;     /* pkv_host_set_cpus_claimed */
	atomic_int cpus_lent;        /* pkv_host_set_cpus_lent */
	uint32_t tag;                /* caller-only: last job tag */
};

#define CLAIM_BITS 24
#define CLAIM_MASK ((1ull << CLAIM_BITS) - 1)

struct worker_arg {
	struct pkv_host *h;
	uint32_t index;
};

/* Set on pool threads and inside parallel_for, so a nested call runs inline instead of deadlocking. */
static _Thread_local int in_pool;


/* How long to spin now: SPIN_NS, or 0 in shared-machine mode when no core idles. */
static uint64_t spin_ns(struct pkv_host *h)
{
	return !atomic_load_explicit(&h->shared_cpus, memory_order_relaxed) || pkv_spin_worthwhile() ? SPIN_NS : 0;
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

/* Claims and runs tasks of the current job until none is left. */
static void run_tasks(struct pkv_host *h, uint32_t thread)
{
	uint64_t c = atomic_load_explicit(&h->claim, memory_order_acquire);

	for (;;) {
		uint64_t n = (c >> CLAIM_BITS) & CLAIM_MASK, t = c & CLAIM_MASK;

		if (t >= n)
			return;
		if (!atomic_compare_exchange_weak_explicit(&h->claim, &c, c + 1, memory_order_acq_rel,
							   memory_order_acquire))
			continue;
		h->fn(h->arg, (uint32_t)t, thread);
		/*
		 * Seq-cst, pairing with the caller's store of caller_waiting and load
		 * of done (a Dekker pair): either it sees done == n, or we see it waiting.
		 * Also makes the task's writes visible to the caller.
		 */
		if (atomic_fetch_add(&h->done, 1) + 1 == n && atomic_load(&h->caller_waiting)) {
			pthread_mutex_lock(&h->lock);
			pthread_cond_broadcast(&h->cv_done);
			pthread_mutex_unlock(&h->lock);
		}
		c = atomic_load_explicit(&h->claim, memory_order_acquire);
	}
}

static void *worker_main(void *p)
{
	struct worker_arg *wa = p;
	struct pkv_host *h = wa->h;
	uint32_t index = wa->index, seen = 0;

	free(wa);
	in_pool = 1;
	{
		char name[16];

		/* Named for top -H and perf: which thread of the daemon is busy. */
		snprintf(name, sizeof(name), "pkv-backend%u", index);
		pthread_setname_np(pthread_self(), name);
	}
	for (;;) {
		uint32_t g = atomic_load_explicit(&h->gen, memory_order_acquire);

		if (g == seen && !atomic_load(&h->stop)) {
			/* Not while clients compute on every CPU: they want this one back now. */
			uint64_t until = pkv_now_ns() +
					 (atomic_load_explicit(&h->cpus_claimed, memory_order_relaxed) ? 0 : spin_ns(h));
			unsigned spins = 0;

			/* Spin briefly: the next layer's call usually follows within microseconds. */
			while ((g = atomic_load_explicit(&h->gen, memory_order_acquire)) == seen &&
			       !atomic_load(&h->stop)) {
				cpu_relax();
				if ((++spins & 63) == 0 && pkv_now_ns() > until)
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
		/*
		 * A worker that wakes late may find the job finished (the caller ran
		 * every task itself and returned) or a newer one: claims decide, and
		 * the caller never waits for a worker that took nothing.
		 */
		run_tasks(h, index);
	}
	return NULL;
}

static int host_parallel_for(void *host, uint32_t n_tasks, pkv_task_fn fn, void *arg)
{
	struct pkv_host *h = host;
	uint64_t until;
	uint32_t t;
	int lent;

	if (!h || !fn)
		return -EINVAL;
	if (n_tasks == 0)
		return 0;
	/*
	 * Shared-machine mode with no core idle beside the caller's: a woken
	 * pool thread would take one from a thread with work (a client, the
	 * daemon's loop), and the caller would wait for the task it claimed,
	 * adding two context switches to a call that may last microseconds (a
	 * decode attend), so run it here. A client spinning for this very call
	 * holds a core too: on 2 CPUs a decode attend split over two threads
	 * took 112-199 us against 83-103 us on one. Unless the client waiting
	 * for the call lent us its cores (pkv_host_set_cpus_lent): they are ours
	 * until the call ends, whatever the runnable count says.
	 */
	lent = atomic_load_explicit(&h->cpus_lent, memory_order_relaxed);
	if (h->nworkers == 0 || n_tasks == 1 || n_tasks > CLAIM_MASK || in_pool ||
	    (atomic_load_explicit(&h->shared_cpus, memory_order_relaxed) && !lent && !pkv_spin_spare_cpu()) ||
	    pthread_mutex_trylock(&h->call_lock)) {
		for (t = 0; t < n_tasks; t++)
			fn(arg, t, 0);
		return 0;
	}
	in_pool = 1;
	h->fn = fn;
	h->arg = arg;
	atomic_store_explicit(&h->done, 0, memory_order_relaxed);
	h->tag = (h->tag + 1) & 0xffff;
	/* Release: fn and arg are visible to whoever claims a task of this job. */
	atomic_store_explicit(&h->claim, (uint64_t)h->tag << (2 * CLAIM_BITS) | (uint64_t)n_tasks << CLAIM_BITS,
			      memory_order_release);
	pthread_mutex_lock(&h->lock);
	atomic_fetch_add_explicit(&h->gen, 1, memory_order_release);
	pthread_cond_broadcast(&h->cv_work);
	pthread_mutex_unlock(&h->lock);

	run_tasks(h, 0);

	/*
	 * Wait for tasks other threads claimed; a worker that claimed none is
	 * not waited for. On lent cores the wait spins: a task lasts tens of
	 * microseconds, a wake-up of this thread about as long.
	 */
	until = pkv_now_ns() + (lent ? SPIN_NS : spin_ns(h));
	t = 0;
	while (atomic_load_explicit(&h->done, memory_order_acquire) < n_tasks) {
		cpu_relax();
		if ((++t & 63) == 0 && pkv_now_ns() > until)
			break;
	}
	if (atomic_load_explicit(&h->done, memory_order_acquire) < n_tasks) {
		pthread_mutex_lock(&h->lock);
		atomic_store(&h->caller_waiting, 1);
		while (atomic_load(&h->done) < n_tasks)
			pthread_cond_wait(&h->cv_done, &h->lock);
		atomic_store(&h->caller_waiting, 0);
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

void pkv_host_set_shared_cpus(struct pkv_host *h, int on)
{
	if (h)
		atomic_store(&h->shared_cpus, !!on);
}

void pkv_host_set_cpus_claimed(struct pkv_host *h, int on)
{
	if (h && atomic_load_explicit(&h->cpus_claimed, memory_order_relaxed) != !!on)
		atomic_store_explicit(&h->cpus_claimed, !!on, memory_order_relaxed);
}

void pkv_host_set_cpus_lent(struct pkv_host *h, int on)
{
	if (h && atomic_load_explicit(&h->cpus_lent, memory_order_relaxed) != !!on)
		atomic_store_explicit(&h->cpus_lent, !!on, memory_order_relaxed);
}

void pkv_host_set_log_level(struct pkv_host *h, int level)
{
	if (h)
		atomic_store(&h->log_level, level);
}
