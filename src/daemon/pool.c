/* SPDX-License-Identifier: MIT */
/* Pools: found by name, created on first attach within the memory budget, matched exactly after. */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"
#include "common/region.h"
#include "daemon/daemon.h"
#include "daemon/tier_glue.h"

uint64_t pool_bytes(const struct pkv_geometry *g)
{
	uint64_t b = 2; /* K and V */

	if (!pkv_mul_ok(b, g->num_layers, &b) || !pkv_mul_ok(b, g->num_blocks, &b) ||
	    !pkv_mul_ok(b, g->block_size, &b) || !pkv_mul_ok(b, g->num_kv_heads, &b) ||
	    !pkv_mul_ok(b, g->head_dim, &b) || !pkv_mul_ok(b, pkv_dtype_size(g->cache_dtype), &b))
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
	if (p->flags != m->flags) {
		snprintf(why, why_len, "pool '%s' was created %s across users", p->name,
			 (p->flags & PKV_WIRE_POOL_SHARED) ? "shared" : "not shared");
		return -EINVAL;
	}
	if (p->scale != m->scale || p->softcap != m->softcap || p->window_left != m->window_left) {
		snprintf(why, why_len, "pool '%s' has scale %g, softcap %g, window %d; the attach differs",
			 p->name, p->scale, p->softcap, p->window_left);
		return -EINVAL;
	}
	return 0;
}

int pool_attach(struct pkv_daemon *d, const struct pkv_msg_attach *m, struct pool **out,
		char *why, size_t why_len)
{
	struct pkv_pool_desc desc;
	struct pool *p;
	uint64_t bytes;
	int r;

	for (p = d->pools; p; p = p->next)
		if (!strcmp(p->name, m->name)) {
			r = mismatch(p, m, why, why_len);
			if (r)
				return r;
			*out = p;
			return 0;
		}
	r = pkv_geometry_check(&m->geo, why, why_len);
	if (r)
		return r;
	bytes = pool_bytes(&m->geo);
	if (!bytes || bytes > d->cfg.memory_budget - d->budget_used) {
		snprintf(why, why_len, "pool '%s' needs %llu bytes of KV cache; %llu of the %llu-byte budget are left",
			 m->name, (unsigned long long)bytes,
			 (unsigned long long)(d->cfg.memory_budget - d->budget_used),
			 (unsigned long long)d->cfg.memory_budget);
		return -ENOMEM;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	snprintf(p->name, sizeof(p->name), "%s", m->name);
	p->geo = m->geo;
	p->act_dtype = m->act_dtype;
	p->flags = m->flags;
	p->model_id = m->model_id;
	p->scale = m->scale;
	p->softcap = m->softcap;
	p->window_left = m->window_left;
	p->bytes = bytes;
	r = pkv_cache_create(&p->geo, NULL, &p->cache);
	if (r) {
		snprintf(why, why_len, "pool '%s': cache manager refused the geometry (%s)", m->name,
			 strerror(-r));
		goto err_free;
	}
	memset(&desc, 0, sizeof(desc));
	desc.abi_version = PKV_BACKEND_ABI_VERSION;
	desc.struct_size = sizeof(desc);
	desc.geo = p->geo;
	desc.act_dtype = p->act_dtype;
	pthread_mutex_lock(&d->backend_mu);
	r = pkv_dispatch_open(&p->disp, &d->plug_varlen, d->same_plugin ? &d->plug_varlen : &d->plug_decode,
			      &desc, why, why_len);
	pthread_mutex_unlock(&d->backend_mu);
	if (r)
		goto err_cache;
	d->budget_used += bytes;
	p->next = d->pools;
	d->pools = p;
	tier_glue_pool_created(d, p);
	pkv_info("pool '%s' created: %u layers, %u/%u heads, head_dim %u, %u blocks of %u (%llu MiB)",
		 p->name, p->geo.num_layers, p->geo.num_heads, p->geo.num_kv_heads, p->geo.head_dim,
		 p->geo.num_blocks, p->geo.block_size, (unsigned long long)(bytes >> 20));
	*out = p;
	return 0;
err_cache:
	pkv_cache_destroy(p->cache);
err_free:
	free(p);
	return r;
}

void pool_destroy(struct pkv_daemon *d, struct pool *p)
{
	tier_glue_pool_destroy(d, p);
	pkv_dispatch_close(&p->disp);
	pkv_cache_destroy(p->cache);
	d->budget_used -= p->bytes;
	free(p);
}
