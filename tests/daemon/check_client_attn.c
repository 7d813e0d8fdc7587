/* SPDX-License-Identifier: MIT */
/* Client attention (PKV_POOL_CLIENT_ATTENTION): clients attend over the daemon's shared KV memory, checked
 * against the reference, across processes, with a fallback and the refusals. */
#include "config.h"
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "common/msg.h"
#include "harness.h"
#include "../suite_main.h"

#define TOL 1e-4f

static struct dmn D;
static char plugin[1100], plugin_dir[1024];

static void setup(void)
{
	harness_backend = plugin;
	setenv("PAGEDKV_PLUGIN_DIR", plugin_dir, 1);
	ck_assert_int_eq(dmn_start(&D, NULL), 0);
}

static void teardown(void)
{
	ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}

static struct pkv_client *client_blocks(const char *name, uint32_t flags, uint32_t blocks, size_t arena, int *err)
{
	struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = arena, .timeout_ms = 10000 };
	struct pkv_pool_params p;
	struct pkv_client *c;

	*err = pkv_connect(&o, &c);
	if (*err)
		return NULL;
	test_pool_params(&p, name);
	p.flags = flags;
	p.geo.num_blocks = blocks;
	*err = pkv_pool_attach(c, &p);
	if (*err) {
		pkv_disconnect(c);
		return NULL;
	}
	return c;
}

static struct pkv_client *client(uint32_t flags)
{
	int err;

	return client_blocks("attn", flags, T_BLOCKS, 2 << 20, &err);
}

static uint32_t in_client(struct pkv_client *c)
{
	struct pkv_stats st = PKV_STATS_INIT;

	ck_assert_int_eq(pkv_stats(c, &st), 0);
	return st.attention_in_client;
}

START_TEST(test_client_attn_prefill_decode_and_shared_prefix)
{
	struct pkv_client *c = client(PKV_POOL_CLIENT_ATTENTION);
	int32_t toks[48];
	uint32_t s1, nc;
	char out[4096];
	pid_t pid;
	int st;

	ck_assert_ptr_nonnull(c);
	ck_assert_uint_eq(in_client(c), 1);
	make_prompt(toks, 48, 7);
	ck_assert_int_eq(pkv_seq_open(c, toks, 40, &s1, &nc), 0);
	ck_assert_uint_eq(nc, 0);
	ck_assert_float_le(step_and_check(c, s1, toks, 40, 0, NULL), TOL);
	for (uint32_t n = 41; n <= 48; n++)
		ck_assert_float_le(step_and_check(c, s1, toks, n, n - 1, NULL), TOL);
	/* Another process of the uid finds the prompt cached and reads the KV this one wrote. */
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pkv_client *c2 = client(PKV_POOL_CLIENT_ATTENTION);
		uint32_t s2, nc2;

		if (!c2 || in_client(c2) != 1 || pkv_seq_open(c2, toks, 48, &s2, &nc2) || nc2 != 32)
			_exit(2);
		_exit(step_and_check(c2, s2, toks, 48, nc2, NULL) <= TOL ? 0 : 3);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_int_eq(child_status(st), 0);
	/* The daemon's books add up: every commit went through it. */
	ck_assert_int_eq(audit_until_clean(D.sock, 2000, out, sizeof(out)), 0);
	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_JSON, out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "\"client_attention\":true"));
	pkv_disconnect(c);
}
END_TEST

/* A fork's copy-on-write lands before the child's first step writes its slots (its begin waits for it). */
START_TEST(test_client_attn_fork_copy_on_write)
{
	struct pkv_client *c = client(PKV_POOL_CLIENT_ATTENTION);
	int32_t a[24], b[24];
	uint32_t s, child, nc;

	ck_assert_ptr_nonnull(c);
	make_prompt(a, 24, 7);
	memcpy(b, a, sizeof(a));
	for (int i = 20; i < 24; i++)
		b[i] = 1000 + i; /* the child's own tokens after the shared 20 (a partial second block) */
	ck_assert_int_eq(pkv_seq_open(c, a, 20, &s, &nc), 0);
	ck_assert_float_le(step_and_check(c, s, a, 20, 0, NULL), TOL);
	for (int round = 0; round < 4; round++) {
		ck_assert_int_eq(pkv_seq_fork(c, s, &child), 0);
		/* each side appends into the block they share: the first append copies it */
		for (uint32_t n = 21; n <= 24; n++) {
			ck_assert_float_le(step_and_check(c, child, b, n, n - 1, NULL), TOL);
			ck_assert_float_le(step_and_check(c, s, a, n, n - 1, NULL), TOL);
		}
		ck_assert_int_eq(pkv_seq_close(c, child), 0);
		ck_assert_int_eq(pkv_seq_truncate(c, s, 20), 0);
	}
	pkv_disconnect(c);
}
END_TEST

/* A step whose tables pass the first buffer (16 KiB): the daemon asks for more, nothing reserved twice. */
START_TEST(test_client_attn_long_prefill_grows_tables)
{
	enum { N = 3000 };
	int32_t *toks = malloc(N * sizeof(*toks));
	int err;
	struct pkv_client *c = client_blocks("long", PKV_POOL_CLIENT_ATTENTION, 256, 8 << 20, &err);
	uint32_t s, nc;
	char out[4096];

	ck_assert_ptr_nonnull(c);
	ck_assert_uint_eq(in_client(c), 1);
	make_prompt(toks, N, 7);
	ck_assert_int_eq(pkv_seq_open(c, toks, N - 1, &s, &nc), 0);
	/* 2,999 slots are 24 KB of slot_mapping alone */
	ck_assert_int_eq(run_step(c, s, toks, 0, N - 1, NULL), 0);
	ck_assert_float_le(step_and_check(c, s, toks, N, N - 1, NULL), TOL);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 2000, out, sizeof(out)), 0);
	free(toks);
}
END_TEST

/* Without the backend in this process's plugin directory the daemon attends, and says why. */
START_TEST(test_client_attn_falls_back_to_the_daemon)
{
	struct pkv_client *c;
	int32_t toks[20];
	uint32_t s, nc;

	setenv("PAGEDKV_PLUGIN_DIR", D.dir, 1);
	c = client(PKV_POOL_CLIENT_ATTENTION);
	ck_assert_ptr_nonnull(c);
	ck_assert_uint_eq(in_client(c), 0);
	ck_assert_ptr_nonnull(strstr(pkv_last_error(c), "client attention off"));
	make_prompt(toks, 20, 7);
	ck_assert_int_eq(pkv_seq_open(c, toks, 19, &s, &nc), 0);
	ck_assert_float_le(step_and_check(c, s, toks, 19, 0, NULL), TOL);
	ck_assert_float_le(step_and_check(c, s, toks, 20, 19, NULL), TOL);
	pkv_disconnect(c);
}
END_TEST

START_TEST(test_client_attn_refusals)
{
	struct pkv_client *c = client(PKV_POOL_CLIENT_ATTENTION), *c2;
	int err;

	ck_assert_ptr_nonnull(c);
	/* Its clients map the whole pool: never one shared across users. */
	c2 = client_blocks("shared", PKV_POOL_SHARE_ACROSS_USERS | PKV_POOL_CLIENT_ATTENTION, T_BLOCKS, 2 << 20, &err);
	ck_assert_ptr_null(c2);
	ck_assert_int_eq(err, -EINVAL);
	/* A pool in use keeps how it was created. */
	c2 = client_blocks("attn", 0, T_BLOCKS, 2 << 20, &err);
	ck_assert_ptr_null(c2);
	ck_assert_int_eq(err, -EINVAL);
	pkv_disconnect(c);
	/* A plain pool's clients get no tables (block ids of a pool the daemon attends are not theirs to see). */
	c2 = client(0);
	ck_assert_ptr_nonnull(c2);
	ck_assert_uint_eq(in_client(c2), 0);
	pkv_disconnect(c2);
}
END_TEST

/* The start of this process's mapping of the pool's memfd, from /proc/self/maps; NULL when none. */
static uint8_t *pool_mapping(size_t *len)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	uint8_t *at = NULL;

	while (f && fgets(line, sizeof(line), f))
		if (strstr(line, "memfd:pagedkv-pool")) {
			unsigned long a, b;

			if (sscanf(line, "%lx-%lx", &a, &b) == 2) {
				at = (uint8_t *)a;
				*len = b - a;
			}
			break;
		}
	if (f)
		fclose(f);
	return at;
}

/* A client scribbling over its pool harms its own KV only: the daemon stays up, its books clean. */
START_TEST(test_client_attn_scribbled_pool)
{
	struct pkv_client *c = client(PKV_POOL_CLIENT_ATTENTION), *c2;
	int32_t toks[40];
	uint32_t s, nc;
	uint8_t *map;
	size_t len = 0;
	char out[4096];

	ck_assert_ptr_nonnull(c);
	make_prompt(toks, 40, 7);
	ck_assert_int_eq(pkv_seq_open(c, toks, 39, &s, &nc), 0);
	ck_assert_float_le(step_and_check(c, s, toks, 39, 0, NULL), TOL);
	map = pool_mapping(&len);
	ck_assert_ptr_nonnull(map);
	memset(map, 0xff, len); /* NaNs everywhere */
	ck_assert(!(step_and_check(c, s, toks, 40, 39, NULL) <= TOL));
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 2000, out, sizeof(out)), 0);
	ck_assert(dmn_alive(&D));
	/* The daemon's own pools are untouched. */
	c2 = client(0);
	ck_assert_ptr_nonnull(c2);
	ck_assert_int_eq(pkv_seq_open(c2, toks, 39, &s, &nc), 0);
	ck_assert_float_le(step_and_check(c2, s, toks, 39, 0, NULL), TOL);
	pkv_disconnect(c2);
}
END_TEST

/*
 * A process that keeps the pool's memory mapped after it left (the raw
 * protocol: nothing unmaps for it) keeps none of it once the daemon frees
 * the pool: the daemon punches the whole file out, so what was there reads
 * as zeros and no page outlives the pool's budget.
 */
START_TEST(test_client_attn_freed_pool_keeps_no_pages)
{
	static const char *const extra[] = { "--pool-idle-grace-s", "0", NULL };
	struct pkv_msg_attach m;
	struct pkv_msg_reply rep;
	struct raw r;
	int fd = -1, nfds = 0;
	uint8_t *map;
	size_t len;
	ssize_t n;

	ck_assert_int_eq(dmn_stop(&D), 0);
	ck_assert_int_eq(dmn_restart(&D, extra), 0);
	ck_assert_int_eq(raw_open(&r, D.sock, 1 << 20, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
	ck_assert_int_eq(raw_hello(&r, PKV_PROTO_VERSION, r.size, 1, NULL, 0), 0);
	raw_attach_msg(&m, "kept");
	m.flags = PKV_WIRE_POOL_CLIENT_ATTN;
	ck_assert_int_eq(pkv_msg_send(r.sock, &m, sizeof(m), NULL, 0), 0);
	n = pkv_msg_recv(r.sock, &rep, sizeof(rep), &fd, 1, &nfds, 5000);
	ck_assert_int_ge(n, (ssize_t)PKV_REPLY_HDR_SIZE);
	ck_assert_int_eq(rep.status, 0);
	ck_assert_int_eq(nfds, 1);
	ck_assert(rep.flags & PKV_REPLY_POOL_MEM);
	len = rep.value;
	map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(map, MAP_FAILED);
	close(fd);
	memset(map, 0x5a, len);
	raw_close(&r); /* the pool's last client: freed at once */
	for (int i = 0; i < 1000 && map[len - 1]; i++)
		usleep(10000);
	for (size_t i = 0; i < len; i += 4096)
		ck_assert_uint_eq(map[i], 0);
	ck_assert(dmn_alive(&D));
	munmap(map, len);
}
END_TEST

int main(void)
{
	const char *dir = getenv("PKV_PLUGIN_BUILD_DIR");
	Suite *s;
	TCase *t;

	snprintf(plugin_dir, sizeof(plugin_dir), "%s/cpu/.libs", dir ? dir : "plugins");
	snprintf(plugin, sizeof(plugin), "%s/pkv_cpu.so", plugin_dir);
	if (access(plugin, R_OK))
		return 77; /* the CPU plugin is not built in this tree */
	s = suite_create("daemon-client-attention");
	t = tcase_create("client-attention");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 120);
	tcase_add_test(t, test_client_attn_prefill_decode_and_shared_prefix);
	tcase_add_test(t, test_client_attn_long_prefill_grows_tables);
	tcase_add_test(t, test_client_attn_fork_copy_on_write);
	tcase_add_test(t, test_client_attn_falls_back_to_the_daemon);
	tcase_add_test(t, test_client_attn_refusals);
	tcase_add_test(t, test_client_attn_scribbled_pool);
	tcase_add_test(t, test_client_attn_freed_pool_keeps_no_pages);
	suite_add_tcase(s, t);
	return suite_main(s);
}
