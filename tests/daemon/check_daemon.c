/* SPDX-License-Identifier: MIT */
/* Process tests of pagedkvd + libpagedkv: attach, steps, attention against a reference, prefix sharing. */
#include "config.h"
#include <check.h>
#include <math.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "harness.h"
#include "../suite_main.h"

#define QN(k) ((size_t)(k) * T_HEADS * T_DIM)

static struct dmn D;

static void setup(void)
{
	ck_assert_int_eq(dmn_start(&D, NULL), 0);
}

static void teardown(void)
{
	if (D.pid > 0)
		ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}

static struct pkv_client *connect_attach(const char *pool)
{
	return test_client(D.sock, pool, 4 << 20, 5000);
}

START_TEST(test_attach_step_attend_matches_reference)
{
	struct pkv_client *c = connect_attach("p");
	int32_t toks[40];
	uint32_t seq, n_cached;

	ck_assert_ptr_nonnull(c);
	make_prompt(toks, 40, 1);
	ck_assert_int_eq(pkv_seq_open(c, toks, 40, &seq, &n_cached), 0);
	ck_assert_uint_eq(n_cached, 0);
	ck_assert_float_le(step_and_check(c, seq, toks, 40, 0, NULL), 1e-5f);
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_decode_steps_match_reference)
{
	struct pkv_client *c = connect_attach("p");
	int32_t toks[24];
	uint32_t seq, n_cached;

	ck_assert_ptr_nonnull(c);
	make_prompt(toks, 24, 2);
	ck_assert_int_eq(pkv_seq_open(c, toks, 20, &seq, &n_cached), 0);
	ck_assert_float_le(step_and_check(c, seq, toks, 20, 0, NULL), 1e-5f);
	for (uint32_t n = 21; n <= 24; n++)
		ck_assert_float_le(step_and_check(c, seq, toks, n, n - 1, NULL), 1e-5f);
	pkv_disconnect(c);
}
END_TEST

/* Child: opens the prompt, prefills what is not cached, writes n_cached and outputs to a pipe. */
static void prefix_child(int fd, const int32_t *toks, uint32_t n)
{
	struct pkv_client *c = connect_attach("shared");
	uint32_t seq, n_cached = 0;
	float *out = malloc(T_LAYERS * QN(n) * 4);
	int ok = 0;

	if (c && !pkv_seq_open(c, toks, n, &seq, &n_cached)) {
		uint32_t k = n - n_cached;
		float *got = malloc(T_LAYERS * QN(k) * 4);

		if (!run_step(c, seq, toks, n_cached, k, got)) {
			for (uint32_t l = 0; l < T_LAYERS; l++)
				memcpy(out + l * QN(n) + QN(n_cached), got + l * QN(k), QN(k) * 4);
			ok = 1;
		}
		free(got);
	}
	if (write(fd, &ok, sizeof(ok)) < 0 || write(fd, &n_cached, 4) < 0 ||
	    write(fd, out, T_LAYERS * QN(n) * 4) < 0)
		_exit(2);
	/* Keep the sequence open until the parent says so, so its blocks stay referenced. */
	{
		char ch;

		if (read(fd, &ch, 1) < 0)
			_exit(3);
	}
	pkv_disconnect(c);
	_exit(ok ? 0 : 1);
}

static pid_t start_prefix_child(int *fd, const int32_t *toks, uint32_t n)
{
	int sv[2];
	pid_t pid;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(sv[0]);
		prefix_child(sv[1], toks, n);
	}
	close(sv[1]);
	*fd = sv[0];
	return pid;
}

static void read_full(int fd, void *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, (char *)buf + got, len - got);

		ck_assert_int_gt(n, 0);
		got += (size_t)n;
	}
}

START_TEST(test_two_processes_share_prefix)
{
	enum { N = 40 };
	int32_t toks[N];
	float *a = malloc(T_LAYERS * QN(N) * 4), *b = malloc(T_LAYERS * QN(N) * 4), *ref = malloc(QN(N) * 4);
	uint32_t nc_a, nc_b;
	int fa, fb, ok, st;
	pid_t pa, pb;

	make_prompt(toks, N, 3);
	pa = start_prefix_child(&fa, toks, N);
	read_full(fa, &ok, sizeof(ok));
	ck_assert_int_eq(ok, 1);
	read_full(fa, &nc_a, 4);
	read_full(fa, a, T_LAYERS * QN(N) * 4);
	ck_assert_uint_eq(nc_a, 0);
	pb = start_prefix_child(&fb, toks, N);
	read_full(fb, &ok, sizeof(ok));
	ck_assert_int_eq(ok, 1);
	read_full(fb, &nc_b, 4);
	read_full(fb, b, T_LAYERS * QN(N) * 4);
	/* Block-aligned prefix, and never the last token. */
	ck_assert_uint_eq(nc_b, (N - 1) / T_BS * T_BS);
	for (uint32_t l = 0; l < T_LAYERS; l++) {
		ref_attend(toks, N, 0, l, ref);
		/* B computed only rows nc_b.. reading A's blocks; they must equal A's and the reference. */
		ck_assert_float_le(max_diff(b + l * QN(N) + QN(nc_b), a + l * QN(N) + QN(nc_b), QN(N - nc_b)), 1e-6f);
		ck_assert_float_le(max_diff(b + l * QN(N) + QN(nc_b), ref + QN(nc_b), QN(N - nc_b)), 1e-5f);
	}
	ck_assert_int_eq(write(fa, "x", 1), 1);
	ck_assert_int_eq(write(fb, "x", 1), 1);
	ck_assert_int_eq(waitpid(pa, &st, 0), pa);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	ck_assert_int_eq(waitpid(pb, &st, 0), pb);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(fa);
	close(fb);
	free(a);
	free(b);
	free(ref);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_fork_and_truncate_across_steps)
{
	struct pkv_client *c = connect_attach("p");
	int32_t par[32], kid[32];
	uint32_t seq, child, n_cached;

	ck_assert_ptr_nonnull(c);
	make_prompt(par, 32, 4);
	memcpy(kid, par, sizeof(kid));
	kid[20] = 777; /* the fork diverges at position 20 */
	kid[21] = 778;
	ck_assert_int_eq(pkv_seq_open(c, par, 20, &seq, &n_cached), 0);
	ck_assert_float_le(step_and_check(c, seq, par, 20, 0, NULL), 1e-5f);
	ck_assert_int_eq(pkv_seq_fork(c, seq, &child), 0);
	ck_assert_uint_ne(child, seq);
	/* Both append into the shared partial block: copy-on-write keeps them apart. */
	ck_assert_float_le(step_and_check(c, child, kid, 21, 20, NULL), 1e-5f);
	ck_assert_float_le(step_and_check(c, seq, par, 21, 20, NULL), 1e-5f);
	ck_assert_float_le(step_and_check(c, child, kid, 22, 21, NULL), 1e-5f);
	ck_assert_float_le(step_and_check(c, seq, par, 22, 21, NULL), 1e-5f);
	/* Truncate the parent to 10 tokens and continue it with different tokens. */
	ck_assert_int_eq(pkv_seq_truncate(c, seq, 10), 0);
	for (int i = 10; i < 32; i++)
		par[i] = 900 + i;
	ck_assert_float_le(step_and_check(c, seq, par, 14, 10, NULL), 1e-5f);
	ck_assert_float_le(step_and_check(c, child, kid, 23, 22, NULL), 1e-5f);
	ck_assert_int_eq(pkv_seq_close(c, child), 0);
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
	pkv_disconnect(c);
}
END_TEST

START_TEST(test_concurrent_clients_attach_one_pool)
{
	enum { N = 4 };
	pid_t pids[N];
	char out[4096];

	for (int i = 0; i < N; i++) {
		pids[i] = fork();
		ck_assert_int_ge(pids[i], 0);
		if (pids[i] == 0) {
			struct pkv_client *c = connect_attach("multi");
			int32_t toks[36];
			uint32_t seq, nc;
			int bad = !c;

			make_prompt(toks, 36, 10 + i);
			bad = bad || pkv_seq_open(c, toks, 30, &seq, &nc);
			bad = bad || run_step(c, seq, toks, 0, 30, NULL);
			for (uint32_t n = 31; n <= 36 && !bad; n++) {
				float got[T_LAYERS * T_HEADS * T_DIM], ref[T_HEADS * T_DIM];

				bad = run_step(c, seq, toks, n - 1, 1, got) != 0;
				for (uint32_t l = 0; l < T_LAYERS && !bad; l++) {
					ref_attend(toks, n, n - 1, l, ref);
					bad = max_diff(got + l * T_HEADS * T_DIM, ref, T_HEADS * T_DIM) > 1e-5f;
				}
			}
			pkv_disconnect(c);
			_exit(bad);
		}
	}
	for (int i = 0; i < N; i++) {
		int st;

		ck_assert_int_eq(waitpid(pids[i], &st, 0), pids[i]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client %d failed", i);
	}
	ck_assert_int_ge(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_TEXT, out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "pool multi"));
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, out, sizeof(out)), 0);
}
END_TEST

START_TEST(test_stats_report_prefix_hits)
{
	struct pkv_client *c = connect_attach("p");
	struct pkv_stats st = PKV_STATS_INIT;
	int32_t toks[40];
	uint32_t s1, s2, nc;

	ck_assert_ptr_nonnull(c);
	make_prompt(toks, 40, 5);
	ck_assert_int_eq(pkv_seq_open(c, toks, 40, &s1, &nc), 0);
	ck_assert_int_eq(run_step(c, s1, toks, 0, 40, NULL), 0);
	ck_assert_int_eq(pkv_seq_open(c, toks, 40, &s2, &nc), 0);
	ck_assert_uint_eq(nc, 32);
	ck_assert_int_eq(pkv_stats(c, &st), 0);
	ck_assert_uint_eq(st.num_blocks, T_BLOCKS);
	ck_assert_uint_eq(st.open_seqs, 2);
	ck_assert_uint_eq(st.free_blocks + st.cached_blocks + st.in_use_blocks, T_BLOCKS);
	ck_assert_uint_eq(st.prefix_hit_tokens, 32);
	pkv_disconnect(c);
}
END_TEST

/* Runs the built pagedkvctl with args; returns its exit status and its output in out. */
static int run_ctl(const char *args, char *out, size_t len)
{
	const char *top = getenv("PKV_TOP_BUILDDIR");
	char cmd[1024];
	size_t n = 0;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "%s/src/tools/pagedkvctl --socket %s %s", top ? top : ".", D.sock, args);
	f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	while (n + 1 < len && fgets(out + n, (int)(len - n), f))
		n += strlen(out + n);
	out[n] = 0;
	return WEXITSTATUS(pclose(f));
}

START_TEST(test_pagedkvctl_commands)
{
	struct pkv_client *c = connect_attach("ctlpool");
	static char out[65536];
	int32_t toks[40];
	uint32_t seq, nc;

	ck_assert_ptr_nonnull(c);
	make_prompt(toks, 40, 6);
	ck_assert_int_eq(pkv_seq_open(c, toks, 40, &seq, &nc), 0);
	ck_assert_int_eq(run_step(c, seq, toks, 0, 40, NULL), 0);
	ck_assert_int_eq(run_ctl("status", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "pool ctlpool"));
	ck_assert_ptr_nonnull(strstr(out, "1 sequences"));
	ck_assert_int_eq(run_ctl("--json status", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "\"name\":\"ctlpool\""));
	ck_assert_ptr_nonnull(strstr(out, "\"in_use_blocks\":3"));
	ck_assert_int_eq(run_ctl("audit", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "0 problems"));
	ck_assert_int_eq(run_ctl("--json audit", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "\"problems\":0"));
	ck_assert_int_eq(run_ctl("metrics", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "# TYPE pagedkv_blocks gauge"));
	ck_assert_ptr_nonnull(strstr(out, "pagedkv_blocks{pool=\"ctlpool\",state=\"in_use\"} 3"));
	ck_assert_ptr_nonnull(strstr(out, "pagedkv_attends_total{pool=\"ctlpool\"} 2"));
	/* Closing leaves 2 full blocks cached; flush drops them. */
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	ck_assert_int_eq(run_ctl("flush", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "2 cached blocks dropped"));
	ck_assert_int_eq(run_ctl("--json flush", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "\"flushed_blocks\":0"));
	ck_assert_int_eq(run_ctl("bogus", out, sizeof(out)), 2);
	pkv_disconnect(c);
}
END_TEST

/*
 * Holds the daemon still (every thread stopped) while a test queues work, so
 * that the worker finds it all queued at once whatever the machine's load.
 */
static void daemon_hold(int hold)
{
	int st;

	ck_assert_int_eq(kill(D.pid, hold ? SIGSTOP : SIGCONT), 0);
	if (hold) {
		int stopped = waitpid(D.pid, &st, WUNTRACED) == D.pid && WIFSTOPPED(st);

		if (!stopped)
			kill(D.pid, SIGCONT); /* the failed test's teardown must still reach it */
		ck_assert(stopped);
	}
}

static long status_count(const char *key)
{
	static char js[8192];
	const char *p;

	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_JSON, js, sizeof(js)), 0);
	p = strstr(js, key);
	ck_assert_ptr_nonnull(p);
	return atol(p + strlen(key));
}

#define CO_LEN 300 /* 19 blocks a sequence: the pool's 64 hold both and the prefill's 16 */

/*
 * Decode attends of two clients of one pool and layer, queued together beside
 * a third client's long prefill of another layer: they run as one backend
 * call. Results must still be each client's own.
 */
START_TEST(test_coalesced_attends_match_reference)
{
	struct pkv_client *c[2] = { connect_attach("co"), connect_attach("co") }, *big = connect_attach("co");
	int32_t toks[2][CO_LEN], btoks[256];
	uint32_t seq[2], bseq, nc, one = 1, bn = 256;
	float *q[2], *k[2], *v[2], *o[2], ref[T_HEADS * T_DIM], *bq, *bk, *bv, *bo;
	long attends, batches;

	ck_assert_ptr_nonnull(big);
	for (int i = 0; i < 256; i++)
		btoks[i] = 3000 + i;
	ck_assert_int_eq(pkv_seq_open(big, btoks, 1, &bseq, &nc), 0);
	ck_assert_int_eq(pkv_step_begin(big, &bseq, &bn, btoks, 1), 0);
	bq = pkv_alloc(big, QN(256) * 4);
	bo = pkv_alloc(big, QN(256) * 4);
	bk = pkv_alloc(big, 256 * T_KV_HEADS * T_DIM * 4);
	bv = pkv_alloc(big, 256 * T_KV_HEADS * T_DIM * 4);
	ck_assert(bq && bo && bk && bv);
	memset(bq, 0, QN(256) * 4);
	memset(bk, 0, 256 * T_KV_HEADS * T_DIM * 4);
	memset(bv, 0, 256 * T_KV_HEADS * T_DIM * 4);
	for (int i = 0; i < 2; i++) {
		ck_assert_ptr_nonnull(c[i]);
		make_prompt(toks[i], CO_LEN, 20 + i);
		ck_assert_int_eq(pkv_seq_open(c[i], toks[i], 8, &seq[i], &nc), 0);
		ck_assert_int_eq(run_step(c[i], seq[i], toks[i], 0, 8, NULL), 0);
		q[i] = pkv_alloc(c[i], QN(1) * 4);
		o[i] = pkv_alloc(c[i], QN(1) * 4);
		k[i] = pkv_alloc(c[i], T_KV_HEADS * T_DIM * 4);
		v[i] = pkv_alloc(c[i], T_KV_HEADS * T_DIM * 4);
	}
	/*
	 * Each layer's three attends are queued while the daemon is held, so the
	 * worker finds the two decodes side by side. Whether it merges them is
	 * its measured choice: it serves the pool in 5 ms epochs, merging or not,
	 * and tries the losing way one epoch in eight. A pause of more than an
	 * epoch before each step gives each step an epoch of its own (unless a
	 * step outlasts 8 epochs: the worker reads that as idle and keeps its
	 * way), so within the steps below some step's decodes must share a call.
	 * The status is read every 8 steps, not to stretch the steps.
	 */
	batches = attends = 0;
	for (uint32_t pos = 8; pos < CO_LEN && batches >= attends; pos++) {
		usleep(6000);
		for (int i = 0; i < 2; i++)
			ck_assert_int_eq(pkv_step_begin(c[i], &seq[i], &one, toks[i] + pos, 1), 0);
		for (uint32_t l = 0; l < T_LAYERS; l++) {
			uint64_t t[2], bt;
			int r[3];

			for (int i = 0; i < 2; i++)
				act_row(toks[i][pos], pos, l, q[i], k[i], v[i]);
			/* Checked once the daemon runs again: a failed test must not leave it stopped. */
			daemon_hold(1);
			/* A long prefill too (layer 1 - l: never merged with the two decodes). */
			r[2] = pkv_attend_async(big, 1 - l, bq, bk, bv, bo, &bt);
			for (int i = 0; i < 2; i++)
				r[i] = pkv_attend_async(c[i], l, q[i], k[i], v[i], o[i], &t[i]);
			daemon_hold(0);
			for (int i = 0; i < 3; i++)
				ck_assert_int_eq(r[i], 0);
			for (int i = 0; i < 2; i++) {
				ck_assert_int_eq(pkv_wait(c[i], t[i]), 0);
				ref_attend(toks[i], pos + 1, pos, l, ref);
				ck_assert_float_le(max_diff(o[i], ref, QN(1)), 1e-5f);
			}
			ck_assert_int_eq(pkv_wait(big, bt), 0);
		}
		for (int i = 0; i < 2; i++)
			ck_assert_int_eq(pkv_step_end(c[i]), 0);
		if (pos % 8 == 7 || pos + 1 == CO_LEN) {
			attends = status_count("\"attends\":");
			batches = status_count("\"batches\":");
		}
	}
	/* Two decodes of one layer queued together, in a merging epoch: they shared a call. */
	ck_assert_int_lt(batches, attends);
	pkv_step_abort(big);
	pkv_disconnect(big);
	for (int i = 0; i < 2; i++)
		pkv_disconnect(c[i]);
}
END_TEST

START_TEST(test_pin_survives_flush_until_unpinned)
{
	struct pkv_client *c = connect_attach("pins");
	static char out[4096];
	int32_t toks[40];
	uint32_t seq, nc;

	ck_assert_ptr_nonnull(c);
	make_prompt(toks, 40, 7);
	ck_assert_int_eq(pkv_seq_open(c, toks, 40, &seq, &nc), 0);
	ck_assert_int_eq(run_step(c, seq, toks, 0, 40, NULL), 0);
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	ck_assert_int_eq(pkv_pin(c, toks, 40), 32);        /* two full blocks */
	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_FLUSH, PKV_FMT_TEXT, out, sizeof(out)), 0);
	ck_assert_int_eq(pkv_seq_open(c, toks, 40, &seq, &nc), 0);
	ck_assert_uint_eq(nc, 32);                         /* still cached after the flush */
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	ck_assert_int_eq(pkv_unpin(c, toks, 40), 32);
	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_FLUSH, PKV_FMT_TEXT, out, sizeof(out)), 0);
	ck_assert_int_eq(pkv_seq_open(c, toks, 40, &seq, &nc), 0);
	ck_assert_uint_eq(nc, 0);                          /* gone once unpinned and flushed */
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

/*
 * One decode step of n sequences at position pos (one new token each, toks[i][pos]): every row's
 * attention against the reference for its own sequence's tokens; returns the worst difference.
 */
enum { FORK_SEQS = 6, FORK_PREFIX = 20, FORK_TOKS = 24 };

/* One decode step of n sequences at pos, over `layers` layers; returns the worst error from the reference. */
static float step_seqs(struct pkv_client *c, const uint32_t *seqs, int32_t (*toks)[FORK_TOKS], uint32_t n,
		       uint32_t pos, uint32_t layers)
{
	size_t qn = (size_t)T_HEADS * T_DIM, kn = (size_t)T_KV_HEADS * T_DIM;
	uint32_t ones[FORK_SEQS];
	int32_t next[FORK_SEQS];
	float *q = pkv_alloc(c, n * qn * 4), *k = pkv_alloc(c, n * kn * 4), *v = pkv_alloc(c, n * kn * 4);
	float *o = pkv_alloc(c, n * qn * 4), ref[T_HEADS * T_DIM], worst = 0;

	ck_assert(q && k && v && o);
	for (uint32_t i = 0; i < n; i++) {
		ones[i] = 1;
		next[i] = toks[i][pos];
	}
	ck_assert_int_eq(pkv_step_begin(c, seqs, ones, next, n), 0);
	for (uint32_t l = 0; l < layers; l++) {
		for (uint32_t i = 0; i < n; i++)
			act_row(toks[i][pos], pos, l, q + i * qn, k + i * kn, v + i * kn);
		ck_assert_int_eq(pkv_attend(c, l, q, k, v, o), 0);
		for (uint32_t i = 0; i < n; i++) {
			float e;

			ref_attend(toks[i], pos + 1, pos, l, ref);
			e = max_diff(o + i * qn, ref, qn);
			if (isnan(e) || e > worst)
				worst = e; /* a NaN is the worst */
		}
	}
	ck_assert_int_eq(pkv_step_end(c), 0);
	pkv_free(c, q);
	pkv_free(c, k);
	pkv_free(c, v);
	pkv_free(c, o);
	return worst;
}

/*
 * Copy-on-write in pieces: forks whose shared last block is 2 MiB (4096-token
 * blocks, 2 layers) step together, so a begin's copies span more than one
 * ~4 MiB piece: once begun on the loop (the ring came back to it for the
 * forks), once on the worker (right after a step it ended). With 12 layers a
 * block is 12 MiB, more than a piece by itself: it is copied 4 layers at a
 * time. Every row of every layer must match the reference for its own sequence.
 */
static void fork_copies_case(const char *pool, uint32_t layers, uint32_t blocks, int by_layers)
{
	struct pkv_connect_opts co = { .socket_path = D.sock, .arena_bytes = 4 << 20, .timeout_ms = 5000 };
	struct pkv_pool_params p;
	struct pkv_client *c;
	int32_t toks[FORK_SEQS][FORK_TOKS];
	uint32_t seqs[FORK_SEQS], nc;
	uint64_t layer_copies = pool_counter_sum(D.sock, "layer_copies");

	ck_assert_uint_ne(layer_copies, UINT64_MAX); /* the status answered */
	ck_assert_int_eq(pkv_connect(&co, &c), 0);
	test_pool_params(&p, pool);
	p.geo.block_size = 4096;
	p.geo.num_blocks = blocks;
	p.geo.num_layers = layers;
	ck_assert_int_eq(pkv_pool_attach(c, &p), 0);
	for (int i = 0; i < FORK_SEQS; i++) {
		make_prompt(toks[i], FORK_TOKS, 9);
		for (int t = FORK_PREFIX; t < FORK_TOKS; t++)
			toks[i][t] = 600 + 10 * i + t; /* each diverges after the shared prefix */
	}
	ck_assert_int_eq(pkv_seq_open(c, toks[0], FORK_PREFIX, &seqs[0], &nc), 0);
	for (uint32_t pos = 0; pos < FORK_PREFIX; pos++)
		ck_assert_float_le(step_seqs(c, seqs, toks, 1, pos, layers), 1e-5f);
	for (int i = 1; i < FORK_SEQS; i++)
		ck_assert_int_eq(pkv_seq_fork(c, seqs[0], &seqs[i]), 0);
	/* Three sequences append into the shared block, then the other three. */
	ck_assert_float_le(step_seqs(c, seqs, toks, 3, FORK_PREFIX, layers), 1e-5f);
	ck_assert_float_le(step_seqs(c, seqs + 3, toks + 3, 3, FORK_PREFIX, layers), 1e-5f);
	/* All six on their own blocks now: one more step each, nothing shared left to copy. */
	ck_assert_float_le(step_seqs(c, seqs, toks, FORK_SEQS, FORK_PREFIX + 1, layers), 1e-5f);
	/* A block over a piece went by ranges of its layers; one under it, whole. */
	if (by_layers)
		ck_assert_uint_gt(pool_counter_sum(D.sock, "layer_copies"), layer_copies);
	else
		ck_assert_uint_eq(pool_counter_sum(D.sock, "layer_copies"), layer_copies);
	for (int i = 0; i < FORK_SEQS; i++)
		ck_assert_int_eq(pkv_seq_close(c, seqs[i]), 0);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}

START_TEST(test_fork_copies_in_pieces_match_reference)
{
	fork_copies_case("big-blocks", T_LAYERS, 16, 0);
}
END_TEST

START_TEST(test_fork_copies_in_layer_pieces_match_reference)
{
	fork_copies_case("deep-blocks", 12, 8, 1); /* 96 MiB: within the uid's half of 256 MiB */
}
END_TEST

/* A pin of one block completes with 1: the loop once read that count as "completes later" and the client hung. */
START_TEST(test_pin_of_one_block_completes)
{
	struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 4 << 20, .timeout_ms = 5000 };
	struct pkv_pool_params p;
	struct pkv_client *c;
	int32_t toks[2];
	uint32_t seq, nc;

	ck_assert_int_eq(pkv_connect(&o, &c), 0);
	test_pool_params(&p, "bs1");
	p.geo.block_size = 1;
	ck_assert_int_eq(pkv_pool_attach(c, &p), 0);
	make_prompt(toks, 2, 3);
	ck_assert_int_eq(pkv_seq_open(c, toks, 2, &seq, &nc), 0);
	ck_assert_int_eq(run_step(c, seq, toks, 0, 2, NULL), 0);
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	ck_assert_int_eq(pkv_pin(c, toks, 1), 1);
	ck_assert_int_eq(pkv_unpin(c, toks, 1), 1);
	ck_assert_int_eq(pkv_pin(c, toks, 2), 2);
	ck_assert_int_eq(pkv_unpin(c, toks, 2), 2);
	pkv_disconnect(c);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("daemon");
	TCase *t = tcase_create("process");

	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 60);
	tcase_add_test(t, test_attach_step_attend_matches_reference);
	tcase_add_test(t, test_decode_steps_match_reference);
	tcase_add_test(t, test_two_processes_share_prefix);
	tcase_add_test(t, test_fork_and_truncate_across_steps);
	tcase_add_test(t, test_concurrent_clients_attach_one_pool);
	tcase_add_test(t, test_stats_report_prefix_hits);
	tcase_add_test(t, test_pagedkvctl_commands);
	tcase_add_test(t, test_coalesced_attends_match_reference);
	tcase_add_test(t, test_pin_survives_flush_until_unpinned);
	tcase_add_test(t, test_pin_of_one_block_completes);
	tcase_add_test(t, test_fork_copies_in_pieces_match_reference);
	tcase_add_test(t, test_fork_copies_in_layer_pieces_match_reference);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return suite_main(suite());
}
