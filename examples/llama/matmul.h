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
	uint8_t *packed; /* owned: the rows repacked for the VNNI kernels (gemm_vnni.h), or NULL */
	uint8_t *converted; /* owned: the rows converted at load (convert.c) that data points to, or NULL */
	int act16;       /* packed: its input takes 16-bit (two-plane) activation blocks, not int8 */
};

/* Scratch for quantized activations; grows on demand. */
struct mm_scratch {
	struct blk_a8 *a8;
	size_t cap; /* blocks */
	int8_t *q8;   /* int8 activation blocks for packed weights: qs, and d/s per block */
	float *q8d, *q8s;
	size_t q8cap; /* blocks */
};

/* Y[t][r] = sum_c X[t][c] * W[r][c] for t < n_x. X and Y are f32, row-major. -ENOMEM on scratch growth. */
int pkv_matmul(struct tpool *tp, struct mm_scratch *s, const struct wmat *w, const float *x, size_t n_x, float *y);
void pkv_mm_scratch_free(struct mm_scratch *s);
/*
 * Several matrices over the same X in one pass of the pool (one barrier, one quantization):
 * Y_i = X W_i^T. With swiglu (n == 2, same rows): y[0] = silu(X W_0^T) * (X W_1^T), y[1] scratch.
 * All must have the same cols.
 */
int pkv_matmul_n(struct tpool *tp, struct mm_scratch *s, const struct wmat *const *w, float *const *y, int n,
		 const float *x, size_t n_x, int swiglu);
/* Repacks w for the VNNI kernels when the CPU has them and $PKV_ISA does not ask for another path
 * (0 also when it does not apply); -ENOMEM. pkv_wmat_unpack drops the packed copy. */
int pkv_wmat_pack(struct wmat *w);
void pkv_wmat_unpack(struct wmat *w);
/* A matrix of a type the kernels do not serve (pkv_convert_target(type) != type) converted into
 * memory it then owns (w->converted; data, type and row_bytes follow); 0 when nothing to do, -ENOMEM,
 * -EINVAL. pkv_wmat_free_converted frees that copy. Both in convert.c. */
int pkv_wmat_convert(struct wmat *w);
void pkv_wmat_free_converted(struct wmat *w);
/* Row r of W as floats (embedding lookup). */
void pkv_wmat_row(const struct wmat *w, uint32_t r, float *out);
int pkv_wmat_is_quant(uint32_t type);

#endif
