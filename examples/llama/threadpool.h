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
/* Tells spinning workers to sleep now: the caller is about to wait on something else (the daemon)
 * and a spinning worker would take the CPU the daemon needs. The next tpool_run wakes them. */
void tpool_idle(struct tpool *p);

#endif
