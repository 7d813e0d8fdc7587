/* SPDX-License-Identifier: MIT */
/* Instantiates the paged attention kernel for a bf16 cache (every head-dim bound and both shapes). */
#include "attn_kernel.cuh"

cudaError_t pkv_attn_launch_bf16(const pkv_cuda_attn_args &a, int shape, cudaStream_t stream)
{
	return pkv::launch_attn_shape<__nv_bfloat16>(a, shape, stream);
}
