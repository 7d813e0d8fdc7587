/* SPDX-License-Identifier: MIT */
/* Glue between pagedkvd and its disk tier: lifetime, spill on eviction, fetch before an open, status. */
#ifndef PKV_DAEMON_TIER_GLUE_H
#define PKV_DAEMON_TIER_GLUE_H

#include <stdint.h>
#include <stdio.h>

struct pkv_daemon;
struct pool;
struct session;

/* Opens the tier when disk_cache is set (loop thread, before the loop runs); -errno after logging why. */
int tier_glue_start(struct pkv_daemon *d);
/* After every pool is gone: finishes the writes and closes the tier. */
void tier_glue_stop(struct pkv_daemon *d);
/* A pool was created / is about to be freed (its cached blocks are spilled first). */
void tier_glue_pool_created(struct pkv_daemon *d, struct pool *p);
void tier_glue_pool_destroy(struct pkv_daemon *d, struct pool *p);
/* pkv_cache_flush, spilling every block it drops (pagedkvctl flush); returns blocks dropped. */
int tier_glue_cache_flush(struct pkv_daemon *d, struct pool *p);
/*
 * Before seq_open: when part of tokens' chain is on disk but not in RAM,
 * starts reading it and parks the open (s->open_fetch, returns 1); 0 when
 * there is nothing to read (the open goes on now). Never fails the open.
 * The loop is woken when the reads are done or disk_wait_ms passed.
 */
int tier_glue_fetch_start(struct pkv_daemon *d, struct session *s, const int32_t *tokens, uint32_t n);
/*
 * A parked open (the same tokens): 0 while its reads are in flight; 1 once
 * the verified blocks are in the pool (or the deadline passed, or they
 * failed): the open goes on, and tier_glue_fetch_release follows.
 */
int tier_glue_fetch_ready(struct pkv_daemon *d, struct session *s, const int32_t *tokens);
/* Frees a parked open's fetch (in flight or not); nothing without one. */
void tier_glue_fetch_release(struct pkv_daemon *d, struct session *s);
/* Status: text lines, or a `"disk_tier":{...},` member for JSON; nothing without a tier. */
void tier_glue_status(struct pkv_daemon *d, FILE *f, int json);
/* pagedkvctl flush --disk. */
void tier_glue_flush(struct pkv_daemon *d, FILE *f, int json);

#endif
