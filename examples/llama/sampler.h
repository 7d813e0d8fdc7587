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
};

void sampler_init(struct sampler *s, float temperature, uint32_t top_k, float top_p, uint64_t seed);
/* Picks a token from n logits (greedy when temperature <= 0). */
int32_t sampler_pick(struct sampler *s, const float *logits, uint32_t n);
int32_t argmax(const float *v, uint32_t n);

#endif
