/* SPDX-License-Identifier: MIT */
/* The CPU backend: plugin entry point, caps, cache memory, K/V append, work partition and split merge. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpu.h"

#define HUGE_PAGE (2u << 20)
/* Split a sequence's keys (flash-decoding) only into chunks at least this long. */
#define MIN_SPLIT_KEYS 256u
/*
 * Cascade decode (plan_cascade) only when a shared prefix saves at least
 * this many key reads in all: below it the extra partials and their merge
 * cost about what the shared reads save (measured, docs/performance.md).
 */
#define CASCADE_MIN_KEYS 64u
/* Decode-only batches: runs of equal bytes per thread (plan_decode). */
#ifndef RUNS_PER_THREAD
#define RUNS_PER_THREAD 1u
#endif

/* Items [first, first + n), computed in order by one thread: a decode item prefetches into the next. */
struct cpu_run {
	uint32_t first, n;
};

struct cpu_ctx {
	const struct pkv_host_api *host;
	const struct cpu_isa *isa;
	uint32_t nthreads;
	struct cpu_scratch *scratch;   /* [nthreads] */
	struct cpu_item *items;
	size_t items_cap;
	struct cpu_run *runs;
	size_t runs_cap;
	float *part;
	size_t part_cap;               /* floats */
	/* Cascade (shared-prefix) decode: see plan_cascade. */
	uint32_t cascade_min_keys;     /* least keys a shared prefix must save; 0: never */
	uint64_t *sort;
	size_t sort_cap;
	uint32_t *seqs;                /* members of the shared-prefix items, in item row order */
	size_t seqs_cap;
	struct cpu_cascade_seq *cas;   /* [num_seqs] */
	size_t cas_cap;
};

/* A decode sequence's part in a cascade call: keys [0, shared) in a shared item, the rest in its own items. */
struct cpu_cascade_seq {
	uint32_t shared;               /* keys read through shared-prefix items; 0: not in one */
	uint32_t cas_item, qi;         /* its chunk's first shared item, its row block in them */
	uint32_t pieces, per_piece;    /* key pieces of the shared keys, items per piece (1 or one per KV head) */
	uint32_t first, n;             /* its own (suffix) decode items */
};

/* Bookkeeping of one cache mapping, kept in pkv_cache_mem.owner_priv. */
struct cpu_mapping {
	void *addr;
	size_t len;
	/* The pre-fault thread (see cpu_cache_alloc); stop asks it to end early. */
	pthread_t prefault;
	int prefaulting, stop;
	char *base;
	size_t layer, regions;
};

PKV_BACKEND_EXPORT int pkv_backend_enum(uint32_t index, const struct pkv_backend **out);

#if defined(__x86_64__) && defined(__GNUC__)
/*
 * AMX needs the CPU bits, the OS enabling tile state in XCR0, and (Linux)
 * a per-process permission for the large tile data state.
 */
static int amx_usable(void)
{
	unsigned int a, b, c, d, lo, hi;

	__cpuid_count(7, 0, a, b, c, d);
	if (!((d >> 22) & 1) || !((d >> 24) & 1))
		return 0;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	if (((lo >> 17) & 3) != 3)
		return 0;
#if defined(__linux__)
	/* ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA */
	if (syscall(SYS_arch_prctl, 0x1023, 18))
		return 0;
#endif
	return 1;
}

/* F16C (CPUID.1:ECX bit 29); its state is AVX's, which the caller checks. clang 14 has no "f16c" builtin name. */
static int has_f16c(void)
{
	unsigned int a, b, c, d;

	return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1);
}
#endif

static int cpu_supports(const char *isa)
{
#if defined(__x86_64__) && defined(__GNUC__)
	__builtin_cpu_init();
	if (!strcmp(isa, "amx"))
		return cpu_supports("avx512bf16") && amx_usable();
	if (!strcmp(isa, "avx512bf16"))
		return cpu_supports("avx512") && __builtin_cpu_supports("avx512bf16");
	if (!strcmp(isa, "avx512"))
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
		       cpu_supports("avx2");
	if (!strcmp(isa, "avx2"))
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
#endif
	return !strcmp(isa, "generic");
}

/*
 * The best kernel this CPU runs, capped by the option isa=generic|avx2|
 * avx512|avx512bf16|amx; PKV_CPU_ISA overrides the option (tests use it to
 * cover every variant on one machine). An unknown option value is refused,
 * an unknown PKV_CPU_ISA only warned about (it is a test aid).
 */
static int pick_isa(const struct pkv_host_api *host, const struct pkv_dict *options, const struct cpu_isa **out)
{
	static const struct {
		const char *key;
		const struct cpu_isa *isa;
	} order[] = {
#if defined(__x86_64__)
		{ "amx", &pkv_cpu_isa_amx },
		{ "avx512bf16", &pkv_cpu_isa_avx512bf16 },
		{ "avx512", &pkv_cpu_isa_avx512 },
		{ "avx2", &pkv_cpu_isa_avx2 },
#endif
		{ "generic", &pkv_cpu_isa_generic },
	};
	const char *env = getenv("PKV_CPU_ISA"), *want = pkv_dict_get(options, "isa");
	size_t i, start = 0, n = sizeof(order) / sizeof(order[0]);

	if (env && *env) {
		for (i = 0; i < n && strcmp(order[i].key, env); i++)
			;
		if (i < n)
			want = env;
		else
			host->log(host->host, PKV_LOG_WARN, "cpu backend: unknown PKV_CPU_ISA '%s', ignored", env);
	}
	if (want && strcmp(want, "auto")) {
		for (i = 0; i < n && strcmp(order[i].key, want); i++)
			;
		if (i == n) {
			host->log(host->host, PKV_LOG_ERROR, "cpu backend: unknown isa '%s'", want);
			return -EINVAL;
		}
		start = i;
	}
	*out = &pkv_cpu_isa_generic;
	for (i = start; i < n; i++)
		if (cpu_supports(order[i].key)) {
			*out = order[i].isa;
			break;
		}
	return 0;
}

/*
 * The option cascade_min_keys (0 turns cascade decode off); the test aid
 * PKV_CPU_CASCADE_MIN_KEYS overrides it (the conformance run sets 1, so
 * one shared block takes the cascade path).
 */
static int pick_cascade(const struct pkv_host_api *host, const struct pkv_dict *options, uint32_t *out)
{
	const char *env = getenv("PKV_CPU_CASCADE_MIN_KEYS"), *opt = pkv_dict_get(options, "cascade_min_keys");
	char *end;
	long long v;

	*out = CASCADE_MIN_KEYS;
	if (opt) {
		v = strtoll(opt, &end, 10);
		if (*end || v < 0 || v > UINT32_MAX) {
			host->log(host->host, PKV_LOG_ERROR, "cpu backend: cascade_min_keys '%s' is not 0..%u", opt,
				  UINT32_MAX);
			return -EINVAL;
		}
		*out = (uint32_t)v;
	}
	if (env && *env) {
		v = strtoll(env, &end, 10);
		if (*end || v < 0 || v > UINT32_MAX)
			host->log(host->host, PKV_LOG_WARN, "cpu backend: PKV_CPU_CASCADE_MIN_KEYS '%s' ignored", env);
		else
			*out = (uint32_t)v;
	}
	return 0;
}

static void free_scratch(struct cpu_ctx *c)
{
	uint32_t t;

	if (!c->scratch)
		return;
	for (t = 0; t < c->nthreads; t++) {
		struct cpu_scratch *s = &c->scratch[t];

		c->host->free_aligned(c->host->host, s->qf);
		c->host->free_aligned(c->host->host, s->qh);
		c->host->free_aligned(c->host->host, s->kf);
		c->host->free_aligned(c->host->host, s->vf);
		c->host->free_aligned(c->host->host, s->kt);
		c->host->free_aligned(c->host->host, s->s);
		c->host->free_aligned(c->host->host, s->acc);
		c->host->free_aligned(c->host->host, s->m);
		c->host->free_aligned(c->host->host, s->l);
		c->host->free_aligned(c->host->host, s->lo);
		c->host->free_aligned(c->host->host, s->hi);
		memset(s, 0, sizeof(*s));
	}
}

static void *xalloc(struct cpu_ctx *c, size_t bytes)
{
	return c->host->alloc_aligned(c->host->host, 64, bytes ? bytes : 64);
}

/* Makes every thread's scratch hold rmax query vectors of CPU_MAX_HD. */
static int ensure_scratch(struct cpu_ctx *c, uint32_t rmax)
{
	uint32_t t;

	if (c->scratch[0].rmax >= rmax)
		return 0;
	free_scratch(c);
	for (t = 0; t < c->nthreads; t++) {
		struct cpu_scratch *s = &c->scratch[t];

		s->qf = xalloc(c, (size_t)rmax * CPU_MAX_HD * sizeof(float));
		s->qh = xalloc(c, (size_t)rmax * CPU_MAX_HD * sizeof(uint16_t));
		s->kf = xalloc(c, (size_t)CPU_TK * CPU_MAX_HD * sizeof(float));
		s->vf = xalloc(c, (size_t)CPU_TK * CPU_MAX_HD * sizeof(float));
		s->kt = xalloc(c, (size_t)CPU_TK * CPU_MAX_HD * sizeof(float));
		s->s = xalloc(c, (size_t)rmax * CPU_TK * sizeof(float));
		s->acc = xalloc(c, (size_t)rmax * CPU_MAX_HD * sizeof(float));
		s->m = xalloc(c, rmax * sizeof(float));
		s->l = xalloc(c, rmax * sizeof(float));
		s->lo = xalloc(c, rmax * sizeof(int32_t));
		s->hi = xalloc(c, rmax * sizeof(int32_t));
		if (!s->qf || !s->qh || !s->kf || !s->vf || !s->kt || !s->s || !s->acc || !s->m || !s->l || !s->lo || !s->hi) {
			free_scratch(c);
			return -ENOMEM;
		}
		s->rmax = rmax;
	}
	return 0;
}

static int cpu_init(const struct pkv_host_api *host, const struct pkv_dict *options, void **out)
{
	struct cpu_ctx *c;
	int ret;

	if (!host || !out || host->abi_version < 1 || !host->alloc_aligned || !host->free_aligned ||
	    !host->parallel_for || !host->num_threads || !host->log)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->host = host;
	c->nthreads = host->num_threads(host->host);
	if (c->nthreads < 1)
		c->nthreads = 1;
	c->scratch = calloc(c->nthreads, sizeof(*c->scratch));
	if (!c->scratch) {
		free(c);
		return -ENOMEM;
	}
	ret = pick_isa(host, options, &c->isa);
	if (!ret)
		ret = pick_cascade(host, options, &c->cascade_min_keys);
	if (ret) {
		free(c->scratch);
		free(c);
		return ret;
	}
	host->log(host->host, PKV_LOG_INFO, "cpu backend: %s kernels, %u threads", c->isa->name, c->nthreads);
	*out = c;
	return 0;
}

static void cpu_fini(void *ctx)
{
	struct cpu_ctx *c = ctx;

	if (!c)
		return;
	free_scratch(c);
	free(c->scratch);
	c->host->free_aligned(c->host->host, c->items);
	c->host->free_aligned(c->host->host, c->runs);
	c->host->free_aligned(c->host->host, c->part);
	c->host->free_aligned(c->host->host, c->sort);
	c->host->free_aligned(c->host->host, c->seqs);
	c->host->free_aligned(c->host->host, c->cas);
	free(c);
}

/* Linux's policy number; glibc declares it only under _GNU_SOURCE, which the plugin does not set. */
#ifndef SCHED_IDLE
#define SCHED_IDLE 5
#endif

/*
 * Faults the whole cache in, in the order the cache manager hands blocks
 * out (lowest index first) across every layer's K and V, 2 MiB of each at a
 * time: the blocks a pool uses first are ready first.
 *
 * The first 2 MiB of every layer's K and V (the blocks the first requests
 * take: a restarted daemon's first disk fetch, an engine's first prompts)
 * at normal priority: they would fault on the loop or in a step otherwise,
 * one 2 MiB page at a time; done here they overlap the disk read. The rest
 * at SCHED_IDLE: zeroed only with CPU nobody else wants, so that a pool of
 * many GiB does not take half of a small machine's CPUs from the requests
 * that are already running; what they touch before the thread got there,
 * they fault themselves, as without the thread.
 *
 * One write per 4 KiB page, not MADV_POPULATE_WRITE: madvise holds the
 * process's mmap lock across its whole range, and a thread this low in
 * priority may sit preempted inside it for long, stalling any mmap or
 * munmap of the daemon (and every fault queued behind that writer); a
 * single fault holds only the pool mapping's own lock. The atomic add of 0
 * changes no byte, so racing with the blocks' real writers is harmless.
 */
static void *prefault(void *arg)
{
	struct cpu_mapping *m = arg;
	struct sched_param sp = { 0 };

	/* Named for top -H and perf sched: a new pool's first seconds show this thread busy. */
	prctl(PR_SET_NAME, "pkv-prefault", 0, 0, 0);
	for (size_t off = 0; off < m->layer; off += HUGE_PAGE) {
		if (off == HUGE_PAGE)
			pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
		for (size_t r = 0; r < m->regions; r++) {
			char *a = m->base + r * m->layer + off;
			size_t n = m->layer - off < HUGE_PAGE ? m->layer - off : HUGE_PAGE;

			if (__atomic_load_n(&m->stop, __ATOMIC_RELAXED))
				return NULL;
			for (size_t i = 0; i < n; i += 4096)
				__atomic_fetch_add(a + i, 0, __ATOMIC_RELAXED);
		}
	}
	return NULL;
}

static int cpu_cache_alloc(void *ctx, const struct pkv_pool_desc *pool, struct pkv_cache_mem *mem)
{
	struct cpu_ctx *c = ctx;
	const struct pkv_geometry *g;
	struct cpu_mapping *map;
	size_t tok, blk, layer, total, len;
	char *p, *aligned;

	if (!pool || !mem || pool->struct_size < sizeof(*pool) || mem->struct_size < sizeof(*mem))
		return -EINVAL;
	g = &pool->geo;
	if (g->cache_dtype >= PKV_DTYPE_COUNT || !g->num_layers || !g->num_kv_heads || !g->head_dim ||
	    !g->block_size || !g->num_blocks)
		return -EINVAL;
	if (__builtin_mul_overflow((size_t)g->num_kv_heads * g->head_dim, pkv_dtype_size(g->cache_dtype), &tok) ||
	    __builtin_mul_overflow(tok, (size_t)g->block_size, &blk) ||
	    __builtin_mul_overflow(blk, (size_t)g->num_blocks, &layer) ||
	    __builtin_mul_overflow(layer, (size_t)g->num_layers * 2, &total) ||
	    __builtin_add_overflow(total, (size_t)HUGE_PAGE, &len))
		return -EOVERFLOW;
	map = calloc(1, sizeof(*map));
	if (!map)
		return -ENOMEM;
	/* Over-map by one huge page so the cache can start on a 2 MiB boundary for THP. */
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED) {
		free(map);
		return -ENOMEM;
	}
	aligned = (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
	/* Decode streams the whole cache: 2 MiB pages cut TLB misses (~30% more read bandwidth here). */
	if (madvise(aligned, total, MADV_HUGEPAGE))
		c->host->log(c->host->host, PKV_LOG_DEBUG, "cpu backend: madvise(MADV_HUGEPAGE) failed");
#endif
	map->addr = p;
	map->len = len;
	/*
	 * The pool is pre-allocated, as vLLM's KV pool is: its memory is
	 * faulted in now, in the background, not by the first steps and disk
	 * reads that touch it (a fresh 2 MiB page costs ~5 ms on a VM). This
	 * runs on its own thread because the daemon creates pools on its loop
	 * with the backend lock held: a synchronous pre-fault of a pool of many
	 * GiB would stall every client for seconds. Without the thread the pool
	 * simply faults on first touch, as before.
	 */
	map->base = aligned;
	map->layer = layer;
	map->regions = (size_t)g->num_layers * 2;
	map->prefaulting = !pthread_create(&map->prefault, NULL, prefault, map);
	mem->domain = PKV_DOMAIN_HOST;
	mem->geo = *g;
	mem->k_base = aligned;
	mem->v_base = aligned + layer * g->num_layers;
	mem->layer_stride = layer;
	mem->block_stride = blk;
	mem->token_stride = tok;
	mem->bytes = total;
	mem->owner_priv = map;
	return 0;
}

static void cpu_cache_free(void *ctx, struct pkv_cache_mem *mem)
{
	struct cpu_mapping *map;

	if (!mem || !mem->owner_priv)
		return;
	map = mem->owner_priv;
	if (map->prefaulting) {
		struct sched_param sp = { 0 };

		__atomic_store_n(&map->stop, 1, __ATOMIC_RELAXED);
		/* Back to normal priority: a busy machine would leave it starving inside a fault while we wait. */
		pthread_setschedparam(map->prefault, SCHED_OTHER, &sp);
		pthread_join(map->prefault, NULL);
	}
	munmap(map->addr, map->len);
	free(map);
	mem->owner_priv = NULL;
	mem->k_base = mem->v_base = NULL;
}

struct copy_job {
	const struct pkv_cache_mem *mem;
	const struct pkv_block_copy *copies;
	uint32_t n;
};

static void copy_task(void *arg, uint32_t task, uint32_t thread)
{
	const struct copy_job *j = arg;
	const struct pkv_cache_mem *m = j->mem;
	uint32_t layer = task / j->n;
	const struct pkv_block_copy *cp = &j->copies[task % j->n];
	size_t off_s = layer * m->layer_stride + (size_t)cp->src * m->block_stride;
	size_t off_d = layer * m->layer_stride + (size_t)cp->dst * m->block_stride;

	if (cp->src == cp->dst)
		return;
	memcpy((char *)m->k_base + off_d, (char *)m->k_base + off_s, m->block_stride);
	memcpy((char *)m->v_base + off_d, (char *)m->v_base + off_s, m->block_stride);
}

static int cpu_copy_blocks(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_block_copy *copies,
			   uint32_t n)
{
	struct cpu_ctx *c = ctx;
	struct copy_job j = { mem, copies, n };
	uint32_t i;

	if (!mem || (n && !copies))
		return -EINVAL;
	for (i = 0; i < n; i++)
		if (copies[i].src < 0 || copies[i].dst < 0 || (uint32_t)copies[i].src >= mem->geo.num_blocks ||
		    (uint32_t)copies[i].dst >= mem->geo.num_blocks)
			return -EINVAL;
	if (n == 0)
		return 0;
	if ((uint64_t)n * mem->geo.num_layers > UINT32_MAX)
		return -E2BIG;
	return c->host->parallel_for(c->host->host, n * mem->geo.num_layers, copy_task, &j);
}

/* Checks what this backend relies on, so a bad batch is refused instead of read out of bounds. */
static int check_batch(const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b)
{
	const struct pkv_geometry *g = &mem->geo;
	uint64_t nslots = (uint64_t)g->num_blocks * g->block_size;
	uint32_t s, i;

	if (b->struct_size < offsetof(struct pkv_attn_batch, flags) + sizeof(uint32_t) ||
	    mem->domain != PKV_DOMAIN_HOST || b->layer >= g->num_layers || b->act_dtype >= PKV_DTYPE_COUNT ||
	    g->cache_dtype >= PKV_DTYPE_COUNT || !g->num_kv_heads || g->num_heads % g->num_kv_heads ||
	    !g->head_dim || g->head_dim > CPU_MAX_HD || g->head_dim % 8 || !g->block_size ||
	    !b->cu_seq_lens_q || !b->cu_seq_lens_k || b->cu_seq_lens_q[0] || b->cu_seq_lens_k[0])
		return -EINVAL;
	if (b->num_seqs && (!b->block_tables || !b->max_blocks_per_seq))
		return -EINVAL;
	if (b->total_q && (!b->q || !b->o || !b->k_new || !b->v_new || !b->slot_mapping))
		return -EINVAL;
	if ((uint32_t)b->cu_seq_lens_q[b->num_seqs] != b->total_q)
		return -EINVAL;
	for (s = 0; s < b->num_seqs; s++) {
		int32_t sq = b->cu_seq_lens_q[s + 1] - b->cu_seq_lens_q[s];
		int32_t sk = b->cu_seq_lens_k[s + 1] - b->cu_seq_lens_k[s];
		uint32_t nb = (uint32_t)(((int64_t)sk + g->block_size - 1) / g->block_size), j;

		if (sq < 0 || sk < 0 || nb > b->max_blocks_per_seq)
			return -EINVAL;
		for (j = 0; j < nb; j++) {
			int32_t id = b->block_tables[(size_t)s * b->max_blocks_per_seq + j];

			if (id < 0 || (uint32_t)id >= g->num_blocks)
				return -EINVAL;
		}
	}
	for (i = 0; i < b->total_q; i++)
		if (b->slot_mapping[i] >= 0 && (uint64_t)b->slot_mapping[i] >= nslots)
			return -EINVAL;
	return 0;
}

struct write_job {
	const struct pkv_cache_mem *mem;
	const struct pkv_attn_batch *b;
};

#define WRITE_CHUNK 32u

/* Appends rows [task*32, +32) of K_new/V_new into their slots, converted exactly. */
static void write_task(void *arg, uint32_t task, uint32_t thread)
{
	const struct write_job *j = arg;
	const struct pkv_attn_batch *b = j->b;
	const struct pkv_geometry *g = &j->mem->geo;
	uint32_t asz = pkv_dtype_size(b->act_dtype), csz = pkv_dtype_size(g->cache_dtype);
	uint32_t r, h, end = (task + 1) * WRITE_CHUNK < b->total_q ? (task + 1) * WRITE_CHUNK : b->total_q;
	char *kl = (char *)j->mem->k_base + (size_t)b->layer * j->mem->layer_stride;
	char *vl = (char *)j->mem->v_base + (size_t)b->layer * j->mem->layer_stride;

	for (r = task * WRITE_CHUNK; r < end; r++) {
		int64_t slot = b->slot_mapping[r];
		size_t off;

		if (slot < 0)
			continue;
		off = (size_t)(slot / g->block_size) * j->mem->block_stride +
		      (size_t)(slot % g->block_size) * j->mem->token_stride;
		for (h = 0; h < g->num_kv_heads; h++) {
			size_t src = ((size_t)r * b->kv_stride_tok + (size_t)h * b->kv_stride_head) * asz;
			size_t dst = off + (size_t)h * g->head_dim * csz;

			pkv_cpu_convert(kl + dst, g->cache_dtype, (const char *)b->k_new + src, b->act_dtype, g->head_dim);
			pkv_cpu_convert(vl + dst, g->cache_dtype, (const char *)b->v_new + src, b->act_dtype, g->head_dim);
		}
	}
}

struct attend_job {
	struct cpu_ctx *ctx;
	struct cpu_call call;
	const struct cpu_item *items;
	const struct cpu_run *runs;
};

static void attend_task(void *arg, uint32_t task, uint32_t thread)
{
	struct attend_job *j = arg;
	const struct cpu_run *r = &j->runs[task];
	struct cpu_scratch *sc = &j->ctx->scratch[thread];
	uint32_t i;

	sc->pf_carry = 0;
	for (i = r->first; i < r->first + r->n; i++)
		j->ctx->isa->attend(&j->call, &j->items[i], i + 1 < r->first + r->n ? &j->items[i + 1] : NULL, sc);
}

/* A log-sum-exp merge in progress (flash-decoding's combine): partials (m, l, acc) folded in one by one. */
struct lse_acc {
	float m, l;
	float o[CPU_MAX_HD];
};

static void lse_init(struct lse_acc *a)
{
	a->m = -INFINITY;
	a->l = 0.0f;
	memset(a->o, 0, sizeof(a->o));
}

/* Folds in partial p = (m, l, acc[hd]): both sides are rescaled to the larger max. */
static void lse_add(const struct cpu_call *c, struct lse_acc *a, const float *p)
{
	float w;
	uint32_t d;

	if (p[0] == -INFINITY)
		return; /* saw no key */
	if (p[0] > a->m) {
		w = a->m == -INFINITY ? 0.0f : expf(a->m - p[0]);
		a->l *= w;
		for (d = 0; d < c->hd; d++)
			a->o[d] *= w;
		a->m = p[0];
	}
	w = expf(p[0] - a->m);
	a->l += p[1] * w;
	for (d = 0; d < c->hd; d++)
		a->o[d] += p[2 + d] * w;
}

static const float *part_row(const struct cpu_call *c, const struct cpu_item *it, uint32_t r)
{
	return c->part + (size_t)it->part * c->part_stride + (size_t)r * (c->hdp + 2);
}

static char *out_row(const struct cpu_call *c, uint32_t tok, uint32_t h)
{
	const struct pkv_attn_batch *b = c->b;

	return (char *)b->o + ((size_t)tok * b->o_stride_tok + (size_t)h * b->o_stride_head) * pkv_dtype_size(c->adt);
}

/*
 * Writes the merged row of query token tok, head h: acc / l, or 0 for a row
 * that saw no key; and its log-sum-exp when the batch asks for it.
 */
static void lse_store(const struct cpu_call *c, struct lse_acc *a, uint32_t tok, uint32_t h)
{
	uint32_t d;

	if (a->l > 0)
		for (d = 0; d < c->hd; d++)
			a->o[d] /= a->l;
	pkv_cpu_store_row(out_row(c, tok, h), c->adt, a->o, c->hd);
	if (c->lse)
		c->lse[(size_t)tok * c->nh + h] = a->l > 0 ? a->m + logf(a->l) : -INFINITY;
}

/* Merges the partials of a split item group (flash-decoding's log-sum-exp combine) and writes O. */
static void merge_split(const struct cpu_call *c, const struct cpu_item *first, uint32_t nsplit)
{
	uint32_t R = first->nq * first->nkvh * c->G, r, i;
	struct lse_acc a;

	for (r = 0; r < R; r++) {
		uint32_t qi, h;

		cpu_row_map(c, first, r, &qi, &h);
		lse_init(&a);
		for (i = 0; i < nsplit; i++)
			lse_add(c, &a, part_row(c, &first[i], r));
		lse_store(c, &a, (uint32_t)c->b->cu_seq_lens_q[first->seq] + first->q0 + qi, h);
	}
}

/*
 * Merges a cascade sequence's partials, head by head: its row in the shared
 * item of each key piece that holds the head's KV head (row qi * G + g of an
 * item of one KV head, (kvh * nq + qi) * G + g of one over every KV head),
 * and row h of each of its own decode items (every KV head, nq = 1).
 */
static void merge_cascade(const struct cpu_call *c, const struct cpu_item *items, const struct cpu_cascade_seq *q,
			  uint32_t s, uint32_t nh)
{
	uint32_t h, i;
	struct lse_acc a;

	for (h = 0; h < nh; h++) {
		uint32_t kvh = h / c->G, kp;

		lse_init(&a);
		/* Per key piece, one shared item per KV head or one over every KV head: rows (hh * nq + qi) * G + g. */
		for (kp = 0; kp < q->pieces; kp++) {
			const struct cpu_item *it = &items[q->cas_item + kp * q->per_piece + (q->per_piece > 1 ? kvh : 0)];

			lse_add(c, &a, part_row(c, it, ((kvh - it->kvh) * it->nq + q->qi) * c->G + h % c->G));
		}
		for (i = 0; i < q->n; i++)
			lse_add(c, &a, part_row(c, &items[q->first + i], h));
		lse_store(c, &a, (uint32_t)c->b->cu_seq_lens_q[s], h);
	}
}

static int grow(struct cpu_ctx *c, void **buf, size_t *cap, size_t need, size_t elem)
{
	void *p;

	if (*cap >= need)
		return 0;
	need = need < 64 ? 64 : need * 2;
	p = xalloc(c, need * elem);
	if (!p)
		return -ENOMEM;
	c->host->free_aligned(c->host->host, *buf);
	*buf = p;
	*cap = need;
	return 0;
}

/*
 * Batches with prefill: one item per group (prefill sequence x KV head x
 * row block, or decode sequence), each its own run; with fewer than ~4
 * groups per thread, each group's keys are split (flash-decoding) into up
 * to 4 x threads / groups chunks of whole tiles, at least MIN_SPLIT_KEYS.
 */
static int plan_general(struct cpu_ctx *c, const struct cpu_call *call, uint32_t nkv, uint32_t n_groups,
			uint32_t *n_items, int *any_split)
{
	const struct pkv_attn_batch *b = call->b;
	uint32_t s, h, i, nsplit_max = 1, ni = 0;
	size_t need;
	int ret;

	if (n_groups < 4 * c->nthreads && c->nthreads > 1 && b->max_length_k >= 2 * MIN_SPLIT_KEYS) {
		nsplit_max = (4 * c->nthreads + n_groups - 1) / n_groups;
		if (nsplit_max > b->max_length_k / MIN_SPLIT_KEYS)
			nsplit_max = b->max_length_k / MIN_SPLIT_KEYS;
	}
	need = (size_t)n_groups * nsplit_max;
	ret = grow(c, (void **)&c->items, &c->items_cap, need, sizeof(*c->items));
	if (!ret)
		ret = grow(c, (void **)&c->runs, &c->runs_cap, need, sizeof(*c->runs));
	if (ret)
		return ret;
	for (s = 0; s < b->num_seqs; s++) {
		uint32_t sq = (uint32_t)(b->cu_seq_lens_q[s + 1] - b->cu_seq_lens_q[s]);
		uint32_t sk = (uint32_t)(b->cu_seq_lens_k[s + 1] - b->cu_seq_lens_k[s]);
		uint32_t q0, nsplit = 1, chunk = sk, nkvh = sq == 1 ? nkv : 1;

		if (nsplit_max > 1 && sk >= 2 * MIN_SPLIT_KEYS) {
			nsplit = sk / MIN_SPLIT_KEYS < nsplit_max ? sk / MIN_SPLIT_KEYS : nsplit_max;
			chunk = ((sk + nsplit - 1) / nsplit + CPU_TK - 1) / CPU_TK * CPU_TK;
			nsplit = (sk + chunk - 1) / chunk;
		}
		for (h = 0; h < nkv; h += nkvh) {
			for (q0 = 0; q0 < sq; q0 += call->qb) {
				uint32_t nq = sq - q0 < call->qb ? sq - q0 : call->qb;

				for (i = 0; i < nsplit; i++) {
					struct cpu_item *it = &c->items[ni];

					it->seq = s;
					it->kvh = h;
					it->nkvh = nkvh;
					it->q0 = q0;
					it->nq = nq;
					it->k0 = i * chunk;
					it->k1 = (i + 1) * chunk < sk ? (i + 1) * chunk : sk;
					it->part = nsplit > 1 ? (int32_t)ni : -1;
					it->flags = 0;
					c->runs[ni].first = ni;
					c->runs[ni].n = 1;
					ni++;
				}
			}
		}
		*any_split |= nsplit > 1;
	}
	*n_items = ni;
	return 0;
}

/*
 * Sequences per shared-prefix item where the kernel's f32-query decode loop
 * takes the cascade's shared part (f32 queries, head dim % 32 == 0): as
 * many as fit its dec_rows_f32 rows over every KV head, at most qb; 0 where
 * it does not serve the call (or fewer than 2 would fit).
 */
static uint32_t cascade_f32_seqs(const struct cpu_ctx *c, const struct cpu_call *call, uint32_t nkv)
{
	uint32_t q;

	if (call->adt != PKV_DTYPE_F32 || call->hd % 32 || !c->isa->dec_rows_f32)
		return 0;
	q = c->isa->dec_rows_f32 / (call->G * nkv);
	if (q < 2)
		return 0;
	return q < call->qb ? q : call->qb;
}

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;

	return a < b ? -1 : a > b;
}

/*
 * Cascade (shared-prefix) attention for a decode-only batch. Sequences whose
 * block tables start with the same block ids read the same keys there (a
 * block's contents belong to its id), so one item per KV head can read
 * those keys once for all their queries: n_seqs x G rows against the
 * shared keys, a small matrix product (on the f32 decode loop for f32
 * queries, else on the prefill tile path or, for few rows, the bf16 decode
 * loop) where each sequence alone is a G-row matrix-vector pass; each sequence's own keys
 * stay in decode items; both write partials, merged per sequence by their
 * log-sum-exp (merge_cascade).
 *
 * Only whole blocks count (a partly filled block may be shared yet seen up
 * to different lengths), and only where every key of them is visible to the
 * sequence's query (no sliding window cutting into them). Sequences are
 * grouped by their first block id (a sort, so a hostile batch costs n log n);
 * in a group, each member's common leading blocks with the first member are
 * counted, and the group shares P blocks among the m members that have at
 * least P, with P chosen to save the most reads ((m - 1) x P); below
 * cascade_min_keys saved keys the group is left to plain decode. Block ids
 * were checked by check_batch for every block a sequence's keys span;
 * nothing else in the tables is trusted.
 *
 * Appends the shared items at items[*n_items...], one run each, and sets
 * c->cas[] for every sequence.
 */
static void plan_cascade(struct cpu_ctx *c, const struct cpu_call *call, uint32_t nkv, uint32_t *n_items,
			     uint32_t *n_runs)
{
	const struct pkv_attn_batch *b = call->b;
	const int32_t *bt = b->block_tables;
	size_t mb = b->max_blocks_per_seq;
	uint32_t n = b->num_seqs, ns = 0, nseqs = 0, i, j, k, s;
	/* Rows per KV head the decode loop takes for this call (0: it does not serve it); sequences per chunk. */
	uint32_t dec = call->cdt == PKV_DTYPE_BF16 && call->adt == PKV_DTYPE_BF16 && call->hd % 32 == 0 ?
			       c->isa->dec_rows : 0, cq = call->qb, f32q = cascade_f32_seqs(c, call, nkv);

	/* f32 queries: the f32 decode loop takes chunks of f32q sequences whole (see below). */
	if (f32q) {
		cq = f32q;
		dec = f32q * call->G;
	}

	memset(c->cas, 0, (size_t)n * sizeof(*c->cas));
	/* Fewer than 2 sequences per item (G >= 32) would read each prefix once per sequence anyway. */
	if (!c->cascade_min_keys || n < 2 || call->qb < 2)
		return;
	for (s = 0; s < n; s++) {
		uint32_t sk = (uint32_t)(b->cu_seq_lens_k[s + 1] - b->cu_seq_lens_k[s]);

		if (sk < call->bs || (call->window >= 0 && (int64_t)sk - 1 - call->window > 0))
			continue;
		c->sort[ns++] = (uint64_t)(uint32_t)bt[s * mb] << 32 | s;
	}
	qsort(c->sort, ns, sizeof(*c->sort), cmp_u64);
	for (i = 0; i < ns; i = j) {
		uint32_t lead = (uint32_t)c->sort[i], lead_full, best_k = 0, m, nch, ch, q0, P, total, pieces, plen;
		uint64_t best = 0;

		for (j = i + 1; j < ns && c->sort[j] >> 32 == c->sort[i] >> 32; j++)
			;
		if (j - i < 2)
			continue;
		lead_full = (uint32_t)(b->cu_seq_lens_k[lead + 1] - b->cu_seq_lens_k[lead]) / call->bs;
		/* Each member's leading blocks in common with the leader (whole blocks of both), then sorted. */
		for (k = i; k < j; k++) {
			uint32_t t = (uint32_t)c->sort[k], l = 0;
			uint32_t full = (uint32_t)(b->cu_seq_lens_k[t + 1] - b->cu_seq_lens_k[t]) / call->bs;
			uint32_t cap = full < lead_full ? full : lead_full;

			while (l < cap && bt[t * mb + l] == bt[lead * mb + l])
				l++;
			c->sort[k] = (uint64_t)l << 32 | t;
		}
		qsort(c->sort + i, j - i, sizeof(*c->sort), cmp_u64);
		/* Ascending: members [k, j) have at least sort[k]'s blocks in common; the leftmost k of a tie wins. */
		for (k = j; k-- > i;) {
			uint64_t save = (uint64_t)(j - k - 1) * (c->sort[k] >> 32);

			if (save > best) {
				best = save;
				best_k = k;
			}
		}
		if (best * call->bs < c->cascade_min_keys)
			continue;
		m = j - best_k;
		/*
		 * Rows of an item: at most qb sequences x G, one item per KV head
		 * (the tile path, K shared across the rows); groups cut into
		 * balanced chunks. Where the kernel's decode loop serves the call,
		 * a chunk of at most dec_rows rows per KV head is one item over
		 * every KV head instead: the decode loop, whole token rows. (Cutting
		 * every group into such chunks read no faster than plain decode
		 * in pkv-bench attn --only cascade: the tile path wins from 4 x G
		 * rows on.) The f32-query decode loop takes any number of rows per
		 * KV head (queries a row at a time, PV four rows per V load): its
		 * chunks are of cq sequences, every KV head in one item, up to its
		 * dec_rows_f32 rows (cascade_f32_seqs); it beats the f32 tile path
		 * at every group size measured (docs/performance.md).
		 */
		nch = (m + cq - 1) / cq;
		P = (uint32_t)(c->sort[best_k] >> 32) * call->bs;
		/*
		 * With several threads the shared keys are cut into pieces (flash-
		 * decoding, merged with the rest) until the group has about two
		 * items per thread: a group of one wide item would otherwise leave
		 * the other threads only its members' short own keys.
		 */
		for (ch = 0, total = 0; ch < nch; ch++)
			total += (m / nch + (ch < m % nch)) * call->G <= dec ? 1 : nkv;
		pieces = 1;
		if (c->nthreads > 1 && total < 2 * c->nthreads) {
			pieces = (2 * c->nthreads + total - 1) / total;
			if (pieces > P / (MIN_SPLIT_KEYS / 2))
				pieces = P / (MIN_SPLIT_KEYS / 2) ? P / (MIN_SPLIT_KEYS / 2) : 1;
		}
		plen = ((P + pieces - 1) / pieces + CPU_TK - 1) / CPU_TK * CPU_TK;
		pieces = (P + plen - 1) / plen;
		for (ch = 0, q0 = 0; ch < nch; ch++) {
			uint32_t cn = m / nch + (ch < m % nch), h, kp;
			uint32_t wide = cn * call->G <= dec;

			for (k = 0; k < cn; k++) {
				struct cpu_cascade_seq *q = &c->cas[(uint32_t)c->sort[best_k + q0 + k]];

				c->seqs[nseqs + k] = (uint32_t)c->sort[best_k + q0 + k];
				q->shared = P;
				q->cas_item = *n_items;
				q->qi = k;
				q->pieces = pieces;
				q->per_piece = wide ? 1 : nkv;
			}
			for (kp = 0; kp < pieces; kp++)
				for (h = 0; h < nkv; h += wide ? nkv : 1) {
					struct cpu_item *it = &c->items[*n_items];

					it->seq = c->seqs[nseqs];
					it->kvh = h;
					it->nkvh = wide ? nkv : 1;
					it->q0 = nseqs;
					it->nq = cn;
					it->k0 = kp * plen;
					it->k1 = (kp + 1) * plen < P ? (kp + 1) * plen : P;
					it->part = (int32_t)*n_items;
					it->flags = CPU_ITEM_SHARED;
					c->runs[*n_runs].first = *n_items;
					c->runs[(*n_runs)++].n = 1;
					(*n_items)++;
				}
			nseqs += cn;
			q0 += cn;
		}
	}
}

/*
 * A decode-only batch: the sequences' keys, laid end to end, are cut into
 * runs of equal keys, RUNS_PER_THREAD per thread. A decode item reads whole
 * token rows, so equal keys are equal bytes, whatever the batch's lengths
 * (batch 1: each thread one range of blocks). A sequence a cut falls in is
 * split there (flash-decoding: the pieces' (m, l, acc) are merged after);
 * cuts fall on whole tiles and leave no piece under MIN_SPLIT_KEYS / 2 (the
 * cut moves to the piece's end). A run's items go to one thread in order,
 * and the decode loop prefetches each next item while finishing the one
 * before: one thread streams its whole range, item boundaries included.
 */
static void plan_decode(struct cpu_ctx *c, const struct pkv_attn_batch *b, uint32_t nkv, uint64_t dec_keys,
			size_t cap, uint32_t *n_items, uint32_t *n_runs, int *any_split)
{
	uint64_t nr = (uint64_t)c->nthreads * RUNS_PER_THREAD, target = UINT64_MAX, fill = 0;
	uint32_t s, i, ni = *n_items, nrun = *n_runs, run0 = ni;

	if (c->nthreads > 1) {
		target = ((dec_keys + nr - 1) / nr + CPU_TK - 1) / CPU_TK * CPU_TK;
		if (target < MIN_SPLIT_KEYS)
			target = MIN_SPLIT_KEYS;
	}
	for (s = 0; s < b->num_seqs; s++) {
		uint32_t sk = (uint32_t)(b->cu_seq_lens_k[s + 1] - b->cu_seq_lens_k[s]), first = ni;
		/* A cascade sequence's own keys start after its shared prefix. */
		uint32_t k = c->cas[s].shared, cascade = k > 0;

		if (cascade && k == sk) {
			c->cas[s].first = ni;
			c->cas[s].n = 0;
			continue; /* every key it sees is in the shared item */
		}
		do {
			uint64_t room = target - fill;
			uint32_t take = sk - k;

			if (take > room) {
				take = (uint32_t)(room / CPU_TK * CPU_TK);
				if (take < MIN_SPLIT_KEYS / 2)
					take = 0;
				/* No tiny tail; and never more items than allocated (each later sequence needs one). */
				else if (sk - k - take < MIN_SPLIT_KEYS / 2 || ni + 1 + (b->num_seqs - s) > cap)
					take = sk - k;
			}
			if (take || sk == 0) {
				struct cpu_item *it = &c->items[ni++];

				it->seq = s;
				it->kvh = 0;
				it->nkvh = nkv;
				it->q0 = 0;
				it->nq = 1;
				it->k0 = k;
				it->k1 = k + take;
				it->flags = cascade ? CPU_ITEM_SUFFIX : 0;
				k += take;
				fill += take;
			}
			if (fill >= target || (!take && sk)) {
				c->runs[nrun].first = run0;
				c->runs[nrun++].n = ni - run0;
				run0 = ni;
				fill = 0;
			}
		} while (k < sk);
		/* Pieces of a split sequence, and every piece of a cascade one, write partials. */
		for (i = first; i < ni; i++)
			c->items[i].part = ni - first > 1 || cascade ? (int32_t)i : -1;
		*any_split |= ni - first > 1 || cascade;
		c->cas[s].first = first;
		c->cas[s].n = ni - first;
	}
	if (ni > run0) {
		c->runs[nrun].first = run0;
		c->runs[nrun++].n = ni - run0;
	}
	*n_items = ni;
	*n_runs = nrun;
}

static int cpu_attend(void *ctx, const struct pkv_cache_mem *mem, const struct pkv_attn_batch *b)
{
	struct cpu_ctx *c = ctx;
	const struct pkv_geometry *g;
	struct write_job wj = { mem, b };
	struct attend_job aj = { .ctx = c };
	struct cpu_call *call = &aj.call;
	uint32_t s, n_items = 0, n_runs = 0, n_groups = 0, n_cas = 0, rmax, i;
	uint64_t dec_keys = 0;
	int ret, prefill = 0, any_split = 0;

	if (!c || !mem || !b)
		return -EINVAL;
	ret = check_batch(mem, b);
	if (ret)
		return ret;
	g = &mem->geo;
	if (b->total_q) {
		ret = c->host->parallel_for(c->host->host, (b->total_q + WRITE_CHUNK - 1) / WRITE_CHUNK, write_task, &wj);
		if (ret)
			return ret;
	}

	call->b = b;
	call->kbase = (const char *)mem->k_base + (size_t)b->layer * mem->layer_stride;
	call->vbase = (const char *)mem->v_base + (size_t)b->layer * mem->layer_stride;
	call->block_stride = mem->block_stride;
	call->token_stride = mem->token_stride;
	call->hd = g->head_dim;
	call->hdp = (g->head_dim + 15) & ~15u;
	call->G = g->num_heads / g->num_kv_heads;
	call->bs = g->block_size;
	call->cdt = g->cache_dtype;
	call->adt = b->act_dtype;
	/* ~32 query vectors per item: enough rows to amortise each K/V tile, few enough to stay in L1/L2. */
	call->qb = call->G >= 32 ? 1 : 32 / call->G;
	/* Rows per KV head a multiple of what the kernel blocks by (4 rows AVX-512 bf16, 16 AMX). */
	while ((call->qb * call->G) % c->isa->rows_multiple && call->qb * call->G < 128)
		call->qb++;
	call->scale = b->scale > 0 ? b->scale : 1.0f / sqrtf((float)g->head_dim);
	call->softcap = b->softcap;
	call->window = b->window_left;
	call->lse = PKV_ABI_HAS(b, struct pkv_attn_batch, softmax_lse) ? b->softmax_lse : NULL;
	call->nh = g->num_heads;
	/* A decode row (sq == 1) is one item over every KV head: whole token rows, read once, in order. */
	rmax = call->qb * call->G > g->num_heads ? call->qb * call->G : g->num_heads;
	/* A cascade item over every KV head (plan_cascade) takes up to dec_rows rows per KV head. */
	if (c->cascade_min_keys && c->isa->dec_rows * g->num_kv_heads > rmax)
		rmax = c->isa->dec_rows * g->num_kv_heads;
	/* With f32 queries, chunks of cascade_f32_seqs sequences over every KV head. */
	if (c->cascade_min_keys && b->num_seqs > 1 &&
	    cascade_f32_seqs(c, call, g->num_kv_heads) * g->num_heads > rmax)
		rmax = cascade_f32_seqs(c, call, g->num_kv_heads) * g->num_heads;
	ret = ensure_scratch(c, rmax);
	if (ret)
		return ret;

	/* Count groups (decode sequence, or prefill sequence x KV head x row block) and decode keys. */
	for (s = 0; s < b->num_seqs; s++) {
		uint32_t sq = (uint32_t)(b->cu_seq_lens_q[s + 1] - b->cu_seq_lens_q[s]);

		n_groups += sq == 1 ? 1 : (sq + call->qb - 1) / call->qb * g->num_kv_heads;
		if (sq == 1)
			dec_keys += (uint64_t)(b->cu_seq_lens_k[s + 1] - b->cu_seq_lens_k[s]);
		else
			prefill = 1;
	}
	if (n_groups == 0)
		return 0;
	if (prefill) {
		ret = plan_general(c, call, g->num_kv_heads, n_groups, &n_items, &any_split);
		if (ret)
			return ret;
		n_runs = n_items;
	} else {
		/*
		 * Shared items: at most one per KV head and sequence, plus the key
		 * pieces (about 2 x threads items per group of >= 2 sequences);
		 * decode items: one per sequence plus the cuts.
		 */
		size_t n = b->num_seqs, cap = n * ((size_t)g->num_kv_heads + c->nthreads) + n +
					      2 * (size_t)c->nthreads * RUNS_PER_THREAD + 2;

		ret = grow(c, (void **)&c->items, &c->items_cap, cap, sizeof(*c->items));
		if (!ret)
			ret = grow(c, (void **)&c->runs, &c->runs_cap, cap, sizeof(*c->runs));
		if (!ret)
			ret = grow(c, (void **)&c->sort, &c->sort_cap, n, sizeof(*c->sort));
		if (!ret)
			ret = grow(c, (void **)&c->seqs, &c->seqs_cap, n, sizeof(*c->seqs));
		if (!ret)
			ret = grow(c, (void **)&c->cas, &c->cas_cap, n, sizeof(*c->cas));
		if (ret)
			return ret;
		call->seqs = c->seqs;
		plan_cascade(c, call, g->num_kv_heads, &n_items, &n_runs);
		/* The runs split what the decode items read: each sequence's keys less its shared ones. */
		for (s = 0; s < b->num_seqs; s++)
			dec_keys -= c->cas[s].shared;
		n_cas = n_items;
		any_split = n_cas > 0;
		plan_decode(c, b, g->num_kv_heads, dec_keys, cap, &n_items, &n_runs, &any_split);
	}
	call->part_stride = (size_t)rmax * (call->hdp + 2);
	if (any_split) {
		ret = grow(c, (void **)&c->part, &c->part_cap, (size_t)n_items * call->part_stride, sizeof(float));
		if (ret)
			return ret;
	}
	call->part = c->part;
	aj.items = c->items;
	aj.runs = c->runs;
	ret = c->host->parallel_for(c->host->host, n_runs, attend_task, &aj);
	if (ret)
		return ret;
	if (!any_split)
		return 0;
	for (i = n_cas; i < n_items;) {
		uint32_t n = 1;

		if (c->items[i].part < 0 || c->items[i].flags) {
			i++;
			continue;
		}
		while (i + n < n_items && c->items[i + n].part >= 0 && !c->items[i + n].flags && c->items[i + n].k0 != 0)
			n++;
		merge_split(call, &c->items[i], n);
		i += n;
	}
	for (s = 0; n_cas && s < b->num_seqs; s++)
		if (c->cas[s].shared)
			merge_cascade(call, c->items, &c->cas[s], s, g->num_heads);
	return 0;
}

static int cpu_sync(void *ctx)
{
	return 0; /* every call is synchronous */
}

static const struct pkv_backend_caps cpu_caps = {
	.abi_version = PKV_BACKEND_ABI_VERSION,
	.struct_size = sizeof(struct pkv_backend_caps),
	.paths = PKV_PATH_VARLEN | PKV_PATH_DECODE,
	.domain = PKV_DOMAIN_HOST,
	.cache_dtypes = PKV_DTYPE_BIT(PKV_DTYPE_F32) | PKV_DTYPE_BIT(PKV_DTYPE_F16) | PKV_DTYPE_BIT(PKV_DTYPE_BF16),
	.act_dtypes = PKV_DTYPE_BIT(PKV_DTYPE_F32) | PKV_DTYPE_BIT(PKV_DTYPE_F16) | PKV_DTYPE_BIT(PKV_DTYPE_BF16),
	.head_dim_min = 8, .head_dim_max = CPU_MAX_HD, .head_dim_multiple = 8,
	.block_size_min = 1, .block_size_max = 1u << 20, .block_size_multiple = 1,
	.max_gqa_ratio = 0,
	.features = PKV_FEAT_WINDOW | PKV_FEAT_SOFTCAP | PKV_FEAT_LSE | PKV_FEAT_COPY_VIEW,
};

static const struct pkv_option cpu_options[] = {
	{ .name = "isa", .type = PKV_OPT_STRING, .def = "auto",
	  .help = "newest kernel to use: auto, amx, avx512bf16, avx512, avx2, generic (PKV_CPU_ISA overrides)" },
	{ .name = "cascade_min_keys", .type = PKV_OPT_INT, .def = "64",
	  .help = "read shared leading blocks once per decode batch if that saves this many keys; 0: never" },
	{ .name = NULL },
};

static const struct pkv_backend cpu_backend = {
	.abi_version = PKV_BACKEND_ABI_VERSION,
	.struct_size = sizeof(struct pkv_backend),
	.name = "cpu",
	.description = "CPU attention: paged varlen and decode, f32/f16/bf16, AVX-512/AVX2/portable C",
	.caps = &cpu_caps,
	.options = cpu_options,
	.init = cpu_init,
	.fini = cpu_fini,
	.cache_alloc = cpu_cache_alloc,
	.cache_free = cpu_cache_free,
	.attend_varlen = cpu_attend,
	.attend_decode = cpu_attend,
	.copy_blocks = cpu_copy_blocks,
	.sync = cpu_sync,
};

int pkv_backend_enum(uint32_t index, const struct pkv_backend **out)
{
	if (!out)
		return -EINVAL;
	if (index > 0)
		return -ENOENT;
	*out = &cpu_backend;
	return 0;
}
