/* SPDX-License-Identifier: MIT */
/* A fake CUDA runtime and kernel launchers on the CPU, so the CUDA plugins' host code runs (and is tested) without a GPU. */

/*
 * Linked instead of libcudart and the .cu objects (tests/cuda/local.mk
 * builds it): "device" memory is host memory, copies are memcpy, streams do
 * nothing, one device with 132 multiprocessors and compute capability 9.0.
 * The attention launcher runs the real attn_kernel template on the CPU
 * emulation (cuda_emu.h); append, convert, merge and copy_blocks are
 * re-done here the way util.cu does them (one RNE rounding through f32).
 * What this checks is the plugin's host code (plugins/cuda/): validation,
 * metadata staging, strided copies, the shipped split heuristic (splits.c,
 * linked as is), dtype paths, cache ownership and cache_read. Only the
 * kernels' launch geometry (rows per CTA, keys per tile) is restated here,
 * from the same template constants util.cu reads.
 */
#define PKV_EMULATE 1
#include "attn_kernel.cuh"
#include "emu_launch.h"
#include "attn_precise.cuh"

#include <cstdlib>
#include <cstring>
#include <vector>

#include <pagedkv/types.h>

/*
 * The runtime's types, restated: cuda_runtime_api.h cannot be included next
 * to cuda_emu.h (both define float2). Values are those of CUDA's driver_types.h.
 */
typedef int cudaError_t;
typedef struct fake_stream *cudaStream_t;
enum cudaDeviceAttr {
	cudaDevAttrMultiProcessorCount = 16,
	cudaDevAttrComputeCapabilityMajor = 75,
	cudaDevAttrComputeCapabilityMinor = 76
};
enum cudaMemcpyKind { cudaMemcpyDefaultFake = 4 };
enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInvalidPitchValue = 12
};

using namespace pkv;

extern "C" {

const char *cudaGetErrorName(cudaError_t e)
{
	return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake";
}

const char *cudaGetErrorString(cudaError_t e)
{
	return e == cudaSuccess ? "no error" : "fake CUDA runtime error";
}

cudaError_t cudaGetLastError(void)
{
	return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n)
{
	*n = getenv("PKV_FAKE_NO_GPU") ? 0 : 1;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int)
{
	return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int)
{
	switch (attr) {
	case cudaDevAttrMultiProcessorCount: *v = 132; break;
	case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
	case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
	default: *v = 0;
	}
	return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int)
{
	*s = static_cast<cudaStream_t>(malloc(1));
	return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	free(s);
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t)
{
	return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
	/* Poisoned: code that reads scratch it never wrote shows up as NaN. */
	*p = malloc(n ? n : 1);
	if (!*p)
		return cudaErrorMemoryAllocation;
	memset(*p, 0xff, n);
	return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
	free(p);
	return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
	return cudaMalloc(p, n);
}

cudaError_t cudaFreeHost(void *p)
{
	free(p);
	return cudaSuccess;
}

cudaError_t cudaHostRegister(void *, size_t, unsigned int)
{
	return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *)
{
	return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t)
{
	memset(p, v, n);
	return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind, cudaStream_t)
{
	memcpy(d, s, n);
	return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, enum cudaMemcpyKind,
			      cudaStream_t)
{
	if (dp < w || sp < w)
		return cudaErrorInvalidPitchValue;
	for (size_t i = 0; i < h; i++)
		memcpy(static_cast<char *>(d) + i * dp, static_cast<const char *>(s) + i * sp, w);
	return cudaSuccess;
}

} /* extern "C" */

namespace {

float ld(const void *p, size_t i, int dt)
{
	if (dt == PKV_DTYPE_F32)
		return static_cast<const float *>(p)[i];
	const uint16_t b = static_cast<const uint16_t *>(p)[i];
	return dt == PKV_DTYPE_F16 ? emu_h2f(b) : emu_bf2f(b);
}

void st(void *p, size_t i, int dt, float v)
{
	if (dt == PKV_DTYPE_F32)
		static_cast<float *>(p)[i] = v;
	else
		static_cast<uint16_t *>(p)[i] = dt == PKV_DTYPE_F16 ? emu_f2h(v) : emu_f2bf(v);
}

template <typename T>
void run(const pkv_cuda_attn_args &a, int shape)
{
	const int D = a.head_dim;
	const int v = a.variant == 1 || a.variant == 2 ? a.variant : 0;
	if (shape == PKV_CUDA_SHAPE_DECODE) {
		if ((v ? v : decode_variant()) == 2) {
			if (D <= 64)
				emu_launch<T, 64, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES_ALT>(a);
			else if (D <= 128)
				emu_launch<T, 128, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES_ALT>(a);
			else
				emu_launch<T, 256, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES_ALT>(a);
		} else if (D <= 64) {
			emu_launch<T, 64, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES>(a);
		} else if (D <= 128) {
			emu_launch<T, 128, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES>(a);
		} else {
			emu_launch<T, 256, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES>(a);
		}
		return;
	}
	if (D > 128)
		emu_launch<T, 256, PKV_VARLEN_WARPS, 1, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a);
	else if ((v ? v : varlen_wm(D)) == 2)
		D <= 64 ? emu_launch<T, 64, PKV_VARLEN_WARPS, 2, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a)
			: emu_launch<T, 128, PKV_VARLEN_WARPS, 2, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a);
	else
		D <= 64 ? emu_launch<T, 64, PKV_VARLEN_WARPS, 1, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a)
			: emu_launch<T, 128, PKV_VARLEN_WARPS, 1, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a);
}

} /* namespace */

extern "C" {

int pkv_cuda_head_dim_ok(int head_dim)
{
	return head_dim >= 16 && head_dim <= 256 && head_dim % 16 == 0;
}

int pkv_cuda_rows_per_cta(int shape, int head_dim)
{
	if (shape == PKV_CUDA_SHAPE_DECODE)
		return 16 * PKV_DECODE_WARPS;
	return 16 * PKV_VARLEN_WARPS * varlen_wm(head_dim);
}

int pkv_cuda_keys_per_tile(int shape)
{
	return shape == PKV_CUDA_SHAPE_DECODE ? PKV_DECODE_BN : PKV_VARLEN_BN;
}

int pkv_cuda_attention(const struct pkv_cuda_attn_args *a, int shape, void *)
{
	if (!pkv_cuda_head_dim_ok(a->head_dim) || a->num_kv_heads <= 0 || a->num_heads % a->num_kv_heads)
		return cudaErrorInvalidValue;
	if (a->max_length_q == 0 || a->num_seqs == 0)
		return cudaSuccess;
	if (a->cache_dtype == PKV_DTYPE_F16)
		run<__half>(*a, shape);
	else if (a->cache_dtype == PKV_DTYPE_BF16)
		run<__nv_bfloat16>(*a, shape);
	else
		return cudaErrorInvalidValue;
	return cudaSuccess;
}

int pkv_cuda_attention_precise(const struct pkv_cuda_attn_args *a, void *)
{
	const int64_t items = (int64_t)a->total_q * a->num_heads;
	if (items == 0 || a->num_seqs == 0)
		return cudaSuccess;
	if (a->cache_dtype == PKV_DTYPE_F16)
		emu_launch_plain(attn_precise_kernel<__half>, *a, (unsigned)((items + 3) / 4), 4);
	else
		emu_launch_plain(attn_precise_kernel<__nv_bfloat16>, *a, (unsigned)((items + 3) / 4), 4);
	return cudaSuccess;
}

int pkv_cuda_merge_splits(const struct pkv_cuda_attn_args *a, void *)
{
	emu_merge(*a);
	return cudaSuccess;
}

int pkv_cuda_append_kv(const void *k_new, const void *v_new, int act_dtype, void *k_cache, void *v_cache,
		       int cache_dtype, int64_t block_stride, int64_t token_stride, int32_t block_size,
		       const int64_t *slot_mapping, int32_t rows, int32_t row_elems, void *)
{
	const size_t es = pkv_dtype_size((uint32_t)cache_dtype);
	for (int32_t r = 0; r < rows; r++) {
		const int64_t slot = slot_mapping[r];
		if (slot < 0)
			continue;
		const int64_t off = (slot / block_size) * block_stride + (slot % block_size) * token_stride;
		for (int32_t e = 0; e < row_elems; e++) {
			st(static_cast<char *>(k_cache) + off, (size_t)e, cache_dtype,
			   ld(k_new, (size_t)r * row_elems + e, act_dtype));
			st(static_cast<char *>(v_cache) + off, (size_t)e, cache_dtype,
			   ld(v_new, (size_t)r * row_elems + e, act_dtype));
		}
		(void)es;
	}
	return cudaSuccess;
}

int pkv_cuda_convert(const void *src, int src_dtype, void *dst, int dst_dtype, int64_t n, void *)
{
	for (int64_t i = 0; i < n; i++)
		st(dst, (size_t)i, dst_dtype, ld(src, (size_t)i, src_dtype));
	return cudaSuccess;
}

int pkv_cuda_copy_blocks(void *k_base, void *v_base, int64_t layer_stride, int32_t num_layers, int64_t block_stride,
			 const int32_t *pairs, int32_t n, void *)
{
	for (int32_t p = 0; p < n; p++)
		for (int32_t l = 0; l < num_layers; l++)
			for (int kv = 0; kv < 2; kv++) {
				char *base = static_cast<char *>(kv ? v_base : k_base) + l * layer_stride;
				memcpy(base + (int64_t)pairs[2 * p + 1] * block_stride, base + (int64_t)pairs[2 * p] * block_stride,
				       (size_t)block_stride);
			}
	return cudaSuccess;
}

} /* extern "C" */
