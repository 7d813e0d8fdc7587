/* SPDX-License-Identifier: MIT */
/*
 * The forward of each architecture against llama.cpp on random-weight models: llama (interleaved
 * rotary pairs, GQA, its own output matrix) and qwen2 (NeoX rotary pairs, Q/K/V biases, tied
 * embeddings). tests/data/arch_logits_ref.txt holds llama.cpp's top 8 logits per position
 * (tests/model/gen_arch_ref.cpp wrote them); ours must pick the same top token and come within
 * TOL of each of those logits. A wrong pair layout or a missing bias moves them by whole units.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../examples/llama/gguf.h"
#include "model_logits.h"
#include "randmodel.h"
#include "refdata.h"
#include "../suite_main.h"

#define N_TOK 16
#define SEED 7
#define TOL 0.05f /* llama.cpp and we differ by at most 0.017 here, on logits up to 36 */

static const struct randmodel_params models[] = {
	{ .arch = "llama", .dim = 128, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn = 256, .n_vocab = 300,
	  .wtype = GGML_F32, .seed = 5 },
	{ .arch = "qwen2", .qkv_bias = 1, .tied = 1, .dim = 128, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
	  .ffn = 256, .n_vocab = 300, .wtype = GGML_F32, .seed = 5, .rope_base = 1e6f },
};

static void check_model(const struct randmodel_params *p)
{
	const char *keep = getenv("PKV_ARCH_REF_KEEP");
	char dir[] = "/tmp/pkv-arch-XXXXXX", path[4200], *line = NULL;
	size_t cap = 0;
	uint32_t vocab;
	unsigned rows = 0;
	float *logits;
	FILE *f;

	if (keep)
		snprintf(path, sizeof path, "%s/%s.gguf", keep, p->arch);
	else {
		ck_assert_ptr_nonnull(mkdtemp(dir));
		snprintf(path, sizeof path, "%s/%s.gguf", dir, p->arch);
	}
	ck_assert_int_eq(randmodel_write(path, p), 0);
	logits = model_logits(path, N_TOK, SEED, &vocab, NULL);
	ck_assert_ptr_nonnull(logits);
	if (keep) { /* the tokens model_logits drew, for gen_arch_ref */
		unsigned s = SEED;

		printf("%s tokens:", p->arch);
		for (int i = 0; i < N_TOK; i++) {
			s = s * 1103515245u + 12345u;
			printf(" %u", 3 + (s >> 8) % (vocab - 3));
		}
		printf("\n");
		fflush(stdout);
	} else {
		unlink(path);
		rmdir(dir);
	}
	f = refdata_open("arch_logits_ref.txt");
	while (getline(&line, &cap, f) > 0) {
		char *save, *arch = strtok_r(line, " \n", &save), *t;
		const float *l;
		unsigned pos, best = 0, k = 0;

		if (!arch || arch[0] == '#' || strcmp(arch, p->arch))
			continue;
		pos = (unsigned)atoi(strtok_r(NULL, " \n", &save));
		ck_assert_uint_lt(pos, N_TOK);
		l = logits + (size_t)pos * vocab;
		for (uint32_t v = 1; v < vocab; v++)
			if (l[v] > l[best])
				best = v;
		for (; (t = strtok_r(NULL, " \n", &save)); k++) {
			unsigned id = (unsigned)atoi(t);
			float want = strtof(strchr(t, ':') + 1, NULL);

			ck_assert_uint_lt(id, vocab);
			if (k == 0)
				ck_assert_msg(best == id, "%s position %u: top token %u, llama.cpp's %u", p->arch, pos,
					      best, id);
			ck_assert_msg(l[id] > want - TOL && l[id] < want + TOL,
				      "%s position %u token %u: logit %g, llama.cpp's %g", p->arch, pos, id,
				      (double)l[id], (double)want);
		}
		ck_assert_uint_eq(k, 8);
		rows++;
	}
	free(line);
	fclose(f);
	free(logits);
	ck_assert_uint_eq(rows, N_TOK);
}

START_TEST(llama_matches_llama_cpp)
{
	check_model(&models[0]);
}
END_TEST

START_TEST(qwen2_matches_llama_cpp)
{
	check_model(&models[1]);
}
END_TEST

int main(void)
{
	Suite *su = suite_create("arch-reference");
	TCase *tc = tcase_create("llama.cpp");
	tcase_add_test(tc, llama_matches_llama_cpp);
	tcase_add_test(tc, qwen2_matches_llama_cpp);
	suite_add_tcase(su, tc);
	return suite_main(su);
}
