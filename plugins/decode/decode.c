/* SPDX-License-Identifier: MIT */
/* The CUDA decode backend: one query per sequence, split-KV with a log-sum-exp merge, over the paged cache. */
#include <errno.h>
#include "cuda_backend.h"

static const struct pkv_backend_caps caps = PKV_CUDA_CAPS(PKV_PATH_DECODE);

static const struct pkv_backend cuda_decode = {
	.abi_version = PKV_BACKEND_ABI_VERSION,
	.struct_size = sizeof(struct pkv_backend),
	.name = "cuda_decode",
	.description = "CUDA paged attention for decode: GQA group per CTA, split-KV with LSE merge",
	.caps = &caps,
	.options = pkv_cuda_options,
	.init = pkv_cuda_be_init,
	.fini = pkv_cuda_be_fini,
	.cache_alloc = pkv_cuda_be_cache_alloc,
	.cache_free = pkv_cuda_be_cache_free,
	.attend_varlen = NULL,
	.attend_decode = pkv_cuda_be_attend_decode,
	.copy_blocks = pkv_cuda_be_copy_blocks,
	.sync = pkv_cuda_be_sync,
	.register_host = pkv_cuda_be_register_host,
	.unregister_host = pkv_cuda_be_unregister_host,
	.cache_read = pkv_cuda_be_cache_read,
};

PKV_BACKEND_EXPORT int pkv_backend_enum(uint32_t index, const struct pkv_backend **out);

/* The library's one exported symbol (DESIGN §4). */
int pkv_backend_enum(uint32_t index, const struct pkv_backend **out)
{
	if (!out)
		return -EINVAL;
	if (index != 0)
		return -ENOENT;
	*out = &cuda_decode;
	return 0;
}
