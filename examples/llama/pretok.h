/* SPDX-License-Identifier: MIT */
/*
 * Pre-tokenizers of byte-level BPE: the split of text into pieces that the merges never cross.
 * Each model family has its own (digits alone or in threes, contractions, a symbol glued to the
 * next word, line breaks), and text split the wrong way tokenizes differently with no error, so a
 * tokenizer names its own in tokenizer.ggml.pre and unknown names are refused.
 */
#ifndef PKV_EX_PRETOK_H
#define PKV_EX_PRETOK_H

#include <stddef.h>

enum pretok {
	PRETOK_SMOLLM, /* every digit alone, then the GPT-2 pattern (SmolLM, SmolLM2) */
	PRETOK_GPT2,   /* the GPT-2 pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
	PRETOK_LLAMA3, /* Llama 3: one symbol may lead a word, digits in threes, line breaks kept together */
	PRETOK_QWEN2,  /* Llama 3's pattern with every digit alone (Qwen2, Qwen2.5) */
};

/* The kind a tokenizer.ggml.pre value names (llama.cpp's names and their aliases), or -1. */
int pretok_by_name(const char *name, size_t len);

/* The kinds whose whole piece, when it is a token itself, is taken without merges (HF ignore_merges). */
int pretok_ignores_merges(enum pretok kind);

typedef void pretok_emit(void *ctx, const char *piece, size_t len);

/* Calls emit for each piece of s, in order; the pieces cover s exactly. */
void pretok_split(enum pretok kind, const char *s, size_t len, pretok_emit *emit, void *ctx);

#endif
