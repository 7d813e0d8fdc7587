/* SPDX-License-Identifier: MIT */
/* Runs the paged attention kernel on the CPU through cuda_emu.h and checks it against an f64 reference. */

/*
 * What a GPU-less machine can still check: the kernel's tile arithmetic,
 * fragment addressing (as the PTX ISA describes it), GQA row packing, paged
 * K/V addressing through shuffled block tables, causal/window/soft-cap
 * masking, fully masked rows, the cp.async stage rotation and the split-KV
 * partials with their log-sum-exp merge. Both kernel shapes (varlen: 4 warps,
 * decode: 1 warp) and all three head-dim bounds are run. Exit 0 = all cases
 * within tolerance.
 */
#define PKV_EMULATE 1
#include "attn_kernel.cuh"
#include "emu_launch.h"
#include "attn_precise.cuh"

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <pagedkv/types.h>
#include "conformance/ref.h"

using namespace pkv;


/* Keys lo.. of one sequence and KV head in a paged f16/bf16 cache, read for the shared f64 reference. */
struct PagedKeys {
	const uint16_t *kc, *vc;
	const int32_t *bt; /* this sequence's block table row */
	int bs, lo, kvh, D;
	size_t token;
	bool f16;

	double at(const uint16_t *base, uint32_t j, uint32_t x) const
	{
		const int k = lo + (int)j;
		const uint16_t b = base[((size_t)bt[k / bs] * bs + k % bs) * token + (size_t)kvh * D + x];
		return f16 ? emu_h2f(b) : emu_bf2f(b);
	}
	static double key(const void *c, uint32_t j, uint32_t x)
	{
		const PagedKeys *p = static_cast<const PagedKeys *>(c);
		return p->at(p->kc, j, x);
	}
	static double value(const void *c, uint32_t j, uint32_t x)
	{
		const PagedKeys *p = static_cast<const PagedKeys *>(c);
		return p->at(p->vc, j, x);
	}
};

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float rnd_f()
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static int rnd_i(int n)
{
	rnd_f();
	return (int)(rs % (uint64_t)n);
}

static int test_no; /* TAP numbering across every instantiation of run_case */

struct seq {
	int sq, sk;
};

template <typename T>
static int run_case(const char *name, int shape, int wm, int H, int HKV, int D, int bs, std::vector<seq> seqs, int window,
		    float softcap, int splits)
{
	const bool f16 = sizeof(T) == 2 && std::is_same<T, __half>::value;
	const int n = (int)seqs.size();
	std::vector<int32_t> cuq(n + 1, 0), cuk(n + 1, 0);
	int maxq = 0, maxk = 0, mbps = 0, nblocks = 0;
	for (int s = 0; s < n; s++) {
		cuq[s + 1] = cuq[s] + seqs[s].sq;
		cuk[s + 1] = cuk[s] + seqs[s].sk;
		maxq = std::max(maxq, seqs[s].sq);
		maxk = std::max(maxk, seqs[s].sk);
		mbps = std::max(mbps, (seqs[s].sk + bs - 1) / bs + 1);
		nblocks += (seqs[s].sk + bs - 1) / bs;
	}
	nblocks += 3;
	const int T_ = cuq[n];
	const size_t token = (size_t)HKV * D;
	std::vector<uint16_t> kc((size_t)nblocks * bs * token), vc(kc.size());
	for (auto &x : kc)
		x = f16 ? emu_f2h(rnd_f()) : emu_f2bf(rnd_f());
	for (auto &x : vc)
		x = f16 ? emu_f2h(rnd_f()) : emu_f2bf(rnd_f());
	/* Shuffled blocks, -1 past the end. */
	std::vector<int> perm(nblocks);
	for (int i = 0; i < nblocks; i++)
		perm[i] = i;
	for (int i = nblocks - 1; i > 0; i--)
		std::swap(perm[i], perm[rnd_i(i + 1)]);
	std::vector<int32_t> bt((size_t)n * mbps, -1);
	int next = 0;
	for (int s = 0; s < n; s++)
		for (int b = 0; b < (seqs[s].sk + bs - 1) / bs; b++)
			bt[(size_t)s * mbps + b] = perm[next++];
	std::vector<uint16_t> q((size_t)T_ * H * D);
	for (auto &x : q)
		x = f16 ? emu_f2h(rnd_f()) : emu_f2bf(rnd_f());
	std::vector<float> o((size_t)T_ * H * D, NAN), part((size_t)splits * T_ * H * D, NAN),
		lse((size_t)splits * T_ * H, NAN);

	pkv_cuda_attn_args a{};
	a.q = q.data();
	a.k_cache = kc.data();
	a.v_cache = vc.data();
	a.block_stride = (int64_t)bs * (int64_t)token * 2;
	a.token_stride = (int64_t)token * 2;
	a.cu_seq_lens_q = cuq.data();
	a.cu_seq_lens_k = cuk.data();
	a.block_tables = bt.data();
	a.max_blocks_per_seq = mbps;
	a.block_size = bs;
	a.num_seqs = n;
	a.total_q = T_;
	a.max_length_q = maxq;
	a.max_length_k = maxk;
	a.num_heads = H;
	a.num_kv_heads = HKV;
	a.head_dim = D;
	a.scale = 1.f / sqrtf((float)D);
	a.softcap = softcap;
	a.window_left = window;
	a.num_splits = splits;
	a.o = o.data();
	a.o_part = part.data();
	a.lse_part = lse.data();

	if (shape == PKV_CUDA_SHAPE_DECODE && wm == 2) {
		/* wm 2 on the decode shape selects the 3-stage pipeline (variant 2) */
		if (D <= 64)
			emu_launch<T, 64, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES_ALT>(a);
		else if (D <= 128)
			emu_launch<T, 128, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES_ALT>(a);
		else
			emu_launch<T, 256, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES_ALT>(a);
	} else if (shape == PKV_CUDA_SHAPE_DECODE) {
		if (D <= 64)
			emu_launch<T, 64, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES>(a);
		else if (D <= 128)
			emu_launch<T, 128, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES>(a);
		else
			emu_launch<T, 256, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES>(a);
	} else if (wm == 2) {
		if (D <= 64)
			emu_launch<T, 64, PKV_VARLEN_WARPS, 2, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a);
		else
			emu_launch<T, 128, PKV_VARLEN_WARPS, 2, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a);
	} else {
		if (D <= 64)
			emu_launch<T, 64, PKV_VARLEN_WARPS, 1, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a);
		else if (D <= 128)
			emu_launch<T, 128, PKV_VARLEN_WARPS, 1, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a);
		else
			emu_launch<T, 256, PKV_VARLEN_WARPS, 1, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a);
	}
	if (splits > 1)
		emu_merge(a);

	/* f64 reference (src/conformance/ref.c) on the same stored (rounded) values. */
	auto cv = [&](uint16_t b) { return (double)(f16 ? emu_h2f(b) : emu_bf2f(b)); };
	const int G = H / HKV;
	double err = 0, refmax = 0;
	int bad_zero = 0, unwritten = 0;
	std::vector<double> qd(D), ref(D);
	for (int s = 0; s < n; s++)
		for (int i = 0; i < seqs[s].sq; i++)
			for (int h = 0; h < H; h++) {
				const int row = cuq[s] + i, diag = seqs[s].sk - seqs[s].sq;
				const int hi = std::min(i + diag, seqs[s].sk - 1);
				const int lo = std::max(window >= 0 ? i + diag - window : 0, 0);
				const PagedKeys pk = { kc.data(), vc.data(), bt.data() + (size_t)s * mbps, bs, lo, h / G, D,
						       token, f16 };
				for (int d = 0; d < D; d++)
					qd[d] = cv(q[((size_t)row * H + h) * D + d]);
				pkv_ref_attend_row(qd.data(), D, hi >= lo ? hi - lo + 1 : 0, PagedKeys::key, PagedKeys::value,
						   &pk, 1.0 / sqrt((double)D), softcap, ref.data());
				for (int d = 0; d < D; d++) {
					const float got = o[((size_t)row * H + h) * D + d];
					if (std::isnan(got)) {
						unwritten++;
						continue;
					}
					if (hi < lo) {
						bad_zero += got != 0.f;
						continue;
					}
					err = std::max(err, fabs(got - ref[d]));
					refmax = std::max(refmax, fabs(ref[d]));
				}
			}
	const double tol = f16 ? 4e-3 : 2.5e-2;
	const bool ok = err <= tol && !bad_zero && !unwritten;
	printf("%s %d - emulate %s (%s, shape %s, variant %d, hd %d, heads %d/%d, bs %d, splits %d): max err %.2g (|ref| %.2g)%s%s\n",
	       ok ? "ok" : "not ok", ++test_no, name, f16 ? "f16" : "bf16", shape ? "decode" : "varlen", wm, D, H, HKV, bs, splits,
	       err, refmax, bad_zero ? ", fully masked rows not 0" : "", unwritten ? ", unwritten outputs" : "");
	return ok ? 0 : 1;
}

/* The f32 path: Q in f32 over a bf16 cache must match the f64 reference to f32 accuracy. */
static int run_precise(void)
{
	const int H = 6, HKV = 2, D = 80, bs = 16, G = H / HKV;
	std::vector<seq> seqs = { { 5, 40 }, { 1, 17 }, { 6, 3 } };
	const int n = (int)seqs.size();
	std::vector<int32_t> cuq(n + 1, 0), cuk(n + 1, 0);
	int mbps = 0, nblocks = 0;
	for (int s = 0; s < n; s++) {
		cuq[s + 1] = cuq[s] + seqs[s].sq;
		cuk[s + 1] = cuk[s] + seqs[s].sk;
		mbps = std::max(mbps, (seqs[s].sk + bs - 1) / bs);
		nblocks += (seqs[s].sk + bs - 1) / bs;
	}
	const int T_ = cuq[n];
	const size_t token = (size_t)HKV * D;
	std::vector<uint16_t> kc((size_t)nblocks * bs * token), vc(kc.size());
	for (auto &x : kc)
		x = emu_f2bf(rnd_f());
	for (auto &x : vc)
		x = emu_f2bf(rnd_f());
	std::vector<int32_t> bt((size_t)n * mbps, -1);
	int next = nblocks - 1; /* blocks handed out backwards: tables are not the identity */
	for (int s = 0; s < n; s++)
		for (int b = 0; b < (seqs[s].sk + bs - 1) / bs; b++)
			bt[(size_t)s * mbps + b] = next--;
	std::vector<float> q((size_t)T_ * H * D), o(q.size(), NAN);
	for (auto &x : q)
		x = rnd_f();
	pkv_cuda_attn_args a{};
	a.q = q.data();
	a.k_cache = kc.data();
	a.v_cache = vc.data();
	a.block_stride = (int64_t)bs * (int64_t)token * 2;
	a.token_stride = (int64_t)token * 2;
	a.cu_seq_lens_q = cuq.data();
	a.cu_seq_lens_k = cuk.data();
	a.block_tables = bt.data();
	a.max_blocks_per_seq = mbps;
	a.block_size = bs;
	a.num_seqs = n;
	a.total_q = T_;
	a.num_heads = H;
	a.num_kv_heads = HKV;
	a.head_dim = D;
	a.cache_dtype = PKV_DTYPE_BF16;
	a.scale = 1.f / sqrtf((float)D);
	a.softcap = 0.f;
	a.window_left = -1;
	a.num_splits = 1;
	a.o = o.data();
	emu_launch_plain(attn_precise_kernel<__nv_bfloat16>, a, (unsigned)((T_ * H + 3) / 4), 4);
	double err = 0;
	int bad = 0;
	std::vector<double> qd(D), ref(D);
	for (int s = 0; s < n; s++)
		for (int i = 0; i < seqs[s].sq; i++)
			for (int h = 0; h < H; h++) {
				const int row = cuq[s] + i, hi = std::min(i + seqs[s].sk - seqs[s].sq, seqs[s].sk - 1);
				const PagedKeys pk = { kc.data(), vc.data(), bt.data() + (size_t)s * mbps, bs, 0, h / G, D,
						       token, false };
				for (int d = 0; d < D; d++)
					qd[d] = q[((size_t)row * H + h) * D + d];
				pkv_ref_attend_row(qd.data(), D, hi >= 0 ? hi + 1 : 0, PagedKeys::key, PagedKeys::value, &pk,
						   1.0 / sqrt((double)D), 0, ref.data());
				for (int d = 0; d < D; d++) {
					const float got = o[((size_t)row * H + h) * D + d];
					if (hi < 0)
						bad += got != 0.f;
					else if (std::isnan(got))
						bad++;
					else
						err = std::max(err, fabs(got - ref[d]));
				}
			}
	const bool ok = err < 2e-6 && !bad;
	printf("%s %d - emulate precise f32 path (f32 q, bf16 cache, hd 80, GQA 3, q longer than k): max err %.2g%s\n",
	       ok ? "ok" : "not ok", ++test_no, err, bad ? ", unwritten or non-zero masked rows" : "");
	return ok ? 0 : 1;
}

int main()
{
	int fail = 0;

	printf("1..11\n");
	/* GQA 4, mixed lengths incl. empty, single-token and q longer than k; crosses 64-key tiles. */
	fail += run_case<__nv_bfloat16>("varlen causal", PKV_CUDA_SHAPE_VARLEN, 1, 8, 2, 128, 16,
					{ { 37, 150 }, { 1, 33 }, { 0, 10 }, { 20, 5 } }, -1, 0.f, 1);
	fail += run_case<__half>("varlen split-KV + merge", PKV_CUDA_SHAPE_VARLEN, 2, 3, 1, 64, 32,
				 { { 18, 200 }, { 5, 70 } }, -1, 0.f, 3);
	fail += run_case<__nv_bfloat16>("varlen hd 80 window softcap", PKV_CUDA_SHAPE_VARLEN, 2, 6, 2, 80, 7,
					{ { 30, 140 } }, 40, 10.f, 1);
	fail += run_case<__half>("varlen hd 256 block 1", PKV_CUDA_SHAPE_VARLEN, 1, 2, 2, 256, 1, { { 9, 70 } }, -1,
				 0.f, 1);
	fail += run_case<__nv_bfloat16>("varlen causal, 2 row tiles per warp", PKV_CUDA_SHAPE_VARLEN, 2, 8, 2, 128, 16,
					{ { 37, 150 }, { 1, 33 }, { 0, 10 }, { 20, 5 }, { 70, 70 } }, -1, 0.f, 1);
	fail += run_case<__half>("varlen 1 row tile per warp, window, split", PKV_CUDA_SHAPE_VARLEN, 1, 4, 4, 64, 16,
				 { { 33, 260 } }, 50, 0.f, 2);
	fail += run_case<__nv_bfloat16>("decode GQA 8 splits", PKV_CUDA_SHAPE_DECODE, 1, 16, 2, 128, 16,
					{ { 1, 300 }, { 1, 1 }, { 1, 77 } }, -1, 0.f, 4);
	fail += run_case<__half>("decode GQA 3 no split, 3 stages", PKV_CUDA_SHAPE_DECODE, 2, 6, 2, 64, 128, { { 1, 130 }, { 1, 2 } },
				 -1, 0.f, 1);
	fail += run_case<__nv_bfloat16>("decode hd 256 window", PKV_CUDA_SHAPE_DECODE, 1, 4, 1, 256, 32, { { 1, 100 } }, 20,
					5.f, 2);
	fail += run_case<__half>("decode GQA 20 (two row tiles), 3 stages", PKV_CUDA_SHAPE_DECODE, 2, 20, 1, 64, 16, { { 1, 90 } },
				 -1, 0.f, 2);
	fail += run_precise();
	return fail ? 1 : 0;
}
