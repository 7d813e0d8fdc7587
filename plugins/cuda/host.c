/* SPDX-License-Identifier: MIT */
/* Host side of the CUDA backends: device context, cache allocation, batch validation, transfers and launches. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "pkv_cuda.h"
#include "pkv_cuda_kernels.h"

#define CACHE_MAGIC 0x706b7663u /* "pkvc" */

struct dbuf {
	void *p;
	size_t cap;
};

struct host_reg {
	void *ptr;
	int owned; /* 0: someone else in the process registered it first */
};

struct cuda_ctx {
	const struct pkv_host_api *host;
	int device;
	int num_sms;
	int forced_splits;  /* the "splits" option (PKV_CUDA_SPLITS overrides); 0 = the heuristic */
	cudaStream_t stream;
	struct dbuf q_raw, q_t, k_raw, v_raw, o_f32, o_act, part, lse, meta;
	void *pinned;
	size_t pinned_cap;
	struct host_reg *regs;
	size_t n_regs, cap_regs;
};

/* What cache_alloc leaves in pkv_cache_mem.owner_priv: proves ownership at cache_free. */
struct cache_owner {
	uint32_t magic;
	struct cuda_ctx *ctx;
	void *base;
};

__attribute__((format(printf, 3, 4)))
static void logm(const struct cuda_ctx *c, int level, const char *fmt, ...)
{
	const struct pkv_host_api *h = c ? c->host : NULL;
	char buf[512];
	va_list ap;

	if (!h || !PKV_ABI_HAS(h, struct pkv_host_api, log) || !h->log)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	h->log(h->host, level, "%s", buf);
}

/* Every CUDA status goes through here: an error is logged with CUDA's own string and becomes -EIO. */
static int cu_check(const struct cuda_ctx *c, int err, const char *what)
{
	if (err == cudaSuccess)
		return 0;
	logm(c, PKV_LOG_ERROR, "cuda: %s failed: %s (%s)", what, cudaGetErrorName((cudaError_t)err),
	     cudaGetErrorString((cudaError_t)err));
	return err == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

#define CU(c, call) cu_check((c), (int)(call), #call)

/* The runtime's current device is per thread and the host may call from any thread. */
static int use_device(struct cuda_ctx *c)
{
	return CU(c, cudaSetDevice(c->device));
}

static int dbuf_reserve(struct cuda_ctx *c, struct dbuf *b, size_t need)
{
	int rc;

	if (need <= b->cap)
		return 0;
	if (b->p) {
		rc = CU(c, cudaFree(b->p));
		b->p = NULL;
		b->cap = 0;
		if (rc)
			return rc;
	}
	/* Grow by half again so that slowly growing batches do not reallocate every call. */
	if (need < SIZE_MAX / 3 * 2)
		need += need / 2;
	rc = CU(c, cudaMalloc(&b->p, need));
	if (rc) {
		b->p = NULL;
		return rc;
	}
	b->cap = need;
	return 0;
}

static void dbuf_release(struct dbuf *b)
{
	if (b->p)
		cudaFree(b->p);
	b->p = NULL;
	b->cap = 0;
}

static int pinned_reserve(struct cuda_ctx *c, size_t need)
{
	int rc;

	if (need <= c->pinned_cap)
		return 0;
	if (c->pinned)
		cudaFreeHost(c->pinned);
	c->pinned = NULL;
	c->pinned_cap = 0;
	need = need < 4096 ? 4096 : need + need / 2;
	rc = CU(c, cudaMallocHost(&c->pinned, need));
	if (rc) {
		c->pinned = NULL;
		return rc;
	}
	c->pinned_cap = need;
	return 0;
}

static void ctx_destroy(struct cuda_ctx *c)
{
	size_t i;

	if (!c)
		return;
	cudaSetDevice(c->device);
	if (c->stream)
		cudaStreamSynchronize(c->stream);
	for (i = 0; i < c->n_regs; i++)
		if (c->regs[i].owned)
			cudaHostUnregister(c->regs[i].ptr);
	free(c->regs);
	dbuf_release(&c->q_raw);
	dbuf_release(&c->q_t);
	dbuf_release(&c->k_raw);
	dbuf_release(&c->v_raw);
	dbuf_release(&c->o_f32);
	dbuf_release(&c->o_act);
	dbuf_release(&c->part);
	dbuf_release(&c->lse);
	dbuf_release(&c->meta);
	if (c->pinned)
		cudaFreeHost(c->pinned);
	if (c->stream)
		cudaStreamDestroy(c->stream);
	free(c);
}

const struct pkv_option pkv_cuda_options[] = {
	{ .name = "device", .type = PKV_OPT_INT, .def = "0",
	  .help = "CUDA device index (PKV_CUDA_DEVICE overrides)" },
	{ .name = "splits", .type = PKV_OPT_INT, .def = "0",
	  .help = "KV splits per launch, 0 = chosen per batch (PKV_CUDA_SPLITS overrides; tuning)" },
	{ .name = NULL },
};

int pkv_cuda_be_init(const struct pkv_host_api *host, const struct pkv_dict *options, void **ctx)
{
	struct cuda_ctx *c;
	int n = 0, major = 0, minor = 0, rc;
	const char *env;
	cudaError_t e;

	if (!ctx)
		return -EINVAL;
	*ctx = NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->host = host;

	e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n <= 0) {
		/* No driver, no device, or a driver too old: all mean this machine cannot serve CUDA pools. */
		logm(c, PKV_LOG_ERROR, "cuda: no CUDA device (%s: %s)",
		     e != cudaSuccess ? cudaGetErrorName(e) : "cudaGetDeviceCount",
		     e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
		free(c);
		return -ENODEV;
	}
	/* The option picks the device; PKV_CUDA_DEVICE overrides it (tests). */
	env = getenv("PKV_CUDA_DEVICE");
	if (!env || !*env)
		env = pkv_dict_get(options, "device");
	if (env && *env) {
		char *end;
		long d = strtol(env, &end, 10);
		if (*end || d < 0 || d >= n) {
			logm(c, PKV_LOG_ERROR, "cuda: device %s is not a device index below %d", env, n);
			free(c);
			return -EINVAL;
		}
		c->device = (int)d;
	}
	env = getenv("PKV_CUDA_SPLITS");
	if (!env || !*env)
		env = pkv_dict_get(options, "splits");
	if (env && *env) {
		char *end;
		long v = strtol(env, &end, 10);

		if (*end || v < 0 || v > 1024) {
			logm(c, PKV_LOG_ERROR, "cuda: splits %s is not a count in 0..1024", env);
			free(c);
			return -EINVAL;
		}
		c->forced_splits = (int)v;
	}
	rc = use_device(c);
	if (!rc)
		rc = CU(c, cudaDeviceGetAttribute(&c->num_sms, cudaDevAttrMultiProcessorCount, c->device));
	if (!rc)
		rc = CU(c, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device));
	if (!rc)
		rc = CU(c, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device));
	if (rc)
		goto err;
	/* The kernels use bf16 tensor-core MMA and cp.async (sm_80+); the default build carries sm_90 code. */
	if (major < 8) {
		logm(c, PKV_LOG_ERROR, "cuda: device %d has compute capability %d.%d; these kernels need 8.0 or newer",
		     c->device, major, minor);
		rc = -ENODEV;
		goto err;
	}
	rc = CU(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
	if (rc) {
		c->stream = NULL;
		goto err;
	}
	logm(c, PKV_LOG_INFO, "cuda: device %d (sm_%d%d, %d multiprocessors)", c->device, major, minor, c->num_sms);
	*ctx = c;
	return 0;
err:
	ctx_destroy(c);
	return rc ? rc : -EIO;
}

void pkv_cuda_be_fini(void *ctx)
{
	ctx_destroy(ctx);
}

static int mul_ok(size_t a, size_t b, size_t *out)
{
	return !__builtin_mul_overflow(a, b, out);
}

static int geo_check(const struct cuda_ctx *c, const struct pkv_geometry *g)
{
	if (g->cache_dtype != PKV_DTYPE_F16 && g->cache_dtype != PKV_DTYPE_BF16) {
		logm(c, PKV_LOG_ERROR, "cuda: cache dtype %u not supported (f16, bf16)", g->cache_dtype);
		return -EINVAL;
	}
	if (!pkv_cuda_head_dim_ok((int)g->head_dim) || g->head_dim > 256) {
		logm(c, PKV_LOG_ERROR, "cuda: head_dim %u not supported (multiples of 16 up to 256)", g->head_dim);
		return -EINVAL;
	}
	if (!g->num_layers || !g->num_kv_heads || !g->num_heads || g->num_heads % g->num_kv_heads ||
	    !g->block_size || g->block_size > (1u << 16) || !g->num_blocks || g->num_blocks > INT32_MAX ||
	    g->num_heads > 65535 || g->num_layers > 65535) {
		logm(c, PKV_LOG_ERROR, "cuda: bad geometry (layers %u, heads %u/%u, block_size %u, blocks %u)",
		     g->num_layers, g->num_heads, g->num_kv_heads, g->block_size, g->num_blocks);
		return -EINVAL;
	}
	return 0;
}

int pkv_cuda_be_cache_alloc(void *ctx, const struct pkv_pool_desc *pool, struct pkv_cache_mem *mem)
{
	struct cuda_ctx *c = ctx;
	struct cache_owner *own;
	size_t tok, blk, layer, half, total;
	void *p = NULL;
	int rc;

	if (!c || !pool || !mem || pool->struct_size < offsetof(struct pkv_pool_desc, geo) + sizeof(pool->geo))
		return -EINVAL;
	rc = geo_check(c, &pool->geo);
	if (rc)
		return rc;
	if (!mul_ok((size_t)pool->geo.num_kv_heads * pool->geo.head_dim, 2, &tok) ||
	    !mul_ok(tok, pool->geo.block_size, &blk) || !mul_ok(blk, pool->geo.num_blocks, &layer) ||
	    !mul_ok(layer, pool->geo.num_layers, &half) || !mul_ok(half, 2, &total)) {
		logm(c, PKV_LOG_ERROR, "cuda: cache size overflows");
		return -EINVAL;
	}
	rc = use_device(c);
	if (rc)
		return rc;
	own = calloc(1, sizeof(*own));
	if (!own)
		return -ENOMEM;
	rc = CU(c, cudaMalloc(&p, total));
	if (rc) {
		logm(c, PKV_LOG_ERROR, "cuda: could not allocate %zu bytes of cache", total);
		goto err_free;
	}
	/* Zeroed so that nothing ever reads uninitialised device memory, even in masked lanes. */
	rc = CU(c, cudaMemsetAsync(p, 0, total, c->stream));
	if (!rc)
		rc = CU(c, cudaStreamSynchronize(c->stream));
	if (rc)
		goto err_cuda;
	own->magic = CACHE_MAGIC;
	own->ctx = c;
	own->base = p;
	memset(mem, 0, sizeof(*mem));
	mem->abi_version = PKV_BACKEND_ABI_VERSION;
	mem->struct_size = sizeof(*mem);
	mem->domain = PKV_DOMAIN_CUDA;
	mem->geo = pool->geo;
	mem->k_base = p;
	mem->v_base = (char *)p + half;
	mem->layer_stride = layer;
	mem->block_stride = blk;
	mem->token_stride = tok;
	mem->bytes = total;
	mem->owner_priv = own;
	return 0;
err_cuda:
	cudaFree(p);
err_free:
	free(own);
	return rc;
}

void pkv_cuda_be_cache_free(void *ctx, struct pkv_cache_mem *mem)
{
	struct cuda_ctx *c = ctx;
	struct cache_owner *own;

	if (!c || !mem || !mem->owner_priv)
		return;
	own = mem->owner_priv;
	if (own->magic != CACHE_MAGIC || own->ctx != c) {
		logm(c, PKV_LOG_ERROR, "cuda: cache_free of memory this context did not allocate; ignored");
		return;
	}
	if (!use_device(c)) {
		cudaStreamSynchronize(c->stream);
		CU(c, cudaFree(own->base));
	}
	own->magic = 0;
	free(own);
	memset(mem, 0, sizeof(*mem));
}

/* The batch checks a hostile or buggy caller could trip; every index the kernels follow is checked here. */
static int batch_check(struct cuda_ctx *c, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b,
		       int decode, int32_t *max_q, int32_t *max_k)
{
	const struct pkv_geometry *g;
	uint32_t s;
	int64_t r, cap;

	/* Version 1's minimum batch ends at flags: what was appended after (softmax_lse) this backend does not read. */
	if (!mem || !b || b->struct_size < offsetof(struct pkv_attn_batch, flags) + sizeof(b->flags) ||
	    mem->domain != PKV_DOMAIN_CUDA || !mem->k_base || !mem->v_base) {
		logm(c, PKV_LOG_ERROR, "cuda: batch or cache memory is malformed");
		return -EINVAL;
	}
	g = &mem->geo;
	if (geo_check(c, g))
		return -EINVAL;
	if (b->layer >= g->num_layers || b->act_dtype >= PKV_DTYPE_COUNT || b->num_seqs > INT32_MAX / 2 ||
	    b->total_q > INT32_MAX / 2 || b->max_blocks_per_seq > INT32_MAX || !b->cu_seq_lens_q ||
	    !b->cu_seq_lens_k || (b->num_seqs && b->max_blocks_per_seq && !b->block_tables) ||
	    (b->total_q && (!b->q || !b->k_new || !b->v_new || !b->o || !b->slot_mapping))) {
		logm(c, PKV_LOG_ERROR, "cuda: batch header invalid (layer %u, dtype %u, seqs %u, rows %u)",
		     b->layer, b->act_dtype, b->num_seqs, b->total_q);
		return -EINVAL;
	}
	if (b->softcap < 0.f || b->scale < 0.f || b->softcap != b->softcap || b->scale != b->scale) {
		logm(c, PKV_LOG_ERROR, "cuda: scale/softcap must be finite and non-negative");
		return -EINVAL;
	}
	/* Any non-negative strides work (move_tensor picks the copies); negative ones are refused. */
	if (b->q_stride_tok < 0 || b->q_stride_head < 0 || b->kv_stride_tok < 0 || b->kv_stride_head < 0 ||
	    b->o_stride_tok < 0 || b->o_stride_head < 0) {
		logm(c, PKV_LOG_ERROR, "cuda: negative tensor strides");
		return -EINVAL;
	}
	if (b->cu_seq_lens_q[0] != 0 || b->cu_seq_lens_k[0] != 0 ||
	    (uint32_t)b->cu_seq_lens_q[b->num_seqs] != b->total_q) {
		logm(c, PKV_LOG_ERROR, "cuda: cu_seq_lens must start at 0 and cu_seq_lens_q end at total_q");
		return -EINVAL;
	}
	*max_q = 0;
	*max_k = 0;
	cap = (int64_t)b->max_blocks_per_seq * g->block_size;
	for (s = 0; s < b->num_seqs; s++) {
		const int32_t sq = b->cu_seq_lens_q[s + 1] - b->cu_seq_lens_q[s];
		const int32_t sk = b->cu_seq_lens_k[s + 1] - b->cu_seq_lens_k[s];
		const int32_t *bt = b->block_tables + (size_t)s * b->max_blocks_per_seq;
		int64_t nb, i;

		if (b->cu_seq_lens_q[s + 1] < b->cu_seq_lens_q[s] || b->cu_seq_lens_k[s + 1] < b->cu_seq_lens_k[s] ||
		    sq < 0 || sk < 0 || sk > cap || (decode && sq != 1)) {
			logm(c, PKV_LOG_ERROR, "cuda: sequence %u: %d queries over %d keys invalid%s", s, sq, sk,
			     decode ? " for the decode path (one query each)" : "");
			return -EINVAL;
		}
		nb = ((int64_t)sk + g->block_size - 1) / g->block_size;
		for (i = 0; i < nb; i++) {
			if (bt[i] < 0 || (uint32_t)bt[i] >= g->num_blocks) {
				logm(c, PKV_LOG_ERROR, "cuda: sequence %u: block table entry %lld = %d out of range",
				     s, (long long)i, bt[i]);
				return -EINVAL;
			}
		}
		if (sq > *max_q)
			*max_q = sq;
		if (sk > *max_k)
			*max_k = sk;
	}
	for (r = 0; r < b->total_q; r++) {
		if (b->slot_mapping[r] >= (int64_t)g->num_blocks * g->block_size) {
			logm(c, PKV_LOG_ERROR, "cuda: slot_mapping[%lld] = %lld out of range", (long long)r,
			     (long long)b->slot_mapping[r]);
			return -EINVAL;
		}
	}
	return 0;
}

enum dir { H2D, D2H };

/* One 2D copy between a strided host layout and a packed device one (pitches in bytes). */
static int copy2d(struct cuda_ctx *c, enum dir dir, char *dev, size_t dpitch, char *hostp, size_t hpitch,
		  size_t width, size_t height)
{
	if (dir == H2D)
		return CU(c, cudaMemcpy2DAsync(dev, dpitch, hostp, hpitch, width, height, cudaMemcpyHostToDevice,
					       c->stream));
	return CU(c, cudaMemcpy2DAsync(hostp, hpitch, dev, dpitch, width, height, cudaMemcpyDeviceToHost, c->stream));
}

/*
 * Moves a [ntok][nheads][D] tensor between a strided host layout (element
 * strides st_tok, st_head; rows of D contiguous) and a packed device one,
 * with as few copies as the strides allow. Only the D elements of each row
 * are touched: gaps between rows are neither read nor written.
 */
static int move_tensor(struct cuda_ctx *c, enum dir dir, void *dev, void *hostp, int64_t st_tok, int64_t st_head,
		       uint32_t ntok, uint32_t nheads, uint32_t D, size_t es)
{
	const size_t row = (size_t)D * es, packed_tok = row * nheads;
	char *d = dev, *h = hostp;
	uint32_t t, i;
	int rc = 0;

	if (nheads == 1)
		st_head = D;
	if (ntok == 1)
		st_tok = (int64_t)D * nheads;
	/* Heads back to back: one copy of whole tokens. */
	if (st_head == (int64_t)D && st_tok >= (int64_t)D * nheads)
		return copy2d(c, dir, d, packed_tok, h, (size_t)st_tok * es, packed_tok, ntok);
	/* Evenly spaced rows: one copy of ntok * nheads rows. */
	if (st_head >= (int64_t)D && st_tok == st_head * nheads)
		return copy2d(c, dir, d, row, h, (size_t)st_head * es, row, (size_t)ntok * nheads);
	/* Head-major or other layouts: one copy per head, or per token. */
	if (st_tok >= (int64_t)D) {
		for (i = 0; i < nheads && !rc; i++)
			rc = copy2d(c, dir, d + i * row, packed_tok, h + (size_t)i * st_head * es, (size_t)st_tok * es,
				    row, ntok);
		return rc;
	}
	if (st_head >= (int64_t)D) {
		for (t = 0; t < ntok && !rc; t++)
			rc = copy2d(c, dir, d + t * packed_tok, row, h + (size_t)t * st_tok * es, (size_t)st_head * es,
				    row, nheads);
		return rc;
	}
	/* Overlapping rows (only sensible for inputs): row by row. */
	for (t = 0; t < ntok && !rc; t++)
		for (i = 0; i < nheads && !rc; i++)
			rc = copy2d(c, dir, d + t * packed_tok + i * row, row,
				    h + ((size_t)t * st_tok + (size_t)i * st_head) * es, row, row, 1);
	return rc;
}

static int attend(struct cuda_ctx *c, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b, int shape)
{
	int32_t max_q, max_k;
	int rc;

	if (!c)
		return -EINVAL;
	rc = batch_check(c, mem, b, shape == PKV_CUDA_SHAPE_DECODE, &max_q, &max_k);
	if (rc)
		return rc;
	if (b->total_q == 0)
		return 0;
	rc = use_device(c);
	if (rc)
		return rc;

	const struct pkv_geometry *g = &mem->geo;
	const uint32_t H = g->num_heads, HKV = g->num_kv_heads, D = g->head_dim, T = b->total_q;
	const uint32_t n = b->num_seqs;
	const size_t aes = pkv_dtype_size(b->act_dtype);
	const size_t nq = (size_t)T * H * D, nkv = (size_t)T * HKV * D;
	const size_t bt_n = (size_t)n * b->max_blocks_per_seq;
	const size_t meta_bytes = (size_t)T * 8 + (2 * ((size_t)n + 1) + bt_n) * 4;
	const int splits = pkv_cuda_choose_splits(c->num_sms, shape, c->forced_splits, (int32_t)n, (int32_t)HKV, (int32_t)(H / HKV),
						   max_q, max_k, (int32_t)T, (int32_t)H, (int32_t)D);

	if ((rc = dbuf_reserve(c, &c->q_raw, nq * aes)) || (rc = dbuf_reserve(c, &c->k_raw, nkv * aes)) ||
	    (rc = dbuf_reserve(c, &c->v_raw, nkv * aes)) || (rc = dbuf_reserve(c, &c->o_f32, nq * 4)) ||
	    (rc = dbuf_reserve(c, &c->meta, meta_bytes)) || (rc = pinned_reserve(c, meta_bytes)))
		return rc;
	if (b->act_dtype != g->cache_dtype && (rc = dbuf_reserve(c, &c->q_t, nq * 4)))
		return rc; /* room for Q in the cache dtype, or widened to f32 for the precise path */
	if (b->act_dtype != PKV_DTYPE_F32 && (rc = dbuf_reserve(c, &c->o_act, nq * aes)))
		return rc;
	if (splits > 1 && ((rc = dbuf_reserve(c, &c->part, nq * 4 * (size_t)splits)) ||
			   (rc = dbuf_reserve(c, &c->lse, (size_t)T * H * 4 * (size_t)splits))))
		return rc;

	/* Metadata: one pinned staging buffer, one copy. int64 slots first keeps them 8-byte aligned. */
	char *pm = c->pinned;
	memcpy(pm, b->slot_mapping, (size_t)T * 8);
	memcpy(pm + (size_t)T * 8, b->cu_seq_lens_q, ((size_t)n + 1) * 4);
	memcpy(pm + (size_t)T * 8 + ((size_t)n + 1) * 4, b->cu_seq_lens_k, ((size_t)n + 1) * 4);
	if (bt_n)
		memcpy(pm + (size_t)T * 8 + 2 * ((size_t)n + 1) * 4, b->block_tables, bt_n * 4);
	char *dm = c->meta.p;
	if ((rc = CU(c, cudaMemcpyAsync(dm, pm, meta_bytes, cudaMemcpyHostToDevice, c->stream))))
		return rc;
	const int64_t *d_slots = (const int64_t *)dm;
	const int32_t *d_cuq = (const int32_t *)(dm + (size_t)T * 8);
	const int32_t *d_cuk = d_cuq + n + 1;
	const int32_t *d_bt = d_cuk + n + 1;

	if ((rc = move_tensor(c, H2D, c->q_raw.p, (void *)b->q, b->q_stride_tok, b->q_stride_head, T, H, D, aes)) ||
	    (rc = move_tensor(c, H2D, c->k_raw.p, (void *)b->k_new, b->kv_stride_tok, b->kv_stride_head, T, HKV, D,
			      aes)) ||
	    (rc = move_tensor(c, H2D, c->v_raw.p, (void *)b->v_new, b->kv_stride_tok, b->kv_stride_head, T, HKV, D,
			      aes)))
		goto out_sync;

	char *kl = (char *)mem->k_base + (size_t)b->layer * mem->layer_stride;
	char *vl = (char *)mem->v_base + (size_t)b->layer * mem->layer_stride;
	if ((rc = CU(c, pkv_cuda_append_kv(c->k_raw.p, c->v_raw.p, (int)b->act_dtype, kl, vl, (int)g->cache_dtype,
					   (int64_t)mem->block_stride, (int64_t)mem->token_stride,
					   (int32_t)g->block_size, d_slots, (int32_t)T, (int32_t)(HKV * D),
					   c->stream))))
		goto out_sync;
	/* Activations more precise than the cache: the f32 kernel, Q widened to f32 (see attn_precise.cuh). */
	const int precise = pkv_cuda_needs_precise((int)b->act_dtype, (int)g->cache_dtype);
	const void *qdev = c->q_raw.p;
	if (precise && b->act_dtype != PKV_DTYPE_F32) {
		if ((rc = CU(c, pkv_cuda_convert(c->q_raw.p, (int)b->act_dtype, c->q_t.p, PKV_DTYPE_F32, (int64_t)nq,
						 c->stream))))
			goto out_sync;
		qdev = c->q_t.p;
	} else if (!precise && b->act_dtype != g->cache_dtype) {
		if ((rc = CU(c, pkv_cuda_convert(c->q_raw.p, (int)b->act_dtype, c->q_t.p, (int)g->cache_dtype,
						 (int64_t)nq, c->stream))))
			goto out_sync;
		qdev = c->q_t.p;
	}

	struct pkv_cuda_attn_args a = {
		.q = qdev,
		.k_cache = kl,
		.v_cache = vl,
		.block_stride = (int64_t)mem->block_stride,
		.token_stride = (int64_t)mem->token_stride,
		.cu_seq_lens_q = d_cuq,
		.cu_seq_lens_k = d_cuk,
		.block_tables = d_bt,
		.max_blocks_per_seq = (int32_t)b->max_blocks_per_seq,
		.block_size = (int32_t)g->block_size,
		.num_seqs = (int32_t)n,
		.total_q = (int32_t)T,
		.max_length_q = max_q,
		.max_length_k = max_k,
		.num_heads = (int32_t)H,
		.num_kv_heads = (int32_t)HKV,
		.head_dim = (int32_t)D,
		.cache_dtype = (int32_t)g->cache_dtype,
		.scale = b->scale > 0.f ? b->scale : 1.f / __builtin_sqrtf((float)D),
		.softcap = b->softcap,
		.window_left = b->window_left,
		.num_splits = splits,
		.o = c->o_f32.p,
		.o_part = c->part.p,
		.lse_part = c->lse.p,
	};
	if (precise) {
		a.num_splits = 1;
		if ((rc = CU(c, pkv_cuda_attention_precise(&a, c->stream))))
			goto out_sync;
	} else {
		if ((rc = CU(c, pkv_cuda_attention(&a, shape, c->stream))))
			goto out_sync;
		if (splits > 1 && (rc = CU(c, pkv_cuda_merge_splits(&a, c->stream))))
			goto out_sync;
	}
	void *odev = c->o_f32.p;
	if (b->act_dtype != PKV_DTYPE_F32) {
		if ((rc = CU(c, pkv_cuda_convert(c->o_f32.p, PKV_DTYPE_F32, c->o_act.p, (int)b->act_dtype,
						 (int64_t)nq, c->stream))))
			goto out_sync;
		odev = c->o_act.p;
	}
	rc = move_tensor(c, D2H, odev, b->o, b->o_stride_tok, b->o_stride_head, T, H, D, aes);
out_sync:
	/* Always drain: the caller may reuse its buffers as soon as we return, even after an error. */
	{
		int rs = CU(c, cudaStreamSynchronize(c->stream));
		if (!rc)
			rc = rs;
	}
	return rc;
}

int pkv_cuda_be_attend_varlen(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b)
{
	return attend(ctx, mem, b, PKV_CUDA_SHAPE_VARLEN);
}

int pkv_cuda_be_attend_decode(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b)
{
	return attend(ctx, mem, b, PKV_CUDA_SHAPE_DECODE);
}

int pkv_cuda_be_copy_blocks(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_block_copy *copies,
			    uint32_t n)
{
	struct cuda_ctx *c = ctx;
	uint32_t i;
	int rc, rs;

	if (!c || !mem || mem->domain != PKV_DOMAIN_CUDA || (n && !copies) || n > INT32_MAX / 2)
		return -EINVAL;
	if (!n)
		return 0;
	for (i = 0; i < n; i++) {
		if (copies[i].src < 0 || copies[i].dst < 0 || (uint32_t)copies[i].src >= mem->geo.num_blocks ||
		    (uint32_t)copies[i].dst >= mem->geo.num_blocks) {
			logm(c, PKV_LOG_ERROR, "cuda: copy_blocks pair %u (%d -> %d) out of range", i, copies[i].src,
			     copies[i].dst);
			return -EINVAL;
		}
	}
	if ((rc = use_device(c)) || (rc = pinned_reserve(c, (size_t)n * 8)) ||
	    (rc = dbuf_reserve(c, &c->meta, (size_t)n * 8)))
		return rc;
	/* struct pkv_block_copy is two int32: the kernel reads it as pairs. */
	memcpy(c->pinned, copies, (size_t)n * sizeof(*copies));
	rc = CU(c, cudaMemcpyAsync(c->meta.p, c->pinned, (size_t)n * 8, cudaMemcpyHostToDevice, c->stream));
	if (!rc)
		rc = CU(c, pkv_cuda_copy_blocks(mem->k_base, mem->v_base, (int64_t)mem->layer_stride,
						(int32_t)mem->geo.num_layers, (int64_t)mem->block_stride,
						c->meta.p, (int32_t)n, c->stream));
	rs = CU(c, cudaStreamSynchronize(c->stream));
	return rc ? rc : rs;
}

int pkv_cuda_be_sync(void *ctx)
{
	struct cuda_ctx *c = ctx;
	int rc;

	if (!c)
		return -EINVAL;
	rc = use_device(c);
	return rc ? rc : CU(c, cudaStreamSynchronize(c->stream));
}

int pkv_cuda_be_register_host(void *ctx, void *ptr, size_t len)
{
	struct cuda_ctx *c = ctx;
	cudaError_t e;
	int owned = 1, rc;

	if (!c || !ptr || !len)
		return -EINVAL;
	if ((rc = use_device(c)))
		return rc;
	if (c->n_regs == c->cap_regs) {
		size_t cap = c->cap_regs ? c->cap_regs * 2 : 8;
		struct host_reg *r = realloc(c->regs, cap * sizeof(*r));
		if (!r)
			return -ENOMEM;
		c->regs = r;
		c->cap_regs = cap;
	}
	e = cudaHostRegister(ptr, len, cudaHostRegisterDefault);
	if (e == cudaErrorHostMemoryAlreadyRegistered) {
		/* The other CUDA plugin of this pool registered the same arena: share it, do not unregister it. */
		cudaGetLastError();
		owned = 0;
	} else if ((rc = CU(c, e))) {
		return rc;
	}
	c->regs[c->n_regs].ptr = ptr;
	c->regs[c->n_regs].owned = owned;
	c->n_regs++;
	return 0;
}

int pkv_cuda_be_unregister_host(void *ctx, void *ptr)
{
	struct cuda_ctx *c = ctx;
	size_t i;
	int rc = 0;

	if (!c || !ptr)
		return -EINVAL;
	for (i = 0; i < c->n_regs; i++) {
		if (c->regs[i].ptr != ptr)
			continue;
		if (c->regs[i].owned && !(rc = use_device(c))) {
			cudaStreamSynchronize(c->stream);
			rc = CU(c, cudaHostUnregister(ptr));
		}
		c->regs[i] = c->regs[--c->n_regs];
		return rc;
	}
	return -ENOENT;
}

int pkv_cuda_be_cache_read(void *ctx, const struct pkv_cache_mem *mem, uint32_t kv, size_t off, void *dst,
			   size_t len)
{
	struct cuda_ctx *c = ctx;
	size_t region;
	int rc;

	if (!c || !mem || !dst || kv > 1 || mem->domain != PKV_DOMAIN_CUDA || !mem->k_base)
		return -EINVAL;
	/* K and V regions are each half of the allocation; stay inside the one asked for. */
	region = mem->layer_stride * mem->geo.num_layers;
	if (off > region || len > region - off)
		return -EINVAL;
	if (!len)
		return 0;
	if ((rc = use_device(c)))
		return rc;
	/* On the context's stream, so it sees every write of earlier calls. */
	rc = CU(c, cudaMemcpyAsync(dst, (const char *)(kv ? mem->v_base : mem->k_base) + off, len,
				   cudaMemcpyDeviceToHost, c->stream));
	if (!rc)
		rc = CU(c, cudaStreamSynchronize(c->stream));
	return rc;
}
