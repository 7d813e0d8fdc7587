/* SPDX-License-Identifier: MIT */
/* Loading a backend .so with dlopen and refusing, with a reason, anything that does not follow the ABI. */
#include "config.h"
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "loader/loader.h"
#include "pkv_paths.h"

/* Enumerating past this many backends means the plugin never says -ENOENT. */
#define MAX_BACKENDS 64u

/* End of the last field a version-1 struct must carry; later fields were appended. */
#define V1_BACKEND_SIZE (offsetof(struct pkv_backend, unregister_host) + sizeof(void (*)(void)))
#define V1_CAPS_SIZE (offsetof(struct pkv_backend_caps, max_gqa_ratio) + sizeof(uint32_t))

/* The loader's copy of a plugin's descriptor: what pkv_plugin.be points to. */
struct backend_copy {
	struct pkv_backend be;
	struct pkv_backend_caps caps;
};

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

	size_t sl = strlen(spec);

	if (strchr(spec, '/')) {
		n = snprintf(path, len, "%s", spec);
	} else if (sl > 3 && !strcmp(spec + sl - 3, ".so")) {
		n = snprintf(path, len, "./%s", spec); /* a file here; dlopen would search the library path */
	} else {
		/* Not in a setuid program: libpagedkv loads backends into its callers (client attention). */
		if (!plugin_dir)
			plugin_dir = secure_getenv("PAGEDKV_PLUGIN_DIR");
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

/* Checks the values of caps already copied to this host's size. */
static int check_caps(const struct pkv_backend_caps *c, const char *file, char *err, size_t len)
{
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

/* More options than this means the list has no terminating entry. */
#define MAX_OPTIONS 64u

static int check_option_list(const struct pkv_backend *be, const char *file, char *err, size_t len);
static int check_options(const struct pkv_backend *be, const struct pkv_dict *d, const char *file,
			 char *err, size_t len);

/*
 * Copies what this host knows of a plugin's struct: min(sizes) bytes, the
 * rest zero, struct_size set to the host's so PKV_ABI_HAS holds for every
 * field (an absent method is then NULL, never garbage).
 */
static void copy_known(void *dst, size_t dst_size, const void *src, uint32_t src_size)
{
	size_t n = src_size < dst_size ? src_size : dst_size;

	memcpy(dst, src, n);
	memset((char *)dst + n, 0, dst_size - n);
	((uint32_t *)dst)[1] = (uint32_t)dst_size; /* struct_size follows abi_version */
}

/* Version and size of a growable struct's header, the only part read before them. */
static int check_header(const char *what, uint32_t version, uint32_t size, size_t v1_size,
			const char *file, char *err, size_t len)
{
	if (version < 1 || version > PKV_BACKEND_ABI_VERSION)
		return fail(err, len, file, -EPROTO, "%sunknown ABI version %u (this host knows 1..%u)",
			    what, version, PKV_BACKEND_ABI_VERSION);
	if (size < v1_size)
		return fail(err, len, file, -EPROTO,
			    "%sstruct is too small: struct_size %u, version 1 needs %zu", what, size, v1_size);
	return 0;
}

/*
 * Checks one backend's descriptor against ABI version 1 and copies it (and
 * its caps) into *cp, which is valid only when this returns 0.
 */
static int check_backend(const struct pkv_backend *raw, struct backend_copy *cp, const char *file,
			 char *err, size_t len)
{
	const struct pkv_backend *be = &cp->be;
	int r;

	r = check_header("", raw->abi_version, raw->struct_size, V1_BACKEND_SIZE, file, err, len);
	if (r)
		return r;
	copy_known(&cp->be, sizeof(cp->be), raw, raw->struct_size);
	if (!sane_string(be->name) || !be->name[0])
		return fail(err, len, file, -EINVAL, "backend has no name");
	if (!be->init)
		return fail(err, len, file, -EINVAL, "backend '%s': required method init is NULL", be->name);
	if (!be->fini)
		return fail(err, len, file, -EINVAL, "backend '%s': required method fini is NULL", be->name);
	if (!be->caps)
		return fail(err, len, file, -EINVAL, "backend '%s': caps is NULL", be->name);
	r = check_header("caps: ", be->caps->abi_version, be->caps->struct_size, V1_CAPS_SIZE, file, err, len);
	if (r)
		return r;
	copy_known(&cp->caps, sizeof(cp->caps), be->caps, be->caps->struct_size);
	cp->be.caps = &cp->caps;
	r = check_caps(&cp->caps, file, err, len);
	if (r)
		return r;
	if ((cp->caps.paths & PKV_PATH_VARLEN) && !be->attend_varlen)
		return fail(err, len, file, -EINVAL,
			    "backend '%s': caps claim the varlen path but attend_varlen is NULL", be->name);
	if ((cp->caps.paths & PKV_PATH_DECODE) && !be->attend_decode)
		return fail(err, len, file, -EINVAL,
			    "backend '%s': caps claim the decode path but attend_decode is NULL", be->name);
	if (!be->cache_alloc != !be->cache_free)
		return fail(err, len, file, -EINVAL,
			    "backend '%s': cache_alloc and cache_free must both be set or both NULL", be->name);
	return check_option_list(be, file, err, len);
}

/* dlopens a regular file at path and finds its entry point; -errno and why on failure. */
static int open_lib(const char *path, void **dl_out, pkv_backend_enum_fn *fn, char *err, size_t len)
{
	struct stat st;
	void *dl;

	if (stat(path, &st))
		return fail(err, len, path, -errno, "cannot open plugin: %s", strerror(errno));
	if (!S_ISREG(st.st_mode))
		return fail(err, len, path, -EINVAL, "not a regular file");
	dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!dl) {
		const char *why = dlerror();

		return fail(err, len, path, -ENOEXEC, "cannot load: %s", why ? why : "dlopen failed");
	}
	dlerror();
	*(void **)fn = dlsym(dl, PKV_BACKEND_ENUM_SYMBOL);
	if (!*fn) {
		dlclose(dl);
		return fail(err, len, path, -ENOENT, "missing symbol %s (not a pagedkv backend?)",
			    PKV_BACKEND_ENUM_SYMBOL);
	}
	*dl_out = dl;
	return 0;
}

int pkv_plugin_load(const char *spec, const char *backend_name, const char *plugin_dir,
		    const struct pkv_dict *options, struct pkv_host *host, struct pkv_plugin *out,
		    char *err, size_t err_len)
{
	static const struct pkv_dict no_options;
	const struct pkv_backend *be = NULL;
	struct backend_copy *cp = NULL;
	pkv_backend_enum_fn enum_fn;
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
	ret = open_lib(out->path, &dl, &enum_fn, err, err_len);
	if (ret)
		return ret;
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
	cp = calloc(1, sizeof(*cp));
	if (!cp) {
		ret = fail(err, err_len, out->path, -ENOMEM, "out of memory");
		goto err_close;
	}
	ret = check_backend(be, cp, out->path, err, err_len);
	if (ret)
		goto err_close;
	be = &cp->be;
	ret = check_options(be, options, out->path, err, err_len);
	if (ret)
		goto err_close;
	ret = be->init(pkv_host_api(host), options ? options : &no_options, &ctx);
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
	free(cp);
	dlclose(dl);
	return ret;
}

static const char *const option_type_name[] = { "string", "int", "bool" };

/* The option list a backend publishes: names sane and unique, types known. */
static int check_option_list(const struct pkv_backend *be, const char *file, char *err, size_t len)
{
	const struct pkv_option *o;
	uint32_t i, j;

	for (i = 0, o = be->options; o && o[i].name; i++) {
		if (i >= MAX_OPTIONS)
			return fail(err, len, file, -EINVAL, "backend '%s': option list has no end", be->name);
		if (!sane_string(o[i].name) || !o[i].name[0] || o[i].type > PKV_OPT_BOOL ||
		    (o[i].def && !sane_string(o[i].def)) || (o[i].help && !sane_string(o[i].help)))
			return fail(err, len, file, -EINVAL, "backend '%s': option %u is malformed", be->name, i);
		for (j = 0; j < i; j++)
			if (!strcmp(o[i].name, o[j].name))
				return fail(err, len, file, -EINVAL, "backend '%s': option '%s' listed twice",
					    be->name, o[i].name);
	}
	return 0;
}

static const struct pkv_option *find_option(const struct pkv_backend *be, const char *key)
{
	const struct pkv_option *o;

	for (o = be->options; o && o->name; o++)
		if (!strcmp(o->name, key))
			return o;
	return NULL;
}

static int bool_text(const char *v)
{
	static const char *const yes[] = { "1", "true", "yes", "on" }, *const no[] = { "0", "false", "no", "off" };
	size_t i;

	for (i = 0; i < 4; i++)
		if (!strcasecmp(v, yes[i]) || !strcasecmp(v, no[i]))
			return 1;
	return 0;
}

/* Every key the caller gives is one the backend lists, with a value of its type. */
static int check_options(const struct pkv_backend *be, const struct pkv_dict *d, const char *file,
			 char *err, size_t len)
{
	uint32_t i;

	for (i = 0; d && i < d->n_items; i++) {
		const char *k = d->items[i].key, *v = d->items[i].value;
		const struct pkv_option *o;
		char *end;

		if (!k || !v)
			return fail(err, len, file, -EINVAL, "backend '%s': option %u has no key or value",
				    be->name, i);
		o = find_option(be, k);
		if (!o)
			return fail(err, len, file, -EINVAL, "backend '%s' has no option '%s'%s", be->name, k,
				    be->options && be->options[0].name ? " (see pagedkvd --list-backends)" :
				    " (it takes none)");
		if (o->type == PKV_OPT_INT) {
			errno = 0;
			(void)strtoll(v, &end, 10);
			if (!*v || *end || errno)
				return fail(err, len, file, -EINVAL, "backend '%s': option '%s' wants an integer, not '%s'",
					    be->name, k, v);
		} else if (o->type == PKV_OPT_BOOL && !bool_text(v)) {
			return fail(err, len, file, -EINVAL, "backend '%s': option '%s' wants a boolean, not '%s'",
				    be->name, k, v);
		}
	}
	return 0;
}

int pkv_backend_spec_split(const char *spec, char *lib, size_t lib_len, const char **name)
{
	const char *colon = strrchr(spec, ':');
	size_t n;

	if (colon && strchr(colon, '/'))
		colon = NULL; /* a ':' inside a directory name, not a backend name */
	n = colon ? (size_t)(colon - spec) : strlen(spec);

	if (n >= lib_len)
		return -ENAMETOOLONG;
	memcpy(lib, spec, n);
	lib[n] = '\0';
	*name = colon ? colon + 1 : NULL;
	return 0;
}

static void describe_one(FILE *out, const struct pkv_backend *be)
{
	static const char *const dt[] = { "f32", "f16", "bf16" };
	const struct pkv_backend_caps *c = be->caps;
	const struct pkv_option *o;
	uint32_t t;

	fprintf(out, "  %s: %s\n", be->name, sane_string(be->description) ? be->description : "");
	fprintf(out, "    paths:%s%s  domain: %s  cache:", c->paths & PKV_PATH_VARLEN ? " varlen" : "",
		c->paths & PKV_PATH_DECODE ? " decode" : "", c->domain == PKV_DOMAIN_CUDA ? "cuda" : "host");
	for (t = 0; t < PKV_DTYPE_COUNT; t++)
		if (c->cache_dtypes & PKV_DTYPE_BIT(t))
			fprintf(out, " %s", dt[t]);
	fprintf(out, "  activations:");
	for (t = 0; t < PKV_DTYPE_COUNT; t++)
		if (c->act_dtypes & PKV_DTYPE_BIT(t))
			fprintf(out, " %s", dt[t]);
	fprintf(out, "\n    head_dim %u..%u step %u  block_size %u..%u step %u  ", c->head_dim_min, c->head_dim_max,
		c->head_dim_multiple, c->block_size_min, c->block_size_max, c->block_size_multiple);
	if (c->max_gqa_ratio)
		fprintf(out, "gqa ratio <= %u", c->max_gqa_ratio);
	else
		fprintf(out, "any gqa ratio");
	fprintf(out, "%s%s%s%s\n", c->features & PKV_FEAT_WINDOW ? "  window" : "",
		c->features & PKV_FEAT_SOFTCAP ? "  softcap" : "", c->features & PKV_FEAT_LSE ? "  lse" : "",
		c->features & PKV_FEAT_COPY_VIEW ? "  copy_view" : "");
	for (o = be->options; o && o->name; o++)
		fprintf(out, "    option %s.%s (%s, default %s): %s\n", be->name, o->name,
			option_type_name[o->type], o->def ? o->def : "none", o->help ? o->help : "");
}

int pkv_plugin_describe(const char *path, FILE *out, char *err, size_t err_len)
{
	pkv_backend_enum_fn enum_fn;
	struct backend_copy cp;
	uint32_t i;
	void *dl;
	int ret;

	ret = open_lib(path, &dl, &enum_fn, err, err_len);
	if (ret)
		return ret;
	fprintf(out, "%s\n", path);
	for (i = 0; i < MAX_BACKENDS; i++) {
		const struct pkv_backend *raw = NULL;
		int r = enum_fn(i, &raw);

		if (r == -ENOENT)
			break;
		if (r < 0 || !raw) {
			ret = fail(err, err_len, path, -EINVAL, "%s(%u) failed: %d and no backend",
				   PKV_BACKEND_ENUM_SYMBOL, i, r);
			goto out;
		}
		ret = check_backend(raw, &cp, path, err, err_len);
		if (ret)
			goto out;
		describe_one(out, &cp.be);
	}
	ret = (int)i;
out:
	dlclose(dl);
	return ret;
}

void pkv_plugin_unload(struct pkv_plugin *p)
{
	if (!p || !p->be)
		return;
	p->be->fini(p->ctx);
	dlclose(p->dl);
	free((void *)p->be); /* the struct backend_copy it is the first member of */
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
	c = p->be->caps;
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
