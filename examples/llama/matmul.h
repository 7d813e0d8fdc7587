/* SPDX-License-Identifier: MIT */
/* Weight matrices in GGML formats and the threaded Y = X W^T kernel over them. */
#ifndef PKV_EX_MATMUL_H
#define PKV_EX_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "threadpool.h"

/* A [rows][cols] weight matrix, row-major in a GGML type (a GGUF tensor with ne[0] = cols). */
struct wmat {
	uint32_t type;
	uint32_t rows, cols;
	size_t row_bytes;
	const uint8_t *data;
};

/* Scratch for quantized activations; grows on demand. */
struct mm_scratch {
	struct blk_a8 *a8;
	size_t cap; /* blocks */
};

/* Y[t][r] = sum_c X[t][c] * W[r][c] for t < n_x. X and Y are f32, row-major. -ENOMEM on scratch growth. */
int pkv_matmul(struct tpool *tp, struct mm_scratch *s, const struct wmat *w, const float *x, size_t n_x, float *y);
void pkv_mm_scratch_free(struct mm_scratch *s);
/* Row r of W as floats (embedding lookup). */
void pkv_wmat_row(const struct wmat *w, uint32_t r, float *out);
int pkv_wmat_is_quant(uint32_t type);

#endif
