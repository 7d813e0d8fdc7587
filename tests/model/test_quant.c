/* SPDX-License-Identifier: MIT */
/* Weight formats and kernels: conversions, quantization error bounds, SIMD dots equal the scalar ones,
 * and the threaded matmul equals a dequantized float reference. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../examples/llama/gguf.h"
#include "../../examples/llama/matmul.h"
#include "../../examples/llama/quant.h"
#include "../suite_main.h"

static float frand(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (float)((*s >> 8) & 0xffff) / 32768.f - 1.f;
}

START_TEST(f16_round_trips_exactly)
{
	for (uint32_t h = 0; h < 65536; h++) {
		if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
			continue; /* NaN payloads need not survive */
		ck_assert_uint_eq(pkv_f32_to_f16(pkv_f16_to_f32((uint16_t)h)), h);
	}
	ck_assert(pkv_f16_to_f32(pkv_f32_to_f16(1.f / 3.f)) == 0.333251953125f);
	ck_assert(pkv_bf16_to_f32(pkv_f32_to_bf16(1.5f)) == 1.5f);
}
END_TEST

static const uint32_t types[] = { GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1 };
/* worst relative row error of quantize->dequantize for values in [-1, 1] */
static const float qtol[] = { 0, 1e-3f, 8e-3f, 1e-2f, 0.15f, 0.08f };

START_TEST(quantize_dequantize_within_format_error)
{
	uint32_t t = types[_i];
	unsigned s = 7;
	float x[256], y[256];
	uint8_t row[1024];
	for (int i = 0; i < 256; i++)
		x[i] = frand(&s);
	ck_assert_int_eq(pkv_quant_row(t, x, row, 256), 0);
	pkv_dequant_row(t, row, y, 256);
	for (int i = 0; i < 256; i++)
		ck_assert_msg(fabsf(x[i] - y[i]) <= qtol[_i] + 1e-7f, "%s elem %d: %f vs %f", ggml_type_name(t), i, x[i], y[i]);
}
END_TEST

/* Each ISA's dot equals the dequantized float dot (activations quantized to 16 bits). */
START_TEST(simd_dots_match_float_reference)
{
	const struct pkv_dot_ops *isas[3] = { pkv_dot_ops_scalar(), pkv_dot_ops_avx2(), pkv_dot_ops_avx512() };
	uint32_t t = types[_i];
	unsigned s = 11;
	size_t n = 576;
	float w[576], x[576], wd[576];
	uint8_t row[4096];
	struct blk_a8 xa[576 / 32];
	for (size_t i = 0; i < n; i++) {
		w[i] = frand(&s);
		x[i] = frand(&s) * (i % 97 == 0 ? 300.f : 1.f); /* outlier channels like SmolLM2's */
	}
	ck_assert_int_eq(pkv_quant_row(t, w, row, n), 0);
	pkv_dequant_row(t, row, wd, n);
	double ref = 0, mag = 0;
	for (size_t i = 0; i < n; i++) {
		ref += (double)wd[i] * x[i];
		mag += fabs((double)wd[i] * x[i]);
	}
	pkv_quant_act(x, xa, n);
	for (int k = 0; k < 3; k++) {
		const struct pkv_dot_ops *o = isas[k];
		float v;
		if (!o)
			continue;
		switch (t) {
		case GGML_Q4_0: v = o->q4_0(row, xa, n / 32); break;
		case GGML_Q4_1: v = o->q4_1(row, xa, n / 32); break;
		case GGML_Q8_0: v = o->q8_0(row, xa, n / 32); break;
		case GGML_F16: v = o->f16((const uint16_t *)row, x, n); break;
		case GGML_BF16: v = o->bf16((const uint16_t *)row, x, n); break;
		default: v = o->f32((const float *)row, x, n); break;
		}
		ck_assert_msg(fabs(v - ref) <= 1e-4 * mag, "%s on %s: %f vs %f", ggml_type_name(t), o->isa, v, ref);
	}
}
END_TEST

START_TEST(threaded_matmul_matches_rowwise)
{
	uint32_t t = types[_i];
	unsigned s = 5;
	uint32_t rows = 37, cols = 96, T = 5;
	size_t rb = pkv_row_bytes(t, cols);
	uint8_t *wbytes = malloc(rows * rb);
	float *x = malloc(T * cols * sizeof *x), *y = malloc(T * rows * sizeof *y), wr[96];
	struct tpool *tp;
	struct mm_scratch sc = { 0 };
	ck_assert_int_eq(tpool_create(2, &tp), 0);
	for (uint32_t r = 0; r < rows; r++) {
		float v[96];
		for (uint32_t c = 0; c < cols; c++)
			v[c] = frand(&s);
		pkv_quant_row(t, v, wbytes + r * rb, cols);
	}
	for (uint32_t i = 0; i < T * cols; i++)
		x[i] = frand(&s);
	struct wmat w = { .type = t, .rows = rows, .cols = cols, .row_bytes = rb, .data = wbytes };
	ck_assert_int_eq(pkv_matmul(tp, &sc, &w, x, T, y), 0);
	for (uint32_t i = 0; i < T; i++)
		for (uint32_t r = 0; r < rows; r++) {
			double ref = 0, mag = 0;
			pkv_wmat_row(&w, r, wr);
			for (uint32_t c = 0; c < cols; c++) {
				ref += (double)wr[c] * x[i * cols + c];
				mag += fabs((double)wr[c] * x[i * cols + c]);
			}
			ck_assert_msg(fabs(y[i * rows + r] - ref) <= 1e-4 * mag + 1e-6, "%s [%u,%u]", ggml_type_name(t), i, r);
		}
	pkv_mm_scratch_free(&sc);
	tpool_destroy(tp);
	free(wbytes);
	free(x);
	free(y);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("quant");
	TCase *tc = tcase_create("kernels");
	tcase_add_test(tc, f16_round_trips_exactly);
	tcase_add_loop_test(tc, quantize_dequantize_within_format_error, 0, 6);
	tcase_add_loop_test(tc, simd_dots_match_float_reference, 0, 6);
	tcase_add_loop_test(tc, threaded_matmul_matches_rowwise, 0, 6);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
