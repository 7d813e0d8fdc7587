/* SPDX-License-Identifier: MIT */
/* The small CUDA kernels around attention: K/V append, dtype conversion, split-KV merge, block copies; C entry points. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <pagedkv/types.h>
#include "attn_kernel.cuh"
#include "attn_precise.cuh"

namespace {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/*
 * Every conversion goes through f32, which holds f16 and bf16 exactly, so
 * each result is one round-to-nearest-even of the source value: the same bits
 * the CPU backend writes (the conformance suite checks the cache bit-exact).
 */
template <typename S, typename D>
__global__ void convert_kernel(const S *__restrict__ src, D *__restrict__ dst, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		dst[i] = from_f32<D>(to_f32(src[i]));
}

template <typename S, typename D>
__global__ void append_kernel(const S *__restrict__ k_new, const S *__restrict__ v_new,
			      char *k_cache, char *v_cache, int64_t block_stride, int64_t token_stride,
			      int32_t block_size, const int64_t *__restrict__ slots, int32_t rows, int32_t row_elems)
{
	const int64_t n = (int64_t)rows * row_elems;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		const int64_t r = i / row_elems;
		const int64_t e = i - r * row_elems;
		const int64_t slot = slots[r];
		if (slot < 0)
			continue;
		const int64_t off = (slot / block_size) * block_stride + (slot % block_size) * token_stride +
				    e * (int64_t)sizeof(D);
		*reinterpret_cast<D *>(k_cache + off) = from_f32<D>(to_f32(k_new[i]));
		*reinterpret_cast<D *>(v_cache + off) = from_f32<D>(to_f32(v_new[i]));
	}
}

/* One block per (query row, head): weights 2^(lse_s - max) over the splits. */
__global__ void merge_kernel(const pkv_cuda_attn_args a)
{
	const int64_t row = blockIdx.x;
	const int64_t nrows = (int64_t)a.total_q * a.num_heads;
	const int D = a.head_dim;
	float mx = -INFINITY;
	for (int sp = 0; sp < a.num_splits; ++sp)
		mx = fmaxf(mx, a.lse_part[sp * nrows + row]);
	for (int d = threadIdx.x; d < D; d += blockDim.x) {
		float acc = 0.f, wsum = 0.f;
		if (mx != -INFINITY) {
			for (int sp = 0; sp < a.num_splits; ++sp) {
				const float w = exp2f(a.lse_part[sp * nrows + row] - mx);
				wsum += w;
				acc += w * a.o_part[(sp * nrows + row) * D + d];
			}
		}
		a.o[row * D + d] = wsum > 0.f ? acc / wsum : 0.f;
	}
}

/* grid (pair, layer, K/V): each block copies one block's bytes in 16-byte words. */
__global__ void copy_blocks_kernel(char *k_base, char *v_base, int64_t layer_stride, int64_t block_stride,
				   const int32_t *__restrict__ pairs)
{
	const int p = blockIdx.x;
	char *base = (blockIdx.z == 0 ? k_base : v_base) + (int64_t)blockIdx.y * layer_stride;
	const uint4 *src = reinterpret_cast<const uint4 *>(base + (int64_t)pairs[2 * p] * block_stride);
	uint4 *dst = reinterpret_cast<uint4 *>(base + (int64_t)pairs[2 * p + 1] * block_stride);
	const int64_t words = block_stride / 16;
	for (int64_t i = threadIdx.x; i < words; i += blockDim.x)
		dst[i] = src[i];
}

unsigned grid_for(int64_t n)
{
	const int64_t b = (n + 255) / 256;
	return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

template <typename S, typename D>
cudaError_t convert_t(const void *src, void *dst, int64_t n, cudaStream_t st)
{
	convert_kernel<S, D><<<grid_for(n), 256, 0, st>>>(static_cast<const S *>(src), static_cast<D *>(dst), n);
	return cudaGetLastError();
}

template <typename S>
cudaError_t convert_from(const void *src, void *dst, int dst_dtype, int64_t n, cudaStream_t st)
{
	switch (dst_dtype) {
	case PKV_DTYPE_F32: return convert_t<S, float>(src, dst, n, st);
	case PKV_DTYPE_F16: return convert_t<S, __half>(src, dst, n, st);
	case PKV_DTYPE_BF16: return convert_t<S, __nv_bfloat16>(src, dst, n, st);
	}
	return cudaErrorInvalidValue;
}

template <typename S, typename D>
cudaError_t append_t(const void *k_new, const void *v_new, void *k_cache, void *v_cache, int64_t block_stride,
		     int64_t token_stride, int32_t block_size, const int64_t *slots, int32_t rows, int32_t row_elems,
		     cudaStream_t st)
{
	append_kernel<S, D><<<grid_for((int64_t)rows * row_elems), 256, 0, st>>>(
		static_cast<const S *>(k_new), static_cast<const S *>(v_new), static_cast<char *>(k_cache),
		static_cast<char *>(v_cache), block_stride, token_stride, block_size, slots, rows, row_elems);
	return cudaGetLastError();
}

template <typename S>
cudaError_t append_from(const void *k_new, const void *v_new, void *k_cache, void *v_cache, int cache_dtype,
			int64_t block_stride, int64_t token_stride, int32_t block_size, const int64_t *slots,
			int32_t rows, int32_t row_elems, cudaStream_t st)
{
	switch (cache_dtype) {
	case PKV_DTYPE_F32:
		return append_t<S, float>(k_new, v_new, k_cache, v_cache, block_stride, token_stride, block_size,
					  slots, rows, row_elems, st);
	case PKV_DTYPE_F16:
		return append_t<S, __half>(k_new, v_new, k_cache, v_cache, block_stride, token_stride, block_size,
					   slots, rows, row_elems, st);
	case PKV_DTYPE_BF16:
		return append_t<S, __nv_bfloat16>(k_new, v_new, k_cache, v_cache, block_stride, token_stride,
						  block_size, slots, rows, row_elems, st);
	}
	return cudaErrorInvalidValue;
}

} /* namespace */

extern "C" int pkv_cuda_head_dim_ok(int head_dim)
{
	return head_dim >= 16 && head_dim <= 256 && head_dim % 16 == 0;
}

extern "C" int pkv_cuda_rows_per_cta(int shape, int head_dim)
{
	if (shape == PKV_CUDA_SHAPE_DECODE)
		return 16 * PKV_DECODE_WARPS;
	return 16 * PKV_VARLEN_WARPS * pkv::varlen_wm(head_dim);
}

extern "C" int pkv_cuda_keys_per_tile(int shape)
{
	return shape == PKV_CUDA_SHAPE_DECODE ? PKV_DECODE_BN : PKV_VARLEN_BN;
}

extern "C" int pkv_cuda_attention(const struct pkv_cuda_attn_args *a, int shape, void *stream)
{
	cudaStream_t st = static_cast<cudaStream_t>(stream);
	if (!pkv_cuda_head_dim_ok(a->head_dim) || a->num_kv_heads <= 0 || a->num_heads % a->num_kv_heads)
		return cudaErrorInvalidValue;
	switch (a->cache_dtype) {
	case PKV_DTYPE_F16: return pkv_attn_launch_f16(*a, shape, st);
	case PKV_DTYPE_BF16: return pkv_attn_launch_bf16(*a, shape, st);
	}
	return cudaErrorInvalidValue;
}

extern "C" int pkv_cuda_attention_precise(const struct pkv_cuda_attn_args *a, void *stream)
{
	cudaStream_t st = static_cast<cudaStream_t>(stream);
	const int64_t items = (int64_t)a->total_q * a->num_heads;
	if (!pkv_cuda_head_dim_ok(a->head_dim) || a->num_kv_heads <= 0 || a->num_heads % a->num_kv_heads)
		return cudaErrorInvalidValue;
	if (items == 0 || a->num_seqs == 0)
		return cudaSuccess;
	if ((items + 3) / 4 > 0x7fffffff)
		return cudaErrorInvalidConfiguration;
	const unsigned blocks = (unsigned)((items + 3) / 4);
	switch (a->cache_dtype) {
	case PKV_DTYPE_F16:
		pkv::attn_precise_kernel<__half><<<blocks, 128, 0, st>>>(*a);
		return cudaGetLastError();
	case PKV_DTYPE_BF16:
		pkv::attn_precise_kernel<__nv_bfloat16><<<blocks, 128, 0, st>>>(*a);
		return cudaGetLastError();
	}
	return cudaErrorInvalidValue;
}

extern "C" int pkv_cuda_merge_splits(const struct pkv_cuda_attn_args *a, void *stream)
{
	const int64_t rows = (int64_t)a->total_q * a->num_heads;
	if (rows == 0)
		return cudaSuccess;
	if (rows > 0x7fffffff)
		return cudaErrorInvalidConfiguration;
	merge_kernel<<<(unsigned)rows, 128, 0, static_cast<cudaStream_t>(stream)>>>(*a);
	return cudaGetLastError();
}

extern "C" int pkv_cuda_append_kv(const void *k_new, const void *v_new, int act_dtype, void *k_cache,
				  void *v_cache, int cache_dtype, int64_t block_stride, int64_t token_stride,
				  int32_t block_size, const int64_t *slot_mapping, int32_t rows, int32_t row_elems,
				  void *stream)
{
	cudaStream_t st = static_cast<cudaStream_t>(stream);
	if (rows == 0)
		return cudaSuccess;
	switch (act_dtype) {
	case PKV_DTYPE_F32:
		return append_from<float>(k_new, v_new, k_cache, v_cache, cache_dtype, block_stride, token_stride,
					  block_size, slot_mapping, rows, row_elems, st);
	case PKV_DTYPE_F16:
		return append_from<__half>(k_new, v_new, k_cache, v_cache, cache_dtype, block_stride, token_stride,
					   block_size, slot_mapping, rows, row_elems, st);
	case PKV_DTYPE_BF16:
		return append_from<__nv_bfloat16>(k_new, v_new, k_cache, v_cache, cache_dtype, block_stride,
						  token_stride, block_size, slot_mapping, rows, row_elems, st);
	}
	return cudaErrorInvalidValue;
}

extern "C" int pkv_cuda_convert(const void *src, int src_dtype, void *dst, int dst_dtype, int64_t n, void *stream)
{
	cudaStream_t st = static_cast<cudaStream_t>(stream);
	if (n == 0)
		return cudaSuccess;
	switch (src_dtype) {
	case PKV_DTYPE_F32: return convert_from<float>(src, dst, dst_dtype, n, st);
	case PKV_DTYPE_F16: return convert_from<__half>(src, dst, dst_dtype, n, st);
	case PKV_DTYPE_BF16: return convert_from<__nv_bfloat16>(src, dst, dst_dtype, n, st);
	}
	return cudaErrorInvalidValue;
}

extern "C" int pkv_cuda_copy_blocks(void *k_base, void *v_base, int64_t layer_stride, int32_t num_layers,
				    int64_t block_stride, const int32_t *pairs, int32_t n, void *stream)
{
	if (n == 0 || num_layers == 0)
		return cudaSuccess;
	if (block_stride % 16 || num_layers > 65535)
		return cudaErrorInvalidValue;
	dim3 grid((unsigned)n, (unsigned)num_layers, 2);
	copy_blocks_kernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(
		static_cast<char *>(k_base), static_cast<char *>(v_base), layer_stride, block_stride, pairs);
	return cudaGetLastError();
}
