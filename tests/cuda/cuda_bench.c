/* SPDX-License-Identifier: MIT */
/* GPU benchmark of the paged attention kernels against ceilings measured in the same run (copy bandwidth, cuBLAS bf16 GEMM). */

/*
 * Usage: cuda_bench [--quick]
 * Prints one line per measurement and a summary table last. Times are medians
 * of CUDA-event-timed launches after warm-up. Decode rotates through several
 * layers of cache so that small configurations do not run out of L2.
 *   - copy: device-to-device cudaMemcpy of 2 GiB, bytes read + written;
 *   - gemm: cublasGemmEx bf16 x bf16 -> bf16, f32 accumulation, 8192^3, random data;
 *   - decode: K+V bytes read per second, batch 1/16/64 x ctx 2048/8192/32768,
 *     32 query / 8 KV heads, head dim 128, bf16 cache, block size 16, shuffled
 *     block tables (kernels + split merge, as the plugin launches them);
 *   - prefill: 4 x 2048 causal, same heads, FLOP/s counting the causal half
 *     (4 * sq * sk / 2 * head_dim * heads per sequence).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <cublas_v2.h>

#include <pagedkv/types.h>
#include "pkv_cuda_kernels.h"
#include "pkv_cuda.h" /* plugins/cuda: the split heuristic the plugin ships */

#define CK(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "bench: %s failed: %s (line %d)\n", #call, cudaGetErrorString(e_), \
				__LINE__);                                                         \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

static uint64_t rs = 88172645463325252ull;

static float rnd_f(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int cmp_f(const void *a, const void *b)
{
	const float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

static float median(float *v, int n)
{
	qsort(v, (size_t)n, sizeof(float), cmp_f);
	return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

/* Fills n bf16/f16/f32 elements at dev with uniform [-1, 1) values, through a 16M-element random tile. */
static void fill_random(void *dev, size_t n, int dtype)
{
	static float *host_tile;
	static void *dev_f32;
	const size_t tile = (size_t)16 << 20, es = pkv_dtype_size((uint32_t)dtype);
	size_t done = 0;

	if (!host_tile) {
		host_tile = malloc(tile * sizeof(float));
		for (size_t i = 0; i < tile; i++)
			host_tile[i] = rnd_f();
		CK(cudaMalloc(&dev_f32, tile * sizeof(float)));
		CK(cudaMemcpy(dev_f32, host_tile, tile * sizeof(float), cudaMemcpyHostToDevice));
	}
	while (done < n) {
		const size_t m = n - done < tile ? n - done : tile;
		CK((cudaError_t)pkv_cuda_convert(dev_f32, PKV_DTYPE_F32, (char *)dev + done * es, dtype, (int64_t)m, NULL));
		done += m;
	}
	CK(cudaDeviceSynchronize());
}

struct timer {
	cudaEvent_t a, b;
};

static float elapsed_ms(struct timer *t)
{
	float ms;
	CK(cudaEventSynchronize(t->b));
	CK(cudaEventElapsedTime(&ms, t->a, t->b));
	return ms;
}

static double copy_gbs(int reps)
{
	const size_t bytes = (size_t)2 << 30;
	void *src, *dst;
	struct timer t;
	float ms[32];
	int i;

	CK(cudaMalloc(&src, bytes));
	CK(cudaMalloc(&dst, bytes));
	fill_random(src, bytes / 2, PKV_DTYPE_BF16);
	CK(cudaEventCreate(&t.a));
	CK(cudaEventCreate(&t.b));
	for (i = 0; i < 3; i++)
		CK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
	for (i = 0; i < reps; i++) {
		CK(cudaEventRecord(t.a, 0));
		CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
		CK(cudaEventRecord(t.b, 0));
		ms[i] = elapsed_ms(&t);
	}
	CK(cudaFree(src));
	CK(cudaFree(dst));
	return 2.0 * bytes / (median(ms, reps) * 1e-3) / 1e9;
}

static double gemm_tflops(int reps)
{
	const int n = 8192;
	void *a, *b, *c;
	cublasHandle_t h;
	const float one = 1.f, zero = 0.f;
	struct timer t;
	float ms[32];
	int i;

	CK(cudaMalloc(&a, (size_t)n * n * 2));
	CK(cudaMalloc(&b, (size_t)n * n * 2));
	CK(cudaMalloc(&c, (size_t)n * n * 2));
	fill_random(a, (size_t)n * n, PKV_DTYPE_BF16);
	fill_random(b, (size_t)n * n, PKV_DTYPE_BF16);
	if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
		fprintf(stderr, "bench: cublasCreate failed\n");
		exit(1);
	}
	CK(cudaEventCreate(&t.a));
	CK(cudaEventCreate(&t.b));
	for (i = 0; i < 3 + reps; i++) {
		CK(cudaEventRecord(t.a, 0));
		if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &zero,
				 c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
			fprintf(stderr, "bench: cublasGemmEx failed\n");
			exit(1);
		}
		CK(cudaEventRecord(t.b, 0));
		if (i >= 3)
			ms[i - 3] = elapsed_ms(&t);
	}
	CK(cudaDeviceSynchronize());
	cublasDestroy(h);
	CK(cudaFree(a));
	CK(cudaFree(b));
	CK(cudaFree(c));
	return 2.0 * n * n * (double)n / (median(ms, reps) * 1e-3) / 1e12;
}

/* Device-side batch: one cache region, shuffled block tables, packed Q. */
struct dev_batch {
	struct pkv_cuda_attn_args a;
	int32_t *d_meta;
	void *q;
	float *o, *part, *lse;
	void *cache;          /* [layers][K | V] */
	size_t layer_bytes;   /* K + V of one layer */
	int layers;
	int shape;
};

static void batch_setup(struct dev_batch *db, int num_sms, int shape, int nseq, int sq, int sk, int H, int HKV,
			int D, int bs, size_t rotate_bytes)
{
	const int nb_seq = (sk + bs - 1) / bs, nblocks = nseq * nb_seq;
	const size_t token = (size_t)HKV * D * 2, half = (size_t)nblocks * bs * token;
	int32_t *meta = malloc(sizeof(int32_t) * (2 * (size_t)(nseq + 1) + (size_t)nblocks));
	int *perm = malloc(sizeof(int) * (size_t)nblocks);
	int i, s;

	memset(db, 0, sizeof(*db));
	db->shape = shape;
	db->layer_bytes = 2 * half;
	db->layers = (int)(rotate_bytes / db->layer_bytes) + 1;
	if (db->layers > 32)
		db->layers = 32;
	CK(cudaMalloc(&db->cache, db->layer_bytes * db->layers));
	fill_random(db->cache, db->layer_bytes * db->layers / 2, PKV_DTYPE_BF16);
	for (s = 0; s <= nseq; s++) {
		meta[s] = s * sq;
		meta[nseq + 1 + s] = s * sk;
	}
	for (i = 0; i < nblocks; i++)
		perm[i] = i;
	for (i = nblocks - 1; i > 0; i--) {
		rnd_f(); /* advances rs */
		const int j = (int)(rs % (uint64_t)(i + 1)), t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	memcpy(meta + 2 * (nseq + 1), perm, sizeof(int32_t) * (size_t)nblocks);
	CK(cudaMalloc((void **)&db->d_meta, sizeof(int32_t) * (2 * (size_t)(nseq + 1) + (size_t)nblocks)));
	CK(cudaMemcpy(db->d_meta, meta, sizeof(int32_t) * (2 * (size_t)(nseq + 1) + (size_t)nblocks),
		      cudaMemcpyHostToDevice));
	free(meta);
	free(perm);
	const size_t nq = (size_t)nseq * sq * H * D;
	CK(cudaMalloc(&db->q, nq * 2));
	fill_random(db->q, nq, PKV_DTYPE_BF16);
	CK(cudaMalloc((void **)&db->o, nq * 4));
	const char *forced = getenv("PKV_CUDA_SPLITS");
	const int splits = pkv_cuda_choose_splits(num_sms, shape, forced ? atoi(forced) : 0, nseq, HKV, H / HKV, sq,
						  sk, nseq * sq, H, D);
	if (splits > 1) {
		CK(cudaMalloc((void **)&db->part, nq * 4 * (size_t)splits));
		CK(cudaMalloc((void **)&db->lse, (size_t)nseq * sq * H * 4 * (size_t)splits));
	}
	struct pkv_cuda_attn_args a = {
		.q = db->q,
		.block_stride = (int64_t)bs * (int64_t)token,
		.token_stride = (int64_t)token,
		.cu_seq_lens_q = db->d_meta,
		.cu_seq_lens_k = db->d_meta + nseq + 1,
		.block_tables = db->d_meta + 2 * (nseq + 1),
		.max_blocks_per_seq = nb_seq,
		.block_size = bs,
		.num_seqs = nseq,
		.total_q = nseq * sq,
		.max_length_q = sq,
		.max_length_k = sk,
		.num_heads = H,
		.num_kv_heads = HKV,
		.head_dim = D,
		.cache_dtype = PKV_DTYPE_BF16,
		.scale = 1.f / sqrtf((float)D),
		.softcap = 0.f,
		.window_left = -1,
		.num_splits = splits,
		.o = db->o,
		.o_part = db->part,
		.lse_part = db->lse,
	};
	db->a = a;
}

static void batch_run(struct dev_batch *db, int layer)
{
	db->a.k_cache = (char *)db->cache + (size_t)layer * db->layer_bytes;
	db->a.v_cache = (char *)db->a.k_cache + db->layer_bytes / 2;
	CK((cudaError_t)pkv_cuda_attention(&db->a, db->shape, NULL));
	if (db->a.num_splits > 1)
		CK((cudaError_t)pkv_cuda_merge_splits(&db->a, NULL));
}

static float batch_time_ms(struct dev_batch *db, int reps)
{
	struct timer t;
	float ms[64];
	int i;

	CK(cudaEventCreate(&t.a));
	CK(cudaEventCreate(&t.b));
	for (i = 0; i < 3; i++)
		batch_run(db, i % db->layers);
	CK(cudaDeviceSynchronize());
	for (i = 0; i < reps; i++) {
		CK(cudaEventRecord(t.a, 0));
		batch_run(db, i % db->layers);
		CK(cudaEventRecord(t.b, 0));
		ms[i] = elapsed_ms(&t);
	}
	CK(cudaEventDestroy(t.a));
	CK(cudaEventDestroy(t.b));
	return median(ms, reps);
}

static void batch_free(struct dev_batch *db)
{
	cudaFree(db->cache);
	cudaFree(db->d_meta);
	cudaFree(db->q);
	cudaFree(db->o);
	cudaFree(db->part);
	cudaFree(db->lse);
}

int main(int argc, char **argv)
{
	const int quick = argc > 1 && !strcmp(argv[1], "--quick");
	const int reps = quick ? 5 : 15;
	const int batches[] = { 1, 16, 64 }, ctxs[] = { 2048, 8192, 32768 };
	struct cudaDeviceProp prop;
	double dec_gbs[3][3] = { { 0 } }, dec_ms[3][3] = { { 0 } };
	int best_v[3][3] = { { 0 } };
	int dev = 0, bi, ci;

	if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
		fprintf(stderr, "bench: no CUDA device\n");
		return 77;
	}
	printf("device: %s, %d SMs, L2 %d MiB, cc %d.%d\n", prop.name, prop.multiProcessorCount,
	       prop.l2CacheSize >> 20, prop.major, prop.minor);
	const double copy = copy_gbs(reps);
	printf("copy d2d: %.0f GB/s (read + write)\n", copy);
	const double gemm = gemm_tflops(reps);
	printf("cublas bf16 gemm 8192^3: %.0f TFLOP/s\n", gemm);

	for (bi = 0; bi < 3; bi++) {
		for (ci = 0; ci < 3; ci++) {
			struct dev_batch db;
			const int B = batches[bi], ctx = ctxs[ci];
			batch_setup(&db, prop.multiProcessorCount, PKV_CUDA_SHAPE_DECODE, B, 1, ctx, 32, 8, 128, 16,
				    (size_t)4 * prop.l2CacheSize);
			const double bytes = (double)B * ctx * 8 * 128 * 2 * 2;
			/* Both decode pipelines (4 stages / 3 stages); the table keeps the better, the log both. */
			for (int v = 1; v <= 2; v++) {
				db.a.variant = v;
				const float ms = batch_time_ms(&db, reps);
				const double gbs = bytes / (ms * 1e-3) / 1e9;
				printf("decode batch %2d ctx %5d variant %d: %.3f ms, %.0f GB/s (%.0f%% of copy), splits %d\n",
				       B, ctx, v, ms, gbs, 100.0 * gbs / copy, db.a.num_splits);
				if (gbs > dec_gbs[bi][ci]) {
					dec_gbs[bi][ci] = gbs;
					dec_ms[bi][ci] = ms;
					best_v[bi][ci] = v; /* best variant */
				}
			}
			batch_free(&db);
		}
	}

	/* Prefill, both varlen tile variants (16-row tiles per warp: 1 = 64-row CTAs, 2 = 128-row CTAs). */
	struct dev_batch pf;
	double ptf_v[3] = { 0, 0, 0 };
	const double flops = 4.0 * 4 * 2048.0 * 2048.0 / 2 * 128 * 32;
	batch_setup(&pf, prop.multiProcessorCount, PKV_CUDA_SHAPE_VARLEN, 4, 2048, 2048, 32, 8, 128, 16, 0);
	for (int wm = 1; wm <= 2; wm++) {
		pf.a.variant = wm;
		const float pms = batch_time_ms(&pf, reps);
		ptf_v[wm] = flops / (pms * 1e-3) / 1e12;
		printf("prefill 4 x 2048 causal, %d-row CTAs: %.3f ms, %.0f TFLOP/s (%.0f%% of gemm), splits %d\n",
		       64 * wm, pms, ptf_v[wm], 100.0 * ptf_v[wm] / gemm, pf.a.num_splits);
	}
	batch_free(&pf);
	const double ptf = ptf_v[1] > ptf_v[2] ? ptf_v[1] : ptf_v[2];

	printf("\n== summary (%s; medians of %d) ==\n", prop.name, reps);
	printf("ceilings: copy %.0f GB/s, bf16 gemm %.0f TFLOP/s\n", copy, gemm);
	printf("decode GB/s (%% of copy) [best variant]   ctx 2048          8192         32768\n");
	for (bi = 0; bi < 3; bi++)
		printf("  batch %2d            %6.0f (%2.0f%%) [%d] %6.0f (%2.0f%%) [%d] %6.0f (%2.0f%%) [%d]\n", batches[bi],
		       dec_gbs[bi][0], 100 * dec_gbs[bi][0] / copy, best_v[bi][0], dec_gbs[bi][1],
		       100 * dec_gbs[bi][1] / copy, best_v[bi][1], dec_gbs[bi][2], 100 * dec_gbs[bi][2] / copy,
		       best_v[bi][2]);
	printf("prefill 4x2048 causal hd128: %.0f TFLOP/s (%.0f%% of gemm; target 300); 64-row CTAs %.0f, 128-row %.0f%s\n",
	       ptf, 100 * ptf / gemm, ptf_v[1], ptf_v[2],
	       ptf_v[1] > ptf_v[2] ? " <- set the default in varlen_wm()" : "");
	(void)dec_ms;
	(void)best_v;
	return 0;
}
