/* SPDX-License-Identifier: MIT */
/* The 5-bit and K-quant formats: dequantization equals an independent reference bit for bit, the test
 * quantizer stays within each format's error, and the load-time conversion to Q4_1 / Q8_0 moves no
 * element further than its bound (f16 rounding of the Q4_K products; half a Q8_0 step). */
#include <check.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../examples/llama/gemm_vnni.h"
#include "../../examples/llama/gguf.h"
#include "../../examples/llama/matmul.h"
#include "../../examples/llama/quant.h"
#include "ref_quant_k.h"
#include "../suite_main.h"

static const uint32_t types[] = { GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K };
#define N_TYPES 5
/* worst |x - dequant(quant(x))| for x in [-1, 1]: about one step of the format (Q5_0 maps the signed
 * max to -16, so the other side may clamp by a step; the K formats add their 6/8-bit scale rounding) */
static const float qtol[N_TYPES] = { 0.07f, 0.04f, 0.08f, 0.04f, 0.04f }; /* measured: .062 .033 .066 .032 .034 */

#define N 1024 /* four K super-blocks, 32 Q5 blocks */

static float frand(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (float)((*s >> 8) & 0xffff) / 32768.f - 1.f;
}

/* Row kind k: 0 uniform [-1, 1], 1 all positive, 2 all negative, 3 zeros with spikes, 4 small (|x| < 0.01,
 * as many real weights: the K formats' scales are f16 subnormals there), 5 zero, 6 tiny (|x| < 0.001:
 * even Q8_0's scale is subnormal; the formats' own precision is poor there, so no round-trip bound). */
#define ROW_KINDS 7
static void make_row(int k, unsigned seed, float *x)
{
	for (int i = 0; i < N; i++) {
		float v = frand(&seed);
		x[i] = k == 0 ? v : k == 1 ? 0.5f + 0.5f * fabsf(v) : k == 2 ? -0.25f - 0.75f * fabsf(v) :
		       k == 3 ? (i % 37 == 0 ? v : 0.f) : k == 4 ? v * 1e-2f : k == 6 ? v * 1e-3f : 0.f;
	}
}

static void expect_same_bits(const float *got, const float *want, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(!memcmp(&got[i], &want[i], sizeof *got), "%s elem %zu: %a vs reference %a", what, i,
			      (double)got[i], (double)want[i]);
}

START_TEST(block_geometry_matches_the_format)
{
	uint32_t t = types[_i];
	ck_assert_uint_eq(ggml_type_block_bytes(t), ref_block_bytes(t));
	ck_assert_uint_eq(ggml_type_block_elems(t), ref_block_elems(t));
	ck_assert_uint_eq(pkv_row_bytes(t, N), N / ref_block_elems(t) * ref_block_bytes(t));
	ck_assert_str_ne(ggml_type_name(t), "unknown");
	ck_assert_int_eq(pkv_quant_row(t, (float[512]){ 0 }, (uint8_t[1024]){ 0 }, ref_block_elems(t) / 2 * 3), -EINVAL);
}
END_TEST

/* Rows the test quantizer wrote read back as the reference reads them, and close to the input. */
START_TEST(quantized_rows_dequantize_like_the_reference)
{
	uint32_t t = types[_i];
	float x[N], got[N], want[N];
	uint8_t row[N * 2];
	for (int k = 0; k < ROW_KINDS; k++) {
		make_row(k, 100u + (unsigned)k, x);
		ck_assert_int_eq(pkv_quant_row(t, x, row, N), 0);
		pkv_dequant_row(t, row, got, N);
		ref_dequant(t, row, want, N);
		expect_same_bits(got, want, N, ggml_type_name(t));
		for (int i = 0; i < N && k != 6; i++)
			ck_assert_msg(fabsf(got[i] - x[i]) <= qtol[_i] * (k == 4 ? 1e-2f : 1.f) + 1e-7f,
				      "%s row kind %d elem %d: %g became %g", ggml_type_name(t), k, i, x[i], got[i]);
	}
}
END_TEST

/* Random block bytes (every bit pattern of quants, scales and mins, incl. negative Q6_K scales and the
 * top 6-bit values), with finite f16 scales: the library reads them as the reference does. */
START_TEST(arbitrary_blocks_dequantize_like_the_reference)
{
	uint32_t t = types[_i];
	size_t bb = ref_block_bytes(t), nb = N / ref_block_elems(t);
	uint8_t row[N * 2];
	float got[N], want[N];
	unsigned s = 77;
	for (int rep = 0; rep < 20; rep++) {
		for (size_t i = 0; i < nb * bb; i++) {
			s = s * 1103515245u + 12345u;
			row[i] = (uint8_t)(s >> 16);
		}
		for (size_t b = 0; b < nb; b++) {
			/* the f16 fields: random sign, mantissa and a finite exponent (subnormals included) */
			size_t at[2] = { t == GGML_Q6_K ? 208 : 0, 2 };
			int nf = t == GGML_Q5_0 || t == GGML_Q6_K ? 1 : 2;
			for (int f = 0; f < nf; f++)
				row[b * bb + at[f] + 1] &= 0xbf; /* exponent < 16: finite, at most 2 */
		}
		pkv_dequant_row(t, row, got, N);
		ref_dequant(t, row, want, N);
		expect_same_bits(got, want, N, ggml_type_name(t));
	}
}
END_TEST

/*
 * Conversion: the converted row dequantizes (as Q4_1 / Q8_0) to within the bound of the original's
 * values, and equals the reference conversion byte for byte.
 */
START_TEST(conversion_stays_within_its_bound)
{
	uint32_t t = types[_i], to = pkv_convert_target(t);
	float x[N], orig[N], conv[N], scratch[N];
	uint8_t row[N * 2], out[N * 2], ref[N * 2];
	ck_assert_uint_eq(to, t == GGML_Q4_K ? GGML_Q4_1 : GGML_Q8_0);
	for (int k = 0; k < ROW_KINDS; k++) {
		make_row(k, 300u + (unsigned)k, x);
		ck_assert_int_eq(pkv_quant_row(t, x, row, N), 0);
		ck_assert_int_eq(pkv_convert_row(t, row, out, N, scratch), 0);
		ref_convert(t, row, ref, N, scratch);
		ck_assert_msg(!memcmp(out, ref, pkv_row_bytes(to, N)), "%s row kind %d: converted bytes differ",
			      ggml_type_name(t), k);
		pkv_dequant_row(t, row, orig, N);
		pkv_dequant_row(to, out, conv, N);
		for (int i = 0; i < N; i++) {
			float bound;
			if (to == GGML_Q4_1) {
				/* only the f16 rounding of the sub-block's step and offset, plus float rounding */
				const uint8_t *b = row + i / 256 * 144;
				int sc, m;
				ref_k_scale_min(b + 4, i % 256 / 32, &sc, &m);
				float step = ref_f16(b) * (float)sc, off = ref_f16(b + 2) * (float)m;
				float rs = pkv_f16_to_f32(pkv_f32_to_f16(step)), ro = pkv_f16_to_f32(pkv_f32_to_f16(-off));
				bound = 15.f * fabsf(step - rs) + fabsf(off + ro) + 4 * FLT_EPSILON * (15.f * step + off);
			} else {
				/* half a step of the stored Q8_0 scale */
				uint16_t h;
				memcpy(&h, out + i / 32 * 34, 2);
				bound = 0.5f * pkv_f16_to_f32(h) * (1 + 4 * FLT_EPSILON);
			}
			ck_assert_msg(fabsf(conv[i] - orig[i]) <= bound, "%s row kind %d elem %d: %g became %g (bound %g)",
				      ggml_type_name(t), k, i, orig[i], conv[i], bound);
		}
	}
	ck_assert_int_eq(pkv_convert_row(t, row, out, ref_block_elems(t) / 2 * 3, scratch), -EINVAL);
}
END_TEST

/* A converted matrix is an ordinary Q4_1 / Q8_0 one: it packs for VNNI where the CPU has it, the matmul
 * equals the float product with the original (dequantized) weights within the conversion's error, and
 * the copy is the matrix's to free. */
START_TEST(converted_matrix_runs_the_fast_paths)
{
	uint32_t t = types[_i], rows = 48, cols = 512, T = 5;
	size_t rb = pkv_row_bytes(t, cols);
	uint8_t *wbytes = malloc(rows * rb);
	float *x = malloc(T * cols * sizeof *x), *y = malloc(T * rows * sizeof *y), *wd = malloc(cols * sizeof *wd);
	unsigned s = 9;
	struct tpool *tp;
	struct mm_scratch sc = { 0 };
	ck_assert_int_eq(tpool_create(2, &tp), 0);
	for (uint32_t r = 0; r < rows; r++) {
		float v[512];
		for (uint32_t c = 0; c < cols; c++)
			v[c] = frand(&s);
		ck_assert_int_eq(pkv_quant_row(t, v, wbytes + r * rb, cols), 0);
	}
	for (uint32_t i = 0; i < T * cols; i++)
		x[i] = frand(&s);
	struct wmat w = { .type = t, .rows = rows, .cols = cols, .row_bytes = rb, .data = wbytes };
	ck_assert_int_eq(pkv_matmul(tp, &sc, &w, x, T, y), -EINVAL); /* no kernel reads K-quants directly */
	ck_assert_int_eq(pkv_wmat_convert(&w), 0);
	ck_assert_uint_eq(w.type, pkv_convert_target(t));
	ck_assert_ptr_eq(w.data, w.converted);
	ck_assert_uint_eq(w.row_bytes, pkv_row_bytes(w.type, cols));
	ck_assert_int_eq(pkv_wmat_pack(&w), 0);
	const char *isa = getenv("PKV_ISA");
	if (pkv_vnni_available() && (!isa || !strcmp(isa, "vnni")))
		ck_assert_ptr_nonnull(w.packed);
	ck_assert_int_eq(pkv_matmul(tp, &sc, &w, x, T, y), 0);
	for (uint32_t i = 0; i < T; i++)
		for (uint32_t r = 0; r < rows; r++) {
			double ref = 0, mag = 0, amax = 0;
			pkv_dequant_row(t, wbytes + r * rb, wd, cols);
			for (uint32_t c = 0; c < cols; c++) {
				ref += (double)wd[c] * x[i * cols + c];
				mag += fabs((double)wd[c] * x[i * cols + c]);
				amax = fmax(amax, fabs(wd[c]));
			}
			/* conversion moves each weight by at most ~amax / 254 (Q8_0) and the packed path rounds
			 * activations to 8 bits (1/254 of their block max): a few per mille of the magnitude */
			ck_assert_msg(fabs(y[i * rows + r] - ref) <= 1e-2 * mag, "%s [%u,%u]: %g vs %g (mag %g)",
				      ggml_type_name(t), i, r, y[i * rows + r], ref, mag);
		}
	pkv_wmat_unpack(&w);
	pkv_wmat_free_converted(&w);
	ck_assert_ptr_null(w.converted);
	pkv_mm_scratch_free(&sc);
	tpool_destroy(tp);
	free(wbytes);
	free(x);
	free(y);
	free(wd);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("quant_k");
	TCase *tc = tcase_create("formats");
	tcase_add_loop_test(tc, block_geometry_matches_the_format, 0, N_TYPES);
	tcase_add_loop_test(tc, quantized_rows_dequantize_like_the_reference, 0, N_TYPES);
	tcase_add_loop_test(tc, arbitrary_blocks_dequantize_like_the_reference, 0, N_TYPES);
	tcase_add_loop_test(tc, conversion_stays_within_its_bound, 0, N_TYPES);
	tcase_add_loop_test(tc, converted_matrix_runs_the_fast_paths, 0, N_TYPES);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
