/* SPDX-License-Identifier: MIT */
/* Sampling: greedy is argmax, seeds reproduce, top-k/top-p restrict the support, and temperature
 * sampling follows softmax(logits / T). */
#include <check.h>
#include <math.h>
#include <stdint.h>

#include "../../examples/llama/sampler.h"
#include "../suite_main.h"

static const float logits[6] = { 1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.9f };

START_TEST(greedy_is_argmax)
{
	struct sampler s;
	sampler_init(&s, 0, 0, 1, 7);
	for (int i = 0; i < 10; i++)
		ck_assert_int_eq(sampler_pick(&s, logits, 6), 1);
}
END_TEST

START_TEST(same_seed_same_choices)
{
	struct sampler a, b;
	sampler_init(&a, 1.0f, 0, 1, 42);
	sampler_init(&b, 1.0f, 0, 1, 42);
	int differ = 0;
	for (int i = 0; i < 200; i++)
		ck_assert_int_eq(sampler_pick(&a, logits, 6), sampler_pick(&b, logits, 6));
	sampler_init(&b, 1.0f, 0, 1, 43);
	sampler_init(&a, 1.0f, 0, 1, 42);
	for (int i = 0; i < 200; i++)
		differ += sampler_pick(&a, logits, 6) != sampler_pick(&b, logits, 6);
	ck_assert_int_gt(differ, 0);
}
END_TEST

START_TEST(top_k_and_top_p_restrict_support)
{
	struct sampler s;
	sampler_init(&s, 2.0f, 2, 1, 5); /* only tokens 1 and 5 */
	for (int i = 0; i < 500; i++) {
		int32_t t = sampler_pick(&s, logits, 6);
		ck_assert(t == 1 || t == 5);
	}
	sampler_init(&s, 1.0f, 0, 0.05f, 5); /* the nucleus is the top token alone */
	for (int i = 0; i < 100; i++)
		ck_assert_int_eq(sampler_pick(&s, logits, 6), 1);
}
END_TEST

START_TEST(temperature_follows_softmax)
{
	struct sampler s;
	int count[6] = { 0 };
	const int n = 60000;
	double z = 0, p[6];
	sampler_init(&s, 1.5f, 0, 1, 11);
	for (int i = 0; i < n; i++)
		count[sampler_pick(&s, logits, 6)]++;
	for (int i = 0; i < 6; i++)
		z += exp(logits[i] / 1.5);
	for (int i = 0; i < 6; i++) {
		p[i] = exp(logits[i] / 1.5) / z;
		double sd = sqrt(n * p[i] * (1 - p[i]));
		ck_assert_msg(fabs(count[i] - n * p[i]) < 5 * sd + 1, "token %d: %d draws, expected %.0f", i, count[i],
			      n * p[i]);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sampler");
	TCase *tc = tcase_create("sampling");
	tcase_add_test(tc, greedy_is_argmax);
	tcase_add_test(tc, same_seed_same_choices);
	tcase_add_test(tc, top_k_and_top_p_restrict_support);
	tcase_add_test(tc, temperature_follows_softmax);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
