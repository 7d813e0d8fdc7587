/* SPDX-License-Identifier: MIT */
/* The int8-activation VNNI kernels: quantization equals the portable reference byte for byte, and the
 * packed 16-row tiles give the reference's integer dot products exactly (unit scales) and its floats
 * (random scales), for every token-group size. Exits 77 without AVX512-VNNI. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../examples/llama/gemm_vnni.h"
#include "../../examples/llama/gguf.h"
#include "../suite_main.h"

static unsigned rnd(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return *s >> 8;
}

static float frand(unsigned *s)
{
	return (float)(rnd(s) & 0xffff) / 32768.f - 1.f;
}

START_TEST(quantized_activations_equal_reference)
{
	unsigned s = 11;
	float x[1024];
	int8_t q1[1024], q2[1024];
	float d1[32], d2[32], s1[32], s2[32];
	for (int i = 0; i < 1024; i++)
		x[i] = frand(&s) * (i % 97 == 0 ? 300.f : 1.f); /* outlier channels, as SmolLM2 has */
	for (int i = 0; i < 32; i++)
		x[i] = 0; /* an all-zero block: scale 0, no division by zero */
	pkv_q8_quant_act(x, 1024, q1, NULL, d1, s1);
	pkv_q8_quant_act_ref(x, 1024, q2, NULL, d2, s2);
	ck_assert_mem_eq(q1, q2, sizeof q1);
	ck_assert_mem_eq(d1, d2, sizeof d1);
	ck_assert_mem_eq(s1, s2, sizeof s1);
	ck_assert_float_eq(d1[0], 0);
	for (int b = 1; b < 32; b++) { /* every block uses its full range */
		int amax = 0;
		for (int j = 0; j < 32; j++)
			amax = abs(q1[b * 32 + j]) > amax ? abs(q1[b * 32 + j]) : amax;
		ck_assert_int_eq(amax, 127);
	}
}
END_TEST

START_TEST(wide_activations_equal_reference)
{
	unsigned s = 13;
	float x[256], d1[8], d2[8], s1[8], s2[8];
	int8_t h1[256], h2[256], l1[256], l2[256];
	for (int i = 0; i < 256; i++)
		x[i] = frand(&s) * (i % 37 == 0 ? 500.f : 1.f);
	pkv_q8_quant_act(x, 256, h1, l1, d1, s1);
	pkv_q8_quant_act_ref(x, 256, h2, l2, d2, s2);
	ck_assert_mem_eq(h1, h2, sizeof h1);
	ck_assert_mem_eq(l1, l2, sizeof l1);
	ck_assert_mem_eq(d1, d2, sizeof d1);
	ck_assert_mem_eq(s1, s2, sizeof s1);
	for (int i = 0; i < 256; i++) { /* 16 bits of precision: within half a step of x */
		float q = (float)(h1[i] * 256 + l1[i]) * d1[i / 32];
		ck_assert_msg(fabsf(q - x[i]) <= 0.5001f * d1[i / 32], "element %d: %g vs %g", i, q, x[i]);
		ck_assert_int_le(abs(h1[i]), 127);
	}
}
END_TEST

static const uint32_t types[] = { GGML_Q4_0, GGML_Q4_1, GGML_Q8_0 };

/* 16 rows of nb blocks with random quant bytes; unit scales when unit, else random ones. */
static void make_rows(uint32_t type, size_t nb, int unit, unsigned *s, uint8_t *rows, size_t *row_bytes)
{
	size_t bs = type == GGML_Q4_0 ? sizeof(struct blk_q4_0) : type == GGML_Q4_1 ? sizeof(struct blk_q4_1) :
										   sizeof(struct blk_q8_0);
	*row_bytes = bs * nb;
	for (size_t i = 0; i < 16 * nb; i++) {
		uint8_t *b = rows + i * bs;
		uint16_t d = pkv_f32_to_f16(unit ? 1.f : frand(s) * 0.05f);
		uint16_t m = pkv_f32_to_f16(unit ? (float)((int)(rnd(s) % 9) - 4) : frand(s) * 0.1f);
		memcpy(b, &d, 2);
		size_t q = 2;
		if (type == GGML_Q4_1) {
			memcpy(b + 2, &m, 2);
			q = 4;
		}
		for (size_t k = q; k < bs; k++)
			b[k] = (uint8_t)rnd(s);
	}
}

START_TEST(packed_tiles_equal_reference_dots)
{
	if (!pkv_vnni_available())
		return;
	uint32_t type = types[_i % 3];
	int unit = _i / 3 % 2, wide = _i >= 6;
	enum { NB = 6, NT = 19 };
	unsigned s = 5 + (unsigned)_i;
	uint8_t rows[16 * NB * 40], packed[16 * NB * 600];
	size_t rb;
	int8_t qs[NT * NB * 32], ql[NT * NB * 32];
	float d[NT * NB], sm[NT * NB], y[NT * 16];
	make_rows(type, NB, unit, &s, rows, &rb);
	ck_assert_uint_le(pkv_vnni_packed_bytes(type, 16, NB * 32), sizeof packed);
	pkv_vnni_pack(type, rows, rb, 16, NB * 32, packed);
	for (int i = 0; i < NT * NB; i++) {
		int sum = 0;
		for (int j = 0; j < 32; j++) {
			qs[i * 32 + j] = (int8_t)((int)(rnd(&s) % 255) - 127);
			ql[i * 32 + j] = (int8_t)((int)(rnd(&s) % 256) - 128);
			sum += wide ? qs[i * 32 + j] * 256 + ql[i * 32 + j] : qs[i * 32 + j];
		}
		d[i] = unit ? 1.f : fabsf(frand(&s)) * 0.02f;
		sm[i] = d[i] * (float)sum;
	}
	for (size_t nt = 1; nt <= NT; nt++) {
		memset(y, 0, sizeof y);
		pkv_vnni_tile(type, packed, NB, qs, wide ? ql : NULL, d, sm, nt, y, 16);
		for (size_t t = 0; t < nt; t++)
			for (int r = 0; r < 16; r++) {
				float want = pkv_q8_dot_ref(type, rows + (size_t)r * rb, qs + t * NB * 32,
							    wide ? ql + t * NB * 32 : NULL, d + t * NB, sm + t * NB, NB);
				if (unit && !wide) /* integer arithmetic below 2^24 on both sides: exact */
					ck_assert_msg(y[t * 16 + (size_t)r] == want, "type %u nt %zu t %zu row %d: %.1f != %.1f",
						      type, nt, t, r, y[t * 16 + (size_t)r], want);
				else
					ck_assert_msg(fabsf(y[t * 16 + (size_t)r] - want) <= 1e-4f * (1 + fabsf(want)),
						      "type %u nt %zu t %zu row %d: %g != %g", type, nt, t, r,
						      y[t * 16 + (size_t)r], want);
			}
	}
}
END_TEST

int main(void)
{
	if (!pkv_vnni_available()) {
		fprintf(stderr, "test_q8act: the CPU has no AVX512-VNNI\n");
		return 77;
	}
	Suite *su = suite_create("q8act");
	TCase *tc = tcase_create("kernels");
	tcase_add_test(tc, quantized_activations_equal_reference);
	tcase_add_test(tc, wide_activations_equal_reference);
	tcase_add_loop_test(tc, packed_tiles_equal_reference_dots, 0, 12);
	suite_add_tcase(su, tc);
	return suite_main(su);
}
