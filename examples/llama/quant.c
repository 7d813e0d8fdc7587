/* SPDX-License-Identifier: MIT */
/* Portable weight-format code: (de)quantization and the scalar row dots. */
#include "quant.h"
#include "gguf.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t pkv_row_bytes(uint32_t type, size_t n)
{
	uint32_t be = ggml_type_block_elems(type);
	return be ? n / be * ggml_type_block_bytes(type) : 0;
}

void pkv_dequant_row(uint32_t type, const void *row, float *out, size_t n)
{
	const uint8_t *p = row;
	switch (type) {
	case GGML_F32:
		memcpy(out, row, n * 4);
		break;
	case GGML_F16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, p + 2 * i, 2);
			out[i] = pkv_f16_to_f32(h);
		}
		break;
	case GGML_BF16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, p + 2 * i, 2);
			out[i] = pkv_bf16_to_f32(h);
		}
		break;
	case GGML_Q4_0:
		for (size_t b = 0; b < n / QK; b++) {
			struct blk_q4_0 blk;
			memcpy(&blk, p + b * sizeof blk, sizeof blk);
			float d = pkv_f16_to_f32(blk.d);
			for (int j = 0; j < QK / 2; j++) {
				out[b * QK + j] = ((blk.qs[j] & 15) - 8) * d;
				out[b * QK + j + 16] = ((blk.qs[j] >> 4) - 8) * d;
			}
		}
		break;
	case GGML_Q4_1:
		for (size_t b = 0; b < n / QK; b++) {
			struct blk_q4_1 blk;
			memcpy(&blk, p + b * sizeof blk, sizeof blk);
			float d = pkv_f16_to_f32(blk.d), m = pkv_f16_to_f32(blk.m);
			for (int j = 0; j < QK / 2; j++) {
				out[b * QK + j] = (blk.qs[j] & 15) * d + m;
				out[b * QK + j + 16] = (blk.qs[j] >> 4) * d + m;
			}
		}
		break;
	case GGML_Q8_0:
		for (size_t b = 0; b < n / QK; b++) {
			struct blk_q8_0 blk;
			memcpy(&blk, p + b * sizeof blk, sizeof blk);
			float d = pkv_f16_to_f32(blk.d);
			for (int j = 0; j < QK; j++)
				out[b * QK + j] = blk.qs[j] * d;
		}
		break;
	default:
		pkv_dequant_row_k(type, row, out, n); /* the 5-bit and K-quant formats; zeros for others */
	}
}

struct blk_range pkv_blk_range(const float *v, size_t n)
{
	struct blk_range r = { 0, 0, -INFINITY, INFINITY };

	for (size_t j = 0; j < n; j++) {
		if (fabsf(v[j]) > r.amax) {
			r.amax = fabsf(v[j]);
			r.sgnmax = v[j];
		}
		r.vmax = fmaxf(r.vmax, v[j]);
		r.vmin = fminf(r.vmin, v[j]);
	}
	return r;
}

int pkv_quant_row(uint32_t type, const float *x, void *row, size_t n)
{
	uint8_t *p = row;
	if (ggml_type_block_elems(type) == 0 || n % ggml_type_block_elems(type))
		return -EINVAL;
	switch (type) {
	case GGML_F32:
		memcpy(row, x, n * 4);
		return 0;
	case GGML_F16:
	case GGML_BF16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h = type == GGML_F16 ? pkv_f32_to_f16(x[i]) : pkv_f32_to_bf16(x[i]);
			memcpy(p + 2 * i, &h, 2);
		}
		return 0;
	case GGML_Q4_0:
	case GGML_Q4_1:
	case GGML_Q8_0:
		break;
	default:
		return pkv_quant_row_k(type, x, row, n);
	}
	for (size_t b = 0; b < n / QK; b++) {
		const float *v = x + b * QK;
		struct blk_range r = pkv_blk_range(v, QK);
		float amax = r.amax, vmax = r.vmax, vmin = r.vmin, sgnmax = r.sgnmax;
		if (type == GGML_Q8_0) {
			struct blk_q8_0 blk;
			float d = amax / 127.f, id = d ? 1.f / d : 0;
			blk.d = pkv_f32_to_f16(d);
			for (int j = 0; j < QK; j++)
				blk.qs[j] = (int8_t)lrintf(v[j] * id);
			memcpy(p + b * sizeof blk, &blk, sizeof blk);
		} else if (type == GGML_Q4_0) {
			/* the signed max maps to -8 so the full 4-bit range is used */
			struct blk_q4_0 blk;
			float d = sgnmax / -8.f, id = d ? 1.f / d : 0;
			blk.d = pkv_f32_to_f16(d);
			for (int j = 0; j < QK / 2; j++) {
				int a = (int)lrintf(v[j] * id) + 8, c = (int)lrintf(v[j + 16] * id) + 8;
				a = a < 0 ? 0 : a > 15 ? 15 : a;
				c = c < 0 ? 0 : c > 15 ? 15 : c;
				blk.qs[j] = (uint8_t)(a | c << 4);
			}
			memcpy(p + b * sizeof blk, &blk, sizeof blk);
		} else {
			struct blk_q4_1 blk;
			float d = (vmax - vmin) / 15.f, id = d ? 1.f / d : 0;
			blk.d = pkv_f32_to_f16(d);
			blk.m = pkv_f32_to_f16(vmin);
			for (int j = 0; j < QK / 2; j++) {
				int a = (int)lrintf((v[j] - vmin) * id), c = (int)lrintf((v[j + 16] - vmin) * id);
				a = a < 0 ? 0 : a > 15 ? 15 : a;
				c = c < 0 ? 0 : c > 15 ? 15 : c;
				blk.qs[j] = (uint8_t)(a | c << 4);
			}
			memcpy(p + b * sizeof blk, &blk, sizeof blk);
		}
	}
	return 0;
}

void pkv_quant_act(const float *x, struct blk_a8 *out, size_t n)
{
	for (size_t b = 0; b < n / QK; b++) {
		const float *v = x + b * QK;
		float amax = 0;
		int sum = 0;
		for (int j = 0; j < QK; j++)
			amax = fmaxf(amax, fabsf(v[j]));
		float d = amax / 32767.f, id = d ? 1.f / d : 0;
		for (int j = 0; j < QK; j++) {
			int q = (int)lrintf(v[j] * id);
			out[b].qs[j] = (int16_t)q;
			sum += q;
		}
		out[b].d = d;
		out[b].s = d * (float)sum;
	}
}

static float dot_q4_0(const void *w, const struct blk_a8 *x, size_t nb)
{
	const uint8_t *p = w;
	float acc = 0;
	for (size_t b = 0; b < nb; b++) {
		struct blk_q4_0 blk;
		int s = 0;
		memcpy(&blk, p + b * sizeof blk, sizeof blk);
		for (int j = 0; j < QK / 2; j++)
			s += ((blk.qs[j] & 15) - 8) * x[b].qs[j] + ((blk.qs[j] >> 4) - 8) * x[b].qs[j + 16];
		acc += pkv_f16_to_f32(blk.d) * x[b].d * (float)s;
	}
	return acc;
}

static float dot_q4_1(const void *w, const struct blk_a8 *x, size_t nb)
{
	const uint8_t *p = w;
	float acc = 0;
	for (size_t b = 0; b < nb; b++) {
		struct blk_q4_1 blk;
		int s = 0;
		memcpy(&blk, p + b * sizeof blk, sizeof blk);
		for (int j = 0; j < QK / 2; j++)
			s += (blk.qs[j] & 15) * x[b].qs[j] + (blk.qs[j] >> 4) * x[b].qs[j + 16];
		acc += pkv_f16_to_f32(blk.d) * x[b].d * (float)s + pkv_f16_to_f32(blk.m) * x[b].s;
	}
	return acc;
}

static float dot_q8_0(const void *w, const struct blk_a8 *x, size_t nb)
{
	const uint8_t *p = w;
	float acc = 0;
	for (size_t b = 0; b < nb; b++) {
		struct blk_q8_0 blk;
		int s = 0;
		memcpy(&blk, p + b * sizeof blk, sizeof blk);
		for (int j = 0; j < QK; j++)
			s += blk.qs[j] * x[b].qs[j];
		acc += pkv_f16_to_f32(blk.d) * x[b].d * (float)s;
	}
	return acc;
}

static float dot_f32(const float *w, const float *x, size_t n)
{
	float acc = 0;
	for (size_t i = 0; i < n; i++)
		acc += w[i] * x[i];
	return acc;
}

static float dot_f16(const uint16_t *w, const float *x, size_t n)
{
	float acc = 0;
	for (size_t i = 0; i < n; i++) {
		uint16_t h;
		memcpy(&h, w + i, 2);
		acc += pkv_f16_to_f32(h) * x[i];
	}
	return acc;
}

static float dot_bf16(const uint16_t *w, const float *x, size_t n)
{
	float acc = 0;
	for (size_t i = 0; i < n; i++) {
		uint16_t h;
		memcpy(&h, w + i, 2);
		acc += pkv_bf16_to_f32(h) * x[i];
	}
	return acc;
}

static const struct pkv_dot_ops scalar_ops = {
	.isa = "scalar", .q4_0 = dot_q4_0, .q4_1 = dot_q4_1, .q8_0 = dot_q8_0,
	.f32 = dot_f32, .f16 = dot_f16, .bf16 = dot_bf16,
};

const struct pkv_dot_ops *pkv_dot_ops_scalar(void)
{
	return &scalar_ops;
}

const struct pkv_dot_ops *pkv_dot_ops(void)
{
	static const struct pkv_dot_ops *ops;
	if (!ops) {
		/* PKV_ISA=scalar|avx2|avx512 forces a path (for tests and benchmarks); vnni (the
		 * default where the CPU has it) packs the quantized weights for gemm_vnni.c. */
		const char *want = getenv("PKV_ISA");
		const struct pkv_dot_ops *a512 = pkv_dot_ops_avx512(), *a2 = pkv_dot_ops_avx2();
		if (want && !strcmp(want, "scalar"))
			ops = &scalar_ops;
		else if (want && !strcmp(want, "avx2") && a2)
			ops = a2;
		else
			ops = a512 ? a512 : a2 ? a2 : &scalar_ops;
	}
	return ops;
}
