/* SPDX-License-Identifier: MIT */
/* Per-uid accounting: one record per local user, charged at every point a connection gains or drops something. */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/barrier.h"
#include "common/log.h"
#include "daemon/daemon.h"
#include "daemon/tenant.h"

struct tenant *tenant_find(const struct pkv_daemon *d, uid_t uid)
{
	for (struct tenant *t = d->tenants; t; t = t->next)
		if (t->uid == uid)
			return t;
	return NULL;
}

struct tenant *tenant_get(struct pkv_daemon *d, uid_t uid)
{
	struct tenant *t = tenant_find(d, uid);

	if (t)
		return t;
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->uid = uid;
	t->next = d->tenants;
	d->tenants = t;
	return t;
}

void tenant_free_all(struct pkv_daemon *d)
{
	while (d->tenants) {
		struct tenant *t = d->tenants;

		d->tenants = t->next;
		while (t->pp) {
			struct tenant_pool *tp = t->pp;

			t->pp = tp->next;
			free(tp);
		}
		free(t);
	}
}

void tenant_maybe_drop(struct pkv_daemon *d, struct tenant *t)
{
	struct tenant **pp;

	if (!t || t->conns || t->pools || t->pp)
		return;
	for (pp = &d->tenants; *pp; pp = &(*pp)->next)
		if (*pp == t) {
			*pp = t->next;
			free(t);
			return;
		}
}

int tenant_hello(struct pkv_daemon *d, struct session *s, uint64_t region_bytes, char *why, size_t why_len)
{
	struct tenant *t = tenant_get(d, s->uid);

	if (!t) {
		snprintf(why, why_len, "out of memory");
		return -ENOMEM;
	}
	if (region_bytes > d->cfg.uid_max_region ||
	    t->region_bytes > d->cfg.uid_max_region - region_bytes) {
		snprintf(why, why_len, "uid %u holds %llu bytes of shared regions; this one of %llu would pass "
			 "uid_max_region %llu", (unsigned)s->uid, (unsigned long long)t->region_bytes,
			 (unsigned long long)region_bytes, (unsigned long long)d->cfg.uid_max_region);
		tenant_maybe_drop(d, t);
		return -EDQUOT;
	}
	t->conns++;
	/* Clients only (a region): another uid's pagedkvctl runs no attend, and must not cost ours their hints. */
	if (region_bytes && !t->clients++) {
		pkv_store_relaxed(&d->uids_connected, d->uids_connected + 1);
		if (d->uids_connected == 2)
			worker_uids_shared(d); /* a lone uid's hints no longer count */
	}
	t->region_bytes += region_bytes;
	s->tenant = t;
	s->charged_region = region_bytes;
	return 0;
}

int tenant_attach(struct pkv_daemon *d, struct session *s)
{
	struct tenant *t = s->tenant;
	struct tenant_pool *tp;

	if (!t)
		return -EINVAL;
	for (tp = t->pp; tp; tp = tp->next)
		if (tp->pool == s->pool)
			break;
	if (!tp) {
		tp = calloc(1, sizeof(*tp));
		if (!tp)
			return -ENOMEM;
		tp->pool = s->pool;
		tp->next = t->pp;
		t->pp = tp;
		s->pool->n_uids++;
	}
	tp->conns++;
	s->tp = tp;
	(void)d;
	return 0;
}

uint64_t tenant_block_limit(const struct pkv_daemon *d, const struct pool *p)
{
	/* A private pool has one uid: its blocks are all its owner's to use. */
	if (!(p->flags & PKV_WIRE_POOL_SHARED) || d->cfg.uid_block_share >= 100)
		return 0;
	return (uint64_t)p->geo.num_blocks * d->cfg.uid_block_share / 100;
}

static uint32_t headroom(uint64_t limit, uint64_t used)
{
	uint64_t h = used >= limit ? 0 : limit - used;

	return h > UINT32_MAX ? UINT32_MAX : (uint32_t)h;
}

int tenant_limit(struct pkv_daemon *d, struct session *s, uint32_t opcode)
{
	struct tenant *t = s->tenant;
	struct pkv_owner_usage u;
	uint64_t blimit, seqs, blocks;
	int grows_seqs = opcode == PKV_OP_SEQ_OPEN || opcode == PKV_OP_SEQ_FORK;

	if (!t || !s->tp || !s->pool)
		return 0;
	if (opcode == PKV_OP_PIN) {
		if (t->pins >= d->cfg.uid_max_pins) {
			session_set_err(s, "pin: uid %u is at its quota of %u pins (uid_max_pins)", (unsigned)s->uid, t->pins);
			return -ENOSPC;
		}
	}
	if (!grows_seqs && opcode != PKV_OP_STEP_BEGIN && opcode != PKV_OP_PIN)
		return 0;
	pkv_cache_owner_usage(s->pool->cache, s->id, &u);
	/*
	 * This connection may grow by what its uid has left, and by no more than
	 * its own cap. Only an open or a fork reads the uid's sequence count (a
	 * loop-thread counter over all pools): every other call keeps the limit
	 * the last of those set, since only they add sequences.
	 */
	seqs = u.max_seqs;
	if (grows_seqs) {
		seqs = (uint64_t)u.seqs + headroom(d->cfg.uid_max_seqs, t->seqs);
		if (seqs > d->cfg.client_max_seqs)
			seqs = d->cfg.client_max_seqs;
	}
	if (grows_seqs && seqs <= u.seqs) {
		if (u.seqs >= d->cfg.client_max_seqs)
			session_set_err(s, "this connection is at its quota of %u sequences (client_max_seqs)", u.seqs);
		else
			session_set_err(s, "uid %u is at its quota of %u sequences over all its connections (uid_max_seqs %u)",
					(unsigned)s->uid, t->seqs, d->cfg.uid_max_seqs);
		return -ENOSPC;
	}
	blimit = tenant_block_limit(d, s->pool);
	blocks = 0;
	if (blimit) {
		/* The cache holds blocks + pin_blocks to this limit: the uid's charge counts both. */
		blocks = (uint64_t)u.blocks + u.pin_blocks + headroom(blimit, s->tp->blocks);
		if (blocks > UINT32_MAX)
			blocks = UINT32_MAX;
		/* A limit of 0 means "none" to the cache: refuse here instead. */
		if (!blocks) {
			session_set_err(s, "uid %u holds %llu blocks of pool '%s', its quota of %llu (uid_block_share %u%%)",
					(unsigned)s->uid, (unsigned long long)s->tp->blocks, s->pool->name,
					(unsigned long long)blimit, d->cfg.uid_block_share);
			return -ENOSPC;
		}
	}
	return pkv_cache_set_owner_limits(s->pool->cache, s->id, (uint32_t)seqs, (uint32_t)blocks);
}

void tenant_sync(struct pkv_daemon *d, struct session *s)
{
	struct pkv_owner_usage u;

	(void)d;
	if (!s->tenant || !s->tp || !s->pool)
		return;
	pkv_cache_owner_usage(s->pool->cache, s->id, &u);
	/* Sequences change only on the loop (open, fork, close): the worker never writes the uid-wide count. */
	if (u.seqs != s->charged_seqs) {
		s->tenant->seqs += u.seqs - s->charged_seqs;
		s->charged_seqs = u.seqs;
	}
	/* Pins hold blocks as references do: both are the uid's share (a pinned block it also references counts twice, as in the cache's own limit). */
	s->tp->blocks += (uint64_t)u.blocks + u.pin_blocks - s->charged_blocks;
	s->charged_blocks = u.blocks + u.pin_blocks;
}

void tenant_leave(struct pkv_daemon *d, struct session *s)
{
	struct tenant *t = s->tenant;

	if (!t)
		return;
	t->seqs -= s->charged_seqs;
	t->pins -= s->pins;
	s->charged_seqs = 0;
	s->pins = 0;
	if (s->tp) {
		struct tenant_pool **pp;

		s->tp->blocks -= s->charged_blocks;
		s->charged_blocks = 0;
		if (!--s->tp->conns) {
			for (pp = &t->pp; *pp; pp = &(*pp)->next)
				if (*pp == s->tp) {
					*pp = s->tp->next;
					break;
				}
			s->tp->pool->n_uids--;
			free(s->tp);
		}
		s->tp = NULL;
	}
	t->conns--;
	if (s->charged_region && !--t->clients)
		pkv_store_relaxed(&d->uids_connected, d->uids_connected - 1);
	t->region_bytes -= s->charged_region;
	s->charged_region = 0;
	s->tenant = NULL;
	tenant_maybe_drop(d, t);
}

static uint64_t uid_budget(const struct pkv_daemon *d)
{
	return (uint64_t)((unsigned __int128)d->cfg.memory_budget * d->cfg.uid_budget_share / 100);
}

int tenant_pool_check(struct pkv_daemon *d, uid_t uid, uint64_t bytes, char *why, size_t why_len)
{
	struct tenant *t = tenant_find(d, uid);
	uint64_t have = t ? t->pool_bytes : 0, cap = uid_budget(d);

	if (t && t->pools >= d->cfg.uid_max_pools) {
		snprintf(why, why_len, "uid %u already owns %u pools (uid_max_pools)", (unsigned)uid, t->pools);
		return -EDQUOT;
	}
	if (bytes > cap || have > cap - bytes) {
		snprintf(why, why_len, "uid %u owns pools of %llu bytes; %llu more would pass its share of the "
			 "budget, %llu bytes (uid_budget_share %u%%)", (unsigned)uid, (unsigned long long)have,
			 (unsigned long long)bytes, (unsigned long long)cap, d->cfg.uid_budget_share);
		return -EDQUOT;
	}
	return 0;
}

void tenant_pool_created(struct pkv_daemon *d, uid_t uid, uint64_t bytes)
{
	struct tenant *t = tenant_get(d, uid);

	/* Out of memory here only loses the charge, never the pool: the pool itself is the truth. */
	if (!t) {
		pkv_warn("uid %u: cannot record a pool's owner (out of memory)", (unsigned)uid);
		return;
	}
	t->pools++;
	t->pool_bytes += bytes;
}

void tenant_pool_destroyed(struct pkv_daemon *d, uid_t uid, uint64_t bytes)
{
	struct tenant *t = tenant_find(d, uid);

	if (!t || !t->pools)
		return;
	t->pools--;
	t->pool_bytes -= bytes < t->pool_bytes ? bytes : t->pool_bytes;
	tenant_maybe_drop(d, t);
}
