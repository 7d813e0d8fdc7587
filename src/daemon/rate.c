/* SPDX-License-Identifier: MIT */
/* The worker's estimate of a pool's backend speed (rate.h). */
#include "config.h"
#include <math.h>
#include "daemon/rate.h"

/*
 * Before a pool has measured its own: about what one CPU thread of the f32
 * reference costs, on the slow side, so that a first long attend is cut too
 * finely rather than too coarsely; and a tiny CPU decode call's fixed cost.
 */
#define NS_PER_UNIT_GUESS 1.0
#define CALL_NS_GUESS 5000.0
/*
 * A call's time is wall time, and the worker may be preempted inside it (8
 * clients on 2 CPUs: whole milliseconds), which only ever adds: one sample
 * raises an estimate to at most this many times itself. Taken whole, one
 * preempted call left the rate ~100x the truth; every decode attend then
 * looked longer than a slice and ran as key pieces of a few keys, too small
 * to teach the rate, so it never came down (8 SmolLM2 clients: 5 pieces per
 * attend and no merging, for the daemon's life).
 */
#define SAMPLE_RISE_MAX 2.0

double rate_ns_per_unit(const struct attend_rate *r)
{
	return r->ns_per_unit > 0 ? r->ns_per_unit : NS_PER_UNIT_GUESS;
}

double rate_call_ns(const struct attend_rate *r)
{
	return r->call_ns;
}

/* An exponential average (weight w for the sample) whose sample counts for at most SAMPLE_RISE_MAX x cur. */
static double learn(double cur, double sample, double w)
{
	if (sample > SAMPLE_RISE_MAX * cur)
		sample = SAMPLE_RISE_MAX * cur;
	return (1.0 - w) * cur + w * sample;
}

void rate_measured(struct attend_rate *r, double units, uint64_t ns)
{
	if (units < RATE_UNITS_TO_MEASURE) {
		double fixed = (double)ns - units * rate_ns_per_unit(r);

		r->call_ns = learn(r->call_ns > 0 ? r->call_ns : CALL_NS_GUESS, fixed > 0 ? fixed : 0, 0.125);
		return;
	}
	r->ns_per_unit = learn(rate_ns_per_unit(r), (double)ns / units, 0.25);
}

double rate_piece_keys(double width, double budget, uint32_t align)
{
	/* A piece too small to teach the rate, cut by an estimate too high, would keep it there. */
	double least = ceil(RATE_UNITS_TO_MEASURE / width / align) * align;
	double keys = floor(budget / width / align) * align;

	return keys < least ? least : keys;
}
