/* SPDX-License-Identifier: MIT */
/* Sequences and their owners: open with prefix match, fork, truncate, close, per-owner limits. */
#include <errno.h>
#include <stdlib.h>
#include "cache/cache_int.h"

/* ---- owners: open addressing on the owner id, backward-shift deletion ---- */

static uint32_t own_hash(uint32_t id)
{
	return id * 0x9e3779b1u;
}

struct owner *pkv_owner_find(const struct pkv_cache *c, uint32_t id)
{
	uint32_t i = own_hash(id) & c->own_mask;

	for (; c->own[i].used; i = (i + 1) & c->own_mask)
		if (c->own[i].id == id)
			return &c->own[i];
	return NULL;
}

static int own_grow(struct pkv_cache *c)
{
	uint32_t cap = 2 * (c->own_mask + 1), i, j;
	struct owner *o = calloc(cap, sizeof(*o));

	if (!o)
		return -ENOMEM;
	for (i = 0; i <= c->own_mask; i++) {
		if (!c->own[i].used)
			continue;
		for (j = own_hash(c->own[i].id) & (cap - 1); o[j].used; j = (j + 1) & (cap - 1))
			;
		o[j] = c->own[i];
	}
	free(c->own);
	c->own = o;
	c->own_mask = cap - 1;
	return 0;
}

/* Finds or creates the owner's entry; NULL only when memory runs out. */
struct owner *pkv_owner_get(struct pkv_cache *c, uint32_t id)
{
	struct owner *o = pkv_owner_find(c, id);
	uint32_t i;

	if (o)
		return o;
	if (2 * (c->n_own + 1) > c->own_mask + 1 && own_grow(c))
		return NULL;
	for (i = own_hash(id) & c->own_mask; c->own[i].used; i = (i + 1) & c->own_mask)
		;
	o = &c->own[i];
	memset(o, 0, sizeof(*o));
	o->used = 1;
	o->id = id;
	o->seq_head = -1;
	c->n_own++;
	return o;
}

/* Forgets an owner that holds nothing and has no limits, so connection churn does not grow the map. */
void pkv_owner_maybe_drop(struct pkv_cache *c, uint32_t id)
{
	struct owner *o = pkv_owner_find(c, id);
	uint32_t m = c->own_mask, i, j, home;

	if (!o || o->nseqs || o->nsteps || o->max_seqs || o->max_blocks || o->n_pins)
		return;
	free(o->pins);
	i = (uint32_t)(o - c->own);
	for (j = i;;) {
		j = (j + 1) & m;
		if (!c->own[j].used)
			break;
		home = own_hash(c->own[j].id) & m;
		if (((j - home) & m) >= ((j - i) & m)) {
			c->own[i] = c->own[j];
			i = j;
		}
	}
	c->own[i].used = 0;
	c->n_own--;
}

int pkv_cache_set_owner_limits(struct pkv_cache *c, uint32_t owner, uint32_t max_seqs,
			       uint32_t max_blocks)
{
	struct owner *o = pkv_owner_get(c, owner);

	if (!o)
		return -ENOMEM;
	o->max_seqs = max_seqs;
	o->max_blocks = max_blocks;
	pkv_owner_maybe_drop(c, owner);
	return 0;
}

void pkv_cache_owner_usage(const struct pkv_cache *c, uint32_t owner, struct pkv_owner_usage *u)
{
	const struct owner *o = pkv_owner_find(c, owner);

	memset(u, 0, sizeof(*u));
	if (!o)
		return;
	u->seqs = o->nseqs;
	u->blocks = o->nblocks;
	u->pin_blocks = o->pin_blocks;
	u->steps = o->nsteps;
	u->max_seqs = o->max_seqs;
	u->max_blocks = o->max_blocks;
	u->block_cap = (uint32_t)owner_block_cap(c, o);
}

static bool owner_over(const struct pkv_cache *c, const struct owner *o, uint32_t more_seqs,
		       uint64_t more_blocks)
{
	if (!o)
		return more_blocks > c->lim.max_refs_per_owner;
	if (more_seqs && o->max_seqs && (uint64_t)o->nseqs + more_seqs > o->max_seqs)
		return true;
	/* Pinned blocks count too: pins and references share one block limit. */
	if (more_blocks > owner_room(c, o))
		return true;
	return false;
}

/* ---- sequence slots ---- */

struct seq *pkv_seq_get(const struct pkv_cache *c, uint32_t owner, uint32_t handle)
{
	uint32_t idx = handle & ((1u << c->idx_bits) - 1);
	struct seq *s;

	if (idx >= c->n_seq_slots)
		return NULL;
	s = &c->seqs[idx];
	if (!s->open || s->owner != owner || (s->gen & (UINT32_MAX >> c->idx_bits)) !=
	    (c->idx_bits == 32 ? 0 : handle >> c->idx_bits))
		return NULL;
	return s;
}

uint32_t pkv_seq_handle(const struct pkv_cache *c, const struct seq *s)
{
	uint32_t idx = (uint32_t)(s - c->seqs);

	return idx | ((s->gen & (UINT32_MAX >> c->idx_bits)) << c->idx_bits);
}

int pkv_seq_reserve_tab(struct seq *s, uint32_t need)
{
	uint64_t cap = s->cap ? s->cap : 4;
	int32_t *t;

	if (need <= s->cap)
		return 0;
	while (cap < need)
		cap *= 2;   /* need < 2^32: no wrap in 64 bits */
	if (cap > UINT32_MAX || cap > SIZE_MAX / sizeof(*t))
		return -ENOMEM;
	t = realloc(s->tab, (size_t)cap * sizeof(*t));
	if (!t)
		return -ENOMEM;
	s->tab = t;
	s->cap = (uint32_t)cap;
	return 0;
}

/*
 * Gives back table capacity far above what s uses: a table that once held a
 * long sequence must not stay allocated after a truncate or close (block
 * references are what a client's quota charges; a table stripped of its
 * references would be free memory for it). Shrinking only: failure is harmless.
 */
static void seq_trim_tab(struct seq *s)
{
	uint32_t want = s->nblk < 32 ? 64 : 2 * s->nblk;
	int32_t *t;

	if (s->cap <= 256 || s->cap <= 2 * want)
		return;
	t = realloc(s->tab, (size_t)want * sizeof(*t));
	if (t) {
		s->tab = t;
		s->cap = want;
	}
}

/* Makes sure a slot is free for one more sequence (growing the slot array); changes nothing visible. */
static int seq_slot_ready(struct pkv_cache *c)
{
	uint32_t n, i;
	struct seq *s;
	uint32_t *f;

	if (c->n_seq_free)
		return 0;
	if (c->n_seq_slots >= c->lim.max_seqs)
		return -ENOSPC;
	n = c->n_seq_slots ? 2 * c->n_seq_slots : 64;
	if (n > c->lim.max_seqs)
		n = c->lim.max_seqs;
	s = realloc(c->seqs, n * sizeof(*s));
	if (!s)
		return -ENOMEM;
	c->seqs = s;
	f = realloc(c->seq_free, n * sizeof(*f));
	if (!f)
		return -ENOMEM;
	c->seq_free = f;
	memset(s + c->n_seq_slots, 0, (n - c->n_seq_slots) * sizeof(*s));
	for (i = n; i > c->n_seq_slots; i--)
		f[c->n_seq_free++] = i - 1;
	c->n_seq_slots = n;
	return 0;
}

/* Takes the prepared slot and links it to its owner. */
static struct seq *seq_take(struct pkv_cache *c, struct owner *o, struct pkv_key ns)
{
	struct seq *s = &c->seqs[c->seq_free[--c->n_seq_free]];
	int32_t idx = (int32_t)(s - c->seqs);

	s->open = 1;
	s->owner = o->id;
	s->ns = ns;
	s->len = 0;
	s->nblk = 0;
	s->step = NULL;
	s->opening = 0;
	s->wait_lo = s->wait_hi = 0;
	s->cut = 0;
	s->settled = 0;
	s->o_prev = -1;
	s->o_next = o->seq_head;
	if (o->seq_head >= 0)
		c->seqs[o->seq_head].o_prev = idx;
	o->seq_head = idx;
	o->nseqs++;
	c->n_open_seqs++;
	return s;
}

/*
 * Matches up to budget more blocks of s's prompt (0: no budget), from its
 * last matched block; the table was reserved for every block that can match.
 * Returns the blocks matched; *more says the budget, not a miss, ended it.
 */
static uint32_t seq_match(const struct pkv_cache *c, const struct seq *s, const int32_t *tokens,
			  uint32_t max_blk, uint32_t budget, int *more)
{
	struct pkv_key parent = s->nblk ? c->blk[s->tab[s->nblk - 1]].key : s->ns;
	uint32_t lim = max_blk - s->nblk, n, settled;

	if (budget && budget < lim)
		lim = budget;
	n = pkv_prefix_walk_from(c, s->ns, parent, tokens + (size_t)s->nblk * c->bs, lim,
				 s->tab + s->nblk);
	*more = n == lim && s->nblk + n < max_blk;
	/* A settled open stops at the first block still being computed. */
	settled = s->settled ? pkv_inflight_trim(c, s->tab + s->nblk, n) : n;
	if (settled < n) {
		n = settled;
		*more = 0;
	}
	return n;
}

/*
 * Takes the references of the n blocks seq_match just found; once the walk
 * is over (more == 0), claims what follows for in-flight sharing.
 */
static void seq_take_matched(struct pkv_cache *c, struct owner *o, struct seq *s, uint32_t n,
			     const int32_t *tokens, uint32_t n_tokens, uint32_t budget, int more)
{
	uint64_t room;

	for (uint32_t i = 0; i < n; i++)
		pkv_blk_incref(c, s->tab[s->nblk + i]);
	pkv_inflight_note_hits(c, s, s->nblk, s->nblk + n);
	s->nblk += n;
	s->len = s->nblk * c->bs;
	o->nblocks += n;
	c->hit_tokens += (uint64_t)n * c->bs;
	if (more)
		return;
	room = owner_room(c, o);
	if (room)
		o->nblocks += pkv_inflight_claim(c, s, tokens, n_tokens,
						 (uint32_t)(budget && budget < room ? budget : room));
}

int pkv_cache_seq_open_partial(struct pkv_cache *c, uint32_t owner, struct pkv_key ns,
			       const int32_t *tokens, uint32_t n_tokens, uint32_t flags, uint32_t budget,
			       uint32_t *seq, uint32_t *n_cached)
{
	uint32_t max_blk, n;
	struct owner *o;
	struct seq *s;
	int err, more;

	if (!seq || (!tokens && n_tokens) || n_tokens > c->lim.max_tokens_per_seq)
		return -EINVAL;
	o = pkv_owner_find(c, owner);
	if (owner_over(c, o, 1, 0))
		return -ENOSPC;
	err = seq_slot_ready(c);
	if (err)
		return err;
	/* The last prompt token is always computed, so the client gets its logits. */
	max_blk = n_tokens ? pkv_prefix_max_walk(c, n_tokens - 1) : 0;
	s = &c->seqs[c->seq_free[c->n_seq_free - 1]];
	/* Only what can match: the first step reserves the rest (and charges it). */
	err = pkv_seq_reserve_tab(s, max_blk);
	if (err)
		return err;
	s->nblk = 0;
	s->ns = ns;
	s->settled = !!(flags & PKV_OPEN_SETTLED);
	n = seq_match(c, s, tokens, max_blk, budget, &more);
	if (owner_over(c, o, 0, n))
		return -ENOSPC;
	o = pkv_owner_get(c, owner);
	if (!o)
		return -ENOMEM;
	s = seq_take(c, o, ns);
	s->settled = !!(flags & PKV_OPEN_SETTLED);
	seq_take_matched(c, o, s, n, tokens, n_tokens, budget, more);
	s->opening = (uint8_t)more;
	c->lookup_tokens += n_tokens;
	*seq = pkv_seq_handle(c, s);
	if (n_cached)
		*n_cached = s->len;
	return more;
}

int pkv_cache_seq_open(struct pkv_cache *c, uint32_t owner, struct pkv_key ns,
		 const int32_t *tokens, uint32_t n_tokens, uint32_t *seq, uint32_t *n_cached)
{
	int r = pkv_cache_seq_open_partial(c, owner, ns, tokens, n_tokens, 0, 0, seq, n_cached);

	return r < 0 ? r : 0;
}

int pkv_cache_seq_open_more(struct pkv_cache *c, uint32_t owner, uint32_t seq, const int32_t *tokens,
			    uint32_t n_tokens, uint32_t budget, uint32_t *n_cached)
{
	struct seq *s = pkv_seq_get(c, owner, seq);
	struct owner *o;
	uint32_t max_blk, n;
	int more;

	if (!s)
		return -ENOENT;
	if (!s->opening || !tokens || !n_tokens || s->step)
		return -EINVAL;
	max_blk = pkv_prefix_max_walk(c, n_tokens - 1);
	if (max_blk < s->nblk || max_blk > s->cap)
		return -EINVAL;   /* not the prompt the sequence was opened with */
	o = pkv_owner_find(c, owner);
	n = seq_match(c, s, tokens, max_blk, budget, &more);
	/* Over the owner's block limit, the match ends where the limit does. */
	if (n > owner_room(c, o)) {
		n = (uint32_t)owner_room(c, o);
		more = 0;
	}
	seq_take_matched(c, o, s, n, tokens, n_tokens, budget, more);
	s->opening = (uint8_t)more;
	if (n_cached)
		*n_cached = s->len;
	return more;
}

int pkv_cache_seq_fork(struct pkv_cache *c, uint32_t owner, uint32_t seq, uint32_t *child)
{
	struct seq *p = pkv_seq_get(c, owner, seq), *s;
	struct owner *o;
	uint32_t i, n;
	int err;

	if (!p)
		return -ENOENT;
	if (!child)
		return -EINVAL;
	if (p->step)
		return -EBUSY;
	p->opening = 0;   /* its open is over once it is used */
	/* The child shares the parent's tokens, not the blocks it claimed past them. */
	n = (p->len + c->bs - 1) / c->bs;
	o = pkv_owner_find(c, owner);
	if (owner_over(c, o, 1, n))
		return -ENOSPC;
	err = seq_slot_ready(c);
	if (err)
		return err;
	p = pkv_seq_get(c, owner, seq);   /* the slot array may have moved */
	s = &c->seqs[c->seq_free[c->n_seq_free - 1]];
	/* The child's table holds the parent's entries, not its capacity (which a long past may have grown). */
	err = pkv_seq_reserve_tab(s, n);
	if (err)
		return err;
	s = seq_take(c, o, p->ns);
	if (n)   /* an empty sequence may have no table at all */
		memcpy(s->tab, p->tab, n * sizeof(*s->tab));
	for (i = 0; i < n; i++)
		c->blk[s->tab[i]].ref++;
	s->nblk = n;
	s->len = p->len;
	s->wait_lo = p->wait_lo < n ? p->wait_lo : n;
	s->wait_hi = p->wait_hi < n ? p->wait_hi : n;
	s->wait_since_ns = p->wait_since_ns;
	o->nblocks += s->nblk;
	*child = pkv_seq_handle(c, s);
	return 0;
}

/* Drops table entries [keep, nblk), tail first, so the LRU sees a chain's tail as older. */
void pkv_seq_drop_blocks(struct pkv_cache *c, struct seq *s, uint32_t keep)
{
	struct owner *o = pkv_owner_find(c, s->owner);

	o->nblocks -= s->nblk - keep;
	while (s->nblk > keep)
		pkv_blk_decref(c, s->tab[--s->nblk]);
}

int pkv_cache_seq_truncate(struct pkv_cache *c, uint32_t owner, uint32_t seq, uint32_t n_tokens)
{
	struct seq *s = pkv_seq_get(c, owner, seq);

	if (!s)
		return -ENOENT;
	if (s->step)
		return -EBUSY;
	if (n_tokens > s->len)
		return -EINVAL;
	s->opening = 0;   /* its open is over once it is used */
	pkv_inflight_withdraw(c, s, n_tokens / c->bs);
	pkv_seq_drop_blocks(c, s, (n_tokens + c->bs - 1) / c->bs);
	s->len = n_tokens;
	if (s->wait_hi > s->nblk)
		s->wait_hi = s->nblk;
	if (s->wait_lo > s->wait_hi)
		s->wait_lo = s->wait_hi;
	seq_trim_tab(s);
	return 0;
}

static void seq_release(struct pkv_cache *c, struct seq *s)
{
	struct owner *o = pkv_owner_find(c, s->owner);
	int32_t idx = (int32_t)(s - c->seqs);

	pkv_inflight_withdraw(c, s, 0);
	pkv_seq_drop_blocks(c, s, 0);
	seq_trim_tab(s);   /* a freed slot keeps a small table for the next open */
	if (s->o_prev >= 0)
		c->seqs[s->o_prev].o_next = s->o_next;
	else
		o->seq_head = s->o_next;
	if (s->o_next >= 0)
		c->seqs[s->o_next].o_prev = s->o_prev;
	o->nseqs--;
	s->open = 0;
	s->gen++;
	s->len = 0;
	c->seq_free[c->n_seq_free++] = (uint32_t)idx;
	c->n_open_seqs--;
}

int pkv_cache_seq_close(struct pkv_cache *c, uint32_t owner, uint32_t seq)
{
	struct seq *s = pkv_seq_get(c, owner, seq);

	if (!s)
		return -ENOENT;
	if (s->step)
		return -EBUSY;
	seq_release(c, s);
	pkv_owner_maybe_drop(c, owner);
	return 0;
}

int64_t pkv_cache_seq_len(const struct pkv_cache *c, uint32_t owner, uint32_t seq)
{
	const struct seq *s = pkv_seq_get(c, owner, seq);

	return s ? (int64_t)s->len : -ENOENT;
}

int pkv_cache_release_owner(struct pkv_cache *c, uint32_t owner)
{
	struct pkv_step *st, *nx;
	struct owner *o;
	int n = 0;

	for (st = c->steps_open; st; st = nx) {
		nx = st->next;
		if (st->owner == owner)
			pkv_cache_step_abort(c, st);
	}
	o = pkv_owner_find(c, owner);
	if (!o)
		return 0;
	while (o->seq_head >= 0) {
		seq_release(c, &c->seqs[o->seq_head]);
		n++;
	}
	pkv_prefix_release_pins(c, o);
	o->max_seqs = o->max_blocks = 0;
	pkv_owner_maybe_drop(c, owner);
	return n;
}
