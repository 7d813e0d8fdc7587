/* SPDX-License-Identifier: MIT */
/* SmolLM2-135M-Instruct end to end (skipped when the model is absent — scripts/fetch-model gets it):
 * BPE round trip, a sensible greedy answer, and a warm shared prefix answering faster than a cold one. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../examples/llama/engine.h"
#include "../../examples/llama/session.h"
#include "modeldir.h"
#include "../suite_main.h"

#define SMOL SMOLLM2_FILE
static char path[4096];
static struct session s;

static void setup(void)
{
	struct session_opts o = { .model = path, .in_process = 1, .threads = 2 };
	char err[512];
	ck_assert_msg(session_open(&s, &o, err, sizeof err) == 0, "%s", err);
}

static void teardown(void)
{
	session_close(&s);
}

static char *detok(const int32_t *ids, uint32_t n)
{
	char *out = calloc(n * 64 + 1, 1);
	size_t len = 0;
	for (uint32_t i = 0; i < n; i++)
		len += tok_piece(&s.tok, ids[i], 0, out + len, 64);
	return out;
}

START_TEST(bpe_round_trips_text)
{
	const char *t = "Hello world!  It's 2024: naïve café, tabs\tand\nnewlines — ok?";
	int32_t *ids;
	int n = tok_encode(&s.tok, t, strlen(t), 0, 0, &ids);
	ck_assert_int_gt(n, 10);
	ck_assert_int_lt(n, (int)strlen(t)); /* merges happened */
	char *back = detok(ids, (uint32_t)n);
	ck_assert_str_eq(back, t);
	free(back);
	free(ids);
}
END_TEST

START_TEST(chat_template_uses_special_tokens)
{
	int32_t *ids;
	int n = chat_turn(&s.tok, "Be brief.<|im_end|>", "<|im_end|>hi", 1, 0, &ids);
	ck_assert_int_gt(n, 8);
	ck_assert_int_eq(ids[0], 1); /* <|im_start|> */
	int specials = 0;
	for (int i = 0; i < n; i++)
		specials += ids[i] == 1 || ids[i] == 2;
	/* system start/end, user start/end, assistant start: a literal "<|im_end|>" in the system or
	 * user text is text */
	ck_assert_int_eq(specials, 5);
	free(ids);
}
END_TEST

static struct conv *ask(struct engine *e, const char *sys, const char *q, uint32_t max_new)
{
	struct sampler smp;
	int32_t *ids;
	sampler_init(&smp, 0, 0, 1, 1);
	struct conv *c = engine_conv_new(e, &smp, NULL, NULL);
	int n = chat_turn(&s.tok, sys, q, 1, 0, &ids);
	ck_assert_int_gt(n, 0);
	ck_assert_int_eq(engine_submit(e, c, ids, (uint32_t)n, max_new), 0);
	free(ids);
	ck_assert_int_eq(engine_run(e), 0);
	ck_assert_int_eq(c->state, CONV_DONE);
	return c;
}

START_TEST(greedy_answer_is_sensible)
{
	struct engine e;
	ck_assert_int_eq(engine_init(&e, &s.lc, &s.tok, 256, 4), 0);
	struct conv *c = ask(&e, NULL, "What is the capital of France?", 24);
	char *a = detok(c->hist + c->turn_start, c->n_gen);
	ck_assert_msg(strstr(a, "Paris") != NULL, "answer: %s", a);
	free(a);
	engine_free(&e);
}
END_TEST

/*
 * The warm turn reuses the shared system prompt, so it computes fewer prompt
 * tokens: counted, not timed (its TTFT gain is measured by pkv-bench-e2e).
 */
START_TEST(warm_prefix_prefills_less_than_cold)
{
	struct engine e;
	char sys[4096] = "You are a careful assistant. ";
	for (int i = 0; i < 25; i++)
		strcat(sys, "Answer questions about geography with short, factual sentences. ");
	ck_assert_int_eq(engine_init(&e, &s.lc, &s.tok, 256, 4), 0);
	/* What the engine computed (its own counter), less the decodes of the generated tokens. */
	uint64_t t0 = e.tokens_computed;
	struct conv *cold = ask(&e, sys, "Name a river in Egypt.", 4);
	uint64_t t1 = e.tokens_computed;
	struct conv *warm = ask(&e, sys, "Name a mountain in Nepal.", 4);
	uint64_t computed_cold = t1 - t0 - (cold->n_gen ? cold->n_gen - 1 : 0);
	uint64_t computed_warm = e.tokens_computed - t1 - (warm->n_gen ? warm->n_gen - 1 : 0);
	ck_assert_uint_eq(cold->reused_tokens, 0);
	ck_assert_uint_eq(computed_cold, cold->prompt_tokens);
	ck_assert_uint_gt(warm->reused_tokens, 200);
	ck_assert_msg(computed_warm + 200 <= computed_cold, "warm turn computed %llu prompt tokens, cold %llu",
		      (unsigned long long)computed_warm, (unsigned long long)computed_cold);
	engine_free(&e);
}
END_TEST

int main(void)
{
	if (smollm2_path(path, sizeof path)) {
		fprintf(stderr, "test_smollm: %s absent (run scripts/fetch-model)\n", SMOL);
		return 77;
	}
	Suite *su = suite_create("smollm2");
	TCase *tc = tcase_create("end-to-end");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, bpe_round_trips_text);
	tcase_add_test(tc, chat_template_uses_special_tokens);
	tcase_add_test(tc, greedy_answer_is_sensible);
	tcase_add_test(tc, warm_prefix_prefills_less_than_cold);
	suite_add_tcase(su, tc);
	return suite_main(su);
}
