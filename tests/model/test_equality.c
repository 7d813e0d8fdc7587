/* SPDX-License-Identifier: MIT */
/* Random-weight model: logits through the attention under test (prefix hits, forks, chunked prefill,
 * mixed batches) equal a plain contiguous forward of each whole sequence. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../examples/llama/llama.h"
#include "randmodel.h"
#include "daemon.h"
#include "../suite_main.h"

#define BS 4 /* small blocks so short sequences produce prefix hits */

/* The larger difference, a NaN being the largest and staying (fmaxf would drop it). */
static float worse(float worst, float d)
{
	return isnan(worst) || d <= worst ? worst : d;
}

static const uint32_t wtypes[] = { GGML_F32, GGML_Q8_0, GGML_Q4_1 };
static char path[3][256];

struct fx {
	struct llama m;
	struct tpool *tp;
	struct pkv_attn a;
	struct llama_ctx c;
};

/* The attention under test: pagedkvd when a daemon socket is set, else the in-process cache. */
static const char *daemon_sock;
static uint32_t pool_flags; /* PKV_POOL_CLIENT_ATTENTION: this process attends, over the daemon's pool */
static int cur_wt;
static uint32_t cur_kv = PKV_DTYPE_F32; /* the KV cache dtype of the fixture and of the reference */

static int attn_under_test(const struct llama *m, const struct pkv_geometry *geo, struct tpool *tp,
			   struct pkv_attn *a)
{
	char name[64], err[512];
	int r;
	if (!daemon_sock)
		return pkv_attn_ref_create(geo, 0, tp, a);
	struct pkv_connect_opts co = { .socket_path = daemon_sock };
	struct pkv_pool_params pp = { .name = name, .geo = *geo, .act_dtype = PKV_DTYPE_F32,
				      .model_id = m->model_id, .window_left = -1, .flags = pool_flags };
	snprintf(name, sizeof name, "eq-%016llx-%u", (unsigned long long)m->model_id, geo->cache_dtype);
	r = pkv_attn_daemon_create(&co, &pp, a, err, sizeof err);
	if (r)
		fprintf(stderr, "test_equality: %s\n", err);
	if (!r && pool_flags) {
		struct pkv_stats st = PKV_STATS_INIT;

		/* A fallback to the daemon's attention would pass the same checks without testing ours. */
		if (a->ops->stats(a->ctx, &st) || !st.attention_in_client) {
			fprintf(stderr, "test_equality: no client attention: %s\n", pkv_last_error(a->ctx));
			pkv_attn_destroy(a);
			r = -ENOTSUP;
		}
	}
	return r;
}

static void fx_up(struct fx *f, int wt)
{
	struct pkv_geometry geo;
	cur_wt = wt;
	ck_assert_msg(llama_load(&f->m, path[wt]) == 0, "%s", f->m.err);
	ck_assert_int_eq(tpool_create(2, &f->tp), 0);
	llama_geometry(&f->m, BS, 1024, &geo);
	geo.cache_dtype = cur_kv;
	ck_assert_int_eq(attn_under_test(&f->m, &geo, f->tp, &f->a), 0);
	ck_assert_int_eq(llama_ctx_init(&f->c, &f->m, &f->a, f->tp, 64), 0);
}

static void fx_down(struct fx *f)
{
	llama_ctx_free(&f->c);
	pkv_attn_destroy(&f->a);
	tpool_destroy(f->tp);
	llama_free(&f->m);
}

/* Logits of every position of toks from a fresh contiguous cache, the whole sequence in one step. */
static float *ref_logits(const struct llama *m, struct tpool *tp, const int32_t *toks, uint32_t n)
{
	struct pkv_geometry geo;
	struct pkv_attn a;
	struct llama_ctx c;
	uint32_t seq, nc, pos = 0;
	float *out = malloc((size_t)n * m->hp.n_vocab * sizeof *out);
	llama_geometry(m, BS, 1024, &geo);
	geo.cache_dtype = cur_kv;
	ck_assert_int_eq(pkv_attn_ref_create(&geo, 0, tp, &a), 0);
	ck_assert_int_eq(llama_ctx_init(&c, m, &a, tp, n), 0);
	ck_assert_int_eq(a.ops->seq_open(a.ctx, toks, n, &seq, &nc), 0);
	ck_assert_uint_eq(nc, 0);
	ck_assert_int_eq(llama_forward(&c, &seq, &n, &pos, toks, 1, out, 1), 0);
	llama_ctx_free(&c);
	pkv_attn_destroy(&a);
	return out;
}

/*
 * f32 cache and activations: the paged result may differ from the contiguous one only by the
 * backend's summation order. With f32 weights that stays below 1e-4 of the logits' scale. With
 * quantized weights the model rounds every matmul input to 16 bits per 32-value block, which is
 * discontinuous: a last-bit difference in an attention output can move one activation by a whole
 * step (2^-15 of its block's max), and later layers amplify it, so the bound is 2e-3 there.
 */
static float tol_for(int wt)
{
	return wtypes[wt] == GGML_F32 ? 1e-4f : 2e-3f;
}

static void expect_rows(const struct llama *m, const float *got, const float *want, uint32_t rows, const char *what)
{
	uint32_t V = m->hp.n_vocab;
	float scale = 0, worst = 0;
	for (size_t i = 0; i < (size_t)rows * V; i++)
		scale = fmaxf(scale, fabsf(want[i]));
	for (size_t i = 0; i < (size_t)rows * V; i++)
		worst = worse(worst, fabsf(got[i] - want[i]));
	ck_assert_msg(scale > 0.1f, "%s: degenerate logits", what);
	ck_assert_msg(worst <= tol_for(cur_wt) * scale, "%s: max |diff| %g over scale %g", what, worst, scale);
}

static void rand_tokens(int32_t *t, uint32_t n, uint32_t V, unsigned seed)
{
	for (uint32_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		t[i] = 3 + (int32_t)((seed >> 8) % (V - 3));
	}
}

/* n random tokens (seed) run through the fixture in the given chunks, checked against the contiguous forward. */
static void chunks_equal_contiguous(struct fx *f, uint32_t n, unsigned seed, const uint32_t *chunks, int n_chunks,
				    const char *what)
{
	uint32_t V = f->m.hp.n_vocab, seq, nc, pos = 0;
	int32_t *t = malloc(n * sizeof *t);
	float *want, *got = malloc((size_t)n * V * sizeof *got);

	rand_tokens(t, n, V, seed);
	want = ref_logits(&f->m, f->tp, t, n);
	ck_assert_int_eq(f->a.ops->seq_open(f->a.ctx, t, n, &seq, &nc), 0);
	for (int k = 0; k < n_chunks; k++) {
		uint32_t c = chunks[k];

		ck_assert_int_eq(llama_forward(&f->c, &seq, &c, &pos, t + pos, 1, got + (size_t)pos * V, 1), 0);
		pos += chunks[k];
	}
	ck_assert_uint_eq(pos, n);
	expect_rows(&f->m, got, want, n, what);
	free(t);
	free(want);
	free(got);
}

START_TEST(chunked_prefill_equals_contiguous)
{
	static const uint32_t chunks[] = { 5, 8, 1, 13, 10 };
	struct fx f;
	fx_up(&f, _i);
	chunks_equal_contiguous(&f, 37, 1, chunks, 5, "chunked prefill");
	fx_down(&f);
}
END_TEST

START_TEST(prefix_hit_equals_contiguous)
{
	struct fx f;
	int32_t a[29], b[31];
	uint32_t sa, sb, nc, pos = 0, n;
	fx_up(&f, _i);
	uint32_t V = f.m.hp.n_vocab;
	rand_tokens(a, 29, V, 2);
	memcpy(b, a, 24 * sizeof *a);      /* 24 shared tokens = 6 blocks */
	rand_tokens(b + 24, 7, V, 3);
	float *got = malloc(31 * V * sizeof *got);
	ck_assert_int_eq(f.a.ops->seq_open(f.a.ctx, a, 29, &sa, &nc), 0);
	n = 29;
	ck_assert_int_eq(llama_forward(&f.c, &sa, &n, &pos, a, 1, got, 0), 0);
	ck_assert_int_eq(f.a.ops->seq_close(f.a.ctx, sa), 0);
	ck_assert_int_eq(f.a.ops->seq_open(f.a.ctx, b, 31, &sb, &nc), 0);
	ck_assert_uint_eq(nc, 24);
	n = 31 - nc;
	ck_assert_int_eq(llama_forward(&f.c, &sb, &n, &nc, b + nc, 1, got, 1), 0);
	float *want = ref_logits(&f.m, f.tp, b, 31);
	expect_rows(&f.m, got, want + (size_t)24 * V, 7, "after a prefix hit");
	free(want);
	free(got);
	fx_down(&f);
}
END_TEST

/*
 * An f16 / bf16 KV cache (--kv-dtype): chunked prefill, then decode steps, equal the contiguous
 * forward whose keys and values are rounded the same way (f32 weights: only the summation order
 * differs). The reference without the rounding differs by 6e-4 (f16) and 7e-3 (bf16) of the
 * logits' scale.
 */
START_TEST(narrow_kv_equals_contiguous)
{
	static const uint32_t kv[] = { PKV_DTYPE_F16, PKV_DTYPE_BF16 };
	static const uint32_t chunks[] = { 7, 13, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
	struct fx f;
	cur_kv = kv[_i];
	fx_up(&f, 0);
	chunks_equal_contiguous(&f, 30, 9, chunks, 12, kv[_i] == PKV_DTYPE_F16 ? "f16 KV" : "bf16 KV");
	cur_kv = PKV_DTYPE_F32;
	fx_down(&f);
}
END_TEST

/* Parent and child diverge after a fork (in one mixed step, then decodes in one batch). */
START_TEST(fork_equals_contiguous)
{
	struct fx f;
	int32_t p[20], x[20], y[20];
	uint32_t s[2], nc, pos = 0, n = 10;
	fx_up(&f, _i);
	uint32_t V = f.m.hp.n_vocab;
	rand_tokens(p, 20, V, 4);
	memcpy(x, p, 10 * sizeof *p);
	memcpy(y, p, 10 * sizeof *p);
	rand_tokens(x + 10, 10, V, 5);
	rand_tokens(y + 10, 10, V, 6);
	float *got = malloc(20 * V * sizeof *got);
	ck_assert_int_eq(f.a.ops->seq_open(f.a.ctx, p, 10, &s[0], &nc), 0);
	ck_assert_int_eq(llama_forward(&f.c, &s[0], &n, &pos, p, 1, got, 0), 0);
	ck_assert_int_eq(f.a.ops->seq_fork(f.a.ctx, s[0], &s[1]), 0);
	/* one step: parent gets 3 tokens, child 2 */
	uint32_t nn[2] = { 3, 2 }, p0[2] = { 10, 10 };
	int32_t tk[5] = { x[10], x[11], x[12], y[10], y[11] };
	float *wx = ref_logits(&f.m, f.tp, x, 20), *wy = ref_logits(&f.m, f.tp, y, 20);
	ck_assert_int_eq(llama_forward(&f.c, s, nn, p0, tk, 2, got, 1), 0);
	expect_rows(&f.m, got, wx + (size_t)10 * V, 3, "parent after fork");
	expect_rows(&f.m, got + 3 * V, wy + (size_t)10 * V, 2, "child after fork");
	/* then decodes: both sequences one token per step */
	uint32_t px = 13, py = 12;
	while (px < 20 && py < 20) {
		uint32_t one[2] = { 1, 1 }, q0[2] = { px, py };
		int32_t t2[2] = { x[px], y[py] };
		ck_assert_int_eq(llama_forward(&f.c, s, one, q0, t2, 2, got, 1), 0);
		expect_rows(&f.m, got, wx + (size_t)px * V, 1, "parent decode");
		expect_rows(&f.m, got + V, wy + (size_t)py * V, 1, "child decode");
		px++;
		py++;
	}
	free(wx);
	free(wy);
	free(got);
	fx_down(&f);
}
END_TEST

START_TEST(mixed_prefill_decode_batch_equals_contiguous)
{
	struct fx f;
	int32_t a[13], b[9], c[1];
	uint32_t s[3], nc, pos = 0, n = 12;
	fx_up(&f, _i);
	uint32_t V = f.m.hp.n_vocab;
	rand_tokens(a, 13, V, 7);
	rand_tokens(b, 9, V, 8);
	rand_tokens(c, 1, V, 9);
	float *got = malloc(13 * V * sizeof *got);
	ck_assert_int_eq(f.a.ops->seq_open(f.a.ctx, a, 12, &s[0], &nc), 0);
	ck_assert_int_eq(llama_forward(&f.c, &s[0], &n, &pos, a, 1, got, 0), 0);
	ck_assert_int_eq(f.a.ops->seq_open(f.a.ctx, b, 9, &s[1], &nc), 0);
	ck_assert_int_eq(f.a.ops->seq_open(f.a.ctx, c, 1, &s[2], &nc), 0);
	uint32_t nn[3] = { 1, 9, 1 }, p0[3] = { 12, 0, 0 };
	int32_t tk[11];
	tk[0] = a[12];
	memcpy(tk + 1, b, 9 * sizeof *b);
	tk[10] = c[0];
	ck_assert_int_eq(llama_forward(&f.c, s, nn, p0, tk, 3, got, 1), 0);
	float *wa = ref_logits(&f.m, f.tp, a, 13), *wb = ref_logits(&f.m, f.tp, b, 9), *wc = ref_logits(&f.m, f.tp, c, 1);
	expect_rows(&f.m, got, wa + (size_t)12 * V, 1, "decode in a mixed batch");
	expect_rows(&f.m, got + V, wb, 9, "prefill in a mixed batch");
	expect_rows(&f.m, got + 10 * V, wc, 1, "one-token prefill in a mixed batch");
	free(wa);
	free(wb);
	free(wc);
	free(got);
	fx_down(&f);
}
END_TEST

/* One client process: a shared 24-token prefix plus its own suffix, prefilled in chunks and then
 * decoded; every logit row must equal the contiguous reference. Returns the number of bad rows. */
static int client_proc(int wt, unsigned who)
{
	struct fx f;
	int32_t t[40];
	uint32_t seq, nc, pos, n, bad = 0;
	fx_up(&f, wt);
	uint32_t V = f.m.hp.n_vocab;
	rand_tokens(t, 24, V, 100);
	rand_tokens(t + 24, 16, V, 200 + who);
	float *want = ref_logits(&f.m, f.tp, t, 40), *got = malloc(40 * V * sizeof *got);
	if (f.a.ops->seq_open(f.a.ctx, t, 30, &seq, &nc))
		return 100;
	for (pos = nc; pos < 40; pos += n) {
		n = pos < 30 ? (30 - pos < 7 ? 30 - pos : 7) : 1;
		if (llama_forward(&f.c, &seq, &n, &pos, t + pos, 1, got + (size_t)pos * V, 1))
			return 101;
	}
	for (uint32_t r = nc; r < 40; r++) {
		float scale = 0, worst = 0;
		for (uint32_t i = 0; i < V; i++) {
			scale = fmaxf(scale, fabsf(want[(size_t)r * V + i]));
			worst = worse(worst, fabsf(got[(size_t)r * V + i] - want[(size_t)r * V + i]));
		}
		bad += !(worst <= tol_for(wt) * scale);
	}
	free(want);
	free(got);
	fx_down(&f);
	return (int)bad;
}

START_TEST(several_client_processes_equal_contiguous)
{
	pid_t kids[4];
	for (unsigned k = 0; k < 4; k++) {
		kids[k] = fork();
		ck_assert_int_ge(kids[k], 0);
		if (kids[k] == 0)
			_exit(client_proc(_i, k));
	}
	for (unsigned k = 0; k < 4; k++) {
		int st;
		ck_assert_int_eq(waitpid(kids[k], &st, 0), kids[k]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client %u: status %d", k, st);
	}
}
END_TEST

static struct dmn d;

/* Runs in the runner process before the pagedkvd tests; a daemon that cannot start leaves
 * daemon_sock unset and fx_up fails every test of the tcase with the reason on stderr. */
static void daemon_up(void)
{
	int r = test_daemon_start(&d);
	if (r) {
		fprintf(stderr, "test_equality: cannot start pagedkvd: %s\n", strerror(-r));
		daemon_sock = "/nonexistent/pagedkvd-did-not-start";
		return;
	}
	daemon_sock = d.sock;
}

/* The same daemon, its pools created with client attention: the backend loads in this process. */
static void daemon_up_client_attn(void)
{
	test_client_attention_plugins();
	pool_flags = PKV_POOL_CLIENT_ATTENTION;
	daemon_up();
}

static void daemon_down(void)
{
	pool_flags = 0;
	if (d.pid)
		test_daemon_stop(&d);
	daemon_sock = NULL;
}

/* The tests that need a daemon, in a tcase whose fixture starts it as `up` says. */
static TCase *daemon_tcase(const char *name, void (*up)(void))
{
	TCase *t = tcase_create(name);

	tcase_add_unchecked_fixture(t, up, daemon_down);
	tcase_set_timeout(t, 120);
	tcase_add_loop_test(t, chunked_prefill_equals_contiguous, 0, 3);
	tcase_add_loop_test(t, prefix_hit_equals_contiguous, 0, 3);
	tcase_add_loop_test(t, fork_equals_contiguous, 0, 3);
	tcase_add_loop_test(t, mixed_prefill_decode_batch_equals_contiguous, 0, 3);
	tcase_add_loop_test(t, several_client_processes_equal_contiguous, 0, 3);
	tcase_add_loop_test(t, narrow_kv_equals_contiguous, 0, 2);
	return t;
}

int main(void)
{
	char dir[] = "/tmp/pkv-eq-XXXXXX";
	if (!mkdtemp(dir))
		return 99;
	for (int i = 0; i < 3; i++) {
		struct randmodel_params p = { .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn = 96,
					      .n_vocab = 300, .wtype = wtypes[i], .tied = i == 2, .seed = 42 + (uint64_t)i };
		snprintf(path[i], sizeof path[i], "%s/rand%d.gguf", dir, i);
		if (randmodel_write(path[i], &p))
			return 99;
	}
	/* One runner (one TAP plan): first against the in-process cache (the reference's own paging
	 * logic), then through pagedkvd with the CPU backend, started by the tcase's fixture. */
	Suite *s = suite_create("equality");
	TCase *tc = tcase_create("in-process");
	tcase_add_loop_test(tc, chunked_prefill_equals_contiguous, 0, 3);
	tcase_add_loop_test(tc, prefix_hit_equals_contiguous, 0, 3);
	tcase_add_loop_test(tc, fork_equals_contiguous, 0, 3);
	tcase_add_loop_test(tc, mixed_prefill_decode_batch_equals_contiguous, 0, 3);
	tcase_add_loop_test(tc, narrow_kv_equals_contiguous, 0, 2);
	suite_add_tcase(s, tc);
	suite_add_tcase(s, daemon_tcase("pagedkvd", daemon_up));
	suite_add_tcase(s, daemon_tcase("client-attention", daemon_up_client_attn));
	int failed = suite_main(s);
	if (d.pid)
		test_daemon_stop(&d);
	for (int i = 0; i < 3; i++)
		unlink(path[i]);
	rmdir(dir);
	return failed;
}
