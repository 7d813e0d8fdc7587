/* SPDX-License-Identifier: MIT */
/* Bit-exact dtype conversions for the CPU backend (round-to-nearest-even, subnormals kept, NaN kept). */
#include <string.h>

#include "cpu.h"

static inline uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static inline float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

float pkv_cpu_bf16_to_f32(uint16_t h)
{
	return u2f((uint32_t)h << 16);
}

uint16_t pkv_cpu_f32_to_bf16(float f)
{
	uint32_t u = f2u(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40); /* NaN stays a (quiet) NaN */
	/* Adding 0x7fff plus the lowest kept bit rounds half to even; a carry into the exponent is right. */
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

float pkv_cpu_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;

	if (exp == 0x1f)
		return u2f(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		/* Zero or subnormal: man * 2^-24 is exact in f32. */
		float v = (float)man * 0x1p-24f;

		return sign ? -v : v;
	}
	return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t pkv_cpu_f32_to_f16(float f)
{
	uint32_t u = f2u(f);
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

void pkv_cpu_convert(void *dst, uint32_t dst_dtype, const void *src, uint32_t src_dtype, size_t n)
{
	size_t i;

	if (dst_dtype == src_dtype) {
		memcpy(dst, src, n * pkv_dtype_size(src_dtype));
		return;
	}
	for (i = 0; i < n; i++) {
		float v = pkv_cpu_load(src, src_dtype, i);

		if (dst_dtype == PKV_DTYPE_F32)
			((float *)dst)[i] = v;
		else if (dst_dtype == PKV_DTYPE_F16)
			((uint16_t *)dst)[i] = pkv_cpu_f32_to_f16(v);
		else
			((uint16_t *)dst)[i] = pkv_cpu_f32_to_bf16(v);
	}
}

void pkv_cpu_store_row(void *dst, uint32_t dtype, const float *src, size_t n)
{
	pkv_cpu_convert(dst, dtype, src, PKV_DTYPE_F32, n);
}
