/* SPDX-License-Identifier: MIT */
/* stories260K: tokenizer and greedy continuation equal the reference ids in tests/data/README.md. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "../../examples/llama/llama.h"
#include "../../examples/llama/sampler.h"
#include "../../examples/llama/tokenizer.h"
#include "daemon.h"
#include "modeldir.h"
#include "../suite_main.h"

static char path[4096];

static const int32_t prompt_ref[] = { 1, 403, 407, 261, 378 };
static const int32_t cont_ref[60] = {
	432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292,
	411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426,
	338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310,
};

START_TEST(encodes_prompt)
{
	struct llama m;
	struct tokenizer t;
	char err[256];
	int32_t *ids;
	ck_assert_int_eq(llama_load(&m, path), 0);
	ck_assert_int_eq(tok_load(&t, &m.g, err, sizeof err), 0);
	int n = tok_encode(&t, "Once upon a time", 16, 1, 0, &ids);
	ck_assert_int_eq(n, 5);
	for (int i = 0; i < 5; i++)
		ck_assert_int_eq(ids[i], prompt_ref[i]);
	free(ids);
	tok_free(&t);
	llama_free(&m);
}
END_TEST

/* Greedy generation: the prompt in one prefill step, then one token per step. */
static void greedy_run(struct pkv_attn *a, struct tpool *tp, const struct llama *m, uint32_t want_cached)
{
	struct llama_ctx c;
	uint32_t seq, nc, pos = 0, n = 5;
	int32_t cur[8];
	ck_assert_int_eq(llama_ctx_init(&c, m, a, tp, 64), 0);
	float *logits = malloc(m->hp.n_vocab * sizeof *logits);
	ck_assert_int_eq(a->ops->seq_open(a->ctx, prompt_ref, 5, &seq, &nc), 0);
	ck_assert_uint_eq(nc, want_cached);
	memcpy(cur, prompt_ref + nc, (5 - nc) * sizeof *cur);
	pos = nc;
	n = 5 - nc;
	for (int i = 0; i < 60; i++) {
		ck_assert_int_eq(llama_forward(&c, &seq, &n, &pos, cur, 1, logits, 0), 0);
		pos += n;
		cur[0] = argmax(logits, m->hp.n_vocab);
		ck_assert_msg(cur[0] == cont_ref[i], "token %d: got %d, reference %d", i, cur[0], cont_ref[i]);
		n = 1;
	}
	ck_assert_int_eq(a->ops->seq_close(a->ctx, seq), 0);
	free(logits);
	llama_ctx_free(&c);
}

START_TEST(greedy_matches_reference_in_process)
{
	struct llama m;
	struct pkv_attn a;
	struct pkv_geometry geo;
	struct tpool *tp;
	ck_assert_int_eq(llama_load(&m, path), 0);
	ck_assert_int_eq(tpool_create(2, &tp), 0);
	llama_geometry(&m, 16, 1024, &geo);
	ck_assert_int_eq(pkv_attn_ref_create(&geo, 0, tp, &a), 0);
	greedy_run(&a, tp, &m, 0);
	pkv_attn_destroy(&a);
	tpool_destroy(tp);
	llama_free(&m);
}
END_TEST

/* The same through pagedkvd and the CPU backend, twice: the second run's prompt is a prefix hit. */
START_TEST(greedy_matches_reference_through_daemon)
{
	struct llama m;
	struct pkv_attn a;
	struct tpool *tp;
	struct dmn d;
	char err[512];
	ck_assert_int_eq(test_daemon_start(&d), 0);
	ck_assert_int_eq(llama_load(&m, path), 0);
	ck_assert_int_eq(tpool_create(2, &tp), 0);
	struct pkv_connect_opts co = { .socket_path = d.sock };
	struct pkv_pool_params pp = { .name = "stories", .act_dtype = PKV_DTYPE_F32, .model_id = m.model_id,
				      .window_left = -1 };
	llama_geometry(&m, 4, 1024, &pp.geo);
	ck_assert_msg(pkv_attn_daemon_create(&co, &pp, &a, err, sizeof err) == 0, "%s", err);
	greedy_run(&a, tp, &m, 0);
	greedy_run(&a, tp, &m, 4); /* 4-token blocks: BOS + "Once upon a" come from the cache */
	pkv_attn_destroy(&a);
	tpool_destroy(tp);
	llama_free(&m);
	test_daemon_stop(&d);
}
END_TEST

int main(void)
{
	if (model_path("stories260K.gguf", path, sizeof path)) {
		fprintf(stderr, "test_stories: %s not found (set PKV_TEST_MODEL_DIR)\n", path);
		return 77;
	}
	Suite *s = suite_create("stories260K");
	TCase *tc = tcase_create("reference");
	tcase_add_test(tc, encodes_prompt);
	tcase_add_test(tc, greedy_matches_reference_in_process);
	tcase_add_test(tc, greedy_matches_reference_through_daemon);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
