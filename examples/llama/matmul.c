/* SPDX-License-Identifier: MIT */
/* Threaded matmul: activations are quantized to 8 bits once per call for quantized weights, then
 * each thread owns a range of weight rows and sweeps all activation rows over them, so a weight row
 * is read from memory once per call whatever the batch size (decode batching is nearly free). */
#include "matmul.h"
#include "gguf.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#define ROW_TILE 16 /* weight rows kept hot in L1 while the activation rows stream past */

int pkv_wmat_is_quant(uint32_t type)
{
	return type == GGML_Q4_0 || type == GGML_Q4_1 || type == GGML_Q8_0;
}

void pkv_wmat_row(const struct wmat *w, uint32_t r, float *out)
{
	pkv_dequant_row(w->type, w->data + (size_t)r * w->row_bytes, out, w->cols);
}

struct mm_job {
	atomic_size_t next; /* next row tile to claim */
	const struct wmat *w;
	const float *x;
	const struct blk_a8 *xa;
	size_t n_x;
	float *y;
	const struct pkv_dot_ops *ops;
};

static void mm_worker(void *arg, int ith, int nth)
{
	struct mm_job *j = arg;
	const struct wmat *w = j->w;
	size_t nb = w->cols / QK;
	for (;;) {
		size_t rt = atomic_fetch_add_explicit(&j->next, ROW_TILE, memory_order_relaxed);
		if (rt >= w->rows)
			break;
		size_t re = rt + ROW_TILE < w->rows ? rt + ROW_TILE : w->rows;
		size_t t = 0;
		if (j->xa && j->ops->quant_x4)
			for (; t + 4 <= j->n_x; t += 4)
				for (size_t r = rt; r < re; r++) {
					float o[4];
					j->ops->quant_x4(w->type, w->data + r * w->row_bytes, j->xa + t * nb, nb, nb, o);
					for (int k = 0; k < 4; k++)
						j->y[(t + (size_t)k) * w->rows + r] = o[k];
				}
		for (; t < j->n_x; t++) {
			float *yr = j->y + t * w->rows;
			for (size_t r = rt; r < re; r++) {
				const void *wr = w->data + r * w->row_bytes;
				float v;
				switch (w->type) {
				case GGML_Q4_0: v = j->ops->q4_0(wr, j->xa + t * nb, nb); break;
				case GGML_Q4_1: v = j->ops->q4_1(wr, j->xa + t * nb, nb); break;
				case GGML_Q8_0: v = j->ops->q8_0(wr, j->xa + t * nb, nb); break;
				case GGML_F16: v = j->ops->f16(wr, j->x + t * w->cols, w->cols); break;
				case GGML_BF16: v = j->ops->bf16(wr, j->x + t * w->cols, w->cols); break;
				default: v = j->ops->f32(wr, j->x + t * w->cols, w->cols); break;
				}
				yr[r] = v;
			}
		}
	}
}

struct qa_job {
	atomic_size_t next;
	const float *x;
	struct blk_a8 *xa;
	size_t n_x, cols;
};

static void qa_worker(void *arg, int ith, int nth)
{
	struct qa_job *j = arg;
	for (size_t t; (t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n_x;)
		pkv_quant_act(j->x + t * j->cols, j->xa + t * (j->cols / QK), j->cols);
}

int pkv_matmul(struct tpool *tp, struct mm_scratch *s, const struct wmat *w, const float *x, size_t n_x, float *y)
{
	struct mm_job j = { .next = 0, .w = w, .x = x, .n_x = n_x, .y = y, .ops = pkv_dot_ops() };
	if (pkv_wmat_is_quant(w->type)) {
		size_t need = n_x * (w->cols / QK);
		if (need > s->cap) {
			struct blk_a8 *n = realloc(s->a8, need * sizeof *n);
			if (!n)
				return -ENOMEM;
			s->a8 = n;
			s->cap = need;
		}
		struct qa_job q = { .next = 0, .x = x, .xa = s->a8, .n_x = n_x, .cols = w->cols };
		if (n_x > 1)
			tpool_run(tp, qa_worker, &q);
		else
			qa_worker(&q, 0, 1);
		j.xa = s->a8;
	}
	tpool_run(tp, mm_worker, &j);
	return 0;
}

void pkv_mm_scratch_free(struct mm_scratch *s)
{
	free(s->a8);
	s->a8 = NULL;
	s->cap = 0;
}
