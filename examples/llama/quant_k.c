/* SPDX-License-Identifier: MIT */
/*
 * The 5-bit and K-quant weight formats (layouts in quant.h): dequantization exactly as GGML defines
 * it, so files quantized elsewhere read back the same values, and a plain quantizer (per-block
 * absmax or min/max scales, nothing searched) for tests and the random-model writer.
 * The kernels never see these types: convert.c turns such matrices into Q4_1 or Q8_0 at load.
 */
#include "quant.h"
#include "gguf.h"

#include <errno.h>
#include <math.h>
#include <string.h>

_Static_assert(sizeof(struct blk_q5_0) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(struct blk_q5_1) == 24, "Q5_1 block is 24 bytes");
_Static_assert(sizeof(struct blk_q4_k) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(struct blk_q5_k) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(struct blk_q6_k) == 210, "Q6_K block is 210 bytes");

/*
 * 12 bytes hold 8 six-bit scales and 8 six-bit mins: sub-blocks 0-3 keep theirs in the low 6 bits
 * of bytes 0-3 (scale) and 4-7 (min); sub-blocks 4-7 keep their low 4 bits in the nibbles of bytes
 * 8-11 (scale low, min high) and their top 2 bits in the spare top bits of bytes 0-3 / 4-7.
 */
void pkv_k_scale_min(const uint8_t s[12], int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
		*m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
	}
}

static void k_pack_scales(uint8_t s[12], const int sc[8], const int m[8])
{
	for (int j = 0; j < 4; j++) {
		s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
		s[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
		s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
	}
}

/* Element i (0..31) of a 32-element block stored as 16 nibble pairs plus a 32-bit high-bit mask. */
static int q5_elem(const uint8_t qs[16], uint32_t qh, int i)
{
	int lo = i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
	return lo | (int)((qh >> i) & 1) << 4;
}

/* Element i (0..31) of sub-block j (0..7) of a Q4_K / Q5_K super-block: its 4 low bits. */
static int k_nibble(const uint8_t qs[128], int j, int i)
{
	uint8_t b = qs[32 * (j / 2) + i];
	return j & 1 ? b >> 4 : b & 15;
}

static int q6_elem(const struct blk_q6_k *b, int e)
{
	int h = e / 128, g = e % 128 / 32, l = e % 32;
	uint8_t lo = b->ql[64 * h + 32 * (g & 1) + l];
	return (g < 2 ? lo & 15 : lo >> 4) | ((b->qh[32 * h + l] >> (2 * g)) & 3) << 4;
}

void pkv_dequant_row_k(uint32_t type, const void *row, float *out, size_t n)
{
	const uint8_t *p = row;
	switch (type) {
	case GGML_Q5_0:
		for (size_t b = 0; b < n / QK; b++) {
			struct blk_q5_0 blk;
			uint32_t qh;
			memcpy(&blk, p + b * sizeof blk, sizeof blk);
			memcpy(&qh, blk.qh, 4);
			float d = pkv_f16_to_f32(blk.d);
			for (int i = 0; i < QK; i++)
				out[b * QK + i] = (float)(q5_elem(blk.qs, qh, i) - 16) * d;
		}
		break;
	case GGML_Q5_1:
		for (size_t b = 0; b < n / QK; b++) {
			struct blk_q5_1 blk;
			uint32_t qh;
			memcpy(&blk, p + b * sizeof blk, sizeof blk);
			memcpy(&qh, blk.qh, 4);
			float d = pkv_f16_to_f32(blk.d), m = pkv_f16_to_f32(blk.m);
			for (int i = 0; i < QK; i++)
				out[b * QK + i] = (float)q5_elem(blk.qs, qh, i) * d + m;
		}
		break;
	case GGML_Q4_K:
	case GGML_Q5_K:
		for (size_t b = 0; b < n / QK_K; b++) {
			struct blk_q5_k blk; /* a Q4_K block read into it lacks only qh */
			const uint8_t *qs;
			if (type == GGML_Q4_K) {
				struct blk_q4_k k4;
				memcpy(&k4, p + b * sizeof k4, sizeof k4);
				blk.d = k4.d;
				blk.dmin = k4.dmin;
				memcpy(blk.scales, k4.scales, sizeof blk.scales);
				memset(blk.qh, 0, sizeof blk.qh);
				memcpy(blk.qs, k4.qs, sizeof blk.qs);
			} else {
				memcpy(&blk, p + b * sizeof blk, sizeof blk);
			}
			qs = blk.qs;
			float d = pkv_f16_to_f32(blk.d), dmin = pkv_f16_to_f32(blk.dmin);
			for (int j = 0; j < 8; j++) {
				int sc, m;
				pkv_k_scale_min(blk.scales, j, &sc, &m);
				float step = d * (float)sc, off = dmin * (float)m;
				float *o = out + b * QK_K + (size_t)j * 32;
				for (int i = 0; i < 32; i++)
					o[i] = step * (float)(k_nibble(qs, j, i) | ((blk.qh[i] >> j) & 1) << 4) - off;
			}
		}
		break;
	case GGML_Q6_K:
		for (size_t b = 0; b < n / QK_K; b++) {
			struct blk_q6_k blk;
			memcpy(&blk, p + b * sizeof blk, sizeof blk);
			float d = pkv_f16_to_f32(blk.d);
			for (int e = 0; e < QK_K; e++)
				out[b * QK_K + (size_t)e] = d * (float)blk.scales[e / 16] * (float)(q6_elem(&blk, e) - 32);
		}
		break;
	default:
		memset(out, 0, n * sizeof *out);
	}
}

/* round(v) clamped to [lo, hi]; lrintf keeps out-of-range and NaN inputs free of undefined casts. */
static int qround(float v, int lo, int hi)
{
	long q = lrintf(v);
	return q < lo ? lo : q > hi ? hi : (int)q;
}

/* A 32-element block: q (0..31) split into nibbles and the high-bit mask. */
static void q5_store(const int q[QK], uint8_t qs[16], uint8_t qh_bytes[4])
{
	uint32_t qh = 0;
	for (int i = 0; i < 16; i++)
		qs[i] = (uint8_t)((q[i] & 15) | (q[i + 16] & 15) << 4);
	for (int i = 0; i < QK; i++)
		qh |= (uint32_t)(q[i] >> 4 & 1) << i;
	memcpy(qh_bytes, &qh, 4);
}

static void quant_q5(uint32_t type, const float *v, uint8_t *dst)
{
	struct blk_range r = pkv_blk_range(v, QK);
	float sgnmax = r.sgnmax, vmax = r.vmax, vmin = r.vmin;
	int q[QK];
	if (type == GGML_Q5_0) {
		/* the signed max maps to -16 so the whole 5-bit range is used */
		struct blk_q5_0 blk;
		float d = sgnmax / -16.f, id = d ? 1.f / d : 0;
		blk.d = pkv_f32_to_f16(d);
		for (int i = 0; i < QK; i++)
			q[i] = qround(v[i] * id + 16.f, 0, 31);
		q5_store(q, blk.qs, blk.qh);
		memcpy(dst, &blk, sizeof blk);
	} else {
		struct blk_q5_1 blk;
		float d = (vmax - vmin) / 31.f, id = d ? 1.f / d : 0;
		blk.d = pkv_f32_to_f16(d);
		blk.m = pkv_f32_to_f16(vmin);
		for (int i = 0; i < QK; i++)
			q[i] = qround((v[i] - vmin) * id, 0, 31);
		q5_store(q, blk.qs, blk.qh);
		memcpy(dst, &blk, sizeof blk);
	}
}

/*
 * Q4_K / Q5_K (nmax 15 / 31): each sub-block's step (max - min) / nmax and offset -min (min clamped
 * to <= 0, as the format subtracts a non-negative offset) become 6-bit multiples of the super-block's
 * largest step / 63 and largest offset / 63; the elements are then rounded against those stored values.
 */
static void quant_k45(uint32_t type, const float *v, uint8_t *dst)
{
	int nmax = type == GGML_Q4_K ? 15 : 31, sc[8], m[8];
	float step[8], off[8], max_step = 0, max_off = 0;
	struct blk_q5_k blk;
	memset(&blk, 0, sizeof blk);
	for (int j = 0; j < 8; j++) {
		float lo = 0, hi = -INFINITY;
		for (int i = 0; i < 32; i++) {
			lo = fminf(lo, v[32 * j + i]);
			hi = fmaxf(hi, v[32 * j + i]);
		}
		step[j] = (hi - lo) / (float)nmax;
		off[j] = -lo;
		max_step = fmaxf(max_step, step[j]);
		max_off = fmaxf(max_off, off[j]);
	}
	blk.d = pkv_f32_to_f16(max_step / 63.f);
	blk.dmin = pkv_f32_to_f16(max_off / 63.f);
	float d = pkv_f16_to_f32(blk.d), dmin = pkv_f16_to_f32(blk.dmin);
	for (int j = 0; j < 8; j++) {
		sc[j] = d ? qround(step[j] / d, 0, 63) : 0;
		m[j] = dmin ? qround(off[j] / dmin, 0, 63) : 0;
	}
	k_pack_scales(blk.scales, sc, m);
	for (int j = 0; j < 8; j++) {
		float s = d * (float)sc[j], o = dmin * (float)m[j], is = s ? 1.f / s : 0;
		for (int i = 0; i < 32; i++) {
			int q = qround((v[32 * j + i] + o) * is, 0, nmax);
			blk.qs[32 * (j / 2) + i] |= (uint8_t)((q & 15) << (j & 1 ? 4 : 0));
			blk.qh[i] |= (uint8_t)((q >> 4 & 1) << j);
		}
	}
	if (type == GGML_Q5_K) {
		memcpy(dst, &blk, sizeof blk);
	} else {
		struct blk_q4_k k4 = { .d = blk.d, .dmin = blk.dmin };
		memcpy(k4.scales, blk.scales, sizeof k4.scales);
		memcpy(k4.qs, blk.qs, sizeof k4.qs);
		memcpy(dst, &k4, sizeof k4);
	}
}

/* Q6_K: each 16-element sub-block's signed max maps to -32; the sub-block steps become signed 8-bit
 * multiples of the largest step / 127. */
static void quant_q6k(const float *v, uint8_t *dst)
{
	struct blk_q6_k blk;
	float step[16], max_step = 0;
	memset(&blk, 0, sizeof blk);
	for (int j = 0; j < 16; j++) {
		float amax = 0, sgnmax = 0;
		for (int i = 0; i < 16; i++)
			if (fabsf(v[16 * j + i]) > amax) {
				amax = fabsf(v[16 * j + i]);
				sgnmax = v[16 * j + i];
			}
		step[j] = sgnmax / -32.f;
		max_step = fmaxf(max_step, fabsf(step[j]));
	}
	blk.d = pkv_f32_to_f16(max_step / 127.f);
	float d = pkv_f16_to_f32(blk.d);
	for (int j = 0; j < 16; j++)
		blk.scales[j] = (int8_t)(d ? qround(step[j] / d, -128, 127) : 0);
	for (int e = 0; e < QK_K; e++) {
		float s = d * (float)blk.scales[e / 16], is = s ? 1.f / s : 0;
		int q = qround(v[e] * is + 32.f, 0, 63);
		int h = e / 128, g = e % 128 / 32, l = e % 32;
		blk.ql[64 * h + 32 * (g & 1) + l] |= (uint8_t)((q & 15) << (g < 2 ? 0 : 4));
		blk.qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * g));
	}
	memcpy(dst, &blk, sizeof blk);
}

int pkv_quant_row_k(uint32_t type, const float *x, void *row, size_t n)
{
	uint8_t *p = row;
	size_t be = ggml_type_block_elems(type), bb = ggml_type_block_bytes(type);
	if (!be || n % be)
		return -EINVAL;
	for (size_t b = 0; b < n / be; b++) {
		switch (type) {
		case GGML_Q5_0:
		case GGML_Q5_1: quant_q5(type, x + b * be, p + b * bb); break;
		case GGML_Q4_K:
		case GGML_Q5_K: quant_k45(type, x + b * be, p + b * bb); break;
		case GGML_Q6_K: quant_q6k(x + b * be, p + b * bb); break;
		default: return -EINVAL;
		}
	}
	return 0;
}
