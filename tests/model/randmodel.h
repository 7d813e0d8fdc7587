/* SPDX-License-Identifier: MIT */
/* Writes a small llama GGUF with random weights (and a byte-level SentencePiece vocabulary). */
#ifndef PKV_EX_RANDMODEL_H
#define PKV_EX_RANDMODEL_H

#include <stdint.h>

struct randmodel_params {
	uint32_t dim, n_layers, n_heads, n_kv_heads, ffn, n_vocab;
	uint32_t wtype;      /* GGML type of the matrices (norms stay F32) */
	int tied;            /* no output.weight: logits use token_embd */
	float rope_base;
	uint64_t seed;
};

/* 0 or -errno. */
int randmodel_write(const char *path, const struct randmodel_params *p);

#endif
