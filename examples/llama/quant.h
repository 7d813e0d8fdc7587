/* SPDX-License-Identifier: MIT */
/* Weight formats (F32, F16, BF16, Q8_0, Q4_0, Q4_1, and Q5_0, Q5_1, Q4_K, Q5_K, Q6_K converted at load, in GGML's
 * block layouts), 8-bit activation blocks and row dots. */
#ifndef PKV_EX_QUANT_H
#define PKV_EX_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <pagedkv/dtype.h>

#define QK 32 /* elements per quantized block */

/* GGML layouts (packed, little-endian). Nibble j of qs: low nibble = element j, high = element j+16. */
struct blk_q4_0 { uint16_t d; uint8_t qs[QK / 2]; };
struct blk_q4_1 { uint16_t d, m; uint8_t qs[QK / 2]; };
struct blk_q8_0 { uint16_t d; int8_t qs[QK]; };

/*
 * Formats the kernels do not serve: read from GGUF files, converted once at load (convert.c) into
 * Q4_1 or Q8_0. Their (de)quantizers live in quant_k.c.
 * Q5_0 / Q5_1: Q4_0 / Q4_1 nibbles plus a fifth bit per element, bit j of qh (little-endian u32) for
 * element j; x = d * (q - 16), or x = d * q + m.
 */
struct blk_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; };
struct blk_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; };

#define QK_K 256 /* elements per K-quant super-block */
/*
 * Q4_K / Q5_K: 8 sub-blocks of 32; sub-block j has a 6-bit scale sc_j and min m_j (packed in scales[],
 * see pkv_k_scale_min) and x = (d * sc_j) * q - (dmin * m_j), q in 0..15 (0..31 with Q5_K's high bit).
 * Sub-blocks 2c and 2c+1 share the 32 bytes qs[32c..32c+31]: low nibbles are 2c, high nibbles 2c+1.
 * Q5_K's fifth bit of element i of sub-block j is bit j of qh[i].
 */
struct blk_q4_k { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; };
struct blk_q5_k { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
/*
 * Q6_K: 16 sub-blocks of 16 with signed 8-bit scales; x = (d * scales[e / 16]) * (q - 32), q in 0..63.
 * Element e = 128h + 32g + l (h < 2, g < 4, l < 32): low 4 bits from ql[64h + 32(g & 1) + l] (low
 * nibble for g < 2, high for g >= 2), high 2 bits from bits 2g, 2g+1 of qh[32h + l].
 */
struct blk_q6_k { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };

/*
 * Activations quantized for integer dots: x ~= d * qs, s = d * sum(qs) (for the Q4 offsets).
 * 16-bit, not 8: SmolLM2's normalized activations have outlier channels a few hundred times larger
 * than the rest, and 8-bit blocks round their neighbours to zero — enough to change greedy answers
 * (measured: "The capital of France is Paris." only with >= 16 bits). int16 x int16 madd runs 32
 * products per AVX-512 instruction, as many as VNNI's u8 x s8 at 256 bits, so it costs little.
 */
struct blk_a8 { float d, s; int16_t qs[QK]; };

/* A block's extremes, which the test quantizers choose their scales from. */
struct blk_range { float amax, sgnmax, vmax, vmin; }; /* largest magnitude, its signed value, max, min */
struct blk_range pkv_blk_range(const float *v, size_t n);

/* Dequantizes one row of n elements of the given GGML type. */
void pkv_dequant_row(uint32_t type, const void *row, float *out, size_t n);
/* Quantizes n floats into a row of the given type (used by tests and by the random-model writer). */
int pkv_quant_row(uint32_t type, const float *x, void *row, size_t n);
/* Bytes one row of n elements takes. */
size_t pkv_row_bytes(uint32_t type, size_t n);

/* quant.c's dispatchers hand Q5_0, Q5_1, Q4_K, Q5_K and Q6_K rows to these (quant_k.c). */
void pkv_dequant_row_k(uint32_t type, const void *row, float *out, size_t n);
int pkv_quant_row_k(uint32_t type, const float *x, void *row, size_t n);
/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block. */
void pkv_k_scale_min(const uint8_t scales[12], int j, int *sc, int *m);

/*
 * Load-time conversion (convert.c): the type a weight matrix of this type is computed in (Q4_1 for
 * Q4_K, Q8_0 for Q5_0, Q5_1, Q5_K and Q6_K, the type itself otherwise), and one row converted to it
 * (scratch: n floats). -EINVAL for a type this client cannot read.
 */
uint32_t pkv_convert_target(uint32_t type);
int pkv_convert_row(uint32_t type, const void *src, void *dst, size_t n, float *scratch);

/* Quantizes n (multiple of 32) floats into n/32 activation blocks. */
void pkv_quant_act(const float *x, struct blk_a8 *out, size_t n);

/* Row dot products, dispatched once to the best ISA the CPU has (AVX-512BW, AVX2, scalar). */
struct pkv_dot_ops {
	const char *isa;
	/* quantized weight row . activation blocks */
	float (*q4_0)(const void *w, const struct blk_a8 *x, size_t nb);
	float (*q4_1)(const void *w, const struct blk_a8 *x, size_t nb);
	float (*q8_0)(const void *w, const struct blk_a8 *x, size_t nb);
	/* float weight row . float activations */
	float (*f32)(const float *w, const float *x, size_t n);
	float (*f16)(const uint16_t *w, const float *x, size_t n);
	float (*bf16)(const uint16_t *w, const float *x, size_t n);
	/* Optional (may be NULL): one quantized weight row against 4 activation rows (x, x + stride,
	 * x + 2 stride, x + 3 stride blocks) so each weight block is unpacked once for 4 rows (prefill). */
	void (*quant_x4)(uint32_t type, const void *w, const struct blk_a8 *x, size_t stride, size_t nb, float *out);
};

const struct pkv_dot_ops *pkv_dot_ops(void);
/* The portable implementation (the reference the SIMD versions are tested against). */
const struct pkv_dot_ops *pkv_dot_ops_scalar(void);
/* NULL when the CPU lacks the ISA. */
const struct pkv_dot_ops *pkv_dot_ops_avx2(void);
const struct pkv_dot_ops *pkv_dot_ops_avx512(void);

#endif
