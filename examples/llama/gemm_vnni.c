/* SPDX-License-Identifier: MIT */
/* Q4_0/Q4_1/Q8_0 weights repacked 16 rows at a time for AVX512-VNNI, against int8 activation blocks. */
#include "gemm_vnni.h"
#include "gguf.h"

#include <math.h>
#include <string.h>

/*
 * Packed layout, per tile of 16 rows, per 32-column block b (tiles and blocks contiguous, tile-major):
 *   f16 d[16]            the 16 rows' block scales
 *   f16 m[16]            Q4_1 only: the rows' block minimums
 *   u8  q[16 rows][..]   as dwords: dword j of lane r is row r's quant bytes 4j..4j+3
 * stored as P_j = 64 bytes (one zmm) per dword index j: lane r of P_j = row r's bytes 4j..4j+3.
 * Q4 keeps GGML's nibble bytes as they are (byte k: element k low, element k + 16 high), so the low
 * nibbles of P_j hold elements 4j..4j+3 and the high ones 16+4j..16+4j+3: 4 zmm per block.
 * Q8_0 bytes are stored with the sign bit flipped (w + 128, unsigned) because vpdpbusd multiplies
 * unsigned by signed bytes: 8 zmm per block, and the extra 128 * sum(x) is taken off with the offsets.
 * Each block's dot is then d_w * d_x * idot + m * s_x, with s_x = d_x * sum(q_x) and
 * m = min (Q4_1), -8 d_w (Q4_0, its nibbles are w + 8) or -128 d_w (Q8_0).
 */

static size_t qbytes(uint32_t type)
{
	return type == GGML_Q8_0 ? 512 : 256;
}

static size_t blk_bytes(uint32_t type)
{
	return 32 + (type == GGML_Q4_1 ? 32 : 0) + qbytes(type);
}

int pkv_vnni_type_ok(uint32_t type, uint32_t rows, uint32_t cols)
{
	return (type == GGML_Q4_0 || type == GGML_Q4_1 || type == GGML_Q8_0) && rows && rows % VNNI_ROWS == 0 &&
	       cols && cols % QK == 0;
}

size_t pkv_vnni_packed_bytes(uint32_t type, uint32_t rows, uint32_t cols)
{
	return (size_t)(rows / VNNI_ROWS) * (cols / QK) * blk_bytes(type);
}

size_t pkv_vnni_tile_bytes(uint32_t type, uint32_t cols)
{
	return (size_t)(cols / QK) * blk_bytes(type);
}

void pkv_vnni_pack(uint32_t type, const uint8_t *data, size_t row_bytes, uint32_t rows, uint32_t cols, uint8_t *out)
{
	size_t nb = cols / QK, bb = blk_bytes(type), sb = type == GGML_Q4_0 ? sizeof(struct blk_q4_0) :
					       type == GGML_Q4_1 ? sizeof(struct blk_q4_1) : sizeof(struct blk_q8_0);
	size_t qoff = type == GGML_Q4_1 ? 4 : 2, nq = type == GGML_Q8_0 ? 32 : 16;
	for (uint32_t t = 0; t < rows / VNNI_ROWS; t++)
		for (size_t b = 0; b < nb; b++) {
			uint8_t *o = out + ((size_t)t * nb + b) * bb, *q = o + bb - qbytes(type);
			for (int r = 0; r < VNNI_ROWS; r++) {
				const uint8_t *src = data + ((size_t)t * VNNI_ROWS + (size_t)r) * row_bytes + b * sb;
				memcpy(o + 2 * r, src, 2); /* d */
				if (type == GGML_Q4_1)
					memcpy(o + 32 + 2 * r, src + 2, 2); /* m */
				for (size_t k = 0; k < nq; k++) {
					uint8_t v = src[qoff + k];
					q[(k / 4) * 64 + (size_t)r * 4 + k % 4] = type == GGML_Q8_0 ? (uint8_t)(v ^ 0x80) : v;
				}
			}
		}
}

void pkv_q8_quant_act_ref(const float *x, size_t n, int8_t *qs, int8_t *qlo, float *d, float *s)
{
	for (size_t b = 0; b < n / QK; b++) {
		const float *v = x + b * QK;
		float amax = 0;
		int sum = 0;
		for (int j = 0; j < QK; j++)
			amax = fmaxf(amax, fabsf(v[j]));
		float db = amax / (qlo ? Q16_MAX : 127.f), id = db ? 1.f / db : 0;
		for (int j = 0; j < QK; j++) {
			int q = (int)lrintf(v[j] * id);
			if (qlo) {
				int hi = (q + 128) >> 8; /* floor: lo lands in [-128, 127] */
				qs[b * QK + (size_t)j] = (int8_t)hi;
				qlo[b * QK + (size_t)j] = (int8_t)(q - 256 * hi);
			} else {
				qs[b * QK + (size_t)j] = (int8_t)q;
			}
			sum += q;
		}
		d[b] = db;
		s[b] = db * (float)sum;
	}
}

float pkv_q8_dot_ref(uint32_t type, const void *row, const int8_t *qs, const int8_t *qlo, const float *d,
		     const float *s, size_t nb)
{
	const uint8_t *p = row;
	float acc = 0;
	for (size_t b = 0; b < nb; b++) {
		int x[QK];
		for (int j = 0; j < QK; j++)
			x[j] = qlo ? qs[b * QK + (size_t)j] * 256 + qlo[b * QK + (size_t)j] : qs[b * QK + (size_t)j];
		int isum = 0;
		float dw, m;
		if (type == GGML_Q8_0) {
			struct blk_q8_0 k;
			memcpy(&k, p + b * sizeof k, sizeof k);
			for (int j = 0; j < QK; j++)
				isum += k.qs[j] * x[j];
			acc += pkv_f16_to_f32(k.d) * d[b] * (float)isum;
			continue;
		}
		const uint8_t *q;
		if (type == GGML_Q4_1) {
			struct blk_q4_1 k;
			memcpy(&k, p + b * sizeof k, sizeof k);
			dw = pkv_f16_to_f32(k.d);
			m = pkv_f16_to_f32(k.m);
			q = p + b * sizeof k + 4;
		} else {
			struct blk_q4_0 k;
			memcpy(&k, p + b * sizeof k, sizeof k);
			dw = pkv_f16_to_f32(k.d);
			m = -8.f * dw;
			q = p + b * sizeof k + 2;
		}
		for (int j = 0; j < QK / 2; j++)
			isum += (q[j] & 15) * x[j] + (q[j] >> 4) * x[j + 16];
		acc += dw * d[b] * (float)isum + m * s[b];
	}
	return acc;
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

#define T_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

/* F16C (CPUID.1:ECX bit 29); its state is AVX's, checked with AVX-512's. clang 14 has no "f16c" builtin name. */
static int has_f16c(void)
{
	unsigned int a, b, c, d;

	return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1);
}

int pkv_vnni_available(void)
{
	static int have = -1;
	if (have < 0) {
		__builtin_cpu_init();
		have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
		       __builtin_cpu_supports("fma") && has_f16c();
	}
	return have;
}

/* Same arithmetic as pkv_q8_quant_act_ref (x * (1/d) rounded to nearest-even), so both give the same bytes. */
T_VNNI void pkv_q8_quant_act(const float *x, size_t n, int8_t *qs, int8_t *qlo, float *d, float *s)
{
	for (size_t b = 0; b < n / QK; b++) {
		__m512 v0 = _mm512_loadu_ps(x + b * QK), v1 = _mm512_loadu_ps(x + b * QK + 16);
		float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
		float db = amax / (qlo ? Q16_MAX : 127.f), id = db ? 1.f / db : 0;
		__m512 vid = _mm512_set1_ps(id);
		__m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
		if (qlo) {
			const __m512i c128 = _mm512_set1_epi32(128);
			__m512i h0 = _mm512_srai_epi32(_mm512_add_epi32(q0, c128), 8);
			__m512i h1 = _mm512_srai_epi32(_mm512_add_epi32(q1, c128), 8);
			_mm_storeu_si128((__m128i *)(qs + b * QK), _mm512_cvtepi32_epi8(h0));
			_mm_storeu_si128((__m128i *)(qs + b * QK + 16), _mm512_cvtepi32_epi8(h1));
			_mm_storeu_si128((__m128i *)(qlo + b * QK),
					 _mm512_cvtepi32_epi8(_mm512_sub_epi32(q0, _mm512_slli_epi32(h0, 8))));
			_mm_storeu_si128((__m128i *)(qlo + b * QK + 16),
					 _mm512_cvtepi32_epi8(_mm512_sub_epi32(q1, _mm512_slli_epi32(h1, 8))));
		} else {
			_mm_storeu_si128((__m128i *)(qs + b * QK), _mm512_cvtepi32_epi8(q0));
			_mm_storeu_si128((__m128i *)(qs + b * QK + 16), _mm512_cvtepi32_epi8(q1));
		}
		d[b] = db;
		s[b] = db * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
	}
}

/*
 * 16 rows (one tile) x NT tokens. Each block's weights are unpacked once and used for every token:
 * with NT = 8 a weight byte feeds 8 vpdpbusd lanes, which is what makes prefill a GEMM.
 */
__attribute__((always_inline)) T_VNNI static inline void tile_kernel(uint32_t type, const uint8_t *tile, size_t nb,
								      const int8_t *qs, const int8_t *qlo, const float *d,
								      const float *s, size_t xs, float *y, size_t ys, const int NT)
{
	const size_t bb = blk_bytes(type), qo = bb - qbytes(type);
	const __m512i m4 = _mm512_set1_epi8(15);
	__m512 acc[8], accm[8];
	for (int t = 0; t < NT; t++)
		acc[t] = accm[t] = _mm512_setzero_ps();
	for (size_t b = 0; b < nb; b++) {
		const uint8_t *p = tile + b * bb;
		__m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)), mw;
		if (type == GGML_Q4_1)
			mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
		else
			mw = _mm512_mul_ps(dw, _mm512_set1_ps(type == GGML_Q4_0 ? -8.f : -128.f));
		__m512i w[8];
		if (type == GGML_Q8_0) {
			for (int j = 0; j < 8; j++)
				w[j] = _mm512_loadu_si512((const void *)(p + qo + 64 * j));
		} else {
			for (int j = 0; j < 4; j++) {
				__m512i v = _mm512_loadu_si512((const void *)(p + qo + 64 * j));
				w[j] = _mm512_and_si512(v, m4);
				w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
			}
		}
		for (int t = 0; t < NT; t++) {
			const int8_t *x = qs + t * xs * QK + b * QK;
			int32_t xw[8];
			memcpy(xw, x, sizeof xw);
			/* two chains so one token's 8 dot steps do not serialize on vpdpbusd latency */
			__m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
			i0 = _mm512_dpbusd_epi32(i0, w[0], _mm512_set1_epi32(xw[0]));
			i1 = _mm512_dpbusd_epi32(i1, w[1], _mm512_set1_epi32(xw[1]));
			i0 = _mm512_dpbusd_epi32(i0, w[2], _mm512_set1_epi32(xw[2]));
			i1 = _mm512_dpbusd_epi32(i1, w[3], _mm512_set1_epi32(xw[3]));
			i0 = _mm512_dpbusd_epi32(i0, w[4], _mm512_set1_epi32(xw[4]));
			i1 = _mm512_dpbusd_epi32(i1, w[5], _mm512_set1_epi32(xw[5]));
			i0 = _mm512_dpbusd_epi32(i0, w[6], _mm512_set1_epi32(xw[6]));
			i1 = _mm512_dpbusd_epi32(i1, w[7], _mm512_set1_epi32(xw[7]));
			__m512i isum = _mm512_add_epi32(i0, i1);
			if (qlo) {
				/* the low plane: q = 256 hi + lo, and |256 * hi-dot| < 2^29 stays in int32 */
				memcpy(xw, qlo + t * xs * QK + b * QK, sizeof xw);
				__m512i l0 = _mm512_setzero_si512(), l1 = _mm512_setzero_si512();
				for (int k = 0; k < 8; k += 2) {
					l0 = _mm512_dpbusd_epi32(l0, w[k], _mm512_set1_epi32(xw[k]));
					l1 = _mm512_dpbusd_epi32(l1, w[k + 1], _mm512_set1_epi32(xw[k + 1]));
				}
				isum = _mm512_add_epi32(_mm512_slli_epi32(isum, 8), _mm512_add_epi32(l0, l1));
			}
			float dx = d[t * xs + b], sx = s[t * xs + b];
			acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum),
						 _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[t]);
			accm[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), accm[t]);
		}
	}
	for (int t = 0; t < NT; t++)
		_mm512_storeu_ps(y + t * ys, _mm512_add_ps(acc[t], accm[t]));
}

#define KERNELS(T, TY)                                                                                        \
	T_VNNI static void k_##T(const uint8_t *tile, size_t nb, const int8_t *qs, const int8_t *ql, const float *d, \
				 const float *s, size_t xs, float *y, size_t ys, size_t nt)                           \
	{                                                                                                     \
		switch (nt) {                                                                                 \
		case 1: tile_kernel(TY, tile, nb, qs, ql, d, s, xs, y, ys, 1); break;                         \
		case 2: tile_kernel(TY, tile, nb, qs, ql, d, s, xs, y, ys, 2); break;                         \
		case 3: tile_kernel(TY, tile, nb, qs, ql, d, s, xs, y, ys, 3); break;                         \
		case 4: tile_kernel(TY, tile, nb, qs, ql, d, s, xs, y, ys, 4); break;                         \
		case 5: tile_kernel(TY, tile, nb, qs, ql, d, s, xs, y, ys, 5); break;                         \
		case 6: tile_kernel(TY, tile, nb, qs, ql, d, s, xs, y, ys, 6); break;                         \
		case 7: tile_kernel(TY, tile, nb, qs, ql, d, s, xs, y, ys, 7); break;                         \
		default: tile_kernel(TY, tile, nb, qs, ql, d, s, xs, y, ys, 8); break;                        \
		}                                                                                             \
	}
KERNELS(q4_0, GGML_Q4_0)
KERNELS(q4_1, GGML_Q4_1)
KERNELS(q8_0, GGML_Q8_0)
#undef KERNELS

void pkv_vnni_tile(uint32_t type, const uint8_t *tile, size_t nb, const int8_t *qs, const int8_t *qlo, const float *d,
		   const float *s, size_t nt, float *y, size_t ys)
{
	/* tokens in groups of up to VNNI_TOKENS: the weights of a tile stay in L1 across groups */
	for (size_t t = 0; t < nt; t += VNNI_TOKENS) {
		size_t k = nt - t < VNNI_TOKENS ? nt - t : VNNI_TOKENS;
		const int8_t *q = qs + t * nb * QK, *ql = qlo ? qlo + t * nb * QK : NULL;
		const float *dd = d + t * nb, *ss = s + t * nb;
		float *yy = y + t * ys;
		if (type == GGML_Q4_1)
			k_q4_1(tile, nb, q, ql, dd, ss, nb, yy, ys, k);
		else if (type == GGML_Q4_0)
			k_q4_0(tile, nb, q, ql, dd, ss, nb, yy, ys, k);
		else
			k_q8_0(tile, nb, q, ql, dd, ss, nb, yy, ys, k);
	}
}
#else
int pkv_vnni_available(void)
{
	return 0;
}

void pkv_q8_quant_act(const float *x, size_t n, int8_t *qs, int8_t *qlo, float *d, float *s)
{
	pkv_q8_quant_act_ref(x, n, qs, qlo, d, s);
}

void pkv_vnni_tile(uint32_t type, const uint8_t *tile, size_t nb, const int8_t *qs, const int8_t *qlo, const float *d,
		   const float *s, size_t nt, float *y, size_t ys)
{
	(void)type, (void)tile, (void)nb, (void)qs, (void)qlo, (void)d, (void)s, (void)nt, (void)y, (void)ys;
}
#endif
