/* SPDX-License-Identifier: MIT */
/* The attention kernel, written once in GCC vector extensions and compiled per ISA by kernel_*.c. */
/*
 * Included by kernel_generic.c, kernel_avx2.c, kernel_avx512.c and
 * kernel_avx512bf16.c, each compiled with its own -m flags and defining
 * KERNEL_ISA (the struct name suffix) and KERNEL_NAME. 16-float vectors
 * become one zmm, two ymm or four xmm registers depending on the target.
 *
 * Work item (see cpu.h): R = nq * G query vectors of one KV head. Keys are
 * visited in tiles of CPU_TK straight from the paged cache through the
 * block table; a tile's K and V rows are converted to f32 into L1 scratch
 * once and used by all R query vectors (so each KV byte is read from memory
 * once per item, and GQA heads share it). Scores: dot products along the
 * head dim, four keys at a time with one combined horizontal reduction.
 * Softmax: online (flash-attention), f32, a tile of 32 scores per row
 * exponentiated as two vectors. PV: rows of V broadcast-multiplied into
 * per-row accumulators held in registers for a chunk of 16 dims.
 */
#include <math.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__F16C__) || defined(__AVX512F__))
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

static inline v16sf splat(float x)
{
	return (v16sf){ 0 } + x;
}

static inline v16sf as_f(v16si i)
{
	v16sf f;

	memcpy(&f, &i, sizeof(f));
	return f;
}

static inline v16si as_i(v16sf f)
{
	v16si i;

	memcpy(&i, &f, sizeof(i));
	return i;
}

/* mask ? a : b, where mask lanes are all-ones or zero. */
static inline v16sf sel(v16si mask, v16sf a, v16sf b)
{
	return as_f((as_i(a) & mask) | (as_i(b) & ~mask));
}

static inline v16sf vmax(v16sf a, v16sf b)
{
	return sel(a > b, a, b);
}

static inline float hsum(v16sf v)
{
	v8sf a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
		 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
	v4sf b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);

	return (b[0] + b[2]) + (b[1] + b[3]);
}

static inline float hmax(v16sf v)
{
	float m = v[0];
	int i;

	for (i = 1; i < 16; i++)
		m = v[i] > m ? v[i] : m;
	return m;
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

/*
 * e^x for a vector, relative error ~2e-7; exactly 0 below -87.3 (so -inf,
 * a masked score, gives a probability of exactly 0).
 */
static inline v16sf vexp(v16sf x)
{
	v16si under = x < splat(-87.3f);
	v16sf xc = sel(x > splat(88.3f), splat(88.3f), sel(under, splat(-87.3f), x));
	v16sf n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;
	v16sf r = xc - n * 0.693145752f;
	v16sf p;
	v16si e;

	r = r - n * 1.42860677e-6f;
	p = splat(1.0f / 720);
	p = p * r + 1.0f / 120;
	p = p * r + 1.0f / 24;
	p = p * r + 1.0f / 6;
	p = p * r + 0.5f;
	p = p * r + 1.0f;
	p = p * r + 1.0f;
	e = (__builtin_convertvector(n, v16si) + 127) << 23;
	return as_f(as_i(p * as_f(e)) & ~under);
}

/* tanh via e^(2x): 1 - 2 / (e^2x + 1); saturates cleanly to +-1. */
static inline v16sf vtanh(v16sf x)
{
	return 1.0f - 2.0f / (vexp(x + x) + 1.0f);
}

/* 16 elements of dtype at p as f32. */
static inline v16sf cvt16(const void *p, uint32_t dtype)
{
	if (dtype == PKV_DTYPE_F32)
		return ld(p);
	if (dtype == PKV_DTYPE_BF16) {
		v16hu h;

		memcpy(&h, p, sizeof(h));
		return as_f(__builtin_convertvector(h, v16si) << 16);
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
			v[i] = pkv_cpu_f16_to_f32(((const uint16_t *)p)[i]);
		return v;
	}
#endif
}

/* Converts a row of hd elements to f32 in dst, zero-padded to hdp. */
static inline void row_to_f32(float *dst, const void *src, uint32_t dtype, uint32_t hd, uint32_t hdp)
{
	uint32_t esz = pkv_dtype_size(dtype), d;

	for (d = 0; d + 16 <= hd; d += 16)
		st(dst + d, cvt16((const char *)src + (size_t)d * esz, dtype));
	for (; d < hd; d++)
		dst[d] = pkv_cpu_load(src, dtype, d);
	for (; d < hdp; d++)
		dst[d] = 0.0f;
}

/* Address of token j's row (for KV head kvh) in this layer's K or V. */
static inline const char *kv_row(const struct cpu_call *c, const char *base, const int32_t *bt,
				 uint32_t j, uint32_t kvh)
{
	return base + (size_t)bt[j / c->bs] * c->block_stride + (size_t)(j % c->bs) * c->token_stride +
	       (size_t)kvh * c->hd * pkv_dtype_size(c->cdt);
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

/* Scores of R query vectors against nt keys (rows of f32 at krow[t], hdp long). */
static void scores_f32(const struct cpu_call *c, struct cpu_scratch *sc, const float *const *krow,
		       uint32_t nt, uint32_t R)
{
	uint32_t nc = c->hdp / 16, r, t, k;

	for (r = 0; r < R; r++) {
		const float *q = sc->qf + (size_t)r * c->hdp;
		float *s = sc->s + (size_t)r * CPU_TK;

		for (t = 0; t + 4 <= nt; t += 4) {
			const float *k0 = krow[t], *k1 = krow[t + 1], *k2 = krow[t + 2], *k3 = krow[t + 3];
			v16sf a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };

			for (k = 0; k < nc; k++) {
				v16sf qv = ld(q + 16 * k);

				a0 += qv * ld(k0 + 16 * k);
				a1 += qv * ld(k1 + 16 * k);
				a2 += qv * ld(k2 + 16 * k);
				a3 += qv * ld(k3 + 16 * k);
			}
			{
				v4sf h = hsum4(a0, a1, a2, a3);

				memcpy(s + t, &h, sizeof(h));
			}
		}
		for (; t < nt; t++) {
			v16sf a0 = { 0 };

			for (k = 0; k < nc; k++)
				a0 += ld(q + 16 * k) * ld(krow[t] + 16 * k);
			s[t] = hsum(a0);
		}
	}
}

/* acc[r] += P[r] . V for a tile, 4 rows at a time sharing each V load. */
static void accumulate_pv(const struct cpu_call *c, struct cpu_scratch *sc, const float *const *vrow,
			  uint32_t nt, uint32_t R)
{
	uint32_t nc = c->hdp / 16, r, t, k;

	for (k = 0; k < nc; k++) {
		for (r = 0; r + 4 <= R; r += 4) {
			float *a = sc->acc + (size_t)r * c->hdp + 16 * k;
			const float *p = sc->s + (size_t)r * CPU_TK;
			v16sf a0 = ld(a), a1 = ld(a + c->hdp), a2 = ld(a + 2 * c->hdp), a3 = ld(a + 3 * c->hdp);

			for (t = 0; t < nt; t++) {
				v16sf v = ld(vrow[t] + 16 * k);

				a0 += p[t] * v;
				a1 += p[CPU_TK + t] * v;
				a2 += p[2 * CPU_TK + t] * v;
				a3 += p[3 * CPU_TK + t] * v;
			}
			st(a, a0);
			st(a + c->hdp, a1);
			st(a + 2 * c->hdp, a2);
			st(a + 3 * c->hdp, a3);
		}
		for (; r < R; r++) {
			float *a = sc->acc + (size_t)r * c->hdp + 16 * k;
			const float *p = sc->s + (size_t)r * CPU_TK;
			v16sf a0 = ld(a);

			for (t = 0; t < nt; t++)
				a0 += p[t] * ld(vrow[t] + 16 * k);
			st(a, a0);
		}
	}
}

/*
 * Online softmax over one tile: turns row r's scores into probabilities
 * relative to the new running max, rescales its accumulator and sum.
 * Columns >= nt, and keys outside [lo, hi], are masked to -inf first.
 */
static void softmax_tile(const struct cpu_call *c, struct cpu_scratch *sc, uint32_t t0, uint32_t nt, uint32_t R)
{
	const v16sf ninf = splat(-INFINITY);
	v16si idx0 = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 };
	uint32_t nc = c->hdp / 16, r, k;

	for (r = 0; r < R; r++) {
		float *s = sc->s + (size_t)r * CPU_TK;
		v16sf s0 = ld(s) * c->scale, s1 = ld(s + 16) * c->scale;
		/* Key index of each lane relative to this row's visible range. */
		v16si j0 = idx0 + (int32_t)t0, j1 = j0 + 16;
		int32_t lo = sc->lo[r], hi = sc->hi[r];
		int32_t last = (int32_t)(t0 + nt) - 1;
		float mt, mnew, corr;
		v16sf e0, e1;

		if (c->softcap > 0) {
			s0 = c->softcap * vtanh(s0 * (1.0f / c->softcap));
			s1 = c->softcap * vtanh(s1 * (1.0f / c->softcap));
		}
		if (lo > (int32_t)t0 || hi < last || nt < CPU_TK) {
			int32_t h = hi < last ? hi : last;

			s0 = sel((j0 >= lo) & (j0 <= h), s0, ninf);
			s1 = sel((j1 >= lo) & (j1 <= h), s1, ninf);
		}
		mt = hmax(vmax(s0, s1));
		mnew = mt > sc->m[r] ? mt : sc->m[r];
		if (mnew == -INFINITY) {
			/* Nothing visible yet: probabilities 0, state unchanged. */
			st(s, (v16sf){ 0 });
			st(s + 16, (v16sf){ 0 });
			continue;
		}
		e0 = vexp(s0 - mnew);
		e1 = vexp(s1 - mnew);
		st(s, e0);
		st(s + 16, e1);
		corr = sc->m[r] == -INFINITY ? 0.0f : expf(sc->m[r] - mnew);
		sc->l[r] = sc->l[r] * corr + hsum(e0 + e1);
		sc->m[r] = mnew;
		if (corr != 1.0f) {
			float *a = sc->acc + (size_t)r * c->hdp;

			for (k = 0; k < nc; k++)
				st(a + 16 * k, ld(a + 16 * k) * corr);
		}
	}
}

static void attend_item(const struct cpu_call *c, const struct cpu_item *it, struct cpu_scratch *sc)
{
	const struct pkv_attn_batch *b = c->b;
	const int32_t *bt = b->block_tables + (size_t)it->seq * b->max_blocks_per_seq;
	int32_t sq = b->cu_seq_lens_q[it->seq + 1] - b->cu_seq_lens_q[it->seq];
	int32_t sk = b->cu_seq_lens_k[it->seq + 1] - b->cu_seq_lens_k[it->seq];
	int32_t kstart = INT32_MAX, kend = -1;
	uint32_t R = it->nq * c->G, asz = pkv_dtype_size(c->adt), r, t, t0;
	const float *krow[CPU_TK], *vrow[CPU_TK];
	const char *kraw[CPU_TK], *vraw[CPU_TK];
	int direct = c->cdt == PKV_DTYPE_F32 && c->hd == c->hdp;
#if defined(KERNEL_DPBF16)
	int use_dp = c->cdt == PKV_DTYPE_BF16 && c->adt == PKV_DTYPE_BF16;
#endif

	/* Queries of this item, f32 (and raw bf16 for the dpbf16 scores). */
	for (r = 0; r < R; r++) {
		uint32_t qi = r / c->G, h = it->kvh * c->G + r % c->G;
		const char *src = (const char *)b->q + ((size_t)(b->cu_seq_lens_q[it->seq] + it->q0 + qi) *
							b->q_stride_tok + (size_t)h * b->q_stride_head) * asz;
		int32_t i = (int32_t)(it->q0 + qi);

		row_to_f32(sc->qf + (size_t)r * c->hdp, src, c->adt, c->hd, c->hdp);
#if defined(KERNEL_DPBF16)
		if (use_dp) {
			memset(sc->qh + (size_t)r * CPU_MAX_HD, 0, CPU_MAX_HD * 2);
			memcpy(sc->qh + (size_t)r * CPU_MAX_HD, src, c->hd * 2);
		}
#endif
		sc->hi[r] = i + (sk - sq);
		sc->lo[r] = c->window >= 0 ? sc->hi[r] - c->window : 0;
		if (sc->lo[r] < (int32_t)it->k0)
			sc->lo[r] = (int32_t)it->k0;
		if (sc->hi[r] > (int32_t)it->k1 - 1)
			sc->hi[r] = (int32_t)it->k1 - 1;
		if (sc->lo[r] <= sc->hi[r]) {
			kstart = sc->lo[r] < kstart ? sc->lo[r] : kstart;
			kend = sc->hi[r] + 1 > kend ? sc->hi[r] + 1 : kend;
		}
		sc->m[r] = -INFINITY;
		sc->l[r] = 0.0f;
		memset(sc->acc + (size_t)r * c->hdp, 0, c->hdp * sizeof(float));
	}

	for (t0 = (uint32_t)kstart; kend > 0 && (int32_t)t0 < kend; t0 += CPU_TK) {
		uint32_t nt = (uint32_t)kend - t0 < CPU_TK ? (uint32_t)kend - t0 : CPU_TK;

		for (t = 0; t < nt; t++) {
			kraw[t] = kv_row(c, c->kbase, bt, t0 + t, it->kvh);
			vraw[t] = kv_row(c, c->vbase, bt, t0 + t, it->kvh);
		}
#if defined(KERNEL_DPBF16)
		if (use_dp) {
			scores_dpbf16(c, sc, kraw, nt, R);
		} else
#endif
		{
			for (t = 0; t < nt; t++) {
				if (direct) {
					krow[t] = (const float *)kraw[t];
				} else {
					row_to_f32(sc->kf + (size_t)t * c->hdp, kraw[t], c->cdt, c->hd, c->hdp);
					krow[t] = sc->kf + (size_t)t * c->hdp;
				}
			}
			scores_f32(c, sc, krow, nt, R);
		}
		softmax_tile(c, sc, t0, nt, R);
		for (t = 0; t < nt; t++) {
			if (direct) {
				vrow[t] = (const float *)vraw[t];
			} else {
				row_to_f32(sc->vf + (size_t)t * c->hdp, vraw[t], c->cdt, c->hd, c->hdp);
				vrow[t] = sc->vf + (size_t)t * c->hdp;
			}
		}
		accumulate_pv(c, sc, vrow, nt, R);
	}

	for (r = 0; r < R; r++) {
		float *a = sc->acc + (size_t)r * c->hdp;

		if (it->part >= 0) {
			float *p = c->part + (size_t)it->part * c->part_stride + (size_t)r * (c->hdp + 2);

			p[0] = sc->m[r];
			p[1] = sc->l[r];
			memcpy(p + 2, a, c->hdp * sizeof(float));
		} else {
			uint32_t qi = r / c->G, h = it->kvh * c->G + r % c->G, d;
			char *dst = (char *)b->o + ((size_t)(b->cu_seq_lens_q[it->seq] + it->q0 + qi) * b->o_stride_tok +
						    (size_t)h * b->o_stride_head) * asz;
			/* A row that saw no key has l == 0: its output is 0, never 0/0. */
			float inv = sc->l[r] > 0 ? 1.0f / sc->l[r] : 0.0f;

			for (d = 0; d < c->hd; d++)
				a[d] *= inv;
			pkv_cpu_store_row(dst, c->adt, a, c->hd);
		}
	}
}

const struct cpu_isa ISA_SYM = {
	.name = KERNEL_NAME,
	.attend = attend_item,
};
