/* SPDX-License-Identifier: MIT */
/* Launches attn_kernel on the CPU emulation (one fiber per CUDA thread) and merges split-KV partials. */
#ifndef PKV_EMU_LAUNCH_H
#define PKV_EMU_LAUNCH_H

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "attn_kernel.cuh"

namespace pkv {

/* Runs body() as every CUDA thread of one CTA (fibers on this OS thread); aborts on a barrier deadlock. */
struct emu_fibers {
	std::vector<ucontext_t> ctx;
	std::vector<std::vector<char>> stacks;
	std::vector<char> done;
	const std::function<void()> *body;
};
inline emu_fibers *emu_fib;

static inline void emu_trampoline()
{
	const unsigned me = emu_cur->cur;
	(*emu_fib->body)();
	emu_fib->done[me] = 1;
	emu_cur->progress++;
	/* returning follows uc_link back to the scheduler */
}

static inline void emu_run_cta(const std::function<void()> &body, unsigned nt, unsigned char *smem, emu_dim3 bid)
{
	static emu_fibers fib;
	emu_cta *cta = new emu_cta();
	const size_t stack = 256 << 10;

	fib.ctx.resize(nt);
	fib.stacks.resize(nt);
	fib.done.assign(nt, 0);
	fib.body = &body;
	emu_fib = &fib;
	cta->smem = smem;
	cta->nt = nt;
	cta->fctx = fib.ctx.data();
	emu_cur = cta;
	for (unsigned t = 0; t < nt; t++) {
		fib.stacks[t].resize(stack);
		getcontext(&fib.ctx[t]);
		fib.ctx[t].uc_stack.ss_sp = fib.stacks[t].data();
		fib.ctx[t].uc_stack.ss_size = stack;
		fib.ctx[t].uc_link = &cta->main;
		makecontext(&fib.ctx[t], emu_trampoline, 0);
	}
	for (unsigned left = nt; left;) {
		const unsigned long before = cta->progress;
		left = 0;
		for (unsigned t = 0; t < nt; t++) {
			if (fib.done[t])
				continue;
			cta->cur = t;
			threadIdx = emu_dim3{ t, 0, 0 };
			blockIdx = bid;
			swapcontext(&cta->main, &fib.ctx[t]);
			left += !fib.done[t];
		}
		if (left && cta->progress == before) {
			fprintf(stderr, "emu: barrier deadlock in CTA (%u,%u,%u): some threads never arrive\n", bid.x, bid.y,
				bid.z);
			abort();
		}
	}
	delete cta;
}

template <typename T, int DMAX, int WARPS, int WM, int BN, int STAGES>
static inline void emu_launch(const pkv_cuda_attn_args &a)
{
	const int BM = WARPS * WM * 16, NT = WARPS * 32;
	const int G = a.num_heads / a.num_kv_heads;
	const int mt = (a.max_length_q * G + BM - 1) / BM;
	const size_t smem = (size_t)(BM + 2 * STAGES * BN) * (size_t)(a.head_dim + 8) * 2;
	std::vector<unsigned char> buf(smem + 16);
	const std::function<void()> body = [&] { attn_kernel<T, DMAX, WARPS, WM, BN, STAGES>(a); };

	gridDim = emu_dim3{ (unsigned)(a.num_seqs * a.num_kv_heads), (unsigned)mt, (unsigned)a.num_splits };
	for (unsigned z = 0; z < gridDim.z; z++)
		for (unsigned y = 0; y < gridDim.y; y++)
			for (unsigned x = 0; x < gridDim.x; x++) {
				/* Stale bytes from the previous CTA must not matter: poison them. */
				memset(buf.data(), 0xff, buf.size());
				emu_run_cta(body, NT, buf.data(), emu_dim3{ x, y, z });
			}
}

/* A 1-D grid of `blocks` CTAs of warps * 32 threads, no shared memory. */
template <typename K>
static inline void emu_launch_plain(K kernel, const pkv_cuda_attn_args &a, unsigned blocks, unsigned warps)
{
	const std::function<void()> body = [&] { kernel(a); };
	gridDim = emu_dim3{ blocks, 1, 1 };
	for (unsigned x = 0; x < blocks; x++)
		emu_run_cta(body, warps * 32, nullptr, emu_dim3{ x, 0, 0 });
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
