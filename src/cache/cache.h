/* SPDX-License-Identifier: MIT */
/* The cache manager: block pool, prefix table, sequences and steps of one pool (no I/O, no threads). */
#ifndef PKV_CACHE_H
#define PKV_CACHE_H

/*
 * One struct pkv_cache manages the blocks of one pool (DESIGN §2). It owns no
 * KV memory: it hands out block ids and slot numbers, and tells the caller
 * which blocks to copy (copy-on-write). It is not thread-safe; the daemon
 * serialises calls on one pool.
 *
 * Every function returns 0 (or a count) on success and -errno on failure,
 * and a failing call leaves the state exactly as it was.
 */

#include <stddef.h>
#include <stdint.h>
#include <pagedkv/types.h>
#include <pagedkv/backend.h>

struct pkv_cache;
struct pkv_step;

/*
 * A 128-bit prefix key, or a namespace seed. A full block's key is
 * XXH3-128(parent key, namespace, XXH3-128(its block_size token ids)), the
 * parent key of a chain's first block being the namespace itself.
 */
struct pkv_key {
	uint64_t lo, hi;
};

/* Validates a geometry; on -EINVAL writes the reason into why (if non-NULL). */
int pkv_geometry_check(const struct pkv_geometry *g, char *why, size_t why_len);

struct pkv_cache_limits {
	uint32_t max_seqs;            /* sequences open at once (0 = default 65536) */
	uint32_t max_tokens_per_seq;  /* (0 = default 1 << 20) */
	uint32_t pin_budget_blocks;   /* per owner, summed over its pins (0 = num_blocks / 4) */
	uint32_t pin_cap_blocks;      /* pinned blocks in the whole pool (0 = num_blocks / 2) */
	/* block references + pinned blocks of one owner, over any owner limit (0 = 8 x num_blocks) */
	uint32_t max_refs_per_owner;
	uint32_t inflight_claims;     /* 1: seq_open claims its prompt's blocks (see below); 0: off */
	/* a claim lapses after this long without progress by its producer, 10x in a step (0 = 2000) */
	uint32_t inflight_lapse_ms;
};

int pkv_cache_create(const struct pkv_geometry *g, const struct pkv_cache_limits *lim,
		     struct pkv_cache **out);
/*
 * Bytes pkv_cache_create allocates for g (0 for an invalid geometry): about
 * 150 + 4 x block_size bytes per block, which for a geometry with little KV
 * per block exceeds the KV memory itself, so a budget must count both.
 * Sequence tables and step buffers come on top, charged as block references.
 */
uint64_t pkv_cache_footprint(const struct pkv_geometry *g);
void pkv_cache_destroy(struct pkv_cache *c);

/*
 * Namespace seed for prefix keys: model fingerprint + geometry + sharing
 * scope (uid, or PKV_NS_SHARED for cross-user pools) + optional cache salt.
 * Equal seeds share blocks; different seeds never do.
 */
#define PKV_NS_SHARED UINT32_MAX
struct pkv_key pkv_namespace(uint64_t model_id, const struct pkv_geometry *g, uint32_t uid,
			     const void *salt, size_t salt_len);

/*
 * Sequences. A sequence belongs to an owner (a connection id); only the
 * owner may use it (-ENOENT otherwise), and pkv_cache_release_owner drops
 * everything an owner holds. Sequence handles are never reused while open.
 *
 * open walks the prefix chain for tokens and takes a reference on every
 * matching block; *n_cached is the number of leading tokens whose KV exists:
 * whole blocks, at most n_tokens - 1. The sequence then holds those n_cached
 * tokens; the caller's first step supplies tokens[n_cached..].
 *
 * fork, truncate and close return -EBUSY for a sequence in an open step.
 * Handles: a sequence handle is an index plus a generation, so a closed
 * handle stays invalid (-ENOENT) even after its slot is reused.
 */
int pkv_cache_seq_open(struct pkv_cache *c, uint32_t owner, struct pkv_key ns,
		 const int32_t *tokens, uint32_t n_tokens, uint32_t *seq, uint32_t *n_cached);
/*
 * The same open with its prefix walk spread over several calls, so a caller
 * can bound the work of one turn: open_partial matches at most budget blocks
 * (0: no bound) and returns 1 when the budget, not a miss, ended the walk;
 * open_more continues it, budget blocks at a time, with the same tokens and
 * n_tokens, until it returns 0. Meanwhile the sequence is usable and holds
 * what matched so far (*n_cached); using it (a step, fork or truncate) ends
 * the walk, after which open_more is -EINVAL. Past the owner's block limit,
 * open_more stops the match at the limit instead of failing.
 */
int pkv_cache_seq_open_partial(struct pkv_cache *c, uint32_t owner, struct pkv_key ns,
			       const int32_t *tokens, uint32_t n_tokens, uint32_t flags, uint32_t budget,
			       uint32_t *seq, uint32_t *n_cached);
int pkv_cache_seq_open_more(struct pkv_cache *c, uint32_t owner, uint32_t seq, const int32_t *tokens,
			    uint32_t n_tokens, uint32_t budget, uint32_t *n_cached);
/* open_partial flags: PKV_OPEN_SETTLED, the walk stops at the first pending block and claims nothing. */
#define PKV_OPEN_SETTLED (1u << 0)
/*
 * In-flight prefix sharing (limits.inflight_claims = 1). An open whose walk
 * ends on a committed block (or finds nothing) also *claims* the following
 * full blocks of its tokens (at most budget of them, as many as its block
 * limit and the pool allow): they are allocated into the sequence's table
 * past its length and published as pending under their keys, so a second
 * open of the same prefix, before the first has computed it, finds them and
 * counts them in n_cached. A sequence whose table holds a pending block of
 * another sequence cannot begin a step: step_begin fails with -EAGAIN and
 * pkv_cache_blocked_seq names it, until the producer has committed those
 * blocks. If the producer cannot deliver them (it closes, is truncated or
 * released, or steps with other tokens than it claimed), the claim is
 * withdrawn: each waiting sequence is cut back to the tokens before the
 * first withdrawn block, and its next step_begin fails once with -ESTALE
 * (pkv_cache_seq_len tells where to resume). pkv_cache_blocked_seq names
 * the sequence of the last such failure and, for -EAGAIN, the owner of the
 * sequence it waits for (a caller must not wait for its own producer).
 * A claim also lapses, and is withdrawn the same way, when the next
 * step_begin of a sequence waiting on it finds that the producer has made no
 * progress (a claim, or a commit that settled a claimed block) for
 * inflight_lapse_ms, or for 10 x that while the producer holds a step open,
 * or that the waiting sequence itself has waited 10 x that since its open: a
 * producer that never computes, or computes a token at a time (a hostile
 * client in a shared pool), cannot keep every later client of the prefix
 * waiting, nor keep its keys from being published. A
 * producer whose claims lapsed inside an open step still writes and commits
 * those blocks, as its own unshared ones.
 * Claims never outlive their producer, never hold unwritten KV readable by
 * anyone, and count against the producer's block limits like any block in
 * its table.
 */
uint32_t pkv_cache_blocked_seq(const struct pkv_cache *c, uint32_t *producer_owner);
int pkv_cache_seq_fork(struct pkv_cache *c, uint32_t owner, uint32_t seq, uint32_t *child);
int pkv_cache_seq_truncate(struct pkv_cache *c, uint32_t owner, uint32_t seq, uint32_t n_tokens);
int pkv_cache_seq_close(struct pkv_cache *c, uint32_t owner, uint32_t seq);
/* Committed length of a sequence, or -errno. */
int64_t pkv_cache_seq_len(const struct pkv_cache *c, uint32_t owner, uint32_t seq);
/* Aborts the owner's steps and closes its sequences; returns how many sequences closed. */
int pkv_cache_release_owner(struct pkv_cache *c, uint32_t owner);

/*
 * Steps. begin reserves slots for every (sequence, new tokens) pair at once
 * or fails with nothing reserved (-ENOSPC when blocks run out, -EINVAL for a
 * sequence named twice or too many tokens, -EBUSY for a sequence already in
 * an open step, -E2BIG when the dense block table, sequences x the longest
 * one's blocks, would exceed PKV_MAX_STEP_TABLE entries; cache/bounds.h).
 * The metadata it produces stays valid until commit/abort.
 */
struct pkv_step_req {
	uint32_t seq;
	uint32_t n_new;          /* >= 1 */
	const int32_t *tokens;   /* n_new token ids */
};

struct pkv_step_meta {
	uint32_t num_seqs;
	uint32_t total_q;
	uint32_t max_length_q, max_length_k;
	uint32_t max_blocks_per_seq;
	int decode_only;                 /* every sequence has exactly one new token */
	const int32_t *cu_seq_lens_q;    /* [num_seqs + 1] */
	const int32_t *cu_seq_lens_k;    /* [num_seqs + 1], cached + new */
	const int32_t *cache_seqlens;    /* [num_seqs], tokens cached before the step */
	const int32_t *block_tables;     /* [num_seqs][max_blocks_per_seq], -1 padded */
	const int64_t *slot_mapping;     /* [total_q] */
	const struct pkv_block_copy *copies; /* copy-on-write list to run before any write */
	uint32_t num_copies;
};

int pkv_cache_step_begin(struct pkv_cache *c, uint32_t owner, const struct pkv_step_req *reqs,
		   uint32_t n_reqs, struct pkv_step **step, struct pkv_step_meta *meta);
/*
 * Layer coverage. A reserved slot holds whatever the block's previous user
 * (possibly another client) left there until an attend writes the step's
 * K/V into it, and an attend of layer l writes every new slot of the step in
 * layer l before it reads any. So a step may commit only once every layer's
 * attend succeeded: pkv_cache_step_layer_done records one (call it after the
 * backend returned success, never before), and commit fails with -EINVAL,
 * changing nothing, while any layer is missing.
 *
 * layer_done touches only the step's own record, so the thread that runs the
 * step's attends may call it while the cache's thread works on other
 * requests, as long as a hand-off (a mutex) orders it before the commit. The
 * layer must be < num_layers (the caller validated the attend).
 *
 * missing_layers returns how many layers are still missing and writes them
 * as ranges ("3,5-7") into buf (if non-NULL).
 */
void pkv_cache_step_layer_done(struct pkv_step *step, uint32_t layer);
uint32_t pkv_cache_step_missing_layers(const struct pkv_cache *c, const struct pkv_step *step,
				       char *buf, size_t len);

/*
 * Commits: lengths advance, newly full blocks are published. A full block
 * stays private when its key is already published (another sequence filled
 * the same prefix first; hits go to that one) and when the block before it
 * in the sequence is not itself published: a published chain is always
 * published end to end, so a hit never depends on a private block.
 */
int pkv_cache_step_commit(struct pkv_cache *c, struct pkv_step *step);
/*
 * Releases the reservation; nothing else changes, with one exception: a
 * cached block that begin evicted to make room stays evicted (its slots may
 * already hold the step's K/V). A committed or aborted step pointer is dead:
 * commit returns -EINVAL for it, abort ignores it. pkv_cache_release_owner
 * aborts the owner's steps, which kills their pointers too.
 */
void pkv_cache_step_abort(struct pkv_cache *c, struct pkv_step *step);

/*
 * Pinning: the published blocks of the chain matching tokens (whole blocks)
 * survive LRU eviction until unpinned or until their owner is released
 * (pkv_cache_release_owner: a pin never outlives the connection that made
 * it). Each pin counts its blocks against the owner's pin budget, and the
 * pool never holds more than pin_cap_blocks pinned blocks; beyond either,
 * -ENOSPC and nothing changes. A namespace (a salt) buys no budget: the
 * budget follows the owner. Returns the number of tokens pinned.
 */
int pkv_prefix_pin(struct pkv_cache *c, uint32_t owner, struct pkv_key ns, const int32_t *tokens,
		   uint32_t n_tokens);
int pkv_prefix_unpin(struct pkv_cache *c, uint32_t owner, struct pkv_key ns, const int32_t *tokens,
		     uint32_t n_tokens);
/*
 * Drops every cached (unreferenced, unpinned) block from the prefix table;
 * returns how many. A cached block that is the parent of a pinned block
 * cannot be dropped without breaking the chain, and is pinned itself anyway
 * (pins cover whole root paths).
 *
 * unpin undoes the owner's deepest pin whose path is a prefix of the chain
 * matching tokens (-ENOENT when it holds none); it returns the tokens unpinned.
 */
int pkv_cache_flush(struct pkv_cache *c);

struct pkv_cache_stats {
	uint32_t num_blocks, free_blocks, cached_blocks, in_use_blocks, pinned_blocks;
	uint32_t open_seqs, open_steps;
	uint64_t lookup_tokens, hit_tokens;   /* prefix lookups on open */
	uint64_t evictions, cow_copies;
	uint64_t inflight_hit_tokens;         /* of hit_tokens, found pending (in-flight) */
	uint64_t claimed_blocks, withdrawn_blocks;
	uint64_t lapsed_claims;                /* withdrawals of a stalled producer's claims */
};
void pkv_cache_stats(const struct pkv_cache *c, struct pkv_cache_stats *st);

/*
 * Checks the invariants of DESIGN §2; returns the number of problems found
 * and writes a description of the first ones into report (if non-NULL).
 */
int pkv_cache_audit(const struct pkv_cache *c, char *report, size_t report_len);

/*
 * Per-owner limits, for the daemon's quotas (an extension of this contract).
 * max_seqs caps the owner's open sequences; max_blocks caps its block
 * references: the block-table entries of all its sequences, including slots
 * reserved by open steps (a block shared by two of its sequences counts
 * twice; one shared with another owner's sequence counts once for each)
 * plus the blocks of its pins: a pin holds blocks in the pool as surely as a
 * sequence, so references + pinned blocks <= max_blocks. 0 means no limit
 * of the owner's own; limits.max_refs_per_owner holds for every owner, the default. A call that would exceed a limit fails
 * with -ENOSPC for that owner only and changes nothing. Lowering a limit
 * below the current usage is allowed: it only refuses further growth.
 * pkv_cache_release_owner forgets the owner's limits too.
 */
int pkv_cache_set_owner_limits(struct pkv_cache *c, uint32_t owner, uint32_t max_seqs,
			       uint32_t max_blocks);

struct pkv_owner_usage {
	uint32_t seqs;        /* open sequences */
	uint32_t blocks;      /* block references of its sequences and open steps */
	uint32_t pin_blocks;  /* blocks its pins hold (a block pinned and referenced counts in both) */
	uint32_t steps;       /* open steps */
	uint32_t max_seqs, max_blocks;   /* 0 = unlimited */
	uint32_t block_cap;   /* what blocks + pin_blocks may reach: max_blocks, at most max_refs_per_owner */
};
/* Usage of one owner (all zero for an owner the cache does not know). */
void pkv_cache_owner_usage(const struct pkv_cache *c, uint32_t owner, struct pkv_owner_usage *u);

/*
 * A tier below RAM (src/tier) hooks in here; the cache itself does no I/O.
 *
 * The eviction hook runs just before a published block leaves the prefix
 * table (LRU eviction to make room, flush), while its slots still hold its
 * KV: the caller may copy them out. It must not call back into the cache,
 * except for pkv_cache_lru_oldest (it only reads).
 */
struct pkv_evict_info {
	struct pkv_key key, parent, ns;
	const int32_t *tokens;        /* block_size ids */
};
typedef void (*pkv_evict_fn)(void *ud, int32_t blk, const struct pkv_evict_info *e);
void pkv_cache_set_evict_hook(struct pkv_cache *c, pkv_evict_fn fn, void *ud);
/*
 * The n blocks eviction would take first (oldest first), as the hook would
 * see them, into blks and info (n entries each); returns how many. Their KV
 * stays unchanged until the hook is called for them, so a tier may copy it
 * ahead of time (write-behind) as long as the hook waits for that copy.
 */
uint32_t pkv_cache_lru_oldest(const struct pkv_cache *c, uint32_t n, int32_t *blks, struct pkv_evict_info *info);

/* The key of a full block (DESIGN §2), for callers that look further than RAM. */
struct pkv_key pkv_cache_block_key(struct pkv_key parent, struct pkv_key ns, const int32_t *tokens,
				   uint32_t block_size);
/*
 * How many whole blocks of tokens an open would find in RAM now (at most
 * (n_tokens - 1) / block_size), without taking references; *last gets the
 * key of the last one (ns when none).
 */
uint32_t pkv_cache_lookup(const struct pkv_cache *c, struct pkv_key ns, const int32_t *tokens,
			  uint32_t n_tokens, struct pkv_key *last);
/*
 * Adopts a block whose KV comes from elsewhere: allocates a block (evicting
 * as an allocation does), publishes it as the child of the published block
 * keyed parent (or as a chain's first block when parent equals ns) and
 * returns it in *blk holding one reference, so the caller can fill its
 * slots before anything else sees it; adopt_end drops that reference (the
 * block becomes cached). -ENOENT: no such parent; -EEXIST: the key is
 * already published; -ENOSPC: no block can be freed.
 */
int pkv_cache_adopt(struct pkv_cache *c, struct pkv_key ns, struct pkv_key parent, const int32_t *tokens,
		    int32_t *blk);
void pkv_cache_adopt_end(struct pkv_cache *c, int32_t blk);

/* Geometry of the pool and the block size, as given to pkv_cache_create. */
const struct pkv_geometry *pkv_cache_geometry(const struct pkv_cache *c);

#endif
