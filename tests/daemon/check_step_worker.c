/* SPDX-License-Identifier: MIT */
/* Step boundaries run by the worker on a ring it owns: results, error texts, copy-on-write, quotas, long steps. */
#include "config.h"
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pagedkv/pagedkv.h>
#include "harness.h"
#include "../suite_main.h"

/*
 * The worker gives an idle ring back after spin_us: a whole second here, so
 * that every step boundary after a step's first attend reaches the worker
 * (nothing else of these tests' pool holds its cache lock meanwhile).
 */
static const char *const held_ring[] = { "--spin-us", "1000000", NULL };

static struct dmn D;

static void setup(void)
{
	ck_assert_int_eq(dmn_start(&D, held_ring), 0);
}

static void teardown(void)
{
	if (D.pid > 0)
		ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}

START_TEST(test_decode_steps_on_the_worker_match_reference)
{
	struct pkv_client *c = test_client(D.sock, "p", 4 << 20, 5000);
	int32_t toks[80];
	uint32_t seq, nc;

	ck_assert_ptr_nonnull(c);
	make_prompt(toks, 80, 1);
	ck_assert_int_eq(pkv_seq_open(c, toks, 20, &seq, &nc), 0);
	ck_assert_float_le(step_and_check(c, seq, toks, 20, 0, NULL), 1e-5f);
	/* Each step's end and the next one's begin follow an attend on the held ring. */
	for (uint32_t n = 21; n <= 80; n++)
		ck_assert_float_le(step_and_check(c, seq, toks, n, n - 1, NULL), 1e-5f);
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_worker_step_errors_say_why)
{
	struct pkv_client *c = test_client(D.sock, "p", 4 << 20, 5000);
	size_t qn = (size_t)T_HEADS * T_DIM, kn = (size_t)T_KV_HEADS * T_DIM;
	float *q = pkv_alloc(c, qn * 4), *k = pkv_alloc(c, kn * 4), *v = pkv_alloc(c, kn * 4), *o = pkv_alloc(c, qn * 4);
	int32_t toks[24];
	uint32_t seq, nc, one = 1, bogus = 12345;

	ck_assert_ptr_nonnull(c);
	ck_assert(q && k && v && o);
	memset(q, 0, qn * 4);
	memset(k, 0, kn * 4);
	memset(v, 0, kn * 4);
	make_prompt(toks, 24, 2);
	ck_assert_int_eq(pkv_seq_open(c, toks, 20, &seq, &nc), 0);
	ck_assert_float_le(step_and_check(c, seq, toks, 20, 0, NULL), 1e-5f);
	/* A step attended in layer 0 only: its end must refuse to commit, and say which layers. */
	ck_assert_int_eq(pkv_step_begin(c, &seq, &one, toks + 20, 1), 0);
	ck_assert_int_eq(pkv_attend(c, 0, q, k, v, o), 0);
	ck_assert_int_eq(pkv_step_end(c), -EINVAL);
	ck_assert_ptr_nonnull(strstr(pkv_last_error(c), "not attended"));
	/* No step open any more. */
	ck_assert_int_eq(pkv_step_abort(c), -EINVAL);
	ck_assert_ptr_nonnull(strstr(pkv_last_error(c), "no open step"));
	/* A sequence this connection does not hold. */
	ck_assert_int_lt(pkv_step_begin(c, &bogus, &one, toks, 1), 0);
	ck_assert_str_ne(pkv_last_error(c), "");
	/* Nothing was committed: the sequence still continues from 20 tokens. */
	ck_assert_float_le(step_and_check(c, seq, toks, 21, 20, NULL), 1e-5f);
	pkv_free(c, q);
	pkv_free(c, k);
	pkv_free(c, v);
	pkv_free(c, o);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_copy_on_write_of_a_worker_step)
{
	struct pkv_client *c = test_client(D.sock, "p", 4 << 20, 5000);
	int32_t par[24], kid[24];
	uint32_t seq, child, nc;

	ck_assert_ptr_nonnull(c);
	make_prompt(par, 24, 3);
	memcpy(kid, par, sizeof(kid));
	kid[20] = 391;
	kid[21] = 392;
	ck_assert_int_eq(pkv_seq_open(c, par, 20, &seq, &nc), 0);
	ck_assert_float_le(step_and_check(c, seq, par, 20, 0, NULL), 1e-5f);
	ck_assert_int_eq(pkv_seq_fork(c, seq, &child), 0);
	/* The child's step goes through the loop (the fork handed the ring back); the
	 * parent's then begins on the worker and must copy the shared partial block. */
	ck_assert_float_le(step_and_check(c, child, kid, 21, 20, NULL), 1e-5f);
	ck_assert_float_le(step_and_check(c, seq, par, 21, 20, NULL), 1e-5f);
	ck_assert_float_le(step_and_check(c, child, kid, 22, 21, NULL), 1e-5f);
	ck_assert_float_le(step_and_check(c, seq, par, 22, 21, NULL), 1e-5f);
	ck_assert_int_eq(pkv_seq_close(c, child), 0);
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_long_step_on_a_held_ring)
{
	struct pkv_client *c = test_client(D.sock, "p", 8 << 20, 5000);
	int32_t toks[340];
	uint32_t seq, nc;

	ck_assert_ptr_nonnull(c);
	make_prompt(toks, 340, 4);
	ck_assert_int_eq(pkv_seq_open(c, toks, 20, &seq, &nc), 0);
	ck_assert_float_le(step_and_check(c, seq, toks, 20, 0, NULL), 1e-5f);
	/* 300 new tokens: more than the worker runs itself; the loop takes this begin and end. */
	ck_assert_float_le(step_and_check(c, seq, toks, 320, 20, NULL), 1e-5f);
	ck_assert_float_le(step_and_check(c, seq, toks, 321, 320, NULL), 1e-5f);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

/* The per-uid block share of a shared pool holds for a begin the worker runs (uid_block_share 25: 16 blocks). */
START_TEST(test_block_share_holds_on_the_worker)
{
	static const char *const extra[] = { "--spin-us", "1000000", "--uid-block-share", "25", NULL };
	struct pkv_connect_opts o = { .arena_bytes = 4 << 20, .timeout_ms = 5000 };
	struct pkv_pool_params pp;
	struct pkv_client *c;
	int32_t toks[300];
	uint32_t seq, nc, n;

	ck_assert_int_eq(dmn_stop(&D), 0);
	ck_assert_int_eq(dmn_restart(&D, extra), 0); /* dmn_start would leave the first daemon's dir behind */
	o.socket_path = D.sock;
	ck_assert_int_eq(pkv_connect(&o, &c), 0);
	test_pool_params(&pp, "pub");
	pp.flags = PKV_POOL_SHARE_ACROSS_USERS;
	ck_assert_int_eq(pkv_pool_attach(c, &pp), 0);
	make_prompt(toks, 300, 5);
	ck_assert_int_eq(pkv_seq_open(c, toks, 16, &seq, &nc), 0);
	ck_assert_float_le(step_and_check(c, seq, toks, 16, 0, NULL), 1e-5f);
	/* 1 block held; 256 more tokens would need 16 more: over the share. */
	n = 256;
	ck_assert_int_eq(pkv_step_begin(c, &seq, &n, toks + 16, 1), -ENOSPC);
	ck_assert_ptr_nonnull(strstr(pkv_last_error(c), "quota"));
	/* 15 more fit exactly. */
	ck_assert_float_le(step_and_check(c, seq, toks, 256, 16, NULL), 1e-5f);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("step_worker");
	TCase *t = tcase_create("worker");

	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 60);
	tcase_add_test(t, test_decode_steps_on_the_worker_match_reference);
	tcase_add_test(t, test_worker_step_errors_say_why);
	tcase_add_test(t, test_copy_on_write_of_a_worker_step);
	tcase_add_test(t, test_long_step_on_a_held_ring);
	tcase_add_test(t, test_block_share_holds_on_the_worker);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return suite_main(suite());
}
