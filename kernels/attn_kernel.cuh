/* SPDX-License-Identifier: MIT */
/* The paged attention kernel: tiled online softmax over K/V read straight from cache pages, tensor-core MMA. */
#ifndef PKV_ATTN_KERNEL_CUH
#define PKV_ATTN_KERNEL_CUH

#ifdef PKV_EMULATE
/* CPU emulation of the warp primitives (tests/cuda/emulate.cpp): checks the kernel's logic without a GPU. */
#include "cuda_emu.h"
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pkv_cuda_kernels.h"

namespace pkv {

/*
 * Design (DESIGN §3, issue 6 §2):
 * - One CTA serves one (sequence, KV head, tile of query rows, KV split).
 *   A query "row" is a (query token, head of the GQA group) pair: the G heads
 *   of one KV head are rows of the same tile, so each K/V byte a CTA loads
 *   serves every head of its group (the decode path's main saving; on the
 *   prefill path it divides K/V shared-memory traffic by G).
 * - Each warp owns 16 rows; S = Q K^T and O += P V are mma.sync m16n8k16
 *   (f16/bf16 operands, f32 accumulators). P goes from the S accumulators to
 *   A fragments in registers, without touching shared memory.
 * - K/V tiles of BN keys are fetched with cp.async (16 bytes per thread per
 *   row) straight from the pages through the block table, STAGES deep.
 *   Keys past the sequence are zero-filled, so stale slots of a partly
 *   written block can never put a NaN into 0 * V.
 * - Shared rows are padded by 16 bytes: with (head_dim + 8) halves per row,
 *   the 8 row addresses of one ldmatrix fall into distinct 4-bank groups.
 * - head_dim is a run-time multiple of 16 up to DMAX: register arrays are
 *   sized by DMAX and every loop over them is unrolled with a guard, so they
 *   stay in registers (run-time indexing would move them to local memory).
 */

#ifndef PKV_EMULATE
template <typename T> struct mma_traits;

template <> struct mma_traits<__half> {
	static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
	{
		asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
			     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
			     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
			     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
	}
	static __device__ __forceinline__ uint32_t pack(float lo, float hi)
	{
		__half2 h = __floats2half2_rn(lo, hi);
		uint32_t u;
		memcpy(&u, &h, 4);
		return u;
	}
};

template <> struct mma_traits<__nv_bfloat16> {
	static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
	{
		asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
			     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
			     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
			     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
	}
	static __device__ __forceinline__ uint32_t pack(float lo, float hi)
	{
		__nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
		uint32_t u;
		memcpy(&u, &h, 4);
		return u;
	}
};

static __device__ __forceinline__ uint32_t smem_u32(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared; src_bytes 0 zero-fills (src must still be a valid address). */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
		     :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

static __device__ __forceinline__ void cp_async_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
static __device__ __forceinline__ void cp_async_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

static __device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], uint32_t addr)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

#endif /* !PKV_EMULATE */

#define PKV_LOG2E 1.4426950408889634f

/* Exact widening of a cache element. */
#ifndef PKV_EMULATE
static __device__ __forceinline__ float to_float(__half x)
{
	return __half2float(x);
}
static __device__ __forceinline__ float to_float(__nv_bfloat16 x)
{
	return __bfloat162float(x);
}
#else
static inline float to_float(__half x)
{
	return emu_h2f(x.bits);
}
static inline float to_float(__nv_bfloat16 x)
{
	return emu_bf2f(x.bits);
}
#endif

#ifndef PKV_EMULATE
#define PKV_SMEM_DECL(name) extern __shared__ __align__(16) unsigned char name[]
#endif

template <typename T, int DMAX, int WARPS, int WM, int BN, int STAGES>
__global__ void __launch_bounds__(WARPS * 32)
attn_kernel(const pkv_cuda_attn_args a)
{
	constexpr int NT = WARPS * 32;
	constexpr int BM = WARPS * WM * 16; /* each warp owns WM stacked 16-row MMA tiles */
	constexpr int CPRM = DMAX / 8;      /* 16-byte chunks per row at DMAX */
	static_assert(NT % CPRM == 0, "thread count must cover whole rows");
	static_assert(BN % 16 == 0 && DMAX % 16 == 0 && STAGES >= 2 && WM >= 1, "tile shape");
	typedef mma_traits<T> MT;

	PKV_SMEM_DECL(smem);
	const int D = a.head_dim;
	const int ld = D + 8;
	T *sQ = reinterpret_cast<T *>(smem);
	T *sK = sQ + BM * ld;
	T *sV = sK + STAGES * BN * ld;

	const int HKV = a.num_kv_heads;
	const int s = blockIdx.x / HKV;
	const int kvh = blockIdx.x - s * HKV;
	const int G = a.num_heads / HKV;
	const int q0 = a.cu_seq_lens_q[s];
	const int sq = a.cu_seq_lens_q[s + 1] - q0;
	const int sk = a.cu_seq_lens_k[s + 1] - a.cu_seq_lens_k[s];
	const int rows = sq * G;
	/* Causal tiles further down see more keys: hand those out first so they do not form the tail. */
	const int m0 = (int)(gridDim.y - 1 - blockIdx.y) * BM;
	if (m0 >= rows)
		return;
	const int diag = sk - sq; /* bottom-right causal alignment */
	const int q_first = m0 / G;
	const int q_last = min(rows - 1, m0 + BM - 1) / G;
	int kv_hi = min(sk, q_last + diag + 1);
	int kv_lo = a.window_left >= 0 ? max(0, q_first + diag - a.window_left) : 0;
	if (kv_hi < kv_lo)
		kv_hi = kv_lo;
	const int t_lo = kv_lo / BN;
	const int t_hi = kv_hi > kv_lo ? (kv_hi + BN - 1) / BN : t_lo;
	const int per = (t_hi - t_lo + a.num_splits - 1) / a.num_splits;
	const int my_lo = t_lo + (int)blockIdx.z * per;
	const int my_n = max(0, min(t_hi, my_lo + per) - my_lo);

	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	const int g = lane >> 2, tig = lane & 3;
	const int nchunks = D / 8;
	const int chunk = tid % CPRM;

	/* Q tile: rows past the sequence are zero. */
	if (chunk < nchunks) {
		const char *qb = static_cast<const char *>(a.q);
#pragma unroll
		for (int r = tid / CPRM; r < BM; r += NT / CPRM) {
			const int gr = m0 + r;
			const void *src = a.q;
			int bytes = 0;
			if (gr < rows) {
				const int qi = gr / G, h = gr - qi * G;
				src = qb + ((((int64_t)(q0 + qi) * a.num_heads + kvh * G + h) * D + chunk * 8) *
					    (int64_t)sizeof(T));
				bytes = 16;
			}
			cp_async16(smem_u32(sQ + r * ld + chunk * 8), src, bytes);
		}
	}

	const int32_t *bt = a.block_tables + (int64_t)s * a.max_blocks_per_seq;
	const char *kc = static_cast<const char *>(a.k_cache) + (int64_t)kvh * D * (int64_t)sizeof(T);
	const char *vc = static_cast<const char *>(a.v_cache) + (int64_t)kvh * D * (int64_t)sizeof(T);
	const int bs = a.block_size;

	auto load_kv = [&](int tile, int stage) {
		constexpr int STEP = NT / CPRM; /* rows apart that one thread loads */
		if (chunk >= nchunks)
			return;
		/*
		 * Block index and offset of this thread's first key, then stepped:
		 * one division per tile instead of one per row (the block size is
		 * only known at run time, and integer division is ~20 instructions).
		 */
		int j = tile * BN + tid / CPRM;
		int jb = j / bs, jo = j - jb * bs;
#pragma unroll
		for (int r = tid / CPRM; r < BN; r += STEP) {
			int64_t off = 0;
			int bytes = 0;
			if (j < sk) {
				const int blk = __ldg(bt + jb);
				off = (int64_t)blk * a.block_stride + (int64_t)jo * a.token_stride + chunk * 16;
				bytes = 16;
			}
			const int srow = (stage * BN + r) * ld + chunk * 8;
			cp_async16(smem_u32(sK + srow), kc + off, bytes);
			cp_async16(smem_u32(sV + srow), vc + off, bytes);
			j += STEP;
			jo += STEP;
			while (jo >= bs) {
				jo -= bs;
				++jb;
			}
		}
	};

#pragma unroll
	for (int st = 0; st < STAGES - 1; ++st) {
		if (st < my_n)
			load_kv(my_lo + st, st);
		cp_async_commit(); /* one group per stage, even empty, keeps wait_group counts exact */
	}

	/*
	 * This thread's rows: g and g + 8 of each of the warp's WM tiles ([mi][0]
	 * and [mi][1]). Visible keys of a row are [lo, hi]; hi = -1 for padding.
	 */
	int hi[WM][2], lo[WM][2];
#pragma unroll
	for (int mi = 0; mi < WM; ++mi) {
#pragma unroll
		for (int e = 0; e < 2; ++e) {
			const int r = m0 + (warp * WM + mi) * 16 + g + e * 8;
			hi[mi][e] = -1;
			lo[mi][e] = 0;
			if (r < rows) {
				const int q = r / G;
				hi[mi][e] = q + diag;
				lo[mi][e] = a.window_left >= 0 ? q + diag - a.window_left : 0;
			}
		}
	}

	const float scale_log2 = a.scale * PKV_LOG2E;
	const float softcap = a.softcap;
	const float cap_in = softcap > 0.f ? a.scale / softcap : 0.f;
	const float cap_out = softcap * PKV_LOG2E;

	float o[WM][DMAX / 8][4];
	float m_r[WM][2], l_r[WM][2];
#pragma unroll
	for (int mi = 0; mi < WM; ++mi) {
#pragma unroll
		for (int j = 0; j < DMAX / 8; ++j)
			o[mi][j][0] = o[mi][j][1] = o[mi][j][2] = o[mi][j][3] = 0.f;
		m_r[mi][0] = m_r[mi][1] = -INFINITY;
		l_r[mi][0] = l_r[mi][1] = 0.f;
	}

	for (int it = 0; it < my_n; ++it) {
		cp_async_wait<STAGES - 2>();
		__syncthreads(); /* tile `it` visible to all; stage (it-1)%STAGES no longer read */
		{
			const int nt = it + STAGES - 1;
			if (nt < my_n)
				load_kv(my_lo + nt, nt % STAGES);
			cp_async_commit();
		}
		const int st = it % STAGES;
		const T *ks = sK + st * BN * ld;
		const T *vs = sV + st * BN * ld;

		float sacc[WM][BN / 8][4];
#pragma unroll
		for (int mi = 0; mi < WM; ++mi)
#pragma unroll
			for (int j = 0; j < BN / 8; ++j)
				sacc[mi][j][0] = sacc[mi][j][1] = sacc[mi][j][2] = sacc[mi][j][3] = 0.f;

		/* S = Q K^T: each K fragment pair feeds all WM row tiles. */
#pragma unroll
		for (int kk = 0; kk < DMAX / 16; ++kk) {
			if (kk * 16 < D) {
				uint32_t af[WM][4];
#pragma unroll
				for (int mi = 0; mi < WM; ++mi)
					ldsm_x4(af[mi], smem_u32(sQ + ((warp * WM + mi) * 16 + (lane & 15)) * ld + kk * 16 +
								 (lane >> 4) * 8));
#pragma unroll
				for (int nb2 = 0; nb2 < BN / 16; ++nb2) {
					uint32_t bf[4];
					ldsm_x4(bf, smem_u32(ks + (nb2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * ld +
							     kk * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
					for (int mi = 0; mi < WM; ++mi) {
						MT::mma(sacc[mi][2 * nb2], af[mi], bf[0], bf[1]);
						MT::mma(sacc[mi][2 * nb2 + 1], af[mi], bf[2], bf[3]);
					}
				}
			}
		}

		/* Scale, soft-cap, mask (causal bottom-right, window, sequence end), online softmax; log2 domain. */
		const int kbase = (my_lo + it) * BN;
#pragma unroll
		for (int mi = 0; mi < WM; ++mi) {
			float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
			for (int nb = 0; nb < BN / 8; ++nb) {
#pragma unroll
				for (int i = 0; i < 4; ++i) {
					const int e = i >> 1;
					const int j = kbase + nb * 8 + tig * 2 + (i & 1);
					float v = sacc[mi][nb][i];
					v = softcap > 0.f ? cap_out * tanhf(v * cap_in) : v * scale_log2;
					v = (j <= hi[mi][e] && j >= lo[mi][e]) ? v : -INFINITY;
					sacc[mi][nb][i] = v;
					mx[e] = fmaxf(mx[e], v);
				}
			}
#pragma unroll
			for (int e = 0; e < 2; ++e) {
				mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 1));
				mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 2));
			}
			float mu[2], al[2];
#pragma unroll
			for (int e = 0; e < 2; ++e) {
				const float mn = fmaxf(m_r[mi][e], mx[e]);
				/* A row with nothing visible yet keeps max -inf; subtracting 0 instead avoids inf - inf. */
				mu[e] = mn == -INFINITY ? 0.f : mn;
				al[e] = exp2f(m_r[mi][e] - mu[e]);
				m_r[mi][e] = mn;
			}
			float rs[2] = { 0.f, 0.f };
#pragma unroll
			for (int nb = 0; nb < BN / 8; ++nb) {
				sacc[mi][nb][0] = exp2f(sacc[mi][nb][0] - mu[0]);
				sacc[mi][nb][1] = exp2f(sacc[mi][nb][1] - mu[0]);
				sacc[mi][nb][2] = exp2f(sacc[mi][nb][2] - mu[1]);
				sacc[mi][nb][3] = exp2f(sacc[mi][nb][3] - mu[1]);
				rs[0] += sacc[mi][nb][0] + sacc[mi][nb][1];
				rs[1] += sacc[mi][nb][2] + sacc[mi][nb][3];
			}
			l_r[mi][0] = l_r[mi][0] * al[0] + rs[0];
			l_r[mi][1] = l_r[mi][1] * al[1] + rs[1];
#pragma unroll
			for (int j = 0; j < DMAX / 8; ++j) {
				o[mi][j][0] *= al[0];
				o[mi][j][1] *= al[0];
				o[mi][j][2] *= al[1];
				o[mi][j][3] *= al[1];
			}
		}

		/* O += P V: the S accumulator layout of two n-blocks is exactly an A fragment. */
#pragma unroll
		for (int kk2 = 0; kk2 < BN / 16; ++kk2) {
			uint32_t pf[WM][4];
#pragma unroll
			for (int mi = 0; mi < WM; ++mi) {
				pf[mi][0] = MT::pack(sacc[mi][2 * kk2][0], sacc[mi][2 * kk2][1]);
				pf[mi][1] = MT::pack(sacc[mi][2 * kk2][2], sacc[mi][2 * kk2][3]);
				pf[mi][2] = MT::pack(sacc[mi][2 * kk2 + 1][0], sacc[mi][2 * kk2 + 1][1]);
				pf[mi][3] = MT::pack(sacc[mi][2 * kk2 + 1][2], sacc[mi][2 * kk2 + 1][3]);
			}
#pragma unroll
			for (int nd2 = 0; nd2 < DMAX / 16; ++nd2) {
				if (nd2 * 16 < D) {
					uint32_t bf[4];
					ldsm_x4_trans(bf, smem_u32(vs + (kk2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld +
								   nd2 * 16 + (lane >> 4) * 8));
#pragma unroll
					for (int mi = 0; mi < WM; ++mi) {
						MT::mma(o[mi][2 * nd2], pf[mi], bf[0], bf[1]);
						MT::mma(o[mi][2 * nd2 + 1], pf[mi], bf[2], bf[3]);
					}
				}
			}
		}
	}
	cp_async_wait<0>();

	float *out;
	int64_t split_rows = 0;
	if (a.num_splits == 1) {
		out = a.o;
	} else {
		split_rows = (int64_t)blockIdx.z * a.total_q * a.num_heads;
		out = a.o_part + split_rows * D;
	}
#pragma unroll
	for (int mi = 0; mi < WM; ++mi) {
#pragma unroll
		for (int e = 0; e < 2; ++e) {
			float l = l_r[mi][e];
			l += __shfl_xor_sync(0xffffffffu, l, 1);
			l += __shfl_xor_sync(0xffffffffu, l, 2);
			const int r = m0 + (warp * WM + mi) * 16 + g + e * 8;
			if (r >= rows)
				continue; /* padding row */
			/* Rows that saw no key have l == 0 and are written as 0 (never NaN). */
			const float inv = l > 0.f ? 1.f / l : 0.f;
			const int qi = r / G; /* recomputed here rather than kept live through the loop */
			const int64_t row = (int64_t)(q0 + qi) * a.num_heads + kvh * G + (r - qi * G);
			float *p = out + row * D + tig * 2;
#pragma unroll
			for (int j = 0; j < DMAX / 8; ++j)
				if (j * 8 < D)
					*reinterpret_cast<float2 *>(p + j * 8) =
						make_float2(o[mi][j][2 * e] * inv, o[mi][j][2 * e + 1] * inv);
			if (a.num_splits > 1 && tig == 0)
				a.lse_part[split_rows + row] = l > 0.f ? m_r[mi][e] + log2f(l) : -INFINITY;
		}
	}
}

/* Kernel shapes: prefill tiles of 64 rows (4 warps), decode tiles of 16 rows (1 warp) with deeper K/V pipelining. */
#define PKV_VARLEN_WARPS 4
#define PKV_VARLEN_BN 64
#define PKV_VARLEN_STAGES 2
#define PKV_DECODE_WARPS 1
#define PKV_DECODE_BN 32
#define PKV_DECODE_STAGES 4
#define PKV_DECODE_STAGES_ALT 3

/*
 * Row tiles per warp of the varlen shape: 2 (128-row CTAs, each K/V fragment
 * feeding two MMA row tiles: less shared-memory traffic per MMA) while the
 * accumulators fit in registers, i.e. head dims up to 128; PKV_CUDA_VARLEN_WM=1
 * forces 64-row CTAs (the bench compares both).
 */
/* 1 or 2 from an environment variable, else 0. */
static inline int variant_env(const char *name)
{
	const char *e = getenv(name);
	return e && (e[0] == '1' || e[0] == '2') && !e[1] ? e[0] - '0' : 0;
}

static inline int varlen_wm_forced(void)
{
	return variant_env("PKV_CUDA_VARLEN_WM");
}

/* Decode pipeline: 4 stages of 32 keys (3 CTAs per SM at hd 128) or, with PKV_CUDA_DECODE_VARIANT=2, 3 stages (4 per SM). */
static inline int decode_variant(void)
{
	static const int forced = variant_env("PKV_CUDA_DECODE_VARIANT");
	return forced ? forced : 1;
}

static inline int varlen_wm(int head_dim)
{
	static const int forced = varlen_wm_forced(); /* read once; C++ makes this initialisation thread-safe */
	if (head_dim > 128)
		return 1;
	return forced ? forced : 2;
}

#ifndef PKV_EMULATE
template <typename T, int DMAX, int WARPS, int WM, int BN, int STAGES>
static cudaError_t launch_attn(const pkv_cuda_attn_args &a, cudaStream_t stream)
{
	const int BM = WARPS * WM * 16;
	const int G = a.num_heads / a.num_kv_heads;
	const long long mt = ((long long)a.max_length_q * G + BM - 1) / BM;
	if (mt == 0 || a.num_seqs == 0)
		return cudaSuccess;
	if (mt > 65535 || a.num_splits < 1 || a.num_splits > 65535)
		return cudaErrorInvalidConfiguration;
	const size_t smem = (size_t)(BM + 2 * STAGES * BN) * (size_t)(a.head_dim + 8) * sizeof(T);
	void (*k)(const pkv_cuda_attn_args) = attn_kernel<T, DMAX, WARPS, WM, BN, STAGES>;
	cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
	if (e != cudaSuccess)
		return e;
	dim3 grid((unsigned)a.num_seqs * (unsigned)a.num_kv_heads, (unsigned)mt, (unsigned)a.num_splits);
	k<<<grid, WARPS * 32, smem, stream>>>(a);
	return cudaGetLastError();
}

template <typename T>
static cudaError_t launch_attn_shape(const pkv_cuda_attn_args &a, int shape, cudaStream_t stream)
{
	const int D = a.head_dim;
	const int v = a.variant == 1 || a.variant == 2 ? a.variant : 0;
	if (shape == PKV_CUDA_SHAPE_DECODE) {
#define PKV_DEC(DM, ST) launch_attn<T, DM, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, ST>(a, stream)
		if ((v ? v : decode_variant()) == 2)
			return D <= 64 ? PKV_DEC(64, PKV_DECODE_STAGES_ALT) : D <= 128 ? PKV_DEC(128, PKV_DECODE_STAGES_ALT)
									: PKV_DEC(256, PKV_DECODE_STAGES_ALT);
		return D <= 64 ? PKV_DEC(64, PKV_DECODE_STAGES) : D <= 128 ? PKV_DEC(128, PKV_DECODE_STAGES)
								: PKV_DEC(256, PKV_DECODE_STAGES);
#undef PKV_DEC
	}
#define PKV_VAR(DM, WM) launch_attn<T, DM, PKV_VARLEN_WARPS, WM, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a, stream)
	if (D > 128)
		return PKV_VAR(256, 1);
	if ((v ? v : varlen_wm(D)) == 2)
		return D <= 64 ? PKV_VAR(64, 2) : PKV_VAR(128, 2);
	return D <= 64 ? PKV_VAR(64, 1) : PKV_VAR(128, 1);
#undef PKV_VAR
}
#endif /* !PKV_EMULATE */

} /* namespace pkv */

#ifndef PKV_EMULATE
/* Per-dtype entry points, each defined in its own translation unit to keep compiles small. */
cudaError_t pkv_attn_launch_f16(const pkv_cuda_attn_args &a, int shape, cudaStream_t stream);
cudaError_t pkv_attn_launch_bf16(const pkv_cuda_attn_args &a, int shape, cudaStream_t stream);
#endif

#endif
