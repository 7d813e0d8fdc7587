/* SPDX-License-Identifier: MIT */
/*
 * Rope scaling read from the file: linear scaling (llama.rope.scaling.type "linear" with its factor)
 * and rope_freqs.weight (an angle divisor per rotated pair) change the logits of every position but
 * the first, the two routes give the same logits for the same angles, the fingerprint tells a scaled
 * model from an unscaled one, and kinds not implemented (YaRN) or nonsense factors are refused.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../examples/llama/llama.h"
#include "model_logits.h"
#include "randmodel.h"
#include "../suite_main.h"

#define HD 32 /* dim 128 over 4 heads */
#define N_TOK 12

enum { PLAIN, LINEAR2, FREQS2, YARN, BAD_FREQS, N_MODELS };
static char dir[] = "/tmp/pkv-rope-XXXXXX";
static char path[N_MODELS][300];

static void write_models(void)
{
	static float twos[HD / 2], bad[HD / 2];

	for (int i = 0; i < HD / 2; i++) {
		twos[i] = 2.f;
		bad[i] = i == 3 ? 0.f : 1.f;
	}
	ck_assert_ptr_nonnull(mkdtemp(dir));
	for (int k = 0; k < N_MODELS; k++) {
		struct randmodel_params p = { .dim = 128, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn = 256,
					      .n_vocab = 300, .wtype = GGML_F32, .seed = 5 };

		if (k == LINEAR2 || k == YARN) {
			p.rope_scaling = k == LINEAR2 ? "linear" : "yarn";
			p.rope_factor = 2.f;
		}
		if (k == FREQS2 || k == BAD_FREQS)
			p.rope_freqs = k == FREQS2 ? twos : bad;
		snprintf(path[k], sizeof path[k], "%s/m%d.gguf", dir, k);
		ck_assert_int_eq(randmodel_write(path[k], &p), 0);
	}
}

static void remove_models(void)
{
	for (int k = 0; k < N_MODELS; k++)
		unlink(path[k]);
	rmdir(dir);
}

/* Logits of every position of the same N_TOK tokens through a fresh in-process cache. */
static float *run(const char *p, uint64_t *model_id, uint32_t *vocab)
{
	float *out = model_logits(p, N_TOK, 7, vocab, model_id);

	ck_assert_msg(out != NULL, "%s: no logits", p);
	return out;
}

static float max_abs_diff(const float *a, const float *b, size_t n)
{
	float d = 0.f;

	for (size_t i = 0; i < n; i++)
		d = fmaxf(d, fabsf(a[i] - b[i]));
	return d;
}

START_TEST(scaling_changes_every_position_but_the_first)
{
	uint64_t id_plain, id_lin, id_freqs;
	uint32_t V;
	float *plain = run(path[PLAIN], &id_plain, &V), *lin = run(path[LINEAR2], &id_lin, &V),
	      *freqs = run(path[FREQS2], &id_freqs, &V);

	/* Angle 0 at position 0: no scaling can change its logits. */
	ck_assert(!memcmp(plain, lin, V * sizeof(float)));
	/* Halving every angle through either route is the same arithmetic, bit for bit. */
	ck_assert_msg(!memcmp(lin, freqs, (size_t)N_TOK * V * sizeof(float)), "linear 2 and rope_freqs 2 differ by %g",
		      (double)max_abs_diff(lin, freqs, (size_t)N_TOK * V));
	for (uint32_t t = 1; t < N_TOK; t++)
		ck_assert_msg(max_abs_diff(plain + (size_t)t * V, lin + (size_t)t * V, V) > 1e-4f,
			      "position %u: scaling changed nothing", t);
	/* A scaled model never shares KV with the unscaled one (its rope_freqs is a tensor, hashed too). */
	ck_assert_uint_ne(id_plain, id_lin);
	ck_assert_uint_ne(id_plain, id_freqs);
	ck_assert_uint_ne(id_lin, id_freqs);
	free(plain);
	free(lin);
	free(freqs);
}
END_TEST

START_TEST(unsupported_or_nonsense_scaling_refused)
{
	struct llama m;

	ck_assert_int_eq(llama_load(&m, path[YARN]), -EINVAL);
	ck_assert_msg(strstr(m.err, "'yarn' is not supported"), "%s", m.err);
	ck_assert_int_eq(llama_load(&m, path[BAD_FREQS]), -EINVAL);
	ck_assert_msg(strstr(m.err, "rope_freqs.weight[3]"), "%s", m.err);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("rope-scaling");
	TCase *tc = tcase_create("load");
	tcase_add_unchecked_fixture(tc, write_models, remove_models);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, scaling_changes_every_position_but_the_first);
	tcase_add_test(tc, unsupported_or_nonsense_scaling_refused);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
