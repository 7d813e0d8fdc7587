/* SPDX-License-Identifier: MIT */
/* SmolLM2 on the VNNI path against the previous 16-bit-activation kernels on a held-out text: the
 * next-token choice (top-1) must agree on at least 98 % of the positions with the default activation
 * precision, and on 95 % with int8 blocks everywhere (measured: 100 % and 97.6 %). Exits 77 when the
 * model or AVX512-VNNI is absent. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../examples/llama/gemm_vnni.h"
#include "../../examples/llama/llama.h"
#include "../../examples/llama/tokenizer.h"
#include "modeldir.h"
#include "../suite_main.h"

#define SMOL SMOLLM2_FILE
static const struct {
	const char *act16; /* $PKV_ACT16; NULL: the default */
	double min;
} cfgs[] = { { NULL, 0.98 }, { "", 0.95 } };

/* Not from any training set we know of: written for this test. */
static const char text[] =
	"The lighthouse keeper kept a ledger of every ship that passed the northern rocks. In the spring "
	"of that year the entries grew short: a fishing boat on Monday, a grain barge on Thursday, and then "
	"nothing for nine days while fog sat on the water like wet wool. He cleaned the lens twice a day "
	"anyway, because the light was the only promise he had made to anyone. On the tenth morning a "
	"small sailboat came in under a torn jib, and a girl of about twelve climbed onto the landing with "
	"a tin box under her arm. She said her grandfather had built the first lamp on this island and "
	"that the box held his drawings. The keeper made tea, spread the pages across the table, and saw "
	"at once that the drawings showed a mechanism he had never understood: a clockwork that turned the "
	"lens without anyone winding it, driven by the tide rising and falling in a shaft beneath the "
	"tower. They spent the afternoon in the cellar with a lantern, tracing iron rods to a sealed hatch. "
	"When they pried it open, the smell of salt and old grease rolled out, and somewhere below them "
	"a wheel the size of a cart turned slowly in the dark, as it had for sixty years.";

static int argmax(const float *v, uint32_t n)
{
	int b = 0;
	for (uint32_t i = 1; i < n; i++)
		if (v[i] > v[b])
			b = (int)i;
	return b;
}

/* All positions' logits of the text, through an in-process contiguous cache. */
static int run(struct llama *m, struct tpool *tp, const int32_t *ids, uint32_t n, float *logits)
{
	struct pkv_geometry geo;
	struct pkv_attn a;
	struct llama_ctx c;
	uint32_t seq, nc, pos = 0;
	llama_geometry(m, 16, 0, &geo);
	if (pkv_attn_ref_create(&geo, 0, tp, &a))
		return -1;
	int r = llama_ctx_init(&c, m, &a, tp, n);
	if (!r)
		r = a.ops->seq_open(a.ctx, ids, n, &seq, &nc);
	if (!r)
		r = llama_forward(&c, &seq, &n, &pos, ids, 1, logits, 1);
	llama_ctx_free(&c);
	pkv_attn_destroy(&a);
	return r;
}

static char path[4096];

START_TEST(vnni_path_agrees_with_16_bit_on_top1)
{
	struct llama m;
	struct tokenizer tok;
	struct tpool *tp;
	int32_t *ids;
	if (cfgs[_i].act16)
		ck_assert_int_eq(setenv("PKV_ACT16", cfgs[_i].act16, 1), 0);
	else
		unsetenv("PKV_ACT16");
	ck_assert_msg(llama_load(&m, path) == 0, "%s", m.err);
	ck_assert_msg(tok_load(&tok, &m.g, m.err, sizeof m.err) == 0, "%s", m.err);
	ck_assert_int_eq(tpool_create(2, &tp), 0);
	int n = tok_encode(&tok, text, strlen(text), tok.add_bos, 0, &ids);
	uint32_t V = m.hp.n_vocab;
	float *a = malloc((size_t)n * V * sizeof *a), *b = malloc((size_t)n * V * sizeof *b);
	ck_assert_int_ge(n, 200);
	ck_assert(a && b);
	ck_assert_msg(m.output.packed && m.layers[0].wq.packed, "weights not packed (PKV_ISA set?)");
	ck_assert_int_eq(run(&m, tp, ids, (uint32_t)n, a), 0);
	llama_unpack(&m);
	ck_assert_int_eq(run(&m, tp, ids, (uint32_t)n, b), 0);
	int same = 0;
	for (int t = 0; t < n; t++)
		same += argmax(a + (size_t)t * V, V) == argmax(b + (size_t)t * V, V);
	double frac = (double)same / n;
	printf("# top-1 agreement, PKV_ACT16=%s vs 16-bit activations: %d of %d positions (%.4f, need %.2f)\n",
	       cfgs[_i].act16 ? cfgs[_i].act16 : "(default)", same, n, frac, cfgs[_i].min);
	free(a);
	free(b);
	free(ids);
	tpool_destroy(tp);
	tok_free(&tok);
	llama_free(&m);
	ck_assert_msg(frac >= cfgs[_i].min, "top-1 agreement %.4f < %.2f", frac, cfgs[_i].min);
}
END_TEST

int main(void)
{
	if (smollm2_path(path, sizeof path) || !pkv_vnni_available()) {
		fprintf(stderr, "test_q8agree: needs %s (scripts/fetch-model) and AVX512-VNNI\n", SMOL);
		return 77;
	}
	Suite *su = suite_create("q8agree");
	TCase *tc = tcase_create("smollm2");
	tcase_set_timeout(tc, 600);
	tcase_add_loop_test(tc, vnni_path_agrees_with_16_bit_on_top1, 0, 2);
	suite_add_tcase(su, tc);
	return suite_main(su);
}
