/* SPDX-License-Identifier: MIT */
/* A llama-family model (llama, qwen2) loaded from GGUF, and its batched forward pass over a pkv_attn. */
#ifndef PKV_EX_LLAMA_H
#define PKV_EX_LLAMA_H

#include <stdint.h>

#include "attn.h"
#include "gguf.h"
#include "matmul.h"

struct llama_hparams {
	uint32_t n_vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn, ctx;
	uint32_t rope_dims;
	float eps, rope_base;
};

/* What tells the supported architectures apart (llama.c). */
struct llama_arch {
	const char *name; /* general.architecture, and the prefix of its metadata keys */
	int rope_neox;    /* rotary pairs (i, i + d/2) rather than (2i, 2i+1) */
	int qkv_bias;     /* Q, K and V have biases (required) */
};

struct llama_layer {
	float *attn_norm, *ffn_norm;
	float *bq, *bk, *bv; /* Q/K/V biases (qwen2), NULL when the file has none */
	struct wmat wq, wk, wv, wo, gate, up, down;
};

struct llama {
	struct gguf g;
	const struct llama_arch *arch;
	struct llama_hparams hp;
	struct llama_layer *layers;
	struct wmat tok_embd, output;
	float *output_norm;
	/* Rope scaling: angle = pos * rope_pos_scale * base^(-2p/rope_dims) / rope_freq_div[p] */
	float rope_pos_scale;  /* 1, or 1/factor of linear scaling (llama.rope.scaling.type "linear") */
	float *rope_freq_div;  /* rope_freqs.weight (Llama 3.1's long-context factors), NULL: all 1 */
	uint64_t model_id; /* XXH3 of the hyper-parameters, the rope scaling and every tensor's bytes */
	char err[320];
};

/* Loads and validates; on failure m->err says why. */
int llama_load(struct llama *m, const char *path);
void llama_free(struct llama *m);
/* Drops the VNNI-packed weight copies: the model then runs the 16-bit-activation kernels (the
 * reference the int8 path is checked against). */
void llama_unpack(struct llama *m);
/* Pool geometry for this model (f32 cache unless overridden by the caller). */
void llama_geometry(const struct llama *m, uint32_t block_size, uint32_t num_blocks, struct pkv_geometry *geo);

/* Per-connection forward state: activation buffers (Q/K/V/O from the attention side's memory). */
struct llama_ctx {
	const struct llama *m;
	struct pkv_attn *attn;
	struct tpool *tp;
	uint32_t cap_tokens;
	float *x, *xb, *hb, *hb2, *rope;
	float *q, *k, *v, *o; /* attn->alloc'd */
	struct mm_scratch mm;
};

int llama_ctx_init(struct llama_ctx *c, const struct llama *m, struct pkv_attn *attn, struct tpool *tp,
		   uint32_t max_tokens_per_step);
void llama_ctx_free(struct llama_ctx *c);

/*
 * One forward pass = one attention step: seqs[i] gets n_new[i] tokens at positions pos0[i]...
 * (pos0 = tokens already cached for it). Writes logits [n_seqs][n_vocab] for each sequence's last
 * token, or [total tokens][n_vocab] when all_logits. Returns 0 or -errno (from the step: -ENOSPC...).
 */
int llama_forward(struct llama_ctx *c, const uint32_t *seqs, const uint32_t *n_new, const uint32_t *pos0,
		  const int32_t *tokens, uint32_t n_seqs, float *logits, int all_logits);

#endif
