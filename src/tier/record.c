/* SPDX-License-Identifier: MIT */
/* Tier records: fingerprints, the record layout, sealing a record and verifying one before it is served. */
#include "config.h"
#include <errno.h>
#include <string.h>
#include <pagedkv/types.h>
#include "tier/tier_int.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* A record is at most this big: larger blocks are a misconfiguration, not a workload. */
#define TIER_REC_MAX (256u << 20)

void pkv_tier_fp_of(const struct pkv_geometry *g, uint64_t model_id, struct pkv_tier_fp *fp)
{
	memset(fp, 0, sizeof(*fp));
	fp->model_id = model_id;
	fp->num_layers = g->num_layers;
	fp->num_kv_heads = g->num_kv_heads;
	fp->head_dim = g->head_dim;
	fp->cache_dtype = g->cache_dtype;
	fp->block_size = g->block_size;
}

uint64_t pkv_tier_kv_bytes(const struct pkv_tier_fp *fp)
{
	unsigned __int128 b;

	if (fp->cache_dtype >= PKV_DTYPE_COUNT)
		return 0;
	b = (unsigned __int128)2 * fp->num_layers * fp->block_size * fp->num_kv_heads * fp->head_dim *
	    pkv_dtype_size(fp->cache_dtype);
	return b > TIER_REC_MAX ? 0 : (uint64_t)b;
}

uint64_t pkv_tier_fp_hash(const struct pkv_tier_fp *fp)
{
	return XXH3_64bits(fp, sizeof(*fp));
}

int pkv_tier_layout(const struct pkv_tier_fp *fp, struct tier_layout *l)
{
	uint64_t kv = pkv_tier_kv_bytes(fp), off, used;

	if (!kv || !fp->block_size || fp->block_size > 4096)
		return -EINVAL;
	/* KV starts 64-byte aligned so the copies in and out run on aligned rows. */
	off = (TIER_REC_HDR + (uint64_t)fp->block_size * sizeof(int32_t) + 63) & ~63ull;
	used = off + kv;
	l->kv_off = (uint32_t)off;
	l->kv_bytes = (uint32_t)kv;
	l->used = (uint32_t)used;
	l->rec_size = (uint32_t)((used + TIER_ALIGN - 1) & ~(uint64_t)(TIER_ALIGN - 1));
	return 0;
}

static uint64_t rec_sum(const void *rec, uint32_t used)
{
	return XXH3_64bits((const uint8_t *)rec + 16, used - 16);
}

void pkv_tier_rec_seal(void *rec, const struct tier_layout *l, const struct pkv_tier_fp *fp,
		       const struct pkv_tier_block *b, uint64_t stamp)
{
	struct tier_rec_hdr *h = rec;

	memset(h, 0, TIER_REC_HDR);
	h->magic = TIER_REC_MAGIC;
	h->version = TIER_REC_VERSION;
	h->used = l->used;
	h->uid = b->uid;
	h->n_tokens = fp->block_size;
	h->key = b->key;
	h->parent = b->parent;
	h->ns = b->ns;
	h->fp = *fp;
	h->fp_hash = pkv_tier_fp_hash(fp);
	h->kv_off = l->kv_off;
	h->kv_bytes = l->kv_bytes;
	h->stamp = stamp;
	/* The gap between tokens and KV, and the tail padding, hold no stale bytes. */
	memset((uint8_t *)rec + TIER_REC_HDR + (size_t)fp->block_size * 4, 0,
	       l->kv_off - TIER_REC_HDR - (size_t)fp->block_size * 4);
	memset((uint8_t *)rec + l->used, 0, l->rec_size - l->used);
	h->sum = rec_sum(rec, l->used);
}

static int key_same(struct pkv_key a, struct pkv_key b)
{
	return a.lo == b.lo && a.hi == b.hi;
}

int pkv_tier_rec_check_self(const void *rec, const struct tier_layout *l, const struct pkv_tier_fp *fp,
			    struct pkv_key key)
{
	const struct tier_rec_hdr *h = rec;

	if (h->magic != TIER_REC_MAGIC || h->version != TIER_REC_VERSION || h->used != l->used ||
	    h->n_tokens != fp->block_size || h->kv_off != l->kv_off || h->kv_bytes != l->kv_bytes ||
	    memcmp(&h->fp, fp, sizeof(*fp)) || !key_same(h->key, key) || h->sum != rec_sum(rec, l->used))
		return -EBADMSG;
	return 0;
}

int pkv_tier_rec_check(const void *rec, const struct tier_layout *l, const struct pkv_tier_fp *fp,
		       struct pkv_key key, struct pkv_key parent, struct pkv_key ns, const int32_t *tokens)
{
	const struct tier_rec_hdr *h = rec;

	/* Cheap field checks first; the checksum then covers every byte including the KV. */
	if (h->magic != TIER_REC_MAGIC || h->version != TIER_REC_VERSION || h->used != l->used ||
	    h->n_tokens != fp->block_size || h->kv_off != l->kv_off || h->kv_bytes != l->kv_bytes)
		return -EBADMSG;
	if (memcmp(&h->fp, fp, sizeof(*fp)) || !key_same(h->key, key) || !key_same(h->parent, parent) ||
	    !key_same(h->ns, ns))
		return -EBADMSG;
	if (memcmp((const uint8_t *)rec + TIER_REC_HDR, tokens, (size_t)fp->block_size * sizeof(*tokens)))
		return -EBADMSG;
	if (h->sum != rec_sum(rec, l->used))
		return -EBADMSG;
	return 0;
}
