/* SPDX-License-Identifier: MIT */
/* The disk tier's configuration keys: accepted values, refused ones with a reason. */
#include "config.h"
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include "daemon/conf.h"
#include "../suite_main.h"

START_TEST(test_disk_keys)
{
	struct pkv_config c;
	char why[256];

	pkv_config_defaults(&c);
	ck_assert_str_eq(c.disk_cache, "");   /* off unless asked for */
	ck_assert_int_eq(pkv_config_set(&c, "disk-cache", "/var/cache/pagedkv", why, sizeof(why)), 0);
	ck_assert_str_eq(c.disk_cache, "/var/cache/pagedkv");
	ck_assert_int_eq(pkv_config_set(&c, "disk_budget", "20G", why, sizeof(why)), 0);
	ck_assert_uint_eq(c.disk_budget, 20ull << 30);
	ck_assert_int_eq(pkv_config_set(&c, "disk-uid-share", "25", why, sizeof(why)), 0);
	ck_assert_uint_eq(c.disk_uid_share, 25);
	ck_assert_int_eq(pkv_config_set(&c, "disk_wait_ms", "50", why, sizeof(why)), 0);
	ck_assert_uint_eq(c.disk_wait_ms, 50);
}
END_TEST

START_TEST(test_disk_keys_refused)
{
	static const char *const bad[][2] = {
		{ "disk_cache", "relative/dir" }, { "disk_cache", "" }, { "disk_budget", "512K" },
		{ "disk_budget", "lots" }, { "disk_uid_share", "0" }, { "disk_uid_share", "101" },
		{ "disk_wait_ms", "0" }, { "disk_wait_ms", "-5" },
	};
	struct pkv_config c;
	char why[256];

	pkv_config_defaults(&c);
	uint64_t budget = c.disk_budget;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int r;

		why[0] = 0;
		r = pkv_config_set(&c, bad[i][0], bad[i][1], why, sizeof(why));
		/* -ERANGE: a number out of its range; -EINVAL: not a value of the key's kind */
		ck_assert_msg(r == -EINVAL || r == -ERANGE, "%s=%s: %d", bad[i][0], bad[i][1], r);
		ck_assert_msg(strstr(why, bad[i][0]) != NULL, "%s=%s: '%s'", bad[i][0], bad[i][1], why);
	}
	ck_assert_str_eq(c.disk_cache, "");
	ck_assert_uint_eq(c.disk_budget, budget);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("tier-conf");
	TCase *tc = tcase_create("keys");

	tcase_add_test(tc, test_disk_keys);
	tcase_add_test(tc, test_disk_keys_refused);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
