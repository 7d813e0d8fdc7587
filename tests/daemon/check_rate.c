/* SPDX-License-Identifier: MIT */
/*
 * The worker's estimate of a backend's speed (src/daemon/rate.c) against a
 * simulated backend, through the worker's own feedback: an attend that
 * looks longer than a slice runs as key pieces sized by the estimate, and
 * those calls are what the estimate learns from next.
 */
#include "config.h"
#include <check.h>
#include <math.h>
#include "daemon/rate.h"
#include "../suite_main.h"

/* A SmolLM2 decode row (9 heads x 64) on a CPU backend: 5 µs per call and 0.4 ns per unit. */
#define WIDTH 576.0
#define FIXED_NS 5000.0
#define TRUE_NS_PER_UNIT 0.4
#define SLICE_NS 500000.0

static uint64_t backend_ns(double units)
{
	return (uint64_t)(FIXED_NS + units * TRUE_NS_PER_UNIT);
}

/* What the rate reads for calls of keys keys, fixed cost included. */
static double seen_rate(double keys)
{
	return (double)backend_ns(keys * WIDTH) / (keys * WIDTH);
}

/*
 * One decode row over keys keys, as the worker runs it: one call when its
 * estimate fits a slice, else key pieces of what the estimate says fits
 * one. Returns the calls it took.
 */
static int run_row(struct attend_rate *r, double keys)
{
	double units = keys * WIDTH;
	int calls = 0;

	if (units * rate_ns_per_unit(r) <= SLICE_NS) {
		rate_measured(r, units, backend_ns(units));
		return 1;
	}
	for (double done = 0; done < keys; calls++) {
		double k = rate_piece_keys(WIDTH, SLICE_NS / rate_ns_per_unit(r), 1);

		if (k > keys - done)
			k = keys - done;
		rate_measured(r, k * WIDTH, backend_ns(k * WIDTH));
		done += k;
	}
	return calls;
}

START_TEST(test_preempted_first_call_does_not_stick)
{
	/* The pool's first timed call: 50 keys, the worker preempted inside it for 5 ms. */
	struct attend_rate r = { 0 };
	int calls = 0;

	rate_measured(&r, 50 * WIDTH, 5000000);
	for (int i = 0; i < 64; i++)
		calls = run_row(&r, 50);
	ck_assert_int_eq(calls, 1);
	ck_assert_double_le(rate_ns_per_unit(&r), 1.1 * seen_rate(50));
}
END_TEST

START_TEST(test_preempted_call_raises_the_estimate_boundedly)
{
	struct attend_rate r = { 0 };
	double before, after;

	for (int i = 0; i < 100; i++)
		run_row(&r, 50);
	before = rate_ns_per_unit(&r);
	ck_assert_double_le(fabs(before - seen_rate(50)), 0.05 * seen_rate(50));
	rate_measured(&r, 50 * WIDTH, 20000000); /* 20 ms */
	after = rate_ns_per_unit(&r);
	ck_assert_double_le(after, 2 * before);
	/* Every row still one call, and back within 10 % in 16 rows. */
	for (int i = 0; i < 16; i++)
		ck_assert_int_eq(run_row(&r, 50), 1);
	ck_assert_double_le(rate_ns_per_unit(&r), 1.1 * before);
}
END_TEST

START_TEST(test_a_slow_backend_is_learned)
{
	/* 20x the guess: rises are bounded per sample, not forbidden. */
	struct attend_rate r = { 0 };

	for (int i = 0; i < 64; i++)
		rate_measured(&r, 50000, 50000 * 20);
	ck_assert_double_le(fabs(rate_ns_per_unit(&r) - 20.0), 1.0);
}
END_TEST

START_TEST(test_a_long_row_still_runs_in_pieces)
{
	/* 64 K keys x 576 at 0.4 ns: ~15 ms, thirty slices. */
	struct attend_rate r = { 0 };
	int calls = 0;

	for (int i = 0; i < 8; i++)
		calls = run_row(&r, 65536);
	ck_assert_int_ge(calls, 20);
	ck_assert_int_le(calls, 60);
}
END_TEST

START_TEST(test_small_calls_teach_the_fixed_cost)
{
	struct attend_rate r = { 0 };

	for (int i = 0; i < 64; i++)
		rate_measured(&r, 1000, (uint64_t)(FIXED_NS + 1000 * rate_ns_per_unit(&r)));
	ck_assert_double_le(fabs(rate_call_ns(&r) - FIXED_NS), 0.05 * FIXED_NS);
	rate_measured(&r, 1000, 10000000); /* preempted */
	ck_assert_double_le(rate_call_ns(&r), 1.2 * FIXED_NS);
}
END_TEST

START_TEST(test_every_piece_teaches_the_rate)
{
	static const double widths[] = { 64, 576, 4096, 65536 };
	static const uint32_t aligns[] = { 1, 16, 4096 };

	for (unsigned w = 0; w < 4; w++)
		for (unsigned a = 0; a < 3; a++) {
			double k = rate_piece_keys(widths[w], 1.0, aligns[a]);

			ck_assert_double_ge(k * widths[w], RATE_UNITS_TO_MEASURE);
			ck_assert_double_eq(fmod(k, aligns[a]), 0);
			/* A budget of many pieces: what fits it, on align. */
			k = rate_piece_keys(widths[w], 1e9, aligns[a]);
			ck_assert_double_le(k * widths[w], 1e9);
			ck_assert_double_eq(fmod(k, aligns[a]), 0);
		}
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("daemon-rate");
	TCase *t = tcase_create("rate");

	tcase_add_test(t, test_preempted_first_call_does_not_stick);
	tcase_add_test(t, test_preempted_call_raises_the_estimate_boundedly);
	tcase_add_test(t, test_a_slow_backend_is_learned);
	tcase_add_test(t, test_a_long_row_still_runs_in_pieces);
	tcase_add_test(t, test_small_calls_teach_the_fixed_cost);
	tcase_add_test(t, test_every_piece_teaches_the_rate);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return suite_main(suite());
}
