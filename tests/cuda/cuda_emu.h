/* SPDX-License-Identifier: MIT */
/* A CPU stand-in for the CUDA features attn_kernel.cuh uses (threads, barriers, shuffles, ldmatrix, mma.sync, cp.async). */
#ifndef PKV_CUDA_EMU_H
#define PKV_CUDA_EMU_H

/*
 * Each CUDA thread of a CTA is a fiber; warp-collective operations meet at
 * a per-warp barrier and exchange their operands through shared arrays,
 * then compute what the PTX ISA says each lane receives:
 *   ldmatrix .m8n8 .x4 [.trans]: lanes 8i..8i+7 give the row addresses of
 *     matrix i; lane l receives row l/4, columns 2(l%4), 2(l%4)+1 (of the
 *     transposed matrix with .trans);
 *   mma.m16n8k16 .row.col: groupID g = l/4, t = l%4;
 *     A a0:(g, 2t..2t+1) a1:(g+8, 2t..) a2:(g, 2t+8..) a3:(g+8, 2t+8..);
 *     B b0:(k 2t..2t+1, n g) b1:(k 2t+8.., n g);
 *     C c0,c1:(g, 2t..2t+1) c2,c3:(g+8, 2t..2t+1).
 * cp.async copies at once. Slow, and only as right as this reading of the
 * ISA, but it runs the kernel's own index arithmetic, masking, pipeline and
 * split logic on any machine.
 */
#include <ucontext.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)

using std::max;
using std::min;

struct emu_dim3 {
	unsigned x, y, z;
};
struct float2 {
	float x, y;
};
static inline float2 make_float2(float x, float y)
{
	return float2{ x, y };
}

struct __half {
	uint16_t bits;
};
struct __nv_bfloat16 {
	uint16_t bits;
};
struct __half2 {
	__half x, y;
};
struct __nv_bfloat162 {
	__nv_bfloat16 x, y;
};

static inline uint16_t emu_f2bf(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static inline float emu_bf2f(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline uint16_t emu_f2h(float f)
{
	uint32_t x, ax, sign, h, rem;
	memcpy(&x, &f, 4);
	sign = (x >> 16) & 0x8000u;
	ax = x & 0x7fffffffu;
	if (ax > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u);
	if (ax >= 0x477ff000u)
		return (uint16_t)(sign | 0x7c00u);
	if (ax < 0x38800000u) {
		float v;
		memcpy(&v, &ax, 4);
		return (uint16_t)(sign | (uint32_t)std::nearbyint(v * 16777216.0f));
	}
	h = (((ax >> 23) - 112) << 10) | ((ax & 0x7fffffu) >> 13);
	rem = ax & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

static inline float emu_h2f(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
	float f;
	if (e == 0) {
		f = std::ldexp((float)m, -24);
		return sign ? -f : f;
	}
	u = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112) << 23) | (m << 13));
	memcpy(&f, &u, 4);
	return f;
}

static inline __half2 __floats2half2_rn(float a, float b)
{
	return __half2{ { emu_f2h(a) }, { emu_f2h(b) } };
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
	return __nv_bfloat162{ { emu_f2bf(a) }, { emu_f2bf(b) } };
}

/*
 * One CTA's state. Its CUDA threads are fibers (ucontext) run by one OS
 * thread, round-robin: a barrier yields until every member of its group
 * (a warp, or the whole CTA) has arrived. One core, deterministic order,
 * and a barrier that some threads never reach is reported as a deadlock.
 */
struct emu_warp {
	uint32_t addr[32];
	float f[32];
	uint32_t frag[32][6];
};
struct emu_cta {
	unsigned char *smem;
	unsigned nt;
	emu_warp w[32];
	unsigned cnt[33], gen[33]; /* groups 0..31: warps; 32: the CTA */
	unsigned long progress;
	ucontext_t main;
	ucontext_t *fctx;
	unsigned cur;
};

inline emu_dim3 threadIdx, blockIdx;
inline emu_dim3 gridDim;
inline emu_cta *emu_cur;

static inline void emu_yield()
{
	swapcontext(&emu_cur->fctx[emu_cur->cur], &emu_cur->main);
}

static inline void emu_barrier(unsigned group, unsigned count)
{
	emu_cta &c = *emu_cur;
	const unsigned g = c.gen[group];
	if (++c.cnt[group] == count) {
		c.cnt[group] = 0;
		c.gen[group]++;
		c.progress++;
		return;
	}
	while (c.gen[group] == g)
		emu_yield();
}

#define PKV_SMEM_DECL(name) unsigned char *name = emu_cur->smem

static inline void __syncthreads()
{
	emu_barrier(32, emu_cur->nt);
}

static inline void emu_warp_sync()
{
	emu_barrier(threadIdx.x / 32, 32);
}

static inline emu_warp &emu_my_warp()
{
	return emu_cur->w[threadIdx.x / 32];
}

static inline float __shfl_xor_sync(unsigned, float v, int m)
{
	emu_warp &w = emu_my_warp();
	const unsigned lane = threadIdx.x % 32;
	w.f[lane] = v;
	emu_warp_sync();
	const float r = w.f[lane ^ (unsigned)m];
	emu_warp_sync();
	return r;
}

template <typename T>
static inline T __ldg(const T *p)
{
	return *p;
}

static inline size_t __cvta_generic_to_shared(const void *p)
{
	return (size_t)((const unsigned char *)p - emu_cur->smem);
}

static inline uint32_t smem_u32(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

static inline void cp_async16(uint32_t dst, const void *src, int src_bytes)
{
	memset(emu_cur->smem + dst, 0, 16);
	memcpy(emu_cur->smem + dst, src, (size_t)src_bytes);
}

static inline void cp_async_commit(void)
{
}

template <int N>
static inline void cp_async_wait(void)
{
}

static inline uint16_t emu_ld16(uint32_t addr)
{
	uint16_t v;
	memcpy(&v, emu_cur->smem + addr, 2);
	return v;
}

static inline void ldsm_x4(uint32_t r[4], uint32_t addr)
{
	emu_warp &w = emu_my_warp();
	const unsigned lane = threadIdx.x % 32;
	w.addr[lane] = addr;
	emu_warp_sync();
	for (int i = 0; i < 4; i++) {
		const uint32_t row = w.addr[8 * i + lane / 4];
		r[i] = (uint32_t)emu_ld16(row + (lane % 4) * 4) | ((uint32_t)emu_ld16(row + (lane % 4) * 4 + 2) << 16);
	}
	emu_warp_sync();
}

static inline void ldsm_x4_trans(uint32_t r[4], uint32_t addr)
{
	emu_warp &w = emu_my_warp();
	const unsigned lane = threadIdx.x % 32;
	w.addr[lane] = addr;
	emu_warp_sync();
	for (int i = 0; i < 4; i++) {
		/* Element (row, col) of the transposed matrix is element (col, row) of the stored one. */
		const uint32_t r0 = w.addr[8 * i + (lane % 4) * 2], r1 = w.addr[8 * i + (lane % 4) * 2 + 1];
		r[i] = (uint32_t)emu_ld16(r0 + (lane / 4) * 2) | ((uint32_t)emu_ld16(r1 + (lane / 4) * 2) << 16);
	}
	emu_warp_sync();
}

template <typename T> struct mma_traits;

template <typename T>
struct emu_mma {
	static float cvt(uint16_t b);
	static void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
	{
		emu_warp &w = emu_my_warp();
		const unsigned lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
		for (int i = 0; i < 4; i++)
			w.frag[lane][i] = a[i];
		w.frag[lane][4] = b0;
		w.frag[lane][5] = b1;
		emu_warp_sync();
		auto A = [&](unsigned row, unsigned k) {
			const uint32_t reg = w.frag[(row % 8) * 4 + (k % 8) / 2][(row / 8) + 2 * (k / 8)];
			return cvt((uint16_t)(reg >> (16 * (k % 2))));
		};
		auto B = [&](unsigned k, unsigned col) {
			const uint32_t reg = w.frag[col * 4 + (k % 8) / 2][4 + k / 8];
			return cvt((uint16_t)(reg >> (16 * (k % 2))));
		};
		for (int i = 0; i < 4; i++) {
			const unsigned row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
			double acc = 0;
			for (unsigned k = 0; k < 16; k++)
				acc += (double)A(row, k) * B(k, col);
			c[i] += (float)acc;
		}
		emu_warp_sync();
	}
};
template <> inline float emu_mma<__half>::cvt(uint16_t b)
{
	return emu_h2f(b);
}
template <> inline float emu_mma<__nv_bfloat16>::cvt(uint16_t b)
{
	return emu_bf2f(b);
}

template <> struct mma_traits<__half> : emu_mma<__half> {
	static uint32_t pack(float lo, float hi)
	{
		return (uint32_t)emu_f2h(lo) | ((uint32_t)emu_f2h(hi) << 16);
	}
};
template <> struct mma_traits<__nv_bfloat16> : emu_mma<__nv_bfloat16> {
	static uint32_t pack(float lo, float hi)
	{
		return (uint32_t)emu_f2bf(lo) | ((uint32_t)emu_f2bf(hi) << 16);
	}
};

#endif
