/* SPDX-License-Identifier: MIT */
/* Per-uid accounting: what each local user holds over all its connections and pools, against its limits. */
#ifndef PKV_DAEMON_TENANT_H
#define PKV_DAEMON_TENANT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct pkv_daemon;
struct session;
struct pool;

/* What one uid holds in one pool (blocks, as the cache counts them for its owners). */
struct tenant_pool {
	struct tenant_pool *next;
	struct pool *pool;
	uint32_t conns;               /* this uid's connections attached to the pool */
	uint64_t blocks;              /* sum of those connections' block references (pool's cache_mu) */
};

/*
 * One record per uid that has a connection past its hello or owns a pool;
 * loop thread only, but for each tenant_pool's blocks (its pool's cache_mu). Every counter is the sum over the uid's connections, so
 * a limit holds however many connections the uid opens.
 */
struct tenant {
	struct tenant *next;
	uid_t uid;
	uint32_t conns;               /* connections past their hello */
	uint32_t clients;             /* of those, client connections (a shared region): uids_connected counts them */
	uint32_t seqs;                /* open sequences, all pools */
	uint32_t pins;                /* prefix pins held */
	uint64_t region_bytes;        /* shared regions (rings + arena) of its connections */
	uint32_t pools;               /* pools it created that still exist */
	uint64_t pool_bytes;          /* their KV bytes, against its share of the budget */
	struct tenant_pool *pp;
};

/* Finds or creates the uid's record; NULL when memory runs out. */
struct tenant *tenant_get(struct pkv_daemon *d, uid_t uid);
struct tenant *tenant_find(const struct pkv_daemon *d, uid_t uid);
/* Shutdown: frees every record. */
void tenant_free_all(struct pkv_daemon *d);
/* Frees the record when it holds nothing. */
void tenant_maybe_drop(struct pkv_daemon *d, struct tenant *t);

/* Hello: counts the connection and its region against the uid; -EDQUOT with why when over. */
int tenant_hello(struct pkv_daemon *d, struct session *s, uint64_t region_bytes, char *why, size_t why_len);
/* Attach: links the session to its uid's per-pool record; -ENOMEM. */
int tenant_attach(struct pkv_daemon *d, struct session *s);
/*
 * tenant_limit and tenant_sync run with s->pool->cache_mu held, on the
 * thread executing s's SQE (the loop, or the worker for a step boundary).
 *
 * Before a cache call of s that may grow what it holds: sets s's owner limits
 * in the cache to what its uid has left. Returns -ENOSPC with the reason in
 * s's error text when nothing is left (the cache reads a limit of 0 as none).
 */
int tenant_limit(struct pkv_daemon *d, struct session *s, uint32_t opcode);
/* After any cache call of s: moves the difference in s's usage into its uid's counters. */
void tenant_sync(struct pkv_daemon *d, struct session *s);
/* Release: drops whatever s still counts (call after the cache released its owner). */
void tenant_leave(struct pkv_daemon *d, struct session *s);

/* Per-uid block limit in a pool (0: none). */
uint64_t tenant_block_limit(const struct pkv_daemon *d, const struct pool *p);
/* Pool creation/destruction: the pool's bytes and count against its owner uid. */
int tenant_pool_check(struct pkv_daemon *d, uid_t uid, uint64_t bytes, char *why, size_t why_len);
void tenant_pool_created(struct pkv_daemon *d, uid_t uid, uint64_t bytes);
void tenant_pool_destroyed(struct pkv_daemon *d, uid_t uid, uint64_t bytes);

#endif
