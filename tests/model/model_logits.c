/* SPDX-License-Identifier: MIT */
#include "model_logits.h"

#include <stdio.h>
#include <stdlib.h>

#include "../../examples/llama/llama.h"

float *model_logits(const char *path, uint32_t n, unsigned seed, uint32_t *vocab, uint64_t *model_id)
{
	struct llama m;
	struct tpool *tp = NULL;
	struct pkv_geometry geo;
	struct pkv_attn a;
	struct llama_ctx c;
	uint32_t seq, nc, pos = 0;
	int32_t toks[64];
	float *out = NULL;
	int r, have_attn = 0, have_ctx = 0;

	if (n == 0 || n > 64)
		return NULL;
	if (llama_load(&m, path)) {
		fprintf(stderr, "model_logits: %s\n", m.err);
		return NULL;
	}
	for (uint32_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		toks[i] = 3 + (int32_t)((seed >> 8) % (m.hp.n_vocab - 3));
	}
	*vocab = m.hp.n_vocab;
	if (model_id)
		*model_id = m.model_id;
	out = malloc((size_t)n * m.hp.n_vocab * sizeof *out);
	r = out ? tpool_create(2, &tp) : -1;
	llama_geometry(&m, 16, 64, &geo);
	if (!r)
		have_attn = !(r = pkv_attn_ref_create(&geo, 0, tp, &a));
	if (!r)
		have_ctx = !(r = llama_ctx_init(&c, &m, &a, tp, n));
	if (!r)
		r = a.ops->seq_open(a.ctx, toks, n, &seq, &nc);
	if (!r)
		r = llama_forward(&c, &seq, &n, &pos, toks, 1, out, 1);
	if (have_ctx)
		llama_ctx_free(&c);
	if (have_attn)
		pkv_attn_destroy(&a);
	if (tp)
		tpool_destroy(tp);
	llama_free(&m);
	if (r) {
		fprintf(stderr, "model_logits: %s: forward failed (%d)\n", path, r);
		free(out);
		return NULL;
	}
	return out;
}
