/* SPDX-License-Identifier: MIT */
/* Per-pool dispatch: checks a batch, picks the decode or varlen backend, shares one cache between them. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "loader/loader.h"

static int bad(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(char *err, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (err && len) {
		va_start(ap, fmt);
		vsnprintf(err, len, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

int pkv_attn_batch_check(const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b,
			 char *err, size_t err_len)
{
	const struct pkv_geometry *g;
	uint64_t nslots;
	uint32_t s, i, max_q = 0, max_k = 0;
	int decode = 1;

	if (!mem || !b)
		return bad(err, err_len, "no cache or no batch");
	g = &mem->geo;
	if (b->abi_version < 1 || b->struct_size < offsetof(struct pkv_attn_batch, flags) + sizeof(uint32_t))
		return bad(err, err_len, "batch struct version %u size %u unknown", b->abi_version, b->struct_size);
	if (b->layer >= g->num_layers)
		return bad(err, err_len, "layer %u >= num_layers %u", b->layer, g->num_layers);
	if (b->act_dtype >= PKV_DTYPE_COUNT)
		return bad(err, err_len, "unknown activation dtype %u", b->act_dtype);
	if (!b->cu_seq_lens_q || !b->cu_seq_lens_k)
		return bad(err, err_len, "cu_seq_lens_q/k missing");
	if (b->num_seqs && (!b->block_tables || !b->cache_seqlens || !b->max_blocks_per_seq))
		return bad(err, err_len, "block tables or cache_seqlens missing");
	if (b->total_q && (!b->q || !b->k_new || !b->v_new || !b->o || !b->slot_mapping))
		return bad(err, err_len, "Q/K/V/O or slot_mapping missing");
	if (b->q_stride_tok < 0 || b->q_stride_head < 0 || b->kv_stride_tok < 0 ||
	    b->kv_stride_head < 0 || b->o_stride_tok < 0 || b->o_stride_head < 0)
		return bad(err, err_len, "negative stride");
	if (b->cu_seq_lens_q[0] != 0 || b->cu_seq_lens_k[0] != 0)
		return bad(err, err_len, "cu_seq_lens must start at 0");
	if (b->window_left < -1 || b->softcap < 0 || !(b->scale >= 0) || b->flags)
		return bad(err, err_len, "bad window_left %d, softcap, scale or flags", b->window_left);
	for (s = 0; s < b->num_seqs; s++) {
		int64_t sq = (int64_t)b->cu_seq_lens_q[s + 1] - b->cu_seq_lens_q[s];
		int64_t sk = (int64_t)b->cu_seq_lens_k[s + 1] - b->cu_seq_lens_k[s];
		uint32_t nb, j;

		if (sq < 0 || sk < 0)
			return bad(err, err_len, "sequence %u: cu_seq_lens decrease", s);
		if ((uint64_t)sk > (uint64_t)b->max_blocks_per_seq * g->block_size)
			return bad(err, err_len, "sequence %u: %lld keys do not fit %u blocks", s,
				   (long long)sk, b->max_blocks_per_seq);
		if (sq > max_q)
			max_q = (uint32_t)sq;
		if (sk > max_k)
			max_k = (uint32_t)sk;
		if (sq != 1 || sk != (int64_t)b->cache_seqlens[s] + 1)
			decode = 0;
		nb = (uint32_t)((sk + g->block_size - 1) / g->block_size);
		for (j = 0; j < nb; j++) {
			int32_t id = b->block_tables[(size_t)s * b->max_blocks_per_seq + j];

			if (id < 0 || (uint32_t)id >= g->num_blocks)
				return bad(err, err_len, "sequence %u: block table entry %u = %d, out of range",
					   s, j, id);
		}
	}
	if ((uint32_t)b->cu_seq_lens_q[b->num_seqs] != b->total_q)
		return bad(err, err_len, "cu_seq_lens_q ends at %d, total_q is %u",
			   b->cu_seq_lens_q[b->num_seqs], b->total_q);
	if (max_q > b->max_length_q || max_k > b->max_length_k)
		return bad(err, err_len, "max_length_q/k (%u/%u) below the longest sequence (%u/%u)",
			   b->max_length_q, b->max_length_k, max_q, max_k);
	nslots = (uint64_t)g->num_blocks * g->block_size;
	for (i = 0; i < b->total_q; i++)
		if (b->slot_mapping[i] >= 0 && (uint64_t)b->slot_mapping[i] >= nslots)
			return bad(err, err_len, "slot_mapping[%u] = %lld, out of range", i,
				   (long long)b->slot_mapping[i]);
	return decode && b->num_seqs ? (int)PKV_PATH_DECODE : (int)PKV_PATH_VARLEN;
}

/* Checks both plugins against the pool and that they share a domain; picks the cache's owner. */
static int check_plugins(struct pkv_dispatch *d, struct pkv_plugin *varlen, struct pkv_plugin *decode,
			 const struct pkv_pool_desc *pool, char *err, size_t err_len)
{
	int ret;

	if (!d || !varlen || !varlen->be || !pool)
		return bad(err, err_len, "dispatch needs a varlen plugin and a pool");
	memset(d, 0, sizeof(*d));
	if (!decode)
		decode = varlen;
	ret = pkv_plugin_check_pool(varlen, pool, PKV_PATH_VARLEN, err, err_len);
	if (ret)
		return ret;
	/* A decode plugin that lacks the decode path would never be called: say so now. */
	ret = pkv_plugin_check_pool(decode, pool, decode == varlen && !(varlen->be->caps->paths & PKV_PATH_DECODE) ?
				    PKV_PATH_VARLEN : PKV_PATH_DECODE, err, err_len);
	if (ret)
		return ret;
	if (decode->be->caps->domain != varlen->be->caps->domain)
		return bad(err, err_len, "%s and %s live in different memory domains (%u, %u) and cannot share a cache",
			   varlen->path, decode->path, varlen->be->caps->domain, decode->be->caps->domain);
	d->owner = varlen->be->cache_alloc ? varlen : decode->be->cache_alloc ? decode : NULL;
	if (!d->owner)
		return bad(err, err_len, "%s: no backend of this domain can allocate cache memory (cache_alloc)",
			   varlen->path);
	d->varlen = varlen;
	d->decode = decode;
	d->pool = *pool;
	return 0;
}

int pkv_dispatch_open(struct pkv_dispatch *d, struct pkv_plugin *varlen, struct pkv_plugin *decode,
		      const struct pkv_pool_desc *pool, char *err, size_t err_len)
{
	struct pkv_plugin *owner;
	int ret = check_plugins(d, varlen, decode, pool, err, err_len);

	if (ret)
		return ret;
	owner = d->owner;
	d->mem.abi_version = PKV_BACKEND_ABI_VERSION;
	d->mem.struct_size = sizeof(d->mem);
	ret = owner->be->cache_alloc(owner->ctx, pool, &d->mem);
	if (ret) {
		memset(d, 0, sizeof(*d));
		return bad(err, err_len, "%s: cache_alloc failed: %s", owner->path, strerror(ret < 0 ? -ret : EIO)),
		       ret < 0 ? ret : -EIO;
	}
	ret = pkv_cache_mem_check(pool, owner->be->caps->domain, &d->mem, err, err_len);
	if (ret) {
		size_t n = err ? strlen(err) : 0;

		owner->be->cache_free(owner->ctx, &d->mem);
		memset(d, 0, sizeof(*d));
		if (err && n + 1 < err_len)
			snprintf(err + n, err_len - n, " (%s)", owner->path);
		return ret;
	}
	return 0;
}

size_t pkv_shared_cache_layout(const struct pkv_geometry *g, struct pkv_cache_mem *mem)
{
	size_t tok, blk, layer, total;

	if (g->cache_dtype >= PKV_DTYPE_COUNT ||
	    __builtin_mul_overflow((size_t)g->num_kv_heads * g->head_dim, pkv_dtype_size(g->cache_dtype), &tok) ||
	    __builtin_mul_overflow(tok, (size_t)g->block_size, &blk) ||
	    __builtin_mul_overflow(blk, (size_t)g->num_blocks, &layer) ||
	    __builtin_mul_overflow(layer, (size_t)g->num_layers * 2, &total) || !total)
		return 0;
	memset(mem, 0, sizeof(*mem));
	mem->abi_version = PKV_BACKEND_ABI_VERSION;
	mem->struct_size = sizeof(*mem);
	mem->domain = PKV_DOMAIN_HOST;
	mem->geo = *g;
	mem->layer_stride = layer;
	mem->block_stride = blk;
	mem->token_stride = tok;
	mem->bytes = total;
	return total;
}

int pkv_dispatch_open_shared(struct pkv_dispatch *d, struct pkv_plugin *varlen, struct pkv_plugin *decode,
			     const struct pkv_pool_desc *pool, void *base, size_t len, char *err, size_t err_len)
{
	int ret = check_plugins(d, varlen, decode, pool, err, err_len);
	size_t need;

	if (ret)
		return ret;
	if (d->owner->be->caps->domain != PKV_DOMAIN_HOST) {
		bad(err, err_len, "%s keeps its cache in device memory: no process can map it", d->owner->path);
		memset(d, 0, sizeof(*d));
		return -ENOTSUP;
	}
	need = pkv_shared_cache_layout(&pool->geo, &d->mem);
	if (!need || !base || len < need) {
		memset(d, 0, sizeof(*d));
		return bad(err, err_len, "a shared cache of %zu bytes does not hold the pool's %zu", len, need);
	}
	d->mem.k_base = base;
	d->mem.v_base = (char *)base + need / 2;
	d->mem_shared = 1;
	return 0;
}

int pkv_cache_mem_check(const struct pkv_pool_desc *pool, uint32_t domain, const struct pkv_cache_mem *mem,
			char *err, size_t err_len)
{
	const struct pkv_geometry *g = &pool->geo, *m = &mem->geo;
	unsigned __int128 row, blk, layer, need;

	if (!mem->k_base || !mem->v_base || mem->domain != domain)
		return bad(err, err_len, "cache_alloc returned no memory or memory of another domain");
	if (m->num_layers != g->num_layers || m->num_heads != g->num_heads || m->num_kv_heads != g->num_kv_heads ||
	    m->head_dim != g->head_dim || m->cache_dtype != g->cache_dtype || m->block_size != g->block_size ||
	    m->num_blocks != g->num_blocks)
		return bad(err, err_len, "cache_alloc returned a cache of another geometry than the pool's");
	row = (unsigned __int128)g->num_kv_heads * g->head_dim * pkv_dtype_size(g->cache_dtype);
	blk = (unsigned __int128)g->block_size * mem->token_stride;
	layer = (unsigned __int128)g->num_blocks * mem->block_stride;
	need = 2 * (unsigned __int128)g->num_layers * layer;
	/* backend.h: rows contiguous, block_stride = block_size * token_stride, layers apart. */
	if (!row || mem->token_stride < row || mem->block_stride != blk || mem->layer_stride < layer ||
	    mem->bytes < need || need > SIZE_MAX)
		return bad(err, err_len,
			   "cache_alloc returned strides that do not hold the pool (token %zu, block %zu, "
			   "layer %zu, bytes %zu)", mem->token_stride, mem->block_stride, mem->layer_stride, mem->bytes);
	return 0;
}

void pkv_dispatch_close(struct pkv_dispatch *d)
{
	if (!d || !d->owner)
		return;
	/* Shared memory belongs to whoever mapped it. */
	if (!d->mem_shared)
		d->owner->be->cache_free(d->owner->ctx, &d->mem);
	memset(d, 0, sizeof(*d));
}

/* Whether batches of this path go to attend_decode of the decode plugin; else to attend_varlen of varlen. */
static int by_decode(const struct pkv_dispatch *d, int path)
{
	/* A decode batch is also a valid varlen batch. */
	return path == PKV_PATH_DECODE && (d->decode->be->caps->paths & PKV_PATH_DECODE);
}

static struct pkv_plugin *serving(const struct pkv_dispatch *d, int path)
{
	return by_decode(d, path) ? d->decode : d->varlen;
}

static int has_feature(const struct pkv_plugin *p, uint32_t feat)
{
	return (p->be->caps->features & feat) != 0;
}

uint32_t pkv_dispatch_features(const struct pkv_dispatch *d)
{
	if (!d || !d->owner)
		return 0;
	return serving(d, PKV_PATH_VARLEN)->be->caps->features & serving(d, PKV_PATH_DECODE)->be->caps->features;
}

int pkv_dispatch_has_lse(const struct pkv_dispatch *d)
{
	return (pkv_dispatch_features(d) & PKV_FEAT_LSE) != 0;
}

int pkv_dispatch_attend(struct pkv_dispatch *d, const struct pkv_attn_batch *b)
{
	struct pkv_plugin *p;
	int path;

	if (!d || !d->owner)
		return -EINVAL;
	path = pkv_attn_batch_check(&d->mem, b, NULL, 0);
	if (path < 0)
		return path;
	if (b->act_dtype != d->pool.act_dtype)
		return -EINVAL;
	p = serving(d, path);
	/*
	 * A backend without PKV_FEAT_LSE would leave softmax_lse as it found
	 * it, and the caller would merge garbage: refuse the batch instead.
	 */
	if (PKV_ABI_HAS(b, struct pkv_attn_batch, softmax_lse) && b->softmax_lse && !has_feature(p, PKV_FEAT_LSE))
		return -ENOTSUP;
	/* So would one without the window or the soft-cap, ignoring the field: a wrong O, no error. */
	if ((b->window_left >= 0 && !has_feature(p, PKV_FEAT_WINDOW)) ||
	    (b->softcap > 0 && !has_feature(p, PKV_FEAT_SOFTCAP)))
		return -ENOTSUP;
	if (by_decode(d, path))
		return p->be->attend_decode(p->ctx, &d->mem, b);
	return p->be->attend_varlen(p->ctx, &d->mem, b);
}

/* The plugin that copies blocks: the owner, else whichever of the two has copy_blocks. */
static struct pkv_plugin *copier(const struct pkv_dispatch *d)
{
	return d->owner->be->copy_blocks ? d->owner :
	       d->varlen->be->copy_blocks ? d->varlen : d->decode->be->copy_blocks ? d->decode : NULL;
}

int pkv_dispatch_can_copy_layers(const struct pkv_dispatch *d)
{
	struct pkv_plugin *p = d && d->owner ? copier(d) : NULL;

	return p && has_feature(p, PKV_FEAT_COPY_VIEW);
}

int pkv_dispatch_copy_blocks(struct pkv_dispatch *d, const struct pkv_block_copy *c, uint32_t n)
{
	return pkv_dispatch_copy_layers(d, c, n, 0, d ? d->mem.geo.num_layers : 0);
}

int pkv_dispatch_copy_layers(struct pkv_dispatch *d, const struct pkv_block_copy *c, uint32_t n, uint32_t l0,
			     uint32_t nl)
{
	struct pkv_cache_mem view;
	struct pkv_plugin *p;
	uint32_t i;

	if (!d || !d->owner || (n && !c))
		return -EINVAL;
	for (i = 0; i < n; i++)
		if (c[i].src < 0 || c[i].dst < 0 || (uint32_t)c[i].src >= d->mem.geo.num_blocks ||
		    (uint32_t)c[i].dst >= d->mem.geo.num_blocks)
			return -EINVAL;
	if (n == 0)
		return 0;
	p = copier(d);
	if (!p)
		return -ENOTSUP;
	if (l0 == 0 && nl == d->mem.geo.num_layers)
		return p->be->copy_blocks(p->ctx, &d->mem, c, n);
	if (!nl || l0 >= d->mem.geo.num_layers || nl > d->mem.geo.num_layers - l0)
		return -EINVAL;
	if (!has_feature(p, PKV_FEAT_COPY_VIEW))
		return -ENOTSUP;
	/* The same memory seen from layer l0 on, nl layers deep (backend.h: backends read only these fields). */
	view = d->mem;
	view.geo.num_layers = nl;
	view.k_base = (char *)d->mem.k_base + (size_t)l0 * d->mem.layer_stride;
	view.v_base = (char *)d->mem.v_base + (size_t)l0 * d->mem.layer_stride;
	return p->be->copy_blocks(p->ctx, &view, c, n);
}

int pkv_dispatch_sync(struct pkv_dispatch *d)
{
	int ret = 0, r;

	if (!d || !d->owner)
		return -EINVAL;
	if (d->varlen->be->sync && (ret = d->varlen->be->sync(d->varlen->ctx)))
		return ret;
	if (d->decode != d->varlen && d->decode->be->sync && (r = d->decode->be->sync(d->decode->ctx)))
		ret = r;
	return ret;
}
