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
	u->steps = o->nsteps;
	u->max_seqs = o->max_seqs;
	u->max_blocks = o->max_blocks;
}

static bool owner_over(const struct owner *o, uint32_t more_seqs, uint64_t more_blocks)
{
	if (!o)
		return false;
	if (more_seqs && o->max_seqs && (uint64_t)o->nseqs + more_seqs > o->max_seqs)
		return true;
	if (more_blocks && o->max_blocks && o->nblocks + more_blocks > o->max_blocks)
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
	uint32_t cap = s->cap ? s->cap : 4;
	int32_t *t;

	if (need <= s->cap)
		return 0;
	while (cap < need)
		cap *= 2;
	t = realloc(s->tab, cap * sizeof(*t));
	if (!t)
		return -ENOMEM;
	s->tab = t;
	s->cap = cap;
	return 0;
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
	s->wait_lo = s->wait_hi = 0;
	s->cut = 0;
	s->o_prev = -1;
	s->o_next = o->seq_head;
	if (o->seq_head >= 0)
		c->seqs[o->seq_head].o_prev = idx;
	o->seq_head = idx;
	o->nseqs++;
	c->n_open_seqs++;
	return s;
}

int pkv_cache_seq_open(struct pkv_cache *c, uint32_t owner, struct pkv_key ns,
		 const int32_t *tokens, uint32_t n_tokens, uint32_t *seq, uint32_t *n_cached)
{
	return pkv_cache_seq_open_flags(c, owner, ns, tokens, n_tokens, 0, seq, n_cached);
}

int pkv_cache_seq_open_flags(struct pkv_cache *c, uint32_t owner, struct pkv_key ns,
			     const int32_t *tokens, uint32_t n_tokens, uint32_t flags,
			     uint32_t *seq, uint32_t *n_cached)
{
	uint32_t max_blk, n, i;
	struct owner *o;
	struct seq *s;
	int err;

	if (!seq || (!tokens && n_tokens) || n_tokens > c->lim.max_tokens_per_seq)
		return -EINVAL;
	o = pkv_owner_find(c, owner);
	if (owner_over(o, 1, 0))
		return -ENOSPC;
	err = seq_slot_ready(c);
	if (err)
		return err;
	s = &c->seqs[c->seq_free[c->n_seq_free - 1]];
	err = pkv_seq_reserve_tab(s, (n_tokens + c->bs - 1) / c->bs);
	if (err)
		return err;
	/* The last prompt token is always computed, so the client gets its logits. */
	max_blk = n_tokens ? (n_tokens - 1) / c->bs : 0;
	n = pkv_prefix_walk(c, ns, tokens, max_blk, s->tab);
	if (flags & PKV_OPEN_SETTLED)
		n = pkv_inflight_trim(c, s->tab, n);
	if (owner_over(o, 0, n))
		return -ENOSPC;
	o = pkv_owner_get(c, owner);
	if (!o)
		return -ENOMEM;
	s = seq_take(c, o, ns);
	for (i = 0; i < n; i++)
		pkv_blk_incref(c, s->tab[i]);
	s->nblk = n;
	s->len = n * c->bs;
	o->nblocks += n;
	pkv_inflight_note_hits(c, s, n);
	if (!(flags & PKV_OPEN_SETTLED))
		o->nblocks += pkv_inflight_claim(c, s, tokens, n_tokens,
						 o->max_blocks ? o->max_blocks - o->nblocks : UINT32_MAX);
	c->lookup_tokens += n_tokens;
	c->hit_tokens += s->len;
	*seq = pkv_seq_handle(c, s);
	if (n_cached)
		*n_cached = s->len;
	return 0;
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
	/* The child shares the parent's tokens, not the blocks it claimed past them. */
	n = (p->len + c->bs - 1) / c->bs;
	o = pkv_owner_find(c, owner);
	if (owner_over(o, 1, n))
		return -ENOSPC;
	err = seq_slot_ready(c);
	if (err)
		return err;
	p = pkv_seq_get(c, owner, seq);   /* the slot array may have moved */
	s = &c->seqs[c->seq_free[c->n_seq_free - 1]];
	err = pkv_seq_reserve_tab(s, p->cap);
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
	pkv_inflight_withdraw(c, s, n_tokens / c->bs);
	pkv_seq_drop_blocks(c, s, (n_tokens + c->bs - 1) / c->bs);
	s->len = n_tokens;
	if (s->wait_hi > s->nblk)
		s->wait_hi = s->nblk;
	if (s->wait_lo > s->wait_hi)
		s->wait_lo = s->wait_hi;
	return 0;
}

static void seq_release(struct pkv_cache *c, struct seq *s)
{
	struct owner *o = pkv_owner_find(c, s->owner);
	int32_t idx = (int32_t)(s - c->seqs);

	pkv_inflight_withdraw(c, s, 0);
	pkv_seq_drop_blocks(c, s, 0);
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
