/* SPDX-License-Identifier: MIT */
/* In-process contiguous-KV attention: the reference the paged path is compared against, and the
 * fallback that lets the model programs run without a daemon. */
#include "attn.h"
#include "quant.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <pagedkv/dtype.h>

#define MAX_STEP_SEQS 4096

struct rseq {
	int used;          /* 1 live, 2 retired (kept for prefix hits) */
	uint64_t lru;      /* retire time */
	int32_t *tokens;   /* committed tokens */
	uint32_t len, cap; /* committed tokens, capacity (tokens) */
	float *k, *v;      /* [layer][cap][kvh*hd] */
};

struct ref {
	struct pkv_geometry geo;
	uint64_t capacity;
	struct tpool *tp;
	struct rseq *s;
	uint32_t n_s;
	uint64_t clock;
	uint64_t lookup_tokens, hit_tokens;
	/* current step */
	int in_step;
	uint32_t n_step, *step_seq, *step_new, total_q;
	uint32_t *q_start;
	int32_t *step_tok;
};

static size_t kvw(const struct ref *r)
{
	return (size_t)r->geo.num_kv_heads * r->geo.head_dim;
}

static uint64_t live_tokens(const struct ref *r)
{
	uint64_t n = 0;
	for (uint32_t i = 0; i < r->n_s; i++)
		if (r->s[i].used == 1)
			n += r->s[i].len;
	return n;
}

static uint64_t retired_tokens(const struct ref *r)
{
	uint64_t n = 0;
	for (uint32_t i = 0; i < r->n_s; i++)
		if (r->s[i].used == 2)
			n += r->s[i].len;
	return n;
}

static void seq_release(struct rseq *s)
{
	free(s->tokens);
	free(s->k);
	free(s->v);
	memset(s, 0, sizeof *s);
}

/* Frees retired sequences, oldest first, until `need` more tokens fit. */
static int make_room(struct ref *r, uint64_t need)
{
	if (!r->capacity)
		return 0;
	for (;;) {
		uint64_t used = live_tokens(r) + retired_tokens(r);
		if (used + need <= r->capacity)
			return 0;
		int old = -1;
		for (uint32_t i = 0; i < r->n_s; i++)
			if (r->s[i].used == 2 && (old < 0 || r->s[i].lru < r->s[old].lru))
				old = (int)i;
		if (old < 0)
			return -ENOSPC;
		seq_release(&r->s[old]);
	}
}

static int seq_grow(struct ref *r, struct rseq *s, uint32_t want)
{
	if (want <= s->cap)
		return 0;
	uint32_t nc = s->cap ? s->cap : 64;
	while (nc < want)
		nc *= 2;
	size_t w = kvw(r), L = r->geo.num_layers;
	int32_t *t = realloc(s->tokens, nc * sizeof *t);
	float *k = calloc(L * nc * w, sizeof *k), *v = calloc(L * nc * w, sizeof *v);
	if (!t || !k || !v) {
		if (t)
			s->tokens = t;
		free(k);
		free(v);
		return -ENOMEM;
	}
	s->tokens = t;
	for (size_t l = 0; l < L && s->len; l++) {
		memcpy(k + l * nc * w, s->k + l * s->cap * w, s->len * w * sizeof *k);
		memcpy(v + l * nc * w, s->v + l * s->cap * w, s->len * w * sizeof *v);
	}
	free(s->k);
	free(s->v);
	s->k = k;
	s->v = v;
	s->cap = nc;
	return 0;
}

static int new_slot(struct ref *r, uint32_t *id)
{
	for (uint32_t i = 0; i < r->n_s; i++)
		if (!r->s[i].used) {
			*id = i;
			return 0;
		}
	struct rseq *n = realloc(r->s, (r->n_s + 16) * sizeof *n);
	if (!n)
		return -ENOMEM;
	memset(n + r->n_s, 0, 16 * sizeof *n);
	r->s = n;
	*id = r->n_s;
	r->n_s += 16;
	return 0;
}

static int copy_prefix(struct ref *r, struct rseq *dst, const struct rseq *src, uint32_t n)
{
	int e = seq_grow(r, dst, n);
	size_t w = kvw(r);
	if (e)
		return e;
	memcpy(dst->tokens, src->tokens, n * sizeof *dst->tokens);
	for (size_t l = 0; l < r->geo.num_layers; l++) {
		memcpy(dst->k + l * dst->cap * w, src->k + l * src->cap * w, n * w * sizeof(float));
		memcpy(dst->v + l * dst->cap * w, src->v + l * src->cap * w, n * w * sizeof(float));
	}
	dst->len = n;
	return 0;
}

static int r_open(void *ctx, const int32_t *tokens, uint32_t n, uint32_t *seq, uint32_t *n_cached)
{
	struct ref *r = ctx;
	uint32_t id, best = 0, bs = r->geo.block_size ? r->geo.block_size : 1;
	int bi = -1, e;
	if (n == 0 || !tokens)
		return -EINVAL;
	for (uint32_t i = 0; i < r->n_s; i++) {
		uint32_t m = 0;
		if (!r->s[i].used)
			continue;
		while (m < r->s[i].len && m < n && r->s[i].tokens[m] == tokens[m])
			m++;
		if (m > best) {
			best = m;
			bi = (int)i;
		}
	}
	/* Same rule as the daemon: whole blocks only, and the last prompt token is always computed. */
	if (best > n - 1)
		best = n - 1;
	best -= best % bs;
	if ((e = make_room(r, best)))
		return e;
	if ((e = new_slot(r, &id)))
		return e;
	struct rseq *s = &r->s[id];
	s->used = 1;
	if (best && bi >= 0) {
		if ((e = copy_prefix(r, s, &r->s[bi], best))) {
			seq_release(s);
			return e;
		}
		r->s[bi].lru = ++r->clock;
	}
	r->lookup_tokens += n;
	r->hit_tokens += best;
	*seq = id;
	*n_cached = best;
	return 0;
}

static struct rseq *live(struct ref *r, uint32_t id)
{
	return id < r->n_s && r->s[id].used == 1 ? &r->s[id] : NULL;
}

static int r_fork(void *ctx, uint32_t seq, uint32_t *child)
{
	struct ref *r = ctx;
	struct rseq *p = live(r, seq);
	uint32_t id;
	int e;
	if (!p || r->in_step)
		return p ? -EBUSY : -ENOENT;
	if ((e = make_room(r, p->len)) || (e = new_slot(r, &id)))
		return e;
	p = &r->s[seq]; /* new_slot may have moved the array */
	r->s[id].used = 1;
	if ((e = copy_prefix(r, &r->s[id], p, p->len))) {
		seq_release(&r->s[id]);
		return e;
	}
	*child = id;
	return 0;
}

static int r_truncate(void *ctx, uint32_t seq, uint32_t n)
{
	struct ref *r = ctx;
	struct rseq *s = live(r, seq);
	if (!s)
		return -ENOENT;
	if (n > s->len || r->in_step)
		return -EINVAL;
	s->len = n;
	return 0;
}

static int r_close(void *ctx, uint32_t seq)
{
	struct ref *r = ctx;
	struct rseq *s = live(r, seq);
	if (!s)
		return -ENOENT;
	if (r->in_step)
		return -EBUSY;
	s->used = 2;
	s->lru = ++r->clock;
	if (r->capacity == 0) {
		/* unlimited: keep only a few closed sequences so memory stays bounded */
		uint32_t kept = 0;
		for (uint32_t i = 0; i < r->n_s; i++)
			kept += r->s[i].used == 2;
		while (kept > 32) {
			int old = -1;
			for (uint32_t i = 0; i < r->n_s; i++)
				if (r->s[i].used == 2 && (old < 0 || r->s[i].lru < r->s[old].lru))
					old = (int)i;
			seq_release(&r->s[old]);
			kept--;
		}
	}
	return 0;
}

static int r_step_begin(void *ctx, const uint32_t *seqs, const uint32_t *n_new, const int32_t *tokens,
			uint32_t n_seqs)
{
	struct ref *r = ctx;
	uint64_t need = 0, tq = 0;
	int e;
	if (r->in_step)
		return -EBUSY;
	if (n_seqs == 0 || n_seqs > MAX_STEP_SEQS)
		return -EINVAL;
	for (uint32_t i = 0; i < n_seqs; i++) {
		if (!live(r, seqs[i]) || n_new[i] == 0)
			return live(r, seqs[i]) ? -EINVAL : -ENOENT;
		for (uint32_t j = 0; j < i; j++)
			if (seqs[j] == seqs[i])
				return -EINVAL;
		need += n_new[i];
		tq += n_new[i];
	}
	if ((e = make_room(r, need)))
		return e;
	free(r->step_seq);
	free(r->step_new);
	free(r->step_tok);
	free(r->q_start);
	r->step_seq = malloc(n_seqs * sizeof *r->step_seq);
	r->step_new = malloc(n_seqs * sizeof *r->step_new);
	r->q_start = malloc(n_seqs * sizeof *r->q_start);
	r->step_tok = malloc(tq * sizeof *r->step_tok);
	if (!r->step_seq || !r->step_new || !r->q_start || !r->step_tok)
		return -ENOMEM;
	for (uint32_t i = 0; i < n_seqs; i++) {
		struct rseq *s = &r->s[seqs[i]];
		if ((e = seq_grow(r, s, s->len + n_new[i])))
			return e;
	}
	memcpy(r->step_seq, seqs, n_seqs * sizeof *seqs);
	memcpy(r->step_new, n_new, n_seqs * sizeof *n_new);
	memcpy(r->step_tok, tokens, tq * sizeof *tokens);
	for (uint32_t i = 0, q = 0; i < n_seqs; i++) {
		r->q_start[i] = q;
		q += n_new[i];
	}
	r->n_step = n_seqs;
	r->total_q = (uint32_t)tq;
	r->in_step = 1;
	return 0;
}

struct attn_job {
	atomic_ulong next; /* next (sequence, head) task */
	struct ref *r;
	uint32_t layer;
	const float *q;
	float *o;
};

#if defined(__x86_64__)
#include <immintrin.h>

#define T_ATT __attribute__((target("avx2,fma,avx512f")))

/* e^x for x <= 0 (softmax after the max is taken off): 2^n * p(r), r = x - n ln2, |r| <= ln2/2,
 * a degree-6 Taylor polynomial: relative error ~2e-7, below f32's own rounding of the scores. */
T_ATT static inline __m512 exp_neg512(__m512 x)
{
	x = _mm512_max_ps(x, _mm512_set1_ps(-87.f)); /* e^-87 is already below the smallest normal */
	__m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
	__m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
	__m512 p = _mm512_set1_ps(1.f / 720);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
	return _mm512_scalef_ps(p, n);
}

/*
 * One query row against nk keys, NC x 16 = head_dim: the same formula as the portable loop below,
 * with the query and the output row held in registers and the exponentials 16 at a time (a decode
 * step at a 512-token context spends most of its attention time in per-key calls and expf).
 */
__attribute__((always_inline)) T_ATT static inline void attn_row512(const float *qv, const float *K, const float *V,
								     size_t w, uint32_t nk, float scale, float *sc,
								     float *ov, const int NC)
{
	__m512 q[8], o[8];
	for (int c = 0; c < NC; c++) {
		q[c] = _mm512_mul_ps(_mm512_loadu_ps(qv + 16 * c), _mm512_set1_ps(scale));
		o[c] = _mm512_setzero_ps();
	}
	float mx = -INFINITY;
	for (uint32_t k = 0; k < nk; k++) {
		const float *kv = K + (size_t)k * w;
		__m512 a = _mm512_mul_ps(q[0], _mm512_loadu_ps(kv));
		for (int c = 1; c < NC; c++)
			a = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(kv + 16 * c), a);
		sc[k] = _mm512_reduce_add_ps(a);
		mx = fmaxf(mx, sc[k]);
	}
	__m512 vm = _mm512_set1_ps(mx), vs = _mm512_setzero_ps();
	uint32_t k = 0;
	for (; k + 16 <= nk; k += 16) {
		__m512 e = exp_neg512(_mm512_sub_ps(_mm512_loadu_ps(sc + k), vm));
		_mm512_storeu_ps(sc + k, e);
		vs = _mm512_add_ps(vs, e);
	}
	if (k < nk) {
		__mmask16 m = (__mmask16)((1u << (nk - k)) - 1);
		__m512 e = exp_neg512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + k), vm));
		_mm512_mask_storeu_ps(sc + k, m, e);
		vs = _mm512_add_ps(vs, _mm512_maskz_mov_ps(m, e));
	}
	float inv = 1.f / _mm512_reduce_add_ps(vs);
	for (k = 0; k < nk; k++) {
		const float *vv = V + (size_t)k * w;
		__m512 p = _mm512_set1_ps(sc[k] * inv);
		for (int c = 0; c < NC; c++)
			o[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vv + 16 * c), o[c]);
	}
	for (int c = 0; c < NC; c++)
		_mm512_storeu_ps(ov + 16 * c, o[c]);
}

T_ATT static void attn_row_d64(const float *qv, const float *K, const float *V, size_t w, uint32_t nk, float scale,
			       float *sc, float *ov)
{
	attn_row512(qv, K, V, w, nk, scale, sc, ov, 4);
}

T_ATT static void attn_row_d128(const float *qv, const float *K, const float *V, size_t w, uint32_t nk, float scale,
				float *sc, float *ov)
{
	attn_row512(qv, K, V, w, nk, scale, sc, ov, 8);
}

typedef void (*attn_row_fn)(const float *, const float *, const float *, size_t, uint32_t, float, float *, float *);

/* NULL: use the portable loop (no AVX-512, another head size, or $PKV_ISA names a path other than
 * vnni: PKV_ISA=avx512 reproduces the previous client, the "before" of pkv-bench comparisons). */
static attn_row_fn attn_row_for(uint32_t D)
{
	const char *isa = getenv("PKV_ISA");
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("fma") || (isa && strcmp(isa, "vnni")))
		return NULL;
	return D == 64 ? attn_row_d64 : D == 128 ? attn_row_d128 : NULL;
}
#else
typedef void (*attn_row_fn)(const float *, const float *, const float *, size_t, uint32_t, float, float *, float *);
static attn_row_fn attn_row_for(uint32_t D)
{
	(void)D;
	return NULL;
}
#endif

/* One (sequence, query head) pair per task: the plain softmax(q k^T * scale) v in f32. */
static void attn_worker(void *arg, int ith, int nth)
{
	struct attn_job *j = arg;
	struct ref *r = j->r;
	uint32_t H = r->geo.num_heads, KH = r->geo.num_kv_heads, D = r->geo.head_dim, grp = H / KH;
	size_t w = kvw(r);
	float scale = 1.f / sqrtf((float)D);
	uint64_t tasks = (uint64_t)r->n_step * H;
	float *sc = NULL;
	uint32_t sc_cap = 0;
	/* the model's own f32 dot (SIMD): the plain formula, just not a scalar loop */
	float (*dot)(const float *, const float *, size_t) = pkv_dot_ops()->f32;
	attn_row_fn row = attn_row_for(D);
	for (uint64_t t; (t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < tasks;) {
		uint32_t si = (uint32_t)(t / H), h = (uint32_t)(t % H), kh = h / grp;
		struct rseq *s = &r->s[r->step_seq[si]];
		uint32_t sq = r->step_new[si], sk = s->len + sq;
		const float *K = s->k + (size_t)j->layer * s->cap * w, *V = s->v + (size_t)j->layer * s->cap * w;
		if (sk > sc_cap) {
			float *n = realloc(sc, sk * sizeof *sc);
			if (!n)
				break; /* leaves O untouched; cannot happen with sane sizes */
			sc = n;
			sc_cap = sk;
		}
		for (uint32_t i = 0; i < sq; i++) {
			const float *qv = j->q + ((size_t)(r->q_start[si] + i) * H + h) * D;
			float *ov = j->o + ((size_t)(r->q_start[si] + i) * H + h) * D;
			uint32_t nk = i + (sk - sq) + 1; /* bottom-right causal */
			if (row) {
				row(qv, K + (size_t)kh * D, V + (size_t)kh * D, w, nk, scale, sc, ov);
				continue;
			}
			float mx = -INFINITY, sum = 0;
			for (uint32_t k = 0; k < nk; k++) {
				sc[k] = dot(qv, K + (size_t)k * w + (size_t)kh * D, D) * scale;
				mx = fmaxf(mx, sc[k]);
			}
			for (uint32_t k = 0; k < nk; k++) {
				sc[k] = expf(sc[k] - mx);
				sum += sc[k];
			}
			for (uint32_t c = 0; c < D; c++)
				ov[c] = 0;
			for (uint32_t k = 0; k < nk; k++) {
				const float *vv = V + (size_t)k * w + (size_t)kh * D;
				float p = sc[k] / sum;
				for (uint32_t c = 0; c < D; c++)
					ov[c] += p * vv[c];
			}
		}
	}
	free(sc);
}

/*
 * A cache dtype narrower than f32: the new K/V are rounded to it (and kept
 * as f32), so attention sees the values pagedkvd's cache would hold.
 */
static void round_to_cache(const struct ref *r, float *k, float *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (r->geo.cache_dtype == PKV_DTYPE_F16) {
			k[i] = pkv_f16_to_f32(pkv_f32_to_f16(k[i]));
			v[i] = pkv_f16_to_f32(pkv_f32_to_f16(v[i]));
		} else {
			k[i] = pkv_bf16_to_f32(pkv_f32_to_bf16(k[i]));
			v[i] = pkv_bf16_to_f32(pkv_f32_to_bf16(v[i]));
		}
}

static int r_attend(void *ctx, uint32_t layer, const float *q, const float *k, const float *v, float *o)
{
	struct ref *r = ctx;
	size_t w = kvw(r);
	if (!r->in_step)
		return -EINVAL;
	if (layer >= r->geo.num_layers)
		return -EINVAL;
	/* write the new K/V after each sequence's committed tokens */
	for (uint32_t i = 0; i < r->n_step; i++) {
		struct rseq *s = &r->s[r->step_seq[i]];
		size_t base = (size_t)layer * s->cap * w + (size_t)s->len * w;
		memcpy(s->k + base, k + (size_t)r->q_start[i] * w, r->step_new[i] * w * sizeof(float));
		memcpy(s->v + base, v + (size_t)r->q_start[i] * w, r->step_new[i] * w * sizeof(float));
		if (r->geo.cache_dtype != PKV_DTYPE_F32)
			round_to_cache(r, s->k + base, s->v + base, r->step_new[i] * w);
	}
	struct attn_job j = { .next = 0, .r = r, .layer = layer, .q = q, .o = o };
	tpool_run(r->tp, attn_worker, &j);
	return 0;
}

static int r_step_end(void *ctx)
{
	struct ref *r = ctx;
	if (!r->in_step)
		return -EINVAL;
	for (uint32_t i = 0, q = 0; i < r->n_step; i++) {
		struct rseq *s = &r->s[r->step_seq[i]];
		memcpy(s->tokens + s->len, r->step_tok + q, r->step_new[i] * sizeof(int32_t));
		s->len += r->step_new[i];
		q += r->step_new[i];
	}
	r->in_step = 0;
	return 0;
}

static int r_step_abort(void *ctx)
{
	struct ref *r = ctx;
	r->in_step = 0; /* K/V written past len are simply ignored */
	return 0;
}

static void *r_alloc(void *ctx, size_t bytes)
{
	void *p = NULL;
	if (posix_memalign(&p, 64, bytes ? bytes : 64))
		return NULL;
	return p;
}

static void r_free(void *ctx, void *p)
{
	free(p);
}

static int r_stats(void *ctx, struct pkv_stats *st)
{
	struct ref *r = ctx;
	uint32_t bs = r->geo.block_size ? r->geo.block_size : 1;
	memset(st, 0, sizeof *st);
	for (uint32_t i = 0; i < r->n_s; i++) {
		uint32_t b = (r->s[i].len + bs - 1) / bs;
		if (r->s[i].used == 1) {
			st->in_use_blocks += b;
			st->open_seqs++;
		} else if (r->s[i].used == 2) {
			st->cached_blocks += b;
		}
	}
	st->num_blocks = r->capacity ? (uint32_t)(r->capacity / bs) : st->in_use_blocks + st->cached_blocks;
	st->free_blocks = st->num_blocks - st->in_use_blocks - st->cached_blocks;
	st->prefix_lookup_tokens = r->lookup_tokens;
	st->prefix_hit_tokens = r->hit_tokens;
	return 0;
}

static void r_destroy(void *ctx)
{
	struct ref *r = ctx;
	for (uint32_t i = 0; i < r->n_s; i++)
		seq_release(&r->s[i]);
	free(r->s);
	free(r->step_seq);
	free(r->step_new);
	free(r->step_tok);
	free(r->q_start);
	free(r);
}

static const struct pkv_attn_ops ref_ops = {
	.seq_open = r_open, .seq_fork = r_fork, .seq_truncate = r_truncate, .seq_close = r_close,
	.step_begin = r_step_begin, .attend = r_attend, .step_end = r_step_end,
	.step_abort = r_step_abort, .alloc = r_alloc, .free = r_free, .stats = r_stats,
	.destroy = r_destroy,
};

int pkv_attn_ref_create(const struct pkv_geometry *geo, uint64_t capacity_tokens, struct tpool *tp,
			struct pkv_attn *out)
{
	struct ref *r;
	if (!geo->num_layers || !geo->num_heads || !geo->num_kv_heads || !geo->head_dim ||
	    geo->num_heads % geo->num_kv_heads || geo->cache_dtype >= PKV_DTYPE_COUNT)
		return -EINVAL;
	r = calloc(1, sizeof *r);
	if (!r)
		return -ENOMEM;
	r->geo = *geo;
	r->capacity = capacity_tokens;
	r->tp = tp;
	out->ops = &ref_ops;
	out->ctx = r;
	out->name = "in-process";
	out->block_size = geo->block_size ? geo->block_size : 1;
	return 0;
}
