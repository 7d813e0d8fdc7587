/* SPDX-License-Identifier: MIT */
/* The block pool: geometry validation, creation, O(1) block alloc/free with refcounts, and the LRU. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "cache/bounds.h"
#include "cache/cache_int.h"

static int why_fail(char *why, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (why && len) {
		va_start(ap, fmt);
		vsnprintf(why, len, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

int pkv_geometry_check(const struct pkv_geometry *g, char *why, size_t why_len)
{
	unsigned __int128 bytes;

	if (!g)
		return why_fail(why, why_len, "no geometry");
	if (!g->num_layers || g->num_layers > PKV_MAX_LAYERS)
		return why_fail(why, why_len, "num_layers %u not in 1..%u", g->num_layers, PKV_MAX_LAYERS);
	if (!g->num_heads || g->num_heads > PKV_MAX_HEADS)
		return why_fail(why, why_len, "num_heads %u not in 1..%u", g->num_heads, PKV_MAX_HEADS);
	if (!g->num_kv_heads || g->num_kv_heads > g->num_heads)
		return why_fail(why, why_len, "num_kv_heads %u not in 1..num_heads (%u)",
				g->num_kv_heads, g->num_heads);
	if (g->num_heads % g->num_kv_heads)
		return why_fail(why, why_len, "num_kv_heads %u does not divide num_heads %u",
				g->num_kv_heads, g->num_heads);
	if (!g->head_dim || g->head_dim > PKV_MAX_HEAD_DIM)
		return why_fail(why, why_len, "head_dim %u not in 1..%u", g->head_dim, PKV_MAX_HEAD_DIM);
	if (g->cache_dtype >= PKV_DTYPE_COUNT)
		return why_fail(why, why_len, "cache_dtype %u is not f32, f16 or bf16", g->cache_dtype);
	if (!g->block_size || g->block_size > PKV_MAX_BLOCK_SIZE)
		return why_fail(why, why_len, "block_size %u not in 1..%u", g->block_size, PKV_MAX_BLOCK_SIZE);
	if (!g->num_blocks || g->num_blocks > PKV_MAX_NUM_BLOCKS)
		return why_fail(why, why_len, "num_blocks %u not in 1..%u", g->num_blocks, PKV_MAX_NUM_BLOCKS);
	/* K and V, every layer: computed in 128 bits so no product can wrap. */
	bytes = (unsigned __int128)2 * g->num_layers * g->num_kv_heads * g->head_dim *
		pkv_dtype_size(g->cache_dtype) * g->block_size * g->num_blocks;
	if (bytes > PKV_MAX_POOL_BYTES)
		return why_fail(why, why_len, "pool of %llu GiB exceeds %llu GiB",
				(unsigned long long)(bytes >> 30), PKV_MAX_POOL_BYTES >> 30);
	if ((uint64_t)g->num_heads * g->head_dim > PKV_MAX_ROW_WIDTH)
		return why_fail(why, why_len, "num_heads x head_dim = %llu exceeds %u",
				(unsigned long long)g->num_heads * g->head_dim, PKV_MAX_ROW_WIDTH);
	if ((uint64_t)2 * g->block_size * g->num_kv_heads * g->head_dim * pkv_dtype_size(g->cache_dtype) >
	    PKV_MAX_BLOCK_LAYER_BYTES)
		return why_fail(why, why_len, "one block of one layer (K and V) exceeds %u MiB",
				PKV_MAX_BLOCK_LAYER_BYTES >> 20);
	if (why && why_len)
		why[0] = '\0';
	return 0;
}

const struct pkv_geometry *pkv_cache_geometry(const struct pkv_cache *c)
{
	return &c->g;
}

struct pkv_key pkv_namespace(uint64_t model_id, const struct pkv_geometry *g, uint32_t uid,
			     const void *salt, size_t salt_len)
{
	XXH3_state_t st;
	XXH128_hash_t h;
	uint64_t hdr[3] = { model_id, uid, salt ? salt_len : 0 };
	struct pkv_geometry zero = { 0 };

	/* The salt length is hashed too, so (salt "ab") and (salt "a", "b"...) cannot meet. */
	XXH3_128bits_reset(&st);
	XXH3_128bits_update(&st, hdr, sizeof(hdr));
	XXH3_128bits_update(&st, g ? g : &zero, sizeof(*g));
	if (salt && salt_len)
		XXH3_128bits_update(&st, salt, salt_len);
	h = XXH3_128bits_digest(&st);
	return (struct pkv_key){ h.low64, h.high64 };
}

static uint32_t prefix_table_cap(uint32_t num_blocks)
{
	uint32_t cap;

	for (cap = 16; cap < 2 * num_blocks; cap <<= 1)
		;
	return cap;
}

uint64_t pkv_cache_footprint(const struct pkv_geometry *g)
{
	uint64_t n;

	if (pkv_geometry_check(g, NULL, 0))
		return 0;
	n = g->num_blocks;
	/* What pkv_cache_create allocates, array by array (num_blocks <= 2^26: no wrap). */
	return sizeof(struct pkv_cache) + n * sizeof(struct blk) + n * g->block_size * sizeof(int32_t) +
	       n * sizeof(int32_t) * 2 /* free stack, scratch */ + (n + 1) * sizeof(int32_t) * 2 /* lru */ +
	       (uint64_t)prefix_table_cap(g->num_blocks) * sizeof(struct pent) + 16 * sizeof(struct owner);
}

int pkv_cache_create(const struct pkv_geometry *g, const struct pkv_cache_limits *lim,
		     struct pkv_cache **out)
{
	struct pkv_cache *c;
	uint32_t n, i, cap;
	int err;

	if (!out)
		return -EINVAL;
	*out = NULL;
	err = pkv_geometry_check(g, NULL, 0);
	if (err)
		return err;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->g = *g;
	c->bs = g->block_size;
	n = g->num_blocks;
	if (lim)
		c->lim = *lim;
	if (!c->lim.max_seqs)
		c->lim.max_seqs = 65536;
	if (!c->lim.max_tokens_per_seq)
		c->lim.max_tokens_per_seq = 1u << 20;
	if (!c->lim.pin_budget_blocks)
		c->lim.pin_budget_blocks = n / 4 ? n / 4 : 1;
	if (!c->lim.pin_cap_blocks)
		c->lim.pin_cap_blocks = n / 2 ? n / 2 : 1;
	if (!c->lim.inflight_lapse_ms)
		c->lim.inflight_lapse_ms = 2000;
	if (!c->lim.max_refs_per_owner)   /* n <= 2^26: no wrap */
		c->lim.max_refs_per_owner = PKV_OWNER_REFS_PER_BLOCK * n;
	err = -EINVAL;
	if (c->lim.max_seqs > PKV_MAX_SEQS_LIMIT || c->lim.max_tokens_per_seq > PKV_MAX_TOKENS_LIMIT)
		goto err_free;
	while ((1u << c->idx_bits) < c->lim.max_seqs)
		c->idx_bits++;

	err = -ENOMEM;
	c->blk = calloc(n, sizeof(*c->blk));
	c->tok = calloc((size_t)n * c->bs, sizeof(*c->tok));
	c->free_stk = malloc(n * sizeof(*c->free_stk));
	c->lru_prev = malloc((n + 1) * sizeof(int32_t));
	c->lru_next = malloc((n + 1) * sizeof(int32_t));
	c->scratch = malloc(n * sizeof(*c->scratch));
	cap = prefix_table_cap(n);
	c->tab = malloc(cap * sizeof(*c->tab));
	c->own = calloc(16, sizeof(*c->own));
	if (!c->blk || !c->tok || !c->free_stk || !c->lru_prev || !c->lru_next || !c->scratch ||
	    !c->tab || !c->own)
		goto err_free;
	c->tab_mask = cap - 1;
	pkv_hash_secret_init(&c->slot_secret);
	for (i = 0; i < cap; i++)
		c->tab[i].blk = -1;
	c->own_mask = 15;
	/* Lowest ids are handed out first: easier to read in tests and dumps. */
	for (i = 0; i < n; i++) {
		c->blk[i].parent = -1;
		c->blk[i].producer = -1;
		c->free_stk[i] = (int32_t)(n - 1 - i);
	}
	c->n_free = n;
	c->lru_head = (int32_t)n;
	c->lru_prev[n] = c->lru_next[n] = (int32_t)n;
	*out = c;
	return 0;

err_free:
	pkv_cache_destroy(c);
	return err;
}

void pkv_cache_destroy(struct pkv_cache *c)
{
	struct pkv_step *s, *nx;
	uint32_t i;

	if (!c)
		return;
	for (i = 0; i < c->n_seq_slots; i++)
		free(c->seqs[i].tab);
	for (int l = 0; l < 2; l++)
		for (s = l ? c->steps_free : c->steps_open; s; s = nx) {
			nx = s->next;
			free(s->reqs);
			free(s->cu_q);
			free(s->cu_k);
			free(s->cache_seqlens);
			free(s->bt);
			free(s->slots);
			free(s->copies);
			free(s);
		}
	free(c->seqs);
	free(c->seq_free);
	/* Only used entries: a slot vacated by deletion may still hold a moved entry's pointers. */
	for (i = 0; c->own && i <= c->own_mask; i++) {
		if (!c->own[i].used)
			continue;
		for (uint32_t j = 0; j < c->own[i].n_pins; j++)
			free(c->own[i].pins[j].blk);
		free(c->own[i].pins);
	}
	free(c->own);
	free(c->blk);
	free(c->tok);
	free(c->free_stk);
	free(c->lru_prev);
	free(c->lru_next);
	free(c->scratch);
	free(c->tab);
	free(c);
}

static void lru_unlink(struct pkv_cache *c, int32_t b)
{
	int32_t p = c->lru_prev[b], nx = c->lru_next[b];

	c->lru_next[p] = nx;
	c->lru_prev[nx] = p;
	c->blk[b].in_lru = 0;
	c->n_lru--;
}

/* Keeps "in the LRU" equal to "evictable now"; new entries go to the most recent end. */
void pkv_lru_update(struct pkv_cache *c, int32_t b)
{
	struct blk *k = &c->blk[b];
	int32_t h = c->lru_head;

	if (blk_evictable(k) == (bool)k->in_lru)
		return;
	if (k->in_lru) {
		lru_unlink(c, b);
		return;
	}
	c->lru_prev[b] = c->lru_prev[h];
	c->lru_next[b] = h;
	c->lru_next[c->lru_prev[h]] = b;
	c->lru_prev[h] = b;
	k->in_lru = 1;
	c->n_lru++;
}

/*
 * Every cached, unpinned block can be reclaimed: a block in use keeps its
 * parent in use (a block table holds whole chains) and a pinned block keeps
 * its parent pinned (pins are root paths), so the descendants of such a
 * block are all cached and unpinned, and evicting leaves first reaches it.
 */
uint32_t pkv_blk_available(const struct pkv_cache *c)
{
	return c->n_free + c->n_cached - c->n_cached_pinned;
}

/* Drops a cached block from the prefix table; its parent may become evictable. */
void pkv_blk_evict(struct pkv_cache *c, int32_t b)
{
	struct blk *k = &c->blk[b];

	if (c->evict_fn)
		c->evict_fn(c->evict_ud, b, &(struct pkv_evict_info){ k->key, k->parent_key, k->ns,
								     blk_tok(c, b) });
	if (k->in_lru)
		lru_unlink(c, b);
	pkv_prefix_remove(c, k->key);
	k->published = 0;
	c->n_cached--;
	if (k->parent >= 0) {
		c->blk[k->parent].nchild--;
		pkv_lru_update(c, k->parent);
	}
	k->parent = -1;
	c->free_stk[c->n_free++] = b;
}

/* Takes a free block, else evicts the least recently used one. Caller checked availability. */
int32_t pkv_blk_alloc(struct pkv_cache *c)
{
	int32_t b;

	if (!c->n_free) {
		if (!c->n_lru)
			return -1;
		c->evictions++;
		pkv_blk_evict(c, c->lru_next[c->lru_head]);
	}
	b = c->free_stk[--c->n_free];
	c->blk[b].ref = 1;
	return b;
}

void pkv_blk_incref(struct pkv_cache *c, int32_t b)
{
	struct blk *k = &c->blk[b];

	if (k->ref++ == 0) {
		c->n_cached--;
		if (k->pin)
			c->n_cached_pinned--;
		if (k->in_lru)
			lru_unlink(c, b);
	}
}

void pkv_blk_decref(struct pkv_cache *c, int32_t b)
{
	struct blk *k = &c->blk[b];

	if (--k->ref)
		return;
	if (!k->published) {
		c->free_stk[c->n_free++] = b;
		return;
	}
	c->n_cached++;
	if (k->pin)
		c->n_cached_pinned++;
	pkv_lru_update(c, b);
}

void pkv_cache_stats(const struct pkv_cache *c, struct pkv_cache_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->num_blocks = c->g.num_blocks;
	st->free_blocks = c->n_free;
	st->cached_blocks = c->n_cached;
	st->in_use_blocks = c->g.num_blocks - c->n_free - c->n_cached;
	st->pinned_blocks = c->n_pinned;
	st->open_seqs = c->n_open_seqs;
	st->open_steps = c->n_steps_open;
	st->lookup_tokens = c->lookup_tokens;
	st->hit_tokens = c->hit_tokens;
	st->evictions = c->evictions;
	st->cow_copies = c->cow_copies;
	st->inflight_hit_tokens = c->inflight_hit_tokens;
	st->claimed_blocks = c->claimed_blocks;
	st->withdrawn_blocks = c->withdrawn_blocks;
	st->lapsed_claims = c->lapsed_claims;
}
