/* SPDX-License-Identifier: MIT */
/* C entry points of the CUDA kernels (launchers), shared by the two CUDA plugins, the self-test and the bench. */
#ifndef PKV_CUDA_KERNELS_H
#define PKV_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Every launcher enqueues work on `stream` (a cudaStream_t) and returns 0 or
 * a cudaError_t value (never aborts); the caller turns it into -EIO with the
 * CUDA error string. All pointers are device pointers.
 */

/*
 * One attention call over packed device tensors:
 *   q      [total_q][num_heads][head_dim] of the cache dtype
 *   o      [total_q][num_heads][head_dim] f32 (final output)
 * K/V are read from the paged cache of one layer through block tables.
 * Query rows of one KV head (its GQA group) are processed together so each
 * K/V byte is loaded once per group.
 */
struct pkv_cuda_attn_args {
	const void *q;
	const void *k_cache;          /* this layer's K base */
	const void *v_cache;          /* this layer's V base */
	int64_t block_stride;         /* bytes */
	int64_t token_stride;         /* bytes */
	const int32_t *cu_seq_lens_q; /* [num_seqs + 1] */
	const int32_t *cu_seq_lens_k; /* [num_seqs + 1] */
	const int32_t *block_tables;  /* [num_seqs][max_blocks_per_seq] */
	int32_t max_blocks_per_seq;
	int32_t block_size;
	int32_t num_seqs;
	int32_t total_q;
	int32_t max_length_q;         /* true maximum over the batch */
	int32_t max_length_k;
	int32_t num_heads, num_kv_heads, head_dim;
	int32_t cache_dtype;          /* PKV_DTYPE_F16 or PKV_DTYPE_BF16 */
	float scale;                  /* > 0 */
	float softcap;                /* 0 = off */
	int32_t window_left;          /* < 0 = unbounded */
	int32_t num_splits;           /* 1 = write o directly */
	float *o;
	float *o_part;                /* [num_splits][total_q][num_heads][head_dim] when num_splits > 1 */
	float *lse_part;              /* [num_splits][total_q][num_heads] (log2 domain) */
	int32_t variant;              /* 0 = default; varlen: 1 = 64-row, 2 = 128-row CTAs (hd <= 128);
				       * decode: 1 = 4 x 32-key stages, 2 = 3 stages (4 CTAs per SM) */
};

/* Kernel shapes: the prefill-oriented tile (64 query rows, 4 warps) or the decode one (16 rows, 1 warp). */
enum pkv_cuda_shape {
	PKV_CUDA_SHAPE_VARLEN = 0,
	PKV_CUDA_SHAPE_DECODE = 1
};

/* Head dims served: multiples of 16 in [16, 256]. */
int pkv_cuda_head_dim_ok(int head_dim);

/* Query rows (token x GQA head) one CTA of a shape serves at this head dim. */
int pkv_cuda_rows_per_cta(int shape, int head_dim);
/* Keys per tile of a shape (split-KV boundaries are multiples of it). */
int pkv_cuda_keys_per_tile(int shape);

int pkv_cuda_attention(const struct pkv_cuda_attn_args *a, int shape, void *stream);

/*
 * The f32 path, for activations more precise than the cache (f32 with any
 * cache, f16 with bf16): a->q is [total_q][num_heads][head_dim] f32, no
 * splits, output in a->o. See attn_precise.cuh for why it exists.
 */
int pkv_cuda_attention_precise(const struct pkv_cuda_attn_args *a, void *stream);

/* Whether a dtype pair needs the f32 path (the activation dtype is more precise than the cache's). */
static inline int pkv_cuda_needs_precise(int act_dtype, int cache_dtype)
{
	return act_dtype == 0 /* f32 */ || (act_dtype == 1 /* f16 */ && cache_dtype == 2 /* bf16 */);
}

/* Combines split-KV partials into a->o with a log-sum-exp merge. */
int pkv_cuda_merge_splits(const struct pkv_cuda_attn_args *a, void *stream);

/*
 * Writes row r of k_new/v_new ([rows][num_kv_heads][head_dim], act dtype,
 * packed) into slot slot_mapping[r] of the layer's cache (cache dtype,
 * round-to-nearest-even); negative slots are skipped.
 */
int pkv_cuda_append_kv(const void *k_new, const void *v_new, int act_dtype,
		       void *k_cache, void *v_cache, int cache_dtype,
		       int64_t block_stride, int64_t token_stride, int32_t block_size,
		       const int64_t *slot_mapping, int32_t rows, int32_t row_elems, void *stream);

/* dst[i] = (dst dtype) src[i] for n elements, round-to-nearest-even. */
int pkv_cuda_convert(const void *src, int src_dtype, void *dst, int dst_dtype, int64_t n, void *stream);

/*
 * Copy-on-write: for each pair and each layer, copies block src to block dst
 * in K and in V. `pairs` holds n (src, dst) int32 pairs; bytes_per_block is a
 * multiple of 16.
 */
int pkv_cuda_copy_blocks(void *k_base, void *v_base, int64_t layer_stride, int32_t num_layers,
			 int64_t block_stride, const int32_t *pairs, int32_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
