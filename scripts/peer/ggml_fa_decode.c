/* SPDX-License-Identifier: MIT */
/*
 * The peer for `pkv-bench attn --only decode`: ggml's CPU flash attention
 * (ggml_flash_attn_ext, what llama.cpp runs with -fa 1) on the same decode
 * shapes, batch 1, f16 K/V and f32 queries, the K/V swept through a pool of
 * --sweep-mb MB so that every call reads from DRAM as a paged cache does.
 * Built and run by scripts/peer-ggml-fa against a llama.cpp tree; not part
 * of the Autotools build (pagedkv does not link ggml).
 *
 * Prints one line per shape and context: median µs per call and the K/V
 * bytes read per second, the figure pkv-bench attn prints for its rows, and
 * the largest error of one call against attention in double precision
 * (fails above MAX_ERROR).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml.h"
#include "ggml-cpu.h"

struct shape {
	const char *name;
	int nh, nkv, hd;
};

static const struct shape shapes[] = { { "hd64", 9, 3, 64 }, { "hd128", 32, 8, 128 } };
static const int ctxs[] = { 512, 2048, 8192 };

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Fills an f16 tensor with small values (softmax over them stays finite and ordinary). */
static void fill_f16(struct ggml_tensor *t, unsigned *seed)
{
	ggml_fp16_t *p = t->data;
	size_t n = ggml_nelements(t);

	for (size_t i = 0; i < n; i++) {
		*seed = *seed * 1103515245u + 12345u;
		p[i] = ggml_fp32_to_fp16(((float)((*seed >> 16) & 0x7fff) / 32768.0f - 0.5f) * 0.25f);
	}
}

/*
 * Largest error of ggml's output against attention in double precision, over
 * every head of one call: a peer that skipped work would show it here.
 */
static double max_error(const struct shape *sh, int ctx, const struct ggml_tensor *q, const struct ggml_tensor *k,
			const struct ggml_tensor *v, const struct ggml_tensor *o)
{
	const ggml_fp16_t *kp = k->data, *vp = v->data;
	double worst = 0, *w = malloc(sizeof(double) * (size_t)ctx);

	for (int h = 0; h < sh->nh && w; h++) {
		int kvh = h / (sh->nh / sh->nkv);
		const float *qh = (const float *)q->data + (size_t)h * sh->hd;
		double m = -INFINITY, l = 0;

		for (int j = 0; j < ctx; j++) {
			const ggml_fp16_t *kr = kp + ((size_t)kvh * ctx + j) * sh->hd;
			double dot = 0;

			for (int d = 0; d < sh->hd; d++)
				dot += (double)qh[d] * ggml_fp16_to_fp32(kr[d]);
			w[j] = dot / sqrt((double)sh->hd);
			m = w[j] > m ? w[j] : m;
		}
		for (int j = 0; j < ctx; j++)
			l += (w[j] = exp(w[j] - m));
		for (int d = 0; d < sh->hd; d++) {
			double acc = 0, e;

			for (int j = 0; j < ctx; j++)
				acc += w[j] * ggml_fp16_to_fp32(vp[((size_t)kvh * ctx + j) * sh->hd + d]);
			e = fabs(acc / l - ((const float *)o->data)[(size_t)h * sh->hd + d]);
			worst = e > worst ? e : worst;
		}
	}
	free(w);
	return w ? worst : INFINITY;
}

/* Above it the peer computed something else than attention: its figure would not count. */
#define MAX_ERROR 1e-3

static int run_row(const struct shape *sh, int ctx, int threads, double sweep_mb, int rounds,
		   struct ggml_threadpool *tp)
{
	size_t kv_bytes = (size_t)2 * sh->hd * ctx * sh->nkv * sizeof(ggml_fp16_t);
	int copies = (int)ceil(sweep_mb * 1048576.0 / (double)kv_bytes), calls = 0;
	size_t mem;
	struct ggml_context *g;
	struct ggml_tensor *q, *k0 = NULL, *v0 = NULL, *o0 = NULL;
	struct ggml_cgraph **gf;
	struct ggml_cplan plan;
	double *t;
	unsigned seed = 1;
	double err;

	if (copies < 1)
		copies = 1;
	/* Per copy: K, V, the output and their objects, a graph; then q; 64 MB of slack for alignment. */
	mem = (size_t)copies * (kv_bytes + (size_t)sh->hd * sh->nh * 4 + 4 * ggml_tensor_overhead() +
				ggml_graph_overhead() + 4096) +
	      (size_t)sh->hd * sh->nh * 8 + (64u << 20);
	g = ggml_init((struct ggml_init_params){ .mem_size = mem, .mem_buffer = NULL, .no_alloc = false });
	gf = calloc((size_t)copies, sizeof(*gf));
	t = calloc((size_t)rounds * copies, sizeof(*t));
	if (!g || !gf || !t) {
		fprintf(stderr, "peer: out of memory (%zu bytes)\n", mem);
		return -1;
	}
	q = ggml_new_tensor_3d(g, GGML_TYPE_F32, sh->hd, 1, sh->nh);
	for (int i = 0; i < sh->hd * sh->nh; i++)
		((float *)q->data)[i] = (float)((i * 7919) % 1000) / 4000.0f - 0.125f;
	for (int c = 0; c < copies; c++) {
		struct ggml_tensor *k = ggml_new_tensor_3d(g, GGML_TYPE_F16, sh->hd, ctx, sh->nkv);
		struct ggml_tensor *v = ggml_new_tensor_3d(g, GGML_TYPE_F16, sh->hd, ctx, sh->nkv);
		struct ggml_tensor *o;

		fill_f16(k, &seed);
		fill_f16(v, &seed);
		o = ggml_flash_attn_ext(g, q, k, v, NULL, 1.0f / sqrtf((float)sh->hd), 0.0f, 0.0f);
		if (!c) {
			k0 = k;
			v0 = v;
			o0 = o;
		}
		gf[c] = ggml_new_graph(g);
		ggml_build_forward_expand(gf[c], o);
	}
	/* The graphs are alike: one plan, work buffer and thread pool (made once, as llama.cpp does) serve them all. */
	plan = ggml_graph_plan(gf[0], threads, tp);
	plan.work_data = plan.work_size ? malloc(plan.work_size) : NULL;
	if (plan.work_size && !plan.work_data)
		return -1;
	/* One warm-up pass over the pool, then rounds of it: each call reads K/V the last pass evicted. */
	for (int c = 0; c < copies; c++)
		ggml_graph_compute(gf[c], &plan);
	err = max_error(sh, ctx, q, k0, v0, o0);
	if (!(err <= MAX_ERROR)) {
		fprintf(stderr, "peer: %s ctx %d: ggml's output is off by %.1e from attention\n", sh->name, ctx, err);
		return -1;
	}
	for (int r = 0; r < rounds; r++)
		for (int c = 0; c < copies; c++) {
			double t0 = now_us();

			if (ggml_graph_compute(gf[c], &plan) != GGML_STATUS_SUCCESS) {
				fprintf(stderr, "peer: graph compute failed\n");
				return -1;
			}
			t[calls++] = now_us() - t0;
		}
	qsort(t, (size_t)calls, sizeof(*t), cmp_d);
	printf("  ggml fa  %-5s batch  1 ctx %5d: %9.1f us  %5.1f GB/s  (threads %d, %d copies, %d calls, "
	       "max error %.1e)\n", sh->name, ctx, t[calls / 2], (double)kv_bytes / t[calls / 2] / 1e3, threads, copies,
	       calls, err);
	free(plan.work_data);
	free(t);
	free(gf);
	ggml_free(g);
	return 0;
}

int main(int argc, char **argv)
{
	int threads = 1, rounds = 15, ret = 0;
	double sweep_mb = 32;
	struct ggml_threadpool_params tpp;
	struct ggml_threadpool *tp;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--sweep-mb") && i + 1 < argc)
			sweep_mb = atof(argv[++i]);
		else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: %s [--threads N] [--sweep-mb MB] [--rounds N]\n", argv[0]);
			return 2;
		}
	}
	if (threads < 1 || rounds < 1 || sweep_mb < 0) {
		fprintf(stderr, "peer: bad arguments\n");
		return 2;
	}
	tpp = ggml_threadpool_params_default(threads);
	tp = ggml_threadpool_new(&tpp);
	if (!tp) {
		fprintf(stderr, "peer: cannot create ggml's thread pool\n");
		return 1;
	}
	printf("ggml flash attention (ggml_flash_attn_ext), f16 K/V, f32 queries, K/V swept through %.0f MB\n",
	       sweep_mb);
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]) && !ret; s++)
		for (size_t c = 0; c < sizeof(ctxs) / sizeof(ctxs[0]) && !ret; c++)
			ret = run_row(&shapes[s], ctxs[c], threads, sweep_mb, rounds, tp) ? 1 : 0;
	ggml_threadpool_free(tp);
	return ret;
}
