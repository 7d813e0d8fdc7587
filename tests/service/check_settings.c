/* SPDX-License-Identifier: MIT */
/* pagedkvd's settings table: every default parses, --print-config reads back as the same settings,
 * trailing comments, and errors that name the flag or key with the valid values. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/conf.h"
#include "../suite_main.h"

static char path[64];

static void write_file(const char *text)
{
	FILE *f;
	int fd;

	snprintf(path, sizeof(path), "/tmp/pkv-settings.XXXXXX");
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	fputs(text, f);
	fclose(f);
}

START_TEST(every_default_is_a_valid_value)
{
	struct pkv_config c;
	char why[256], v[4200];

	pkv_config_defaults(&c);
	for (size_t i = 0; i < pkv_conf_nkeys; i++) {
		const struct pkv_conf_key *k = &pkv_conf_keys[i];

		ck_assert_ptr_nonnull(k->help);
		ck_assert_ptr_eq(pkv_config_find(k->key), k);
		if (!k->def)
			continue;
		ck_assert_msg(pkv_config_set(&c, k->key, k->def, why, sizeof(why)) == 0, "%s", why);
		pkv_config_format(&c, k, v, sizeof(v));
		ck_assert_msg(pkv_config_set(&c, k->key, v, why, sizeof(why)) == 0, "%s = %s: %s", k->key, v, why);
	}
	ck_assert_uint_eq(c.memory_budget, 1ull << 30);
	ck_assert_uint_eq(c.socket_mode, 0660);
	ck_assert_str_eq(c.backend_decode, "cpu");
}
END_TEST

START_TEST(print_config_reads_back)
{
	struct pkv_config a, b;
	char why[256];
	FILE *f;
	int fd;

	pkv_config_defaults(&a);
	ck_assert_int_eq(pkv_config_set(&a, "--memory-budget", "3G", why, sizeof(why)), 0);
	ck_assert_int_eq(pkv_config_set(&a, "log_level", "debug", why, sizeof(why)), 0);
	ck_assert_int_eq(pkv_config_set(&a, "socket-group", "pagedkv", why, sizeof(why)), 0);
	snprintf(path, sizeof(path), "/tmp/pkv-settings.XXXXXX");
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	pkv_config_print(&a, f);
	fclose(f);
	pkv_config_defaults(&b);
	ck_assert_msg(pkv_config_load(&b, path, why, sizeof(why)) == 0, "%s", why);
	unlink(path);
	ck_assert_int_eq(memcmp(&a, &b, sizeof(a)), 0);
}
END_TEST

START_TEST(trailing_comments)
{
	struct pkv_config c;
	char why[256];

	pkv_config_defaults(&c);
	write_file("memory_budget = 256M   # the KV pools\nlog_level = warn# no space: part of the value\n");
	ck_assert_int_lt(pkv_config_load(&c, path, why, sizeof(why)), 0);
	ck_assert_ptr_nonnull(strstr(why, ":2:"));
	unlink(path);
	write_file("memory_budget = 256M   # the KV pools\n\tlog_level = warn\t# quiet\nsocket = /tmp/a#b.sock\n");
	ck_assert_msg(pkv_config_load(&c, path, why, sizeof(why)) == 0, "%s", why);
	unlink(path);
	ck_assert_uint_eq(c.memory_budget, 256ull << 20);
	ck_assert_int_eq(c.log_level, 1);
	ck_assert_str_eq(c.socket_path, "/tmp/a#b.sock");
}
END_TEST

static void expect_error(const char *name, const char *value, const char *const *parts)
{
	struct pkv_config c;
	char why[512];

	pkv_config_defaults(&c);
	ck_assert_int_lt(pkv_config_set(&c, name, value, why, sizeof(why)), 0);
	for (; *parts; parts++)
		ck_assert_msg(strstr(why, *parts), "'%s' lacks '%s'", why, *parts);
}

START_TEST(errors_name_the_flag_and_the_range)
{
	expect_error("--memory-budget", "100", (const char *[]){ "--memory-budget", "too small", "1M", "memory", NULL });
	expect_error("-m", "1000T", (const char *[]){ "-m:", "too large", "this machine's memory", NULL });
	expect_error("memory_budget", "lots", (const char *[]){ "memory_budget", "not a size", NULL });
	expect_error("--log-level", "verbose", (const char *[]){ "--log-level", "error, warn, info, debug", NULL });
	expect_error("--workers", "-1", (const char *[]){ "--workers", "0 to 1024", NULL });
	expect_error("--client-block-share", "0", (const char *[]){ "1 to 100", NULL });
	expect_error("--socket-mode", "0999", (const char *[]){ "octal", "0777", NULL });
	expect_error("--frobnicate", "1", (const char *[]){ "unknown key", "--frobnicate", NULL });
}
END_TEST

int main(void)
{
	Suite *s = suite_create("settings");
	TCase *t = tcase_create("table");

	tcase_add_test(t, every_default_is_a_valid_value);
	tcase_add_test(t, print_config_reads_back);
	tcase_add_test(t, trailing_comments);
	tcase_add_test(t, errors_name_the_flag_and_the_range);
	suite_add_tcase(s, t);
	return suite_main(s);
}
