/* SPDX-License-Identifier: MIT */
/* Steps: atomic slot reservation with copy-on-write, the backend metadata, commit and abort. */
#include <errno.h>
#include <stdlib.h>
#include "cache/cache_int.h"

static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
	uint32_t n = *cap ? *cap : 8;
	void *q;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	q = realloc(*p, (size_t)n * elem);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}

/* Buffers are grow-only and steps are recycled, so a warm cache allocates nothing per step. */
static int step_buffers(struct pkv_step *st, uint32_t n_reqs, uint32_t total_q, uint64_t bt)
{
	uint32_t c;

	if (bt > UINT32_MAX)
		return -ENOMEM;
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
	if (grow((void **)&st->bt, &c, (uint32_t)bt, sizeof(int32_t)))
		return -ENOMEM;
	st->cap_bt = c;
	return 0;
}

static struct pkv_step *step_get(struct pkv_cache *c)
{
	struct pkv_step *st = c->steps_free;

	if (st) {
		c->steps_free = st->next;
		return st;
	}
	return calloc(1, sizeof(*st));
}

static void step_put(struct pkv_cache *c, struct pkv_step *st)
{
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

int pkv_cache_step_begin(struct pkv_cache *c, uint32_t owner, const struct pkv_step_req *reqs,
		   uint32_t n_reqs, struct pkv_step **step, struct pkv_step_meta *meta)
{
	uint64_t need = 0, new_refs = 0, total_q = 0, total_k = 0, bt;
	uint32_t i, j, max_q = 0, max_k = 0, max_b = 0, bs = c->bs, ncopy = 0;
	struct pkv_step *st;
	struct owner *o;
	int err;

	if (!step || !meta || !reqs || !n_reqs || n_reqs > c->lim.max_seqs)
		return -EINVAL;
	/* Validate everything before touching anything, so a failure leaves no trace. */
	c->mark_epoch++;
	for (i = 0; i < n_reqs; i++) {
		struct seq *s = pkv_seq_get(c, owner, reqs[i].seq);
		uint64_t nl, nb, fresh;

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
		need += fresh + needs_cow(c, s);
		new_refs += fresh;
		total_q += reqs[i].n_new;
		total_k += nl;
		if (reqs[i].n_new > max_q)
			max_q = reqs[i].n_new;
		if (nl > max_k)
			max_k = (uint32_t)nl;
		if (nb > max_b)
			max_b = (uint32_t)nb;
	}
	/* cu_seq_lens are int32 in every attention API this feeds. */
	if (total_k > INT32_MAX)
		return -EINVAL;
	o = pkv_owner_find(c, owner);
	if (new_refs && o->max_blocks && o->nblocks + new_refs > o->max_blocks)
		return -ENOSPC;
	if (need > pkv_blk_available(c))
		return -ENOSPC;
	st = step_get(c);
	if (!st)
		return -ENOMEM;
	bt = (uint64_t)n_reqs * max_b;
	err = step_buffers(st, n_reqs, (uint32_t)total_q, bt);
	for (i = 0; !err && i < n_reqs; i++)
		err = pkv_seq_reserve_tab(pkv_seq_get(c, owner, reqs[i].seq),
					  (uint32_t)((pkv_seq_get(c, owner, reqs[i].seq)->len +
						      (uint64_t)reqs[i].n_new + bs - 1) / bs));
	if (err) {
		step_put(c, st);
		return err;
	}

	/* Nothing can fail from here on. */
	st->owner = owner;
	st->n_reqs = n_reqs;
	st->cu_q[0] = st->cu_k[0] = 0;
	total_q = 0;
	for (i = 0; i < n_reqs; i++) {
		struct seq *s = pkv_seq_get(c, owner, reqs[i].seq);
		struct step_req *r = &st->reqs[i];
		uint32_t nl = s->len + reqs[i].n_new, nb = (nl + bs - 1) / bs;
		int32_t *row = st->bt + (size_t)i * max_b;

		r->seq = (uint32_t)(s - c->seqs);
		r->old_len = s->len;
		r->old_nblk = s->nblk;
		r->n_new = reqs[i].n_new;
		r->cow_idx = r->cow_old = -1;
		if (needs_cow(c, s)) {
			uint32_t at = s->len / bs;
			int32_t nbk = pkv_blk_alloc(c);

			/* The copy starts with the source's tokens; the step holds the source until commit. */
			memcpy(blk_tok(c, nbk), blk_tok(c, s->tab[at]), (size_t)bs * sizeof(int32_t));
			st->copies[ncopy++] = (struct pkv_block_copy){ s->tab[at], nbk };
			r->cow_idx = (int32_t)at;
			r->cow_old = s->tab[at];
			s->tab[at] = nbk;
		}
		while (s->nblk < nb)
			s->tab[s->nblk++] = pkv_blk_alloc(c);
		/* Writing token ids now is harmless on abort: these slots are private and past len. */
		for (j = 0; j < r->n_new; j++) {
			uint32_t pos = s->len + j;
			int32_t b = s->tab[pos / bs];

			blk_tok(c, b)[pos % bs] = reqs[i].tokens[j];
			st->slots[total_q + j] = (int64_t)b * bs + pos % bs;
		}
		total_q += r->n_new;
		st->cu_q[i + 1] = (int32_t)total_q;
		st->cu_k[i + 1] = st->cu_k[i] + (int32_t)nl;
		st->cache_seqlens[i] = (int32_t)s->len;
		memcpy(row, s->tab, nb * sizeof(*row));
		for (j = nb; j < max_b; j++)
			row[j] = -1;
		s->step = st;
	}
	o->nblocks += (uint32_t)new_refs;
	o->nsteps++;
	c->cow_copies += ncopy;
	st->open = 1;
	st->prev = NULL;
	st->next = c->steps_open;
	if (c->steps_open)
		c->steps_open->prev = st;
	c->steps_open = st;
	c->n_steps_open++;

	memset(meta, 0, sizeof(*meta));
	meta->num_seqs = n_reqs;
	meta->total_q = (uint32_t)total_q;
	meta->max_length_q = max_q;
	meta->max_length_k = max_k;
	meta->max_blocks_per_seq = max_b;
	meta->decode_only = max_q == 1;
	meta->cu_seq_lens_q = st->cu_q;
	meta->cu_seq_lens_k = st->cu_k;
	meta->cache_seqlens = st->cache_seqlens;
	meta->block_tables = st->bt;
	meta->slot_mapping = st->slots;
	meta->copies = st->copies;
	meta->num_copies = ncopy;
	*step = st;
	return 0;
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
	struct owner *o;
	uint32_t i;

	if (!st || !st->open)
		return;
	o = pkv_owner_find(c, st->owner);
	/* In reverse, so a block two requests shared goes back exactly as it was. */
	for (i = st->n_reqs; i-- > 0;) {
		struct step_req *r = &st->reqs[i];
		struct seq *s = &c->seqs[r->seq];

		o->nblocks -= s->nblk - r->old_nblk;
		while (s->nblk > r->old_nblk)
			pkv_blk_decref(c, s->tab[--s->nblk]);
		if (r->cow_old >= 0) {
			pkv_blk_decref(c, s->tab[r->cow_idx]);
			s->tab[r->cow_idx] = r->cow_old;
			c->cow_copies--;
		}
		s->step = NULL;
	}
	step_unlink(c, st);
}
