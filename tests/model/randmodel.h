/* SPDX-License-Identifier: MIT */
/* Writes a small llama-family GGUF with random weights (and a byte-level SentencePiece vocabulary). */
#ifndef PKV_EX_RANDMODEL_H
#define PKV_EX_RANDMODEL_H

#include <stddef.h>
#include <stdint.h>

struct randmodel_params {
	const char *arch;    /* general.architecture and the key prefix; NULL: "llama" */
	int qkv_bias;        /* write Q, K and V biases (qwen2) */
	uint32_t dim, n_layers, n_heads, n_kv_heads, ffn, n_vocab;
	uint32_t wtype;      /* GGML type of the matrices (norms stay F32) */
	int tied;            /* no output.weight: logits use token_embd */
	float rope_base;
	const char *rope_scaling; /* llama.rope.scaling.type with rope_factor, or NULL */
	float rope_factor;
	const float *rope_freqs;  /* rope_freqs.weight, head_dim/2 values, or NULL */
	uint64_t seed;
	/* Optional: each matrix row, once quantized to wtype, is rewritten by restore into store_type
	 * (n elements, 0 or -errno) and stored so: the same model in another representation. */
	int (*restore)(uint32_t wtype, const void *row, uint32_t store_type, void *out, size_t n);
	uint32_t store_type;
};

/* 0 or -errno. */
int randmodel_write(const char *path, const struct randmodel_params *p);

#endif
