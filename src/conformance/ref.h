/* SPDX-License-Identifier: MIT */
/* The one reference attention of the tree: a query row against its keys, in double (DESIGN §3). */
#ifndef PKV_REF_H
#define PKV_REF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element x of key or value j, as the caller stores them (a paged cache, a generator, ...). */
typedef double (*pkv_ref_elem_fn)(const void *ctx, uint32_t j, uint32_t x);

/*
 * out[x] = sum_j softmax_j(s_j) * value(j, x) over keys j in [0, n), where
 * s_j = scale * q . key(j), replaced by softcap * tanh(s_j / softcap) when
 * softcap > 0. n == 0 (a query that sees no key) gives zeros. The caller
 * picks which keys a query sees (causality, window) and maps j to them.
 * Returns 0, or -1 when out of memory.
 */
int pkv_ref_attend_row(const double *q, uint32_t dim, uint32_t n, pkv_ref_elem_fn key, pkv_ref_elem_fn value,
		       const void *ctx, double scale, double softcap, double *out);

/*
 * The same, and *lse = log(sum_j exp(s_j)), the softmax's log-sum-exp
 * (pkv_attn_batch.softmax_lse): -INFINITY when n == 0. lse may be NULL.
 */
int pkv_ref_attend_row_lse(const double *q, uint32_t dim, uint32_t n, pkv_ref_elem_fn key, pkv_ref_elem_fn value,
			   const void *ctx, double scale, double softcap, double *out, double *lse);

#ifdef __cplusplus
}
#endif
#endif
