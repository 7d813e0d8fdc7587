/* SPDX-License-Identifier: MIT */
/* Pools: found by name within the attaching uid's scope, created within the budget, freed when idle. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include "common/log.h"
#include "common/region.h"
#include "daemon/daemon.h"
#include "daemon/sigbus.h"
#include "daemon/tier_glue.h"

/*
 * What a pool costs the budget: its KV and the cache manager's bookkeeping
 * (block records, stored token ids, the prefix table). With a tiny geometry the
 * bookkeeping outweighs the KV, so a budget counting KV alone could be overrun
 * many times over by pools of many small blocks.
 */
uint64_t pool_bytes(const struct pkv_geometry *g)
{
	uint64_t b = block_kv_bytes(g);

	if (!b || !pkv_mul_ok(b, g->num_blocks, &b))
		return 0;
	return b + pkv_cache_footprint(g);
}

uint64_t block_kv_bytes(const struct pkv_geometry *g)
{
	uint64_t b = 2; /* K and V */

	if (!pkv_mul_ok(b, g->num_layers, &b) || !pkv_mul_ok(b, g->block_size, &b) ||
	    !pkv_mul_ok(b, g->num_kv_heads, &b) || !pkv_mul_ok(b, g->head_dim, &b) ||
	    !pkv_mul_ok(b, pkv_dtype_size(g->cache_dtype), &b))
		return 0;
	return b;
}

/* Names the first difference between an existing pool and an attach request. */
static int mismatch(const struct pool *p, const struct pkv_msg_attach *m, char *why, size_t why_len)
{
	static const char *const gnames[] = { "num_layers", "num_heads", "num_kv_heads", "head_dim",
					       "cache_dtype", "block_size", "num_blocks" };
	const uint32_t *a = &p->geo.num_layers, *b = &m->geo.num_layers;

	for (int i = 0; i < 7; i++)
		if (a[i] != b[i]) {
			snprintf(why, why_len, "pool '%s' has %s %u, the attach asks for %u", p->name,
				 gnames[i], a[i], b[i]);
			return -EINVAL;
		}
	if (p->act_dtype != m->act_dtype) {
		snprintf(why, why_len, "pool '%s' has activation dtype %u, the attach asks for %u",
			 p->name, p->act_dtype, m->act_dtype);
		return -EINVAL;
	}
	if (p->model_id != m->model_id) {
		snprintf(why, why_len, "pool '%s' holds model 0x%llx, the attach names 0x%llx", p->name,
			 (unsigned long long)p->model_id, (unsigned long long)m->model_id);
		return -EINVAL;
	}
	if ((p->flags ^ m->flags) & PKV_WIRE_POOL_SHARED) {
		snprintf(why, why_len, "pool '%s' was created %s across users", p->name,
			 (p->flags & PKV_WIRE_POOL_SHARED) ? "shared" : "not shared");
		return -EINVAL;
	}
	if (p->flags != m->flags) {
		snprintf(why, why_len, "pool '%s' was created %s client attention", p->name,
			 (p->flags & PKV_WIRE_POOL_CLIENT_ATTN) ? "with" : "without");
		return -EINVAL;
	}
	if (p->scale != m->scale || p->softcap != m->softcap || p->window_left != m->window_left) {
		snprintf(why, why_len, "pool '%s' has scale %g, softcap %g, window %d; the attach differs",
			 p->name, p->scale, p->softcap, p->window_left);
		return -EINVAL;
	}
	return 0;
}

/* A private pool's name belongs to its owner; a shared pool's name to every uid. */
static int in_scope(const struct pool *p, const char *name, uint32_t flags, uid_t uid)
{
	if (strcmp(p->name, name))
		return 0;
	if ((p->flags & PKV_WIRE_POOL_SHARED) != (flags & PKV_WIRE_POOL_SHARED))
		return 0;
	return (flags & PKV_WIRE_POOL_SHARED) || p->owner_uid == uid;
}

static void unlink_pool(struct pkv_daemon *d, struct pool *p)
{
	for (struct pool **pp = &d->pools; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			return;
		}
}

/* Frees the pool idle for longest (of owner `uid` only, when `mine`); returns 0 when there is none. */
static int free_oldest_idle(struct pkv_daemon *d, int mine, uid_t uid)
{
	struct pool *oldest = NULL;

	for (struct pool *p = d->pools; p; p = p->next)
		if (!p->n_clients && (!mine || p->owner_uid == uid) &&
		    (!oldest || p->idle_since_ns < oldest->idle_since_ns))
			oldest = p;
	if (!oldest)
		return 0;
	pkv_info("pool '%s' (uid %u) freed: idle, and an attach needs its budget", oldest->name,
		 (unsigned)oldest->owner_uid);
	unlink_pool(d, oldest);
	pool_destroy(d, oldest);
	return 1;
}

/* Frees idle pools, longest idle first, until `bytes` fit the budget; returns whether they do. */
/* SIGHUP may have lowered the budget below what existing pools use: then nothing is left. */
static uint64_t budget_left(const struct pkv_daemon *d)
{
	return d->budget_used < d->cfg.memory_budget ? d->cfg.memory_budget - d->budget_used : 0;
}

static int reclaim(struct pkv_daemon *d, uint64_t bytes)
{
	while (bytes > budget_left(d))
		if (!free_oldest_idle(d, 0, 0))
			return 0;
	return 1;
}

/*
 * The attach's scale, soft-cap and window: what the batch check accepts
 * (else every attend of the pool would fail, and only the worker's own
 * split pieces, which set their window themselves, would pass), and only
 * what both backends serve.
 */
static int attention_params_check(const struct pkv_daemon *d, const struct pkv_msg_attach *m, char *why,
				  size_t why_len)
{
	uint32_t feat = d->plug_varlen.be->caps->features &
			(d->same_plugin ? d->plug_varlen.be : d->plug_decode.be)->caps->features;

	if (!(m->scale >= 0 && isfinite(m->scale)) || !(m->softcap >= 0 && isfinite(m->softcap)) ||
	    m->window_left < -1) {
		snprintf(why, why_len, "pool '%s': scale %g, softcap %g, window_left %d: scale and softcap >= 0, "
			 "window_left -1 (none) or >= 0", m->name, m->scale, m->softcap, m->window_left);
		return -EINVAL;
	}
	if ((m->window_left >= 0 && !(feat & PKV_FEAT_WINDOW)) || (m->softcap > 0 && !(feat & PKV_FEAT_SOFTCAP))) {
		snprintf(why, why_len, "pool '%s': the backends serve no %s", m->name,
			 m->window_left >= 0 && !(feat & PKV_FEAT_WINDOW) ? "sliding window" : "soft-cap");
		return -ENOTSUP;
	}
	return 0;
}

/*
 * The KV memory of a pool whose clients attend themselves: a memfd sealed
 * against resizing and further seals before anyone maps it (a client that
 * could shrink it would SIGBUS the daemon; one that could add a write seal
 * would stop every other client's attends), mapped here too: copy-on-write
 * and the disk tier work on it as on any pool. Watched for SIGBUS like a
 * client's region, since clients hold the same file. It gets 4 KiB pages
 * (shmem has huge pages only where the administrator enabled them), and is
 * not pre-faulted: clients fault it in as their steps first touch it.
 */
static int shared_mem_create(struct pool *p, size_t bytes, char *why, size_t why_len)
{
	int fd = memfd_create("pagedkv-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING), r;
	void *map = MAP_FAILED;

	if (fd < 0)
		goto fail;
	if (ftruncate(fd, (off_t)bytes) || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
		goto fail;
	map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		goto fail;
	r = pkv_sigbus_watch(map, bytes);
	if (r < 0) {
		errno = -r;
		goto fail;
	}
	p->shared_fd = fd;
	p->shared_map = map;
	p->shared_len = bytes;
	p->shared_watch = r;
	return 0;
fail:
	r = -errno;
	snprintf(why, why_len, "pool '%s': its shared KV memory (%zu bytes): %s", p->name, bytes, strerror(errno));
	if (map != MAP_FAILED)
		munmap(map, bytes);
	if (fd >= 0)
		close(fd);
	return r;
}

static void shared_mem_free(struct pool *p)
{
	if (p->shared_fd < 0)
		return;
	if (pkv_sigbus_faulted(p->shared_watch))
		pkv_warn("pool '%s' (uid %u): its shared KV memory faulted (SIGBUS) while the daemon used it",
			 p->name, (unsigned)p->owner_uid);
	pkv_sigbus_unwatch(p->shared_watch);
	munmap(p->shared_map, p->shared_len);
	/*
	 * A process that kept its mapping (one that spoke the protocol itself
	 * and never unmapped) would keep the pages alive past the pool, outside
	 * the budget, some of them charged to the daemon (its copies, the disk
	 * tier's fetches): a hole over the whole file frees them from every
	 * mapping, which reads zeros from then on.
	 */
	if (fallocate(p->shared_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)p->shared_len))
		pkv_warn("pool '%s': cannot free its shared KV memory: %s", p->name, strerror(errno));
	close(p->shared_fd);
	p->shared_fd = -1;
}

/* Opens the pool's backends: over a shared memfd for a client-attention pool, else on cache_alloc's memory. */
static int pool_open_backends(struct pkv_daemon *d, struct pool *p, const struct pkv_pool_desc *desc, char *why,
			      size_t why_len)
{
	struct pkv_plugin *dec = d->same_plugin ? &d->plug_varlen : &d->plug_decode;
	struct pkv_cache_mem lay;
	size_t bytes;
	int r;

	if (!(p->flags & PKV_WIRE_POOL_CLIENT_ATTN))
		return pkv_dispatch_open(&p->disp, &d->plug_varlen, dec, desc, why, why_len);
	bytes = pkv_shared_cache_layout(&p->geo, &lay);
	if (!bytes) {
		snprintf(why, why_len, "pool '%s': its size overflows", p->name);
		return -EINVAL;
	}
	if (d->plug_varlen.be->caps->domain != PKV_DOMAIN_HOST || dec->be->caps->domain != PKV_DOMAIN_HOST) {
		snprintf(why, why_len, "pool '%s': client attention needs backends on host memory; %s is not",
			 p->name, d->plug_varlen.path);
		return -ENOTSUP;
	}
	r = shared_mem_create(p, bytes, why, why_len);
	if (r)
		return r;
	r = pkv_dispatch_open_shared(&p->disp, &d->plug_varlen, dec, desc, p->shared_map, p->shared_len, why,
				     why_len);
	if (r)
		shared_mem_free(p);
	return r;
}

int pool_attach(struct pkv_daemon *d, const struct pkv_msg_attach *m, uid_t uid, struct pool **out,
		char *why, size_t why_len)
{
	struct pkv_cache_limits lim = { 0 };
	struct pkv_pool_desc desc;
	struct pool *p;
	uint64_t bytes, left;
	int r;

	for (p = d->pools; p; p = p->next)
		if (in_scope(p, m->name, m->flags, uid)) {
			r = mismatch(p, m, why, why_len);
			if (!r) {
				*out = p;
				return 0;
			}
			/* Nobody uses it: the name goes to the new geometry (its cached prefixes go too). */
			if (p->n_clients)
				return r;
			pkv_info("pool '%s' (uid %u) freed: idle, and reattached with another geometry",
				 p->name, (unsigned)p->owner_uid);
			unlink_pool(d, p);
			pool_destroy(d, p);
			break;
		}
	r = pkv_geometry_check(&m->geo, why, why_len);
	if (!r)
		r = attention_params_check(d, m, why, why_len);
	if (r)
		return r;
	bytes = pool_bytes(&m->geo);
	if (!bytes) {
		snprintf(why, why_len, "pool '%s': its size overflows", m->name);
		return -EINVAL;
	}
	/* Larger than the whole budget first: no quota could ever let it in. */
	if (bytes <= d->cfg.memory_budget) {
		/* Over its own share: the uid's idle pools make room first. */
		while ((r = tenant_pool_check(d, uid, bytes, why, why_len)) && free_oldest_idle(d, 1, uid))
			;
		if (r)
			return r;
	}
	if (bytes > d->cfg.memory_budget || !reclaim(d, bytes)) {
		left = budget_left(d);
		snprintf(why, why_len, "pool '%s' needs %llu bytes (KV cache and its index); %llu of the %llu-byte budget are left",
			 m->name, (unsigned long long)bytes, (unsigned long long)left,
			 (unsigned long long)d->cfg.memory_budget);
		return -ENOMEM;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->cache_mu, NULL);
	snprintf(p->name, sizeof(p->name), "%s", m->name);
	p->geo = m->geo;
	p->act_dtype = m->act_dtype;
	p->flags = m->flags;
	p->model_id = m->model_id;
	p->scale = m->scale;
	p->softcap = m->softcap;
	p->window_left = m->window_left;
	p->bytes = bytes;
	p->owner_uid = uid;
	p->shared_fd = -1;
	/* The backend checks the pool before anything is allocated for it: a refused attach costs nothing. */
	memset(&desc, 0, sizeof(desc));
	desc.abi_version = PKV_BACKEND_ABI_VERSION;
	desc.struct_size = sizeof(desc);
	desc.geo = p->geo;
	desc.act_dtype = p->act_dtype;
	backend_lock_loop(d);
	r = pool_open_backends(d, p, &desc, why, why_len);
	pthread_mutex_unlock(&d->backend_mu);
	if (r)
		goto err_free;
	lim.inflight_claims = d->cfg.inflight_sharing;
	r = pkv_cache_create(&p->geo, &lim, &p->cache);
	if (r) {
		snprintf(why, why_len, "pool '%s': cache manager refused the geometry (%s)", m->name,
			 strerror(-r));
		goto err_disp;
	}
	d->budget_used += bytes;
	tenant_pool_created(d, uid, bytes);
	p->next = d->pools;
	d->pools = p;
	tier_glue_pool_created(d, p);
	pkv_info("pool '%s' created for uid %u%s%s: %u layers, %u/%u heads, head_dim %u, %u blocks of %u (%llu MiB)",
		 p->name, (unsigned)uid, (p->flags & PKV_WIRE_POOL_SHARED) ? " (shared)" : "",
		 (p->flags & PKV_WIRE_POOL_CLIENT_ATTN) ? " (client attention)" : "",
		 p->geo.num_layers, p->geo.num_heads, p->geo.num_kv_heads, p->geo.head_dim, p->geo.num_blocks, p->geo.block_size, (unsigned long long)(bytes >> 20));
	*out = p;
	return 0;
err_disp:
	backend_lock_loop(d);
	pkv_dispatch_close(&p->disp);
	pthread_mutex_unlock(&d->backend_mu);
	shared_mem_free(p);
err_free:
	pthread_mutex_destroy(&p->cache_mu);
	free(p);
	return r;
}

void pool_left(struct pkv_daemon *d, struct pool *p)
{
	if (p->n_clients)
		return;
	p->idle_since_ns = pkv_now_ns();
	if (!d->cfg.pool_idle_grace_s) {
		pkv_info("pool '%s' (uid %u) freed: no clients", p->name, (unsigned)p->owner_uid);
		unlink_pool(d, p);
		pool_destroy(d, p);
	}
}

void pool_reap(struct pkv_daemon *d, uint64_t now_ns)
{
	uint64_t grace = (uint64_t)d->cfg.pool_idle_grace_s * 1000000000ull;
	struct pool **pp = &d->pools;

	while (*pp) {
		struct pool *p = *pp;

		if (!p->n_clients && now_ns - p->idle_since_ns >= grace) {
			pkv_info("pool '%s' (uid %u) freed: no clients for %u s", p->name,
				 (unsigned)p->owner_uid, d->cfg.pool_idle_grace_s);
			*pp = p->next;
			pool_destroy(d, p);
		} else {
			pp = &p->next;
		}
	}
}

void backend_lock_loop(struct pkv_daemon *d)
{
	__atomic_add_fetch(&d->backend_wanted, 1, __ATOMIC_ACQ_REL);
	pthread_mutex_lock(&d->backend_mu);
	__atomic_sub_fetch(&d->backend_wanted, 1, __ATOMIC_ACQ_REL);
}

/*
 * Callers unlinked p; no session points at it (n_clients is 0, so every
 * session that attached was released, and release waits for the worker's
 * jobs of that session: no job names the pool).
 */
void pool_destroy(struct pkv_daemon *d, struct pool *p)
{
	tier_glue_pool_destroy(d, p);   /* spills what it caches while its KV memory lives */
	/* The plugin's context may be inside an attend of another pool on the worker. */
	backend_lock_loop(d);
	pkv_dispatch_close(&p->disp);
	pthread_mutex_unlock(&d->backend_mu);
	shared_mem_free(p);
	pkv_cache_destroy(p->cache);
	pthread_mutex_destroy(&p->cache_mu);
	d->budget_used -= p->bytes;
	tenant_pool_destroyed(d, p->owner_uid, p->bytes);
	free(p);
}

void pool_lock(struct pool *p)
{
	pthread_mutex_lock(&p->cache_mu);
}

void pool_unlock(struct pool *p)
{
	pthread_mutex_unlock(&p->cache_mu);
}

/* The worker holds at most one pool's lock, and only ever tries it: any order is deadlock-free. */
void pool_lock_all(struct pkv_daemon *d)
{
	for (struct pool *p = d->pools; p; p = p->next)
		pool_lock(p);
}

void pool_unlock_all(struct pkv_daemon *d)
{
	for (struct pool *p = d->pools; p; p = p->next)
		pool_unlock(p);
}

void pool_cache_stats(struct pool *p, struct pkv_cache_stats *cs)
{
	pool_lock(p);
	pkv_cache_stats(p->cache, cs);
	pool_unlock(p);
}
