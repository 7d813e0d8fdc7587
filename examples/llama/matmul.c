/* SPDX-License-Identifier: MIT */
/* Threaded matmul: activations are quantized once per call for quantized weights, then
 * each thread owns a range of weight rows and sweeps all activation rows over them, so a weight row
 * is read from memory once per call whatever the batch size (decode batching is nearly free).
 * Weights repacked for VNNI take int8 activation blocks and 16-row tiles (gemm_vnni.c); the others
 * the 16-bit blocks of quant.h. */
#include "matmul.h"
#include "gemm_vnni.h"
#include "gguf.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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

int pkv_wmat_pack(struct wmat *w)
{
	const char *isa = getenv("PKV_ISA");
	if (w->packed || !pkv_vnni_available() || (isa && strcmp(isa, "vnni")) ||
	    !pkv_vnni_type_ok(w->type, w->rows, w->cols))
		return 0;
	w->packed = malloc(pkv_vnni_packed_bytes(w->type, w->rows, w->cols));
	if (!w->packed)
		return -ENOMEM;
	pkv_vnni_pack(w->type, w->data, w->row_bytes, w->rows, w->cols, w->packed);
	return 0;
}

void pkv_wmat_unpack(struct wmat *w)
{
	free(w->packed);
	w->packed = NULL;
}

/* Packed path: all matrices' 16-row tiles form one list of work units, claimed in chunks. */
struct vj {
	atomic_size_t next;
	const struct wmat *const *w;
	float *const *y;
	int n, swiglu;
	size_t cum[8]; /* cumulative tile counts */
	size_t chunk, n_x, nb;
	const int8_t *qs, *qlo;
	const float *d, *s;
};

static void vnni_worker(void *arg, int ith, int nth)
{
	struct vj *j = arg;
	size_t total = j->cum[j->n - 1];
	for (;;) {
		size_t u0 = atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
		if (u0 >= total)
			break;
		size_t ue = u0 + j->chunk < total ? u0 + j->chunk : total;
		for (size_t u = u0; u < ue; u++) {
			int i = 0;
			while (u >= j->cum[i])
				i++;
			size_t tile = u - (i ? j->cum[i - 1] : 0);
			const struct wmat *w = j->w[i];
			size_t tb = pkv_vnni_tile_bytes(w->type, w->cols), r0 = tile * VNNI_ROWS;
			pkv_vnni_tile(w->type, w->packed + tile * tb, j->nb, j->qs, j->qlo, j->d, j->s, j->n_x, j->y[i] + r0,
				      w->rows);
			if (!j->swiglu)
				continue;
			const struct wmat *w1 = j->w[1];
			pkv_vnni_tile(w1->type, w1->packed + tile * tb, j->nb, j->qs, j->qlo, j->d, j->s, j->n_x,
				      j->y[1] + r0, w1->rows);
			for (size_t t = 0; t < j->n_x; t++) {
				float *g = j->y[0] + t * w->rows + r0, *up = j->y[1] + t * w->rows + r0;
				for (int r = 0; r < VNNI_ROWS; r++)
					g[r] = g[r] / (1.f + expf(-g[r])) * up[r];
			}
		}
	}
}

struct q8_job {
	atomic_size_t next;
	const float *x;
	int8_t *qs, *qlo;
	float *d, *s;
	size_t n_x, cols;
};

static void q8_worker(void *arg, int ith, int nth)
{
	struct q8_job *j = arg;
	size_t nb = j->cols / QK;
	for (size_t t; (t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n_x;)
		pkv_q8_quant_act(j->x + t * j->cols, j->cols, j->qs + t * j->cols, j->qlo ? j->qlo + t * j->cols : NULL,
				 j->d + t * nb, j->s + t * nb);
}

static int all_packed(const struct wmat *const *w, int n, int swiglu)
{
	if (n < 1 || n > 8 || (swiglu && (n != 2 || w[0]->rows != w[1]->rows || w[0]->type != w[1]->type)))
		return 0;
	for (int i = 0; i < n; i++)
		if (!w[i]->packed || w[i]->cols != w[0]->cols)
			return 0;
	return 1;
}

static int matmul_packed(struct tpool *tp, struct mm_scratch *s, const struct wmat *const *w, float *const *y,
			 int n, const float *x, size_t n_x, int swiglu)
{
	size_t cols = w[0]->cols, nb = cols / QK, need = n_x * nb;
	int wide = 0;
	for (int i = 0; i < n; i++)
		wide |= w[i]->act16;
	if (need > s->q8cap) {
		int8_t *q = realloc(s->q8, need * QK * 2); /* room for the low plane of wide blocks */
		if (!q)
			return -ENOMEM;
		s->q8 = q;
		float *d = realloc(s->q8d, need * sizeof *d);
		if (!d)
			return -ENOMEM;
		s->q8d = d;
		float *sm = realloc(s->q8s, need * sizeof *sm);
		if (!sm)
			return -ENOMEM;
		s->q8s = sm;
		s->q8cap = need;
	}
	int8_t *qlo = wide ? s->q8 + need * QK : NULL;
	struct q8_job q = { .next = 0, .x = x, .qs = s->q8, .qlo = qlo, .d = s->q8d, .s = s->q8s, .n_x = n_x,
			    .cols = cols };
	if (n_x > 1)
		tpool_run(tp, q8_worker, &q);
	else
		q8_worker(&q, 0, 1);
	struct vj j = { .next = 0, .w = w, .y = y, .n = swiglu ? 1 : n, .swiglu = swiglu, .n_x = n_x, .nb = nb,
			.qs = s->q8, .qlo = qlo, .d = s->q8d, .s = s->q8s };
	for (int i = 0; i < j.n; i++)
		j.cum[i] = (i ? j.cum[i - 1] : 0) + w[i]->rows / VNNI_ROWS;
	/* ~8 claims per thread: few atomics, yet a descheduled thread leaves little behind */
	j.chunk = j.cum[j.n - 1] / ((size_t)tpool_size(tp) * 8);
	if (j.chunk < 1)
		j.chunk = 1;
	tpool_run(tp, vnni_worker, &j);
	return 0;
}

int pkv_matmul_n(struct tpool *tp, struct mm_scratch *s, const struct wmat *const *w, float *const *y, int n,
		 const float *x, size_t n_x, int swiglu)
{
	if (all_packed(w, n, swiglu))
		return matmul_packed(tp, s, w, y, n, x, n_x, swiglu);
	for (int i = 0; i < n; i++) {
		int r = pkv_matmul(tp, s, w[i], x, n_x, y[i]);
		if (r)
			return r;
	}
	if (swiglu)
		for (size_t i = 0; i < n_x * w[0]->rows; i++) {
			float g = y[0][i];
			y[0][i] = g / (1.f + expf(-g)) * y[1][i];
		}
	return 0;
}

int pkv_matmul(struct tpool *tp, struct mm_scratch *s, const struct wmat *w, const float *x, size_t n_x, float *y)
{
	if (pkv_convert_target(w->type) != w->type)
		return -EINVAL; /* no kernel reads it: pkv_wmat_convert first */
	if (w->packed)
		return matmul_packed(tp, s, &w, &y, 1, x, n_x, 0);
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
	free(s->q8);
	free(s->q8d);
	free(s->q8s);
	memset(s, 0, sizeof *s);
}
