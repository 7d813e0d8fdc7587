/* SPDX-License-Identifier: MIT */
/* A toy backend compiled once per defect (-DDEFECT_*) so the loader tests can check each refusal. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <pagedkv/backend.h>

/* Counts calls so the dispatch tests can see which path ran. */
struct toy {
	const struct pkv_host_api *host;
	int varlen_calls, decode_calls, copy_calls;
};

int pkv_backend_enum(uint32_t index, const struct pkv_backend **out);
int pkv_toy_counts(void *ctx, int *varlen, int *decode, int *copy);

__attribute__((unused)) static int toy_init(const struct pkv_host_api *host, void **ctx)
{
	struct toy *t;

#ifdef DEFECT_INIT_FAILS
	return -ENODEV;
#endif
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->host = host;
	*ctx = t;
	return 0;
}

static void toy_fini(void *ctx)
{
	free(ctx);
}

static int toy_cache_alloc(void *ctx, const struct pkv_pool_desc *pool, struct pkv_cache_mem *mem)
{
	const struct pkv_geometry *g = &pool->geo;
	size_t tok = (size_t)g->num_kv_heads * g->head_dim * pkv_dtype_size(g->cache_dtype);
	size_t layer = tok * g->block_size * g->num_blocks;
	void *p = calloc(2, layer * g->num_layers);

	if (!p)
		return -ENOMEM;
	mem->domain = PKV_DOMAIN_HOST;
	mem->geo = *g;
	mem->k_base = p;
	mem->v_base = (char *)p + layer * g->num_layers;
	mem->layer_stride = layer;
	mem->block_stride = tok * g->block_size;
	mem->token_stride = tok;
	mem->bytes = 2 * layer * g->num_layers;
	mem->owner_priv = p;
	return 0;
}

static void toy_cache_free(void *ctx, struct pkv_cache_mem *mem)
{
	free(mem->owner_priv);
}

static int toy_varlen(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b)
{
	((struct toy *)ctx)->varlen_calls++;
	return 0;
}

__attribute__((unused)) static int toy_decode(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b)
{
	((struct toy *)ctx)->decode_calls++;
	return 0;
}

static int toy_copy(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_block_copy *c, uint32_t n)
{
	((struct toy *)ctx)->copy_calls++;
	return 0;
}

/* Not part of the ABI: the test finds it with dlsym to read the counters. */
__attribute__((visibility("default"))) int pkv_toy_counts(void *ctx, int *varlen, int *decode, int *copy)
{
	struct toy *t = ctx;

	*varlen = t->varlen_calls;
	*decode = t->decode_calls;
	*copy = t->copy_calls;
	return 0;
}

static const struct pkv_backend toy = {
#ifdef DEFECT_BAD_ABI
	.abi_version = 99,
#else
	.abi_version = PKV_BACKEND_ABI_VERSION,
#endif
#ifdef DEFECT_SMALL_STRUCT
	.struct_size = 16,
#else
	.struct_size = sizeof(struct pkv_backend),
#endif
	.name = "toy",
	.description = "loader test backend",
	.caps = {
		.abi_version = PKV_BACKEND_ABI_VERSION,
		.struct_size = sizeof(struct pkv_backend_caps),
		.paths = PKV_PATH_VARLEN | PKV_PATH_DECODE,
		.domain = PKV_DOMAIN_HOST,
#ifdef DEFECT_NARROW_CAPS
		/* Loads fine, but can serve only f32 caches of head_dim 32. */
		.cache_dtypes = PKV_DTYPE_BIT(PKV_DTYPE_F32),
		.head_dim_min = 32, .head_dim_max = 32, .head_dim_multiple = 32,
#else
		.cache_dtypes = 7,
		.head_dim_min = 8, .head_dim_max = 256, .head_dim_multiple = 8,
#endif
		.act_dtypes = 7,
		.block_size_min = 1, .block_size_max = 1024, .block_size_multiple = 1,
	},
#ifdef DEFECT_NULL_INIT
	.init = NULL,
#else
	.init = toy_init,
#endif
	.fini = toy_fini,
	.cache_alloc = toy_cache_alloc,
	.cache_free = toy_cache_free,
	.attend_varlen = toy_varlen,
#ifdef DEFECT_NO_DECODE_METHOD
	.attend_decode = NULL,
#else
	.attend_decode = toy_decode,
#endif
	.copy_blocks = toy_copy,
};

#ifdef DEFECT_NO_SYMBOL
/* Exports something, just not the entry point. */
__attribute__((visibility("default"))) int pkv_backend_enumerate(uint32_t index, const struct pkv_backend **out);
__attribute__((visibility("default"))) int pkv_backend_enumerate(uint32_t index, const struct pkv_backend **out)
#else
__attribute__((visibility("default"))) int pkv_backend_enum(uint32_t index, const struct pkv_backend **out)
#endif
{
	if (index > 0)
		return -ENOENT;
	*out = &toy;
	return 0;
}
