/* SPDX-License-Identifier: MIT */
/* The repetition penalty pkv-demo uses: each distinct recent token once, sign-aware, off at 1. */
#include <check.h>

#include "../../examples/llama/sampler.h"
#include "../suite_main.h"

START_TEST(penalises_each_recent_token_once)
{
	struct sampler s;
	float lg[4] = { 2, -2, 1, 3 };
	const int32_t recent[] = { 0, 1, 0, 0, 7, -1 }; /* 7 and -1 are not tokens of a 4-word vocabulary */

	sampler_init(&s, 0.2f, 0, 0.9f, 1);
	s.repeat_penalty = 2;
	sampler_penalize(&s, lg, 4, recent, 6);
	ck_assert_float_eq(lg[0], 1);   /* positive: divided, once despite three occurrences */
	ck_assert_float_eq(lg[1], -4);  /* negative: multiplied */
	ck_assert_float_eq(lg[2], 1);
	ck_assert_float_eq(lg[3], 3);
	ck_assert_int_eq(sampler_pick(&(struct sampler){ .temperature = 0 }, lg, 4), 3);
}
END_TEST

START_TEST(off_by_default)
{
	struct sampler s;
	float lg[2] = { 2, -2 };
	const int32_t recent[] = { 0, 1 };

	sampler_init(&s, 0, 0, 1, 1);
	sampler_penalize(&s, lg, 2, recent, 2);
	ck_assert_float_eq(lg[0], 2);
	ck_assert_float_eq(lg[1], -2);
}
END_TEST

int main(void)
{
	Suite *su = suite_create("repeat-penalty");
	TCase *tc = tcase_create("sampler");
	tcase_add_test(tc, penalises_each_recent_token_once);
	tcase_add_test(tc, off_by_default);
	suite_add_tcase(su, tc);
	return suite_main(su);
}
