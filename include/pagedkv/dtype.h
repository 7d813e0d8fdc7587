/* SPDX-License-Identifier: MIT */
/* Bit-exact f16/bf16 <-> f32 conversions (round-to-nearest-even, subnormals and NaN kept), header-only. */
#ifndef PAGEDKV_DTYPE_H
#define PAGEDKV_DTYPE_H

/*
 * One definition for every part that converts activations or cache
 * elements: the CPU backend's cache writes must match, bit for bit, what a
 * client computes, so both use these. Header-only so that plugins, which
 * link against nothing of the project, can use them too.
 */

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline uint32_t pkv_f2u_(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static inline float pkv_u2f_(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static inline float pkv_bf16_to_f32(uint16_t h)
{
	return pkv_u2f_((uint32_t)h << 16);
}

static inline uint16_t pkv_f32_to_bf16(float f)
{
	uint32_t u = pkv_f2u_(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40); /* NaN stays a (quiet) NaN */
	/* Adding 0x7fff plus the lowest kept bit rounds half to even; a carry into the exponent is right. */
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline float pkv_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;

	if (exp == 0x1f)
		return pkv_u2f_(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		/* Zero or subnormal: man * 2^-24 is exact in f32. */
		float v = (float)man * 0x1p-24f;

		return sign ? -v : v;
	}
	return pkv_u2f_(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t pkv_f32_to_f16(float f)
{
	uint32_t u = pkv_f2u_(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
	uint32_t a = u & 0x7fffffffu;
	int32_t exp;
	uint32_t man, shift, rem, half, q;

	if (a > 0x7f800000u)
		return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff);
	if (a >= 0x477ff000u) /* rounds to >= 65520: infinity */
		return sign | 0x7c00;
	exp = (int32_t)(a >> 23) - 127;
	if (exp >= -14) {
		/* Normal f16: drop 13 mantissa bits, round half to even; a carry bumps the exponent. */
		uint32_t v = a - (112u << 23); /* rebias 127 -> 15 */

		return sign | (uint16_t)((v + 0xfffu + ((v >> 13) & 1)) >> 13);
	}
	if (exp < -25)
		return sign; /* below half the smallest subnormal */
	/* Subnormal f16: value = man24 * 2^(exp-23); f16 unit is 2^-24. */
	man = (a & 0x7fffffu) | 0x800000u;
	shift = (uint32_t)(-14 - exp) + 13;
	q = man >> shift;
	rem = man & ((1u << shift) - 1);
	half = 1u << (shift - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	return sign | (uint16_t)q;
}

#ifdef __cplusplus
}
#endif
#endif
