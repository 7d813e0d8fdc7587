/* SPDX-License-Identifier: MIT */
/* The prefix-cache tier below RAM: keys, verification, namespaces, budgets and the index; a backend moves bytes. */
#ifndef PKV_TIER_H
#define PKV_TIER_H

/*
 * A tier keeps full, published KV blocks that left RAM, so that a later
 * open of the same prefix (in this daemon run or the next) reads them back
 * instead of recomputing them. It knows blocks as byte records; it has no
 * model knowledge and never touches the cache manager: the daemon's glue
 * copies a block's bytes into a staging buffer the tier hands out (spill),
 * and copies fetched, verified bytes into blocks it allocated (fetch).
 *
 * Threads: every call below is made from one thread (the daemon's loop);
 * the tier runs its own thread for the I/O, and a fetch need not block the
 * caller (pkv_tier_fetch_start, poll, the config's notify). A block is findable (probe,
 * fetch) only once its write completed and its index entry was written.
 *
 * Trust: a fetched record is served only when its checksum (XXH3-64 over
 * the whole record), key, parent key, namespace, tokens and pool
 * fingerprint all equal what the caller asked for; anything else is a miss
 * and the record is dropped.
 */

#include <stddef.h>
#include <stdint.h>
#include "cache/cache.h"

struct pkv_tier;
struct pkv_tier_fetch;

/* What makes a block's bytes meaningful: geometry of one block, dtype and model. */
struct pkv_tier_fp {
	uint64_t model_id;
	uint32_t num_layers, num_kv_heads, head_dim, cache_dtype, block_size;
	uint32_t reserved;
};

/* The fingerprint of a pool (num_blocks and the query heads do not change a block's bytes). */
void pkv_tier_fp_of(const struct pkv_geometry *g, uint64_t model_id, struct pkv_tier_fp *fp);
/* Bytes of K and V of one block over every layer, 0 for a geometry out of range. */
uint64_t pkv_tier_kv_bytes(const struct pkv_tier_fp *fp);

struct pkv_tier_config {
	const char *dir;              /* created 0700 if missing; must belong to the effective uid */
	uint64_t budget;              /* bytes of records on disk */
	unsigned uid_share;           /* percent of budget one uid's blocks may hold (1..100) */
	uint64_t staging;             /* bytes of staging buffers (0 = 64 MiB) */
	unsigned queue_depth;         /* I/O requests in flight (0 = 64) */
	int buffered;                 /* 1 = never O_DIRECT (tests, benchmarks) */
	/*
	 * Called on the tier thread when a fetch begun with pkv_tier_fetch_start
	 * completes or reaches its deadline (the daemon writes its loop's
	 * eventfd). Must not call into the tier.
	 */
	void (*notify)(void *ud);
	void *notify_ud;
	/* Test hook: while this path does not exist, fetch reads stay queued (a slow disk on demand). */
	const char *read_gate;
};

/*
 * Opens the tier directory, rebuilds the index from it (records whose
 * fingerprint no pool has yet are kept, found once a matching class is
 * attached) and starts the tier thread. -errno with the reason in why.
 */
int pkv_tier_open(const struct pkv_tier_config *cfg, struct pkv_tier **out, char *why, size_t why_len);
/* Finishes the queued writes, stops the thread, closes the files. */
void pkv_tier_close(struct pkv_tier *t);

/* A class is the storage of one fingerprint; returns its id (>= 0) or -errno. */
int pkv_tier_class(struct pkv_tier *t, const struct pkv_tier_fp *fp);

/* One block as the cache knows it. */
struct pkv_tier_block {
	struct pkv_key key, parent, ns;
	uint32_t uid;                 /* budget owner; PKV_NS_SHARED for shared pools */
	const int32_t *tokens;        /* block_size ids */
};

/*
 * Spill, in two calls so that the caller copies the KV bytes straight into
 * the staging buffer: begin returns it (kv_bytes long), commit queues the
 * write. begin returns -EEXIST when the key is already in the tier (it is
 * marked recently used), -EAGAIN when no staging buffer is free (the block
 * is simply not spilled: RAM never waits for the disk), -ENOSPC while
 * spilling is stopped (disk full; reason in the stats).
 */
int pkv_tier_spill_begin(struct pkv_tier *t, int cls, const struct pkv_tier_block *b, void **kv);
void pkv_tier_spill_commit(struct pkv_tier *t, void *kv);
/* Gives a begun spill back unwritten. */
void pkv_tier_spill_cancel(struct pkv_tier *t, void *kv);

/*
 * Write-behind: queues block b to be spilled with its KV copied later, on
 * the tier thread, by copy(ud, tag, kv) (kv_bytes into kv). The caller
 * keeps the source unchanged until it has called pkv_tier_spill_forget for
 * (ud, tag). Never uses more than half the staging (-EAGAIN); -EEXIST when
 * the key is in the tier or queued; -ENOSPC while spilling is stopped.
 */
typedef void (*pkv_tier_copy_fn)(void *ud, int32_t tag, void *kv);
int pkv_tier_spill_later(struct pkv_tier *t, int cls, const struct pkv_tier_block *b, pkv_tier_copy_fn copy,
			 void *ud, int32_t tag);
/*
 * The source of (ud, tag), holding key, is about to change: a queued copy of it is made
 * now, on the caller's thread; one running on the tier thread is waited
 * for. Returns 1 when a write-behind spill of it exists (its bytes are on
 * their way to disk), 0 when none. tag < 0: every block of ud, and the
 * ones not copied yet are dropped instead (ud's memory is going away).
 */
int pkv_tier_spill_forget(struct pkv_tier *t, void *ud, int32_t tag, struct pkv_key key);

/*
 * How many of keys[0..n) are in the tier, consecutively from the first,
 * for class cls (a lookup in the index only; nothing is read).
 */
uint32_t pkv_tier_probe(struct pkv_tier *t, int cls, const struct pkv_key *keys, uint32_t n);

/*
 * Fetch: reads the chain keys[0..n) (block i's parent is keys[i - 1], the
 * first one's is parent) in one submission, verifies every record and
 * waits at most timeout_ms. Returns how many leading blocks are verified
 * and ready (their bytes via pkv_tier_fetch_kv) or -errno; *f must be
 * given back with pkv_tier_fetch_done whatever the result (a fetch still in
 * flight after the timeout is finished and freed by the tier thread).
 * uid is the requester: one uid's fetches not yet given back hold at most
 * half the staging together, so n is cut to what is left of its half
 * (-EAGAIN when not one record fits).
 */
int pkv_tier_fetch(struct pkv_tier *t, int cls, uint32_t uid, struct pkv_key ns, struct pkv_key parent,
		   const struct pkv_key *keys, const int32_t *tokens, uint32_t n, unsigned timeout_ms,
		   struct pkv_tier_fetch **f);
/*
 * The same without blocking: start queues the reads and returns how many
 * blocks are being read (0: none) or -errno; poll returns -EINPROGRESS
 * while they are, then the verified leading blocks (as pkv_tier_fetch), or
 * -ETIMEDOUT once timeout_ms passed first. The config's notify is called
 * when poll's answer stops being -EINPROGRESS, and while it is, each time
 * a few more of the chain's leading records are verified. *f goes back
 * through pkv_tier_fetch_done in every case, in flight or not.
 *
 * pkv_tier_fetch_kv(f, i) gives the bytes of record i once a poll saw it
 * verified: every i < the count poll returned when complete, and before
 * that, while poll still returns -EINPROGRESS or -ETIMEDOUT, the leading
 * records already read and verified (NULL for the others). So a caller
 * may copy a prefix's head into its pool while the tail is being read.
 */
int pkv_tier_fetch_start(struct pkv_tier *t, int cls, uint32_t uid, struct pkv_key ns, struct pkv_key parent,
			 const struct pkv_key *keys, const int32_t *tokens, uint32_t n, unsigned timeout_ms,
			 struct pkv_tier_fetch **f);
int pkv_tier_fetch_poll(struct pkv_tier *t, struct pkv_tier_fetch *f);
const void *pkv_tier_fetch_kv(const struct pkv_tier_fetch *f, uint32_t i);
/* How many leading records pkv_tier_fetch_kv gives, as of the last poll. */
uint32_t pkv_tier_fetch_avail(const struct pkv_tier_fetch *f);
void pkv_tier_fetch_done(struct pkv_tier *t, struct pkv_tier_fetch *f);

/*
 * Reads every block of the tier and verifies what can be verified without
 * a caller (checksum, fingerprint, key); failures are dropped. Returns the
 * blocks checked, *dropped the ones that failed. Slow: an fsck, for tests
 * and administrators.
 */
int64_t pkv_tier_check_all(struct pkv_tier *t, uint64_t *dropped);

/* Waits until at least one I/O completes (a staging buffer may be free again), or none is pending. */
void pkv_tier_wait_io(struct pkv_tier *t);
/* Waits until every queued spill is written (or dropped). */
void pkv_tier_drain(struct pkv_tier *t);
/* Drops every block from the tier (index and files); spilling resumes if it was stopped. Returns blocks dropped. */
int64_t pkv_tier_flush(struct pkv_tier *t);

struct pkv_tier_stats {
	uint64_t blocks, bytes, budget;
	uint64_t lookups, hits;                /* blocks asked for by fetch, blocks served */
	uint64_t spilled, spill_skipped;       /* written; not spilled (staging full, duplicate) */
	uint64_t spilled_behind;               /* of spilled, copied on the tier thread (write-behind) */
	uint64_t evicted, corrupt;             /* budget evictions; records failing verification */
	uint64_t read_bytes, read_ns, write_bytes, write_ns;  /* ns: time with reads / writes in flight */
	uint32_t classes, uids;
	uint32_t fetching;                     /* started fetches a caller still waits for */
	uint32_t index_probe_max;              /* longest probe run an index insert met */
	int stopped;                           /* spilling stopped: -errno of the failure, else 0 */
	int direct;                            /* O_DIRECT in use */
	char stop_reason[128];
};
void pkv_tier_stats(struct pkv_tier *t, struct pkv_tier_stats *st);

/* Index memory (heap bytes held for the index), for the benchmark's bytes per block. */
uint64_t pkv_tier_index_bytes(struct pkv_tier *t);

#endif
