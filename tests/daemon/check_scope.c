/* SPDX-License-Identifier: MIT */
/* Prefix-sharing scope: two uids never share unless the pool was created shared; a salt narrows further. */
#include "config.h"
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "harness.h"
#include "../suite_main.h"

#define UID_A 61001
#define UID_B 61002

static struct dmn D;

static void setup(void)
{
	static const char *const extra[] = { "--socket-mode", "0666", NULL };

	ck_assert_int_eq(dmn_start(&D, extra), 0);
	ck_assert_int_eq(chmod(D.dir, 0755), 0);
}

static void teardown(void)
{
	ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}

/*
 * In a child running as uid (when uid != 0): attaches to pool, opens the
 * prompt, prefills what is not cached. Returns n_cached, or -1 on failure.
 */
static int open_as(uid_t uid, const char *pool, uint32_t flags, const char *salt)
{
	int p[2];
	pid_t pid;
	int st, nc = -1;

	ck_assert_int_eq(pipe(p), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 1 << 20, .timeout_ms = 5000 };
		struct pkv_pool_params pp;
		struct pkv_client *c;
		int32_t toks[40];
		uint32_t s, n_cached;
		int res = -1;

		close(p[0]);
		if (uid && (setgid(uid) || setuid(uid)))
			_exit(2);
		for (int i = 0; i < 40; i++)
			toks[i] = 7 * i + 1;
		test_pool_params(&pp, pool);
		pp.flags = flags;
		pp.cache_salt = salt;
		pp.cache_salt_len = salt ? strlen(salt) : 0;
		if (!pkv_connect(&o, &c) && !pkv_pool_attach(c, &pp) &&
		    !pkv_seq_open(c, toks, 40, &s, &n_cached) &&
		    !run_step(c, s, toks, n_cached, 40 - n_cached, NULL))
			res = (int)n_cached;
		if (write(p[1], &res, sizeof(res)) != sizeof(res))
			_exit(3);
		_exit(0); /* the daemon closes the sequence; its full blocks stay cached */
	}
	close(p[1]);
	ck_assert_int_eq(read(p[0], &nc, sizeof(nc)), (ssize_t)sizeof(nc));
	close(p[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_int_eq(child_status(st), 0);
	return nc;
}

START_TEST(test_two_uids_do_not_share)
{
	ck_assert_int_eq(open_as(UID_A, "p", 0, NULL), 0);
	ck_assert_int_eq(open_as(UID_A, "p", 0, NULL), 32);   /* same uid: shares */
	ck_assert_int_eq(open_as(UID_B, "p", 0, NULL), 0);    /* other uid: never */
	ck_assert_int_eq(open_as(UID_B, "p", 0, NULL), 32);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_shared_pool_shares_across_uids)
{
	ck_assert_int_eq(open_as(UID_A, "pub", PKV_POOL_SHARE_ACROSS_USERS, NULL), 0);
	ck_assert_int_eq(open_as(UID_B, "pub", PKV_POOL_SHARE_ACROSS_USERS, NULL), 32);
	/*
	 * A client cannot turn a private pool shared by asking: the shared "p"
	 * is another pool (names are scoped), which sees nothing of A's.
	 */
	ck_assert_int_eq(open_as(UID_A, "p", 0, NULL), 0);
	ck_assert_int_eq(open_as(UID_B, "p", PKV_POOL_SHARE_ACROSS_USERS, NULL), 0);
	ck_assert_int_eq(open_as(UID_A, "p", 0, NULL), 32);
}
END_TEST

START_TEST(test_salt_narrows_sharing)
{
	ck_assert_int_eq(open_as(UID_A, "p", 0, "alice-1"), 0);
	ck_assert_int_eq(open_as(UID_A, "p", 0, "alice-2"), 0);
	ck_assert_int_eq(open_as(UID_A, "p", 0, "alice-1"), 32);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("daemon-scope");
	TCase *t = tcase_create("scope");

	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 60);
	tcase_add_test(t, test_two_uids_do_not_share);
	tcase_add_test(t, test_shared_pool_shares_across_uids);
	tcase_add_test(t, test_salt_narrows_sharing);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return suite_main_as_root(suite);
}
