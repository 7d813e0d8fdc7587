/* SPDX-License-Identifier: MIT */
/* Host side shared by the two CUDA plugins: context, cache memory, transfers and the attention driver. */
#ifndef PKV_CUDA_BACKEND_H
#define PKV_CUDA_BACKEND_H

#include <pagedkv/backend.h>

/*
 * Both plugins (plugins/varlen, plugins/decode) are built from this code and
 * differ only in the path they declare. Cache memory of a pool is allocated
 * by whichever of them the host makes the domain owner (cudaMalloc through
 * cache_alloc) and the pointers in struct pkv_cache_mem are plain device
 * pointers of the process's primary CUDA context, which every libcudart
 * user in the process shares, so the other plugin reads and writes the same
 * blocks. Each call finishes with its stream synchronised (its output is in
 * host memory when it returns), so work of the two plugins never overlaps
 * and needs no cross-stream ordering.
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
	.features = PKV_FEAT_WINDOW | PKV_FEAT_SOFTCAP,                                  \
}

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
