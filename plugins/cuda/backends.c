/* SPDX-License-Identifier: MIT */
/* pkv_cuda.so's backends: "varlen" (batches with prefill, FlashAttention varlen semantics) and "decode" (one query per sequence, split-KV). */
#include <errno.h>
#include "pkv_cuda.h"

static const struct pkv_backend_caps varlen_caps = PKV_CUDA_CAPS(PKV_PATH_VARLEN);
static const struct pkv_backend_caps decode_caps = PKV_CUDA_CAPS(PKV_PATH_DECODE);

static const struct pkv_backend backends[] = {
	{
		.abi_version = PKV_BACKEND_ABI_VERSION,
		.struct_size = sizeof(struct pkv_backend),
		.name = "varlen",
		.description = "CUDA paged attention for batches with prefill: tensor-core tiles, GQA-packed rows",
		.caps = &varlen_caps,
		.options = pkv_cuda_options,
		.init = pkv_cuda_be_init,
		.fini = pkv_cuda_be_fini,
		.cache_alloc = pkv_cuda_be_cache_alloc,
		.cache_free = pkv_cuda_be_cache_free,
		.attend_varlen = pkv_cuda_be_attend_varlen,
		.copy_blocks = pkv_cuda_be_copy_blocks,
		.sync = pkv_cuda_be_sync,
		.register_host = pkv_cuda_be_register_host,
		.unregister_host = pkv_cuda_be_unregister_host,
		.cache_read = pkv_cuda_be_cache_read,
	},
	{
		.abi_version = PKV_BACKEND_ABI_VERSION,
		.struct_size = sizeof(struct pkv_backend),
		.name = "decode",
		.description = "CUDA paged attention for one query per sequence: split-KV over many multiprocessors",
		.caps = &decode_caps,
		.options = pkv_cuda_options,
		.init = pkv_cuda_be_init,
		.fini = pkv_cuda_be_fini,
		.cache_alloc = pkv_cuda_be_cache_alloc,
		.cache_free = pkv_cuda_be_cache_free,
		.attend_decode = pkv_cuda_be_attend_decode,
		.copy_blocks = pkv_cuda_be_copy_blocks,
		.sync = pkv_cuda_be_sync,
		.register_host = pkv_cuda_be_register_host,
		.unregister_host = pkv_cuda_be_unregister_host,
		.cache_read = pkv_cuda_be_cache_read,
	},
};

PKV_BACKEND_EXPORT int pkv_backend_enum(uint32_t index, const struct pkv_backend **out);

/* The library's one exported symbol (DESIGN §4): index 0 is varlen, 1 decode. */
int pkv_backend_enum(uint32_t index, const struct pkv_backend **out)
{
	if (!out)
		return -EINVAL;
	if (index >= sizeof(backends) / sizeof(backends[0]))
		return -ENOENT;
	*out = &backends[index];
	return 0;
}
