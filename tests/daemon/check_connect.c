/* SPDX-License-Identifier: MIT */
/* pkv_connect's reasons (no daemon, stale socket, refused by the daemon) and the client structs' struct_size. */
#include "config.h"
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "harness.h"
#include "../suite_main.h"

static char why[512];

START_TEST(no_socket_names_path_and_says_no_daemon)
{
	struct pkv_connect_opts o = PKV_CONNECT_OPTS_INIT;
	struct pkv_client *c = NULL;

	o.socket_path = "/nonexistent-pkv-dir/pagedkv.sock";
	o.error_buf = why;
	o.error_buf_len = sizeof(why);
	ck_assert_int_eq(pkv_connect(&o, &c), -ENOENT);
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(why, "/nonexistent-pkv-dir/pagedkv.sock") && strstr(why, "no pagedkvd is running"),
		      "%s", why);
	/* The generic text no longer reads as "no such sequence" alone. */
	ck_assert_ptr_nonnull(strstr(pkv_strerror(-ENOENT), "pkv_connect"));
}
END_TEST

/* A socket file nobody listens on (a daemon that died without unlinking it). */
START_TEST(stale_socket_says_nothing_listens)
{
	struct pkv_connect_opts o = PKV_CONNECT_OPTS_INIT;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	char dir[] = "/tmp/pkv-stale.XXXXXX";
	struct pkv_client *c;
	int s;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(a.sun_path, sizeof(a.sun_path), "%s/s.sock", dir);
	s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	ck_assert_int_ge(s, 0);
	ck_assert_int_eq(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
	close(s);
	o.socket_path = a.sun_path;
	o.error_buf = why;
	o.error_buf_len = sizeof(why);
	ck_assert_int_eq(pkv_connect(&o, &c), -ECONNREFUSED);
	ck_assert_msg(strstr(why, a.sun_path) && strstr(why, "stale socket"), "%s", why);
	unlink(a.sun_path);
	rmdir(dir);
}
END_TEST

/* The daemon's own reason reaches the caller through the library, no raw protocol needed. */
START_TEST(refusal_reason_reaches_caller)
{
	static const char *const extra[] = { "--max-clients-per-uid", "1", NULL };
	struct pkv_connect_opts o = PKV_CONNECT_OPTS_INIT;
	struct pkv_client *c, *c2;
	struct dmn D;

	ck_assert_int_eq(dmn_start(&D, extra), 0);
	o.socket_path = D.sock;
	o.arena_bytes = 1 << 20;
	o.timeout_ms = 5000;
	o.error_buf = why;
	o.error_buf_len = sizeof(why);
	ck_assert_int_eq(pkv_connect(&o, &c), 0);
	ck_assert_int_eq(pkv_connect(&o, &c2), -EUSERS);
	ck_assert_msg(strstr(why, "refused the connection") && strstr(why, "max_clients_per_uid") &&
		      strstr(why, D.sock), "%s", why);
	pkv_disconnect(c);
	ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}
END_TEST

/*
 * struct_size both ways: a caller built against a newer, larger struct (a
 * field appended) and one that leaves struct_size 0; pkv_stats writes no
 * more than an older caller's smaller struct holds.
 */
START_TEST(struct_size_both_ways)
{
	struct {
		struct pkv_connect_opts o;
		uint64_t appended_later;
	} newer = { .o = PKV_CONNECT_OPTS_INIT, .appended_later = ~0ull };
	struct pkv_connect_opts zero = { .socket_path = NULL }; /* struct_size 0: version 1 */
	struct pkv_pool_params pp;
	struct pkv_stats full = PKV_STATS_INIT;
	union {
		struct pkv_stats st;
		unsigned char bytes[sizeof(struct pkv_stats)];
	} old;
	const size_t old_size = offsetof(struct pkv_stats, open_seqs);
	struct pkv_client *c;
	struct dmn D;
	size_t i;

	ck_assert_int_eq(dmn_start(&D, NULL), 0);
	newer.o.struct_size = sizeof(newer);
	newer.o.socket_path = D.sock;
	newer.o.arena_bytes = 1 << 20;
	ck_assert_int_eq(pkv_connect(&newer.o, &c), 0);
	test_pool_params(&pp, "sizes");
	ck_assert_int_eq(pkv_pool_attach(c, &pp), 0);
	ck_assert_int_eq(pkv_stats(c, &full), 0);
	ck_assert_uint_eq(full.num_blocks, T_BLOCKS);
	ck_assert_uint_eq(full.struct_size, sizeof(full));
	memset(old.bytes, 0xa5, sizeof(old.bytes));
	old.st.struct_size = (uint32_t)old_size;
	ck_assert_int_eq(pkv_stats(c, &old.st), 0);
	ck_assert_uint_eq(old.st.num_blocks, T_BLOCKS);
	for (i = old_size; i < sizeof(old.bytes); i++)
		ck_assert_msg(old.bytes[i] == 0xa5, "pkv_stats wrote byte %zu past the caller's struct", i);
	old.st.struct_size = 2; /* not even the size field */
	ck_assert_int_eq(pkv_stats(c, &old.st), -EINVAL);
	pkv_disconnect(c);

	zero.socket_path = D.sock;
	zero.arena_bytes = 1 << 20;
	ck_assert_int_eq(pkv_connect(&zero, &c), 0);
	pp.struct_size = 0;
	ck_assert_int_eq(pkv_pool_attach(c, &pp), 0);
	pkv_disconnect(c);
	ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("connect");
	TCase *tc = tcase_create("connect");

	tcase_add_test(tc, no_socket_names_path_and_says_no_daemon);
	tcase_add_test(tc, stale_socket_says_nothing_listens);
	tcase_add_test(tc, refusal_reason_reaches_caller);
	tcase_add_test(tc, struct_size_both_ways);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
