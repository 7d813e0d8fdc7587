/* SPDX-License-Identifier: MIT */
/* The configuration parser: keys, values, sizes, comments, and errors that name the file and line. */
#include "config.h"
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

	snprintf(path, sizeof(path), "/tmp/pkv-conf-XXXXXX");
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	fputs(text, f);
	fclose(f);
}

START_TEST(test_file_keys_are_applied)
{
	struct pkv_config c;
	char why[256];

	pkv_config_defaults(&c);
	write_file("# comment\n\nsocket = /tmp/x.sock\nsocket_mode = 0600\nmemory_budget = 2G\n"
		   "worker_threads=3\n  log_level =  debug  \ncoalesce = no\nbackend = /p/pkv_cpu.so\n"
		   "client_block_share = 25\nmax_clients_per_uid = 7\nforeground = yes\n");
	ck_assert_int_eq(pkv_config_load(&c, path, why, sizeof(why)), 0);
	unlink(path);
	ck_assert_str_eq(c.socket_path, "/tmp/x.sock");
	ck_assert_uint_eq(c.socket_mode, 0600);
	ck_assert_uint_eq(c.memory_budget, 2ull << 30);
	ck_assert_uint_eq(c.worker_threads, 3);
	ck_assert_int_eq(c.log_level, 3);
	ck_assert_int_eq(c.coalesce, 0);
	ck_assert_str_eq(c.backend_varlen, "/p/pkv_cpu.so");
	ck_assert_str_eq(c.backend_decode, "/p/pkv_cpu.so");
	ck_assert_uint_eq(c.uid_block_share, 25);
	ck_assert_uint_eq(c.max_clients_per_uid, 7);
	ck_assert_int_eq(c.foreground, 1);
}
END_TEST

/* Issue 9's isolation keys: defaults that are safe, values range-checked. */
START_TEST(test_isolation_keys)
{
	struct pkv_config c;
	char why[256];

	pkv_config_defaults(&c);
	ck_assert_str_eq(c.admin_group, "");
	ck_assert_uint_eq(c.max_unauth_per_uid, 16);
	ck_assert_uint_eq(c.uid_max_region, 4ull << 30);
	write_file("admin_group = pkvadm\nmax_unauth_per_uid = 4\nmax_arena_per_uid = 512M\n");
	ck_assert_int_eq(pkv_config_load(&c, path, why, sizeof(why)), 0);
	unlink(path);
	ck_assert_str_eq(c.admin_group, "pkvadm");
	ck_assert_uint_eq(c.max_unauth_per_uid, 4);
	ck_assert_uint_eq(c.uid_max_region, 512ull << 20);   /* the old name still works */
	ck_assert_int_lt(pkv_config_set(&c, "max-unauth-per-uid", "0", why, sizeof(why)), 0);
	ck_assert_int_lt(pkv_config_set(&c, "max-arena-per-uid", "1K", why, sizeof(why)), 0);
	ck_assert_int_lt(pkv_config_set(&c, "admin-group", "", why, sizeof(why)), 0);
	ck_assert_int_eq(pkv_config_set(&c, "admin-group", "wheel", why, sizeof(why)), 0);
	ck_assert_str_eq(c.admin_group, "wheel");
}
END_TEST

START_TEST(test_bad_line_names_file_and_line)
{
	struct pkv_config c;
	char why[256], want[128];

	pkv_config_defaults(&c);
	write_file("socket = /tmp/a\nmemory_budget = lots\n");
	ck_assert_int_lt(pkv_config_load(&c, path, why, sizeof(why)), 0);
	snprintf(want, sizeof(want), "%s:2:", path);
	ck_assert_ptr_nonnull(strstr(why, want));
	unlink(path);
	write_file("no equals sign here\n");
	ck_assert_int_lt(pkv_config_load(&c, path, why, sizeof(why)), 0);
	ck_assert_ptr_nonnull(strstr(why, ":1:"));
	unlink(path);
	write_file("frobnicate = 1\n");
	ck_assert_int_lt(pkv_config_load(&c, path, why, sizeof(why)), 0);
	ck_assert_ptr_nonnull(strstr(why, "unknown key"));
	unlink(path);
	ck_assert_int_lt(pkv_config_load(&c, "/nonexistent/pagedkvd.conf", why, sizeof(why)), 0);
}
END_TEST

START_TEST(test_values_are_range_checked)
{
	struct pkv_config c;
	char why[256];
	uint64_t v;

	pkv_config_defaults(&c);
	ck_assert_int_lt(pkv_config_set(&c, "socket-mode", "0999", why, sizeof(why)), 0);
	ck_assert_int_lt(pkv_config_set(&c, "client-block-share", "101", why, sizeof(why)), 0);
	ck_assert_int_lt(pkv_config_set(&c, "workers", "-1", why, sizeof(why)), 0);
	ck_assert_int_lt(pkv_config_set(&c, "memory-budget", "0", why, sizeof(why)), 0);
	ck_assert_int_lt(pkv_config_set(&c, "memory-budget", "99999999999T", why, sizeof(why)), 0);
	ck_assert_int_lt(pkv_config_set(&c, "log-level", "chatty", why, sizeof(why)), 0);
	ck_assert_int_eq(pkv_config_set(&c, "memory-budget", "512M", why, sizeof(why)), 0);
	ck_assert_uint_eq(c.memory_budget, 512ull << 20);
	ck_assert_int_eq(pkv_parse_size("64KiB", &v), 0);
	ck_assert_uint_eq(v, 64 << 10);
}
END_TEST

START_TEST(test_per_uid_keys)
{
	struct pkv_config c;
	char why[256];

	pkv_config_defaults(&c);
	/* Safe defaults: a uid gets half of a shared pool and of the budget, idle pools die. */
	ck_assert_uint_eq(c.uid_block_share, 50);
	ck_assert_uint_eq(c.uid_budget_share, 50);
	ck_assert_uint_gt(c.pool_idle_grace_s, 0);
	ck_assert_uint_gt(c.attend_slice_us, 0);
	ck_assert_int_eq(pkv_config_set(&c, "uid-max-region", "3M", why, sizeof(why)), 0);
	ck_assert_uint_eq(c.uid_max_region, 3ull << 20);
	ck_assert_int_eq(pkv_config_set(&c, "pool_idle_grace_s", "0", why, sizeof(why)), 0);
	ck_assert_uint_eq(c.pool_idle_grace_s, 0);
	ck_assert_int_eq(pkv_config_set(&c, "attend-slice-us", "0", why, sizeof(why)), 0);
	ck_assert_uint_eq(c.attend_slice_us, 0);
	ck_assert_int_lt(pkv_config_set(&c, "uid-budget-share", "0", why, sizeof(why)), 0);
	ck_assert_int_lt(pkv_config_set(&c, "uid-max-seqs", "0", why, sizeof(why)), 0);
	ck_assert_int_lt(pkv_config_set(&c, "uid-max-pools", "0", why, sizeof(why)), 0);
	ck_assert_int_lt(pkv_config_set(&c, "uid-max-region", "1K", why, sizeof(why)), 0);
	ck_assert_ptr_nonnull(strstr(why, "uid-max-region"));
}
END_TEST

/*
 * The config file the service installs (systemd/pagedkvd.conf) loads, uses no old key name, and
 * weakens no per-user limit below the built-in default: it once set client_block_share = 100, which
 * became uid_block_share and let one user take every block of a shared pool on every service install.
 */
START_TEST(test_shipped_file_keeps_the_safe_defaults)
{
	struct pkv_config dflt, c;
	char file[4200], why[256], line[512];
	FILE *f;

	snprintf(file, sizeof(file), "%s/systemd/pagedkvd.conf",
		 getenv("PKV_TOP_SRCDIR") ? getenv("PKV_TOP_SRCDIR") : "..");
	pkv_config_defaults(&dflt);
	pkv_config_defaults(&c);
	ck_assert_msg(pkv_config_load(&c, file, why, sizeof(why)) == 0, "%s", why);
	ck_assert_uint_le(c.uid_block_share, dflt.uid_block_share);
	ck_assert_uint_le(c.uid_budget_share, dflt.uid_budget_share);
	ck_assert_uint_le(c.max_clients_per_uid, dflt.max_clients_per_uid);
	ck_assert_uint_le(c.uid_max_seqs, dflt.uid_max_seqs);
	ck_assert_uint_le(c.uid_max_region, dflt.uid_max_region);
	f = fopen(file, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		char key[128];
		const struct pkv_conf_key *k;

		if (sscanf(line, " %127[a-z_0-9] =", key) != 1)
			continue;
		k = pkv_config_find(key);
		ck_assert_msg(k && !(k->flags & PKV_CONF_OLD_NAME), "%s: key %s is unknown or an old name", file, key);
	}
	fclose(f);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("daemon-conf");
	TCase *t = tcase_create("conf");

	tcase_add_test(t, test_file_keys_are_applied);
	tcase_add_test(t, test_bad_line_names_file_and_line);
	tcase_add_test(t, test_isolation_keys);
	tcase_add_test(t, test_values_are_range_checked);
	tcase_add_test(t, test_per_uid_keys);
	tcase_add_test(t, test_shipped_file_keeps_the_safe_defaults);
	suite_add_tcase(s, t);
	return suite_main(s);
}
