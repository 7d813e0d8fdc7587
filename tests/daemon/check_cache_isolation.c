/* SPDX-License-Identifier: MIT */
/* The cache's isolation across uids: no stale KV (class 1), bounded steps (class 3) and opens (class 6). */
#include "config.h"
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "harness.h"
#include "../suite_main.h"

#define UID_A 65534   /* writes known K/V, then leaves */
#define UID_B 65533   /* gets A's blocks back from the pool */
#define A_V 1000.0f   /* every V element A writes */
#define B_V (-5.0f)   /* every V element B writes */
#define QROW (T_HEADS * T_DIM)
#define KVROW (T_KV_HEADS * T_DIM)

static struct dmn D;

static void setup(void)
{
	static const char *const extra[] = { "--socket-mode", "0666", "--client-max-seqs", "4096", NULL };

	ck_assert_int_eq(dmn_start(&D, extra), 0);
	ck_assert_int_eq(chmod(D.dir, 0755), 0);
}

static void teardown(void)
{
	ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}

/* A child's verdict: 0, or the line that failed and why (checked by the parent). */
struct verdict {
	int line;
	char why[200];
};

#define CHILD_CHECK(v, cond, ...) do { \
		if (!(cond)) { \
			(v)->line = __LINE__; \
			snprintf((v)->why, sizeof((v)->why), __VA_ARGS__); \
			return; \
		} \
	} while (0)

static struct pkv_client *client(void)
{
	return test_client(D.sock, "stale", 4 << 20, 5000);
}

/* uid A: fills every block of the pool with V = A_V in every layer, commits, and exits. */
static void as_a(struct verdict *v)
{
	struct pkv_client *c = client();
	uint32_t n = T_BLOCKS * T_BS, seq, nc, tok0 = 1;
	int32_t *toks = calloc(n, sizeof(*toks));
	float *q, *k, *vv, *o;

	CHILD_CHECK(v, c && toks, "connect/attach as uid A");
	q = pkv_alloc(c, (size_t)n * QROW * 4);
	o = pkv_alloc(c, (size_t)n * QROW * 4);
	k = pkv_alloc(c, (size_t)n * KVROW * 4);
	vv = pkv_alloc(c, (size_t)n * KVROW * 4);
	CHILD_CHECK(v, q && o && k && vv, "arena");
	for (uint32_t i = 0; i < n; i++)
		toks[i] = (int32_t)(i * 13 + 1);
	for (size_t i = 0; i < (size_t)n * QROW; i++)
		q[i] = 0.01f * (float)(i % 7);
	for (size_t i = 0; i < (size_t)n * KVROW; i++) {
		k[i] = 0.02f * (float)(i % 5);
		vv[i] = A_V;
	}
	CHILD_CHECK(v, pkv_seq_open(c, toks, tok0, &seq, &nc) == 0 && nc == 0, "open");
	CHILD_CHECK(v, pkv_step_begin(c, &seq, &n, toks, 1) == 0, "A step_begin: %s", pkv_last_error(c));
	for (uint32_t l = 0; l < T_LAYERS; l++)
		CHILD_CHECK(v, pkv_attend(c, l, q, k, vv, o) == 0, "A attend: %s", pkv_last_error(c));
	CHILD_CHECK(v, pkv_step_end(c) == 0, "A step_end: %s", pkv_last_error(c));
	free(toks);
	pkv_disconnect(c);   /* A's blocks stay in the pool as its cached prefix */
}

/* One decode step of B with q = 0 (uniform attention): every output must be B's V, nothing of A's. */
static int decode_b(struct pkv_client *c, uint32_t seq, int32_t tok, float *q, float *k, float *vv,
		    float *o, char *why, size_t why_len)
{
	uint32_t one = 1;
	int r = pkv_step_begin(c, &seq, &one, &tok, 1);

	if (r) {
		snprintf(why, why_len, "B step_begin: %s", pkv_last_error(c));
		return r;
	}
	for (uint32_t l = 0; l < T_LAYERS; l++) {
		r = pkv_attend(c, l, q, k, vv, o);
		if (r) {
			snprintf(why, why_len, "B attend: %s", pkv_last_error(c));
			return r;
		}
		for (uint32_t x = 0; x < QROW; x++)
			if (!(fabsf(o[x] - B_V) < 1e-3f)) {
				snprintf(why, why_len, "layer %u: output %g, expected %g (a stale row leaked)",
					 l, o[x], B_V);
				return -EIO;
			}
	}
	r = pkv_step_end(c);
	if (r)
		snprintf(why, why_len, "B step_end: %s", pkv_last_error(c));
	return r;
}

/* Expects step_end to refuse a step whose listed layers were not attended. */
static int end_refused(struct pkv_client *c, const char *layers, char *why, size_t why_len)
{
	char want[64];
	int r = pkv_step_end(c);

	snprintf(want, sizeof(want), "layers %s not attended", layers);
	if (r != -EINVAL || !strstr(pkv_last_error(c), want)) {
		snprintf(why, why_len, "step_end: %d '%s', expected -EINVAL naming '%s'", r,
			 pkv_last_error(c), want);
		return -1;
	}
	return 0;
}

/* uid B: reuses A's blocks; an unattended step never commits, decodes see only B's rows. */
static void as_b(struct verdict *v)
{
	struct pkv_client *c = client();
	uint32_t seq, nc, one = 1, child;
	int32_t tok = 5;
	float *q, *k, *vv, *o;
	char why[160];

	CHILD_CHECK(v, c != NULL, "connect/attach as uid B");
	q = pkv_alloc(c, QROW * 4);
	o = pkv_alloc(c, QROW * 4);
	k = pkv_alloc(c, KVROW * 4);
	vv = pkv_alloc(c, KVROW * 4);
	CHILD_CHECK(v, q && o && k && vv, "arena");
	memset(q, 0, QROW * 4);
	memset(k, 0, KVROW * 4);
	for (uint32_t x = 0; x < KVROW; x++)
		vv[x] = B_V;
	CHILD_CHECK(v, pkv_seq_open(c, &tok, 1, &seq, &nc) == 0 && nc == 0, "B open: %s", pkv_last_error(c));

	/* The sequence: one token reserved, step_end with no attend. */
	CHILD_CHECK(v, pkv_step_begin(c, &seq, &one, &tok, 1) == 0, "B begin: %s", pkv_last_error(c));
	CHILD_CHECK(v, !end_refused(c, "0-1", why, sizeof(why)), "%s", why);
	/* Attending some layers is not enough either. */
	CHILD_CHECK(v, pkv_step_begin(c, &seq, &one, &tok, 1) == 0, "B begin: %s", pkv_last_error(c));
	CHILD_CHECK(v, pkv_attend(c, 0, q, k, vv, o) == 0, "B attend: %s", pkv_last_error(c));
	CHILD_CHECK(v, !end_refused(c, "1", why, sizeof(why)), "%s", why);
	/* A sequence in an open step cannot be forked (its reserved slots are unwritten). */
	CHILD_CHECK(v, pkv_step_begin(c, &seq, &one, &tok, 1) == 0, "B begin: %s", pkv_last_error(c));
	CHILD_CHECK(v, pkv_seq_fork(c, seq, &child) == -EBUSY, "fork in a step");
	CHILD_CHECK(v, pkv_step_abort(c) == 0, "abort");

	/* Nothing was committed: every decode reads B's own rows only. */
	for (int32_t t = 0; t < 3; t++)
		CHILD_CHECK(v, decode_b(c, seq, 10 + t, q, k, vv, o, why, sizeof(why)) == 0, "%s", why);
	/* After a truncate the dropped slots must be written again before they count. */
	CHILD_CHECK(v, pkv_seq_truncate(c, seq, 1) == 0, "truncate: %s", pkv_last_error(c));
	CHILD_CHECK(v, pkv_step_begin(c, &seq, &one, &tok, 1) == 0, "B begin: %s", pkv_last_error(c));
	CHILD_CHECK(v, !end_refused(c, "0-1", why, sizeof(why)), "%s", why);
	CHILD_CHECK(v, decode_b(c, seq, 20, q, k, vv, o, why, sizeof(why)) == 0, "%s", why);
	/* A fork shares the written rows; its own next slot is unwritten until it attends. */
	CHILD_CHECK(v, pkv_seq_fork(c, seq, &child) == 0, "fork: %s", pkv_last_error(c));
	CHILD_CHECK(v, pkv_step_begin(c, &child, &one, &tok, 1) == 0, "B begin: %s", pkv_last_error(c));
	CHILD_CHECK(v, !end_refused(c, "0-1", why, sizeof(why)), "%s", why);
	CHILD_CHECK(v, decode_b(c, child, 21, q, k, vv, o, why, sizeof(why)) == 0, "%s", why);
	pkv_disconnect(c);
}

/* Runs fn in a child as uid; fails the test with the child's reason. */
static void run_as(uid_t uid, void (*fn)(struct verdict *))
{
	struct verdict v;
	int p[2], st;
	pid_t pid;

	ck_assert_int_eq(pipe(p), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(p[0]);
		memset(&v, 0, sizeof(v));
		if (setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) {
			v.line = __LINE__;
			snprintf(v.why, sizeof(v.why), "setresuid(%u) failed", (unsigned)uid);
		} else {
			fn(&v);
		}
		if (write(p[1], &v, sizeof(v)) != (ssize_t)sizeof(v))
			_exit(3);
		_exit(0);
	}
	close(p[1]);
	memset(&v, 0, sizeof(v));
	ck_assert_int_eq(read(p[0], &v, sizeof(v)), (ssize_t)sizeof(v));
	close(p[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_int_eq(child_status(st), 0);
	ck_assert_msg(v.line == 0, "uid %u, line %d: %s", (unsigned)uid, v.line, v.why);
}

START_TEST(test_unattended_slots_never_leak_across_uids)
{
	run_as(UID_A, as_a);
	run_as(UID_B, as_b);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

/*
 * Class 3 and 6, scaled to a test's pool: block_size 1, so a 4,200-token
 * sequence has 4,200 blocks; beside it 1,024 one-token sequences make the
 * step's dense block table 1,025 x 4,201 entries, past PKV_MAX_STEP_TABLE.
 */
#define LONG 4200u
#define SHORT 1024u

static struct pkv_client *client_bs1(void)
{
	struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 8 << 20, .timeout_ms = 20000 };
	struct pkv_pool_params p;
	struct pkv_client *c;

	if (pkv_connect(&o, &c))
		return NULL;
	test_pool_params(&p, "bs1");
	p.geo = (struct pkv_geometry){ 1, 1, 1, T_DIM, PKV_DTYPE_F32, 1, 8192 };
	if (pkv_pool_attach(c, &p)) {
		pkv_disconnect(c);
		return NULL;
	}
	return c;
}

static void as_big_stepper(struct verdict *v)
{
	struct pkv_client *c = client_bs1();
	uint32_t *seqs = calloc(SHORT + 1, sizeof(*seqs)), *n_new = calloc(SHORT + 1, sizeof(*n_new));
	uint32_t n = LONG, nc, big_open = 1u << 20;
	int32_t *toks = calloc(big_open, sizeof(*toks));
	float *q, *k, *vv, *o;

	CHILD_CHECK(v, c && seqs && n_new && toks, "connect/attach");
	q = pkv_alloc(c, (size_t)LONG * T_DIM * 4);
	o = pkv_alloc(c, (size_t)LONG * T_DIM * 4);
	k = pkv_alloc(c, (size_t)LONG * T_DIM * 4);
	vv = pkv_alloc(c, (size_t)LONG * T_DIM * 4);
	CHILD_CHECK(v, q && o && k && vv, "arena");
	memset(q, 0, (size_t)LONG * T_DIM * 4);
	memset(k, 0, (size_t)LONG * T_DIM * 4);
	memset(vv, 0, (size_t)LONG * T_DIM * 4);
	for (uint32_t i = 0; i < big_open; i++)
		toks[i] = (int32_t)(i % 30000);
	/* The long one, prefilled and committed (one layer, one attend). */
	CHILD_CHECK(v, pkv_seq_open(c, toks, 1, &seqs[0], &nc) == 0, "open: %s", pkv_last_error(c));
	CHILD_CHECK(v, pkv_step_begin(c, &seqs[0], &n, toks, 1) == 0, "begin: %s", pkv_last_error(c));
	CHILD_CHECK(v, pkv_attend(c, 0, q, k, vv, o) == 0, "attend: %s", pkv_last_error(c));
	CHILD_CHECK(v, pkv_step_end(c) == 0, "end: %s", pkv_last_error(c));
	for (uint32_t i = 1; i <= SHORT; i++)
		CHILD_CHECK(v, pkv_seq_open(c, toks + i, 1, &seqs[i], &nc) == 0, "open %u: %s", i,
			    pkv_last_error(c));
	for (uint32_t i = 0; i <= SHORT; i++)
		n_new[i] = 1;
	/* All together: refused at once with the reason, nothing reserved. */
	CHILD_CHECK(v, pkv_step_begin(c, seqs, n_new, toks, SHORT + 1) == -E2BIG, "big step: %s",
		    pkv_last_error(c));
	CHILD_CHECK(v, strstr(pkv_last_error(c), "block table") != NULL, "reason: %s", pkv_last_error(c));
	/* Fewer short ones fit: the connection and the pool still work. */
	CHILD_CHECK(v, pkv_step_begin(c, seqs, n_new, toks, SHORT - 128) == 0, "smaller step: %s",
		    pkv_last_error(c));
	CHILD_CHECK(v, pkv_attend(c, 0, q, k, vv, o) == 0, "attend: %s", pkv_last_error(c));
	CHILD_CHECK(v, pkv_step_end(c) == 0, "end: %s", pkv_last_error(c));
	/* A 1 M-token open is accepted and matches the cached chain: 4,200 blocks, more than one
	 * turn's walk (PKV_SWEEP_WORK_TOKENS blocks of 1), so it completes over two turns. */
	CHILD_CHECK(v, pkv_seq_close(c, seqs[0]) == 0, "close: %s", pkv_last_error(c));
	CHILD_CHECK(v, pkv_seq_open(c, toks, big_open, &seqs[0], &nc) == 0, "1M open: %s",
		    pkv_last_error(c));
	CHILD_CHECK(v, nc == LONG, "1M open: n_cached %u, expected %u", nc, LONG);
	pkv_disconnect(c);
	free(seqs);
	free(n_new);
	free(toks);
}

/*
 * Submits a 1 M-token open over the cached 4,200-block chain (its walk takes
 * two loop turns) and hangs up at once, several times: whenever the hang-up
 * lands, mid-walk or after, the sequence and the copied tokens are released
 * (the sanitizer build's daemon fails its exit status on a leak).
 */
static void as_open_and_vanish(struct verdict *v)
{
	uint32_t n = 1u << 20;

	for (int k = 0; k < 8; k++) {
		struct pkv_msg_attach m;
		struct pkv_sqe e = { .opcode = PKV_OP_SEQ_OPEN, .n = n };
		struct raw r;
		int32_t *t;

		CHILD_CHECK(v, raw_open(&r, D.sock, (uint64_t)n * 4, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0,
			    "raw_open");
		CHILD_CHECK(v, raw_hello(&r, PKV_PROTO_VERSION, r.size, 1, NULL, 0) == 0, "hello");
		raw_attach_msg(&m, "bs1");
		m.geo = (struct pkv_geometry){ 1, 1, 1, T_DIM, PKV_DTYPE_F32, 1, 8192 };
		CHILD_CHECK(v, raw_attach(&r, &m, NULL, 0) == 0, "attach");
		t = (int32_t *)r.arena;
		for (uint32_t i = 0; i < n; i++)
			t[i] = (int32_t)(i % 30000);
		CHILD_CHECK(v, raw_submit(&r, &e) == 0, "submit");
		raw_close(&r);
	}
}

START_TEST(test_oversized_step_is_refused_not_hung)
{
	run_as(UID_A, as_big_stepper);
	run_as(UID_A, as_open_and_vanish);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
	ck_assert_int_eq(dmn_alive(&D), 1);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("daemon-cache-isolation");
	TCase *t = tcase_create("stale");

	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 120);
	tcase_add_test(t, test_unattended_slots_never_leak_across_uids);
	tcase_add_test(t, test_oversized_step_is_refused_not_hung);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return suite_main_as_root(suite);
}
