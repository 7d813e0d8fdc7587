/* SPDX-License-Identifier: MIT */
/* Instantiates the paged attention kernel for an f16 cache (every head-dim bound and both shapes). */
#include "attn_kernel.cuh"

cudaError_t pkv_attn_launch_f16(const pkv_cuda_attn_args &a, int shape, cudaStream_t stream)
{
	return pkv::launch_attn_shape<__half>(a, shape, stream);
}
