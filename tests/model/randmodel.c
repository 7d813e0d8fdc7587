/* SPDX-License-Identifier: MIT */
/* Random-weight llama GGUF writer: any geometry, any weight type, for tests that need no trained model. */
#include "randmodel.h"
#include "../../examples/llama/gguf.h"
#include "gguf_write.h"
#include "../../examples/llama/quant.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float frand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return (float)(*s >> 40) / (float)(1u << 23) - 1.f;
}

static int add_mat(struct gguf_builder *b, const char *name, const struct randmodel_params *p, uint32_t rows,
		   uint32_t cols, float scale, uint64_t *s)
{
	uint32_t type = p->restore ? p->store_type : p->wtype;
	size_t rb = pkv_row_bytes(type, cols), qb = pkv_row_bytes(p->wtype, cols);
	uint8_t *buf = malloc((size_t)rows * rb), *q = malloc(qb);
	float *v = malloc(cols * sizeof *v);
	uint64_t ne[2] = { cols, rows };
	int r = 0;
	if (!buf || !v || !q || !rb || !qb) {
		r = buf && v && q ? -EINVAL : -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < rows && !r; i++) {
		for (uint32_t c = 0; c < cols; c++)
			v[c] = frand(s) * scale;
		if (p->restore) {
			if (!(r = pkv_quant_row(p->wtype, v, q, cols)))
				r = p->restore(p->wtype, q, type, buf + (size_t)i * rb, cols);
		} else {
			r = pkv_quant_row(type, v, buf + (size_t)i * rb, cols);
		}
	}
	if (!r)
		gb_tensor(b, name, type, ne, 2, buf, (size_t)rows * rb);
out:
	free(buf);
	free(q);
	free(v);
	return r;
}

/* An F32 vector of offset + spread * U(-1, 1): norms (1, 0.2) and biases (0, 0.5). */
static void add_vec(struct gguf_builder *b, const char *name, uint32_t n, float offset, float spread, uint64_t *s)
{
	float *v = malloc(n * sizeof *v);
	uint64_t ne[1] = { n };
	if (!v)
		return; /* the builder's size check will fail the load; the test reports it */
	for (uint32_t i = 0; i < n; i++)
		v[i] = offset + spread * frand(s);
	gb_tensor(b, name, GGML_F32, ne, 1, v, n * sizeof *v);
	free(v);
}

int randmodel_write(const char *path, const struct randmodel_params *p)
{
	struct gguf_builder b;
	uint64_t s = p->seed | 1;
	uint32_t hd = p->dim / p->n_heads, qd = p->dim, kd = p->n_kv_heads * hd;
	const char *arch = p->arch ? p->arch : "llama";
	char name[64], key[96];
	int r = 0;
	uint8_t *img;
	size_t len;
	const char **toks = calloc(p->n_vocab, sizeof *toks);
	char (*tbuf)[16] = calloc(p->n_vocab, sizeof *tbuf);
	int32_t *types = calloc(p->n_vocab, sizeof *types);
	if (!toks || !tbuf || !types) {
		r = -ENOMEM;
		goto out;
	}
	/* <unk> <s> </s>, then byte tokens so any text encodes, then filler pieces */
	for (uint32_t i = 0; i < p->n_vocab; i++) {
		if (i < 3)
			snprintf(tbuf[i], 16, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
		else if (i < 3 + 256)
			snprintf(tbuf[i], 16, "<0x%02X>", i - 3);
		else
			snprintf(tbuf[i], 16, "tok%u", i);
		toks[i] = tbuf[i];
		types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 3 + 256 ? 6 : 1;
	}
	gb_init(&b, 32);
#define K(x) (snprintf(key, sizeof key, "%s." x, arch), key)
	gb_kv_str(&b, "general.architecture", arch);
	gb_kv_u32(&b, K("embedding_length"), p->dim);
	gb_kv_u32(&b, K("block_count"), p->n_layers);
	gb_kv_u32(&b, K("attention.head_count"), p->n_heads);
	gb_kv_u32(&b, K("attention.head_count_kv"), p->n_kv_heads);
	gb_kv_u32(&b, K("feed_forward_length"), p->ffn);
	gb_kv_u32(&b, K("context_length"), 4096);
	gb_kv_u32(&b, K("rope.dimension_count"), hd);
	gb_kv_f32(&b, K("rope.freq_base"), p->rope_base > 0 ? p->rope_base : 10000.f);
	gb_kv_f32(&b, K("attention.layer_norm_rms_epsilon"), 1e-5f);
	if (p->rope_scaling) {
		gb_kv_str(&b, K("rope.scaling.type"), p->rope_scaling);
		gb_kv_f32(&b, K("rope.scaling.factor"), p->rope_factor);
	}
	gb_kv_str(&b, "tokenizer.ggml.model", "llama");
	gb_kv_arr_str(&b, "tokenizer.ggml.tokens", toks, p->n_vocab);
	gb_kv_arr(&b, "tokenizer.ggml.token_type", GGUF_I32, types, p->n_vocab);
	gb_kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
	gb_kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
	/* scales keep activations O(1) through the layers so logits are well conditioned */
	if ((r = add_mat(&b, "token_embd.weight", p, p->n_vocab, p->dim, 1.f, &s)))
		goto out_b;
	add_vec(&b, "output_norm.weight", p->dim, 1.f, 0.2f, &s);
	if (p->rope_freqs) {
		uint64_t ne[1] = { hd / 2 };

		gb_tensor(&b, "rope_freqs.weight", GGML_F32, ne, 1, p->rope_freqs, hd / 2 * sizeof(float));
	}
	if (!p->tied && (r = add_mat(&b, "output.weight", p, p->n_vocab, p->dim, 0.5f, &s)))
		goto out_b;
	for (uint32_t l = 0; l < p->n_layers; l++) {
		float sa = 1.f / (float)p->dim, sf = 1.f / (float)p->ffn;
#define N(x) (snprintf(name, sizeof name, "blk.%u." x ".weight", l), name)
		add_vec(&b, N("attn_norm"), p->dim, 1.f, 0.2f, &s);
		add_vec(&b, N("ffn_norm"), p->dim, 1.f, 0.2f, &s);
		if ((r = add_mat(&b, N("attn_q"), p, qd, p->dim, 3.f * sqrtf(sa), &s)) ||
		    (r = add_mat(&b, N("attn_k"), p, kd, p->dim, 3.f * sqrtf(sa), &s)) ||
		    (r = add_mat(&b, N("attn_v"), p, kd, p->dim, 1.7f * sqrtf(sa), &s)) ||
		    (r = add_mat(&b, N("attn_output"), p, p->dim, qd, 1.7f * sqrtf(sa), &s)) ||
		    (r = add_mat(&b, N("ffn_gate"), p, p->ffn, p->dim, 1.7f * sqrtf(sa), &s)) ||
		    (r = add_mat(&b, N("ffn_up"), p, p->ffn, p->dim, 1.7f * sqrtf(sa), &s)) ||
		    (r = add_mat(&b, N("ffn_down"), p, p->dim, p->ffn, 1.7f * sqrtf(sf), &s)))
			goto out_b;
#undef N
#define N(x) (snprintf(name, sizeof name, "blk.%u." x ".bias", l), name)
		if (p->qkv_bias) {
			add_vec(&b, N("attn_q"), qd, 0.f, 0.5f, &s);
			add_vec(&b, N("attn_k"), kd, 0.f, 0.5f, &s);
			add_vec(&b, N("attn_v"), kd, 0.f, 0.5f, &s);
		}
#undef N
	}
#undef K
	if ((r = gb_finish(&b, &img, &len)))
		goto out;
	{
		FILE *f = fopen(path, "wb");
		if (!f || fwrite(img, 1, len, f) != len)
			r = -EIO;
		if (f && fclose(f))
			r = -EIO;
	}
	free(img);
	goto out;
out_b:
	gb_free(&b);
out:
	free(toks);
	free(tbuf);
	free(types);
	return r;
}
