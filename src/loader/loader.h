/* SPDX-License-Identifier: MIT */
/* Loading backend plugins, the host services they get, and choosing a backend per batch. */
#ifndef PKV_LOADER_H
#define PKV_LOADER_H

#include <stddef.h>
#include <pagedkv/backend.h>

/* Host services (log, aligned allocation, a thread pool) handed to plugins. */
struct pkv_host;
int pkv_host_create(unsigned num_threads, int log_level, struct pkv_host **out);
void pkv_host_destroy(struct pkv_host *h);
const struct pkv_host_api *pkv_host_api(struct pkv_host *h);

/* One loaded and initialised backend. */
struct pkv_plugin {
	void *dl;                        /* dlopen handle */
	const struct pkv_backend *be;    /* validated: version, size, required methods */
	void *ctx;                       /* from be->init */
	char path[256];
};

/*
 * Loads `spec` (a path containing '/', or a name looked up as
 * <plugin_dir>/pkv_<name>.so), picks the backend called `backend_name`
 * within it (NULL = index 0), checks its ABI and calls init. On failure
 * returns -errno and writes "<file>: <reason>" into err.
 */
int pkv_plugin_load(const char *spec, const char *backend_name, const char *plugin_dir,
		    struct pkv_host *host, struct pkv_plugin *out, char *err, size_t err_len);
void pkv_plugin_unload(struct pkv_plugin *p);

/* Whether the plugin can serve this pool on `path` (PKV_PATH_*); else -EINVAL and why. */
int pkv_plugin_check_pool(const struct pkv_plugin *p, const struct pkv_pool_desc *pool,
			  uint32_t path, char *err, size_t err_len);

/*
 * The backends serving one pool: one for varlen, one for decode (possibly the
 * same plugin), sharing the cache memory of their domain.
 */
struct pkv_dispatch {
	struct pkv_plugin *varlen;
	struct pkv_plugin *decode;
	struct pkv_cache_mem mem;        /* allocated by the domain owner (varlen's plugin) */
};

int pkv_dispatch_open(struct pkv_dispatch *d, struct pkv_plugin *varlen, struct pkv_plugin *decode,
		      const struct pkv_pool_desc *pool, char *err, size_t err_len);
void pkv_dispatch_close(struct pkv_dispatch *d);
/* Runs the batch on decode when every sequence has one query, on varlen otherwise. */
int pkv_dispatch_attend(struct pkv_dispatch *d, const struct pkv_attn_batch *b);
int pkv_dispatch_copy_blocks(struct pkv_dispatch *d, const struct pkv_block_copy *c, uint32_t n);

#endif
