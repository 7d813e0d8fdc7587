/* SPDX-License-Identifier: MIT */
/* The attention kernel, written once in GCC vector extensions and compiled per ISA by kernel_*.c. */
/*
 * Included by kernel_generic.c, kernel_avx2.c, kernel_avx512.c,
 * kernel_avx512bf16.c and kernel_amx.c, each compiled with its own -m flags
 * and defining KERNEL_ISA (the struct name suffix) and KERNEL_NAME (plus
 * KERNEL_DPBF16 / KERNEL_AMX for the bf16 paths). 16-float vectors become
 * one zmm, two ymm or four xmm registers depending on the target.
 *
 * Work item (see cpu.h): nq queries x nkvh KV heads x G query heads. Keys
 * are visited in tiles of CPU_TK straight from the paged cache through the
 * block table; for each KV head, the tile's rows are used by all its G*nq
 * query rows, so each KV byte is read from memory once per item.
 * - Scores, generic: dot products along the head dim against f32 rows (the
 *   cache row itself for f32, else converted into L1 scratch), four keys at
 *   a time with one combined horizontal reduction.
 * - Scores, bf16 cache and queries: vdpbf16ps over a K tile transposed into
 *   (dim pair) x (16 keys) vectors, or AMX tiles (TDPBF16PS) for 16-row
 *   blocks and decode heads.
 * - Softmax: online (flash-attention), f32, a tile of 32 scores per row
 *   exponentiated in native vectors (2 zmm, 4 ymm, 8 xmm); rows that see no key stay at l = 0 -> 0.
 * - PV: f32 rows of V broadcast-multiplied into per-row accumulators, or
 *   for bf16 key pairs interleaved once per tile with P rounded to bf16
 *   (vdpbf16ps / AMX), accumulating in f32.
 */
#include <math.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__))
#include <immintrin.h>
#endif

#include "cpu.h"


typedef float v16sf __attribute__((vector_size(64)));
typedef int32_t v16si __attribute__((vector_size(64)));
typedef uint16_t v16hu __attribute__((vector_size(32)));
typedef float v8sf __attribute__((vector_size(32)));
typedef float v4sf __attribute__((vector_size(16)));

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define ISA_SYM CAT(pkv_cpu_isa_, KERNEL_ISA)

static inline v16sf ld(const float *p)
{
	v16sf v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void st(float *p, v16sf v)
{
	memcpy(p, &v, sizeof(v));
}

static inline v16sf as_f(v16si i)
{
	v16sf f;

	memcpy(&f, &i, sizeof(f));
	return f;
}

static inline float hsum(v16sf v)
{
	v8sf a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
		 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
	v4sf b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);

	return (b[0] + b[2]) + (b[1] + b[3]);
}

/* Horizontal sums of four vectors at once: [sum a, sum b, sum c, sum d]. */
static inline v4sf hsum4(v16sf a, v16sf b, v16sf c, v16sf d)
{
	v8sf a8 = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
		  __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
	v8sf b8 = __builtin_shufflevector(b, b, 0, 1, 2, 3, 4, 5, 6, 7) +
		  __builtin_shufflevector(b, b, 8, 9, 10, 11, 12, 13, 14, 15);
	v8sf c8 = __builtin_shufflevector(c, c, 0, 1, 2, 3, 4, 5, 6, 7) +
		  __builtin_shufflevector(c, c, 8, 9, 10, 11, 12, 13, 14, 15);
	v8sf d8 = __builtin_shufflevector(d, d, 0, 1, 2, 3, 4, 5, 6, 7) +
		  __builtin_shufflevector(d, d, 8, 9, 10, 11, 12, 13, 14, 15);
	/* [a01 b01 a23 b23 a45 b45 a67 b67] */
	v8sf ab = __builtin_shufflevector(a8, b8, 0, 8, 2, 10, 4, 12, 6, 14) +
		  __builtin_shufflevector(a8, b8, 1, 9, 3, 11, 5, 13, 7, 15);
	v8sf cd = __builtin_shufflevector(c8, d8, 0, 8, 2, 10, 4, 12, 6, 14) +
		  __builtin_shufflevector(c8, d8, 1, 9, 3, 11, 5, 13, 7, 15);
	/* [a0-3 b0-3 c0-3 d0-3 a4-7 b4-7 c4-7 d4-7] */
	v8sf abcd = __builtin_shufflevector(ab, cd, 0, 1, 8, 9, 4, 5, 12, 13) +
		    __builtin_shufflevector(ab, cd, 2, 3, 10, 11, 6, 7, 14, 15);

	return __builtin_shufflevector(abcd, abcd, 0, 1, 2, 3) + __builtin_shufflevector(abcd, abcd, 4, 5, 6, 7);
}

/* 16 elements of dtype at p as f32. */
static inline v16sf cvt16(const void *p, uint32_t dtype)
{
	if (dtype == PKV_DTYPE_F32)
		return ld(p);
	if (dtype == PKV_DTYPE_BF16) {
#if defined(__AVX512F__)
		/* vpmovzxwd straight from memory, then shift: two instructions for 16 values. */
		return (v16sf)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p)), 16));
#elif defined(__AVX2__)
		__m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p)), 16);
		__m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p + 1)), 16);
		v8sf l8 = (v8sf)_mm256_castsi256_ps(lo), h8 = (v8sf)_mm256_castsi256_ps(hi);

		return __builtin_shufflevector(l8, h8, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
		v16hu h;

		memcpy(&h, p, sizeof(h));
		return as_f(__builtin_convertvector(h, v16si) << 16);
#endif
	}
#if defined(__AVX512F__)
	return (v16sf)_mm512_cvtph_ps(_mm256_loadu_si256(p));
#elif defined(__F16C__)
	{
		__m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(p));
		__m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p + 1));
		v8sf l8 = (v8sf)lo, h8 = (v8sf)hi;

		return __builtin_shufflevector(l8, h8, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
	}
#else
	{
		v16sf v;
		int i;

		for (i = 0; i < 16; i++)
			v[i] = pkv_f16_to_f32(((const uint16_t *)p)[i]);
		return v;
	}
#endif
}

/*
 * The f32 score and PV loops and the row conversion below work in the target's own vector width.
 * GCC has no register mode for a 64-byte vector without AVX-512: a v16sf
 * accumulator lives on the stack there, and every FMA of these loops
 * round-tripped through memory (f32 decode read at 27 % of STREAM on AVX2,
 * against 100-150 % on AVX-512).
 */
#if defined(__AVX512F__)
typedef v16sf vnat;
#define NW 16u
#elif defined(__AVX__)
typedef v8sf vnat;
#define NW 8u
#else
typedef v4sf vnat;
#define NW 4u
#endif
typedef int32_t vnati __attribute__((vector_size(sizeof(vnat))));

/* mask ? a : b in the native width, where mask lanes are all-ones or zero. */
static inline vnat seln(vnati mask, vnat a, vnat b)
{
	return (vnat)(((vnati)a & mask) | ((vnati)b & ~mask));
}

/*
 * e^x for a vector, relative error ~2e-7; exactly 0 below -87.3 (so -inf,
 * a masked score, gives a probability of exactly 0).
 */
static inline vnat vexp(vnat x)
{
	const vnat z = { 0 };
	vnati under = x < z - 87.3f;
	vnat xc = seln(x > z + 88.3f, z + 88.3f, seln(under, z - 87.3f, x));
	vnat n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;
	vnat r = xc - n * 0.693145752f;
	vnat p;
	vnati e;

	r = r - n * 1.42860677e-6f;
	p = z + 1.0f / 720;
	p = p * r + 1.0f / 120;
	p = p * r + 1.0f / 24;
	p = p * r + 1.0f / 6;
	p = p * r + 0.5f;
	p = p * r + 1.0f;
	p = p * r + 1.0f;
	e = (__builtin_convertvector(n, vnati) + 127) << 23;
	return (vnat)((vnati)(p * (vnat)e) & ~under);
}

/* tanh via e^(2x): 1 - 2 / (e^2x + 1); saturates cleanly to +-1. */
static inline vnat vtanh(vnat x)
{
	return 1.0f - 2.0f / (vexp(x + x) + 1.0f);
}

/* The largest lane of a native vector. */
static inline float hmaxn(vnat v)
{
#if defined(__AVX512F__)
	/* A halving tree: each step keeps the larger of every lane and its partner. */
	vnat t = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);

	v = seln(v > t, v, t);
	t = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
	v = seln(v > t, v, t);
	t = __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
	v = seln(v > t, v, t);
	t = __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
	v = seln(v > t, v, t);
	return v[0];
#else
	float m = v[0];

	for (uint32_t i = 1; i < NW; i++)
		m = v[i] > m ? v[i] : m;
	return m;
#endif
}

static inline vnat ldn(const float *p)
{
	vnat v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void stn(float *p, vnat v)
{
	memcpy(p, &v, sizeof(v));
}

/* [sum a, sum b, sum c, sum d] of four native vectors. */
static inline v4sf hsum4n(vnat a, vnat b, vnat c, vnat d)
{
#if defined(__AVX512F__)
	return hsum4(a, b, c, d);
#else
#if defined(__AVX__)
	v4sf a4 = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
	v4sf b4 = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
	v4sf c4 = __builtin_shufflevector(c, c, 0, 1, 2, 3) + __builtin_shufflevector(c, c, 4, 5, 6, 7);
	v4sf d4 = __builtin_shufflevector(d, d, 0, 1, 2, 3) + __builtin_shufflevector(d, d, 4, 5, 6, 7);
#else
	v4sf a4 = a, b4 = b, c4 = c, d4 = d;
#endif
	/* [a01 b01 a23 b23] and [c01 d01 c23 d23], then [a b c d] */
	v4sf ab = __builtin_shufflevector(a4, b4, 0, 4, 2, 6) + __builtin_shufflevector(a4, b4, 1, 5, 3, 7);
	v4sf cd = __builtin_shufflevector(c4, d4, 0, 4, 2, 6) + __builtin_shufflevector(c4, d4, 1, 5, 3, 7);

	return __builtin_shufflevector(ab, cd, 0, 1, 4, 5) + __builtin_shufflevector(ab, cd, 2, 3, 6, 7);
#endif
}

/* The sum of a native vector's lanes. */
static inline float hsumn(vnat v)
{
#if defined(__AVX512F__)
	return hsum(v);
#else
	const vnat z = { 0 };

	return hsum4n(v, z, z, z)[0];
#endif
}

/* NW elements of a bf16 or f16 row at p as f32 (row_to_f32's loop, in the native width). */
static inline vnat cvtn(const void *p, uint32_t dtype)
{
#if defined(__AVX512F__)
	return cvt16(p, dtype);
#elif defined(__AVX2__)
	if (dtype == PKV_DTYPE_BF16)
		return (vnat)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p)), 16));
	return (vnat)_mm256_cvtph_ps(_mm_loadu_si128(p));
#else
	vnat v = { 0 };

	for (uint32_t i = 0; i < NW; i++)
		v[i] = pkv_cpu_load(p, dtype, i);
	return v;
#endif
}

/* Converts a row of hd elements to f32 in dst, zero-padded to hdp. */
static inline void row_to_f32(float *dst, const void *src, uint32_t dtype, uint32_t hd, uint32_t hdp)
{
	uint32_t esz = pkv_dtype_size(dtype), d;

	if (dtype == PKV_DTYPE_F32) {
		memcpy(dst, src, (size_t)hd * sizeof(float));
		d = hd;
	} else {
		for (d = 0; d + NW <= hd; d += NW)
			stn(dst + d, cvtn((const char *)src + (size_t)d * esz, dtype));
	}
	for (; d < hd; d++)
		dst[d] = pkv_cpu_load(src, dtype, d);
	for (; d < hdp; d++)
		dst[d] = 0.0f;
}

#if defined(KERNEL_DPBF16)
/* Scores with vdpbf16ps straight from the bf16 cache: bf16 x bf16 products are exact in f32. */
static void scores_dpbf16(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *krow,
			  uint32_t nt, uint32_t R)
{
	uint32_t nc = (c->hd + 31) / 32, tail = c->hd % 32, r, t, k;
	__mmask32 tmask = tail ? (__mmask32)((1u << tail) - 1) : (__mmask32)~0u;

	for (r = 0; r < R; r++) {
		const uint16_t *q = sc->qh + (size_t)r * CPU_MAX_HD;
		float *s = sc->s + (size_t)r * CPU_TK;

		for (t = 0; t + 4 <= nt; t += 4) {
			__m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;

			for (k = 0; k < nc; k++) {
				__m512bh qv = (__m512bh)_mm512_loadu_si512(q + 32 * k);
				__mmask32 m = k == nc - 1 ? tmask : (__mmask32)~0u;

				a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_maskz_loadu_epi16(m, krow[t] + 64 * k), qv);
				a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_maskz_loadu_epi16(m, krow[t + 1] + 64 * k), qv);
				a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_maskz_loadu_epi16(m, krow[t + 2] + 64 * k), qv);
				a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_maskz_loadu_epi16(m, krow[t + 3] + 64 * k), qv);
			}
			{
				v4sf h = hsum4((v16sf)a0, (v16sf)a1, (v16sf)a2, (v16sf)a3);

				memcpy(s + t, &h, sizeof(h));
			}
		}
		for (; t < nt; t++) {
			__m512 a0 = _mm512_setzero_ps();

			for (k = 0; k < nc; k++) {
				__mmask32 m = k == nc - 1 ? tmask : (__mmask32)~0u;

				a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_maskz_loadu_epi16(m, krow[t] + 64 * k),
						      (__m512bh)_mm512_loadu_si512(q + 32 * k));
			}
			s[t] = hsum((v16sf)a0);
		}
	}
}
#endif

#if defined(KERNEL_DPBF16)
/*
 * acc[r] += P[r] . V with vdpbf16ps, two keys per instruction (bf16 cache,
 * head_dim % 32 == 0). The V rows of a key pair are interleaved with
 * vpunpck{l,h}wd once per tile and shared by all R rows; P is rounded to
 * bf16 for the product, as FlashAttention does for its PV matmul (the sums
 * stay f32). The unpack permutes dims inside each 128-bit lane: acc keeps
 * that order until unpermute_acc.
 */
static void accumulate_pv_dpbf16(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *vraw,
				 const char *const *vnext, uint32_t nt, uint32_t R)
{
	uint32_t nc = c->hd / 32, np = (nt + 1) / 2, r, t, k;
	__m512i *v2 = (__m512i *)sc->vf; /* [np][nc][lo, hi] */

	for (t = 0; t < np; t++)
		for (k = 0; k < nc; k++) {
			__m512i a = _mm512_loadu_si512(vraw[2 * t] + 64 * k);
			__m512i b = 2 * t + 1 < nt ? _mm512_loadu_si512(vraw[2 * t + 1] + 64 * k) : _mm512_setzero_si512();

			if (vnext[2 * t])
				__builtin_prefetch(vnext[2 * t] + 64 * k, 0, 2);
			if (2 * t + 1 < CPU_TK && vnext[2 * t + 1])
				__builtin_prefetch(vnext[2 * t + 1] + 64 * k, 0, 2);
			v2[(t * nc + k) * 2] = _mm512_unpacklo_epi16(a, b);
			v2[(t * nc + k) * 2 + 1] = _mm512_unpackhi_epi16(a, b);
		}
	for (r = 0; r < R; r++) {
		const float *p = sc->s + (size_t)r * CPU_TK;
		float *a = sc->acc + (size_t)r * c->hdp;
		uint32_t ph[CPU_TK / 2];

		/* 32 probabilities -> 32 bf16, i.e. 16 (key, key+1) pairs. */
		_mm512_storeu_si512(ph, (__m512i)_mm512_cvtne2ps_pbh((__m512)ld(p + 16), (__m512)ld(p)));
		for (k = 0; k < nc; k++) {
			__m512 lo0 = _mm512_loadu_ps(a + 32 * k), hi0 = _mm512_loadu_ps(a + 32 * k + 16);
			__m512 lo1 = _mm512_setzero_ps(), hi1 = _mm512_setzero_ps();

			for (t = 0; t + 2 <= np; t += 2) {
				__m512bh p0 = (__m512bh)_mm512_set1_epi32((int)ph[t]);
				__m512bh p1 = (__m512bh)_mm512_set1_epi32((int)ph[t + 1]);

				lo0 = _mm512_dpbf16_ps(lo0, (__m512bh)v2[(t * nc + k) * 2], p0);
				hi0 = _mm512_dpbf16_ps(hi0, (__m512bh)v2[(t * nc + k) * 2 + 1], p0);
				lo1 = _mm512_dpbf16_ps(lo1, (__m512bh)v2[((t + 1) * nc + k) * 2], p1);
				hi1 = _mm512_dpbf16_ps(hi1, (__m512bh)v2[((t + 1) * nc + k) * 2 + 1], p1);
			}
			if (t < np) {
				__m512bh p0 = (__m512bh)_mm512_set1_epi32((int)ph[t]);

				lo0 = _mm512_dpbf16_ps(lo0, (__m512bh)v2[(t * nc + k) * 2], p0);
				hi0 = _mm512_dpbf16_ps(hi0, (__m512bh)v2[(t * nc + k) * 2 + 1], p0);
			}
			_mm512_storeu_ps(a + 32 * k, _mm512_add_ps(lo0, lo1));
			_mm512_storeu_ps(a + 32 * k + 16, _mm512_add_ps(hi0, hi1));
		}
	}
}

/*
 * Scores with vdpbf16ps and no horizontal sums (bf16 cache and queries,
 * head_dim % 32 == 0): the K tile is transposed once into (dim pair) x
 * (16 keys) vectors, 16x16 dword transposes in three shuffle stages, then
 * each query row's dim pair is broadcast against 16 keys at a time. The
 * shuffles (port 5) overlap the dot products (port 0).
 */
static void transpose_k_tile(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *kraw,
			     const char *const *knext, uint32_t nt)
{
	uint32_t np = c->hd / 2, nchunk = c->hd / 32, g, k, i, p, cc;
	__m512i *kt = (__m512i *)sc->kf; /* [np][2]: keys 0-15, 16-31 */

	for (g = 0; g < 2; g++) {
		if (g * 16 >= nt) {
			for (p = 0; p < np; p++)
				kt[p * 2 + g] = _mm512_setzero_si512();
			continue;
		}
		for (k = 0; k < nchunk; k++) {
			__m512i rw[16], a[16], b[16];

			for (i = 0; i < 16; i++) {
				rw[i] = g * 16 + i < nt ? _mm512_loadu_si512(kraw[g * 16 + i] + 64 * k) : _mm512_setzero_si512();
				if (knext[g * 16 + i])
					__builtin_prefetch(knext[g * 16 + i] + 64 * k, 0, 2);
			}
			for (i = 0; i < 8; i++) {
				a[2 * i] = _mm512_unpacklo_epi32(rw[2 * i], rw[2 * i + 1]);
				a[2 * i + 1] = _mm512_unpackhi_epi32(rw[2 * i], rw[2 * i + 1]);
			}
			/* b[4i + c], lane L: column 4L + c of rows 4i..4i+3. */
			for (i = 0; i < 4; i++) {
				b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
				b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
				b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
				b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
			}
			/* A 4x4 transpose of 128-bit lanes gathers each column's 16 rows. */
			for (cc = 0; cc < 4; cc++) {
				__m512i x0 = _mm512_shuffle_i32x4(b[cc], b[4 + cc], 0x44);
				__m512i x1 = _mm512_shuffle_i32x4(b[cc], b[4 + cc], 0xee);
				__m512i y0 = _mm512_shuffle_i32x4(b[8 + cc], b[12 + cc], 0x44);
				__m512i y1 = _mm512_shuffle_i32x4(b[8 + cc], b[12 + cc], 0xee);

				kt[(16 * k + cc) * 2 + g] = _mm512_shuffle_i32x4(x0, y0, 0x88);
				kt[(16 * k + 4 + cc) * 2 + g] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
				kt[(16 * k + 8 + cc) * 2 + g] = _mm512_shuffle_i32x4(x1, y1, 0x88);
				kt[(16 * k + 12 + cc) * 2 + g] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
			}
		}
	}
}

static void scores_dpbf16_t(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *kraw,
			    const char *const *knext, uint32_t nt, uint32_t R)
{
	uint32_t np = c->hd / 2, r, p;
	__m512i *kt = (__m512i *)sc->kf;

	transpose_k_tile(c, sc, kraw, knext, nt);
	for (r = 0; r + 4 <= R; r += 4) {
		const uint32_t *q0 = (const uint32_t *)(sc->qh + (size_t)r * CPU_MAX_HD);
		const uint32_t *q1 = q0 + CPU_MAX_HD / 2, *q2 = q1 + CPU_MAX_HD / 2, *q3 = q2 + CPU_MAX_HD / 2;
		__m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
		float *srow = sc->s + (size_t)r * CPU_TK;

		for (p = 0; p < np; p++) {
			__m512bh k0 = (__m512bh)kt[2 * p], k1 = (__m512bh)kt[2 * p + 1];
			__m512bh w;

			w = (__m512bh)_mm512_set1_epi32((int)q0[p]);
			a0 = _mm512_dpbf16_ps(a0, k0, w);
			a1 = _mm512_dpbf16_ps(a1, k1, w);
			w = (__m512bh)_mm512_set1_epi32((int)q1[p]);
			b0 = _mm512_dpbf16_ps(b0, k0, w);
			b1 = _mm512_dpbf16_ps(b1, k1, w);
			w = (__m512bh)_mm512_set1_epi32((int)q2[p]);
			c0 = _mm512_dpbf16_ps(c0, k0, w);
			c1 = _mm512_dpbf16_ps(c1, k1, w);
			w = (__m512bh)_mm512_set1_epi32((int)q3[p]);
			d0 = _mm512_dpbf16_ps(d0, k0, w);
			d1 = _mm512_dpbf16_ps(d1, k1, w);
		}
		_mm512_storeu_ps(srow, a0);
		_mm512_storeu_ps(srow + 16, a1);
		_mm512_storeu_ps(srow + CPU_TK, b0);
		_mm512_storeu_ps(srow + CPU_TK + 16, b1);
		_mm512_storeu_ps(srow + 2 * CPU_TK, c0);
		_mm512_storeu_ps(srow + 2 * CPU_TK + 16, c1);
		_mm512_storeu_ps(srow + 3 * CPU_TK, d0);
		_mm512_storeu_ps(srow + 3 * CPU_TK + 16, d1);
	}
	for (; r < R; r++) {
		const uint32_t *q0 = (const uint32_t *)(sc->qh + (size_t)r * CPU_MAX_HD);
		__m512 a0 = _mm512_setzero_ps(), a1 = a0;

		for (p = 0; p < np; p++) {
			__m512bh w = (__m512bh)_mm512_set1_epi32((int)q0[p]);

			a0 = _mm512_dpbf16_ps(a0, (__m512bh)kt[2 * p], w);
			a1 = _mm512_dpbf16_ps(a1, (__m512bh)kt[2 * p + 1], w);
		}
		_mm512_storeu_ps(sc->s + (size_t)r * CPU_TK, a0);
		_mm512_storeu_ps(sc->s + (size_t)r * CPU_TK + 16, a1);
	}
}

#if defined(KERNEL_AMX)
/*
 * AMX (TDPBF16PS) for blocks of 16 rows: the same operands as the AVX-512
 * bf16 paths, already in the layouts the tile unit wants. Scores: A = 16
 * query rows x 32 dims (qh), B = the transposed K tile's 16 dim pairs x 16
 * keys (kt). PV: A = 16 rows x 32 probabilities in bf16, B = 16 key pairs x
 * 16 dims of the interleaved V tile (v2, whose permuted dim order the
 * accumulators keep). Tiles: 0-1 C scores, 2 A, 3-4 B, 5 A (P), 6 C (acc), 7 B (V).
 */
struct amx_tilecfg {
	uint8_t palette, start_row, reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
} __attribute__((aligned(64)));

/*
 * rows: query rows per block, 16 for prefill blocks, G (< 16) for a decode
 * item's heads. kdirect (decode): scores as S^T = K . Q^T, so tile 0 holds
 * 16 keys x G rows, tile 2 sixteen K rows straight from a block, tile 3 Q^T.
 */
static void amx_begin(uint32_t rows, int kdirect)
{
	struct amx_tilecfg cfg;
	int i;

	memset(&cfg, 0, sizeof(cfg));
	cfg.palette = 1;
	for (i = 0; i < 8; i++) {
		cfg.colsb[i] = 64;
		/* B tiles (3, 4, 7) always hold 16 dim or key pairs; A and C tiles hold the rows. */
		cfg.rows[i] = (i == 3 || i == 4 || i == 7) ? 16 : (uint8_t)rows;
	}
	if (kdirect) {
		cfg.rows[0] = 16;
		cfg.colsb[0] = (uint16_t)(4 * rows);
		cfg.rows[2] = 16;
		cfg.colsb[3] = (uint16_t)(4 * rows);
	}
	_tile_loadconfig(&cfg);
}

/*
 * Decode scores without transposing K: a 16-key group of one block is a
 * strided tile (token_stride) AMX loads as the A operand; Q^T in pair
 * layout (qt, built once per item) is B. Needs block_size % 16 == 0 and
 * tiles starting on 16-key boundaries, so a group never spans two blocks.
 */
static void scores_amx_kdirect(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *kraw,
			       uint32_t nt, uint32_t R, const uint32_t *qt)
{
	float st[16 * 16];
	uint32_t g, k, i, r;

	for (g = 0; g < 2; g++) {
		if (16 * g >= nt) {
			for (r = 0; r < R; r++)
				memset(sc->s + (size_t)r * CPU_TK + 16 * g, 0, 16 * sizeof(float));
			continue;
		}
		_tile_zero(0);
		for (k = 0; k < c->hd / 32; k++) {
			_tile_loadd(2, kraw[16 * g] + 64 * k, c->token_stride);
			_tile_loadd(3, qt + (size_t)k * 16 * R, R * 4);
			_tile_dpbf16ps(0, 2, 3);
		}
		_tile_stored(0, st, R * 4);
		for (i = 0; i < 16; i++)
			for (r = 0; r < R; r++)
				sc->s[(size_t)r * CPU_TK + 16 * g + i] = st[i * R + r];
	}
}

static void scores_amx(const struct cpu_call *c, struct cpu_scratch *sc, uint32_t R)
{
	const char *kt = (const char *)sc->kf;
	uint32_t rb, k;

	for (rb = 0; rb < R; rb += 16) {
		_tile_zero(0);
		_tile_zero(1);
		for (k = 0; k < c->hd / 32; k++) {
			_tile_loadd(2, sc->qh + (size_t)rb * CPU_MAX_HD + 32 * k, CPU_MAX_HD * 2);
			_tile_loadd(3, kt + (size_t)16 * k * 128, 128);
			_tile_loadd(4, kt + (size_t)16 * k * 128 + 64, 128);
			_tile_dpbf16ps(0, 2, 3);
			_tile_dpbf16ps(1, 2, 4);
		}
		_tile_stored(0, sc->s + (size_t)rb * CPU_TK, CPU_TK * 4);
		_tile_stored(1, sc->s + (size_t)rb * CPU_TK + 16, CPU_TK * 4);
	}
}

static void accumulate_pv_amx(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *vraw,
			      const char *const *vnext, uint32_t nt, uint32_t R)
{
	uint32_t nc = c->hd / 32, np = (nt + 1) / 2, r, t, k, lh, rb;
	__m512i *v2 = (__m512i *)sc->vf; /* [16 pairs][nc][lo, hi] */
	uint16_t *ph = (uint16_t *)((char *)sc->vf + (size_t)CPU_TK / 2 * CPU_MAX_HD / 32 * 128);

	for (t = 0; t < CPU_TK / 2; t++)
		for (k = 0; k < nc; k++) {
			__m512i a = t < np ? _mm512_loadu_si512(vraw[2 * t] + 64 * k) : _mm512_setzero_si512();
			__m512i b = 2 * t + 1 < nt ? _mm512_loadu_si512(vraw[2 * t + 1] + 64 * k) : _mm512_setzero_si512();

			if (vnext[2 * t])
				__builtin_prefetch(vnext[2 * t] + 64 * k, 0, 2);
			if (vnext[2 * t + 1])
				__builtin_prefetch(vnext[2 * t + 1] + 64 * k, 0, 2);
			v2[(t * nc + k) * 2] = _mm512_unpacklo_epi16(a, b);
			v2[(t * nc + k) * 2 + 1] = _mm512_unpackhi_epi16(a, b);
		}
	for (r = 0; r < R; r++) {
		const float *p = sc->s + (size_t)r * CPU_TK;

		_mm512_storeu_si512(ph + (size_t)r * CPU_TK,
				    (__m512i)_mm512_cvtne2ps_pbh((__m512)ld(p + 16), (__m512)ld(p)));
	}
	for (rb = 0; rb < R; rb += 16) {
		_tile_loadd(5, ph + (size_t)rb * CPU_TK, CPU_TK * 2);
		for (k = 0; k < nc; k++)
			for (lh = 0; lh < 2; lh++) {
				float *a = sc->acc + (size_t)rb * c->hdp + 32 * k + 16 * lh;

				_tile_loadd(6, a, c->hdp * 4);
				_tile_loadd(7, (const char *)v2 + (size_t)(k * 2 + lh) * 64, nc * 128);
				_tile_dpbf16ps(6, 5, 7);
				_tile_stored(6, a, c->hdp * 4);
			}
	}
}
#endif

/* Back from accumulate_pv_dpbf16's lane order to dims in order, for each 32-dim chunk. */
static void unpermute_acc(float *a, uint32_t hd)
{
	float tmp[32];
	uint32_t k, l, j;

	for (k = 0; k < hd; k += 32) {
		for (l = 0; l < 4; l++)
			for (j = 0; j < 4; j++) {
				tmp[8 * l + j] = a[k + 4 * l + j];
				tmp[8 * l + 4 + j] = a[k + 16 + 4 * l + j];
			}
		memcpy(a + k, tmp, sizeof(tmp));
	}
}
#endif

/*
 * NW elements of a K or V row from element i on: f32 rows as stored, bf16
 * and f16 rows widened as loaded (dt is a constant at every call).
 */
static inline __attribute__((always_inline)) vnat ldrow(const void *row, uint32_t i, uint32_t dt)
{
	if (dt == PKV_DTYPE_F32)
		return ldn((const float *)row + i);
	return cvtn((const char *)row + (size_t)i * 2, dt);
}

/* Scores of R query vectors against nt keys (rows of dt at krow[t], hdp long). */
static inline __attribute__((always_inline)) void scores_rows(const struct cpu_call *c, struct cpu_scratch *sc,
							      const void *const *krow, uint32_t nt, uint32_t R,
							      uint32_t dt)
{
	uint32_t nc = c->hdp / NW, r, t, k;

	for (r = 0; r < R; r++) {
		const float *q = sc->qf + (size_t)r * c->hdp;
		float *s = sc->s + (size_t)r * CPU_TK;

		for (t = 0; t + 4 <= nt; t += 4) {
			const void *k0 = krow[t], *k1 = krow[t + 1], *k2 = krow[t + 2], *k3 = krow[t + 3];
			vnat a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };

			for (k = 0; k < nc; k++) {
				vnat qv = ldn(q + NW * k);

				a0 += qv * ldrow(k0, NW * k, dt);
				a1 += qv * ldrow(k1, NW * k, dt);
				a2 += qv * ldrow(k2, NW * k, dt);
				a3 += qv * ldrow(k3, NW * k, dt);
			}
			{
				v4sf h = hsum4n(a0, a1, a2, a3);

				memcpy(s + t, &h, sizeof(h));
			}
		}
		for (; t < nt; t++) {
			vnat a0 = { 0 }, z = { 0 };

			for (k = 0; k < nc; k++)
				a0 += ldn(q + NW * k) * ldrow(krow[t], NW * k, dt);
			s[t] = hsum4n(a0, z, z, z)[0];
		}
	}
}

/* acc[r] += P[r] . V for a tile (rows of dt), 4 rows at a time sharing each V load. */
static inline __attribute__((always_inline)) void pv_rows(const struct cpu_call *c, struct cpu_scratch *sc,
							  const void *const *vrow, uint32_t nt, uint32_t R,
							  uint32_t dt)
{
	uint32_t nc = c->hdp / NW, r, t, k;

	for (k = 0; k < nc; k++) {
		for (r = 0; r + 4 <= R; r += 4) {
			float *a = sc->acc + (size_t)r * c->hdp + NW * k;
			const float *p = sc->s + (size_t)r * CPU_TK;
			vnat a0 = ldn(a), a1 = ldn(a + c->hdp), a2 = ldn(a + 2 * c->hdp), a3 = ldn(a + 3 * c->hdp);

			for (t = 0; t < nt; t++) {
				vnat v = ldrow(vrow[t], NW * k, dt);

				a0 += p[t] * v;
				a1 += p[CPU_TK + t] * v;
				a2 += p[2 * CPU_TK + t] * v;
				a3 += p[3 * CPU_TK + t] * v;
			}
			stn(a, a0);
			stn(a + c->hdp, a1);
			stn(a + 2 * c->hdp, a2);
			stn(a + 3 * c->hdp, a3);
		}
		for (; r < R; r++) {
			float *a = sc->acc + (size_t)r * c->hdp + NW * k;
			const float *p = sc->s + (size_t)r * CPU_TK;
			/* Two chains: one FMA's latency per key would bound a single accumulator. */
			vnat a0 = ldn(a), a1 = { 0 };

			for (t = 0; t + 2 <= nt; t += 2) {
				a0 += p[t] * ldrow(vrow[t], NW * k, dt);
				a1 += p[t + 1] * ldrow(vrow[t + 1], NW * k, dt);
			}
			if (t < nt)
				a0 += p[t] * ldrow(vrow[t], NW * k, dt);
			stn(a, a0 + a1);
		}
	}
}

static void scores_f32(const struct cpu_call *c, struct cpu_scratch *sc, const float *const *krow,
		       uint32_t nt, uint32_t R)
{
	scores_rows(c, sc, (const void *const *)krow, nt, R, PKV_DTYPE_F32);
}

static void accumulate_pv(const struct cpu_call *c, struct cpu_scratch *sc, const float *const *vrow,
			  uint32_t nt, uint32_t R)
{
	pv_rows(c, sc, (const void *const *)vrow, nt, R, PKV_DTYPE_F32);
}

/*
 * Rows per KV head up to which the tile path widens 16-bit rows as loaded:
 * each row of the tile is loaded once per query row, so with many rows (a
 * prefill's 16 queries x G) converting the tile once pays (AVX2 bf16 prefill
 * hd128 read 16-19 GFLOP/s widening per row against 25-29 converting).
 */
#ifndef LOAD16_MAX_ROWS
#define LOAD16_MAX_ROWS 8u
#endif
#if !defined(__AVX512F__)
/*
 * Scores and PV straight from bf16 / f16 rows, widened as loaded (a
 * vpmovzxwd and a shift, or a vcvtph2ps, per 8 values on AVX2): converting
 * each tile's rows into scratch first wrote and read every value once more,
 * and a bf16 decode read at 31 % of STREAM. The AVX-512 kernels keep the
 * conversion (or use vdpbf16ps and their decode loops).
 */
static void scores_widen(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *krow,
			 uint32_t nt, uint32_t R)
{
	if (c->cdt == PKV_DTYPE_BF16)
		scores_rows(c, sc, (const void *const *)krow, nt, R, PKV_DTYPE_BF16);
	else
		scores_rows(c, sc, (const void *const *)krow, nt, R, PKV_DTYPE_F16);
}

static void pv_widen(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *vrow, uint32_t nt,
		     uint32_t R)
{
	if (c->cdt == PKV_DTYPE_BF16)
		pv_rows(c, sc, (const void *const *)vrow, nt, R, PKV_DTYPE_BF16);
	else
		pv_rows(c, sc, (const void *const *)vrow, nt, R, PKV_DTYPE_F16);
}
#endif

/*
 * Online softmax over one tile: turns row r's scores into probabilities
 * relative to the new running max, rescales its accumulator and sum.
 * Columns >= nt, and keys outside [lo, hi], are masked to -inf first.
 */
static void softmax_tile(const struct cpu_call *c, struct cpu_scratch *sc, uint32_t t0, uint32_t nt, uint32_t R)
{
	enum { NV = CPU_TK / NW };
	const vnat ninf = (vnat){ 0 } - INFINITY, z = { 0 };
	vnati idx0;
	uint32_t nc = c->hdp / NW, r, k, j;

	for (j = 0; j < NW; j++)
		idx0[j] = (int32_t)j;
	for (r = 0; r < R; r++) {
		float *s = sc->s + (size_t)r * CPU_TK;
		vnat sv[NV], m, sum = z;
		int32_t lo = sc->lo[r], hi = sc->hi[r];
		int32_t last = (int32_t)(t0 + nt) - 1;
		float mt, mnew, corr;

#pragma GCC unroll 8
		for (j = 0; j < NV; j++)
			sv[j] = ldn(s + NW * j) * c->scale;
		if (c->softcap > 0) {
#pragma GCC unroll 8
			for (j = 0; j < NV; j++)
				sv[j] = c->softcap * vtanh(sv[j] * (1.0f / c->softcap));
		}
		if (lo > (int32_t)t0 || hi < last || nt < CPU_TK) {
			/* Key index of each lane relative to this row's visible range. */
			int32_t h = hi < last ? hi : last;

#pragma GCC unroll 8
			for (j = 0; j < NV; j++) {
				vnati jv = idx0 + (int32_t)(t0 + NW * j);

				sv[j] = seln((jv >= lo) & (jv <= h), sv[j], ninf);
			}
		}
		m = sv[0];
#pragma GCC unroll 8
		for (j = 1; j < NV; j++)
			m = seln(m > sv[j], m, sv[j]);
		mt = hmaxn(m);
		mnew = mt > sc->m[r] ? mt : sc->m[r];
		if (mnew == -INFINITY) {
			/* Nothing visible yet: probabilities 0, state unchanged. */
			memset(s, 0, CPU_TK * sizeof(float));
			continue;
		}
#pragma GCC unroll 8
		for (j = 0; j < NV; j++) {
			vnat e = vexp(sv[j] - mnew);

			stn(s + NW * j, e);
			sum += e;
		}
		corr = sc->m[r] == -INFINITY ? 0.0f : expf(sc->m[r] - mnew);
		sc->l[r] = sc->l[r] * corr + hsumn(sum);
		sc->m[r] = mnew;
		if (corr != 1.0f) {
			float *a = sc->acc + (size_t)r * c->hdp;

			for (k = 0; k < nc; k++)
				stn(a + NW * k, ldn(a + NW * k) * corr);
		}
	}
}

/* Prefetches the next tile's rows of one head into L2 (paths that convert rows one by one). */
static inline void prefetch_rows(const struct cpu_call *c, const char *const *next)
{
	size_t rowb = (size_t)c->hd * pkv_dtype_size(c->cdt), l;
	uint32_t t;

	for (t = 0; t < CPU_TK && next[t]; t++)
		for (l = 0; l < rowb; l += 64)
			__builtin_prefetch(next[t] + l, 0, 2);
}

#ifndef KDIRECT
#define KDIRECT 1
#endif

/* How far ahead (keys) the tile code prefetches: far enough to cover DRAM latency at full bandwidth. */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD CPU_TK
#endif

/* The scratch of rows [r0, ...): lets the tile functions work on one KV head's rows of an item. */
static inline struct cpu_scratch rows_from(const struct cpu_call *c, const struct cpu_scratch *sc, uint32_t r0)
{
	struct cpu_scratch v = *sc;

	v.qf += (size_t)r0 * c->hdp;
	v.qh += (size_t)r0 * CPU_MAX_HD;
	v.s += (size_t)r0 * CPU_TK;
	v.acc += (size_t)r0 * c->hdp;
	v.m += r0;
	v.l += r0;
	v.lo += r0;
	v.hi += r0;
	return v;
}

/* What attend_item decided once per item: the paths it takes and the keys any row sees. */
struct item_plan {
	int32_t kstart, kend;   /* keys [kstart, kend) cover every row's visible range; kend <= 0: none */
	uint32_t Rh, R;         /* rows per KV head, rows in all */
	int direct;             /* f32 cache rows used in place */
	int load16;             /* tile path: bf16 / f16 rows widened as loaded (kernels without AVX-512) */
	int use_dp, use_dp_pv;  /* bf16 scores / PV with vdpbf16ps */
	int use_amx, kdirect;   /* AMX tiles; AMX scores straight from K rows */
	uint32_t *qt;           /* AMX kdirect: [nkvh][hd/2][Rh] Q^T pairs */
	int dec;                /* tiles_decode: DEC_BF16 or DEC_FLOAT; DEC_NONE (0): the tile path */
	int widen;              /* DEC_FLOAT over a 16-bit cache: each tile's rows widened once, for every row */
	int many;               /* DEC_FLOAT, a shared item's many rows: scores on the transposed tile */
};

/*
 * The decode loop (tiles_decode) on every bf16 kernel, AMX included: it is
 * AVX-512+BF16 code, which every AMX CPU runs, and it reads whole token rows
 * in address order with the block-table prefetch, where the AMX decode path
 * reads one KV head at a time, token_stride apart (the order the issue
 * measured at 74-76% of STREAM before any compute). -DDEC_PATH=0 builds the
 * AMX decode path back, for comparison on an AMX host.
 */
#ifndef DEC_PATH
#if defined(KERNEL_DPBF16)
#define DEC_PATH 1
#else
#define DEC_PATH 0
#endif
#endif

/*
 * Loads the item's queries (f32, and raw bf16 for the vdpbf16ps paths),
 * each row's visible key range and its fresh online-softmax state.
 */
static void load_rows(const struct cpu_call *c, const struct cpu_item *it, struct cpu_scratch *sc,
		      struct item_plan *pl)
{
	const struct pkv_attn_batch *b = c->b;
	uint32_t asz = pkv_dtype_size(c->adt), r;

	pl->kstart = INT32_MAX;
	pl->kend = -1;
	for (r = 0; r < pl->R; r++) {
		uint32_t qi, h, s, pos;
		const char *src;
		int32_t sq, sk;

		cpu_row_map(c, it, r, &qi, &h);
		/* A shared-prefix item's rows come from several sequences: each row its own lengths. */
		cpu_row_query(c, it, qi, &s, &pos);
		sq = b->cu_seq_lens_q[s + 1] - b->cu_seq_lens_q[s];
		sk = b->cu_seq_lens_k[s + 1] - b->cu_seq_lens_k[s];
		src = (const char *)b->q + ((size_t)(b->cu_seq_lens_q[s] + pos) * b->q_stride_tok +
					    (size_t)h * b->q_stride_head) * asz;
		row_to_f32(sc->qf + (size_t)r * c->hdp, src, c->adt, c->hd, c->hdp);
		if (pl->use_dp) {
			memset(sc->qh + (size_t)r * CPU_MAX_HD, 0, CPU_MAX_HD * 2);
			memcpy(sc->qh + (size_t)r * CPU_MAX_HD, src, c->hd * 2);
		}
		sc->hi[r] = (int32_t)pos + (sk - sq);
		sc->lo[r] = c->window >= 0 ? sc->hi[r] - c->window : 0;
		if (sc->lo[r] < (int32_t)it->k0)
			sc->lo[r] = (int32_t)it->k0;
		if (sc->hi[r] > (int32_t)it->k1 - 1)
			sc->hi[r] = (int32_t)it->k1 - 1;
		if (sc->lo[r] <= sc->hi[r]) {
			pl->kstart = sc->lo[r] < pl->kstart ? sc->lo[r] : pl->kstart;
			pl->kend = sc->hi[r] + 1 > pl->kend ? sc->hi[r] + 1 : pl->kend;
		}
		sc->m[r] = -INFINITY;
		sc->l[r] = 0.0f;
		memset(sc->acc + (size_t)r * c->hdp, 0, c->hdp * sizeof(float));
	}
}

/* Writes each row's result: O = acc / l, or the (m, l, acc) partial of a split item. */
static void store_rows(const struct cpu_call *c, const struct cpu_item *it, struct cpu_scratch *sc,
		       const struct item_plan *pl)
{
	const struct pkv_attn_batch *b = c->b;
	uint32_t asz = pkv_dtype_size(c->adt), r;

	for (r = 0; r < pl->R; r++) {
		float *a = sc->acc + (size_t)r * c->hdp;

#if defined(KERNEL_DPBF16)
		if (pl->use_dp_pv)
			unpermute_acc(a, c->hd);
#endif
		if (it->part >= 0) {
			float *p = c->part + (size_t)it->part * c->part_stride + (size_t)r * (c->hdp + 2);

			p[0] = sc->m[r];
			p[1] = sc->l[r];
			memcpy(p + 2, a, c->hdp * sizeof(float));
		} else {
			uint32_t qi, h, d, s, pos;
			size_t tok;
			char *dst;
			/* A row that saw no key has l == 0: its output is 0, never 0/0. */
			float inv = sc->l[r] > 0 ? 1.0f / sc->l[r] : 0.0f;

			cpu_row_map(c, it, r, &qi, &h);
			cpu_row_query(c, it, qi, &s, &pos);
			tok = (size_t)(b->cu_seq_lens_q[s] + pos);
			dst = (char *)b->o + (tok * b->o_stride_tok + (size_t)h * b->o_stride_head) * asz;
			for (d = 0; d < c->hd; d++)
				a[d] *= inv;
			pkv_cpu_store_row(dst, c->adt, a, c->hd);
			/* m and l are of the scaled, soft-capped scores in e^x: their log-sum-exp is m + ln l. */
			if (c->lse)
				c->lse[tok * c->nh + h] = sc->l[r] > 0 ? sc->m[r] + logf(sc->l[r]) : -INFINITY;
		}
	}
}

/* Byte offsets (in a layer) of the token rows of keys [t0, t0 + n): one division per tile, not per key. */
static inline void tile_tokens(const struct cpu_call *c, const int32_t *bt, uint32_t t0, uint32_t n, size_t *tok)
{
	uint32_t blk = t0 / c->bs, off = t0 % c->bs, t;

	for (t = 0; t < n; t++) {
		tok[t] = (size_t)bt[blk] * c->block_stride + (size_t)off * c->token_stride;
		if (++off == c->bs) {
			off = 0;
			blk++;
		}
	}
}

#if defined(KERNEL_AMX)
/* Decides on AMX for the item and, for kdirect, lays out Q^T; then configures the tiles. */
static void amx_prepare(const struct cpu_call *c, const struct cpu_item *it, struct cpu_scratch *sc,
			struct item_plan *pl)
{
	uint32_t hh, k, n, Rh = pl->Rh;

	/* 16-row blocks (prefill), or one block of G < 16 rows per KV head (decode). */
	pl->use_amx = pl->use_dp_pv && (Rh % 16 == 0 || Rh < 16) && pl->R <= 128;
	/*
	 * K rows as the A operand when 16-key groups stay inside one block. Only
	 * from head_dim 128: at 64 the K transpose is cheap and the S^T scatter
	 * costs more than it saves (measured).
	 */
	pl->kdirect = KDIRECT && pl->use_amx && Rh < 16 && c->hd >= 128 && c->bs % 16 == 0 && pl->kstart >= 0 &&
		      pl->kstart % 16 == 0;
	pl->qt = (uint32_t *)sc->qf; /* qf is unused on the bf16 paths */
	if (pl->kdirect)
		for (hh = 0; hh < it->nkvh; hh++)
			for (k = 0; k < c->hd / 2; k++)
				for (n = 0; n < Rh; n++)
					pl->qt[((size_t)hh * (c->hd / 2) + k) * Rh + n] =
						((const uint32_t *)(sc->qh + (size_t)(hh * Rh + n) * CPU_MAX_HD))[k];
	if (pl->use_amx)
		amx_begin(Rh < 16 ? Rh : 16, pl->kdirect);
}
#endif

/* Scores of one KV head's rows (v) against the tile's keys, on the widest path the item allows. */
static void head_scores(const struct cpu_call *c, const struct item_plan *pl, struct cpu_scratch *sc,
			struct cpu_scratch *v, uint32_t hh, const char *const *kraw, const char *const *knext,
			uint32_t nt)
{
	const float *krow[CPU_TK];
	uint32_t t;

#if defined(KERNEL_AMX)
	if (pl->kdirect) {
		prefetch_rows(c, knext);
		scores_amx_kdirect(c, v, kraw, nt, pl->Rh, pl->qt + (size_t)hh * (c->hd / 2) * pl->Rh);
		return;
	}
	if (pl->use_amx) {
		/* The transposed K tile is AMX's B operand as it stands. */
		transpose_k_tile(c, v, kraw, knext, nt);
		scores_amx(c, v, pl->Rh);
		return;
	}
#endif
#if defined(KERNEL_DPBF16)
	if (pl->use_dp_pv) {
		scores_dpbf16_t(c, v, kraw, knext, nt, pl->Rh);
		return;
	}
	if (pl->use_dp) {
		scores_dpbf16(c, v, kraw, nt, pl->Rh);
		prefetch_rows(c, knext);
		return;
	}
#endif
	prefetch_rows(c, knext);
#if !defined(__AVX512F__)
	if (pl->load16) {
		scores_widen(c, v, kraw, nt, pl->Rh);
		return;
	}
#endif
	for (t = 0; t < nt; t++) {
		if (pl->direct) {
			krow[t] = (const float *)kraw[t];
		} else {
			row_to_f32(sc->kf + (size_t)t * c->hdp, kraw[t], c->cdt, c->hd, c->hdp);
			krow[t] = sc->kf + (size_t)t * c->hdp;
		}
	}
	scores_f32(c, v, krow, nt, pl->Rh);
}

/* acc += P . V for one KV head's rows (v) over the tile's keys. */
static void head_pv(const struct cpu_call *c, const struct item_plan *pl, struct cpu_scratch *sc,
		    struct cpu_scratch *v, const char *const *vraw, const char *const *vnext, uint32_t nt)
{
	const float *vrow[CPU_TK];
	uint32_t t;

#if defined(KERNEL_AMX)
	if (pl->use_amx) {
		accumulate_pv_amx(c, v, vraw, vnext, nt, pl->Rh);
		return;
	}
#endif
#if defined(KERNEL_DPBF16)
	if (pl->use_dp_pv) {
		accumulate_pv_dpbf16(c, v, vraw, vnext, nt, pl->Rh);
		return;
	}
#endif
	prefetch_rows(c, vnext);
#if !defined(__AVX512F__)
	if (pl->load16) {
		pv_widen(c, v, vraw, nt, pl->Rh);
		return;
	}
#endif
	for (t = 0; t < nt; t++) {
		if (pl->direct) {
			vrow[t] = (const float *)vraw[t];
		} else {
			row_to_f32(sc->vf + (size_t)t * c->hdp, vraw[t], c->cdt, c->hd, c->hdp);
			vrow[t] = sc->vf + (size_t)t * c->hdp;
		}
	}
	accumulate_pv(c, v, vrow, nt, pl->Rh);
}

/*
 * The general tile loop: tiles of CPU_TK keys; per tile, each KV head's rows
 * take scores, softmax and PV in turn, prefetching the same head's rows of
 * the tile PREFETCH_AHEAD keys on next to the reads.
 */
static void tiles_general(const struct cpu_call *c, const struct cpu_item *it, struct cpu_scratch *sc,
			  const struct item_plan *pl, const int32_t *bt)
{
	size_t csz = pkv_dtype_size(c->cdt), tok[CPU_TK], tok_next[CPU_TK];
	const char *kraw[CPU_TK], *vraw[CPU_TK], *knext[CPU_TK], *vnext[CPU_TK];
	uint32_t t0, t, hh, nt, n2;

	for (t0 = (uint32_t)pl->kstart; (int32_t)t0 < pl->kend; t0 += CPU_TK) {
		nt = (uint32_t)pl->kend - t0 < CPU_TK ? (uint32_t)pl->kend - t0 : CPU_TK;
		tile_tokens(c, bt, t0, nt, tok);
		/*
		 * Token offsets of the next tile, so the tile code can prefetch each
		 * row it reads for the next tile right next to the read: spread out,
		 * the prefetches overlap memory with compute; issued in one burst they
		 * stall on the fill buffers and serialise the two.
		 */
		n2 = 0;
		if ((int32_t)(t0 + PREFETCH_AHEAD) < pl->kend) {
			uint32_t p0 = t0 + PREFETCH_AHEAD;

			n2 = (uint32_t)pl->kend - p0 < CPU_TK ? (uint32_t)pl->kend - p0 : CPU_TK;
			tile_tokens(c, bt, p0, n2, tok_next);
		}
		for (hh = 0; hh < it->nkvh; hh++) {
			struct cpu_scratch v = rows_from(c, sc, hh * pl->Rh);
			size_t head = (size_t)(it->kvh + hh) * c->hd * csz;

			for (t = 0; t < CPU_TK; t++) {
				if (t < nt) {
					kraw[t] = c->kbase + tok[t] + head;
					vraw[t] = c->vbase + tok[t] + head;
				}
				knext[t] = t < n2 ? c->kbase + tok_next[t] + head : NULL;
				vnext[t] = t < n2 ? c->vbase + tok_next[t] + head : NULL;
			}
			head_scores(c, pl, sc, &v, hh, kraw, knext, nt);
			softmax_tile(c, &v, t0, nt, pl->Rh);
			head_pv(c, pl, sc, &v, vraw, vnext, nt);
		}
	}
}

/* pv_dec's probabilities (ph) hold 8 rows; the f32 decode loop takes as many. */
#define DEC_ROWS 8u

/*
 * The decode loop for f32 queries (any cache dtype, rows converted as they
 * are loaded) on the AVX-512 kernels (AVX-512, +BF16, AMX); the AVX2 and
 * generic kernels keep the tile path: built for AVX2 (16-float vectors as
 * ymm pairs, 4 keys reduced together) it read 1.2x (hd64) to 3x (hd128)
 * slower than the tile path there (docs/performance.md). -DDEC_F32=0
 * builds an AVX-512 kernel without it, for comparison.
 */
#ifndef DEC_F32
#if defined(__AVX512F__)
#define DEC_F32 1
#else
#define DEC_F32 0
#endif
#endif
#if DEC_F32 && !defined(__AVX512F__)
#error "the f32 decode loop is AVX-512 code"
#endif

/*
 * Most rows in all of a shared-prefix item (cascade decode: the decode
 * queries of several sequences against their common keys, every KV head)
 * that the f32 decode loop takes: its scores and PV take any number of rows
 * (a row, or a block of DECF_ROWS rows, at a time); the bound keeps the
 * scratch small (rmax rows of CPU_MAX_HD floats).
 */
#define DECF_WIDE_ROWS 256u
/*
 * Above this many rows per KV head a shared-prefix item widens a 16-bit
 * cache's tile once (scratch kf/vf) rather than per row as it loads it.
 */
/* -DDECF_KT=0: a shared item's scores per row along the head dim (scores_decf) instead, for comparison. */
#ifndef DECF_KT
#define DECF_KT 1
#endif
#ifndef DECF_WIDEN_ROWS
#define DECF_WIDEN_ROWS 4u
#endif

/* What tiles_decode computes a tile with. */
enum { DEC_NONE, DEC_BF16, DEC_FLOAT };

#if DEC_PATH || DEC_F32
/*
 * ---- Decode: a few query rows per KV head (G), whole token rows per item ----
 *
 * With G = 3-4 rows per KV head, sharing a transposed K tile across rows
 * does not pay: its 16x16 transposes cost 4 shuffles per 64 bytes of K
 * (~40% of hd64 decode compute). Here each key's dot product stays along
 * the head dim (vdpbf16ps straight from the cache row, queries in
 * registers) and 16 keys' partial vectors are reduced together in one tree
 * (hsum16: 2 shuffles per key and row), about half the shuffles at hd64 and
 * a third at hd128. PV keeps the key-pair interleave of accumulate_pv_dpbf16
 * but in registers, every row's accumulators updated from one load of V.
 *
 * f32 queries (DEC_FLOAT: an f32 cache, or f16/bf16 rows widened as they
 * are loaded) take the same loop with f32 FMAs: scores along the head dim,
 * 16 keys reduced together (hsum16), PV with up to 4 rows' accumulators
 * for 32 or 64 dims in registers.
 */

/*
 * How far ahead of its reads the decode loop prefetches, in bytes of K (and
 * as many of V). 32 KiB since the accumulators stay in registers: same-run
 * A/B against 48 / 64 / 96 KiB, 1 and 2 threads, 32 read 0-5 points more of
 * STREAM on every row but one (a shorter lead also leaves less to compute
 * after the last prefetch of a run).
 */
#ifndef DEC_PF_BYTES
#define DEC_PF_BYTES 32768
#endif

/* A run of whole token rows of one block: [off, off + len) bytes in a layer. */
struct kv_span {
	size_t off, len;
};

/* The spans of keys [t0, t0 + n), block by block (each block-table entry once). */
static uint32_t tile_spans(const struct cpu_call *c, const int32_t *bt, uint32_t t0, uint32_t n, struct kv_span *sp,
			   size_t *total)
{
	uint32_t blk = t0 / c->bs, off = t0 % c->bs, ns = 0;

	*total = 0;
	while (n) {
		uint32_t m = c->bs - off < n ? c->bs - off : n;

		sp[ns].off = (size_t)bt[blk] * c->block_stride + (size_t)off * c->token_stride;
		sp[ns].len = (size_t)m * c->token_stride;
		*total += sp[ns++].len;
		n -= m;
		off = 0;
		blk++;
	}
	return ns;
}

/*
 * A walk over spans' bytes in address order, prefetching `per` lines into
 * L2 at each step: the compute loops take steps between their loads, so
 * the requests go out spread over the tile instead of in one burst that
 * stalls on the fill buffers.
 */
struct pf_cursor {
	const char *base;
	const struct kv_span *sp;
	uint32_t ns, i, per;
	size_t b;           /* byte within sp[i] */
};

static inline void pf_step(struct pf_cursor *pc)
{
	uint32_t n = pc->per, m, j;

	/* A span at a time: in one span the lines are one address plus 64 each (no per-line bookkeeping). */
	while (n && pc->i < pc->ns) {
		const char *p = pc->base + pc->sp[pc->i].off + pc->b;
		size_t left = (pc->sp[pc->i].len - pc->b + 63) / 64;

		m = left < n ? (uint32_t)left : n;
#pragma GCC unroll 8
		for (j = 0; j < m; j++)
			__builtin_prefetch(p + 64 * (size_t)j, 0, 2);
		n -= m;
		pc->b += 64 * (size_t)m;
		if (pc->b >= pc->sp[pc->i].len) {
			pc->b = 0;
			pc->i++;
		}
	}
}

/* Positions a cursor at byte `from` of the spans, to cover `bytes` in `steps` steps. */
static void pf_start(struct pf_cursor *pc, const char *base, const struct kv_span *sp, uint32_t ns, size_t from,
		     size_t bytes, uint32_t steps)
{
	pc->base = base;
	pc->sp = sp;
	pc->ns = ns;
	pc->i = 0;
	while (pc->i < ns && from >= sp[pc->i].len)
		from -= sp[pc->i++].len;
	pc->b = from & ~(size_t)63;
	pc->per = (uint32_t)((bytes / 64 + steps) / (steps ? steps : 1));
	if (!bytes)
		pc->ns = 0;
}

#endif

#if defined(__AVX512F__) && (DEC_PATH || DEC_F32)
/* Lane sums of 16 vectors at once: lane i of the result is the sum of a[i]. */
static inline __m512 hsum16(const __m512 *a)
{
	__m512 b[8], c4[4], d0, d1;
	int i;

	/* b[i], per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] of x = a[2i], y = a[2i+1]. */
#pragma GCC unroll 8
	for (i = 0; i < 8; i++)
		b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
	/* c4[j], lane L, element m: the part of a[4j + m] that lane L of a[4j + m] held. */
#pragma GCC unroll 4
	for (i = 0; i < 4; i++) {
		__m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);

		c4[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
				      _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
	}
	/* Then the four 128-bit lanes of each c4[j] are added up: two rounds of lane shuffles. */
	d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c4[0], c4[1], 0x88), _mm512_shuffle_f32x4(c4[0], c4[1], 0xdd));
	d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c4[2], c4[3], 0x88), _mm512_shuffle_f32x4(c4[2], c4[3], 0xdd));
	return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xdd));
}

#endif

#if defined(KERNEL_DPBF16) && DEC_PATH
/* Scores of R rows against a tile of CPU_TK K rows (rows past the tile's end point to zeros). */
static void scores_dec(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *kraw, uint32_t R,
		       struct pf_cursor *pc)
{
	uint32_t nc = c->hd / 32, r, g, k, i;

	for (r = 0; r < R; r++) {
		const uint16_t *q = sc->qh + (size_t)r * CPU_MAX_HD;

		for (g = 0; g < CPU_TK / 16; g++) {
			const char *const *kr = kraw + 16 * g;
			__m512 a[16];

#pragma GCC unroll 16
			for (i = 0; i < 16; i++)
				a[i] = _mm512_setzero_ps();
			for (k = 0; k < nc; k++) {
				__m512bh qv = (__m512bh)_mm512_loadu_si512(q + 32 * k);

				pf_step(pc);
#pragma GCC unroll 16
				for (i = 0; i < 16; i++)
					a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)_mm512_loadu_si512(kr[i] + 64 * k), qv);
			}
			_mm512_storeu_ps(sc->s + (size_t)r * CPU_TK + 16 * g, hsum16(a));
		}
	}
}

/* acc[r0..r0+nr) += P . V over np key pairs; nr <= 4 is a constant where inlined. */
static inline __attribute__((always_inline)) void pv_dec_rows(const struct cpu_call *c, struct cpu_scratch *sc,
							      const char *const *vraw, uint32_t np,
							      const uint32_t *ph, uint32_t r0, const uint32_t nr,
							      struct pf_cursor *pc)
{
	uint32_t nc = c->hd / 32, k, t, j;

	for (k = 0; k < nc; k++) {
		__m512 lo[4], hi[4];

#pragma GCC unroll 4
		for (j = 0; j < nr; j++) {
			lo[j] = _mm512_loadu_ps(sc->acc + (size_t)(r0 + j) * c->hdp + 32 * k);
			hi[j] = _mm512_loadu_ps(sc->acc + (size_t)(r0 + j) * c->hdp + 32 * k + 16);
		}
		for (t = 0; t < np; t++) {
			__m512i a = _mm512_loadu_si512(vraw[2 * t] + 64 * k), b = _mm512_loadu_si512(vraw[2 * t + 1] + 64 * k);
			__m512bh ul = (__m512bh)_mm512_unpacklo_epi16(a, b), uh = (__m512bh)_mm512_unpackhi_epi16(a, b);

			if (!(t & 3))
				pf_step(pc);

#pragma GCC unroll 4
			for (j = 0; j < nr; j++) {
				__m512bh p = (__m512bh)_mm512_set1_epi32((int)ph[(r0 + j) * (CPU_TK / 2) + t]);

				lo[j] = _mm512_dpbf16_ps(lo[j], ul, p);
				hi[j] = _mm512_dpbf16_ps(hi[j], uh, p);
			}
		}
#pragma GCC unroll 4
		for (j = 0; j < nr; j++) {
			_mm512_storeu_ps(sc->acc + (size_t)(r0 + j) * c->hdp + 32 * k, lo[j]);
			_mm512_storeu_ps(sc->acc + (size_t)(r0 + j) * c->hdp + 32 * k + 16, hi[j]);
		}
	}
}

/* acc += P . V for R rows over a tile of nt V rows (accumulators in accumulate_pv_dpbf16's lane order). */
static void pv_dec(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *vraw, uint32_t nt, uint32_t R,
		   struct pf_cursor *pc)
{
	uint32_t ph[CPU_TK / 2 * DEC_ROWS], np = (nt + 1) / 2, r;

	for (r = 0; r < R; r++) {
		const float *p = sc->s + (size_t)r * CPU_TK;

		_mm512_storeu_si512(ph + r * (CPU_TK / 2), (__m512i)_mm512_cvtne2ps_pbh((__m512)ld(p + 16), (__m512)ld(p)));
	}
	for (r = 0; r + 4 <= R; r += 4)
		pv_dec_rows(c, sc, vraw, np, ph, r, 4, pc);
	switch (R - r) {
	case 3: pv_dec_rows(c, sc, vraw, np, ph, r, 3, pc); break;
	case 2: pv_dec_rows(c, sc, vraw, np, ph, r, 2, pc); break;
	case 1: pv_dec_rows(c, sc, vraw, np, ph, r, 1, pc); break;
	}
}

#endif

#if DEC_F32
/* Keys whose partial vectors the f32 scores reduce together; rows per PV block. */
#define DECF_KEYS 16u
#define DECF_ROWS 4u

/*
 * Scores of R f32 query rows against a tile of CPU_TK K rows of dtype cdt (a
 * constant where inlined; rows past the tile's end point to zeros). A row's
 * query stays in registers (nq vectors, a constant where inlined: 4 or 8 for
 * head_dim 64 and 128; 0 loads it from L1 instead) while each key's products
 * accumulate along the head dim, one key row at a time (one address live,
 * not DECF_KEYS), and DECF_KEYS keys' partial vectors are reduced together.
 */
static inline __attribute__((always_inline)) void scores_decf_t(const struct cpu_call *c, struct cpu_scratch *sc,
								const char *const *kraw, uint32_t R,
								struct pf_cursor *pc, const uint32_t cdt,
								const uint32_t nq)
{
	const size_t esz = cdt == PKV_DTYPE_F32 ? 4 : 2;
	uint32_t nc = nq ? nq : c->hd / 16, r, g, k, i;

	for (r = 0; r < R; r++) {
		const float *q = sc->qf + (size_t)r * c->hdp;
		v16sf qv[8];

#pragma GCC unroll 8
		for (k = 0; k < nq; k++)
			qv[k] = ld(q + 16 * k);
		for (g = 0; g < CPU_TK / DECF_KEYS; g++) {
			v16sf a[DECF_KEYS];

			pf_step(pc);
#pragma GCC unroll 16
			for (i = 0; i < DECF_KEYS; i++) {
				const char *kr = kraw[DECF_KEYS * g + i];

				a[i] = (nq ? qv[0] : ld(q)) * cvt16(kr, cdt);
#pragma GCC unroll 8
				for (k = 1; k < nc; k++)
					a[i] += (nq ? qv[k] : ld(q + 16 * k)) * cvt16(kr + 16 * k * esz, cdt);
			}
			_mm512_storeu_ps(sc->s + (size_t)r * CPU_TK + 16 * g, hsum16((const __m512 *)a));
		}
	}
}

/*
 * acc[r0..r0+nr) += P . V over nt keys for dims [d0, d0 + 16 nv): nr rows x
 * nv vectors of accumulators in registers, each V vector loaded once for the
 * nr rows (nr, nv and cdt constants where inlined).
 */
static inline __attribute__((always_inline)) void pv_decf_rows(const struct cpu_call *c, struct cpu_scratch *sc,
							       const char *const *vraw, uint32_t nt, uint32_t r0,
							       const uint32_t nr, uint32_t d0, const uint32_t nv,
							       struct pf_cursor *pc, const uint32_t cdt)
{
	const size_t esz = cdt == PKV_DTYPE_F32 ? 4 : 2;
	const float *pr = sc->s + (size_t)r0 * CPU_TK;
	v16sf acc[DECF_ROWS][4], v[4];
	uint32_t t, j, m;

#pragma GCC unroll 4
	for (j = 0; j < nr; j++)
#pragma GCC unroll 4
		for (m = 0; m < nv; m++)
			acc[j][m] = ld(sc->acc + (size_t)(r0 + j) * c->hdp + d0 + 16 * m);
	for (t = 0; t < nt; t++) {
		/* The row's address plus constants: no per-vector offsets to keep in registers. */
		const char *vp = vraw[t] + (size_t)d0 * esz;

		if (!(t & 3))
			pf_step(pc);
#pragma GCC unroll 4
		for (m = 0; m < nv; m++)
			v[m] = cvt16(vp + 16 * m * esz, cdt);
#pragma GCC unroll 4
		for (j = 0; j < nr; j++) {
			float pj = pr[j * CPU_TK + t];
			/* A broadcast of pj ((v16sf){ 0 } + pj would be one more dependent add). */
			v16sf p = { pj, pj, pj, pj, pj, pj, pj, pj, pj, pj, pj, pj, pj, pj, pj, pj };

#pragma GCC unroll 4
			for (m = 0; m < nv; m++)
				acc[j][m] += p * v[m];
		}
	}
#pragma GCC unroll 4
	for (j = 0; j < nr; j++)
#pragma GCC unroll 4
		for (m = 0; m < nv; m++)
			st(sc->acc + (size_t)(r0 + j) * c->hdp + d0 + 16 * m, acc[j][m]);
}

/* PV for R rows over dims [d0, d0 + 16 nv): blocks of DECF_ROWS rows, then the rest. */
static inline __attribute__((always_inline)) void pv_decf_dims(const struct cpu_call *c, struct cpu_scratch *sc,
							       const char *const *vraw, uint32_t nt, uint32_t R,
							       uint32_t d0, const uint32_t nv, struct pf_cursor *pc,
							       const uint32_t cdt)
{
	uint32_t r;

	for (r = 0; r + DECF_ROWS <= R; r += DECF_ROWS)
		pv_decf_rows(c, sc, vraw, nt, r, DECF_ROWS, d0, nv, pc, cdt);
	switch (R - r) {
	case 3: pv_decf_rows(c, sc, vraw, nt, r, 3, d0, nv, pc, cdt); break;
	case 2: pv_decf_rows(c, sc, vraw, nt, r, 2, d0, nv, pc, cdt); break;
	case 1: pv_decf_rows(c, sc, vraw, nt, r, 1, d0, nv, pc, cdt); break;
	}
}

/*
 * acc += P . V for R rows over a tile of nt V rows of dtype cdt, 64 dims at
 * a time with 512-bit vectors (head_dim % 64 == 0; 4 rows x 4 vectors of
 * accumulators: enough independent FMA chains to hide their latency at
 * G = 3), else 32.
 */
static inline __attribute__((always_inline)) void pv_decf_t(const struct cpu_call *c, struct cpu_scratch *sc,
							    const char *const *vraw, uint32_t nt, uint32_t R,
							    struct pf_cursor *pc, const uint32_t cdt)
{
	uint32_t d;

	if (c->hd % 64 == 0) {
		for (d = 0; d < c->hd; d += 64)
			pv_decf_dims(c, sc, vraw, nt, R, d, 4, pc, cdt);
		return;
	}
	for (d = 0; d < c->hd; d += 32)
		pv_decf_dims(c, sc, vraw, nt, R, d, 2, pc, cdt);
}

/*
 * Scores of R (2-4) f32 query rows against a tile of 16-bit K rows, each key
 * row widened once for all R rows (scores_decf_t widens it once per row: at
 * G = 3 two thirds of its loads and conversions were repeats). Four keys x R
 * rows of partial vectors are reduced by one hsum16: lane 4r + i of the sum
 * is row r's score of key i, so 128-bit lane r holds row r's four scores in
 * order. The rows' queries are read from L1 by the FMAs (nq, R and cdt
 * constants where inlined). One prefetch step per four keys.
 */
#define DECF_G_KEYS 4u

static inline __attribute__((always_inline)) void scores_decf_g(const struct cpu_call *c, struct cpu_scratch *sc,
								const char *const *kraw, const uint32_t R,
								struct pf_cursor *pc, const uint32_t cdt,
								const uint32_t nq)
{
	const size_t esz = 2;
	uint32_t g, i, k, r;

	for (g = 0; g < CPU_TK / DECF_G_KEYS; g++) {
		__m512 a[16];

		pf_step(pc);
#pragma GCC unroll 16
		for (i = 0; i < 16; i++)
			a[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
		for (i = 0; i < DECF_G_KEYS; i++) {
			const char *kr = kraw[DECF_G_KEYS * g + i];

#pragma GCC unroll 8
			for (k = 0; k < nq; k++) {
				__m512 kv = (__m512)cvt16(kr + 16 * k * esz, cdt);

#pragma GCC unroll 4
				for (r = 0; r < R; r++)
					a[4 * r + i] = _mm512_fmadd_ps(_mm512_loadu_ps(sc->qf + (size_t)r * c->hdp + 16 * k), kv,
								       a[4 * r + i]);
			}
		}
		{
			__m512 sum = hsum16(a);
			float *out = sc->s + DECF_G_KEYS * g;

			_mm_storeu_ps(out, _mm512_extractf32x4_ps(sum, 0));
			_mm_storeu_ps(out + CPU_TK, _mm512_extractf32x4_ps(sum, 1));
			if (R > 2)
				_mm_storeu_ps(out + 2 * CPU_TK, _mm512_extractf32x4_ps(sum, 2));
			if (R > 3)
				_mm_storeu_ps(out + 3 * CPU_TK, _mm512_extractf32x4_ps(sum, 3));
		}
	}
}

/* Whether scores_decf takes the grouped-rows instance for R rows (it then wants CPU_TK / 4 prefetch steps). */
static inline int decf_grouped(const struct cpu_call *c, uint32_t R, uint32_t cdt)
{
	return cdt != PKV_DTYPE_F32 && R >= 2 && R <= 4 && (c->hd == 64 || c->hd == 128);
}

static inline __attribute__((always_inline)) void scores_decf_gr(const struct cpu_call *c, struct cpu_scratch *sc,
								 const char *const *kraw, uint32_t R,
								 struct pf_cursor *pc, const uint32_t cdt)
{
	if (c->hd == 64 && R == 2)
		scores_decf_g(c, sc, kraw, 2, pc, cdt, 4);
	else if (c->hd == 64 && R == 3)
		scores_decf_g(c, sc, kraw, 3, pc, cdt, 4);
	else if (c->hd == 64)
		scores_decf_g(c, sc, kraw, 4, pc, cdt, 4);
	else if (R == 2)
		scores_decf_g(c, sc, kraw, 2, pc, cdt, 8);
	else if (R == 3)
		scores_decf_g(c, sc, kraw, 3, pc, cdt, 8);
	else
		scores_decf_g(c, sc, kraw, 4, pc, cdt, 8);
}

/*
 * The query in registers for head_dim 64 and 128. nq is a literal at each
 * call: GCC does not fold a conditional argument (`hd == 64 ? 4 : 0`), and
 * the key loop then stays generic, testing nq for every vector.
 */
static inline __attribute__((always_inline)) void scores_decf_hd(const struct cpu_call *c, struct cpu_scratch *sc,
								 const char *const *kraw, uint32_t R,
								 struct pf_cursor *pc, const uint32_t cdt)
{
	if (c->hd == 64)
		scores_decf_t(c, sc, kraw, R, pc, cdt, 4);
	else if (c->hd == 128)
		scores_decf_t(c, sc, kraw, R, pc, cdt, 8);
	else
		scores_decf_t(c, sc, kraw, R, pc, cdt, 0);
}

/* One instance of the f32 decode tile per cache dtype. */
static void scores_decf(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *kraw, uint32_t R,
			struct pf_cursor *pc, uint32_t cdt)
{
	int grouped = decf_grouped(c, R, cdt);

	if (cdt == PKV_DTYPE_F32)
		scores_decf_hd(c, sc, kraw, R, pc, PKV_DTYPE_F32);
	else if (cdt == PKV_DTYPE_F16 && grouped)
		scores_decf_gr(c, sc, kraw, R, pc, PKV_DTYPE_F16);
	else if (cdt == PKV_DTYPE_F16)
		scores_decf_hd(c, sc, kraw, R, pc, PKV_DTYPE_F16);
	else if (grouped)
		scores_decf_gr(c, sc, kraw, R, pc, PKV_DTYPE_BF16);
	else
		scores_decf_hd(c, sc, kraw, R, pc, PKV_DTYPE_BF16);
}

static void pv_decf(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *vraw, uint32_t nt,
		    uint32_t R, struct pf_cursor *pc, uint32_t cdt)
{
	if (cdt == PKV_DTYPE_F32)
		pv_decf_t(c, sc, vraw, nt, R, pc, PKV_DTYPE_F32);
	else if (cdt == PKV_DTYPE_F16)
		pv_decf_t(c, sc, vraw, nt, R, pc, PKV_DTYPE_F16);
	else
		pv_decf_t(c, sc, vraw, nt, R, pc, PKV_DTYPE_BF16);
}

/* Transposes 16 vectors in place: m[i] lane j becomes m[j] lane i. */
static inline __attribute__((always_inline)) void transpose16(__m512 *m)
{
	__m512 t[16];
	int i, k;

	/* Per 128-bit lane L: t[2i] = rows 2i, 2i+1 at columns 4L, 4L+1 interleaved; t[2i+1] at 4L+2, 4L+3. */
#pragma GCC unroll 8
	for (i = 0; i < 8; i++) {
		t[2 * i] = _mm512_unpacklo_ps(m[2 * i], m[2 * i + 1]);
		t[2 * i + 1] = _mm512_unpackhi_ps(m[2 * i], m[2 * i + 1]);
	}
	/* m[4i + k], lane L: column 4L + k of rows 4i..4i+3. */
#pragma GCC unroll 4
	for (i = 0; i < 4; i++) {
		__m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
		__m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);

		m[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
		m[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
		m[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
		m[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
	}
	/* t[k]: column k of rows 0-3, k + 8 of 0-3, k of 4-7, k + 8 of 4-7 (t[4 + k]: k + 4, k + 12); t[8 + ...]: rows 8-15. */
#pragma GCC unroll 4
	for (k = 0; k < 4; k++) {
		t[k] = _mm512_shuffle_f32x4(m[k], m[4 + k], 0x88);
		t[4 + k] = _mm512_shuffle_f32x4(m[k], m[4 + k], 0xdd);
		t[8 + k] = _mm512_shuffle_f32x4(m[8 + k], m[12 + k], 0x88);
		t[12 + k] = _mm512_shuffle_f32x4(m[8 + k], m[12 + k], 0xdd);
	}
#pragma GCC unroll 4
	for (k = 0; k < 4; k++) {
		m[k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
		m[k + 8] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xdd);
		m[k + 4] = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0x88);
		m[k + 12] = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0xdd);
	}
}

/* Rows per block of the transposed scores: 2 x nr accumulators (32 keys each), each K^T vector loaded once for them. */
#define DECF_T_ROWS 6u

/* Scores of rows [r0, r0 + nr) against the transposed tile kt ([hd][CPU_TK]); nr a constant where inlined. */
static inline __attribute__((always_inline)) void scores_kt_rows(const struct cpu_call *c, struct cpu_scratch *sc,
								 const float *kt, uint32_t r0, const uint32_t nr)
{
	__m512 a[DECF_T_ROWS][2];
	uint32_t d, j;

#pragma GCC unroll 6
	for (j = 0; j < nr; j++)
		a[j][0] = a[j][1] = _mm512_setzero_ps();
	for (d = 0; d < c->hd; d++) {
		__m512 k0 = _mm512_load_ps(kt + (size_t)d * CPU_TK), k1 = _mm512_load_ps(kt + (size_t)d * CPU_TK + 16);

#pragma GCC unroll 6
		for (j = 0; j < nr; j++) {
			__m512 q = _mm512_set1_ps(sc->qf[(size_t)(r0 + j) * c->hdp + d]);

			a[j][0] = _mm512_fmadd_ps(q, k0, a[j][0]);
			a[j][1] = _mm512_fmadd_ps(q, k1, a[j][1]);
		}
	}
#pragma GCC unroll 6
	for (j = 0; j < nr; j++) {
		_mm512_storeu_ps(sc->s + (size_t)(r0 + j) * CPU_TK, a[j][0]);
		_mm512_storeu_ps(sc->s + (size_t)(r0 + j) * CPU_TK + 16, a[j][1]);
	}
}

/*
 * Scores of a shared-prefix item's many rows (R) against a tile of CPU_TK
 * f32 K rows: the tile is transposed once (16 x 16 blocks, one prefetch
 * step each), keys then lie along the lanes and each row's scores build up
 * as q[d] x K^T[d], DECF_T_ROWS rows at a time: no horizontal sums per row,
 * and each K^T vector is loaded once per block of rows.
 */
static void scores_decf_kt(const struct cpu_call *c, struct cpu_scratch *sc, const char *const *kraw, uint32_t R,
			   struct pf_cursor *pc)
{
	float *kt = sc->kt;
	uint32_t g, d, i, r;

	for (g = 0; g < CPU_TK / 16; g++)
		for (d = 0; d < c->hd; d += 16) {
			__m512 m[16];

			pf_step(pc);
#pragma GCC unroll 16
			for (i = 0; i < 16; i++)
				m[i] = _mm512_loadu_ps((const float *)kraw[16 * g + i] + d);
			transpose16(m);
#pragma GCC unroll 16
			for (i = 0; i < 16; i++)
				_mm512_store_ps(kt + (size_t)(d + i) * CPU_TK + 16 * g, m[i]);
		}
	for (r = 0; r + DECF_T_ROWS <= R; r += DECF_T_ROWS)
		scores_kt_rows(c, sc, kt, r, DECF_T_ROWS);
	switch (R - r) {
	case 5: scores_kt_rows(c, sc, kt, r, 5); break;
	case 4: scores_kt_rows(c, sc, kt, r, 4); break;
	case 3: scores_kt_rows(c, sc, kt, r, 3); break;
	case 2: scores_kt_rows(c, sc, kt, r, 2); break;
	case 1: scores_kt_rows(c, sc, kt, r, 1); break;
	}
}

/* Prefetch steps of a tile: scores one per DECF_KEYS keys x row, PV one per 4 keys x dim block x row block. */
static inline uint32_t decf_steps(const struct cpu_call *c, uint32_t R, int pv)
{
	uint32_t dims = c->hd % 64 == 0 ? 64 : 32;

	if (pv)
		return (R + DECF_ROWS - 1) / DECF_ROWS * (c->hd / dims) * (CPU_TK / 4);
	if (decf_grouped(c, R, c->cdt))
		return CPU_TK / DECF_G_KEYS;
	return R * (CPU_TK / DECF_KEYS);
}
#endif

#if DEC_PATH || DEC_F32
/* At most this many keys' blocks are prefetched during one tile (an item's first tile catches up). */
#define DEC_PF_MAX_KEYS (8 * CPU_TK)

/*
 * The decode tile loop. Prefetch follows the block table, not addresses:
 * while a tile is computed, the keys up to DEC_PF_BYTES of K past its end
 * are prefetched, block by block whole and in address order (so a shuffled
 * table costs no more than a sequential one), a few lines per compute step
 * so the requests never queue up in one burst. Keys are counted on past
 * the item's end into the next item of the thread's run (next), so a
 * thread's stream of blocks runs on across items; what the previous item
 * prefetched of this one is sc->pf_carry, and an item that starts a run
 * catches up over its first tile.
 */
static void tiles_decode(const struct cpu_call *c, const struct cpu_item *it, const struct cpu_item *next,
			 struct cpu_scratch *sc, const struct item_plan *pl, const int32_t *bt)
{
	static const float zero_row[CPU_MAX_HD] __attribute__((aligned(64)));
	size_t esz = pkv_dtype_size(c->cdt);
	size_t tok[CPU_TK], tile_bytes = (size_t)CPU_TK * c->token_stride, total, t2;
	const char *kraw[CPU_TK], *vraw[CPU_TK];
	const int32_t *bt_next = NULL;
	struct kv_span sp[DEC_PF_MAX_KEYS + 2];
	struct pf_cursor pc;
	uint32_t ahead = (uint32_t)((DEC_PF_BYTES + tile_bytes - 1) / tile_bytes) * CPU_TK, t0, t, hh, nt, ns;
	/* Keys below pf_next are prefetched already; from kend on, keys count into next from next->k0. */
	int64_t pf_next = (int64_t)it->k0 + sc->pf_carry, vend = pl->kend;

	if (pf_next < pl->kstart)
		pf_next = pl->kstart;
	if (next && next->nkvh == it->nkvh && next->nq == 1 && next->k1 > next->k0) {
		bt_next = c->b->block_tables + (size_t)next->seq * c->b->max_blocks_per_seq;
		vend += next->k1 - next->k0;
	}
	for (t0 = (uint32_t)pl->kstart; (int32_t)t0 < pl->kend; t0 += CPU_TK) {
		int64_t lo = (int64_t)t0 + CPU_TK, hi = (int64_t)t0 + CPU_TK + ahead;

		nt = (uint32_t)pl->kend - t0 < CPU_TK ? (uint32_t)pl->kend - t0 : CPU_TK;
		tile_tokens(c, bt, t0, nt, tok);
		if (lo < pf_next)
			lo = pf_next;
		if (hi > vend)
			hi = vend;
		if (hi > lo + DEC_PF_MAX_KEYS)
			hi = lo + DEC_PF_MAX_KEYS;
		ns = 0;
		total = 0;
		if (lo < hi) {
			if (lo < pl->kend)
				ns = tile_spans(c, bt, (uint32_t)lo, (uint32_t)((hi < pl->kend ? hi : pl->kend) - lo), sp, &total);
			if (hi > pl->kend) {
				int64_t from = lo > pl->kend ? lo : pl->kend;

				ns += tile_spans(c, bt_next, next->k0 + (uint32_t)(from - pl->kend), (uint32_t)(hi - from),
						 sp + ns, &t2);
				total += t2;
			}
			pf_next = hi;
		}
		for (hh = 0; hh < it->nkvh; hh++) {
			struct cpu_scratch v = rows_from(c, sc, hh * pl->Rh);
			size_t head = (size_t)(it->kvh + hh) * c->hd * esz;
			size_t from = total * hh / it->nkvh, to = total * (hh + 1) / it->nkvh;

			for (t = 0; t < nt; t++) {
				kraw[t] = c->kbase + tok[t] + head;
				vraw[t] = c->vbase + tok[t] + head;
			}
			for (; t < CPU_TK; t++)
				kraw[t] = vraw[t] = (const char *)zero_row;
#if DEC_F32
			if (pl->dec == DEC_FLOAT) {
				uint32_t rdt = c->cdt;

				/*
				 * A shared-prefix item's many rows over a 16-bit cache: the
				 * tile's K and V rows widened once (head_dim % 32 == 0: no
				 * padding), not once per query row as they are loaded.
				 */
				if (pl->widen) {
					for (t = 0; t < nt; t++) {
						row_to_f32(sc->kf + (size_t)t * c->hd, kraw[t], c->cdt, c->hd, c->hd);
						row_to_f32(sc->vf + (size_t)t * c->hd, vraw[t], c->cdt, c->hd, c->hd);
						kraw[t] = (const char *)(sc->kf + (size_t)t * c->hd);
						vraw[t] = (const char *)(sc->vf + (size_t)t * c->hd);
					}
					rdt = PKV_DTYPE_F32;
				}
				if (pl->many) {
					/* f32 rows (widened, or the cache's own): the transposed tile. */
					pf_start(&pc, c->kbase, sp, ns, from, to - from, (CPU_TK / 16) * (c->hd / 16));
					scores_decf_kt(c, &v, kraw, pl->Rh, &pc);
				} else {
					pf_start(&pc, c->kbase, sp, ns, from, to - from, decf_steps(c, pl->Rh, 0));
					scores_decf(c, &v, kraw, pl->Rh, &pc, rdt);
				}
				softmax_tile(c, &v, t0, nt, pl->Rh);
				pf_start(&pc, c->vbase, sp, ns, from, to - from, decf_steps(c, pl->Rh, 1));
				pv_decf(c, &v, vraw, nt, pl->Rh, &pc, rdt);
				continue;
			}
#endif
#if DEC_PATH
			/* Steps: scores take one per 16 keys x 32 dims x row, PV one per 4 key pairs x 32 dims x row block. */
			pf_start(&pc, c->kbase, sp, ns, from, to - from, pl->Rh * (CPU_TK / 16) * (c->hd / 32));
			scores_dec(c, &v, kraw, pl->Rh, &pc);
			softmax_tile(c, &v, t0, nt, pl->Rh);
			pf_start(&pc, c->vbase, sp, ns, from, to - from, (pl->Rh + 3) / 4 * (CPU_TK / 8) * (c->hd / 32));
			pv_dec(c, &v, vraw, nt, pl->Rh, &pc);
#endif
		}
	}
	sc->pf_carry = pf_next > pl->kend ? (uint32_t)(pf_next - pl->kend) : 0;
}
#endif


static void attend_item(const struct cpu_call *c, const struct cpu_item *it, const struct cpu_item *next,
			struct cpu_scratch *sc)
{
	const int32_t *bt = c->b->block_tables + (size_t)it->seq * c->b->max_blocks_per_seq;
	struct item_plan pl = { 0 };

	pl.Rh = it->nq * c->G;
	pl.R = pl.Rh * it->nkvh;
	pl.direct = c->cdt == PKV_DTYPE_F32 && c->hd == c->hdp;
	pl.load16 = (c->cdt == PKV_DTYPE_BF16 || c->cdt == PKV_DTYPE_F16) && c->hd == c->hdp &&
		    pl.Rh <= LOAD16_MAX_ROWS;
#if defined(KERNEL_DPBF16)
	pl.use_dp = c->cdt == PKV_DTYPE_BF16 && c->adt == PKV_DTYPE_BF16;
	pl.use_dp_pv = pl.use_dp && c->hd % 32 == 0;
#endif
	/*
	 * Few rows per KV head and whole token rows (every KV head): the decode
	 * loop, with vdpbf16ps for bf16 queries over a bf16 cache, with f32 FMAs
	 * for f32 queries (head_dim % 32 == 0) over any cache.
	 */
	if (it->nkvh * c->hd * pkv_dtype_size(c->cdt) == c->token_stride) {
		if (DEC_PATH && pl.use_dp_pv && pl.Rh <= DEC_ROWS)
			pl.dec = DEC_BF16;
		else if (DEC_F32 && c->adt == PKV_DTYPE_F32 && c->hd % 32 == 0 &&
			 (pl.Rh <= DEC_ROWS || ((it->flags & CPU_ITEM_SHARED) && pl.R <= DECF_WIDE_ROWS))) {
			pl.dec = DEC_FLOAT;
			pl.many = (it->flags & CPU_ITEM_SHARED) && pl.Rh > DECF_WIDEN_ROWS && DECF_KT;
			pl.widen = (it->flags & CPU_ITEM_SHARED) && c->cdt != PKV_DTYPE_F32 && pl.Rh > DECF_WIDEN_ROWS;
		}
	}
	load_rows(c, it, sc, &pl);
	if (pl.kend > 0) {
#if defined(KERNEL_AMX)
		if (!pl.dec)
			amx_prepare(c, it, sc, &pl);
#endif
#if DEC_PATH || DEC_F32
		if (pl.dec)
			tiles_decode(c, it, next, sc, &pl, bt);
		else
#endif
			tiles_general(c, it, sc, &pl, bt);
#if defined(KERNEL_AMX)
		if (pl.use_amx)
			_tile_release();
#endif
	}
	/* Only tiles_decode prefetches into the next item (and says how far). */
	if (!pl.dec || pl.kend <= 0)
		sc->pf_carry = 0;
	store_rows(c, it, sc, &pl);
}

const struct cpu_isa ISA_SYM = {
	.name = KERNEL_NAME,
	.attend = attend_item,
#if defined(KERNEL_AMX)
	.rows_multiple = 16,
#elif defined(KERNEL_DPBF16)
	.rows_multiple = 4,
#else
	.rows_multiple = 1,
#endif
	.dec_rows = DEC_PATH ? DEC_ROWS : 0,
	.dec_rows_f32 = DEC_F32 ? DECF_WIDE_ROWS : 0,
};
