/* SPDX-License-Identifier: MIT */
/*
 * What the worker knows of a pool's backend speed: time per unit of attend
 * work (query-key pairs x num_heads x head_dim) and the fixed cost of one
 * call, learned from the calls it times. Slices, key pieces and merges are
 * sized by them. Pure arithmetic, no I/O (tests/daemon/check_rate.c).
 */
#ifndef PKV_DAEMON_RATE_H
#define PKV_DAEMON_RATE_H

#include <stdint.h>

/* Calls smaller than this are mostly fixed cost: they teach the fixed cost, not the rate. */
#define RATE_UNITS_TO_MEASURE 16384.0

struct attend_rate {
	double ns_per_unit; /* 0 until measured */
	double call_ns;     /* 0 until measured */
};

/* The pool's ns per unit: measured, or a guess on the slow side before the first call. */
double rate_ns_per_unit(const struct attend_rate *r);
/* The fixed cost of one call (what merging two attends saves); 0 before the first small call. */
double rate_call_ns(const struct attend_rate *r);
/* Learns from one call of units that took ns of wall time. */
void rate_measured(struct attend_rate *r, double units, uint64_t ns);
/*
 * Keys of one key piece of a row width units wide: what fits budget units,
 * a multiple of align, and never fewer than a call that teaches the rate.
 */
double rate_piece_keys(double width, double budget, uint32_t align);

#endif
