/* SPDX-License-Identifier: MIT */
/* In-flight prefix sharing: claims published as pending at open, their consumers, settling and withdrawal. */
#include <errno.h>
#include "cache/cache_int.h"
#include "common/clock.h"

/* Marks a block withdrawn during one pkv_inflight_withdraw, so consumers can recognise it. */
#define JUST_WITHDRAWN (-2)

static int32_t seq_index(const struct pkv_cache *c, const struct seq *s)
{
	return (int32_t)(s - c->seqs);
}

static bool own_claim(const struct pkv_cache *c, const struct seq *s, int32_t b)
{
	return c->blk[b].pending && c->blk[b].producer == seq_index(c, s);
}

/* After an open matched table entries [from, to): remembers which another sequence still computes. */
void pkv_inflight_note_hits(struct pkv_cache *c, struct seq *s, uint32_t from, uint32_t to)
{
	for (uint32_t i = from; i < to; i++)
		if (c->blk[s->tab[i]].pending) {
			if (s->wait_lo == s->wait_hi) {
				s->wait_lo = i;
				s->wait_since_ns = pkv_now_ns();
			}
			s->wait_hi = i + 1;
			c->inflight_hit_tokens += c->bs;
		}
}

/*
 * Claims up to max_claims full blocks of tokens after the sequence's n hits
 * (s->nblk of them): each is allocated, keyed and published as pending. No
 * claim follows a pending hit, so a withdrawal never strands another
 * sequence's claim under a parent that disappears. Only blocks the pool has
 * to spare are claimed; a key already published stops the claims.
 */
uint32_t pkv_inflight_claim(struct pkv_cache *c, struct seq *s, const int32_t *tokens,
			    uint32_t n_tokens, uint32_t max_claims)
{
	uint32_t i, bs = c->bs, full = n_tokens / bs, got = 0;

	if (!c->lim.inflight_claims || !tokens || s->settled || full <= s->nblk)
		return 0;
	if (s->nblk && c->blk[s->tab[s->nblk - 1]].pending)
		return 0;
	/* The open reserved its table for the blocks a walk can match; claims may take one more. */
	if (pkv_seq_reserve_tab(s, full))
		return 0;
	for (i = s->nblk; i < full && got < max_claims && pkv_blk_available(c); i++) {
		int32_t p = i ? s->tab[i - 1] : -1, b;
		struct pkv_key parent = p >= 0 ? c->blk[p].key : s->ns;
		struct pkv_key key = pkv_block_key(parent, s->ns, tokens + (size_t)i * bs, bs);
		struct blk *k;

		if (pkv_prefix_find(c, key) >= 0)
			break;
		b = pkv_blk_alloc(c);
		if (b < 0)
			break;
		k = &c->blk[b];
		memcpy(blk_tok(c, b), tokens + (size_t)i * bs, (size_t)bs * sizeof(*tokens));
		k->key = key;
		k->parent_key = parent;
		k->ns = s->ns;
		k->parent = p;
		k->published = 1;
		k->pending = 1;
		k->producer = seq_index(c, s);
		if (p >= 0)
			c->blk[p].nchild++;
		pkv_prefix_insert(c, key, b);
		s->tab[s->nblk++] = b;
		got++;
	}
	c->claimed_blocks += got;
	if (got)
		s->progress_ns = pkv_now_ns();
	return got;
}

/* Table entries the sequence's tokens fill, counting those its open step writes. */
static uint32_t blocks_in_use(const struct pkv_cache *c, const struct seq *s)
{
	uint64_t n = s->len;

	if (s->step)
		for (uint32_t i = 0; i < s->step->n_reqs; i++)
			if (s->step->reqs[i].seq == (uint32_t)seq_index(c, s))
				n = (uint64_t)s->step->reqs[i].old_len + s->step->reqs[i].n_new;
	return (uint32_t)((n + c->bs - 1) / c->bs);
}

/* Cuts every sequence that waits on a block just withdrawn back to the tokens before it. */
static void cut_consumers(struct pkv_cache *c, const struct seq *prod, uint32_t lo)
{
	for (uint32_t i = 0; i < c->n_seq_slots; i++) {
		struct seq *t = &c->seqs[i];
		uint32_t j, end;

		if (!t->open || t == prod || t->wait_hi <= lo)
			continue;
		end = t->wait_hi < t->nblk ? t->wait_hi : t->nblk;
		for (j = lo > t->wait_lo ? lo : t->wait_lo; j < end; j++) {
			if (c->blk[t->tab[j]].producer != JUST_WITHDRAWN)
				continue;
			/* A waiting sequence has no open step (it cannot begin one): safe to cut. */
			pkv_seq_drop_blocks(c, t, j);
			t->len = j * c->bs;
			t->wait_hi = j;
			if (t->wait_lo > j)
				t->wait_lo = j;
			t->cut = 1;
			break;
		}
	}
}

/*
 * The producer s gives up its pending blocks at table entries >= from: they
 * leave the prefix table (children first), their waiting consumers are cut
 * back, and the claimed entries past s's own tokens (and past those its open
 * step writes, if any) leave its table.
 */
void pkv_inflight_withdraw(struct pkv_cache *c, struct seq *s, uint32_t from)
{
	uint32_t i, lo = UINT32_MAX, mine = blocks_in_use(c, s);
	bool shared = false;

	for (i = s->nblk; i-- > from;) {
		int32_t b = s->tab[i];
		struct blk *k = &c->blk[b];

		if (!own_claim(c, s, b))
			continue;
		pkv_prefix_remove(c, k->key);
		k->published = 0;
		k->pending = 0;
		k->producer = JUST_WITHDRAWN;
		if (k->parent >= 0) {
			c->blk[k->parent].nchild--;
			pkv_lru_update(c, k->parent);
		}
		k->parent = -1;
		c->withdrawn_blocks++;
		shared |= k->ref > 1;
		lo = i;
	}
	if (lo == UINT32_MAX)
		return;
	/* Only a block someone else holds has consumers: the scan of every sequence is skipped otherwise. */
	if (shared)
		cut_consumers(c, s, lo);
	for (i = lo; i < s->nblk; i++)
		if (c->blk[s->tab[i]].producer == JUST_WITHDRAWN)
			c->blk[s->tab[i]].producer = -1;
	pkv_seq_drop_blocks(c, s, lo > mine ? lo : mine);
}

/*
 * Withdraws the claims of pending block b's producer from b on when the
 * producer has stalled, or when the consumer s has waited on claims for 10
 * lapses (cache.h: inflight_lapse_ms). Returns whether it did. Only a commit
 * that settles a claimed block is progress: a producer stepping a token at a
 * time keeps no one waiting for long, nor does one that settles a block now
 * and then.
 */
static bool lapse(struct pkv_cache *c, const struct seq *s, int32_t b)
{
	struct seq *p = &c->seqs[c->blk[b].producer];
	uint64_t now = pkv_now_ns(), lapse_ns = (uint64_t)c->lim.inflight_lapse_ms * 1000000ull;
	uint32_t i;

	if (now - p->progress_ns <= lapse_ns * (p->step ? 10 : 1) && now - s->wait_since_ns <= 10 * lapse_ns)
		return false;
	for (i = 0; i < p->nblk && p->tab[i] != b; i++)
		;
	if (i == p->nblk)
		return false;
	c->lapsed_claims++;
	pkv_inflight_withdraw(c, p, i);
	return true;
}

/*
 * step_begin's check of one request: a sequence cut back by a withdrawal
 * reports it once (-ESTALE); one that still waits on another's pending
 * block cannot step yet (-EAGAIN); a producer stepping other tokens than it
 * claimed withdraws the claim from that block on (a state change that stands
 * even if the step then fails: the claim could never be delivered).
 */
int pkv_inflight_check(struct pkv_cache *c, struct seq *s, const struct pkv_step_req *r)
{
	uint32_t j, bs = c->bs;

	if (s->cut) {
		s->cut = 0;
		c->blocked_seq = pkv_seq_handle(c, s);
		return -ESTALE;
	}
	for (int tries = 0; tries < 2; tries++) {
		while (s->wait_lo < s->wait_hi && !c->blk[s->tab[s->wait_lo]].pending)
			s->wait_lo++;
		if (s->wait_lo == s->wait_hi || !lapse(c, s, s->tab[s->wait_lo]))
			break;
		/* The lapse cut s back (it held the withdrawn blocks): say so now, as for any withdrawal. */
		if (s->cut) {
			s->cut = 0;
			c->blocked_seq = pkv_seq_handle(c, s);
			return -ESTALE;
		}
	}
	if (s->wait_lo < s->wait_hi) {
		c->blocked_seq = pkv_seq_handle(c, s);
		c->blocked_by = c->seqs[c->blk[s->tab[s->wait_lo]].producer].owner;
		return -EAGAIN;
	}
	for (j = 0; j < r->n_new; j++) {
		uint32_t pos = s->len + j, at = pos / bs;

		if (at >= s->nblk)
			break;
		if (own_claim(c, s, s->tab[at]) && blk_tok(c, s->tab[at])[pos % bs] != r->tokens[j]) {
			pkv_inflight_withdraw(c, s, at);
			break;
		}
	}
	return 0;
}

/* At commit: the producer's pending blocks among table entries [from, to) are now whole. */
void pkv_inflight_settle(struct pkv_cache *c, struct seq *s, uint32_t from, uint32_t to)
{
	bool settled = false;

	for (uint32_t i = from; i < to && i < s->nblk; i++) {
		struct blk *k = &c->blk[s->tab[i]];

		if (own_claim(c, s, s->tab[i])) {
			k->pending = 0;
			k->producer = -1;
			settled = true;
		}
	}
	if (settled)
		s->progress_ns = pkv_now_ns();
}

/*
 * After an aborted step: entries past the sequence's tokens that are no
 * longer its own claims (they lapsed while the step was open) leave its table.
 */
void pkv_inflight_abort(struct pkv_cache *c, struct seq *s)
{
	for (uint32_t i = (s->len + c->bs - 1) / c->bs; i < s->nblk; i++)
		if (!own_claim(c, s, s->tab[i])) {
			pkv_seq_drop_blocks(c, s, i);
			break;
		}
}

/* The leading blocks of a walk that hold KV already (pins stop at the first pending one). */
uint32_t pkv_inflight_trim(const struct pkv_cache *c, const int32_t *blk, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n && !c->blk[blk[i]].pending; i++)
		;
	return i;
}

uint32_t pkv_cache_blocked_seq(const struct pkv_cache *c, uint32_t *producer_owner)
{
	if (producer_owner)
		*producer_owner = c->blocked_by;
	return c->blocked_seq;
}
