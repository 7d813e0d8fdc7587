/* SPDX-License-Identifier: MIT */
/* The one reference attention: pkv-conformance, the daemon tests and the CUDA emulation tests all use it. */
#include <math.h>
#include <stdlib.h>
#include "conformance/ref.h"

int pkv_ref_attend_row(const double *q, uint32_t dim, uint32_t n, pkv_ref_elem_fn key, pkv_ref_elem_fn value,
		       const void *ctx, double scale, double softcap, double *out)
{
	return pkv_ref_attend_row_lse(q, dim, n, key, value, ctx, scale, softcap, out, NULL);
}

int pkv_ref_attend_row_lse(const double *q, uint32_t dim, uint32_t n, pkv_ref_elem_fn key, pkv_ref_elem_fn value,
			   const void *ctx, double scale, double softcap, double *out, double *lse)
{
	double *s, m = -INFINITY, l = 0;
	uint32_t j, x;

	for (x = 0; x < dim; x++)
		out[x] = 0;
	if (lse)
		*lse = -INFINITY;
	if (!n)
		return 0;
	s = malloc(sizeof(double) * n);
	if (!s)
		return -1;
	for (j = 0; j < n; j++) {
		double dot = 0;

		for (x = 0; x < dim; x++)
			dot += q[x] * key(ctx, j, x);
		dot *= scale;
		if (softcap > 0)
			dot = softcap * tanh(dot / softcap);
		s[j] = dot;
		m = dot > m ? dot : m;
	}
	/* Max-subtracted exponentials: the same softmax, without overflow. */
	for (j = 0; j < n; j++) {
		s[j] = exp(s[j] - m);
		l += s[j];
	}
	for (j = 0; j < n; j++)
		for (x = 0; x < dim; x++)
			out[x] += s[j] / l * value(ctx, j, x);
	/* The sum was taken relative to the max: log sum_j e^(s_j) = m + log sum_j e^(s_j - m). */
	if (lse)
		*lse = m + log(l);
	free(s);
	return 0;
}
