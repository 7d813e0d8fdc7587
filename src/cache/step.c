/* SPDX-License-Identifier: MIT */
/* Steps: atomic slot reservation with copy-on-write, the backend metadata, layer coverage, commit and abort. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include "cache/bounds.h"
#include "cache/cache_int.h"

/* Grows *p to hold need elements (capacity doubling); sizes are checked, never wrapped. */
static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
	uint64_t n = *cap ? *cap : 8;
	size_t bytes;
	void *q;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;   /* need <= UINT32_MAX, so n <= 2^32: no wrap in 64 bits */
	if (n > UINT32_MAX)
		n = need;
	if (__builtin_mul_overflow((size_t)n, elem, &bytes))
		return -ENOMEM;
	q = realloc(*p, bytes);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = (uint32_t)n;
	return 0;
}

/* What begin learns from validating the requests, before it touches anything. */
struct step_plan {
	uint64_t need;        /* free blocks needed: new table entries + copies */
	uint64_t new_refs;    /* new table entries, charged to the owner */
	uint64_t total_q, total_k;
	uint32_t max_q, max_k, max_b;
};

/* Buffers are kept between steps (no allocation per step when warm), up to PKV_STEP_KEEP_BYTES each. */
static int step_buffers(struct pkv_step *st, uint32_t n_reqs, uint32_t total_q, uint32_t bt)
{
	uint32_t c;

	/* One capacity for every per-request array: each is grown to the same n_reqs + 1. */
	c = st->cap_reqs;
	if (grow((void **)&st->reqs, &c, n_reqs + 1, sizeof(*st->reqs)))
		return -ENOMEM;
	c = st->cap_reqs;
	if (grow((void **)&st->cu_q, &c, n_reqs + 1, sizeof(int32_t)))
		return -ENOMEM;
	c = st->cap_reqs;
	if (grow((void **)&st->cu_k, &c, n_reqs + 1, sizeof(int32_t)))
		return -ENOMEM;
	c = st->cap_reqs;
	if (grow((void **)&st->cache_seqlens, &c, n_reqs + 1, sizeof(int32_t)))
		return -ENOMEM;
	c = st->cap_reqs;
	if (grow((void **)&st->copies, &c, n_reqs + 1, sizeof(*st->copies)))
		return -ENOMEM;
	st->cap_reqs = c;   /* every per-request array now holds at least c entries */
	c = st->cap_q;
	if (grow((void **)&st->slots, &c, total_q, sizeof(int64_t)))
		return -ENOMEM;
	st->cap_q = c;
	c = st->cap_bt;
	if (grow((void **)&st->bt, &c, bt, sizeof(int32_t)))
		return -ENOMEM;
	st->cap_bt = c;
	return 0;
}

/* Frees the buffers a large step left, so its peak is not kept for the life of the pool. */
static void step_trim(struct pkv_step *st)
{
	if ((uint64_t)st->cap_reqs * sizeof(*st->reqs) > PKV_STEP_KEEP_BYTES) {
		free(st->reqs);
		free(st->cu_q);
		free(st->cu_k);
		free(st->cache_seqlens);
		free(st->copies);
		st->reqs = NULL;
		st->cu_q = st->cu_k = st->cache_seqlens = NULL;
		st->copies = NULL;
		st->cap_reqs = 0;
	}
	if ((uint64_t)st->cap_q * sizeof(int64_t) > PKV_STEP_KEEP_BYTES) {
		free(st->slots);
		st->slots = NULL;
		st->cap_q = 0;
	}
	if ((uint64_t)st->cap_bt * sizeof(int32_t) > PKV_STEP_KEEP_BYTES) {
		free(st->bt);
		st->bt = NULL;
		st->cap_bt = 0;
	}
}

static uint32_t layer_words(const struct pkv_cache *c)
{
	return (c->g.num_layers + 63) / 64;
}

static struct pkv_step *step_get(struct pkv_cache *c)
{
	struct pkv_step *st = c->steps_free;

	if (st) {
		c->steps_free = st->next;
	} else {
		/* The layer bitmap's size is fixed for the pool, so it lives with the step. */
		st = calloc(1, sizeof(*st) + layer_words(c) * sizeof(uint64_t));
		if (!st)
			return NULL;
	}
	memset(st->layers, 0, layer_words(c) * sizeof(uint64_t));
	return st;
}

static void step_put(struct pkv_cache *c, struct pkv_step *st)
{
	step_trim(st);
	st->next = c->steps_free;
	c->steps_free = st;
}

/* Whether the next write into s must go to a copy: a shared or published (immutable) partial block. */
static bool needs_cow(const struct pkv_cache *c, const struct seq *s)
{
	const struct blk *k;

	if (s->len % c->bs == 0)
		return false;
	k = &c->blk[s->tab[s->len / c->bs]];
	/* The producer of a pending block is the one sequence that writes it in place. */
	if (k->pending && k->producer == (int32_t)(s - c->seqs))
		return false;
	return k->ref > 1 || k->published;
}

/*
 * Validates every request and sizes the step; touches nothing but the
 * duplicate marks and, for in-flight sharing, what pkv_inflight_check says.
 */
static int step_plan(struct pkv_cache *c, uint32_t owner, const struct pkv_step_req *reqs,
		     uint32_t n_reqs, struct step_plan *p)
{
	uint32_t bs = c->bs;
	struct owner *o;

	memset(p, 0, sizeof(*p));
	c->mark_epoch++;
	for (uint32_t i = 0; i < n_reqs; i++) {
		struct seq *s = pkv_seq_get(c, owner, reqs[i].seq);
		uint64_t nl, nb, fresh;
		int err;

		if (!s)
			return -ENOENT;
		if (s->mark == c->mark_epoch)
			return -EINVAL;        /* named twice */
		s->mark = c->mark_epoch;
		if (s->step)
			return -EBUSY;
		if (!reqs[i].n_new || !reqs[i].tokens)
			return -EINVAL;
		nl = (uint64_t)s->len + reqs[i].n_new;
		if (nl > c->lim.max_tokens_per_seq)
			return -EINVAL;
		err = pkv_inflight_check(c, s, &reqs[i]);
		if (err)
			return err;
		nb = (nl + bs - 1) / bs;
		/* A producer's table may already hold the blocks it claimed at open. */
		fresh = nb > s->nblk ? nb - s->nblk : 0;
		p->need += fresh + needs_cow(c, s);
		p->new_refs += fresh;
		p->total_q += reqs[i].n_new;
		p->total_k += nl;
		if (reqs[i].n_new > p->max_q)
			p->max_q = reqs[i].n_new;
		if (nl > p->max_k)
			p->max_k = (uint32_t)nl;
		if (nb > p->max_b)
			p->max_b = (uint32_t)nb;
	}
	/* cu_seq_lens are int32 in every attention API this feeds. */
	if (p->total_k > INT32_MAX || p->total_q > PKV_MAX_STEP_TOKENS)
		return -EINVAL;
	/* The backends take a dense table: n_reqs x the longest sequence's blocks. */
	if ((uint64_t)n_reqs * p->max_b > PKV_MAX_STEP_TABLE)
		return -E2BIG;
	o = pkv_owner_find(c, owner);
	if (p->new_refs > owner_room(c, o))
		return -ENOSPC;
	if (p->need > pkv_blk_available(c))
		return -ENOSPC;
	return 0;
}

/* Allocates everything the step needs, so that filling it cannot fail. */
static int step_reserve(struct pkv_cache *c, uint32_t owner, struct pkv_step *st,
			const struct pkv_step_req *reqs, uint32_t n_reqs, const struct step_plan *p)
{
	int err = step_buffers(st, n_reqs, (uint32_t)p->total_q, n_reqs * p->max_b);

	for (uint32_t i = 0; !err && i < n_reqs; i++) {
		struct seq *s = pkv_seq_get(c, owner, reqs[i].seq);

		err = pkv_seq_reserve_tab(s, (uint32_t)((s->len + (uint64_t)reqs[i].n_new +
							 c->bs - 1) / c->bs));
	}
	return err;
}

/*
 * Reserves the slots of request i (copying a shared partial block first) and
 * writes its rows of the metadata; q0 is the step's token offset of its first
 * new token.
 */
static void step_fill(struct pkv_cache *c, struct pkv_step *st, uint32_t i, struct seq *s,
			  const struct pkv_step_req *req, uint32_t q0, uint32_t max_b)
{
	struct step_req *r = &st->reqs[i];
	uint32_t bs = c->bs, nl = s->len + req->n_new, nb = (nl + bs - 1) / bs;
	int32_t *row = st->bt + (size_t)i * max_b;

	s->opening = 0;   /* its open is over once it is used */
	r->seq = (uint32_t)(s - c->seqs);
	r->old_len = s->len;
	r->old_nblk = s->nblk;
	r->n_new = req->n_new;
	r->cow_idx = r->cow_old = -1;
	if (needs_cow(c, s)) {
		uint32_t at = s->len / bs;
		int32_t nbk = pkv_blk_alloc(c);

		/* The copy starts with the source's tokens; the step holds the source until commit. */
		memcpy(blk_tok(c, nbk), blk_tok(c, s->tab[at]), (size_t)bs * sizeof(int32_t));
		st->copies[st->n_copies++] = (struct pkv_block_copy){ s->tab[at], nbk };
		r->cow_idx = (int32_t)at;
		r->cow_old = s->tab[at];
		s->tab[at] = nbk;
	}
	while (s->nblk < nb)
		s->tab[s->nblk++] = pkv_blk_alloc(c);
	/* Writing token ids now is harmless on abort: these slots are private and past len. */
	for (uint32_t j = 0; j < r->n_new; j++) {
		uint32_t pos = s->len + j;
		int32_t b = s->tab[pos / bs];

		blk_tok(c, b)[pos % bs] = req->tokens[j];
		st->slots[q0 + j] = (int64_t)b * bs + pos % bs;
	}
	st->cu_q[i + 1] = (int32_t)(q0 + r->n_new);
	st->cu_k[i + 1] = st->cu_k[i] + (int32_t)nl;
	st->cache_seqlens[i] = (int32_t)s->len;
	memcpy(row, s->tab, nb * sizeof(*row));
	for (uint32_t j = nb; j < max_b; j++)
		row[j] = -1;
	s->step = st;
}

static void step_link(struct pkv_cache *c, struct pkv_step *st)
{
	st->open = 1;
	st->prev = NULL;
	st->next = c->steps_open;
	if (c->steps_open)
		c->steps_open->prev = st;
	c->steps_open = st;
	c->n_steps_open++;
}

static void step_meta(const struct pkv_step *st, const struct step_plan *p, struct pkv_step_meta *meta)
{
	memset(meta, 0, sizeof(*meta));
	meta->num_seqs = st->n_reqs;
	meta->total_q = (uint32_t)p->total_q;
	meta->max_length_q = p->max_q;
	meta->max_length_k = p->max_k;
	meta->max_blocks_per_seq = p->max_b;
	meta->decode_only = p->max_q == 1;
	meta->cu_seq_lens_q = st->cu_q;
	meta->cu_seq_lens_k = st->cu_k;
	meta->cache_seqlens = st->cache_seqlens;
	meta->block_tables = st->bt;
	meta->slot_mapping = st->slots;
	meta->copies = st->copies;
	meta->num_copies = st->n_copies;
}

int pkv_cache_step_begin(struct pkv_cache *c, uint32_t owner, const struct pkv_step_req *reqs,
			 uint32_t n_reqs, struct pkv_step **step, struct pkv_step_meta *meta)
{
	struct step_plan p;
	struct pkv_step *st;
	uint32_t q0 = 0;
	int err;

	if (!step || !meta || !reqs || !n_reqs || n_reqs > c->lim.max_seqs)
		return -EINVAL;
	/* Validate everything before touching anything, so a failure leaves no trace. */
	err = step_plan(c, owner, reqs, n_reqs, &p);
	if (err)
		return err;
	st = step_get(c);
	if (!st)
		return -ENOMEM;
	err = step_reserve(c, owner, st, reqs, n_reqs, &p);
	if (err) {
		step_put(c, st);
		return err;
	}

	/* Nothing can fail from here on. */
	st->owner = owner;
	st->n_reqs = n_reqs;
	st->n_copies = 0;
	st->cu_q[0] = st->cu_k[0] = 0;
	for (uint32_t i = 0; i < n_reqs; i++) {
		step_fill(c, st, i, pkv_seq_get(c, owner, reqs[i].seq), &reqs[i], q0, p.max_b);
		q0 += reqs[i].n_new;
	}
	pkv_owner_find(c, owner)->nblocks += (uint32_t)p.new_refs;
	pkv_owner_find(c, owner)->nsteps++;
	c->cow_copies += st->n_copies;
	step_link(c, st);
	step_meta(st, &p, meta);
	*step = st;
	return 0;
}

void pkv_cache_step_layer_done(struct pkv_step *st, uint32_t layer)
{
	/* The layer was checked against num_layers when the attend was validated. */
	if (st)
		st->layers[layer / 64] |= 1ull << (layer % 64);
}

/* Appends "a" or "a-b" to buf at *at, with a comma before all but the first. */
static void put_range(char *buf, size_t len, size_t *at, uint32_t a, uint32_t b, int first)
{
	int n;

	if (!buf || *at >= len)
		return;
	if (a == b)
		n = snprintf(buf + *at, len - *at, "%s%u", first ? "" : ",", a);
	else
		n = snprintf(buf + *at, len - *at, "%s%u-%u", first ? "" : ",", a, b);
	*at += n > 0 ? (size_t)n : 0;
}

uint32_t pkv_cache_step_missing_layers(const struct pkv_cache *c, const struct pkv_step *st,
				       char *buf, size_t len)
{
	uint32_t n = 0, L = c->g.num_layers, l = 0;
	size_t at = 0;

	if (buf && len)
		buf[0] = 0;
	if (!st || !st->open)
		return 0;
	while (l < L) {
		uint32_t a;

		if (st->layers[l / 64] >> (l % 64) & 1) {
			l++;
			continue;
		}
		for (a = l; l < L && !(st->layers[l / 64] >> (l % 64) & 1); l++)
			;
		put_range(buf, len, &at, a, l - 1, n == 0);
		n += l - a;
	}
	return n;
}

static void step_unlink(struct pkv_cache *c, struct pkv_step *st)
{
	struct owner *o = pkv_owner_find(c, st->owner);

	if (st->prev)
		st->prev->next = st->next;
	else
		c->steps_open = st->next;
	if (st->next)
		st->next->prev = st->prev;
	st->open = 0;
	c->n_steps_open--;
	o->nsteps--;
	step_put(c, st);
}

int pkv_cache_step_commit(struct pkv_cache *c, struct pkv_step *st)
{
	uint32_t i;

	if (!st || !st->open)
		return -EINVAL;
	/*
	 * A reserved slot holds whatever its block's previous owner wrote until
	 * an attend writes it; committing it unwritten in any layer would let
	 * the next step read another client's K/V.
	 */
	if (pkv_cache_step_missing_layers(c, st, NULL, 0))
		return -EINVAL;
	for (i = 0; i < st->n_reqs; i++) {
		struct step_req *r = &st->reqs[i];
		struct seq *s = &c->seqs[r->seq];

		if (r->cow_old >= 0)
			pkv_blk_decref(c, r->cow_old);
		s->len = r->old_len + r->n_new;
		s->step = NULL;
		pkv_inflight_settle(c, s, r->old_len / c->bs, s->len / c->bs);
		pkv_prefix_publish_new(c, s, r->old_len / c->bs, s->len / c->bs);
	}
	step_unlink(c, st);
	return 0;
}

void pkv_cache_step_abort(struct pkv_cache *c, struct pkv_step *st)
{
	uint32_t i;

	if (!st || !st->open)
		return;
	/* In reverse, so a block two requests shared goes back exactly as it was. */
	for (i = st->n_reqs; i-- > 0;) {
		struct step_req *r = &st->reqs[i];
		struct seq *s = &c->seqs[r->seq];

		/* Fewer entries than before the step: its claims lapsed meanwhile (pkv_inflight_abort). */
		if (s->nblk > r->old_nblk)
			pkv_seq_drop_blocks(c, s, r->old_nblk);
		if (r->cow_old >= 0) {
			pkv_blk_decref(c, s->tab[r->cow_idx]);
			s->tab[r->cow_idx] = r->cow_old;
			c->cow_copies--;
		}
		s->step = NULL;
		pkv_inflight_abort(c, s);
	}
	step_unlink(c, st);
}
