/* SPDX-License-Identifier: MIT */
/* Sampling over logits: greedy argmax, or softmax(logits / T) restricted to top-k and the top-p nucleus. */
#include "sampler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

struct cand {
	float p;
	int32_t id;
};

void sampler_init(struct sampler *s, float temperature, uint32_t top_k, float top_p, uint64_t seed)
{
	s->temperature = temperature;
	s->top_k = top_k;
	s->top_p = top_p;
	s->rng = seed ? seed : 0x9e3779b97f4a7c15ull;
	s->repeat_penalty = 1;
}

void sampler_penalize(const struct sampler *s, float *logits, uint32_t n, const int32_t *recent, uint32_t n_recent)
{
	if (!(s->repeat_penalty > 1))
		return;
	for (uint32_t i = 0; i < n_recent; i++) {
		int32_t t = recent[i];
		uint32_t j;
		for (j = 0; j < i && recent[j] != t; j++)
			;
		if (j < i || t < 0 || (uint32_t)t >= n)
			continue; /* seen already, or not a token */
		logits[t] = logits[t] > 0 ? logits[t] / s->repeat_penalty : logits[t] * s->repeat_penalty;
	}
}

static double next_unit(struct sampler *s)
{
	/* xorshift64*: plenty for sampling, and reproducible from the seed */
	s->rng ^= s->rng >> 12;
	s->rng ^= s->rng << 25;
	s->rng ^= s->rng >> 27;
	return (double)((s->rng * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-53;
}

int32_t argmax(const float *v, uint32_t n)
{
	uint32_t b = 0;
	for (uint32_t i = 1; i < n; i++)
		if (v[i] > v[b])
			b = i;
	return (int32_t)b;
}

static int cmp_desc(const void *a, const void *b)
{
	float x = ((const struct cand *)a)->p, y = ((const struct cand *)b)->p;
	return x < y ? 1 : x > y ? -1 : 0;
}

int32_t sampler_pick(struct sampler *s, const float *logits, uint32_t n)
{
	struct cand *c;
	uint32_t m = n;
	float mx;
	double sum = 0, r, acc = 0;
	int32_t out;
	if (s->temperature <= 0 || n == 1)
		return argmax(logits, n);
	c = malloc(n * sizeof *c);
	if (!c)
		return argmax(logits, n); /* degrade to greedy rather than fail a generation */
	mx = logits[argmax(logits, n)];
	for (uint32_t i = 0; i < n; i++) {
		c[i].p = expf((logits[i] - mx) / s->temperature);
		c[i].id = (int32_t)i;
	}
	qsort(c, n, sizeof *c, cmp_desc);
	if (s->top_k && s->top_k < m)
		m = s->top_k;
	for (uint32_t i = 0; i < m; i++)
		sum += c[i].p;
	if (s->top_p > 0 && s->top_p < 1) {
		double cut = s->top_p * sum, run = 0;
		for (uint32_t i = 0; i < m; i++) {
			run += c[i].p;
			if (run >= cut) {
				m = i + 1;
				sum = run;
				break;
			}
		}
	}
	r = next_unit(s) * sum;
	out = c[m - 1].id;
	for (uint32_t i = 0; i < m; i++) {
		acc += c[i].p;
		if (r < acc) {
			out = c[i].id;
			break;
		}
	}
	free(c);
	return out;
}
