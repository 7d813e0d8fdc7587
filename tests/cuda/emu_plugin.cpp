/* SPDX-License-Identifier: MIT */
/* A host-domain backend plugin that runs the CUDA attention kernel on the CPU emulation: lets pkv-conformance check it without a GPU. */

/*
 * Built by tests/cuda/local.mk; by hand: c++ -std=c++20 -O2 -pthread -shared -fPIC
 *   -Iinclude -Ikernels -Itests/cuda tests/cuda/emu_plugin.cpp -o pkv_cuda_emu.so
 * then: pkv-conformance pkv_cuda_emu.so
 * attend_varlen uses the varlen kernel shape and attend_decode the decode
 * shape, with the plugin's default variants and split counts like the CUDA
 * host code's. Conversions, the K/V append and the copies are done here on
 * the CPU the way util.cu does them on the GPU (one RNE rounding through
 * f32). It is a test vehicle, never installed.
 */
#define PKV_EMULATE 1
#include "attn_kernel.cuh"
#include "emu_launch.h"
#include "attn_precise.cuh"

#include <cerrno>
#include <cstdlib>
#include <vector>

#include <pagedkv/backend.h>

using namespace pkv;

namespace {

float ld(const void *p, size_t i, uint32_t dt)
{
	if (dt == PKV_DTYPE_F32)
		return static_cast<const float *>(p)[i];
	const uint16_t b = static_cast<const uint16_t *>(p)[i];
	return dt == PKV_DTYPE_F16 ? emu_h2f(b) : emu_bf2f(b);
}

void st(void *p, size_t i, uint32_t dt, float v)
{
	if (dt == PKV_DTYPE_F32)
		static_cast<float *>(p)[i] = v;
	else
		static_cast<uint16_t *>(p)[i] = dt == PKV_DTYPE_F16 ? emu_f2h(v) : emu_f2bf(v);
}

int emu_init(const struct pkv_host_api *, const struct pkv_dict *, void **ctx)
{
	if (!ctx)
		return -EINVAL;
	*ctx = malloc(1);
	return *ctx ? 0 : -ENOMEM;
}

void emu_fini(void *ctx)
{
	free(ctx);
}

int emu_cache_alloc(void *, const struct pkv_pool_desc *pool, struct pkv_cache_mem *mem)
{
	const struct pkv_geometry &g = pool->geo;
	if (g.cache_dtype == PKV_DTYPE_F32 || g.head_dim % 16 || g.head_dim > 256 || !g.num_kv_heads)
		return -EINVAL;
	const size_t tok = (size_t)g.num_kv_heads * g.head_dim * 2, blk = tok * g.block_size,
		     layer = blk * g.num_blocks, half = layer * g.num_layers;
	char *p = static_cast<char *>(calloc(2 * half, 1));
	if (!p)
		return -ENOMEM;
	mem->domain = PKV_DOMAIN_HOST;
	mem->geo = g;
	mem->k_base = p;
	mem->v_base = p + half;
	mem->layer_stride = layer;
	mem->block_stride = blk;
	mem->token_stride = tok;
	mem->bytes = 2 * half;
	mem->owner_priv = p;
	return 0;
}

void emu_cache_free(void *, struct pkv_cache_mem *mem)
{
	free(mem->owner_priv);
	mem->owner_priv = nullptr;
}

template <typename T>
void run(const pkv_cuda_attn_args &a, int shape)
{
	const int D = a.head_dim;
	if (shape == PKV_CUDA_SHAPE_DECODE) {
		if (D <= 64)
			emu_launch<T, 64, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES>(a);
		else if (D <= 128)
			emu_launch<T, 128, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES>(a);
		else
			emu_launch<T, 256, PKV_DECODE_WARPS, 1, PKV_DECODE_BN, PKV_DECODE_STAGES>(a);
	} else if (D <= 64) {
		emu_launch<T, 64, PKV_VARLEN_WARPS, 2, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a);
	} else if (D <= 128) {
		emu_launch<T, 128, PKV_VARLEN_WARPS, 2, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a);
	} else {
		emu_launch<T, 256, PKV_VARLEN_WARPS, 1, PKV_VARLEN_BN, PKV_VARLEN_STAGES>(a);
	}
}

int attend(const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b, int shape)
{
	const pkv_geometry &g = mem->geo;
	const int H = (int)g.num_heads, HKV = (int)g.num_kv_heads, D = (int)g.head_dim, T = (int)b->total_q;
	const uint32_t at = b->act_dtype, ct = g.cache_dtype;
	int maxq = 0, maxk = 0;

	if (!T)
		return 0;
	for (uint32_t s = 0; s < b->num_seqs; s++) {
		maxq = std::max(maxq, b->cu_seq_lens_q[s + 1] - b->cu_seq_lens_q[s]);
		maxk = std::max(maxk, b->cu_seq_lens_k[s + 1] - b->cu_seq_lens_k[s]);
	}
	char *kl = static_cast<char *>(mem->k_base) + (size_t)b->layer * mem->layer_stride;
	char *vl = static_cast<char *>(mem->v_base) + (size_t)b->layer * mem->layer_stride;
	/* Append: row r into slot slot_mapping[r]. */
	for (int r = 0; r < T; r++) {
		const int64_t slot = b->slot_mapping[r];
		if (slot < 0)
			continue;
		const size_t off = (size_t)(slot / g.block_size) * mem->block_stride +
				   (size_t)(slot % g.block_size) * mem->token_stride;
		for (int h = 0; h < HKV; h++)
			for (int d = 0; d < D; d++) {
				const size_t src = (size_t)r * b->kv_stride_tok + (size_t)h * b->kv_stride_head + d;
				st(kl + off, (size_t)h * D + d, ct, ld(b->k_new, src, at));
				st(vl + off, (size_t)h * D + d, ct, ld(b->v_new, src, at));
			}
	}
	/* Q in the cache dtype for the MMA kernel, or widened to f32 for the precise one (as cuda_backend.c). */
	const bool precise = pkv_cuda_needs_precise((int)at, (int)ct);
	const uint32_t qt = precise ? (uint32_t)PKV_DTYPE_F32 : ct;
	std::vector<float> q((size_t)T * H * D);
	for (int r = 0; r < T; r++)
		for (int h = 0; h < H; h++)
			for (int d = 0; d < D; d++)
				st(q.data(), ((size_t)r * H + h) * D + d, qt,
				   ld(b->q, (size_t)r * b->q_stride_tok + (size_t)h * b->q_stride_head + d, at));
	/* Split counts in the spirit of pkv_cuda_choose_splits: some splits, two tiles each at least. */
	const int kpt = shape == PKV_CUDA_SHAPE_DECODE ? PKV_DECODE_BN : PKV_VARLEN_BN;
	const int tiles = (maxk + kpt - 1) / kpt;
	const int splits = std::max(1, std::min(shape == PKV_CUDA_SHAPE_DECODE ? 4 : 2, tiles / 2));
	std::vector<float> o((size_t)T * H * D), part((size_t)splits * T * H * D), lse((size_t)splits * T * H);
	pkv_cuda_attn_args a{};
	a.q = q.data();
	a.k_cache = kl;
	a.v_cache = vl;
	a.block_stride = (int64_t)mem->block_stride;
	a.token_stride = (int64_t)mem->token_stride;
	a.cu_seq_lens_q = b->cu_seq_lens_q;
	a.cu_seq_lens_k = b->cu_seq_lens_k;
	a.block_tables = b->block_tables;
	a.max_blocks_per_seq = (int32_t)b->max_blocks_per_seq;
	a.block_size = (int32_t)g.block_size;
	a.num_seqs = (int32_t)b->num_seqs;
	a.total_q = T;
	a.max_length_q = maxq;
	a.max_length_k = maxk;
	a.num_heads = H;
	a.num_kv_heads = HKV;
	a.head_dim = D;
	a.cache_dtype = (int32_t)ct;
	a.scale = b->scale > 0.f ? b->scale : 1.f / sqrtf((float)D);
	a.softcap = b->softcap;
	a.window_left = b->window_left;
	a.num_splits = splits;
	a.o = o.data();
	a.o_part = part.data();
	a.lse_part = lse.data();
	if (precise) {
		a.num_splits = 1;
		const unsigned blocks = (unsigned)(((int64_t)T * H + 3) / 4);
		if (ct == PKV_DTYPE_F16)
			emu_launch_plain(attn_precise_kernel<__half>, a, blocks, 4);
		else
			emu_launch_plain(attn_precise_kernel<__nv_bfloat16>, a, blocks, 4);
	} else {
		if (ct == PKV_DTYPE_F16)
			run<__half>(a, shape);
		else
			run<__nv_bfloat16>(a, shape);
		if (splits > 1)
			emu_merge(a);
	}
	for (int r = 0; r < T; r++)
		for (int h = 0; h < H; h++)
			for (int d = 0; d < D; d++)
				st(b->o, (size_t)r * b->o_stride_tok + (size_t)h * b->o_stride_head + d, at,
				   o[((size_t)r * H + h) * D + d]);
	return 0;
}

int emu_varlen(void *, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b)
{
	return attend(mem, b, PKV_CUDA_SHAPE_VARLEN);
}

int emu_decode(void *, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b)
{
	return attend(mem, b, PKV_CUDA_SHAPE_DECODE);
}

int emu_copy(void *, const struct pkv_cache_mem *mem, const struct pkv_block_copy *c, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < mem->geo.num_layers; l++)
			for (int kv = 0; kv < 2; kv++) {
				char *base = static_cast<char *>(kv ? mem->v_base : mem->k_base) + l * mem->layer_stride;
				memcpy(base + (size_t)c[i].dst * mem->block_stride, base + (size_t)c[i].src * mem->block_stride,
				       mem->block_stride);
			}
	return 0;
}

int emu_sync(void *)
{
	return 0;
}

struct pkv_backend_caps make_caps()
{
	struct pkv_backend_caps caps{};
	caps.abi_version = PKV_BACKEND_ABI_VERSION;
	caps.struct_size = sizeof(caps);
	caps.paths = PKV_PATH_VARLEN | PKV_PATH_DECODE;
	caps.domain = PKV_DOMAIN_HOST;
	caps.cache_dtypes = PKV_DTYPE_BIT(PKV_DTYPE_F16) | PKV_DTYPE_BIT(PKV_DTYPE_BF16);
	caps.act_dtypes = PKV_DTYPE_BIT(PKV_DTYPE_F32) | PKV_DTYPE_BIT(PKV_DTYPE_F16) | PKV_DTYPE_BIT(PKV_DTYPE_BF16);
	caps.head_dim_min = 16;
	caps.head_dim_max = 256;
	caps.head_dim_multiple = 16;
	caps.block_size_min = 1;
	caps.block_size_max = 1u << 16;
	caps.block_size_multiple = 1;
	caps.features = PKV_FEAT_WINDOW | PKV_FEAT_SOFTCAP;
	return caps;
}

const struct pkv_backend_caps emu_caps = make_caps();

struct pkv_backend make_backend()
{
	struct pkv_backend be{};
	be.abi_version = PKV_BACKEND_ABI_VERSION;
	be.struct_size = sizeof(be);
	be.name = "cuda_emu";
	be.description = "the CUDA attention kernel on a CPU emulation (test vehicle)";
	be.caps = &emu_caps;
	be.init = emu_init;
	be.fini = emu_fini;
	be.cache_alloc = emu_cache_alloc;
	be.cache_free = emu_cache_free;
	be.attend_varlen = emu_varlen;
	be.attend_decode = emu_decode;
	be.copy_blocks = emu_copy;
	be.sync = emu_sync;
	return be;
}

const struct pkv_backend emu_backend = make_backend();

} /* namespace */

extern "C" PKV_BACKEND_EXPORT int pkv_backend_enum(uint32_t index, const struct pkv_backend **out)
{
	if (!out)
		return -EINVAL;
	if (index)
		return -ENOENT;
	*out = &emu_backend;
	return 0;
}
