/* SPDX-License-Identifier: MIT */
/* Cache manager under allocation failure: every -ENOMEM leaves the state exactly as it was. */
#include "helpers.h"

/*
 * malloc, calloc and realloc are replaced in this program so the n-th
 * allocation inside a cache call can be made to fail. A sanitizer build
 * owns the allocator itself, so there the test is skipped.
 */
#if defined(__SANITIZE_ADDRESS__)
int main(void)
{
	return 77;
}
#else
#include <stdio.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

static long countdown = -1;   /* allocations left before one fails; -1: never */
static unsigned long failures;

static int fail_now(void)
{
	if (countdown < 0)
		return 0;
	if (countdown-- == 0) {
		failures++;
		return 1;
	}
	return 0;
}

void *malloc(size_t n);
void *calloc(size_t n, size_t m);
void *realloc(void *p, size_t n);

void *malloc(size_t n)
{
	return fail_now() ? NULL : __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
	return fail_now() ? NULL : __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
	return fail_now() ? NULL : __libc_realloc(p, n);
}

#define OWN 4

/* Runs call with the k-th allocation failing, for k = 0, 1, ... until it succeeds. */
#define EVERY_FAILURE(c, setup, call) do {                                             \
	for (long _k = 0;; _k++) {                                                     \
		struct test_snap _a, _b;                                               \
		int _r;                                                                \
		setup;                                                                 \
		_a = test_snapshot(c, OWN);                                            \
		countdown = _k;                                                        \
		_r = (call);                                                           \
		countdown = -1;                                                        \
		if (_r != -ENOMEM) {                                                   \
			ck_assert_int_ge(_r, 0);                                       \
			break;                                                         \
		}                                                                      \
		_b = test_snapshot(c, OWN);                                            \
		test_same(&_a, &_b);                                                   \
		ck_assert_int_lt(_k, 1000);                                            \
	}                                                                              \
} while (0)

START_TEST(create_fails_cleanly)
{
	struct pkv_geometry g = test_geom(64);
	struct pkv_cache *c = NULL;
	unsigned long before = failures;
	long k;
	int r;

	for (k = 0;; k++) {
		countdown = k;
		r = pkv_cache_create(&g, NULL, &c);
		countdown = -1;
		if (r != -ENOMEM)
			break;
		ck_assert_ptr_null(c);
	}
	ck_assert_int_eq(r, 0);
	ck_assert_uint_gt(failures - before, 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(open_fork_step_pin_fail_cleanly)
{
	struct pkv_cache *c = test_cache(256);
	int32_t t[200];
	uint32_t s = 0, k = 0, nc, extra[80];
	struct pkv_step_req r;
	struct pkv_step *st = NULL;
	struct pkv_step_meta m;
	unsigned long before = failures;

	test_prompt(t, 200, 1);
	/* Open: the sequence slots and the owner map grow on first use. */
	EVERY_FAILURE(c, (void)0, pkv_cache_seq_open(c, OWN, test_ns(1), t, 200, &s, &nc));
	/* The first step: the step object and its buffers. */
	r = (struct pkv_step_req){ s, 200, t };
	EVERY_FAILURE(c, (void)0, pkv_cache_step_begin(c, OWN, &r, 1, &st, &m));
	ck_assert_int_eq(test_commit(c, st), 0);
	/* Fork: a slot and a table for the child. */
	EVERY_FAILURE(c, (void)0, pkv_cache_seq_fork(c, OWN, s, &k));
	/* Many sequences: the slot array grows past its first size. */
	for (int i = 0; i < 80; i++)
		EVERY_FAILURE(c, (void)0, pkv_cache_seq_open(c, OWN, test_ns(1), t, 3, &extra[i], &nc));
	/* Pin: the path record and the owner's pin list. */
	EVERY_FAILURE(c, (void)0, pkv_prefix_pin(c, OWN, test_ns(1), t, 64));
	/* A second owner: its owner entry too. */
	EVERY_FAILURE(c, (void)0, pkv_prefix_pin(c, OWN + 7, test_ns(1), t, 64));
	/* Owner limits: many owners grow the owner map. */
	for (uint32_t o = 100; o < 140; o++)
		EVERY_FAILURE(c, (void)0, pkv_cache_set_owner_limits(c, o, 5, 5));
	ck_assert_uint_gt(failures - before, 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cache-nomem");
	TCase *tc = tcase_create("enomem");

	tcase_add_test(tc, create_fails_cleanly);
	tcase_add_test(tc, open_fork_step_pin_fail_cleanly);
	suite_add_tcase(s, tc);
	return test_run(s);
}
#endif
