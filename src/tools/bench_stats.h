/* SPDX-License-Identifier: MIT */
/* The order statistics every pkv-bench benchmark reports: doubles sorted, their median. */
#ifndef PKV_BENCH_STATS_H
#define PKV_BENCH_STATS_H

#include <stddef.h>
#include <stdlib.h>

static inline int bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Sorts v in place; an even count gives the mean of the middle two. */
static inline double bench_median(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), bench_cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
