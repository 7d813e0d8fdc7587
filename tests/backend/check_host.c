/* SPDX-License-Identifier: MIT */
/* Host services tests: the thread pool runs every task once, nests safely, and allocation honours alignment. */
#include <check.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader/loader.h"
#include "../suite_main.h"

struct count_arg {
	atomic_int hits[1000];
	atomic_int bad_thread;
	uint32_t nthreads;
	const struct pkv_host_api *api;
};

static void count_task(void *p, uint32_t task, uint32_t thread)
{
	struct count_arg *a = p;

	atomic_fetch_add(&a->hits[task], 1);
	if (thread >= a->nthreads)
		atomic_store(&a->bad_thread, 1);
}

START_TEST(parallel_for_runs_each_task_once)
{
	struct pkv_host *h;
	const struct pkv_host_api *api;
	struct count_arg *a = calloc(1, sizeof(*a));
	int rep, i;

	ck_assert_int_eq(pkv_host_create(3, PKV_LOG_ERROR, &h), 0);
	api = pkv_host_api(h);
	ck_assert_uint_eq(api->num_threads(api->host), 3);
	a->nthreads = 3;
	for (rep = 0; rep < 200; rep++)
		ck_assert_int_eq(api->parallel_for(api->host, 1000, count_task, a), 0);
	for (i = 0; i < 1000; i++)
		ck_assert_int_eq(atomic_load(&a->hits[i]), 200);
	ck_assert_int_eq(atomic_load(&a->bad_thread), 0);
	pkv_host_destroy(h);
	free(a);
}
END_TEST

START_TEST(parallel_for_many_small_jobs)
{
	struct pkv_host *h;
	const struct pkv_host_api *api;
	struct count_arg *a = calloc(1, sizeof(*a));
	int rep;

	/* Jobs shorter than a worker's wake-up: late workers must neither run stale tasks nor be waited for. */
	ck_assert_int_eq(pkv_host_create(2, PKV_LOG_ERROR, &h), 0);
	api = pkv_host_api(h);
	a->nthreads = 2;
	for (rep = 0; rep < 20000; rep++)
		ck_assert_int_eq(api->parallel_for(api->host, 2 + rep % 3, count_task, a), 0);
	ck_assert_int_eq(atomic_load(&a->hits[0]), 20000);
	ck_assert_int_eq(atomic_load(&a->hits[1]), 20000);
	ck_assert_int_eq(atomic_load(&a->hits[2]), 20000 / 3 * 2 + (20000 % 3 == 2));
	ck_assert_int_eq(atomic_load(&a->hits[3]), 20000 / 3);
	ck_assert_int_eq(atomic_load(&a->bad_thread), 0);
	pkv_host_destroy(h);
	free(a);
}
END_TEST

struct lent_arg {
	atomic_int started[2];
	atomic_int thread_of[2];
	int wait_ms;
};

/* Each of the two tasks waits (wait_ms at most) for the other to start: both run at once only on two threads. */
static void wait_for_other_task(void *p, uint32_t task, uint32_t thread)
{
	struct lent_arg *a = p;

	atomic_store(&a->thread_of[task], (int)thread);
	atomic_store(&a->started[task], 1);
	for (int i = 0; i < a->wait_ms && !atomic_load(&a->started[!task]); i++)
		usleep(1000);
}

START_TEST(parallel_for_fans_out_on_lent_cpus)
{
	struct pkv_host *h;
	const struct pkv_host_api *api;
	struct lent_arg a;

	/* Shared-machine mode on a machine read as busy: calls run on the caller's thread... */
	setenv("PAGEDKV_SPIN_POLICY", "never", 1);
	ck_assert_int_eq(pkv_host_create(2, PKV_LOG_ERROR, &h), 0);
	api = pkv_host_api(h);
	pkv_host_set_shared_cpus(h, 1);
	memset(&a, 0, sizeof(a));
	a.wait_ms = 100;
	ck_assert_int_eq(api->parallel_for(api->host, 2, wait_for_other_task, &a), 0);
	ck_assert_int_eq(atomic_load(&a.thread_of[0]), 0);
	ck_assert_int_eq(atomic_load(&a.thread_of[1]), 0);
	/* ...unless the client waiting for them lent its cores: then the pool thread takes one of the two. */
	pkv_host_set_cpus_lent(h, 1);
	memset(&a, 0, sizeof(a));
	a.wait_ms = 30000; /* ends as soon as the other task starts */
	ck_assert_int_eq(api->parallel_for(api->host, 2, wait_for_other_task, &a), 0);
	ck_assert_int_ne(atomic_load(&a.thread_of[0]), atomic_load(&a.thread_of[1]));
	pkv_host_destroy(h);
	unsetenv("PAGEDKV_SPIN_POLICY");
}
END_TEST

static void nested_task(void *p, uint32_t task, uint32_t thread)
{
	struct count_arg *a = p;

	/* A nested call must run inline rather than deadlock on the busy pool. */
	a->api->parallel_for(a->api->host, 10, count_task, a);
}

START_TEST(parallel_for_nested_runs_inline)
{
	struct pkv_host *h;
	struct count_arg *a = calloc(1, sizeof(*a));
	int i;

	ck_assert_int_eq(pkv_host_create(2, PKV_LOG_ERROR, &h), 0);
	a->api = pkv_host_api(h);
	a->nthreads = 2;
	ck_assert_int_eq(a->api->parallel_for(a->api->host, 7, nested_task, a), 0);
	for (i = 0; i < 10; i++)
		ck_assert_int_eq(atomic_load(&a->hits[i]), 7);
	pkv_host_destroy(h);
	free(a);
}
END_TEST

START_TEST(alloc_aligned_honours_alignment)
{
	struct pkv_host *h;
	const struct pkv_host_api *api;
	void *p;

	ck_assert_int_eq(pkv_host_create(1, PKV_LOG_ERROR, &h), 0);
	api = pkv_host_api(h);
	p = api->alloc_aligned(api->host, 4096, 100);
	ck_assert_ptr_nonnull(p);
	ck_assert_uint_eq((uintptr_t)p % 4096, 0);
	api->free_aligned(api->host, p);
	ck_assert_ptr_null(api->alloc_aligned(api->host, 48, 100));
	pkv_host_destroy(h);
}
END_TEST

static int sink_level = -1;
static char sink_msg[256];

static void sink(void *ud, int level, const char *msg)
{
	sink_level = level;
	snprintf(sink_msg, sizeof(sink_msg), "%s", msg);
}

START_TEST(log_respects_level_and_sink)
{
	struct pkv_host *h;
	const struct pkv_host_api *api;

	ck_assert_int_eq(pkv_host_create(1, PKV_LOG_WARN, &h), 0);
	api = pkv_host_api(h);
	pkv_host_set_log_sink(h, sink, NULL);
	api->log(api->host, PKV_LOG_INFO, "hidden %d", 1);
	ck_assert_int_eq(sink_level, -1);
	api->log(api->host, PKV_LOG_WARN, "shown %d\n", 2);
	ck_assert_int_eq(sink_level, PKV_LOG_WARN);
	ck_assert_str_eq(sink_msg, "shown 2");
	pkv_host_destroy(h);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("host");
	TCase *tc = tcase_create("services");

	tcase_add_test(tc, parallel_for_runs_each_task_once);
	tcase_add_test(tc, parallel_for_many_small_jobs);
	tcase_add_test(tc, parallel_for_nested_runs_inline);
	tcase_add_test(tc, parallel_for_fans_out_on_lent_cpus);
	tcase_add_test(tc, alloc_aligned_honours_alignment);
	tcase_add_test(tc, log_respects_level_and_sink);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
