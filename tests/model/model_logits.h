/* SPDX-License-Identifier: MIT */
/* Runs a model file on n pseudo-random tokens through a fresh in-process cache (model tests). */
#ifndef PKV_TEST_MODEL_LOGITS_H
#define PKV_TEST_MODEL_LOGITS_H

#include <stdint.h>

/*
 * Logits of every position (n x *vocab floats, malloc'd) of n <= 64 tokens drawn from seed, or
 * NULL with the reason on stderr. *model_id (may be NULL) receives the file's fingerprint.
 */
float *model_logits(const char *path, uint32_t n, unsigned seed, uint32_t *vocab, uint64_t *model_id);

#endif
