/* SPDX-License-Identifier: MIT */
/* AVX512-VNNI matmul kernels: quantized weights repacked 16 rows per tile, int8 activation blocks. */
#ifndef PKV_EX_GEMM_VNNI_H
#define PKV_EX_GEMM_VNNI_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"

#define VNNI_ROWS 16  /* weight rows per tile: one int32 lane each in a zmm */
#define VNNI_TOKENS 8 /* activation rows sharing one unpack of a weight block */
#define Q16_MAX 32639.f /* 127 * 257: the largest q whose high byte (q + 128) >> 8 fits in int8 */

/*
 * Activations for these kernels: per token, cols/32 blocks of int8 qs (contiguous, 32 per block),
 * with per-block scale d and s = d * sum(qs) in separate float arrays. 8 bits per value as
 * llama.cpp's Q8 activations; the scale is per 32 values, not per row, so one outlier channel only
 * coarsens its own block.
 * Wide blocks (qlo != NULL) keep 16 bits as two int8 planes, q = 256 * qs + qlo with |q| <= 32639: the
 * same kernels with twice the vpdpbusd, for the matrices whose inputs int8 rounds too coarsely.
 */

/* 1 when the CPU runs the kernels below (AVX512F/BW/VL + VNNI); the rest of this header needs it,
 * except the _ref functions and the packing, which are portable. */
int pkv_vnni_available(void);
/* 1 when a [rows][cols] matrix of this type can be packed (Q4_0/Q4_1/Q8_0, rows % 16 == 0). */
int pkv_vnni_type_ok(uint32_t type, uint32_t rows, uint32_t cols);
size_t pkv_vnni_packed_bytes(uint32_t type, uint32_t rows, uint32_t cols);
/* Bytes of one 16-row tile (tile i starts at i times this). */
size_t pkv_vnni_tile_bytes(uint32_t type, uint32_t cols);
/* Repacks GGML rows (row_bytes apart) into out (pkv_vnni_packed_bytes long). */
void pkv_vnni_pack(uint32_t type, const uint8_t *data, size_t row_bytes, uint32_t rows, uint32_t cols, uint8_t *out);

/* Quantizes n (multiple of 32) floats: qs[n], d[n/32], s[n/32] (and qlo[n] for wide blocks, else NULL). */
void pkv_q8_quant_act(const float *x, size_t n, int8_t *qs, int8_t *qlo, float *d, float *s);
/* The portable reference: the same bytes and scales as pkv_q8_quant_act. */
void pkv_q8_quant_act_ref(const float *x, size_t n, int8_t *qs, int8_t *qlo, float *d, float *s);
/* Reference dot of one GGML row (unpacked) with one token's activation blocks. */
float pkv_q8_dot_ref(uint32_t type, const void *row, const int8_t *qs, const int8_t *qlo, const float *d,
		     const float *s, size_t nb);

/* y[t * ys + r] = row r of the tile . token t, for r < 16 and t < nt; token t's activations start at
 * qs + t * nb * 32 (qlo likewise, or NULL), d + t * nb, s + t * nb. */
void pkv_vnni_tile(uint32_t type, const uint8_t *tile, size_t nb, const int8_t *qs, const int8_t *qlo, const float *d,
		   const float *s, size_t nt, float *y, size_t ys);

#endif
