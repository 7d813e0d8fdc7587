/* SPDX-License-Identifier: MIT */
/* A trivial f32 attention backend for the daemon tests: plain loops, the same math as the tests' reference. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <pagedkv/backend.h>

struct ctx {
	const struct pkv_host_api *host;
};

static int init(const struct pkv_host_api *host, const struct pkv_dict *options, void **out)
{
	struct ctx *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	c->host = host;
	*out = c;
	return 0;
}

static void fini(void *ctx)
{
	free(ctx);
}

static int cache_alloc(void *ctx, const struct pkv_pool_desc *pool, struct pkv_cache_mem *mem)
{
	const struct pkv_geometry *g = &pool->geo;
	size_t tok = (size_t)g->num_kv_heads * g->head_dim * sizeof(float);
	size_t layer = tok * g->block_size * g->num_blocks;

	(void)ctx;
	memset(mem, 0, sizeof(*mem));
	mem->abi_version = PKV_BACKEND_ABI_VERSION;
	mem->struct_size = sizeof(*mem);
	mem->domain = PKV_DOMAIN_HOST;
	mem->geo = *g;
	mem->k_base = calloc(g->num_layers, layer);
	mem->v_base = calloc(g->num_layers, layer);
	if (!mem->k_base || !mem->v_base) {
		free(mem->k_base);
		free(mem->v_base);
		return -ENOMEM;
	}
	mem->token_stride = tok;
	mem->block_stride = tok * g->block_size;
	mem->layer_stride = layer;
	mem->bytes = 2 * layer * g->num_layers;
	return 0;
}

static void cache_free(void *ctx, struct pkv_cache_mem *mem)
{
	(void)ctx;
	free(mem->k_base);
	free(mem->v_base);
	mem->k_base = mem->v_base = NULL;
}

static float *slot_ptr(const struct pkv_cache_mem *m, void *base, uint32_t layer, int64_t slot)
{
	return (float *)((char *)base + layer * m->layer_stride + (size_t)slot * m->token_stride);
}

static int attend(void *ctx, const struct pkv_cache_mem *m, const struct pkv_attn_batch *b)
{
	const struct pkv_geometry *g = &m->geo;
	uint32_t H = g->num_heads, KH = g->num_kv_heads, D = g->head_dim, bs = g->block_size;
	float scale = b->scale > 0 ? b->scale : 1.0f / sqrtf((float)D);
	float *sc;

	(void)ctx;
	for (uint32_t r = 0; r < b->total_q; r++) {
		if (b->slot_mapping[r] < 0)
			continue;
		for (uint32_t h = 0; h < KH; h++) {
			memcpy(slot_ptr(m, m->k_base, b->layer, b->slot_mapping[r]) + h * D,
			       (const float *)b->k_new + r * b->kv_stride_tok + h * b->kv_stride_head, D * 4);
			memcpy(slot_ptr(m, m->v_base, b->layer, b->slot_mapping[r]) + h * D,
			       (const float *)b->v_new + r * b->kv_stride_tok + h * b->kv_stride_head, D * 4);
		}
	}
	sc = malloc(sizeof(float) * (b->max_length_k + 1));
	if (!sc)
		return -ENOMEM;
	for (uint32_t s = 0; s < b->num_seqs; s++) {
		int32_t q0 = b->cu_seq_lens_q[s], sq = b->cu_seq_lens_q[s + 1] - q0;
		int32_t sk = b->cu_seq_lens_k[s + 1] - b->cu_seq_lens_k[s];

		for (int32_t i = 0; i < sq; i++)
			for (uint32_t h = 0; h < H; h++) {
				const float *q = (const float *)b->q + (q0 + i) * b->q_stride_tok + h * b->q_stride_head;
				float *o = (float *)b->o + (q0 + i) * b->o_stride_tok + h * b->o_stride_head;
				uint32_t kh = h / (H / KH);
				int32_t last = i + (sk - sq);
				float mx = -INFINITY, sum = 0;

				for (int32_t j = 0; j <= last; j++) {
					int32_t blk = b->block_tables[(size_t)s * b->max_blocks_per_seq + j / bs];
					const float *k = slot_ptr(m, m->k_base, b->layer, (int64_t)blk * bs + j % bs) + kh * D;
					float dot = 0;

					for (uint32_t x = 0; x < D; x++)
						dot += q[x] * k[x];
					sc[j] = dot * scale;
					mx = sc[j] > mx ? sc[j] : mx;
				}
				for (int32_t j = 0; j <= last; j++) {
					sc[j] = expf(sc[j] - mx);
					sum += sc[j];
				}
				for (uint32_t x = 0; x < D; x++)
					o[x] = 0;
				for (int32_t j = 0; j <= last; j++) {
					int32_t blk = b->block_tables[(size_t)s * b->max_blocks_per_seq + j / bs];
					const float *v = slot_ptr(m, m->v_base, b->layer, (int64_t)blk * bs + j % bs) + kh * D;

					for (uint32_t x = 0; x < D; x++)
						o[x] += sc[j] / sum * v[x];
				}
			}
	}
	free(sc);
	return 0;
}

static int copy_blocks(void *ctx, const struct pkv_cache_mem *m, const struct pkv_block_copy *c, uint32_t n)
{
	(void)ctx;
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < m->geo.num_layers; l++) {
			memcpy((char *)m->k_base + l * m->layer_stride + c[i].dst * m->block_stride,
			       (char *)m->k_base + l * m->layer_stride + c[i].src * m->block_stride, m->block_stride);
			memcpy((char *)m->v_base + l * m->layer_stride + c[i].dst * m->block_stride,
			       (char *)m->v_base + l * m->layer_stride + c[i].src * m->block_stride, m->block_stride);
		}
	return 0;
}

static int sync_(void *ctx)
{
	(void)ctx;
	return 0;
}

static const struct pkv_backend_caps naive_caps = {
	.abi_version = PKV_BACKEND_ABI_VERSION,
	.struct_size = sizeof(struct pkv_backend_caps),
	.paths = PKV_PATH_VARLEN | PKV_PATH_DECODE,
	.domain = PKV_DOMAIN_HOST,
	.cache_dtypes = PKV_DTYPE_BIT(PKV_DTYPE_F32),
	.act_dtypes = PKV_DTYPE_BIT(PKV_DTYPE_F32),
	.head_dim_min = 1, .head_dim_max = 512, .head_dim_multiple = 1,
	.block_size_min = 1, .block_size_max = 1024, .block_size_multiple = 1,
};

static const struct pkv_backend naive = {
	.abi_version = PKV_BACKEND_ABI_VERSION,
	.struct_size = sizeof(struct pkv_backend),
	.name = "naive",
	.description = "f32 reference loops (daemon tests only)",
	.caps = &naive_caps,
	.init = init,
	.fini = fini,
	.cache_alloc = cache_alloc,
	.cache_free = cache_free,
	.attend_varlen = attend,
	.attend_decode = attend,
	.copy_blocks = copy_blocks,
	.sync = sync_,
};

int pkv_backend_enum(uint32_t index, const struct pkv_backend **out);

int pkv_backend_enum(uint32_t index, const struct pkv_backend **out)
{
	if (index)
		return -ENOENT;
	*out = &naive;
	return 0;
}
