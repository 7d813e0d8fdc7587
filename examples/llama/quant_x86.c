/* SPDX-License-Identifier: MIT */
/* x86 row dots: AVX2 and AVX-512BW versions (int16 madd over 16-bit activation blocks), compiled per function so one
 * binary runs everywhere; pkv_dot_ops() picks one at run time. */
#include "quant.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))

/* F16C's one-instruction conversion; every caller is compiled with f16c enabled. */
#define h2f(h) _cvtsh_ss(h)

T_AVX2 static inline float hsum256(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* 16 packed nibble bytes -> 32 unsigned bytes: elements 0..15 (low nibbles) then 16..31 (high). */
T_AVX2 static inline __m256i unpack_nibbles(const uint8_t *qs)
{
	__m128i raw = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(15);
	return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
}

/* 32 weights as int16 (two halves) . 32 int16 activations -> 8 int32 partial sums. No overflow:
 * |w| <= 128 and |x| <= 32767, so each pair sum stays below 2^23. */
T_AVX2 static inline __m256i dot16_avx2(__m256i w8, const int16_t *x)
{
	__m256i lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w8));
	__m256i hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w8, 1));
	return _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)x)),
				_mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 16))));
}

T_AVX2 static float q4_0_avx2(const void *w, const struct blk_a8 *x, size_t nb)
{
	const struct blk_q4_0 *b = w;
	__m256 acc = _mm256_setzero_ps();
	float off = 0;
	for (size_t i = 0; i < nb; i++) {
		float dw = h2f(b[i].d);
		__m256i p = dot16_avx2(unpack_nibbles(b[i].qs), x[i].qs);
		acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * x[i].d), acc);
		off += dw * x[i].s; /* the -8 offset: -8 * dw * dx * sum(qx) */
	}
	return hsum256(acc) - 8.f * off;
}

T_AVX2 static float q4_1_avx2(const void *w, const struct blk_a8 *x, size_t nb)
{
	const struct blk_q4_1 *b = w;
	__m256 acc = _mm256_setzero_ps();
	float off = 0;
	for (size_t i = 0; i < nb; i++) {
		__m256i p = dot16_avx2(unpack_nibbles(b[i].qs), x[i].qs);
		acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(b[i].d) * x[i].d), acc);
		off += h2f(b[i].m) * x[i].s;
	}
	return hsum256(acc) + off;
}

T_AVX2 static float q8_0_avx2(const void *w, const struct blk_a8 *x, size_t nb)
{
	const struct blk_q8_0 *b = w;
	__m256 acc = _mm256_setzero_ps();
	for (size_t i = 0; i < nb; i++) {
		__m256i p = dot16_avx2(_mm256_loadu_si256((const __m256i *)b[i].qs), x[i].qs);
		acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(b[i].d) * x[i].d), acc);
	}
	return hsum256(acc);
}

T_AVX2 static float f32_avx2(const float *w, const float *x, size_t n)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
	size_t i = 0;
	float tail = 0;
	for (; i + 16 <= n; i += 16) {
		a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
		a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
	}
	for (; i + 8 <= n; i += 8)
		a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
	for (; i < n; i++)
		tail += w[i] * x[i];
	return hsum256(_mm256_add_ps(a0, a1)) + tail;
}

T_AVX2 static float f16_avx2(const uint16_t *w, const float *x, size_t n)
{
	__m256 a = _mm256_setzero_ps();
	size_t i = 0;
	float tail = 0;
	for (; i + 8 <= n; i += 8)
		a = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))),
				    _mm256_loadu_ps(x + i), a);
	for (; i < n; i++) {
		uint16_t h;
		memcpy(&h, w + i, 2);
		tail += h2f(h) * x[i];
	}
	return hsum256(a) + tail;
}

T_AVX2 static float bf16_avx2(const uint16_t *w, const float *x, size_t n)
{
	__m256 a = _mm256_setzero_ps();
	size_t i = 0;
	float tail = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i v = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i))), 16);
		a = _mm256_fmadd_ps(_mm256_castsi256_ps(v), _mm256_loadu_ps(x + i), a);
	}
	for (; i < n; i++) {
		uint16_t h;
		memcpy(&h, w + i, 2);
		tail += pkv_bf16_to_f32(h) * x[i];
	}
	return hsum256(a) + tail;
}

/* One block per instruction: 32 int16 weights x 32 int16 activations, pairwise into 16 int32. */
T_512 static inline __m512i dot16_512(__m256i w8, const int16_t *x)
{
	return _mm512_madd_epi16(_mm512_cvtepi8_epi16(w8), _mm512_loadu_si512((const void *)x));
}

T_512 static float q4_0_512(const void *w, const struct blk_a8 *x, size_t nb)
{
	const struct blk_q4_0 *b = w;
	__m512 acc = _mm512_setzero_ps();
	float off = 0;
	for (size_t i = 0; i < nb; i++) {
		float dw = h2f(b[i].d);
		__m512i p = dot16_512(unpack_nibbles(b[i].qs), x[i].qs);
		acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(dw * x[i].d), acc);
		off += dw * x[i].s;
	}
	return _mm512_reduce_add_ps(acc) - 8.f * off;
}

T_512 static float q4_1_512(const void *w, const struct blk_a8 *x, size_t nb)
{
	const struct blk_q4_1 *b = w;
	/* two accumulators: one FMA chain per block would be latency-bound (4 cycles per block) */
	__m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
	float off = 0;
	size_t i = 0;
	for (; i + 2 <= nb; i += 2) {
		__m512i p0 = dot16_512(unpack_nibbles(b[i].qs), x[i].qs);
		__m512i p1 = dot16_512(unpack_nibbles(b[i + 1].qs), x[i + 1].qs);
		acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_set1_ps(h2f(b[i].d) * x[i].d), acc0);
		acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_set1_ps(h2f(b[i + 1].d) * x[i + 1].d), acc1);
		off += h2f(b[i].m) * x[i].s + h2f(b[i + 1].m) * x[i + 1].s;
	}
	for (; i < nb; i++) {
		__m512i p = dot16_512(unpack_nibbles(b[i].qs), x[i].qs);
		acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(h2f(b[i].d) * x[i].d), acc0);
		off += h2f(b[i].m) * x[i].s;
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + off;
}

T_512 static float q8_0_512(const void *w, const struct blk_a8 *x, size_t nb)
{
	const struct blk_q8_0 *b = w;
	__m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
	size_t i = 0;
	for (; i + 2 <= nb; i += 2) {
		__m512i p0 = dot16_512(_mm256_loadu_si256((const __m256i *)b[i].qs), x[i].qs);
		__m512i p1 = dot16_512(_mm256_loadu_si256((const __m256i *)b[i + 1].qs), x[i + 1].qs);
		acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_set1_ps(h2f(b[i].d) * x[i].d), acc0);
		acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_set1_ps(h2f(b[i + 1].d) * x[i + 1].d), acc1);
	}
	for (; i < nb; i++) {
		__m512i p = dot16_512(_mm256_loadu_si256((const __m256i *)b[i].qs), x[i].qs);
		acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(h2f(b[i].d) * x[i].d), acc0);
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* Weight block b of a row as 32 int16 values plus its scale and (Q4_1) offset. Q4_0's -8 is folded
 * into the values so it needs no offset term. */
T_512 static inline __m512i wblock16(uint32_t type, const void *w, size_t b, float *d, float *m)
{
	if (type == 3) { /* GGML_Q4_1 */
		const struct blk_q4_1 *q = (const struct blk_q4_1 *)w + b;
		*d = h2f(q->d);
		*m = h2f(q->m);
		return _mm512_cvtepi8_epi16(unpack_nibbles(q->qs));
	}
	if (type == 2) { /* GGML_Q4_0 */
		const struct blk_q4_0 *q = (const struct blk_q4_0 *)w + b;
		*d = h2f(q->d);
		*m = 0;
		return _mm512_sub_epi16(_mm512_cvtepi8_epi16(unpack_nibbles(q->qs)), _mm512_set1_epi16(8));
	}
	const struct blk_q8_0 *q = (const struct blk_q8_0 *)w + b;
	*d = h2f(q->d);
	*m = 0;
	return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)q->qs));
}

T_512 static void quant_x4_512(uint32_t type, const void *w, const struct blk_a8 *x, size_t stride, size_t nb,
			       float *out)
{
	__m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
	float o0 = 0, o1 = 0, o2 = 0, o3 = 0;
	const struct blk_a8 *x0 = x, *x1 = x + stride, *x2 = x + 2 * stride, *x3 = x + 3 * stride;
	for (size_t b = 0; b < nb; b++) {
		float d, m;
		__m512i wv = wblock16(type, w, b, &d, &m);
#define ROW(k)                                                                                           \
		a##k = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(wv, _mm512_loadu_si512(x##k[b].qs))), \
				       _mm512_set1_ps(d * x##k[b].d), a##k);                                 \
		o##k += m * x##k[b].s;
		ROW(0) ROW(1) ROW(2) ROW(3)
#undef ROW
	}
	out[0] = _mm512_reduce_add_ps(a0) + o0;
	out[1] = _mm512_reduce_add_ps(a1) + o1;
	out[2] = _mm512_reduce_add_ps(a2) + o2;
	out[3] = _mm512_reduce_add_ps(a3) + o3;
}

T_512 static float f32_512(const float *w, const float *x, size_t n)
{
	__m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
	size_t i = 0;
	for (; i + 32 <= n; i += 32) {
		a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
		a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
	}
	if (i < n) {
		/* masked tail: no scalar loop, no read past the row */
		size_t r = n - i;
		__mmask16 m0 = r >= 16 ? 0xffff : (__mmask16)((1u << r) - 1);
		__mmask16 m1 = r > 16 ? (__mmask16)((1u << (r - 16)) - 1) : 0;
		a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, w + i), _mm512_maskz_loadu_ps(m0, x + i), a0);
		if (m1)
			a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, w + i + 16), _mm512_maskz_loadu_ps(m1, x + i + 16), a1);
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

static const struct pkv_dot_ops avx2_ops = {
	.isa = "avx2", .q4_0 = q4_0_avx2, .q4_1 = q4_1_avx2, .q8_0 = q8_0_avx2,
	.f32 = f32_avx2, .f16 = f16_avx2, .bf16 = bf16_avx2,
};

static const struct pkv_dot_ops avx512_ops = {
	.isa = "avx512bw", .q4_0 = q4_0_512, .q4_1 = q4_1_512, .q8_0 = q8_0_512,
	.f32 = f32_512, .f16 = f16_avx2, .bf16 = bf16_avx2, .quant_x4 = quant_x4_512,
};

const struct pkv_dot_ops *pkv_dot_ops_avx2(void)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return &avx2_ops;
	return NULL;
}

const struct pkv_dot_ops *pkv_dot_ops_avx512(void)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") &&
	    __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return &avx512_ops;
	return NULL;
}
#else
const struct pkv_dot_ops *pkv_dot_ops_avx2(void) { return NULL; }
const struct pkv_dot_ops *pkv_dot_ops_avx512(void) { return NULL; }
#endif
