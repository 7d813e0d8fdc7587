/* SPDX-License-Identifier: MIT */
/* The attention backend plugin ABI: what a backend .so exports and what the host gives it. */
#ifndef PAGEDKV_BACKEND_H
#define PAGEDKV_BACKEND_H

/*
 * A backend is a shared object exporting exactly one symbol,
 *
 *     int pkv_backend_enum(uint32_t index, const struct pkv_backend **out);
 *
 * which returns 0 and sets *out for index 0..n-1 and -ENOENT past the last
 * backend, so one library may offer several backends.
 *
 * Evolution rules (DESIGN §4): this header is append-only, and every
 * struct in it is one of two kinds.
 *
 * Growable: starts with abi_version and struct_size, is reached only by
 * pointer, and is never embedded by value in another struct or used as an
 * array element (either would move what follows it when it grows). These
 * are pkv_host_api, pkv_backend_caps, pkv_pool_desc, pkv_cache_mem,
 * pkv_attn_batch and pkv_backend. Their fields and methods are only ever
 * appended, never reordered, resized or removed. A reader uses a field only
 * when the producer's struct_size covers it (PKV_ABI_HAS).
 *
 * Frozen by name: no size field, laid out once and never changed; growing
 * one means a new struct with a new name (pkv_geometry2) reached from a new
 * appended field. These are pkv_geometry (types.h), pkv_block_copy,
 * pkv_dict, pkv_dict_item and pkv_option: they may be embedded or form
 * arrays because their size never changes.
 *
 * The loader copies a plugin's pkv_backend and pkv_backend_caps into its own
 * current-size structs, min(plugin's struct_size, host's) bytes, zero-filling
 * the rest: a method appended after the plugin was built reads as NULL (the
 * host treats it as -ENOTSUP), a field as 0, and what a newer plugin appended
 * past the host's knowledge is ignored. Both directions are tested
 * (tests/backend: an older, smaller and a newer, larger plugin).
 *
 * PKV_BACKEND_ABI_VERSION changes only for a change these rules forbid. It
 * is still 1: the caps pointer, the options list and init's options
 * argument were settled before any release, so no plugin built against an
 * earlier draft of version 1 exists outside this tree (DESIGN §4).
 *
 * Plugins never link against the daemon: logging, allocation and the thread
 * pool reach them through struct pkv_host_api, passed to init.
 *
 * Threading: the host never calls two methods of one backend context at the
 * same time; a backend parallelises inside a call with host->parallel_for.
 *
 * Errors: methods return 0 on success and -errno on failure (-EINVAL for a
 * batch the backend cannot serve, -ENOMEM, -EIO for a device failure). They
 * never abort the process.
 */

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <pagedkv/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PKV_BACKEND_ABI_VERSION 1u

/* True when a struct of the size its producer declared contains `field`. */
#define PKV_ABI_HAS(ptr, type, field) \
	((ptr)->struct_size >= offsetof(type, field) + sizeof(((type *)0)->field))

enum pkv_log_level {
	PKV_LOG_ERROR = 0,
	PKV_LOG_WARN = 1,
	PKV_LOG_INFO = 2,
	PKV_LOG_DEBUG = 3
};

/* Memory domains: where a backend's cache memory lives. */
enum pkv_domain {
	PKV_DOMAIN_HOST = 0,
	PKV_DOMAIN_CUDA = 1
};

/* Paths a backend serves. */
#define PKV_PATH_VARLEN (1u << 0) /* batches with prefill: any number of queries per sequence */
#define PKV_PATH_DECODE (1u << 1) /* one query per sequence, new K/V appended in place */

/* Body of one parallel_for task: task in [0, n_tasks), thread in [0, num_threads). */
typedef void (*pkv_task_fn)(void *arg, uint32_t task, uint32_t thread);

/*
 * Services the host offers a plugin. Versioned like every ABI struct: a
 * plugin checks PKV_ABI_HAS before using a field added after version 1.
 */
struct pkv_host_api {
	uint32_t abi_version;
	uint32_t struct_size;
	void *host; /* opaque, passed back to every call below */
	void (*log)(void *host, int level, const char *fmt, ...)
		__attribute__((format(printf, 3, 4)));
	/* align is a power of two >= sizeof(void *); returns NULL on failure. */
	void *(*alloc_aligned)(void *host, size_t align, size_t size);
	void (*free_aligned)(void *host, void *ptr);
	/* Threads parallel_for may use, the calling thread included (>= 1). */
	uint32_t (*num_threads)(void *host);
	/* Runs fn for every task, the caller taking part; returns when all are done. */
	int (*parallel_for)(void *host, uint32_t n_tasks, pkv_task_fn fn, void *arg);
};

/*
 * What a backend can serve. A pool is served only when every field allows it.
 * Growable; version 1's minimum ends at max_gqa_ratio (features was appended).
 */
struct pkv_backend_caps {
	uint32_t abi_version;
	uint32_t struct_size;
	uint32_t paths;          /* PKV_PATH_* */
	uint32_t domain;         /* enum pkv_domain */
	uint32_t cache_dtypes;   /* PKV_DTYPE_BIT mask */
	uint32_t act_dtypes;     /* PKV_DTYPE_BIT mask */
	uint32_t head_dim_min, head_dim_max, head_dim_multiple;
	uint32_t block_size_min, block_size_max, block_size_multiple;
	uint32_t max_gqa_ratio;  /* 0 = any */
	uint32_t features;       /* PKV_FEAT_* */
};

#define PKV_FEAT_WINDOW  (1u << 0) /* sliding window */
#define PKV_FEAT_SOFTCAP (1u << 1) /* logit soft-cap */
#define PKV_FEAT_LSE     (1u << 2) /* writes pkv_attn_batch.softmax_lse when asked */
#define PKV_FEAT_COPY_VIEW (1u << 3) /* copy_blocks copies what a view of a layer range describes */

/* The pool a cache is allocated for: geometry (frozen, so embedded) plus the activations' dtype. */
struct pkv_pool_desc {
	uint32_t abi_version;
	uint32_t struct_size;
	struct pkv_geometry geo;
	uint32_t act_dtype;
};

/*
 * Cache memory of one pool in one domain, allocated once by the domain's
 * owner backend and handed to every backend of that domain.
 *
 * Layout, the one FlashAttention and FlashInfer use, for each layer l:
 *   K: k_base + l * layer_stride, as [num_blocks][block_size][num_kv_heads][head_dim]
 *   V: v_base + l * layer_stride, same shape
 * elements of geo.cache_dtype, rows contiguous. Strides are in bytes; readers
 * use them and never recompute them from the geometry.
 */
struct pkv_cache_mem {
	uint32_t abi_version;
	uint32_t struct_size;
	uint32_t domain;
	uint32_t reserved0;
	struct pkv_geometry geo;
	void *k_base;
	void *v_base;
	size_t layer_stride;  /* bytes between layers */
	size_t block_stride;  /* bytes between blocks = block_size * token_stride */
	size_t token_stride;  /* bytes between tokens = num_kv_heads * head_dim * elem */
	size_t bytes;         /* total bytes of K and V together */
	void *owner_priv;     /* owner backend's bookkeeping; others leave it alone */
};

/*
 * One attention call over one layer (DESIGN §3). Same struct for both paths;
 * on the decode path num_seqs == total_q and every sequence has one query.
 *
 * Q, O:          [total_q][num_heads][head_dim], act_dtype
 * K_new, V_new:  [total_q][num_kv_heads][head_dim], act_dtype
 * Strides are in elements; the innermost dimension is contiguous. Tensors are
 * host memory (the client's arena); a device-domain backend moves them itself.
 *
 * For sequence s, its queries are rows cu_seq_lens_q[s] .. cu_seq_lens_q[s+1]-1,
 * sq = their count, sk = cu_seq_lens_k[s+1] - cu_seq_lens_k[s] keys in all
 * (cache_seqlens[s] already cached + sq new). Query i sees key j iff
 * j <= i + (sk - sq) (causal, bottom-right) and, with a window,
 * j >= i + (sk - sq) - window_left. Key j lives in block
 * block_tables[s * max_blocks_per_seq + j / block_size] at offset j % block_size.
 *
 * The backend first writes row r of K_new/V_new into slot slot_mapping[r]
 * of this layer (converted to the cache dtype, round-to-nearest-even; a
 * negative slot means "do not write"), then attends. Rows of O whose
 * query sees no key are written as 0.
 *
 * Keys are always read from the paged cache, keys 0..sk-1 of the sequence,
 * after the write. Usually sk = cache_seqlens[s] + sq, but sk < sq is legal
 * (FlashAttention's q-longer-than-k case: the first sq - sk rows see nothing
 * and are 0), and sq == 0 (a sequence that only has cached keys) writes
 * nothing. cu_seq_lens_q/k are filled on both paths; on the decode path the
 * host guarantees sq == 1 and sk == cache_seqlens[s] + 1 >= 1 for every s, so
 * a decode kernel may use cache_seqlens alone (flash_attn_with_kvcache).
 * Every block_tables entry a key in 0..sk-1 falls in is a valid block id,
 * and every slot_mapping entry >= 0 is < num_blocks * block_size; the host
 * (pkv_attn_batch_check in the loader) validates this before the call, and
 * a backend should still refuse out-of-range ids with -EINVAL, never crash.
 *
 * Conversions are round-to-nearest-even with subnormals kept (no flush to
 * zero), NaN stays NaN and f32 -> f16 overflows to infinity, as PyTorch's
 * .to() does; the conformance suite checks the cache bytes exactly.
 */
struct pkv_attn_batch {
	uint32_t abi_version;
	uint32_t struct_size;
	uint32_t layer;
	uint32_t num_seqs;
	uint32_t total_q;
	uint32_t act_dtype;
	const void *q;
	const void *k_new;
	const void *v_new;
	void *o;
	int64_t q_stride_tok, q_stride_head;
	int64_t kv_stride_tok, kv_stride_head;   /* for both K_new and V_new */
	int64_t o_stride_tok, o_stride_head;
	const int32_t *cu_seq_lens_q;  /* [num_seqs + 1] */
	const int32_t *cu_seq_lens_k;  /* [num_seqs + 1] */
	uint32_t max_length_q;
	uint32_t max_length_k;
	const int32_t *block_tables;   /* [num_seqs][max_blocks_per_seq], -1 = unallocated */
	uint32_t max_blocks_per_seq;
	uint32_t reserved0;
	const int32_t *cache_seqlens;  /* [num_seqs]: keys cached before this call */
	const int64_t *slot_mapping;   /* [total_q] */
	float scale;                   /* 0 = 1/sqrt(head_dim) */
	float softcap;                 /* 0 = off; else s = softcap * tanh(s / softcap) */
	int32_t window_left;           /* < 0 = unbounded */
	uint32_t flags;                /* reserved, 0 */

	/*
	 * Version 1's minimum pkv_attn_batch ends at flags; a backend reads what
	 * follows only when struct_size covers it (PKV_ABI_HAS).
	 *
	 * softmax_lse, [total_q][num_heads] f32 (row stride num_heads), or NULL:
	 * when set, the backend also writes for every query row and head the
	 * natural log of its softmax denominator, log(sum_j exp(s_j)) over the
	 * keys the row sees, s_j the scores after scale and softcap
	 * (FlashAttention's softmax_lse); -INFINITY for a row that sees no key
	 * (its O row is 0). The host sets it only for a backend whose caps carry
	 * PKV_FEAT_LSE, to merge calls over disjoint key ranges of one row
	 * (flash-decoding's combine): O = sum_i exp(lse_i - L) O_i with
	 * L = log(sum_i exp(lse_i)).
	 */
	float *softmax_lse;
};

/* A copy-on-write request: copy every layer's K and V of block src into block dst. Frozen (an array element). */
struct pkv_block_copy {
	int32_t src;
	int32_t dst;
};

/*
 * Options a plugin's init takes: key/value strings, as SPA's factories get a
 * spa_dict. The daemon fills it from pagedkvd.conf ("backend_option =
 * cpu.isa=avx2": the part before the first '.' names the backend and is not
 * part of the key) and --backend-option. The loader refuses a key the
 * backend does not list in pkv_backend.options, and a value that does not
 * parse as the listed type, so init sees only known keys. Frozen.
 */
struct pkv_dict_item {
	const char *key;
	const char *value;
};

struct pkv_dict {
	uint32_t n_items;
	uint32_t reserved0;
	const struct pkv_dict_item *items;
};

/* The value of key in d, or NULL when absent (d may be NULL). */
static inline const char *pkv_dict_get(const struct pkv_dict *d, const char *key)
{
	uint32_t i;

	for (i = 0; d && i < d->n_items; i++)
		if (d->items[i].key && !strcmp(d->items[i].key, key))
			return d->items[i].value;
	return NULL;
}

/* How the loader checks an option's value before init sees it. */
enum pkv_option_type {
	PKV_OPT_STRING = 0,
	PKV_OPT_INT = 1,    /* a decimal integer (strtoll, whole string) */
	PKV_OPT_BOOL = 2    /* 0/1, true/false, yes/no, on/off */
};

/* One option a backend lists (array ends at name == NULL). Frozen. */
struct pkv_option {
	const char *name;  /* the key, without the backend's prefix: "isa" */
	uint32_t type;     /* enum pkv_option_type */
	uint32_t reserved0;
	const char *def;   /* the value used when the key is absent, as text */
	const char *help;  /* one line */
};

struct pkv_backend {
	uint32_t abi_version;
	uint32_t struct_size;
	const char *name;         /* short, unique within the library: "cpu" */
	const char *description;
	const struct pkv_backend_caps *caps;  /* growable: by pointer, checked by its own struct_size */
	const struct pkv_option *options;     /* NULL (none) or an array ending at name == NULL */

	/*
	 * Required. Creates a context; *ctx is passed to every method below.
	 * options is never NULL (n_items may be 0) and holds only keys listed
	 * in .options; an absent key means its default. Environment variables a
	 * backend documents as test overrides (PKV_CPU_ISA) win over options.
	 */
	int (*init)(const struct pkv_host_api *host, const struct pkv_dict *options, void **ctx);
	void (*fini)(void *ctx);

	/* Domain owner only: allocate/free the cache of one pool. */
	int (*cache_alloc)(void *ctx, const struct pkv_pool_desc *pool, struct pkv_cache_mem *mem);
	void (*cache_free)(void *ctx, struct pkv_cache_mem *mem);

	/* Optional per path (NULL when caps->paths lacks it). */
	int (*attend_varlen)(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b);
	int (*attend_decode)(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b);

	/*
	 * Copy-on-write: done before the step's attention writes into dst, every
	 * layer's K and V. To a backend whose caps carry PKV_FEAT_COPY_VIEW the
	 * host may pass a view of a range of layers instead (k_base and v_base
	 * moved by whole layer_strides, geo.num_layers the range's length, every
	 * other field the pool's), to copy a long block in pieces: such a
	 * backend copies what mem describes, from its fields alone.
	 */
	int (*copy_blocks)(void *ctx, const struct pkv_cache_mem *mem,
			   const struct pkv_block_copy *copies, uint32_t n);

	/* Waits until every previous call's effects are visible to the host. */
	int (*sync)(void *ctx);

	/* Optional (device domains): register host memory (a client arena) for fast transfers. */
	int (*register_host)(void *ctx, void *ptr, size_t len);
	int (*unregister_host)(void *ctx, void *ptr);

	/*
	 * Version 1's minimum pkv_backend ends here, at unregister_host.
	 *
	 * Optional, appended after the first draft (NULL in the loader's copy
	 * of an older plugin's struct): copies len
	 * bytes at byte offset off of the K (kv = 0) or V (kv = 1) region of mem,
	 * i.e. from k_base/v_base + off, into host memory dst. Lets the
	 * conformance suite and tools inspect a device-domain cache; host-domain
	 * readers just read the memory.
	 */
	int (*cache_read)(void *ctx, const struct pkv_cache_mem *mem, uint32_t kv, size_t off,
			  void *dst, size_t len);
};

typedef int (*pkv_backend_enum_fn)(uint32_t index, const struct pkv_backend **out);

#define PKV_BACKEND_ENUM_SYMBOL "pkv_backend_enum"

/* Marks the entry point exported when a plugin builds with -fvisibility=hidden. */
#if defined(__GNUC__)
#define PKV_BACKEND_EXPORT __attribute__((visibility("default")))
#else
#define PKV_BACKEND_EXPORT
#endif

#ifdef __cplusplus
}
#endif
#endif
