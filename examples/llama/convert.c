/* SPDX-License-Identifier: MIT */
/*
 * Load-time conversion of the weight types the kernels do not serve (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)
 * into ones they do (Q4_1, Q8_0). Why convert rather than add kernels: one kernel set stays the only
 * one to optimize and test (scalar, AVX2, AVX-512, and the VNNI packing that pkv_wmat_pack applies to
 * the converted rows afterwards), and these files are read far less often than they are computed with.
 * Cost: the converted copy lives in memory owned by the model and replaces the mapped tensor for
 * compute, so such a model takes its converted size in RAM (plus the mapping, which the kernel may
 * drop). That is fine for the small models this client targets.
 */
#include "matmul.h"
#include "gguf.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

uint32_t pkv_convert_target(uint32_t type)
{
	switch (type) {
	case GGML_Q4_K:
		return GGML_Q4_1;
	case GGML_Q5_0:
	case GGML_Q5_1:
	case GGML_Q5_K:
	case GGML_Q6_K:
		return GGML_Q8_0;
	default:
		return type;
	}
}

/*
 * Each 32-element sub-block of a Q4_K super-block is x = (d * sc) * q - (dmin * m) with q in 0..15:
 * exactly a Q4_1 block (x = d' * q + m') with d' = d * sc and m' = -(dmin * m), except that Q4_1 keeps
 * d' and m' as f16 where Q4_K multiplies them out in f32. So the conversion changes each element by at
 * most q * |d' - f16(d')| + |m' - f16(m')| (f16 rounding, a relative 2^-11 of the step and offset).
 * The nibbles move from Q4_K's order (sub-blocks 2c, 2c+1 share bytes) to Q4_1's (elements i, i+16).
 */
static void q4k_to_q4_1(const uint8_t *src, uint8_t *dst, size_t n)
{
	for (size_t b = 0; b < n / QK_K; b++) {
		struct blk_q4_k k;
		memcpy(&k, src + b * sizeof k, sizeof k);
		float d = pkv_f16_to_f32(k.d), dmin = pkv_f16_to_f32(k.dmin);
		for (int j = 0; j < 8; j++) {
			struct blk_q4_1 o;
			const uint8_t *q = k.qs + 32 * (j / 2);
			int sc, m, shift = j & 1 ? 4 : 0;
			pkv_k_scale_min(k.scales, j, &sc, &m);
			o.d = pkv_f32_to_f16(d * (float)sc);
			o.m = pkv_f32_to_f16(-(dmin * (float)m));
			for (int i = 0; i < QK / 2; i++)
				o.qs[i] = (uint8_t)((q[i] >> shift & 15) | (q[i + 16] >> shift & 15) << 4);
			memcpy(dst + (b * 8 + (size_t)j) * sizeof o, &o, sizeof o);
		}
	}
}

/*
 * f32 -> Q8_0 against the scale as stored (f16), rounded up to the next f16 where the nearest one
 * times 127 falls short of the block's max (it can, by up to 4 % where the scale is an f16 subnormal,
 * below 6.1e-5): then nothing clamps and every element lands within half a step of the stored scale.
 * quant.c's test quantizer rounds against the unrounded scale, which can be off by more.
 */
static void f32_to_q8_0(const float *x, uint8_t *dst, size_t n)
{
	for (size_t b = 0; b < n / QK; b++) {
		struct blk_q8_0 o;
		const float *v = x + b * QK;
		float amax = 0;
		for (int i = 0; i < QK; i++)
			amax = fmaxf(amax, fabsf(v[i]));
		o.d = pkv_f32_to_f16(amax / 127.f);
		if (pkv_f16_to_f32(o.d) * 127.f < amax && o.d < 0x7bff)
			o.d++; /* the next f16 up: amax / 127 is positive */
		float d = pkv_f16_to_f32(o.d), id = d != 0 && isfinite(d) ? 1.f / d : 0;
		for (int i = 0; i < QK; i++) {
			long q = lrintf(v[i] * id); /* lrintf: a NaN from a hostile file is no undefined cast */
			o.qs[i] = (int8_t)(q < -127 ? -127 : q > 127 ? 127 : q);
		}
		memcpy(dst + b * sizeof o, &o, sizeof o);
	}
}

int pkv_convert_row(uint32_t type, const void *src, void *dst, size_t n, float *scratch)
{
	uint32_t to = pkv_convert_target(type), be = ggml_type_block_elems(type);
	if (!be || n % be || n % QK)
		return -EINVAL;
	if (to == type) {
		memcpy(dst, src, pkv_row_bytes(type, n));
		return 0;
	}
	if (type == GGML_Q4_K) {
		q4k_to_q4_1(src, dst, n);
		return 0;
	}
	pkv_dequant_row(type, src, scratch, n);
	f32_to_q8_0(scratch, dst, n);
	return 0;
}

int pkv_wmat_convert(struct wmat *w)
{
	uint32_t to = pkv_convert_target(w->type);
	size_t rb = pkv_row_bytes(to, w->cols), bytes;
	uint8_t *buf;
	float *tmp;
	int r = 0;
	if (to == w->type)
		return 0;
	if (!rb || __builtin_mul_overflow(rb, (size_t)w->rows, &bytes))
		return -EINVAL;
	buf = malloc(bytes ? bytes : 1);
	tmp = malloc((w->cols ? w->cols : 1) * sizeof *tmp);
	if (!buf || !tmp) {
		free(buf);
		free(tmp);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < w->rows && !r; i++)
		r = pkv_convert_row(w->type, w->data + (size_t)i * w->row_bytes, buf + (size_t)i * rb, w->cols, tmp);
	free(tmp);
	if (r) {
		free(buf);
		return r;
	}
	w->converted = buf;
	w->data = buf;
	w->type = to;
	w->row_bytes = rb;
	return 0;
}

void pkv_wmat_free_converted(struct wmat *w)
{
	free(w->converted);
	w->converted = NULL;
}
