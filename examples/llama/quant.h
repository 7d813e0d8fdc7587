/* SPDX-License-Identifier: MIT */
/* Weight formats (F32, F16, BF16, Q8_0, Q4_0, Q4_1 in GGML's block layouts), 8-bit activation blocks and row dots. */
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
 * Activations quantized for integer dots: x ~= d * qs, s = d * sum(qs) (for the Q4 offsets).
 * 16-bit, not 8: SmolLM2's normalized activations have outlier channels a few hundred times larger
 * than the rest, and 8-bit blocks round their neighbours to zero — enough to change greedy answers
 * (measured: "The capital of France is Paris." only with >= 16 bits). int16 x int16 madd runs 32
 * products per AVX-512 instruction, as many as VNNI's u8 x s8 at 256 bits, so it costs little.
 */
struct blk_a8 { float d, s; int16_t qs[QK]; };

/* Dequantizes one row of n elements of the given GGML type. */
void pkv_dequant_row(uint32_t type, const void *row, float *out, size_t n);
/* Quantizes n floats into a row of the given type (used by tests and by the random-model writer). */
int pkv_quant_row(uint32_t type, const float *x, void *row, size_t n);
/* Bytes one row of n elements takes. */
size_t pkv_row_bytes(uint32_t type, size_t n);

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
