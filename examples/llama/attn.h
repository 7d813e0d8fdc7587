/* SPDX-License-Identifier: MIT */
/* The attention/KV interface the model runs on: the libpagedkv call set, with two implementations —
 * pagedkvd through libpagedkv, and an in-process contiguous-KV reference. */
#ifndef PKV_EX_ATTN_H
#define PKV_EX_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include <pagedkv/pagedkv.h>
#include <pagedkv/types.h>

#include "threadpool.h"

struct pkv_attn_ops {
	int (*seq_open)(void *ctx, const int32_t *tokens, uint32_t n, uint32_t *seq, uint32_t *n_cached);
	int (*seq_fork)(void *ctx, uint32_t seq, uint32_t *child);
	int (*seq_truncate)(void *ctx, uint32_t seq, uint32_t n);
	int (*seq_close)(void *ctx, uint32_t seq);
	int (*step_begin)(void *ctx, const uint32_t *seqs, const uint32_t *n_new, const int32_t *tokens,
			  uint32_t n_seqs);
	/* Q, O [total_q][num_heads][head_dim], K, V [total_q][num_kv_heads][head_dim], f32. */
	int (*attend)(void *ctx, uint32_t layer, const float *q, const float *k, const float *v, float *o);
	int (*step_end)(void *ctx);
	int (*step_abort)(void *ctx);
	/* Tensor memory the attention side can read (the shared arena for the daemon). */
	void *(*alloc)(void *ctx, size_t bytes);
	void (*free)(void *ctx, void *p);
	int (*stats)(void *ctx, struct pkv_stats *st);
	void (*destroy)(void *ctx);
	/* The sequence a step_begin refused with -EAGAIN/-ESTALE (in-flight prefix sharing); may be NULL. */
	uint32_t (*blocked_seq)(void *ctx);
};

struct pkv_attn {
	const struct pkv_attn_ops *ops;
	void *ctx;
	const char *name;
	int remote; /* attention runs in another process: idle our threads while waiting */
	uint32_t block_size; /* tokens per block: prefixes are shared in whole blocks */
};

/*
 * The contiguous reference: each sequence keeps its own K/V arrays, attention is the plain
 * DESIGN §3 formula in f32. It also keeps closed sequences (up to capacity_tokens in total) and
 * serves prefix hits from them, rounded down to block_size like the daemon, so programs behave the
 * same without a daemon. capacity_tokens bounds live tokens too (-ENOSPC beyond it); 0 = unlimited.
 */
int pkv_attn_ref_create(const struct pkv_geometry *geo, uint64_t capacity_tokens, struct tpool *tp,
			struct pkv_attn *out);

/* pagedkvd through libpagedkv: connects, attaches pool p (act dtype f32). */
int pkv_attn_daemon_create(const struct pkv_connect_opts *co, const struct pkv_pool_params *p,
			   struct pkv_attn *out, char *err, size_t errlen);

static inline void pkv_attn_destroy(struct pkv_attn *a)
{
	if (a->ops)
		a->ops->destroy(a->ctx);
	a->ops = NULL;
}

#endif
