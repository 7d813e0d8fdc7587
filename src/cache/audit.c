/* SPDX-License-Identifier: MIT */
/* audit(): recomputes the invariants of DESIGN §2 from scratch and reports what disagrees. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "cache/cache_int.h"

struct rep {
	char *buf;
	size_t len, used;
	int n;
};

static void bad(struct rep *r, const char *fmt, ...)
{
	va_list ap;
	int w;

	/* Count every problem; describe the first ones that fit. */
	if (r->n++ >= 8 || !r->buf || r->used + 1 >= r->len)
		return;
	va_start(ap, fmt);
	w = vsnprintf(r->buf + r->used, r->len - r->used, fmt, ap);
	va_end(ap);
	if (w > 0)
		r->used += (size_t)w;
	if (r->used + 2 < r->len) {
		r->buf[r->used++] = ';';
		r->buf[r->used++] = ' ';
		r->buf[r->used] = '\0';
	} else {
		r->used = r->len;
	}
}

static void audit_blocks(const struct pkv_cache *c, struct rep *r, const uint32_t *refs,
			 const uint32_t *nchild, const uint32_t *pinch)
{
	uint32_t n = c->g.num_blocks, i, nfree = 0, ncached = 0, nused = 0, npinned = 0, ncp = 0;
	uint32_t nlru = 0, npub = 0;
	uint8_t *onfree = calloc(n, 1);
	int32_t b;

	if (!onfree) {
		bad(r, "audit: out of memory");
		return;
	}
	for (i = 0; i < c->n_free; i++) {
		b = c->free_stk[i];
		if (b < 0 || (uint32_t)b >= n || onfree[b]++)
			bad(r, "free list entry %u (%d) invalid or repeated", i, b);
	}
	for (i = 0; i < n; i++) {
		const struct blk *k = &c->blk[i];

		if (k->ref != refs[i])
			bad(r, "block %u: refcount %u but %u table references", i, k->ref, refs[i]);
		if (k->ref)
			nused++;
		else if (k->published)
			ncached++;
		else
			nfree++;
		if (!k->ref && !k->published && !onfree[i])
			bad(r, "block %u is free but not on the free list", i);
		if ((k->ref || k->published) && onfree[i])
			bad(r, "block %u is on the free list but %s", i, k->ref ? "in use" : "cached");
		if (k->pin) {
			npinned++;
			ncp += !k->ref;
			if (!k->published)
				bad(r, "block %u pinned but not published", i);
		}
		if (k->nchild != nchild[i])
			bad(r, "block %u: nchild %u, counted %u", i, k->nchild, nchild[i]);
		if (k->pin_child != pinch[i] || k->pin < k->pin_child)
			bad(r, "block %u: pin %u, pin_child %u, counted %u", i, k->pin, k->pin_child,
			    pinch[i]);
		if ((bool)k->in_lru != blk_evictable(k))
			bad(r, "block %u: in LRU %d, evictable %d", i, k->in_lru, blk_evictable(k));
		if (k->pending && (!k->published || !k->ref || k->producer < 0 ||
				   (uint32_t)k->producer >= c->n_seq_slots ||
				   !c->seqs[k->producer].open))
			bad(r, "block %u pending without a live producer or not in use", i);
		if (!k->published)
			continue;
		npub++;
		if (pkv_prefix_find(c, k->key) != (int32_t)i)
			bad(r, "published block %u does not resolve through its key", i);
		if (!key_eq(pkv_block_key(k->parent_key, k->ns, blk_tok(c, (int32_t)i), c->bs), k->key))
			bad(r, "published block %u: stored tokens do not produce its key", i);
		if (k->parent < 0 ? !key_eq(k->parent_key, k->ns) :
		    (!c->blk[k->parent].published || !key_eq(c->blk[k->parent].key, k->parent_key)))
			bad(r, "published block %u: parent %d does not match its parent key", i, k->parent);
		/* Tail-first eviction: in use or pinned implies the parent is too. */
		if (k->parent >= 0 && k->ref && !c->blk[k->parent].ref)
			bad(r, "block %u in use but its parent %d is not", i, k->parent);
	}
	if (nfree != c->n_free || ncached != c->n_cached || nfree + ncached + nused != n)
		bad(r, "free %u (counter %u) + cached %u (counter %u) + in use %u != %u blocks", nfree,
		    c->n_free, ncached, c->n_cached, nused, n);
	if (npinned != c->n_pinned || ncp != c->n_cached_pinned)
		bad(r, "pinned %u/%u, cached pinned %u/%u", npinned, c->n_pinned, ncp, c->n_cached_pinned);
	if (npub != c->n_pub)
		bad(r, "%u published blocks but %u table entries", npub, c->n_pub);
	for (b = c->lru_next[c->lru_head]; b != c->lru_head && nlru <= n; b = c->lru_next[b]) {
		nlru++;
		if (!c->blk[b].in_lru || c->lru_prev[c->lru_next[b]] != b)
			bad(r, "LRU list broken at block %d", b);
	}
	if (nlru != c->n_lru)
		bad(r, "LRU holds %u blocks, counter says %u", nlru, c->n_lru);
	free(onfree);
}

static void audit_table(const struct pkv_cache *c, struct rep *r)
{
	uint32_t i, n = 0;

	for (i = 0; i <= c->tab_mask; i++) {
		const struct pent *e = &c->tab[i];
		const struct blk *k;

		if (e->blk < 0)
			continue;
		n++;
		if ((uint32_t)e->blk >= c->g.num_blocks) {
			bad(r, "table slot %u names block %d", i, e->blk);
			continue;
		}
		k = &c->blk[e->blk];
		if (!k->published || k->key.lo != e->lo || k->key.hi != e->hi)
			bad(r, "table slot %u: key does not resolve to a published block with that key", i);
		if (pkv_prefix_find(c, (struct pkv_key){ e->lo, e->hi }) != e->blk)
			bad(r, "table slot %u unreachable by lookup", i);
	}
	if (n != c->n_pub)
		bad(r, "table holds %u entries, counter says %u", n, c->n_pub);
}

static void audit_seqs(const struct pkv_cache *c, struct rep *r, uint32_t *refs)
{
	uint32_t i, j, bs = c->bs, nopen = 0;
	const struct pkv_step *st;

	for (i = 0; i < c->n_seq_slots; i++) {
		const struct seq *s = &c->seqs[i];
		struct pkv_key parent;

		if (!s->open)
			continue;
		nopen++;
		/* Past its tokens, a table holds only the blocks the sequence claimed and still owes. */
		for (j = (s->len + bs - 1) / bs; !s->step && j < s->nblk; j++)
			if (!c->blk[s->tab[j]].pending || c->blk[s->tab[j]].producer != (int32_t)i)
				bad(r, "seq %u: %u blocks for %u tokens, entry %u is no claim of its own",
				    i, s->nblk, s->len, j);
		if (!s->step && s->nblk < (s->len + bs - 1) / bs)
			bad(r, "seq %u: %u blocks for %u tokens", i, s->nblk, s->len);
		if (s->wait_lo > s->wait_hi || s->wait_hi > s->nblk)
			bad(r, "seq %u: wait range [%u, %u) outside its %u blocks", i, s->wait_lo,
			    s->wait_hi, s->nblk);
		parent = s->ns;
		for (j = 0; j < s->nblk; j++) {
			int32_t b = s->tab[j];
			const struct blk *k;

			if (b < 0 || (uint32_t)b >= c->g.num_blocks) {
				bad(r, "seq %u entry %u: block %d", i, j, b);
				continue;
			}
			refs[b]++;
			k = &c->blk[b];
			if (k->published && k->parent != (j ? s->tab[j - 1] : -1))
				bad(r, "seq %u entry %u: published block %d has parent %d, table says %d",
				    i, j, b, k->parent, j ? s->tab[j - 1] : -1);
			if ((j + 1) * bs <= s->len) {
				if (!key_eq(k->key, pkv_block_key(parent, s->ns, blk_tok(c, b), bs)))
					bad(r, "seq %u entry %u: block %d key is stale", i, j, b);
				parent = k->key;
			}
		}
	}
	if (nopen != c->n_open_seqs)
		bad(r, "%u open sequences, counter says %u", nopen, c->n_open_seqs);
	/* An open step holds the block each copy-on-write replaced until it ends. */
	for (st = c->steps_open; st; st = st->next)
		for (i = 0; i < st->n_reqs; i++)
			if (st->reqs[i].cow_old >= 0)
				refs[st->reqs[i].cow_old]++;
}

static void audit_pins(const struct pkv_cache *c, struct rep *r);

static void audit_owners(const struct pkv_cache *c, struct rep *r)
{
	uint32_t i, nown = 0, nsteps = 0;
	const struct pkv_step *st;

	for (st = c->steps_open; st; st = st->next)
		nsteps++;
	if (nsteps != c->n_steps_open)
		bad(r, "%u open steps, counter says %u", nsteps, c->n_steps_open);
	for (i = 0; i <= c->own_mask; i++) {
		const struct owner *o = &c->own[i];
		uint32_t ns = 0, nb = 0, nst = 0;
		int32_t x;

		if (!o->used)
			continue;
		nown++;
		for (x = o->seq_head; x >= 0 && ns <= c->n_seq_slots; x = c->seqs[x].o_next) {
			if (!c->seqs[x].open || c->seqs[x].owner != o->id)
				bad(r, "owner %u lists seq slot %d that is not its own", o->id, x);
			ns++;
			nb += c->seqs[x].nblk;
		}
		for (st = c->steps_open; st; st = st->next)
			nst += st->owner == o->id;
		if (ns != o->nseqs || nb != o->nblocks || nst != o->nsteps)
			bad(r, "owner %u: %u seqs, %u blocks, %u steps; counters say %u, %u, %u", o->id,
			    ns, nb, nst, o->nseqs, o->nblocks, o->nsteps);
	}
	if (nown != c->n_own)
		bad(r, "%u owners, counter says %u", nown, c->n_own);
	audit_pins(c, r);
}

/* Every block's pin count equals the owners' pins through it; budgets and the cap hold. */
static void audit_pins(const struct pkv_cache *c, struct rep *r)
{
	uint32_t n = c->g.num_blocks, i, j, k;
	uint32_t *cnt = calloc(n, sizeof(*cnt));

	if (!cnt) {
		bad(r, "out of memory auditing pins");
		return;
	}
	for (i = 0; i <= c->own_mask; i++) {
		const struct owner *o = &c->own[i];
		uint64_t sum = 0;

		if (!o->used)
			continue;
		for (j = 0; j < o->n_pins; j++) {
			const struct pin_rec *p = &o->pins[j];

			sum += p->n;
			for (k = 0; k < p->n; k++) {
				if (p->blk[k] < 0 || (uint32_t)p->blk[k] >= n) {
					bad(r, "owner %u: pin %u names block %d", o->id, j, p->blk[k]);
					continue;
				}
				cnt[p->blk[k]]++;
				if (k && c->blk[p->blk[k]].parent != p->blk[k - 1])
					bad(r, "owner %u: pin %u is not a root path at %u", o->id, j, k);
			}
			if (p->n && c->blk[p->blk[0]].parent != -1)
				bad(r, "owner %u: pin %u does not start at a root", o->id, j);
		}
		if (sum != o->pin_blocks)
			bad(r, "owner %u: pins hold %llu blocks, counter says %u", o->id,
			    (unsigned long long)sum, o->pin_blocks);
		if (sum > c->lim.pin_budget_blocks)
			bad(r, "owner %u: %llu pinned blocks over the budget %u", o->id,
			    (unsigned long long)sum, c->lim.pin_budget_blocks);
	}
	for (i = 0; i < n; i++)
		if (cnt[i] != c->blk[i].pin)
			bad(r, "block %u: pin %u, owners' pins through it %u", i, c->blk[i].pin, cnt[i]);
	if (c->n_pinned > c->lim.pin_cap_blocks)
		bad(r, "%u pinned blocks over the pool's cap %u", c->n_pinned, c->lim.pin_cap_blocks);
	free(cnt);
}

int pkv_cache_audit(const struct pkv_cache *c, char *report, size_t report_len)
{
	uint32_t n = c->g.num_blocks, i;
	uint32_t *refs = calloc(3 * (size_t)n, sizeof(*refs));
	struct rep r = { report, report_len, 0, 0 };

	if (report && report_len)
		report[0] = '\0';
	if (!refs)
		return -ENOMEM;
	audit_seqs(c, &r, refs);
	for (i = 0; i < n; i++) {
		const struct blk *k = &c->blk[i];

		if (k->published && k->parent >= 0 && (uint32_t)k->parent < n) {
			refs[n + k->parent]++;
			refs[2 * n + k->parent] += k->pin;
		}
	}
	audit_blocks(c, &r, refs, refs + n, refs + 2 * n);
	audit_table(c, &r);
	audit_owners(c, &r);
	free(refs);
	return r.n;
}
