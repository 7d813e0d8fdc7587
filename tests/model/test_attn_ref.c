/* SPDX-License-Identifier: MIT */
/* The in-process attention (attn_ref.c) equals softmax(q k^T / sqrt(d)) v computed here in double,
 * causal within a step, for the head sizes its AVX-512 rows serve (64, 128) and one they do not,
 * on its fast path and with PKV_ISA=scalar. */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "../../examples/llama/attn.h"
#include "../suite_main.h"

static float frand(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (float)((*s >> 8) & 0xffff) / 32768.f - 1.f;
}

static const uint32_t dims[] = { 64, 128, 48 };

START_TEST(attention_equals_double_reference)
{
	uint32_t D = dims[_i % 3], H = 4, KH = 2, T = 37; /* 37: a masked tail of 16-wide exp blocks */
	if (_i >= 3)
		setenv("PKV_ISA", "scalar", 1);
	struct pkv_geometry geo = { .num_layers = 1, .num_heads = H, .num_kv_heads = KH, .head_dim = D,
				    .cache_dtype = PKV_DTYPE_F32, .block_size = 16 };
	struct pkv_attn a;
	ck_assert_int_eq(pkv_attn_ref_create(&geo, 0, NULL, &a), 0);
	size_t qn = (size_t)T * H * D, kn = (size_t)T * KH * D;
	float *q = malloc(qn * 4), *k = malloc(kn * 4), *v = malloc(kn * 4), *o = malloc(qn * 4);
	int32_t tok[37] = { 0 };
	unsigned s = 3 + _i;
	for (size_t i = 0; i < qn; i++)
		q[i] = 3.f * frand(&s);
	for (size_t i = 0; i < kn; i++) {
		k[i] = frand(&s);
		v[i] = frand(&s);
	}
	uint32_t seq, nc;
	ck_assert_int_eq(a.ops->seq_open(a.ctx, tok, T, &seq, &nc), 0);
	ck_assert_uint_eq(nc, 0);
	ck_assert_int_eq(a.ops->step_begin(a.ctx, &seq, &T, tok, 1), 0);
	ck_assert_int_eq(a.ops->attend(a.ctx, 0, q, k, v, o), 0);
	ck_assert_int_eq(a.ops->step_end(a.ctx), 0);
	double sc[37];
	for (uint32_t t = 0; t < T; t++)
		for (uint32_t h = 0; h < H; h++) {
			const float *qv = q + ((size_t)t * H + h) * D;
			uint32_t kh = h / (H / KH);
			double mx = -INFINITY, sum = 0;
			for (uint32_t j = 0; j <= t; j++) {
				double d = 0;
				for (uint32_t c = 0; c < D; c++)
					d += (double)qv[c] * k[((size_t)j * KH + kh) * D + c];
				sc[j] = d / sqrt((double)D);
				mx = fmax(mx, sc[j]);
			}
			for (uint32_t j = 0; j <= t; j++)
				sum += sc[j] = exp(sc[j] - mx);
			for (uint32_t c = 0; c < D; c++) {
				double want = 0;
				for (uint32_t j = 0; j <= t; j++)
					want += sc[j] / sum * v[((size_t)j * KH + kh) * D + c];
				float got = o[((size_t)t * H + h) * D + c];
				ck_assert_msg(fabs(got - want) <= 1e-5, "D %u t %u h %u c %u: %g vs %g", D, t, h, c, got, want);
			}
		}
	pkv_attn_destroy(&a);
	free(q);
	free(k);
	free(v);
	free(o);
}
END_TEST

int main(void)
{
	Suite *su = suite_create("attn_ref");
	TCase *tc = tcase_create("rows");
	tcase_add_loop_test(tc, attention_equals_double_reference, 0, 6);
	suite_add_tcase(su, tc);
	return suite_main(su);
}
