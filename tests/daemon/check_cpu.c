/* SPDX-License-Identifier: MIT */
/* The daemon with the real CPU backend plugin: prefill, decode, prefix sharing and coalesced clients vs the reference. */
#include "config.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "harness.h"
#include "../suite_main.h"

#define TOL 1e-4f

static struct dmn D;
static char plugin[1024];

static void setup(void)
{
	harness_backend = plugin;
	ck_assert_int_eq(dmn_start(&D, NULL), 0);
}

static void teardown(void)
{
	ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}

static struct pkv_client *client(void)
{
	struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 2 << 20, .timeout_ms = 10000 };
	struct pkv_pool_params p;
	struct pkv_client *c;

	if (pkv_connect(&o, &c))
		return NULL;
	test_pool_params(&p, "cpu");
	if (pkv_pool_attach(c, &p)) {
		pkv_disconnect(c);
		return NULL;
	}
	return c;
}

START_TEST(test_cpu_prefill_decode_and_prefix_hit)
{
	struct pkv_client *c = client();
	int32_t toks[48];
	uint32_t s1, s2, nc;

	ck_assert_ptr_nonnull(c);
	for (int i = 0; i < 48; i++)
		toks[i] = 3 * i + 5;
	ck_assert_int_eq(pkv_seq_open(c, toks, 40, &s1, &nc), 0);
	ck_assert_float_le(step_and_check(c, s1, toks, 40, 0, NULL), TOL);
	for (uint32_t n = 41; n <= 48; n++)
		ck_assert_float_le(step_and_check(c, s1, toks, n, n - 1, NULL), TOL);
	/* A second sequence over the same prompt reads the first one's blocks. */
	ck_assert_int_eq(pkv_seq_open(c, toks, 40, &s2, &nc), 0);
	ck_assert_uint_eq(nc, 32);
	ck_assert_float_le(step_and_check(c, s2, toks, 40, 32, NULL), TOL);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_cpu_concurrent_decoders)
{
	enum { N = 4 };
	pid_t pids[N];

	for (int i = 0; i < N; i++) {
		pids[i] = fork();
		ck_assert_int_ge(pids[i], 0);
		if (pids[i] == 0) {
			struct pkv_client *c = client();
			int32_t toks[64];
			uint32_t s, nc;
			int bad = !c;

			for (int j = 0; j < 64; j++)
				toks[j] = 11 * j + 17 * i;
			bad = bad || pkv_seq_open(c, toks, 24, &s, &nc) || step_and_check(c, s, toks, 24, 0, NULL) > TOL;
			for (uint32_t n = 25; n <= 64 && !bad; n++)
				bad = step_and_check(c, s, toks, n, n - 1, NULL) > TOL;
			pkv_disconnect(c);
			_exit(bad);
		}
	}
	for (int i = 0; i < N; i++) {
		int st;

		ck_assert_int_eq(waitpid(pids[i], &st, 0), pids[i]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client %d failed", i);
	}
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

int main(void)
{
	const char *dir = getenv("PKV_PLUGIN_BUILD_DIR");
	Suite *s;
	TCase *t;

	snprintf(plugin, sizeof(plugin), "%s/cpu/.libs/pkv_cpu.so", dir ? dir : "plugins");
	if (access(plugin, R_OK))
		return 77; /* the CPU plugin is not built in this tree */
	s = suite_create("daemon-cpu");
	t = tcase_create("cpu");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 120);
	tcase_add_test(t, test_cpu_prefill_decode_and_prefix_hit);
	tcase_add_test(t, test_cpu_concurrent_decoders);
	suite_add_tcase(s, t);
	return suite_main(s);
}
