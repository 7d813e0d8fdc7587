/* SPDX-License-Identifier: MIT */
/* Loading a backend .so with dlopen and refusing, with a reason, anything that does not follow the ABI. */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loader/loader.h"

#ifndef PKV_PLUGIN_DIR
#define PKV_PLUGIN_DIR "/usr/local/lib/pagedkv"
#endif

/* Enumerating past this many backends means the plugin never says -ENOENT. */
#define MAX_BACKENDS 64u

/* End of the last field a version-1 struct must carry. */
#define V1_BACKEND_SIZE (offsetof(struct pkv_backend, unregister_host) + sizeof(void (*)(void)))
#define V1_CAPS_SIZE (offsetof(struct pkv_backend_caps, features) + sizeof(uint32_t))

static int fail(char *err, size_t len, const char *file, int ret, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static int fail(char *err, size_t len, const char *file, int ret, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!err || !len)
		return ret;
	n = snprintf(err, len, "%s: ", file);
	if (n >= 0 && (size_t)n < len) {
		va_start(ap, fmt);
		vsnprintf(err + n, len - n, fmt, ap);
		va_end(ap);
	}
	return ret;
}

static int resolve_path(const char *spec, const char *plugin_dir, char *path, size_t len)
{
	int n;

	if (strchr(spec, '/')) {
		n = snprintf(path, len, "%s", spec);
	} else {
		if (!plugin_dir)
			plugin_dir = getenv("PAGEDKV_PLUGIN_DIR");
		if (!plugin_dir || !*plugin_dir)
			plugin_dir = PKV_PLUGIN_DIR;
		n = snprintf(path, len, "%s/pkv_%s.so", plugin_dir, spec);
	}
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* A NUL-terminated string of sane length, without trusting the plugin to have one. */
static int sane_string(const char *s)
{
	return s && memchr(s, '\0', 128) != NULL;
}

static int check_caps(const struct pkv_backend_caps *c, const char *file, char *err, size_t len)
{
	if (c->abi_version < 1 || c->abi_version > PKV_BACKEND_ABI_VERSION)
		return fail(err, len, file, -EPROTO, "caps: unknown ABI version %u (this host knows 1..%u)",
			    c->abi_version, PKV_BACKEND_ABI_VERSION);
	if (c->struct_size < V1_CAPS_SIZE)
		return fail(err, len, file, -EPROTO, "caps: struct_size %u is smaller than version 1's %zu",
			    c->struct_size, (size_t)V1_CAPS_SIZE);
	if (!(c->paths & (PKV_PATH_VARLEN | PKV_PATH_DECODE)))
		return fail(err, len, file, -EINVAL, "caps: serves neither the varlen nor the decode path");
	if (c->domain > PKV_DOMAIN_CUDA)
		return fail(err, len, file, -EINVAL, "caps: unknown memory domain %u", c->domain);
	if (!(c->cache_dtypes & ((1u << PKV_DTYPE_COUNT) - 1)) ||
	    !(c->act_dtypes & ((1u << PKV_DTYPE_COUNT) - 1)))
		return fail(err, len, file, -EINVAL, "caps: no known cache or activation dtype");
	if (!c->head_dim_multiple || !c->head_dim_min || c->head_dim_min > c->head_dim_max)
		return fail(err, len, file, -EINVAL, "caps: empty head_dim range [%u, %u] step %u",
			    c->head_dim_min, c->head_dim_max, c->head_dim_multiple);
	if (!c->block_size_multiple || !c->block_size_min || c->block_size_min > c->block_size_max)
		return fail(err, len, file, -EINVAL, "caps: empty block_size range [%u, %u] step %u",
			    c->block_size_min, c->block_size_max, c->block_size_multiple);
	return 0;
}

/* Checks one backend's descriptor against ABI version 1. */
static int check_backend(const struct pkv_backend *be, const char *file, char *err, size_t len)
{
	int r;

	if (be->abi_version < 1 || be->abi_version > PKV_BACKEND_ABI_VERSION)
		return fail(err, len, file, -EPROTO, "unknown ABI version %u (this host knows 1..%u)",
			    be->abi_version, PKV_BACKEND_ABI_VERSION);
	if (be->struct_size < V1_BACKEND_SIZE)
		return fail(err, len, file, -EPROTO,
			    "struct pkv_backend is too small: struct_size %u, version 1 needs %zu",
			    be->struct_size, (size_t)V1_BACKEND_SIZE);
	if (!sane_string(be->name) || !be->name[0])
		return fail(err, len, file, -EINVAL, "backend has no name");
	if (!be->init)
		return fail(err, len, file, -EINVAL, "backend '%s': required method init is NULL", be->name);
	if (!be->fini)
		return fail(err, len, file, -EINVAL, "backend '%s': required method fini is NULL", be->name);
	r = check_caps(&be->caps, file, err, len);
	if (r)
		return r;
	if ((be->caps.paths & PKV_PATH_VARLEN) && !be->attend_varlen)
		return fail(err, len, file, -EINVAL,
			    "backend '%s': caps claim the varlen path but attend_varlen is NULL", be->name);
	if ((be->caps.paths & PKV_PATH_DECODE) && !be->attend_decode)
		return fail(err, len, file, -EINVAL,
			    "backend '%s': caps claim the decode path but attend_decode is NULL", be->name);
	if (!be->cache_alloc != !be->cache_free)
		return fail(err, len, file, -EINVAL,
			    "backend '%s': cache_alloc and cache_free must both be set or both NULL", be->name);
	return 0;
}

int pkv_plugin_load(const char *spec, const char *backend_name, const char *plugin_dir,
		    struct pkv_host *host, struct pkv_plugin *out, char *err, size_t err_len)
{
	const struct pkv_backend *be = NULL;
	pkv_backend_enum_fn enum_fn;
	struct stat st;
	uint32_t i;
	void *ctx = NULL;
	void *dl;
	int ret;

	if (err && err_len)
		err[0] = '\0';
	if (!spec || !*spec || !host || !out)
		return fail(err, err_len, spec ? spec : "(null)", -EINVAL, "invalid arguments");
	memset(out, 0, sizeof(*out));
	if (resolve_path(spec, plugin_dir, out->path, sizeof(out->path)))
		return fail(err, err_len, spec, -ENAMETOOLONG, "plugin path too long");
	if (stat(out->path, &st))
		return fail(err, err_len, out->path, -errno, "cannot open plugin: %s", strerror(errno));
	if (!S_ISREG(st.st_mode))
		return fail(err, err_len, out->path, -EINVAL, "not a regular file");

	dl = dlopen(out->path, RTLD_NOW | RTLD_LOCAL);
	if (!dl) {
		const char *why = dlerror();

		return fail(err, err_len, out->path, -ENOEXEC, "cannot load: %s", why ? why : "dlopen failed");
	}
	dlerror();
	*(void **)&enum_fn = dlsym(dl, PKV_BACKEND_ENUM_SYMBOL);
	if (!enum_fn) {
		ret = fail(err, err_len, out->path, -ENOENT, "missing symbol %s (not a pagedkv backend?)",
			   PKV_BACKEND_ENUM_SYMBOL);
		goto err_close;
	}
	for (i = 0; i < MAX_BACKENDS; i++) {
		const struct pkv_backend *cand = NULL;
		int r = enum_fn(i, &cand);

		if (r == -ENOENT)
			break;
		if (r < 0 || !cand) {
			ret = fail(err, err_len, out->path, -EINVAL,
				   "%s(%u) failed: %d and no backend", PKV_BACKEND_ENUM_SYMBOL, i, r);
			goto err_close;
		}
		if (!backend_name) {
			be = cand;
			break;
		}
		/* The name is read only after the size check says it is there. */
		if (cand->struct_size >= offsetof(struct pkv_backend, name) + sizeof(char *) &&
		    sane_string(cand->name) && !strcmp(cand->name, backend_name)) {
			be = cand;
			break;
		}
	}
	if (!be) {
		ret = backend_name ?
			fail(err, err_len, out->path, -ENOENT, "no backend named '%s'", backend_name) :
			fail(err, err_len, out->path, -ENOENT, "offers no backend");
		goto err_close;
	}
	ret = check_backend(be, out->path, err, err_len);
	if (ret)
		goto err_close;
	ret = be->init(pkv_host_api(host), &ctx);
	if (ret) {
		ret = fail(err, err_len, out->path, ret < 0 ? ret : -EIO, "backend '%s': init failed: %s",
			   be->name, strerror(ret < 0 ? -ret : EIO));
		goto err_close;
	}
	out->dl = dl;
	out->be = be;
	out->ctx = ctx;
	return 0;

err_close:
	dlclose(dl);
	return ret;
}

void pkv_plugin_unload(struct pkv_plugin *p)
{
	if (!p || !p->be)
		return;
	p->be->fini(p->ctx);
	dlclose(p->dl);
	p->be = NULL;
	p->dl = NULL;
	p->ctx = NULL;
}

static int in_range(uint32_t v, uint32_t lo, uint32_t hi, uint32_t mult)
{
	return v >= lo && v <= hi && mult && v % mult == 0;
}

int pkv_plugin_check_pool(const struct pkv_plugin *p, const struct pkv_pool_desc *pool,
			  uint32_t path, char *err, size_t err_len)
{
	const struct pkv_backend_caps *c;
	const struct pkv_geometry *g;
	const char *file;

	if (!p || !p->be || !pool)
		return fail(err, err_len, p ? p->path : "(null)", -EINVAL, "no plugin or pool");
	file = p->path;
	c = &p->be->caps;
	g = &pool->geo;
	if (pool->struct_size < sizeof(*pool))
		return fail(err, err_len, file, -EINVAL, "pool descriptor too small");
	if (!(c->paths & path))
		return fail(err, err_len, file, -EINVAL, "backend '%s' does not serve the %s path",
			    p->be->name, path == PKV_PATH_DECODE ? "decode" : "varlen");
	if (g->cache_dtype >= PKV_DTYPE_COUNT || !(c->cache_dtypes & PKV_DTYPE_BIT(g->cache_dtype)))
		return fail(err, err_len, file, -EINVAL, "backend '%s' cannot hold cache dtype %u",
			    p->be->name, g->cache_dtype);
	if (pool->act_dtype >= PKV_DTYPE_COUNT || !(c->act_dtypes & PKV_DTYPE_BIT(pool->act_dtype)))
		return fail(err, err_len, file, -EINVAL, "backend '%s' cannot take activation dtype %u",
			    p->be->name, pool->act_dtype);
	if (!in_range(g->head_dim, c->head_dim_min, c->head_dim_max, c->head_dim_multiple))
		return fail(err, err_len, file, -EINVAL,
			    "backend '%s' cannot serve head_dim %u (supports %u..%u, multiples of %u)",
			    p->be->name, g->head_dim, c->head_dim_min, c->head_dim_max, c->head_dim_multiple);
	if (!in_range(g->block_size, c->block_size_min, c->block_size_max, c->block_size_multiple))
		return fail(err, err_len, file, -EINVAL,
			    "backend '%s' cannot serve block_size %u (supports %u..%u, multiples of %u)",
			    p->be->name, g->block_size, c->block_size_min, c->block_size_max,
			    c->block_size_multiple);
	if (!g->num_heads || !g->num_kv_heads || g->num_heads % g->num_kv_heads)
		return fail(err, err_len, file, -EINVAL, "num_heads %u is not a multiple of num_kv_heads %u",
			    g->num_heads, g->num_kv_heads);
	if (c->max_gqa_ratio && g->num_heads / g->num_kv_heads > c->max_gqa_ratio)
		return fail(err, err_len, file, -EINVAL, "backend '%s' supports GQA ratios up to %u, pool has %u",
			    p->be->name, c->max_gqa_ratio, g->num_heads / g->num_kv_heads);
	if (!g->num_layers || !g->num_blocks)
		return fail(err, err_len, file, -EINVAL, "pool has no layers or no blocks");
	return 0;
}
