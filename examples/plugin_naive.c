/* SPDX-License-Identifier: MIT */
/* The smallest correct attention backend: f32 only, plain loops; it passes pkv-conformance (make check). */
/*
 * Build it outside the tree with
 *     cc -O2 -shared -fPIC -o pkv_naive.so plugin_naive.c -lm
 * and check it with `pkv-conformance ./pkv_naive.so` (man pkv-conformance).
 * Everything here is required by DESIGN §3-§4 except the window, soft-cap
 * and log-sum-exp support (caps.features) and copy_blocks, which the daemon
 * needs only once sequences fork.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <pagedkv/backend.h>

/* One context per init: this backend needs nothing but the host's services, which it never uses. */
static int naive_init(const struct pkv_host_api *host, const struct pkv_dict *options, void **ctx)
{
	(void)host;
	(void)options;
	*ctx = NULL;
	return 0;
}

static void naive_fini(void *ctx)
{
	(void)ctx;
}

/* The cache: K then V, each [layer][block][token][kv_head][head_dim] of f32 (backend.h's layout). */
static int naive_cache_alloc(void *ctx, const struct pkv_pool_desc *pool, struct pkv_cache_mem *mem)
{
	const struct pkv_geometry *g = &pool->geo;
	size_t tok = (size_t)g->num_kv_heads * g->head_dim * sizeof(float), layer;
	char *p;

	(void)ctx;
	/* Sizes come from the pool description: a product that wraps must not allocate a short cache. */
	if (__builtin_mul_overflow(tok, (size_t)g->block_size, &layer) ||
	    __builtin_mul_overflow(layer, (size_t)g->num_blocks, &layer))
		return -EOVERFLOW;
	p = calloc(2 * (size_t)g->num_layers, layer);
	if (!p)
		return -ENOMEM;
	mem->domain = PKV_DOMAIN_HOST;
	mem->geo = *g;
	mem->k_base = p;
	mem->v_base = p + layer * g->num_layers;
	mem->layer_stride = layer;
	mem->block_stride = tok * g->block_size;
	mem->token_stride = tok;
	mem->bytes = 2 * layer * g->num_layers;
	return 0;
}

static void naive_cache_free(void *ctx, struct pkv_cache_mem *mem)
{
	(void)ctx;
	free(mem->k_base);
}

/* Row (layer, slot, kv head) of the K or V region. */
static float *row(const struct pkv_cache_mem *m, void *base, uint32_t layer, int64_t slot, uint32_t kh)
{
	return (float *)((char *)base + layer * m->layer_stride + (size_t)slot * m->token_stride) +
	       (size_t)kh * m->geo.head_dim;
}

/* One query row of one head: softmax(q.K * scale) V over keys lo..hi, in double; *lse its log-sum-exp. */
static void attend_row(const struct pkv_cache_mem *m, const struct pkv_attn_batch *b, uint32_t s,
		       const float *q, uint32_t kh, int32_t lo, int32_t hi, float *o, float *lse)
{
	uint32_t D = m->geo.head_dim, bs = m->geo.block_size, x;
	double scale = b->scale > 0 ? b->scale : 1.0 / sqrt((double)D), mx = -INFINITY, sum = 0, acc[512] = { 0 };
	int32_t j;

	for (int pass = 0; pass < 2; pass++)
		for (j = lo; j <= hi; j++) {
			int64_t slot = (int64_t)b->block_tables[(size_t)s * b->max_blocks_per_seq + j / bs] * bs + j % bs;
			const float *k = row(m, m->k_base, b->layer, slot, kh), *v = row(m, m->v_base, b->layer, slot, kh);
			double dot = 0, p;

			for (x = 0; x < D; x++)
				dot += (double)q[x] * k[x];
			dot *= scale;
			if (b->softcap > 0)
				dot = b->softcap * tanh(dot / b->softcap);
			if (pass == 0) { /* first pass: the maximum, for a stable exp */
				mx = dot > mx ? dot : mx;
				continue;
			}
			p = exp(dot - mx);
			sum += p;
			for (x = 0; x < D; x++)
				acc[x] += p * v[x];
		}
	for (x = 0; x < D; x++)
		o[x] = hi >= lo ? (float)(acc[x] / sum) : 0.0f; /* a query that sees no key gives 0 */
	*lse = hi >= lo ? (float)(mx + log(sum)) : -INFINITY;
}

/* Both paths: write the new K/V into their slots, then attend (DESIGN §3). */
static int naive_attend(void *ctx, const struct pkv_cache_mem *m, const struct pkv_attn_batch *b)
{
	const struct pkv_geometry *g = &m->geo;
	uint32_t kh, h, s, r, group = g->num_heads / g->num_kv_heads;
	int64_t nslots = (int64_t)g->num_blocks * g->block_size;
	/* Appended to the batch after version 1: read only when the host's struct has it. */
	float *lse = PKV_ABI_HAS(b, struct pkv_attn_batch, softmax_lse) ? b->softmax_lse : NULL, unused;

	(void)ctx;
	if (b->act_dtype != PKV_DTYPE_F32 || g->cache_dtype != PKV_DTYPE_F32 || g->head_dim > 512)
		return -EINVAL;
	for (r = 0; r < b->total_q; r++) {
		int64_t slot = b->slot_mapping[r];

		if (slot >= nslots)
			return -EINVAL; /* the host checked; a backend still never writes out of bounds */
		for (kh = 0; slot >= 0 && kh < g->num_kv_heads; kh++) {
			memcpy(row(m, m->k_base, b->layer, slot, kh),
			       (const float *)b->k_new + r * b->kv_stride_tok + kh * b->kv_stride_head, g->head_dim * 4);
			memcpy(row(m, m->v_base, b->layer, slot, kh),
			       (const float *)b->v_new + r * b->kv_stride_tok + kh * b->kv_stride_head, g->head_dim * 4);
		}
	}
	for (s = 0; s < b->num_seqs; s++) {
		int32_t q0 = b->cu_seq_lens_q[s], sq = b->cu_seq_lens_q[s + 1] - q0;
		int32_t sk = b->cu_seq_lens_k[s + 1] - b->cu_seq_lens_k[s], i, j;

		for (j = 0; j < sk; j += (int32_t)g->block_size) {
			int32_t blk = b->block_tables[(size_t)s * b->max_blocks_per_seq + j / g->block_size];

			if (blk < 0 || (uint32_t)blk >= g->num_blocks)
				return -EINVAL;
		}
		for (i = 0; i < sq; i++) {
			int32_t hi = i + (sk - sq), lo = b->window_left >= 0 ? hi - b->window_left : 0;

			if (hi >= sk)
				hi = sk - 1;
			for (h = 0; h < g->num_heads; h++)
				attend_row(m, b, s, (const float *)b->q + (q0 + i) * b->q_stride_tok + h * b->q_stride_head,
					   h / group, lo < 0 ? 0 : lo, hi,
					   (float *)b->o + (q0 + i) * b->o_stride_tok + h * b->o_stride_head,
					   lse ? lse + (size_t)(q0 + i) * g->num_heads + h : &unused);
		}
	}
	return 0;
}

/* Copy-on-write of shared blocks (the daemon needs it once sequences fork): every layer, K and V. */
static int naive_copy_blocks(void *ctx, const struct pkv_cache_mem *m, const struct pkv_block_copy *c, uint32_t n)
{
	uint32_t i, l;

	(void)ctx;
	for (i = 0; i < n; i++) {
		if (c[i].src < 0 || c[i].dst < 0 || (uint32_t)c[i].src >= m->geo.num_blocks ||
		    (uint32_t)c[i].dst >= m->geo.num_blocks)
			return -EINVAL;
		for (l = 0; l < m->geo.num_layers; l++) {
			size_t src = l * m->layer_stride + c[i].src * m->block_stride;
			size_t dst = l * m->layer_stride + c[i].dst * m->block_stride;

			memcpy((char *)m->k_base + dst, (char *)m->k_base + src, m->block_stride);
			memcpy((char *)m->v_base + dst, (char *)m->v_base + src, m->block_stride);
		}
	}
	return 0;
}

/* The optional features it has (tests/daemon builds it once more without the window). */
#ifndef NAIVE_FEATURES
#define NAIVE_FEATURES (PKV_FEAT_WINDOW | PKV_FEAT_SOFTCAP | PKV_FEAT_LSE | PKV_FEAT_COPY_VIEW)
#endif

static const struct pkv_backend_caps naive_caps = {
	.abi_version = PKV_BACKEND_ABI_VERSION,
	.struct_size = sizeof(struct pkv_backend_caps),
	.paths = PKV_PATH_VARLEN | PKV_PATH_DECODE,
	.domain = PKV_DOMAIN_HOST,
	.cache_dtypes = PKV_DTYPE_BIT(PKV_DTYPE_F32),
	.act_dtypes = PKV_DTYPE_BIT(PKV_DTYPE_F32),
	.head_dim_min = 1, .head_dim_max = 512, .head_dim_multiple = 1,
	.block_size_min = 1, .block_size_max = 1u << 16, .block_size_multiple = 1,
	.features = NAIVE_FEATURES,
};

static const struct pkv_backend naive = {
	.abi_version = PKV_BACKEND_ABI_VERSION,
	.struct_size = sizeof(struct pkv_backend),
	.name = "naive",
	.description = "f32 reference loops: the smallest correct backend (examples/plugin_naive.c)",
	.caps = &naive_caps,
	.options = NULL, /* takes none */
	.init = naive_init,
	.fini = naive_fini,
	.cache_alloc = naive_cache_alloc,
	.cache_free = naive_cache_free,
	.attend_varlen = naive_attend,
	.attend_decode = naive_attend,
	.copy_blocks = naive_copy_blocks,
};

/* The one symbol a backend library exports: its backends, one per index, then -ENOENT. */
PKV_BACKEND_EXPORT int pkv_backend_enum(uint32_t index, const struct pkv_backend **out);
PKV_BACKEND_EXPORT int pkv_backend_enum(uint32_t index, const struct pkv_backend **out)
{
	if (index)
		return -ENOENT;
	*out = &naive;
	return 0;
}
