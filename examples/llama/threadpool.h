/* SPDX-License-Identifier: MIT */
/* A tiny fork-join thread pool: run fn(ctx, i, n) on n threads and wait for all of them. */
#ifndef PKV_EX_THREADPOOL_H
#define PKV_EX_THREADPOOL_H

struct tpool;

typedef void (*tpool_fn)(void *ctx, int ith, int nth);

/* n_threads includes the caller; 0 picks $PKV_THREADS or the CPU count. */
int tpool_create(int n_threads, struct tpool **out);
void tpool_destroy(struct tpool *p);
int tpool_size(const struct tpool *p);
/* Runs fn on the caller and on every worker that wakes in time, and returns when all that joined are
 * done. fn must claim its work dynamically (a worker may not join at all); ith/nth are advisory. */
void tpool_run(struct tpool *p, tpool_fn fn, void *ctx);
/* The caller is about to wait on another process (the daemon): the workers stop spinning and yield
 * their cores until the next tpool_run (for at most about a millisecond, then they sleep). The
 * process waited for gets a core at once, and the vCPU does not halt: on the development VM waking a
 * thread on a halted vCPU took ~50 us, twice per layer of a 2-thread client (the daemon's worker,
 * then our worker for the next matmul). */
void tpool_idle(struct tpool *p);

#endif
