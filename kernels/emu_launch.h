/* SPDX-License-Identifier: MIT */
/* Launches attn_kernel on the CPU emulation (one std::thread per CUDA thread) and merges split-KV partials. */
#ifndef PKV_EMU_LAUNCH_H
#define PKV_EMU_LAUNCH_H

#include <thread>
#include <vector>

#include "attn_kernel.cuh"

namespace pkv {

template <typename T, int DMAX, int WARPS, int WM, int BN, int STAGES>
static inline void emu_launch(const pkv_cuda_attn_args &a)
{
	const int BM = WARPS * WM * 16, NT = WARPS * 32;
	const int G = a.num_heads / a.num_kv_heads;
	const int mt = (a.max_length_q * G + BM - 1) / BM;
	const size_t smem = (size_t)(BM + 2 * STAGES * BN) * (size_t)(a.head_dim + 8) * 2;
	std::vector<unsigned char> buf(smem + 16);

	gridDim = emu_dim3{ (unsigned)(a.num_seqs * a.num_kv_heads), (unsigned)mt, (unsigned)a.num_splits };
	for (unsigned z = 0; z < gridDim.z; z++)
		for (unsigned y = 0; y < gridDim.y; y++)
			for (unsigned x = 0; x < gridDim.x; x++) {
				emu_cta cta;
				std::barrier<> cb(NT);
				std::vector<std::barrier<> *> wb;
				for (int w = 0; w < WARPS; w++) {
					wb.push_back(new std::barrier<>(32));
					cta.warp_bar[w] = wb.back();
				}
				cta.cta_bar = &cb;
				/* Stale bytes from the previous CTA must not matter: poison them. */
				memset(buf.data(), 0xff, buf.size());
				cta.smem = buf.data();
				std::vector<std::thread> th;
				for (int t = 0; t < NT; t++)
					th.emplace_back([&, t] {
						emu_cur = &cta;
						threadIdx = emu_dim3{ (unsigned)t, 0, 0 };
						blockIdx = emu_dim3{ x, y, z };
						attn_kernel<T, DMAX, WARPS, WM, BN, STAGES>(a);
					});
				for (auto &t : th)
					t.join();
				for (auto *p : wb)
					delete p;
			}
}

/* Mirrors merge_kernel in util.cu. */
static inline void emu_merge(const pkv_cuda_attn_args &a)
{
	const int64_t nrows = (int64_t)a.total_q * a.num_heads;
	for (int64_t row = 0; row < nrows; row++) {
		float mx = -INFINITY;
		for (int sp = 0; sp < a.num_splits; sp++)
			mx = fmaxf(mx, a.lse_part[sp * nrows + row]);
		for (int d = 0; d < a.head_dim; d++) {
			float acc = 0.f, wsum = 0.f;
			if (mx != -INFINITY)
				for (int sp = 0; sp < a.num_splits; sp++) {
					const float w = exp2f(a.lse_part[sp * nrows + row] - mx);
					wsum += w;
					acc += w * a.o_part[(sp * nrows + row) * a.head_dim + d];
				}
			a.o[row * a.head_dim + d] = wsum > 0.f ? acc / wsum : 0.f;
		}
	}
}

} /* namespace pkv */
#endif
