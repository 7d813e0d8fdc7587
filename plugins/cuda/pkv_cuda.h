/* SPDX-License-Identifier: MIT */
/* The CUDA plugin's host side: context, cache memory, transfers, the attention driver and the split heuristic. */
#ifndef PKV_CUDA_PLUGIN_H
#define PKV_CUDA_PLUGIN_H

#include <stdint.h>
#include <pagedkv/backend.h>

/*
 * pkv_cuda.so offers two backends, "varlen" and "decode" (backends.c),
 * built from this code and differing only in the path they declare
 * (pagedkvd --backend-varlen cuda:varlen --backend-decode cuda:decode).
 * Cache memory of a pool is allocated by whichever of them the host makes
 * the domain owner (cudaMalloc through cache_alloc) and the pointers in
 * struct pkv_cache_mem are plain device pointers of the process's primary
 * CUDA context, which every libcudart user in the process shares, so the
 * other backend reads and writes the same blocks. Each call finishes with
 * its stream synchronised (its output is in host memory when it returns),
 * so work of the two never overlaps and needs no cross-stream ordering.
 */

/* Caps for one path (PKV_PATH_VARLEN or PKV_PATH_DECODE). */
#define PKV_CUDA_CAPS(path_bits) {                                                      \
	.abi_version = PKV_BACKEND_ABI_VERSION,                                          \
	.struct_size = sizeof(struct pkv_backend_caps),                                  \
	.paths = (path_bits),                                                            \
	.domain = PKV_DOMAIN_CUDA,                                                       \
	.cache_dtypes = PKV_DTYPE_BIT(PKV_DTYPE_F16) | PKV_DTYPE_BIT(PKV_DTYPE_BF16),    \
	.act_dtypes = PKV_DTYPE_BIT(PKV_DTYPE_F32) | PKV_DTYPE_BIT(PKV_DTYPE_F16) |      \
		      PKV_DTYPE_BIT(PKV_DTYPE_BF16),                                     \
	.head_dim_min = 16, .head_dim_max = 256, .head_dim_multiple = 16,                \
	.block_size_min = 1, .block_size_max = 1u << 16, .block_size_multiple = 1,       \
	.max_gqa_ratio = 0,                                                              \
	.features = PKV_FEAT_WINDOW | PKV_FEAT_SOFTCAP | PKV_FEAT_COPY_VIEW,             \
}

/*
 * KV splits for a batch (splits.c): enough CTAs to fill num_sms
 * multiprocessors, at least two key tiles per split, partials bounded to
 * 256 MiB. forced > 0 (the "splits" option, PKV_CUDA_SPLITS) replaces the
 * count the heuristic would pick, within the same bounds.
 */
int pkv_cuda_choose_splits(int num_sms, int shape, int forced, int32_t num_seqs, int32_t num_kv_heads,
			   int32_t group, int32_t max_q, int32_t max_k, int32_t total_q, int32_t num_heads,
			   int32_t head_dim);

/* Options both CUDA backends take. */
extern const struct pkv_option pkv_cuda_options[];

int pkv_cuda_be_init(const struct pkv_host_api *host, const struct pkv_dict *options, void **ctx);
void pkv_cuda_be_fini(void *ctx);
int pkv_cuda_be_cache_alloc(void *ctx, const struct pkv_pool_desc *pool, struct pkv_cache_mem *mem);
void pkv_cuda_be_cache_free(void *ctx, struct pkv_cache_mem *mem);
int pkv_cuda_be_attend_varlen(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b);
int pkv_cuda_be_attend_decode(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b);
int pkv_cuda_be_copy_blocks(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_block_copy *copies,
			    uint32_t n);
int pkv_cuda_be_sync(void *ctx);
int pkv_cuda_be_register_host(void *ctx, void *ptr, size_t len);
int pkv_cuda_be_unregister_host(void *ctx, void *ptr);
int pkv_cuda_be_cache_read(void *ctx, const struct pkv_cache_mem *mem, uint32_t kv, size_t off, void *dst,
			   size_t len);

#endif
