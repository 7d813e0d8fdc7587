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
	long level; /* the "level" option init got */
};

/*
 * LAYOUT_OLD and LAYOUT_NEW build this toy against its own copies of the
 * growable structs instead of backend.h's: an older, smaller version 1
 * (caps without features, the backend ending at unregister_host) and a
 * newer, larger one (a field and a method appended to each). The loader
 * must load both and run them (check_loader: abi_*).
 */
#if defined(LAYOUT_OLD) || defined(LAYOUT_NEW)
struct toy_caps_layout {
	uint32_t abi_version, struct_size, paths, domain, cache_dtypes, act_dtypes;
	uint32_t head_dim_min, head_dim_max, head_dim_multiple;
	uint32_t block_size_min, block_size_max, block_size_multiple;
	uint32_t max_gqa_ratio;
#ifdef LAYOUT_NEW
	uint32_t features;
	uint32_t from_the_future; /* a cap this host has never heard of */
#endif
};

struct toy_backend_layout {
	uint32_t abi_version, struct_size;
	const char *name, *description;
	const struct toy_caps_layout *caps;
	const struct pkv_option *options;
	int (*init)(const struct pkv_host_api *host, const struct pkv_dict *options, void **ctx);
	void (*fini)(void *ctx);
	int (*cache_alloc)(void *ctx, const struct pkv_pool_desc *pool, struct pkv_cache_mem *mem);
	void (*cache_free)(void *ctx, struct pkv_cache_mem *mem);
	int (*attend_varlen)(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b);
	int (*attend_decode)(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b);
	int (*copy_blocks)(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_block_copy *c, uint32_t n);
	int (*sync)(void *ctx);
	int (*register_host)(void *ctx, void *ptr, size_t len);
	int (*unregister_host)(void *ctx, void *ptr);
#ifdef LAYOUT_NEW
	int (*cache_read)(void *ctx, const struct pkv_cache_mem *mem, uint32_t kv, size_t off, void *dst, size_t len);
	int (*method_from_the_future)(void *ctx);
#endif
};
#define TOY_CAPS_T struct toy_caps_layout
#define TOY_BACKEND_T struct toy_backend_layout
#else
#define TOY_CAPS_T struct pkv_backend_caps
#define TOY_BACKEND_T struct pkv_backend
#endif

int pkv_backend_enum(uint32_t index, const struct pkv_backend **out);
int pkv_toy_counts(void *ctx, int *varlen, int *decode, int *copy);

__attribute__((unused)) static int toy_init(const struct pkv_host_api *host, const struct pkv_dict *options,
					    void **ctx)
{
	const char *level = pkv_dict_get(options, "level");
	struct toy *t;

#ifdef DEFECT_INIT_FAILS
	return -ENODEV;
#endif
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->host = host;
	t->level = strtol(level ? level : "7", NULL, 10);
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

/* Not part of the ABI either: the value of the "level" option init saw. */
__attribute__((visibility("default"))) long pkv_toy_level(void *ctx);
__attribute__((visibility("default"))) long pkv_toy_level(void *ctx)
{
	return ((struct toy *)ctx)->level;
}

#ifdef LAYOUT_NEW
static int toy_future(void *ctx)
{
	(void)ctx;
	return -EIO;
}
#endif

static const struct pkv_option toy_options[] = {
	{ .name = "level", .type = PKV_OPT_INT, .def = "7", .help = "a number init keeps" },
	{ .name = "loud", .type = PKV_OPT_BOOL, .def = "no", .help = "ignored" },
	{ .name = NULL },
};

static const TOY_CAPS_T toy_caps = {
	.abi_version = PKV_BACKEND_ABI_VERSION,
	.struct_size = sizeof(TOY_CAPS_T),
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
#ifdef LAYOUT_NEW
	.features = PKV_FEAT_WINDOW,
	.from_the_future = 0xdeadbeef,
#endif
};

static const TOY_BACKEND_T toy = {
#ifdef DEFECT_BAD_ABI
	.abi_version = 99,
#else
	.abi_version = PKV_BACKEND_ABI_VERSION,
#endif
#ifdef DEFECT_SMALL_STRUCT
	.struct_size = 16,
#else
	.struct_size = sizeof(TOY_BACKEND_T),
#endif
	.name = "toy",
	.description = "loader test backend",
	.caps = &toy_caps,
	.options = toy_options,
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
#ifdef LAYOUT_NEW
	.method_from_the_future = toy_future,
#endif
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
	*out = (const struct pkv_backend *)&toy;
	return 0;
}
