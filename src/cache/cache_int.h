/* SPDX-License-Identifier: MIT */
/* Internal state of the cache manager, shared by the files of src/cache (not a public header). */
#ifndef PKV_CACHE_INT_H
#define PKV_CACHE_INT_H

#include <stdbool.h>
#include <string.h>
#include "cache/cache.h"

#define XXH_INLINE_ALL
#include <xxhash.h>
#include "common/keyed_hash.h"

/*
 * A block is free (ref 0, not published), cached (ref 0, published) or in
 * use (ref > 0). ref counts block-table entries plus the references an open
 * step holds on the blocks it copied away from (returned at commit/abort).
 */
struct blk {
	uint32_t ref;
	uint32_t pin;        /* pin references: pinned root paths through this block */
	uint32_t pin_child;  /* sum of pin over published children: pin >= pin_child */
	uint32_t nchild;     /* published children; a parent outlives its published children */
	int32_t parent;      /* published parent block, -1 for the first block of a chain */
	int32_t lru_prev, lru_next;
	uint8_t published, in_lru;
	/*
	 * pending: published at seq_open as a claim (tokens known, KV not yet
	 * written); producer is the slot of the one sequence that computes it.
	 * Cleared when the producer commits the whole block; withdrawn (see
	 * inflight.c) when the producer cannot deliver it.
	 */
	uint8_t pending;
	int32_t producer;
	struct pkv_key key;        /* valid once the block was filled and committed */
	struct pkv_key parent_key; /* published blocks: key of the parent (the namespace for the first) */
	struct pkv_key ns;         /* published blocks: namespace */
};

/* Prefix table entry: open addressing, linear probing, backward-shift deletion (no tombstones). */
struct pent {
	uint64_t lo, hi;
	int32_t blk;         /* -1 = empty */
	int32_t pad;
};

struct seq {
	uint32_t gen;        /* bumps on close so a stale handle never names a new sequence */
	uint8_t open;
	uint32_t owner;
	struct pkv_key ns;
	uint32_t len;        /* committed tokens */
	uint32_t nblk;       /* table entries, including blocks reserved by an open step */
	uint32_t cap;
	int32_t *tab;
	struct pkv_step *step;
	uint8_t opening;     /* its open's prefix walk may continue (pkv_cache_seq_open_more) */
	uint64_t mark;       /* step_begin's duplicate check */
	int32_t o_prev, o_next;  /* the owner's list of sequences (indices) */
	/* Table entries [wait_lo, wait_hi) may still be pending blocks of another sequence. */
	uint32_t wait_lo, wait_hi;
	uint8_t cut;         /* cut back by a withdrawn claim: the next step_begin says -ESTALE once */
	uint8_t settled;     /* opened with PKV_OPEN_SETTLED: its walk ignores pending blocks */
	uint64_t progress_ns; /* its last claim, or commit that settled a claim: when its claims lapse */
	uint64_t wait_since_ns; /* when it began to wait on another's claim: it waits 10 lapses at most */
};

struct owner {
	uint32_t id;
	uint8_t used;
	uint32_t nseqs, nblocks, nsteps;
	uint32_t max_seqs, max_blocks;
	int32_t seq_head;
	struct pin_rec *pins;     /* pins held, released with the owner */
	uint32_t n_pins, cap_pins;
	uint32_t pin_blocks;      /* sum of the pins' lengths, against lim.pin_budget_blocks */
};

/* One pin held by an owner: the root path of blocks it pinned (they cannot be evicted meanwhile). */
struct pin_rec {
	uint32_t n;
	int32_t *blk;
};

struct step_req {
	uint32_t seq;        /* index */
	uint32_t old_len, old_nblk, n_new;
	int32_t cow_idx, cow_old;  /* table index copied and the block it replaced, -1 if none */
};

struct pkv_step {
	struct pkv_step *next, *prev;  /* open list, or free list through next */
	uint32_t owner;
	uint8_t open;
	uint32_t n_reqs, cap_reqs;
	struct step_req *reqs;
	uint32_t cap_q, cap_bt;
	int32_t *cu_q, *cu_k, *cache_seqlens, *bt;
	int64_t *slots;
	struct pkv_block_copy *copies;
	uint32_t n_copies;
	/*
	 * Layers whose attend wrote the step's new K/V (pkv_cache_step_layer_done):
	 * commit needs every one. Sized for the pool's num_layers at allocation.
	 */
	uint64_t layers[];
};

struct pkv_cache {
	struct pkv_geometry g;
	uint32_t bs;
	struct pkv_cache_limits lim;

	struct blk *blk;
	int32_t *tok;            /* [num_blocks][bs] token ids stored in each block */
	int32_t *free_stk;
	uint32_t n_free, n_cached, n_cached_pinned, n_pinned;
	int32_t lru_head;        /* sentinel index num_blocks in lru links */
	int32_t *lru_prev, *lru_next;  /* [num_blocks + 1] */
	uint32_t n_lru;

	struct pent *tab;
	uint32_t tab_mask, n_pub;
	struct pkv_hash_secret slot_secret;  /* keys the table's home slots (keyed_hash.h) */

	struct seq *seqs;
	uint32_t n_seq_slots, n_open_seqs;
	uint32_t *seq_free;      /* stack of free slot indices */
	uint32_t n_seq_free;
	uint32_t idx_bits;
	uint64_t mark_epoch;

	struct owner *own;
	uint32_t own_mask, n_own;

	struct pkv_step *steps_open, *steps_free;
	uint32_t n_steps_open;

	int32_t *scratch;        /* [num_blocks]: chain walks of pin/unpin */

	uint64_t lookup_tokens, hit_tokens, evictions, cow_copies;
	uint64_t inflight_hit_tokens, claimed_blocks, withdrawn_blocks, lapsed_claims;
	uint32_t blocked_seq;    /* handle that made the last step_begin fail -EAGAIN/-ESTALE */
	uint32_t blocked_by;     /* -EAGAIN: the owner of the sequence computing what it waits for */

	pkv_evict_fn evict_fn;   /* adopt.c: a tier's spill hook */
	void *evict_ud;
};

static inline bool key_eq(struct pkv_key a, struct pkv_key b)
{
	return a.lo == b.lo && a.hi == b.hi;
}

/* H(parent, namespace, block tokens): the tokens are hashed once, then mixed with both keys. */
static inline struct pkv_key pkv_block_key(struct pkv_key parent, struct pkv_key ns,
					   const int32_t *tok, uint32_t bs)
{
	XXH128_hash_t t = XXH3_128bits(tok, (size_t)bs * sizeof(*tok));
	uint64_t buf[6] = { parent.lo, parent.hi, ns.lo, ns.hi, t.low64, t.high64 };
	XXH128_hash_t h = XXH3_128bits(buf, sizeof(buf));

	return (struct pkv_key){ h.low64, h.high64 };
}

static inline int32_t *blk_tok(const struct pkv_cache *c, int32_t b)
{
	return c->tok + (size_t)b * c->bs;
}

/* What an owner's block references plus pinned blocks may reach. */
static inline uint64_t owner_block_cap(const struct pkv_cache *c, const struct owner *o)
{
	uint64_t m = c->lim.max_refs_per_owner;

	if (o && o->max_blocks && o->max_blocks < m)
		m = o->max_blocks;
	return m;
}

/* Blocks the owner may still take (references and pins share one limit); o may be NULL. */
static inline uint64_t owner_room(const struct pkv_cache *c, const struct owner *o)
{
	uint64_t held = o ? (uint64_t)o->nblocks + o->pin_blocks : 0, cap = owner_block_cap(c, o);

	return held < cap ? cap - held : 0;
}

static inline bool blk_evictable(const struct blk *b)
{
	return b->ref == 0 && b->published && b->pin == 0 && b->nchild == 0;
}

/* pool.c */
void pkv_lru_update(struct pkv_cache *c, int32_t b);
int32_t pkv_blk_alloc(struct pkv_cache *c);
void pkv_blk_decref(struct pkv_cache *c, int32_t b);
void pkv_blk_incref(struct pkv_cache *c, int32_t b);
uint32_t pkv_blk_available(const struct pkv_cache *c);
void pkv_blk_evict(struct pkv_cache *c, int32_t b);

/* prefix.c */
int32_t pkv_prefix_find(const struct pkv_cache *c, struct pkv_key key);
void pkv_prefix_insert(struct pkv_cache *c, struct pkv_key key, int32_t b);
void pkv_prefix_remove(struct pkv_cache *c, struct pkv_key key);
uint32_t pkv_prefix_walk(const struct pkv_cache *c, struct pkv_key ns, const int32_t *tokens,
			 uint32_t max_blocks, int32_t *out);
/* The same walk continued after a matched block whose key is parent. */
uint32_t pkv_prefix_walk_from(const struct pkv_cache *c, struct pkv_key ns, struct pkv_key parent,
			      const int32_t *tokens, uint32_t max_blocks, int32_t *out);
uint32_t pkv_prefix_max_walk(const struct pkv_cache *c, uint32_t n_tokens);
void pkv_prefix_publish_new(struct pkv_cache *c, struct seq *s, uint32_t from_blk, uint32_t to_blk);

/* seq.c */
struct seq *pkv_seq_get(const struct pkv_cache *c, uint32_t owner, uint32_t handle);
struct owner *pkv_owner_find(const struct pkv_cache *c, uint32_t id);
struct owner *pkv_owner_get(struct pkv_cache *c, uint32_t id);
void pkv_owner_maybe_drop(struct pkv_cache *c, uint32_t id);
/* Drops every pin the owner holds. */
void pkv_prefix_release_pins(struct pkv_cache *c, struct owner *o);
int pkv_seq_reserve_tab(struct seq *s, uint32_t need);
uint32_t pkv_seq_handle(const struct pkv_cache *c, const struct seq *s);
void pkv_seq_drop_blocks(struct pkv_cache *c, struct seq *s, uint32_t keep);

/* inflight.c: pending blocks (claims) and their consumers */
void pkv_inflight_note_hits(struct pkv_cache *c, struct seq *s, uint32_t from, uint32_t to);
uint32_t pkv_inflight_claim(struct pkv_cache *c, struct seq *s, const int32_t *tokens,
			    uint32_t n_tokens, uint32_t max_claims);
void pkv_inflight_withdraw(struct pkv_cache *c, struct seq *s, uint32_t from);
int pkv_inflight_check(struct pkv_cache *c, struct seq *s, const struct pkv_step_req *r);
void pkv_inflight_settle(struct pkv_cache *c, struct seq *s, uint32_t from, uint32_t to);
void pkv_inflight_abort(struct pkv_cache *c, struct seq *s);
uint32_t pkv_inflight_trim(const struct pkv_cache *c, const int32_t *blk, uint32_t n);

#endif
