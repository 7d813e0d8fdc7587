/* SPDX-License-Identifier: MIT */
/* The f32 attention kernel for activations more precise than the cache (f32 with any cache, f16 with a bf16 cache). */
#ifndef PKV_ATTN_PRECISE_CUH
#define PKV_ATTN_PRECISE_CUH

#include "attn_kernel.cuh"

namespace pkv {

/*
 * Why a second kernel: the tensor-core kernel rounds Q and the softmax
 * probabilities to the cache dtype, which is exactly what a same-dtype
 * implementation does when activations and cache share a dtype. When the
 * activations are more precise (f32, or f16 over a bf16 cache) the rule
 * "within 2x of a naive implementation in the activation dtype" asks for
 * f32-grade products, which bf16/f16 MMA cannot give. This kernel keeps Q,
 * scores, probabilities and O in f32 (K/V are read from the cache and widened
 * exactly): one warp per (query row, head), lanes over the head dimension,
 * online softmax over the visible keys. Correct first; it is a slow path.
 */
template <typename TC>
__global__ void __launch_bounds__(128)
attn_precise_kernel(const pkv_cuda_attn_args a)
{
	constexpr int PER = 256 / 32; /* head-dim elements per lane at most */
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int64_t item = (int64_t)blockIdx.x * 4 + warp; /* row * num_heads + head */
	if (item >= (int64_t)a.total_q * a.num_heads)
		return;
	const int row = (int)(item / a.num_heads), h = (int)(item - (int64_t)row * a.num_heads);
	const int D = a.head_dim, G = a.num_heads / a.num_kv_heads, kvh = h / G;

	/* The sequence of this row: the last s with cu_seq_lens_q[s] <= row (binary search). */
	int lo_s = 0, hi_s = a.num_seqs - 1;
	while (lo_s < hi_s) {
		const int mid = (lo_s + hi_s + 1) >> 1;
		if (a.cu_seq_lens_q[mid] <= row)
			lo_s = mid;
		else
			hi_s = mid - 1;
	}
	const int s = lo_s;
	const int sq = a.cu_seq_lens_q[s + 1] - a.cu_seq_lens_q[s];
	const int sk = a.cu_seq_lens_k[s + 1] - a.cu_seq_lens_k[s];
	const int i = row - a.cu_seq_lens_q[s];
	const int hi = min(sk - 1, i + sk - sq);
	const int lo = a.window_left >= 0 ? max(0, i + sk - sq - a.window_left) : 0;

	const float *qp = static_cast<const float *>(a.q) + ((int64_t)row * a.num_heads + h) * D;
	float q[PER], o[PER];
#pragma unroll
	for (int t = 0; t < PER; ++t) {
		const int d = lane + 32 * t;
		q[t] = d < D ? qp[d] : 0.f;
		o[t] = 0.f;
	}
	const int32_t *bt = a.block_tables + (int64_t)s * a.max_blocks_per_seq;
	const char *kc = static_cast<const char *>(a.k_cache) + (int64_t)kvh * D * (int64_t)sizeof(TC);
	const char *vc = static_cast<const char *>(a.v_cache) + (int64_t)kvh * D * (int64_t)sizeof(TC);
	float m = -INFINITY, l = 0.f;

	for (int j = lo; j <= hi; ++j) {
		const int64_t off = (int64_t)__ldg(bt + j / a.block_size) * a.block_stride +
				    (int64_t)(j % a.block_size) * a.token_stride;
		const TC *kr = reinterpret_cast<const TC *>(kc + off);
		const TC *vr = reinterpret_cast<const TC *>(vc + off);
		float dot = 0.f;
#pragma unroll
		for (int t = 0; t < PER; ++t) {
			const int d = lane + 32 * t;
			if (d < D)
				dot = fmaf(q[t], to_float(kr[d]), dot);
		}
#pragma unroll
		for (int w = 16; w >= 1; w >>= 1)
			dot += __shfl_xor_sync(0xffffffffu, dot, w);
		float sc = dot * a.scale;
		if (a.softcap > 0.f)
			sc = a.softcap * tanhf(sc / a.softcap);
		const float mn = fmaxf(m, sc);
		const float corr = expf(m - mn); /* m = -inf on the first key: 0 */
		const float p = expf(sc - mn);
		l = l * corr + p;
#pragma unroll
		for (int t = 0; t < PER; ++t) {
			const int d = lane + 32 * t;
			if (d < D)
				o[t] = fmaf(p, to_float(vr[d]), o[t] * corr);
		}
		m = mn;
	}
	/* No visible key (l == 0): the row is written as 0. */
	const float inv = l > 0.f ? 1.f / l : 0.f;
	float *op = a.o + ((int64_t)row * a.num_heads + h) * D;
#pragma unroll
	for (int t = 0; t < PER; ++t) {
		const int d = lane + 32 * t;
		if (d < D)
			op[d] = o[t] * inv;
	}
}

} /* namespace pkv */
#endif
