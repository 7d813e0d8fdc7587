/* SPDX-License-Identifier: MIT */
/* Hooks for a tier below RAM: the eviction callback, a reference-free lookup, adopting blocks read back. */
#include <errno.h>
#include "cache/cache_int.h"

void pkv_cache_set_evict_hook(struct pkv_cache *c, pkv_evict_fn fn, void *ud)
{
	c->evict_fn = fn;
	c->evict_ud = ud;
}

struct pkv_key pkv_cache_block_key(struct pkv_key parent, struct pkv_key ns, const int32_t *tokens,
				   uint32_t block_size)
{
	return pkv_block_key(parent, ns, tokens, block_size);
}

uint32_t pkv_cache_lookup(const struct pkv_cache *c, struct pkv_key ns, const int32_t *tokens,
			  uint32_t n_tokens, struct pkv_key *last)
{
	uint32_t max_blk = n_tokens ? (n_tokens - 1) / c->bs : 0, n;

	if (max_blk > c->g.num_blocks)
		max_blk = c->g.num_blocks;
	if (!tokens || n_tokens > c->lim.max_tokens_per_seq)
		max_blk = 0;
	n = pkv_prefix_walk(c, ns, tokens, max_blk, c->scratch);
	if (last)
		*last = n ? c->blk[c->scratch[n - 1]].key : ns;
	return n;
}

int pkv_cache_adopt(struct pkv_cache *c, struct pkv_key ns, struct pkv_key parent, const int32_t *tokens,
		    int32_t *blk)
{
	struct pkv_key key = pkv_block_key(parent, ns, tokens, c->bs);
	int32_t p = -1, b;
	struct blk *k;

	if (!key_eq(parent, ns)) {
		p = pkv_prefix_find(c, parent);
		/* A pending parent may be withdrawn: nothing is published under it (as in publish_new). */
		if (p < 0 || !c->blk[p].published || c->blk[p].pending)
			return -ENOENT;
	}
	if (pkv_prefix_find(c, key) >= 0)
		return -EEXIST;
	/* The parent may itself be evictable: hold it so the allocation cannot take it. */
	if (p >= 0)
		pkv_blk_incref(c, p);
	if (pkv_blk_available(c) == 0 || (b = pkv_blk_alloc(c)) < 0) {
		if (p >= 0)
			pkv_blk_decref(c, p);
		return -ENOSPC;
	}
	k = &c->blk[b];
	memcpy(blk_tok(c, b), tokens, (size_t)c->bs * sizeof(*tokens));
	k->key = key;
	k->published = 1;
	k->parent = p;
	k->parent_key = parent;
	k->ns = ns;
	if (p >= 0) {
		c->blk[p].nchild++;
		pkv_blk_decref(c, p);
	}
	pkv_prefix_insert(c, key, b);
	*blk = b;
	return 0;
}

void pkv_cache_adopt_end(struct pkv_cache *c, int32_t blk)
{
	pkv_blk_decref(c, blk);
}

uint32_t pkv_cache_lru_oldest(const struct pkv_cache *c, uint32_t n, int32_t *blks, struct pkv_evict_info *info)
{
	uint32_t i = 0;

	for (int32_t b = c->lru_next[c->lru_head]; b != c->lru_head && i < n; b = c->lru_next[b], i++) {
		const struct blk *k = &c->blk[b];

		blks[i] = b;
		info[i] = (struct pkv_evict_info){ k->key, k->parent_key, k->ns, blk_tok(c, b) };
	}
	return i;
}
