/* SPDX-License-Identifier: MIT */
/* Per-uid limits, pool scope and lifetime, sliced attends: real processes under different uids. */
#include "config.h"
#include <check.h>
#include <math.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "harness.h"
#include "../suite_main.h"

#define UID_A 61011
#define UID_B 61012

static struct dmn D;

static void start(const char *const *extra)
{
	const char *args[32] = { "--socket-mode", "0666" };
	int n = 2;

	for (; extra && *extra && n < 31; extra++)
		args[n++] = *extra;
	args[n] = NULL;
	ck_assert_int_eq(dmn_start(&D, args), 0);
	ck_assert_int_eq(chmod(D.dir, 0755), 0);
}

/* start() on the backend at plugin (a library this build made). */
static void start_on(const char *plugin, const char *const *extra)
{
	ck_assert_msg(access(plugin, R_OK) == 0, "%s: not built", plugin);
	harness_backend = plugin;
	start(extra);
	harness_backend = NULL;
}

static void teardown(void)
{
	if (D.pid > 0)
		ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}

/* In a child: a failed check names its line on stderr and becomes the exit status. */
#define CHILD_CHECK(cond)                                                                  \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: child check failed: %s\n", __FILE__, __LINE__, #cond); \
			_exit(1);                                                          \
		}                                                                          \
	} while (0)

static void become(uid_t uid)
{
	if (setresgid(uid, uid, uid) || setresuid(uid, uid, uid))
		_exit(2);
}

static struct pkv_client *conn(const char *pool, uint32_t flags, uint32_t num_layers)
{
	struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 1 << 20, .timeout_ms = 5000 };
	struct pkv_pool_params pp;
	struct pkv_client *c;

	if (pkv_connect(&o, &c))
		return NULL;
	test_pool_params(&pp, pool);
	pp.flags = flags;
	if (num_layers)
		pp.geo.num_layers = num_layers;
	if (pkv_pool_attach(c, &pp)) {
		fprintf(stderr, "attach '%s': %s\n", pool, pkv_last_error(c));
		pkv_disconnect(c);
		return NULL;
	}
	return c;
}

/* Runs fn(arg) as uid in a child process; returns its exit status (0 = every check held). */
static int run_as(uid_t uid, int (*fn)(void *), void *arg)
{
	pid_t pid = fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		become(uid);
		_exit(fn(arg));
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/*
 * A process of uid attached to pool (flags, num_layers) that stays until
 * killed; returns once the attach is done. Its pid in *pid.
 */
struct holder_arg {
	const char *pool;
	uint32_t flags, layers;
};

static void hold_as(uid_t uid, const struct holder_arg *h, pid_t *pid)
{
	int p[2];
	char c = 0;

	ck_assert_int_eq(pipe(p), 0);
	*pid = fork();
	ck_assert_int_ge(*pid, 0);
	if (*pid == 0) {
		struct pkv_client *cl;

		close(p[0]);
		become(uid);
		cl = conn(h->pool, h->flags, h->layers);
		c = cl ? 'y' : 'n';
		if (write(p[1], &c, 1) != 1)
			_exit(3);
		for (;;)
			pause();
	}
	close(p[1]);
	ck_assert_int_eq(read(p[0], &c, 1), 1);
	close(p[0]);
	ck_assert_int_eq(c, 'y');
}

static void unhold(pid_t pid)
{
	int st;

	kill(pid, SIGKILL);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
}

/* ---------------------------------------------------------------- sequences */

static int open_n(struct pkv_client *c, int n)
{
	int32_t toks[4] = { 1, 2, 3, 4 };
	uint32_t s, nc;

	for (int i = 0; i < n; i++) {
		int r = pkv_seq_open(c, toks, 4, &s, &nc);

		if (r)
			return r;
	}
	return 0;
}

static int seqs_a(void *arg)
{
	struct pkv_client *c[3];
	int32_t toks[4] = { 1, 2, 3, 4 };
	uint32_t s, child, nc;

	(void)arg;
	for (int i = 0; i < 3; i++)
		CHILD_CHECK((c[i] = conn("p", 0, 0)) != NULL);
	/* uid_max_seqs 6 over three connections of client_max_seqs 4 each. */
	CHILD_CHECK(open_n(c[0], 4) == 0);
	CHILD_CHECK(pkv_seq_open(c[1], toks, 4, &s, &nc) == 0);
	CHILD_CHECK(pkv_seq_fork(c[1], s, &child) == 0);        /* forks count too */
	CHILD_CHECK(pkv_seq_open(c[1], toks, 4, &s, &nc) == -ENOSPC);
	CHILD_CHECK(strstr(pkv_last_error(c[1]), "uid_max_seqs") != NULL);
	CHILD_CHECK(pkv_seq_fork(c[1], child, &s) == -ENOSPC);
	CHILD_CHECK(pkv_seq_open(c[2], toks, 4, &s, &nc) == -ENOSPC);
	/* A closed sequence, then a whole connection, give their share back. */
	CHILD_CHECK(pkv_seq_close(c[1], child) == 0);
	CHILD_CHECK(pkv_seq_open(c[2], toks, 4, &s, &nc) == 0);
	CHILD_CHECK(pkv_seq_open(c[2], toks, 4, &s, &nc) == -ENOSPC);
	pkv_disconnect(c[0]);
	CHILD_CHECK(open_n(c[2], 3) == 0);
	pkv_disconnect(c[1]);
	pkv_disconnect(c[2]);
	return 0;
}

static int seqs_b(void *arg)
{
	struct pkv_client *c = conn("p", 0, 0);

	(void)arg;
	CHILD_CHECK(c != NULL);
	CHILD_CHECK(open_n(c, 4) == 0);
	pkv_disconnect(c);
	return 0;
}

START_TEST(test_sequence_quota_is_per_uid)
{
	static const char *const extra[] = { "--uid-max-seqs", "6", "--client-max-seqs", "4", NULL };
	struct holder_arg h = { "p", 0, 0 };
	pid_t hb;

	start(extra);
	/* Another uid is attached the whole time: its quota is its own. */
	hold_as(UID_B, &h, &hb);
	ck_assert_int_eq(run_as(UID_A, seqs_a, NULL), 0);
	ck_assert_int_eq(run_as(UID_B, seqs_b, NULL), 0);
	unhold(hb);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

/* ---------------------------------------------------------------- blocks */

static int blocks_a(void *arg)
{
	struct pkv_client *a1 = conn("pub", PKV_POOL_SHARE_ACROSS_USERS, 0);
	struct pkv_client *a2 = conn("pub", PKV_POOL_SHARE_ACROSS_USERS, 0);
	int32_t toks[300];
	uint32_t s1, s2, nc, n;
	int *out = arg;

	CHILD_CHECK(a1 && a2);
	for (int i = 0; i < 300; i++)
		toks[i] = 1000 + i;
	/* 25% of 64 blocks = 16 blocks of 16 tokens for the uid, over both its connections. */
	CHILD_CHECK(pkv_seq_open(a1, toks, 1, &s1, &nc) == 0);
	CHILD_CHECK(pkv_seq_open(a2, toks + 1, 1, &s2, &nc) == 0);
	n = 192; /* 12 blocks reserved by a1's open step */
	CHILD_CHECK(pkv_step_begin(a1, &s1, &n, toks, 1) == 0);
	n = 80;  /* 5 more: 17 > 16 */
	CHILD_CHECK(pkv_step_begin(a2, &s2, &n, toks, 1) == -ENOSPC);
	CHILD_CHECK(strstr(pkv_last_error(a2), "quota") != NULL);
	n = 64;  /* 4 more: exactly 16 */
	CHILD_CHECK(pkv_step_begin(a2, &s2, &n, toks, 1) == 0);
	(void)out;
	pkv_disconnect(a1);
	pkv_disconnect(a2);
	return 0;
}

static int blocks_b(void *arg)
{
	struct pkv_client *b = conn("pub", PKV_POOL_SHARE_ACROSS_USERS, 0);
	int32_t toks[256];
	uint32_t s, nc, n = 256;

	(void)arg;
	CHILD_CHECK(b != NULL);
	for (int i = 0; i < 256; i++)
		toks[i] = 5000 + i;
	CHILD_CHECK(pkv_seq_open(b, toks, 1, &s, &nc) == 0);
	CHILD_CHECK(pkv_step_begin(b, &s, &n, toks, 1) == 0);
	pkv_disconnect(b);
	return 0;
}

START_TEST(test_block_share_is_per_uid_in_shared_pools)
{
	static const char *const extra[] = { "--uid-block-share", "25", NULL };

	start(extra);
	ck_assert_int_eq(run_as(UID_A, blocks_a, NULL), 0);
	ck_assert_int_eq(run_as(UID_B, blocks_b, NULL), 0);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

/* ---------------------------------------------------------------- pins */

static int pins_a(void *arg)
{
	struct pkv_client *c1 = conn("p", 0, 0), *c2 = conn("p", 0, 0);
	int32_t toks[40];
	uint32_t s, nc;

	(void)arg;
	CHILD_CHECK(c1 && c2);
	for (int i = 0; i < 40; i++)
		toks[i] = 3 * i + 5;
	CHILD_CHECK(pkv_seq_open(c1, toks, 40, &s, &nc) == 0);
	CHILD_CHECK(run_step(c1, s, toks, 0, 40, NULL) == 0);
	CHILD_CHECK(pkv_pin(c1, toks, 32) == 32);
	CHILD_CHECK(pkv_pin(c1, toks, 16) == 16);
	/* uid_max_pins 2, counted over both connections. */
	CHILD_CHECK(pkv_pin(c2, toks, 32) == -ENOSPC);
	CHILD_CHECK(strstr(pkv_last_error(c2), "uid_max_pins") != NULL);
	CHILD_CHECK(pkv_unpin(c1, toks, 16) == 16);
	CHILD_CHECK(pkv_pin(c2, toks, 32) == 32);
	pkv_disconnect(c1);
	pkv_disconnect(c2);
	return 0;
}

START_TEST(test_pins_are_counted_per_uid)
{
	static const char *const extra[] = { "--uid-max-pins", "2", NULL };

	start(extra);
	ck_assert_int_eq(run_as(UID_A, pins_a, NULL), 0);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

/* ---------------------------------------------------------------- regions */

static int regions_a(void *arg)
{
	struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 1 << 20, .timeout_ms = 5000 };
	struct pkv_client *c[3] = { NULL, NULL, NULL };

	(void)arg;
	CHILD_CHECK(pkv_connect(&o, &c[0]) == 0);
	CHILD_CHECK(pkv_connect(&o, &c[1]) == 0);
	/* Each region is 1 MiB of arena plus rings: a third passes 3 MiB. */
	CHILD_CHECK(pkv_connect(&o, &c[2]) == -EDQUOT);
	pkv_disconnect(c[1]);
	CHILD_CHECK(pkv_connect(&o, &c[2]) == 0);
	pkv_disconnect(c[0]);
	pkv_disconnect(c[2]);
	return 0;
}

START_TEST(test_region_bytes_are_counted_per_uid)
{
	static const char *const extra[] = { "--uid-max-region", "3M", NULL };

	start(extra);
	ck_assert_int_eq(run_as(UID_A, regions_a, NULL), 0);
	/* Another uid has its own allowance. */
	ck_assert_int_eq(run_as(UID_B, regions_a, NULL), 0);
}
END_TEST

/* ---------------------------------------------------------------- pools */

static int attach_ok(void *arg)
{
	const struct holder_arg *h = arg;
	struct pkv_client *c = conn(h->pool, h->flags, h->layers);

	if (!c)
		return 1;
	pkv_disconnect(c);
	return 0;
}

START_TEST(test_pool_names_are_private_to_their_uid)
{
	struct holder_arg sq = { "llama-3-8b", 0, 3 }, real = { "llama-3-8b", 0, 0 };
	struct holder_arg pub3 = { "pub", PKV_POOL_SHARE_ACROSS_USERS, 3 }, pub = { "pub", PKV_POOL_SHARE_ACROSS_USERS, 0 };
	pid_t ha, hp;

	start(NULL);
	/* A squats the name with another geometry and stays attached: B's pool is another pool. */
	hold_as(UID_A, &sq, &ha);
	ck_assert_int_eq(run_as(UID_B, attach_ok, &real), 0);
	/* A shared name is one pool for everybody: a different geometry is refused while in use... */
	hold_as(UID_A, &pub3, &hp);
	ck_assert_int_ne(run_as(UID_B, attach_ok, &pub), 0);
	/* ...and goes to the next attach once nobody uses it. */
	unhold(hp);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
	ck_assert_int_eq(run_as(UID_B, attach_ok, &pub), 0);
	unhold(ha);
}
END_TEST

static int two_pools(void *arg)
{
	struct pkv_client *c1 = conn("s1", 0, 0), *c2 = conn("s2", 0, 0);

	(void)arg;
	CHILD_CHECK(c1 && c2);
	pkv_disconnect(c1);
	pkv_disconnect(c2);
	return 0;
}

static int third_pool_over_share(void *arg)
{
	struct pkv_client *c1 = conn("s1", 0, 0), *c2 = conn("s2", 0, 0);
	struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 1 << 20, .timeout_ms = 5000 };
	struct pkv_pool_params pp;
	struct pkv_client *c3;

	(void)arg;
	CHILD_CHECK(c1 && c2);
	CHILD_CHECK(pkv_connect(&o, &c3) == 0);
	test_pool_params(&pp, "s3");
	CHILD_CHECK(pkv_pool_attach(c3, &pp) == -EDQUOT);
	CHILD_CHECK(strstr(pkv_last_error(c3), "uid_budget_share") != NULL);
	pkv_disconnect(c1);
	pkv_disconnect(c2);
	pkv_disconnect(c3);
	return 0;
}

START_TEST(test_idle_pools_give_their_budget_back)
{
	/* A test pool is 512 KiB of KV and ~16 KiB of index: the budget holds four, a uid's half two. */
	static const char *const extra[] = { "--memory-budget", "2304K", "--pool-idle-grace-s", "3600", NULL };
	struct holder_arg b1 = { "b1", 0, 0 }, b2 = { "b2", 0, 0 };

	start(extra);
	ck_assert_int_eq(run_as(UID_A, third_pool_over_share, NULL), 0);
	/* A's two pools stay, idle, and take half of the budget: B still gets its two. */
	ck_assert_int_eq(run_as(UID_A, two_pools, NULL), 0);
	/* A third pool of A's, with its two idle: its own oldest idle pool makes room. */
	ck_assert_int_eq(run_as(UID_A, attach_ok, &(struct holder_arg){ "s3", 0, 0 }), 0);
	ck_assert_int_eq(run_as(UID_B, attach_ok, &b1), 0);
	ck_assert_int_eq(run_as(UID_B, attach_ok, &b2), 0);
	/* The budget is full of idle pools: a new attach frees the oldest ones. */
	ck_assert_int_eq(run_as(0, attach_ok, &(struct holder_arg){ "r1", 0, 0 }), 0);
	ck_assert_int_eq(run_as(0, attach_ok, &(struct holder_arg){ "r2", 0, 0 }), 0);
	ck_assert_int_eq(run_as(UID_A, two_pools, NULL), 0);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

/*
 * A pool of many small blocks: 1 MiB of KV exactly, but its blocks' records,
 * token ids and prefix table come on top. The 1 MiB budget must refuse it (a
 * budget that counted KV alone would let such pools take many times the budget);
 * a quarter as many blocks fit in the uid's half.
 */
static int index_is_charged(void *arg)
{
	struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 1 << 20, .timeout_ms = 5000 };
	struct pkv_pool_params pp;
	struct pkv_client *c;

	(void)arg;
	CHILD_CHECK(pkv_connect(&o, &c) == 0);
	test_pool_params(&pp, "many-small-blocks");
	/* 2 (K, V) x 1 layer x 16 tokens x 2 heads x 16 dims x 4 bytes = 4 KiB a block. */
	pp.geo.num_layers = 1;
	pp.geo.num_blocks = 256;
	CHILD_CHECK(pkv_pool_attach(c, &pp) == -ENOMEM);
	CHILD_CHECK(strstr(pkv_last_error(c), "index") != NULL);
	pp.geo.num_blocks = 64;   /* within the uid's half of the budget */
	CHILD_CHECK(pkv_pool_attach(c, &pp) == 0);
	pkv_disconnect(c);
	return 0;
}

START_TEST(test_pool_index_counts_against_the_budget)
{
	static const char *const extra[] = { "--memory-budget", "1M", NULL };

	start(extra);
	ck_assert_int_eq(run_as(0, index_is_charged, NULL), 0);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_pool_without_clients_is_freed_after_grace)
{
	static const char *const extra[] = { "--pool-idle-grace-s", "0", NULL };
	struct holder_arg gone = { "gone-soon", 0, 0 };
	char out[16384];

	start(extra);
	ck_assert_int_eq(run_as(UID_A, attach_ok, &gone), 0);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_JSON, out, sizeof(out)), 0);
	ck_assert_ptr_null(strstr(out, "gone-soon"));
}
END_TEST

/* ---------------------------------------------------------------- slices */

#define QN(k) ((size_t)(k) * T_HEADS * T_DIM)

/* Prefills toks[p0..n) and compares every layer with the reference; returns the worst error. */
static float prefill_error(struct pkv_client *c, uint32_t seq, const int32_t *toks, uint32_t p0, uint32_t n)
{
	uint32_t k = n - p0;
	float *got = malloc(T_LAYERS * QN(k) * 4), *ref = malloc(QN(k) * 4), worst = 0;

	ck_assert_ptr_nonnull(got);
	ck_assert_ptr_nonnull(ref);
	ck_assert_int_eq(run_step(c, seq, toks, p0, k, got), 0);
	for (uint32_t l = 0; l < T_LAYERS; l++) {
		float e;

		ref_attend(toks, n, p0, l, ref);
		e = max_diff(got + l * QN(k), ref, QN(k));
		if (isnan(e) || e > worst)
			worst = e; /* a NaN is the worst */
	}
	free(got);
	free(ref);
	return worst;
}

START_TEST(test_sliced_attends_match_reference)
{
	/* A 1 us slice cuts every prefill into slices of one row or a few. */
	static const char *const extra[] = { "--attend-slice-us", "1", NULL };
	struct pkv_client *c;
	int32_t toks[120];
	uint32_t s1, s2, nc;

	start(extra);
	c = conn("p", 0, 0);
	ck_assert_ptr_nonnull(c);
	for (int i = 0; i < 120; i++)
		toks[i] = (i * 37 + 11) % 400;
	ck_assert_int_eq(pkv_seq_open(c, toks, 100, &s1, &nc), 0);
	ck_assert_uint_eq(nc, 0);
	ck_assert_float_le(prefill_error(c, s1, toks, 0, 100), 1e-5f);
	/* Cached keys before the slices' rows: the second open hits 96 tokens. */
	ck_assert_int_eq(pkv_seq_open(c, toks, 120, &s2, &nc), 0);
	ck_assert_uint_eq(nc, 96);
	ck_assert_float_le(prefill_error(c, s2, toks, 96, 120), 1e-5f);
	/* And decode steps after it. */
	ck_assert_float_le(prefill_error(c, s1, toks, 100, 101), 1e-5f);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

/* ---------------------------------------------------------------- rows split over keys */

#define LONG_TOKENS 3000u

/* A pool of 512 blocks (8,192 tokens) with window_left = window, and an arena for a 3,000-token prefill. */
/* A client on a pool of 8,192 tokens, blocks of bs tokens (0: the harness's), activations of dtype act. */
static struct pkv_client *conn_long(const char *pool, int32_t window, uint32_t bs, uint32_t act)
{
	/* A 3,000-token prefill in 1 us slices under sanitizers on a loaded machine: a long call. */
	struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 8 << 20, .timeout_ms = 60000 };
	struct pkv_pool_params pp;
	struct pkv_client *c;

	if (pkv_connect(&o, &c))
		return NULL;
	test_pool_params(&pp, pool);
	if (bs)
		pp.geo.block_size = bs;
	pp.geo.num_blocks = (8192 + pp.geo.block_size - 1) / pp.geo.block_size;
	pp.window_left = window;
	pp.act_dtype = act;
	if (pkv_pool_attach(c, &pp)) {
		fprintf(stderr, "attach '%s': %s\n", pool, pkv_last_error(c));
		pkv_disconnect(c);
		return NULL;
	}
	return c;
}

/* Key pieces the worker ran, summed over the pools (status, as an admin). */
static uint64_t row_pieces(void)
{
	uint64_t n = pool_counter_sum(D.sock, "row_pieces");

	ck_assert_uint_ne(n, UINT64_MAX); /* the status answered */
	return n;
}

/* Error of row r of a step from p0 (got: that layer's output) against the reference. */
static float row_error(const float *got, const int32_t *toks, uint32_t p0, uint32_t r, uint32_t l, int32_t window)
{
	float ref[T_HEADS * T_DIM];

	ref_attend_window(toks, p0 + r + 1, p0 + r, l, window, ref);
	return max_diff(got + QN(r), ref, QN(1));
}

/* Runs toks[p0..n) as one step and returns the worst error of every 61st row and the last, each layer. */
static float long_step_error(struct pkv_client *c, uint32_t seq, const int32_t *toks, uint32_t p0, uint32_t n,
			     int32_t window)
{
	uint32_t k = n - p0;
	float *got = malloc(T_LAYERS * QN(k) * 4), worst = 0;

	ck_assert_ptr_nonnull(got);
	ck_assert_int_eq(run_step(c, seq, toks, p0, k, got), 0);
	for (uint32_t l = 0; l < T_LAYERS; l++) {
		float e = row_error(got + l * QN(k), toks, p0, k - 1, l, window);

		if (isnan(e) || e > worst)
			worst = e; /* a NaN is the worst */
		for (uint32_t r = 0; r + 1 < k; r += 61) {
			e = row_error(got + l * QN(k), toks, p0, r, l, window);
			if (isnan(e) || e > worst)
				worst = e; /* a NaN is the worst */
		}
	}
	free(got);
	return worst;
}

/*
 * Opens toks[0..LONG_TOKENS) on c, runs it as one step, then one decode step
 * over the whole context: every checked row of both matches the reference.
 */
static void long_row_matches_reference(struct pkv_client *c, const int32_t *toks, int32_t window)
{
	uint32_t seq, nc;

	ck_assert_int_eq(pkv_seq_open(c, toks, LONG_TOKENS, &seq, &nc), 0);
	ck_assert_uint_eq(nc, 0);
	ck_assert_float_le(long_step_error(c, seq, toks, 0, LONG_TOKENS, window), 1e-5f);
	/* A decode step (the decode path) over the whole context. */
	ck_assert_float_le(long_step_error(c, seq, toks, LONG_TOKENS, LONG_TOKENS + 1, window), 1e-5f);
}

START_TEST(test_long_rows_split_over_keys_match_reference)
{
	/*
	 * A 1 us slice: rows over a few hundred keys are longer than a slice by
	 * themselves and run in key pieces (the CPU backend reports the
	 * log-sum-exp). With a window of 300 the first piece of a row starts
	 * inside a block and the window cuts it there.
	 */
	static const char *const extra[] = { "--attend-slice-us", "1", NULL };
	static const int32_t windows[] = { -1, 300 };
	static int32_t toks[LONG_TOKENS + 1];

	start(extra);
	make_prompt(toks, LONG_TOKENS + 1, 7);
	for (unsigned w = 0; w < 2; w++) {
		char name[16];
		struct pkv_client *c;
		uint64_t before = row_pieces();

		snprintf(name, sizeof(name), "long%u", w);
		c = conn_long(name, windows[w], 0, PKV_DTYPE_F32);
		ck_assert_ptr_nonnull(c);
		long_row_matches_reference(c, toks, windows[w]);
		ck_assert_uint_gt(row_pieces(), before);
		pkv_disconnect(c);
	}
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_long_rows_split_in_whole_blocks_without_window)
{
	/*
	 * The naive backend built without PKV_FEAT_WINDOW: no piece may start
	 * inside a block (nothing would hide that block's earlier keys), so
	 * the worker cuts pieces on block boundaries; and a pool asking for a
	 * window is refused. Blocks of 48 tokens: a piece of the least size
	 * (16,384 units / 64 = 256 keys) would end inside one.
	 */
	static const char *const extra[] = { "--attend-slice-us", "1", NULL };
	static char plugin[1024];
	static int32_t toks[LONG_TOKENS + 1];
	const char *top = getenv("PKV_TOP_BUILDDIR");
	struct pkv_client *c;
	uint64_t before;

	snprintf(plugin, sizeof(plugin), "%s/tests/daemon/.libs/pkv_naive_nowin.so", top ? top : ".");
	start_on(plugin, extra);
	ck_assert_ptr_null(conn_long("nowin-window", 300, 48, PKV_DTYPE_F32));
	make_prompt(toks, LONG_TOKENS + 1, 11);
	before = row_pieces();
	c = conn_long("nowin", -1, 48, PKV_DTYPE_F32);
	ck_assert_ptr_nonnull(c);
	long_row_matches_reference(c, toks, -1);
	ck_assert_uint_gt(row_pieces(), before);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_long_rows_split_with_bf16_activations)
{
	/*
	 * The CPU backend, bf16 Q/K/V/O: each key piece's O comes back rounded
	 * to bf16 and the worker merges those (one rounding per piece more than
	 * a whole call). Against the f64 reference of the f32 rows, within what
	 * bf16 inputs and outputs allow; and the same rows unsplit (another
	 * daemon, the default slice) must agree with the split ones about as
	 * closely.
	 */
	static const char *const sliced[] = { "--attend-slice-us", "1", NULL };
	/* The unsplit reference: slicing off, not the default slice (under ASan on a busy host the row ran past it). */
	static const char *const unsliced[] = { "--attend-slice-us", "0", NULL };
	static char plugin[1024];
	static int32_t toks[LONG_TOKENS + 1];
	const char *dir = getenv("PKV_PLUGIN_BUILD_DIR");
	float *split = malloc(T_LAYERS * QN(1) * 4), *whole = malloc(T_LAYERS * QN(1) * 4);
	uint64_t before;

	ck_assert_ptr_nonnull(split);
	ck_assert_ptr_nonnull(whole);
	snprintf(plugin, sizeof(plugin), "%s/cpu/.libs/pkv_cpu.so", dir ? dir : "plugins");
	make_prompt(toks, LONG_TOKENS + 1, 13);
	run_step_act_dtype = PKV_DTYPE_BF16;
	for (int pass = 0; pass < 2; pass++) {
		float *got = pass ? whole : split;
		struct pkv_client *c;
		uint32_t seq, nc;

		start_on(plugin, pass ? unsliced : sliced);
		before = row_pieces();
		c = conn_long("bf16", -1, 0, PKV_DTYPE_BF16);
		ck_assert_ptr_nonnull(c);
		ck_assert_int_eq(pkv_seq_open(c, toks, LONG_TOKENS, &seq, &nc), 0);
		ck_assert_int_eq(run_step(c, seq, toks, 0, LONG_TOKENS, NULL), 0);
		/* The decode step over the whole context: its one row per layer. */
		ck_assert_int_eq(run_step(c, seq, toks, LONG_TOKENS, 1, got), 0);
		for (uint32_t l = 0; l < T_LAYERS; l++)
			ck_assert_float_le(row_error(got + l * QN(1), toks, LONG_TOKENS, 0, l, -1), 2e-2f);
		if (pass)
			ck_assert_uint_eq(row_pieces(), before);
		else
			ck_assert_uint_gt(row_pieces(), before);
		pkv_disconnect(c);
		teardown();
		memset(&D, 0, sizeof(D));
	}
	run_step_act_dtype = PKV_DTYPE_F32;
	ck_assert_float_le(max_diff(split, whole, T_LAYERS * QN(1)), 2e-2f);
	free(split);
	free(whole);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("daemon-tenant");
	TCase *t = tcase_create("tenant");

	tcase_add_checked_fixture(t, NULL, teardown);
	tcase_set_timeout(t, 300); /* the long-row cases' prefills and their references, sanitized */
	tcase_add_test(t, test_sequence_quota_is_per_uid);
	tcase_add_test(t, test_block_share_is_per_uid_in_shared_pools);
	tcase_add_test(t, test_pins_are_counted_per_uid);
	tcase_add_test(t, test_region_bytes_are_counted_per_uid);
	tcase_add_test(t, test_pool_names_are_private_to_their_uid);
	tcase_add_test(t, test_idle_pools_give_their_budget_back);
	tcase_add_test(t, test_pool_without_clients_is_freed_after_grace);
	tcase_add_test(t, test_pool_index_counts_against_the_budget);
	tcase_add_test(t, test_sliced_attends_match_reference);
	tcase_add_test(t, test_long_rows_split_over_keys_match_reference);
	tcase_add_test(t, test_long_rows_split_in_whole_blocks_without_window);
	tcase_add_test(t, test_long_rows_split_with_bf16_activations);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return suite_main_as_root(suite);
}
