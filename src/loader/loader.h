/* SPDX-License-Identifier: MIT */
/* Loading backend plugins, the host services they get, and choosing a backend per batch. */
#ifndef PKV_LOADER_H
#define PKV_LOADER_H

#include <stddef.h>
#include <stdio.h>
#include <pagedkv/backend.h>

/*
 * Host services (log, aligned allocation, a thread pool) handed to plugins.
 * num_threads 0 = one per online CPU. log_level: messages above it are
 * dropped (PKV_LOG_*). The pool's threads are created here and persist until
 * destroy; parallel_for from inside a task, or while another thread is
 * already running one, runs inline on the caller (correct, just serial).
 */
struct pkv_host;
int pkv_host_create(unsigned num_threads, int log_level, struct pkv_host **out);
void pkv_host_destroy(struct pkv_host *h);
const struct pkv_host_api *pkv_host_api(struct pkv_host *h);

/*
 * Where log lines go (default: stderr as "pagedkv: LEVEL: msg"). fn gets the
 * formatted message without a trailing newline; NULL restores stderr.
 */
typedef void (*pkv_log_sink)(void *ud, int level, const char *msg);
void pkv_host_set_log_sink(struct pkv_host *h, pkv_log_sink fn, void *ud);
void pkv_host_set_log_level(struct pkv_host *h, int level);
/*
 * Shared-machine mode (off by default): the pool's threads spin after a job
 * only while a core would otherwise idle (pkv_spin_worthwhile), and a call
 * fans out to them only while a core idles beside the caller's
 * (pkv_spin_spare_cpu); otherwise a call runs on the caller's thread and
 * the threads sleep at once. For a service whose calls are short (a decode
 * attend of ~15 us) on a machine its clients keep busy: a woken pool thread
 * would take a core from a thread with work. Benchmarks of the kernels
 * themselves leave it off.
 */
void pkv_host_set_shared_cpus(struct pkv_host *h, int on);
/*
 * Whether the clients being served compute on every CPU between their
 * attends (their compute-threads hints): the pool threads then go to sleep
 * as soon as a job is done instead of spinning for the next one.
 */
void pkv_host_set_cpus_claimed(struct pkv_host *h, int on);
/*
 * Whether the one client being served sleeps through each call with its
 * compute threads' cores left free (a lone client claiming every CPU, see
 * the daemon's follow_sleeper): a call then fans out to the pool threads
 * even in shared-machine mode, and the caller spins for them.
 */
void pkv_host_set_cpus_lent(struct pkv_host *h, int on);

/* One loaded and initialised backend. */
struct pkv_plugin {
	void *dl;                        /* dlopen handle */
	/*
	 * The loader's own copy of the plugin's descriptor and caps, at this
	 * host's struct sizes (min of sizes copied, the rest zero: see
	 * backend.h), validated: version, size, required methods, caps.
	 */
	const struct pkv_backend *be;
	void *ctx;                       /* from be->init */
	char path[256];
};

/*
 * Loads `spec` (a path containing '/' or ending in ".so", or a name looked up
 * as <plugin_dir>/pkv_<name>.so; plugin_dir NULL = $PAGEDKV_PLUGIN_DIR, else the
 * install's plugin directory), picks the backend called `backend_name`
 * within it (NULL = index 0), checks its ABI and options and calls init
 * with options (NULL = none). On failure returns -errno and writes
 * "<file>: <reason>" into err: missing file, missing symbol, unknown ABI
 * version, too-small struct, missing required method, incoherent caps,
 * unknown option or a value of the wrong type, init failure.
 */
int pkv_plugin_load(const char *spec, const char *backend_name, const char *plugin_dir,
		    const struct pkv_dict *options, struct pkv_host *host, struct pkv_plugin *out,
		    char *err, size_t err_len);

/*
 * Splits a backend spec "lib:name" (pagedkvd --backend-decode cuda:decode)
 * into the library part, written to lib, and the backend name (NULL when the
 * spec has no ':'). -ENAMETOOLONG when lib_len is too small.
 */
int pkv_backend_spec_split(const char *spec, char *lib, size_t lib_len, const char **name);

/*
 * One "prefix.key=value" backend option from pagedkvd.conf or the command
 * line. The prefix names the library (pkv_PREFIX.so, or the spec's name) or
 * one backend in it; init sees only key and value.
 */
struct pkv_option_setting {
	const char *prefix;
	struct pkv_dict_item item;
	int used;  /* set by pkv_options_select when a loaded backend took it */
};

/* Splits text into *out, pointing into buf (a copy of text). -EINVAL unless "prefix.key=value". */
int pkv_option_parse(const char *text, char *buf, size_t buf_len, struct pkv_option_setting *out);
/* The name options use for a spec: "cpu" for cpu, cpu:cpu and /x/pkv_cpu.so. */
void pkv_spec_short_name(const char *spec, char *out, size_t len);
/*
 * The settings whose prefix is lib or backend (may be NULL), as a dictionary
 * for pkv_plugin_load over items[max]; marks them used. -E2BIG past max.
 */
int pkv_options_select(struct pkv_option_setting *all, uint32_t n, const char *lib, const char *backend,
		       struct pkv_dict_item *items, uint32_t max, struct pkv_dict *out);

/*
 * Prints every backend the library at path offers, with its description,
 * caps and options (pagedkvd --list-backends), without calling init.
 * Returns the number of backends, or -errno and the reason in err.
 */
int pkv_plugin_describe(const char *path, FILE *out, char *err, size_t err_len);
void pkv_plugin_unload(struct pkv_plugin *p);

/* Whether the plugin can serve this pool on `path` (PKV_PATH_*); else -EINVAL and why. */
int pkv_plugin_check_pool(const struct pkv_plugin *p, const struct pkv_pool_desc *pool,
			  uint32_t path, char *err, size_t err_len);

/*
 * Whether a batch is well formed for this cache (lengths, block ids, slots,
 * dtype, strides' signs) and which path it belongs to: returns PKV_PATH_DECODE
 * when every sequence has exactly one query (and then sk == cache_seqlens + 1),
 * PKV_PATH_VARLEN otherwise, or -EINVAL with the reason in err. Costs
 * O(num_seqs * max_blocks_per_seq + total_q), nothing next to attention.
 */
int pkv_attn_batch_check(const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b,
			 char *err, size_t err_len);

/*
 * Whether the cache descriptor a plugin's cache_alloc returned describes the
 * pool asked for: its geometry, non-null bases in the owner's domain, and
 * strides that hold the layout of backend.h without overlap or overflow.
 * Everything that then addresses the cache (attends, block copies, the disk
 * tier) trusts these strides, so a broken plugin is refused here, with the
 * reason in err, instead of scribbling through them. -EINVAL when not.
 */
int pkv_cache_mem_check(const struct pkv_pool_desc *pool, uint32_t domain, const struct pkv_cache_mem *mem,
			char *err, size_t err_len);

/*
 * The backends serving one pool: one for varlen, one for decode (possibly the
 * same plugin), sharing the cache memory of their domain.
 */
struct pkv_dispatch {
	struct pkv_plugin *varlen;
	struct pkv_plugin *decode;
	struct pkv_plugin *owner;        /* the one that allocated mem (varlen's plugin if it can) */
	struct pkv_pool_desc pool;
	struct pkv_cache_mem mem;        /* allocated by the domain owner, or shared (below) */
	int mem_shared;                  /* mem is the caller's mapping: close leaves it alone */
};

/*
 * decode may be NULL (varlen then serves decode batches too) or the same
 * plugin as varlen. Checks both plugins against the pool and that they share
 * a memory domain, then allocates the cache. -errno and the reason on failure.
 */
int pkv_dispatch_open(struct pkv_dispatch *d, struct pkv_plugin *varlen, struct pkv_plugin *decode,
		      const struct pkv_pool_desc *pool, char *err, size_t err_len);
void pkv_dispatch_close(struct pkv_dispatch *d);

/*
 * The layout of a host-memory cache that several processes map (a pool whose
 * clients attend themselves): every layer's K, then every layer's V, packed,
 * as backend.h describes. Fills mem's strides, geometry and domain (bases
 * NULL) and returns the bytes, or 0 when the size overflows.
 */
size_t pkv_shared_cache_layout(const struct pkv_geometry *g, struct pkv_cache_mem *mem);
/*
 * pkv_dispatch_open over memory the caller mapped (len bytes at base, laid
 * out by pkv_shared_cache_layout) instead of a cache_alloc: both plugins
 * must keep their caches in host memory (-ENOTSUP otherwise).
 */
int pkv_dispatch_open_shared(struct pkv_dispatch *d, struct pkv_plugin *varlen, struct pkv_plugin *decode,
			     const struct pkv_pool_desc *pool, void *base, size_t len, char *err, size_t err_len);
/*
 * Checks the batch, then runs it on decode when every sequence has one query,
 * on varlen otherwise. A batch asking for softmax_lse, a window or a
 * soft-cap of a backend whose caps lack PKV_FEAT_LSE, _WINDOW or _SOFTCAP is
 * refused with -ENOTSUP (nothing written).
 */
int pkv_dispatch_attend(struct pkv_dispatch *d, const struct pkv_attn_batch *b);
/*
 * 1 when every backend serving this pool (the varlen one, and the decode
 * one where it takes decode batches) writes softmax_lse, so a caller may
 * split a row's keys over calls and merge them; else 0.
 */
int pkv_dispatch_has_lse(const struct pkv_dispatch *d);
/* PKV_FEAT_* bits both paths' plugins carry. */
uint32_t pkv_dispatch_features(const struct pkv_dispatch *d);
/* Copy-on-write through the owner (then the other plugin); -ENOTSUP when neither has copy_blocks. */
int pkv_dispatch_copy_blocks(struct pkv_dispatch *d, const struct pkv_block_copy *c, uint32_t n);
/*
 * The same for layers [l0, l0 + nl) only: copy_blocks gets a view of the
 * pool's memory whose k_base/v_base start at layer l0 and whose
 * geo.num_layers is nl (the rest as the pool's), so that one long block is
 * copied in pieces. -ENOTSUP unless that backend carries PKV_FEAT_COPY_VIEW
 * (pkv_dispatch_features).
 */
int pkv_dispatch_copy_layers(struct pkv_dispatch *d, const struct pkv_block_copy *c, uint32_t n, uint32_t l0,
			     uint32_t nl);
/* Whether pkv_dispatch_copy_layers can serve (the copying backend carries PKV_FEAT_COPY_VIEW). */
int pkv_dispatch_can_copy_layers(const struct pkv_dispatch *d);
/* Waits for both plugins' pending work (sync), if they have any. */
int pkv_dispatch_sync(struct pkv_dispatch *d);

#endif
