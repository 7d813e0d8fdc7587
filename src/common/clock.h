/* SPDX-License-Identifier: MIT */
/* The monotonic clock in nanoseconds: the one helper every timer, deadline and benchmark in the tree uses. */
#ifndef PKV_COMMON_CLOCK_H
#define PKV_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t pkv_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
