/* SPDX-License-Identifier: MIT */
/* Token sampling: greedy, or temperature with top-k and top-p, from a seeded generator. */
#ifndef PKV_EX_SAMPLER_H
#define PKV_EX_SAMPLER_H

#include <stdint.h>

struct sampler {
	float temperature; /* <= 0: greedy */
	uint32_t top_k;    /* 0: off */
	float top_p;       /* >= 1: off */
	uint64_t rng;      /* xorshift state, from the seed */
	float repeat_penalty; /* > 1: recent tokens' logits are divided (positive) or multiplied by it */
};

void sampler_init(struct sampler *s, float temperature, uint32_t top_k, float top_p, uint64_t seed);
/* The repetition penalty over `recent` (each distinct token once, as llama.cpp's repeat_penalty):
 * a no-op unless repeat_penalty > 1. Set s->repeat_penalty after sampler_init. */
void sampler_penalize(const struct sampler *s, float *logits, uint32_t n, const int32_t *recent, uint32_t n_recent);
/* Picks a token from n logits (greedy when temperature <= 0). */
int32_t sampler_pick(struct sampler *s, const float *logits, uint32_t n);
int32_t argmax(const float *v, uint32_t n);

#endif
