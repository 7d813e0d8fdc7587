/* SPDX-License-Identifier: MIT */
/* The prefix table: chained block keys, collision-proof lookup, publication, pinning and flush. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "cache/bounds.h"
#include "cache/cache_int.h"

/* Home slot of a key: keyed, so that clients cannot choose tokens whose keys crowd one probe run. */
static inline uint32_t home_slot(const struct pkv_cache *c, uint64_t lo, uint64_t hi)
{
	return (uint32_t)pkv_keyed_hash128(&c->slot_secret, lo, hi) & c->tab_mask;
}

int32_t pkv_prefix_find(const struct pkv_cache *c, struct pkv_key key)
{
	uint32_t i = home_slot(c, key.lo, key.hi);

	for (;; i = (i + 1) & c->tab_mask) {
		const struct pent *e = &c->tab[i];

		if (e->blk < 0)
			return -1;
		if (e->lo == key.lo && e->hi == key.hi)
			return e->blk;
	}
}

/* The table has room for every block twice over, so a free slot always exists. */
void pkv_prefix_insert(struct pkv_cache *c, struct pkv_key key, int32_t b)
{
	uint32_t i = home_slot(c, key.lo, key.hi);

	while (c->tab[i].blk >= 0)
		i = (i + 1) & c->tab_mask;
	c->tab[i] = (struct pent){ key.lo, key.hi, b, 0 };
	c->n_pub++;
}

void pkv_prefix_remove(struct pkv_cache *c, struct pkv_key key)
{
	uint32_t m = c->tab_mask, i = home_slot(c, key.lo, key.hi), j, home;

	while (c->tab[i].lo != key.lo || c->tab[i].hi != key.hi) {
		if (c->tab[i].blk < 0)
			return;
		i = (i + 1) & m;
	}
	/* Backward shift: pull later entries of the probe run into the hole so lookups never stop early. */
	for (j = i;;) {
		j = (j + 1) & m;
		if (c->tab[j].blk < 0)
			break;
		home = home_slot(c, c->tab[j].lo, c->tab[j].hi);
		if (((j - home) & m) >= ((j - i) & m)) {
			c->tab[i] = c->tab[j];
			i = j;
		}
	}
	c->tab[i].blk = -1;
	c->n_pub--;
}

/*
 * Follows the chain of published blocks matching tokens, at most max_blocks
 * whole blocks. A candidate counts only if its stored tokens, parent key and
 * namespace equal ours: a 128-bit collision then yields a miss, never KV
 * computed for other tokens. Published keys are unique and a published
 * parent outlives its children, so the parent key names one block.
 */
uint32_t pkv_prefix_walk(const struct pkv_cache *c, struct pkv_key ns, const int32_t *tokens,
			 uint32_t max_blocks, int32_t *out)
{
	return pkv_prefix_walk_from(c, ns, ns, tokens, max_blocks, out);
}

uint32_t pkv_prefix_walk_from(const struct pkv_cache *c, struct pkv_key ns, struct pkv_key parent,
			      const int32_t *tokens, uint32_t max_blocks, int32_t *out)
{
	size_t bytes = (size_t)c->bs * sizeof(*tokens);
	uint32_t i;

	for (i = 0; i < max_blocks; i++) {
		const int32_t *t = tokens + (size_t)i * c->bs;
		struct pkv_key key = pkv_block_key(parent, ns, t, c->bs);
		int32_t b = pkv_prefix_find(c, key);
		const struct blk *k;

		if (b < 0)
			break;
		k = &c->blk[b];
		if (!key_eq(k->parent_key, parent) || !key_eq(k->ns, ns) ||
		    memcmp(blk_tok(c, b), t, bytes))
			break;
		out[i] = b;
		parent = key;
	}
	return i;
}

/*
 * Keys (and publishes where allowed) the blocks [from, to) of s that a
 * commit just filled. A block is published only when its parent in s is the
 * published block of the previous key (or it is first), so every published
 * chain is verified end to end; when its key is already published (another
 * sequence got there first, or a collision) it stays private.
 */
void pkv_prefix_publish_new(struct pkv_cache *c, struct seq *s, uint32_t from, uint32_t to)
{
	uint32_t i;

	for (i = from; i < to; i++) {
		int32_t b = s->tab[i], p = i ? s->tab[i - 1] : -1;
		struct pkv_key parent = p >= 0 ? c->blk[p].key : s->ns;
		struct blk *k = &c->blk[b];

		k->key = pkv_block_key(parent, s->ns, blk_tok(c, b), c->bs);
		if (k->published || (p >= 0 && (!c->blk[p].published || c->blk[p].pending)) ||
		    pkv_prefix_find(c, k->key) >= 0)
			continue;
		k->published = 1;
		k->parent = p;
		k->parent_key = parent;
		k->ns = s->ns;
		if (p >= 0)
			c->blk[p].nchild++;
		pkv_prefix_insert(c, k->key, b);
	}
}

static int check_tokens(const struct pkv_cache *c, const int32_t *tokens, uint32_t n_tokens)
{
	if (!tokens && n_tokens)
		return -EINVAL;
	if (n_tokens > c->lim.max_tokens_per_seq)
		return -EINVAL;
	return 0;
}

/*
 * Blocks a walk over n_tokens may match: whole blocks, at most
 * PKV_MAX_OPEN_WALK_TOKENS worth (the walk runs on the daemon's event loop),
 * and never more than the pool holds (a chain cannot; the bound keeps scratch
 * safe even so).
 */
uint32_t pkv_prefix_max_walk(const struct pkv_cache *c, uint32_t n_tokens)
{
	uint32_t n = n_tokens / c->bs, cap = PKV_MAX_OPEN_WALK_TOKENS / c->bs;

	if (n > cap)
		n = cap;
	return n < c->g.num_blocks ? n : c->g.num_blocks;
}

/* Pins (or, with d = -1, unpins) the root path blk[0..n). */
static void pin_path(struct pkv_cache *c, const int32_t *blk, uint32_t n, int d)
{
	for (uint32_t i = 0; i < n; i++) {
		struct blk *k = &c->blk[blk[i]];

		if (i)
			c->blk[blk[i - 1]].pin_child += (uint32_t)d;
		if (d > 0 && k->pin++ == 0) {
			c->n_pinned++;
			if (!k->ref)
				c->n_cached_pinned++;
			pkv_lru_update(c, blk[i]);
		} else if (d < 0 && --k->pin == 0) {
			c->n_pinned--;
			if (!k->ref)
				c->n_cached_pinned--;
			pkv_lru_update(c, blk[i]);
		}
	}
}

int pkv_prefix_pin(struct pkv_cache *c, uint32_t owner, struct pkv_key ns, const int32_t *tokens,
		   uint32_t n_tokens)
{
	uint32_t n, i, fresh = 0, have;
	struct owner *o;
	int32_t *path;
	int err;

	err = check_tokens(c, tokens, n_tokens);
	if (err)
		return err;
	/* The budget follows the owner (a salt buys none); the cap bounds all owners together. */
	o = pkv_owner_find(c, owner);
	have = o ? o->pin_blocks : 0;
	/* One block past what the budget allows tells "over budget": a spent budget makes pins cheap. */
	n = pkv_prefix_max_walk(c, n_tokens);
	if (have < c->lim.pin_budget_blocks && c->lim.pin_budget_blocks - have < n)
		n = c->lim.pin_budget_blocks - have + 1;
	else if (have >= c->lim.pin_budget_blocks && n > 1)
		n = 1;
	n = pkv_prefix_walk(c, ns, tokens, n, c->scratch);
	n = pkv_inflight_trim(c, c->scratch, n);   /* KV still being computed cannot be pinned */
	if (!n)
		return 0;
	for (i = 0; i < n; i++)
		fresh += c->blk[c->scratch[i]].pin == 0;
	if ((uint64_t)have + n > c->lim.pin_budget_blocks ||
	    (uint64_t)c->n_pinned + fresh > c->lim.pin_cap_blocks)
		return -ENOSPC;
	/* A pin holds blocks as surely as a sequence does: it counts against the owner's block limit. */
	if (n > owner_room(c, o))
		return -ENOSPC;
	path = malloc(n * sizeof(*path));
	if (!path)
		return -ENOMEM;
	o = pkv_owner_get(c, owner);
	if (!o)
		goto err_path;
	if (o->n_pins == o->cap_pins) {
		uint32_t cap = o->cap_pins ? 2 * o->cap_pins : 4;
		struct pin_rec *p = realloc(o->pins, cap * sizeof(*p));

		if (!p)
			goto err_owner;
		o->pins = p;
		o->cap_pins = cap;
	}
	memcpy(path, c->scratch, n * sizeof(*path));
	o->pins[o->n_pins++] = (struct pin_rec){ n, path };
	o->pin_blocks += n;
	pin_path(c, path, n, 1);
	return (int)(n * c->bs);

err_owner:
	pkv_owner_maybe_drop(c, owner);
err_path:
	free(path);
	return -ENOMEM;
}

static void pin_drop(struct pkv_cache *c, struct owner *o, uint32_t i)
{
	struct pin_rec *p = &o->pins[i];

	pin_path(c, p->blk, p->n, -1);
	o->pin_blocks -= p->n;
	free(p->blk);
	*p = o->pins[--o->n_pins];
}

int pkv_prefix_unpin(struct pkv_cache *c, uint32_t owner, struct pkv_key ns, const int32_t *tokens,
		     uint32_t n_tokens)
{
	struct owner *o;
	uint32_t n, i, best = UINT32_MAX, best_n = 0;
	int err;

	err = check_tokens(c, tokens, n_tokens);
	if (err)
		return err;
	o = pkv_owner_find(c, owner);
	if (!o || !o->n_pins)
		return -ENOENT;
	/* No deeper than the owner's longest pin: nothing past it can match one. */
	n = 0;
	for (i = 0; i < o->n_pins; i++)
		n = o->pins[i].n > n ? o->pins[i].n : n;
	if (n > pkv_prefix_max_walk(c, n_tokens))
		n = pkv_prefix_max_walk(c, n_tokens);
	n = pkv_prefix_walk(c, ns, tokens, n, c->scratch);
	n = pkv_inflight_trim(c, c->scratch, n);
	/* The owner's deepest pin along this chain. */
	for (i = 0; i < o->n_pins; i++) {
		const struct pin_rec *p = &o->pins[i];

		if (p->n <= n && p->n > best_n && !memcmp(p->blk, c->scratch, p->n * sizeof(*p->blk))) {
			best = i;
			best_n = p->n;
		}
	}
	if (best == UINT32_MAX)
		return -ENOENT;
	pin_drop(c, o, best);
	pkv_owner_maybe_drop(c, owner);
	return (int)(best_n * c->bs);
}

void pkv_prefix_release_pins(struct pkv_cache *c, struct owner *o)
{
	while (o->n_pins)
		pin_drop(c, o, o->n_pins - 1);
}

int pkv_cache_flush(struct pkv_cache *c)
{
	int n = 0;

	/* Evicting a leaf may make its parent evictable: it joins the list and goes too. */
	while (c->n_lru) {
		pkv_blk_evict(c, c->lru_next[c->lru_head]);
		n++;
	}
	return n;
}
