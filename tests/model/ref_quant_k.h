/* SPDX-License-Identifier: MIT */
/*
 * Test references for the 5-bit and K-quant formats, written from the format description again and
 * on purpose unlike the library (byte offsets instead of structs, own f16 decoder, one element at a
 * time): the library must agree with them bit for bit. Also the load-time conversion done the plain
 * way (Q4_K sub-blocks re-labelled as Q4_1 blocks; everything else dequantized and requantized to
 * Q8_0 against the stored f16 scale, never smaller than max / 127).
 */
#ifndef PKV_TEST_REF_QUANT_K_H
#define PKV_TEST_REF_QUANT_K_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../../examples/llama/gguf.h"
#include "../../examples/llama/quant.h"

static inline float ref_f16(const uint8_t *p)
{
	unsigned h = (unsigned)p[0] | (unsigned)p[1] << 8, e = h >> 10 & 31, f = h & 1023;
	float v = e == 0 ? ldexpf((float)f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexpf((float)(f | 1024), (int)e - 25);
	return h & 0x8000 ? -v : v;
}

/* Bytes per block and elements per block, from the format description (not from gguf.c). */
static inline size_t ref_block_bytes(uint32_t t)
{
	return t == GGML_Q5_0 ? 22 : t == GGML_Q5_1 ? 24 : t == GGML_Q4_K ? 144 : t == GGML_Q5_K ? 176 :
	       t == GGML_Q6_K ? 210 : 0;
}

static inline size_t ref_block_elems(uint32_t t)
{
	return t == GGML_Q5_0 || t == GGML_Q5_1 ? 32 : 256;
}

/* Sub-block j's 6-bit scale and min: bytes 0-3 / 4-7 hold sub-blocks 0-3 in their low six bits and
 * the top two bits of sub-blocks 4-7 in their high two; bytes 8-11 hold the low four bits of 4-7. */
static inline void ref_k_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] % 64;
		*m = s[4 + j] % 64;
	} else {
		*sc = s[8 + j - 4] % 16 + 16 * (s[j - 4] / 64);
		*m = s[8 + j - 4] / 16 + 16 * (s[j] / 64);
	}
}

/* Element e of one block starting at b. */
static inline float ref_elem(uint32_t t, const uint8_t *b, int e)
{
	switch (t) {
	case GGML_Q5_0:
	case GGML_Q5_1: {
		const uint8_t *qh = b + (t == GGML_Q5_0 ? 2 : 4), *qs = qh + 4;
		int nib = (qs[e % 16] >> (e < 16 ? 0 : 4)) & 15, hi = (qh[e / 8] >> (e % 8)) & 1, q = nib + 16 * hi;
		return t == GGML_Q5_0 ? (float)(q - 16) * ref_f16(b) : (float)q * ref_f16(b) + ref_f16(b + 2);
	}
	case GGML_Q4_K:
	case GGML_Q5_K: {
		int j = e / 32, i = e % 32, sc, m;
		const uint8_t *qs = b + (t == GGML_Q4_K ? 16 : 48);
		int q = (qs[32 * (j / 2) + i] >> (j % 2 ? 4 : 0)) & 15;
		if (t == GGML_Q5_K)
			q += 16 * ((b[16 + i] >> j) & 1);
		ref_k_scale_min(b + 4, j, &sc, &m);
		return ref_f16(b) * (float)sc * (float)q - ref_f16(b + 2) * (float)m;
	}
	case GGML_Q6_K: {
		int h = e / 128, g = (e % 128) / 32, l = e % 32;
		int lo = (b[64 * h + 32 * (g % 2) + l] >> (g < 2 ? 0 : 4)) & 15;
		int hi = (b[128 + 32 * h + l] >> (2 * g)) & 3;
		return ref_f16(b + 208) * (float)(int8_t)b[192 + e / 16] * (float)(lo + 16 * hi - 32);
	}
	}
	return NAN;
}

static inline void ref_dequant(uint32_t t, const uint8_t *row, float *out, size_t n)
{
	size_t be = ref_block_elems(t), bb = ref_block_bytes(t);
	for (size_t i = 0; i < n; i++)
		out[i] = ref_elem(t, row + i / be * bb, (int)(i % be));
}

/* Q8_0 rounded against the stored scale: 2 bytes f16 scale, 32 int8. Finite inputs only. */
static inline void ref_q8_0(const float *x, uint8_t *out, size_t n)
{
	for (size_t b = 0; b < n / 32; b++) {
		float amax = 0;
		for (int i = 0; i < 32; i++)
			amax = fmaxf(amax, fabsf(x[32 * b + i]));
		/* the f16 nearest amax / 127, or the one above it when that does not reach amax */
		uint16_t h = pkv_f32_to_f16(amax / 127.f);
		uint8_t *o = out + 34 * b;
		for (int up = 0; up < 2; up++, h++) {
			o[0] = (uint8_t)(h & 255);
			o[1] = (uint8_t)(h >> 8);
			if (ref_f16(o) * 127.f >= amax)
				break;
		}
		float d = ref_f16(o), id = d > 0 ? 1.f / d : 0.f;
		for (int i = 0; i < 32; i++) {
			float q = rintf(x[32 * b + i] * id); /* nearest, ties to even */
			o[2 + i] = (uint8_t)(int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
		}
	}
}

/* The converted row (Q4_1 for Q4_K, else Q8_0); scratch holds n floats. */
static inline void ref_convert(uint32_t t, const uint8_t *row, uint8_t *out, size_t n, float *scratch)
{
	if (t != GGML_Q4_K) {
		ref_dequant(t, row, scratch, n);
		ref_q8_0(scratch, out, n);
		return;
	}
	for (size_t s = 0; s < n / 32; s++) {
		const uint8_t *b = row + s / 8 * 144;
		int j = (int)(s % 8), sc, m;
		uint8_t *o = out + 20 * s;
		ref_k_scale_min(b + 4, j, &sc, &m);
		uint16_t d = pkv_f32_to_f16(ref_f16(b) * (float)sc), mn = pkv_f32_to_f16(-(ref_f16(b + 2) * (float)m));
		memcpy(o, &d, 2);
		memcpy(o + 2, &mn, 2);
		for (int i = 0; i < 16; i++) {
			int lo = (b[16 + 32 * (j / 2) + i] >> (j % 2 ? 4 : 0)) & 15;
			int hi = (b[16 + 32 * (j / 2) + i + 16] >> (j % 2 ? 4 : 0)) & 15;
			o[4 + i] = (uint8_t)(lo | hi << 4);
		}
	}
}

#endif
