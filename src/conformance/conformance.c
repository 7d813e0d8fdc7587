/* SPDX-License-Identifier: MIT */
/* pkv-conformance: checks any backend .so against an f32 reference (DESIGN §3), printing TAP. */
/*
 * Usage: pkv-conformance PLUGIN.so [BACKEND_NAME]   (man pkv-conformance)
 *
 * Installed with pagedkv ($bindir). Plain C on purpose (no Check, no
 * liburing): it links only the loader sources, libdl, pthreads and libm, so
 * it also builds with cc alone:
 *   cc -O2 -Iinclude -Isrc src/conformance/conformance.c src/conformance/ref.c src/loader/host.c \
 *      src/loader/plugin.c src/loader/options.c src/loader/dispatch.c -ldl -lpthread -lm
 *
 * Every case builds a pool, fills cached tokens, runs one batch on each path
 * the backend offers and checks:
 * - output: max |out - ref| <= 2 * max |naive - ref| + floor, where ref is
 *   computed in double from the same rounded inputs and naive is a plain
 *   implementation rounding to the activation dtype at each stage, as
 *   PyTorch would (FlashAttention's test rule);
 * - every output element written (O is poisoned with NaN; strides have NaN
 *   gaps that must be neither read nor written);
 * - cache bytes after the append bit-exact, other layers untouched;
 * - for a backend with PKV_FEAT_LSE, the same batch again with softmax_lse
 *   set: O as above, softmax_lse against the reference's log-sum-exp
 *   (-inf exactly for a row that sees no key), and one decode row's keys
 *   split over two calls (the daemon's scheme) merged by it.
 *
 * Environment: PKV_CONFORMANCE_FULL=1 runs the exhaustive matrix;
 * PKV_CONFORMANCE_SWEEP="VAR=a,b,c" reloads the plugin once per value of VAR
 * (e.g. PKV_CPU_ISA=generic,avx2,avx512 to cover every kernel variant);
 * PKV_CONFORMANCE_THREADS (default 2) sizes the host thread pool;
 * PKV_CONFORMANCE_VERBOSE=1 prints each case's errors;
 * PKV_CONFORMANCE_FILL_VIA_BACKEND=1 fills even a host cache through the
 * backend's own attend calls, as for a device domain;
 * PKV_CONFORMANCE_MAX_CASES=N stops after N cases that ran, taken spread
 * over the matrix (slow, emulated backends); PKV_CONFORMANCE_OPTIONS="k=v,..." passes options to
 * the backend's init (pagedkvd's backend_option without the NAME. prefix).
 *
 * Exit: 0 every check passed; 1 a check failed or the run stopped with
 * "Bail out!" (a plugin that does not load or whose init fails); 2 usage;
 * 77 the plugin's init reports no device (-ENODEV) before any test ran:
 * nothing is printed on stdout then (the reason goes to stderr), so the
 * TAP wrapper reports the run as SKIP (DESIGN §7).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance/ref.h"
#include "loader/loader.h"

#define MAX_SEQS 16

struct seqdef {
	int cached;      /* keys already in the cache */
	int sq;          /* new queries */
	int sk;          /* keys in all; 0 = cached + sq, -1 = none; < sq allowed (q longer than k) */
	int share_with;  /* 1-based index of a sequence whose first blocks this one reuses; 0 = none */
	int shared_blocks;
	int share_from;  /* the reused blocks are [share_from, shared_blocks); those before are its own */
};

struct casedef {
	char name[160];
	int nh, nkv, hd, bs, cdt, adt;
	int nseq;
	struct seqdef seq[MAX_SEQS];
	int window;      /* -1: none */
	float softcap;
	int copy;        /* also test copy_blocks */
	int split_at;    /* > 0: one decode row, its keys split here (block-aligned) and merged (check_merge) */
};

static struct pkv_host *host;
static struct pkv_plugin plug;
static int test_no, failures, verbose;
static int ran_paths; /* (case, path) pairs not skipped: what PKV_CONFORMANCE_MAX_CASES counts */
/* PKV_CONFORMANCE_FILL_VIA_BACKEND=1: fill a host cache the way a device one is filled. */
static int fill_via_backend;
static const char *sweep_label = "";
static uint64_t rng_state;

static const char *dt_name[] = { "f32", "f16", "bf16" };

static void tap(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tap(int ok, const char *fmt, ...)
{
	va_list ap;

	printf("%s %d - %s", ok ? "ok" : "not ok", ++test_no, sweep_label);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	if (!ok)
		failures++;
}

static void skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void skip(const char *fmt, ...)
{
	va_list ap;

	printf("ok %d - %s", ++test_no, sweep_label);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" # SKIP\n");
	fflush(stdout);
}

static double urand(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (double)(rng_state >> 11) * 0x1p-53 * 2.0 - 1.0;
}

/* ---- dtype conversions, written independently of any backend ---- */

static uint32_t fbits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float bitsf(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static uint16_t to_bf16(float f)
{
	uint32_t u = fbits(f);

	if (isnan(f))
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static float from_bf16(uint16_t h)
{
	return bitsf((uint32_t)h << 16);
}

/* f16 by explicit rounding of the scaled value: independent of bit tricks. */
static uint16_t to_f16(float f)
{
	uint16_t sign = signbit(f) ? 0x8000 : 0;
	double a = fabs((double)f), m;
	int e;

	if (isnan(f))
		return 0x7e00 | sign;
	if (a >= 65520.0)
		return 0x7c00 | sign;
	if (a < 0x1p-14) {
		/* subnormal: units of 2^-24, nearbyint rounds half to even */
		return sign | (uint16_t)nearbyint(a * 0x1p24);
	}
	m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
	{
		double q = nearbyint(m * 2048.0); /* 11 significant bits */
		if (q == 2048.0) {
			q = 1024.0;
			e++;
		}
		if (e - 1 + 15 >= 31)
			return 0x7c00 | sign;
		return sign | (uint16_t)(((e - 1 + 15) << 10) | ((uint32_t)q - 1024));
	}
}

static float from_f16(uint16_t h)
{
	int e = (h >> 10) & 0x1f, m = h & 0x3ff;
	double v;

	if (e == 31)
		return m ? NAN : ((h & 0x8000) ? -INFINITY : INFINITY);
	v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
	return (float)((h & 0x8000) ? -v : v);
}

/* Rounds f to dtype and back. */
static float rnd(float f, int dt)
{
	return dt == PKV_DTYPE_F32 ? f : dt == PKV_DTYPE_F16 ? from_f16(to_f16(f)) : from_bf16(to_bf16(f));
}

static void put(void *base, int dt, size_t i, float v)
{
	if (dt == PKV_DTYPE_F32)
		((float *)base)[i] = v;
	else if (dt == PKV_DTYPE_F16)
		((uint16_t *)base)[i] = to_f16(v);
	else
		((uint16_t *)base)[i] = to_bf16(v);
}

static float get(const void *base, int dt, size_t i)
{
	if (dt == PKV_DTYPE_F32)
		return ((const float *)base)[i];
	if (dt == PKV_DTYPE_F16)
		return from_f16(((const uint16_t *)base)[i]);
	return from_bf16(((const uint16_t *)base)[i]);
}

static void put_nan(void *base, int dt, size_t i)
{
	if (dt == PKV_DTYPE_F32)
		((float *)base)[i] = NAN;
	else
		((uint16_t *)base)[i] = dt == PKV_DTYPE_F16 ? 0x7e00 : 0x7fc0;
}

/* ---- one case ---- */

struct run {
	const struct casedef *c;
	struct pkv_cache_mem mem;
	int layer, nlayers, G, max_blocks, num_blocks;
	int sq[MAX_SEQS], sk[MAX_SEQS], cached[MAX_SEQS];
	int32_t *bt, cuq[MAX_SEQS + 1], cuk[MAX_SEQS + 1], cache_seqlens[MAX_SEQS];
	int64_t *slots;
	int total_q;
	/* Expected cache contents of the tested layer, as f32, per slot: [slot][nkv][hd]. */
	float *ek, *ev;
	unsigned char *written; /* slot holds data */
	/* Activations with NaN-filled gaps: strides are hd + 8 per head. */
	void *q, *kn, *vn, *o;
	int64_t qs_tok, qs_head, kvs_tok, kvs_head, os_tok, os_head;
};

static size_t esz(int dt)
{
	return pkv_dtype_size((uint32_t)dt);
}

static int slot_of(const struct run *r, int s, int pos)
{
	return r->bt[s * r->max_blocks + pos / r->c->bs] * r->c->bs + pos % r->c->bs;
}

/* Reads bytes of the cache, through cache_read for a device domain. */
static int cache_bytes(const struct run *r, int kv, size_t off, void *dst, size_t len)
{
	const struct pkv_backend *be = plug.be;

	if (r->mem.domain == PKV_DOMAIN_HOST) {
		memcpy(dst, (const char *)(kv ? r->mem.v_base : r->mem.k_base) + off, len);
		return 0;
	}
	if (!PKV_ABI_HAS(be, struct pkv_backend, cache_read) || !be->cache_read)
		return -ENOTSUP;
	return be->cache_read(plug.ctx, &r->mem, (uint32_t)kv, off, dst, len);
}

static size_t slot_off(const struct run *r, int layer, int slot)
{
	return (size_t)layer * r->mem.layer_stride + (size_t)(slot / r->c->bs) * r->mem.block_stride +
	       (size_t)(slot % r->c->bs) * r->mem.token_stride;
}

static void batch_init(struct run *r, struct pkv_attn_batch *b)
{
	memset(b, 0, sizeof(*b));
	b->abi_version = PKV_BACKEND_ABI_VERSION;
	b->struct_size = sizeof(*b);
	b->layer = (uint32_t)r->layer;
	b->act_dtype = (uint32_t)r->c->adt;
	b->q_stride_tok = r->qs_tok;
	b->q_stride_head = r->qs_head;
	b->kv_stride_tok = r->kvs_tok;
	b->kv_stride_head = r->kvs_head;
	b->o_stride_tok = r->os_tok;
	b->o_stride_head = r->os_head;
	b->max_blocks_per_seq = (uint32_t)r->max_blocks;
	b->window_left = r->c->window;
	b->softcap = r->c->softcap;
}

/* Device domain with a varlen path: every cached token appended by one prefill-shaped call. */
static int fill_cache_varlen(struct run *r)
{
	const struct casedef *c = r->c;
	size_t row = (size_t)c->nkv * c->hd;
	int total = 0, s, p, i, ret = -ENOMEM;
	int32_t cuq[MAX_SEQS + 1], csl[MAX_SEQS];
	struct pkv_attn_batch b;
	int64_t *sl;
	void *qa, *oa, *ka, *va;

	for (s = 0; s < c->nseq; s++)
		total += r->cached[s];
	if (total == 0)
		return 0;
	sl = calloc(total, sizeof(*sl));
	qa = calloc((size_t)total * c->nh * c->hd, 4);
	oa = calloc((size_t)total * c->nh * c->hd, 4);
	ka = calloc((size_t)total * row, 4);
	va = calloc((size_t)total * row, 4);
	if (!sl || !qa || !oa || !ka || !va)
		goto out;
	cuq[0] = 0;
	for (s = 0, i = 0; s < c->nseq; s++) {
		for (p = 0; p < r->cached[s]; p++, i++) {
			int slot = slot_of(r, s, p);
			size_t e;

			sl[i] = r->written[slot] ? -1 : slot;
			if (r->written[slot])
				continue;
			r->written[slot] = 1;
			for (e = 0; e < row; e++) {
				float kv = rnd((float)urand(), c->adt), vv = rnd((float)urand(), c->adt);

				put(ka, c->adt, (size_t)i * row + e, kv);
				put(va, c->adt, (size_t)i * row + e, vv);
				r->ek[(size_t)slot * row + e] = rnd(kv, c->cdt);
				r->ev[(size_t)slot * row + e] = rnd(vv, c->cdt);
			}
		}
		cuq[s + 1] = i;
		csl[s] = 0;
	}
	batch_init(r, &b);
	b.q_stride_tok = (int64_t)c->nh * c->hd;
	b.q_stride_head = c->hd;
	b.o_stride_tok = b.q_stride_tok;
	b.o_stride_head = c->hd;
	b.kv_stride_tok = (int64_t)row;
	b.kv_stride_head = c->hd;
	b.window_left = -1;
	b.softcap = 0;
	b.num_seqs = (uint32_t)c->nseq;
	b.total_q = (uint32_t)total;
	b.q = qa;
	b.o = oa;
	b.k_new = ka;
	b.v_new = va;
	b.cu_seq_lens_q = cuq;
	b.cu_seq_lens_k = cuq; /* sk == sq: the prompt itself */
	for (s = 0; s < c->nseq; s++) {
		b.max_length_q = (uint32_t)r->cached[s] > b.max_length_q ? (uint32_t)r->cached[s] : b.max_length_q;
		b.max_length_k = b.max_length_q;
	}
	b.block_tables = r->bt;
	b.cache_seqlens = csl;
	b.slot_mapping = sl;
	ret = plug.be->attend_varlen(plug.ctx, &r->mem, &b);
	if (!ret && plug.be->sync)
		ret = plug.be->sync(plug.ctx);
out:
	free(sl);
	free(qa);
	free(oa);
	free(ka);
	free(va);
	return ret;
}

/*
 * Puts the cached tokens in place. Host domain: written straight into memory
 * in the cache dtype. Device domain: appended through the backend (one
 * varlen call, or one decode step per position for a decode-only backend),
 * from activation-dtype values.
 */
static int fill_cache(struct run *r)
{
	const struct casedef *c = r->c;
	size_t row = (size_t)c->nkv * c->hd;
	int s, p, h, d;

	if (r->mem.domain == PKV_DOMAIN_HOST && !fill_via_backend) {
		for (s = 0; s < c->nseq; s++)
			for (p = 0; p < r->cached[s]; p++) {
				int slot = slot_of(r, s, p);

				if (r->written[slot])
					continue;
				r->written[slot] = 1;
				for (h = 0; h < c->nkv; h++)
					for (d = 0; d < c->hd; d++) {
						size_t i = (size_t)slot * row + (size_t)h * c->hd + d;
						float kv = rnd((float)urand(), c->cdt), vv = rnd((float)urand(), c->cdt);
						size_t off = slot_off(r, r->layer, slot) + ((size_t)h * c->hd + d) * esz(c->cdt);

						r->ek[i] = kv;
						r->ev[i] = vv;
						put((char *)r->mem.k_base + off, c->cdt, 0, kv);
						put((char *)r->mem.v_base + off, c->cdt, 0, vv);
					}
			}
		return 0;
	}
	if (plug.be->caps->paths & PKV_PATH_VARLEN)
		return fill_cache_varlen(r);
	/* Decode-only device backend: one decode step per position, each new slot once. */
	{
		int maxc = 0, ret = 0;
		size_t n = (size_t)c->nseq * row;
		float *kb = calloc(n, sizeof(float)), *vb = calloc(n, sizeof(float));
		void *qa = calloc((size_t)c->nseq * c->nh * c->hd, 4), *oa = calloc((size_t)c->nseq * c->nh * c->hd, 4);
		void *ka = calloc(n, 4), *va = calloc(n, 4);
		int64_t sl[MAX_SEQS];
		int32_t cuq[MAX_SEQS + 1], cuk[MAX_SEQS + 1], csl[MAX_SEQS], bt2[MAX_SEQS * 64];

		if (!kb || !vb || !qa || !oa || !ka || !va)
			ret = -ENOMEM;
		for (s = 0; s < c->nseq; s++)
			maxc = r->cached[s] > maxc ? r->cached[s] : maxc;
		for (p = 0; p < maxc && !ret; p++) {
			struct pkv_attn_batch b;
			int ns = 0, i;

			batch_init(r, &b);
			b.q_stride_tok = (int64_t)c->nh * c->hd;
			b.q_stride_head = c->hd;
			b.o_stride_tok = b.q_stride_tok;
			b.o_stride_head = c->hd;
			b.kv_stride_tok = (int64_t)row;
			b.kv_stride_head = c->hd;
			b.window_left = -1;
			b.softcap = 0;
			cuq[0] = cuk[0] = 0;
			for (s = 0; s < c->nseq; s++) {
				int slot;

				if (p >= r->cached[s])
					continue;
				slot = slot_of(r, s, p);
				sl[ns] = r->written[slot] ? -1 : slot;
				if (!r->written[slot]) {
					r->written[slot] = 1;
					for (i = 0; i < (int)row; i++) {
						float kv = rnd((float)urand(), c->adt), vv = rnd((float)urand(), c->adt);

						put(ka, c->adt, (size_t)ns * row + i, kv);
						put(va, c->adt, (size_t)ns * row + i, vv);
						r->ek[(size_t)slot * row + i] = rnd(kv, c->cdt);
						r->ev[(size_t)slot * row + i] = rnd(vv, c->cdt);
					}
				}
				memcpy(bt2 + ns * r->max_blocks, r->bt + s * r->max_blocks, r->max_blocks * sizeof(int32_t));
				cuq[ns + 1] = ns + 1;
				cuk[ns + 1] = cuk[ns] + p + 1;
				csl[ns] = p;
				ns++;
			}
			b.num_seqs = (uint32_t)ns;
			b.total_q = (uint32_t)ns;
			b.q = qa;
			b.o = oa;
			b.k_new = ka;
			b.v_new = va;
			b.cu_seq_lens_q = cuq;
			b.cu_seq_lens_k = cuk;
			b.max_length_q = 1;
			b.max_length_k = (uint32_t)p + 1;
			b.block_tables = bt2;
			b.cache_seqlens = csl;
			b.slot_mapping = sl;
			ret = (plug.be->caps->paths & PKV_PATH_DECODE) ? plug.be->attend_decode(plug.ctx, &r->mem, &b) :
								       plug.be->attend_varlen(plug.ctx, &r->mem, &b);
		}
		if (!ret && plug.be->sync)
			ret = plug.be->sync(plug.ctx);
		free(kb);
		free(vb);
		free(qa);
		free(oa);
		free(ka);
		free(va);
		return ret;
	}
}

/* Keys lo.. of one sequence and KV head, as the shared reference reads them (expected cache contents). */
struct ref_keys {
	const struct run *r;
	int s, kvh, lo;
};

static double ref_key(const void *p, uint32_t j, uint32_t x)
{
	const struct ref_keys *k = p;
	size_t row = (size_t)k->r->c->nkv * k->r->c->hd;

	return k->r->ek[(size_t)slot_of(k->r, k->s, k->lo + (int)j) * row + (size_t)k->kvh * k->r->c->hd + x];
}

static double ref_value(const void *p, uint32_t j, uint32_t x)
{
	const struct ref_keys *k = p;
	size_t row = (size_t)k->r->c->nkv * k->r->c->hd;

	return k->r->ev[(size_t)slot_of(k->r, k->s, k->lo + (int)j) * row + (size_t)k->kvh * k->r->c->hd + x];
}

/*
 * Reference (double, src/conformance/ref.c) and naive (rounding to the
 * activation dtype at each stage, as PyTorch would) outputs for every row,
 * and their log-sum-exps ([total_q][nh], -inf for a row that sees no key).
 */
static void reference(const struct run *r, double *ref, float *naive, double *ref_lse, float *naive_lse)
{
	const struct casedef *c = r->c;
	size_t row = (size_t)c->nkv * c->hd;
	double scale = 1.0 / sqrt((double)c->hd);
	float scalef = 1.0f / sqrtf((float)c->hd);
	float *sf = malloc(sizeof(float) * 65536);
	double *qd = malloc(sizeof(double) * (size_t)c->hd);
	int s, i, h, j, d;

	for (s = 0; s < c->nseq; s++)
		for (i = 0; i < r->sq[s]; i++)
			for (h = 0; h < c->nh; h++) {
				int kvh = h / r->G, hi = i + r->sk[s] - r->sq[s], lo = c->window >= 0 ? hi - c->window : 0;
				size_t qi = (size_t)(r->cuq[s] + i) * r->qs_tok + (size_t)h * r->qs_head;
				size_t li = (size_t)(r->cuq[s] + i) * c->nh + h, oi = li * c->hd;
				struct ref_keys keys = { r, s, kvh, 0 };
				double mf = -INFINITY;
				float lf = 0;
				int n = 0;

				if (lo < 0)
					lo = 0;
				if (hi > r->sk[s] - 1)
					hi = r->sk[s] - 1;
				keys.lo = lo;
				for (d = 0; d < c->hd; d++) {
					qd[d] = get(r->q, c->adt, qi + d);
					naive[oi + d] = 0;
				}
				pkv_ref_attend_row_lse(qd, (uint32_t)c->hd, hi >= lo ? (uint32_t)(hi - lo + 1) : 0, ref_key,
						       ref_value, &keys, scale, c->softcap, ref + oi, ref_lse + li);
				naive_lse[li] = -INFINITY;
				if (hi < lo)
					continue;
				for (j = lo; j <= hi; j++, n++) {
					const float *k = r->ek + (size_t)slot_of(r, s, j) * row + (size_t)kvh * c->hd;
					float dotf = 0;

					for (d = 0; d < c->hd; d++)
						dotf += (float)qd[d] * k[d];
					dotf = rnd(rnd(dotf, c->adt) * scalef, c->adt);
					if (c->softcap > 0)
						dotf = rnd(c->softcap * tanhf(dotf / c->softcap), c->adt);
					sf[n] = dotf;
					mf = dotf > mf ? dotf : mf;
				}
				for (j = 0; j < n; j++)
					lf += expf(sf[j] - (float)mf);
				naive_lse[li] = (float)mf + logf(lf);
				for (j = lo; j <= hi; j++) {
					const float *v = r->ev + (size_t)slot_of(r, s, j) * row + (size_t)kvh * c->hd;
					float pf = rnd(expf(sf[j - lo] - (float)mf) / lf, c->adt);

					for (d = 0; d < c->hd; d++)
						naive[oi + d] += pf * v[d];
				}
				for (d = 0; d < c->hd; d++)
					naive[oi + d] = rnd(naive[oi + d], c->adt);
			}
	free(sf);
	free(qd);
}

static double floor_of(int adt)
{
	return adt == PKV_DTYPE_F32 ? 1e-5 : adt == PKV_DTYPE_F16 ? 1e-4 : 5e-4;
}

/* Checks O against the reference; returns 1 on pass. */
static int check_output(const struct run *r, const double *ref, const float *naive, const char *path)
{
	const struct casedef *c = r->c;
	double err = 0, nerr = 0, tol;
	int s, i, h, d, unwritten = 0, gap_written = 0;

	for (s = 0; s < c->nseq; s++)
		for (i = 0; i < r->sq[s]; i++)
			for (h = 0; h < c->nh; h++) {
				size_t oi = ((size_t)(r->cuq[s] + i) * c->nh + h) * c->hd;
				size_t bi = (size_t)(r->cuq[s] + i) * r->os_tok + (size_t)h * r->os_head;

				for (d = 0; d < c->hd; d++) {
					float v = get(r->o, c->adt, bi + d);
					double e = fabs((double)v - ref[oi + d]);

					if (isnan(v) || isinf(v))
						unwritten++;
					else if (e > err)
						err = e;
					e = fabs((double)naive[oi + d] - ref[oi + d]);
					nerr = e > nerr ? e : nerr;
				}
				for (d = c->hd; d < r->os_head; d++)
					if (!isnan(get(r->o, c->adt, bi + d)))
						gap_written++;
			}
	tol = 2 * nerr + floor_of(c->adt);
	tap(!unwritten && !gap_written && err <= tol, "%s %s: max_err %.3g <= tol %.3g (naive %.3g)%s%s", path,
	    c->name, err, tol, nerr, unwritten ? ", UNWRITTEN or non-finite outputs" : "",
	    gap_written ? ", wrote into stride gaps" : "");
	return !unwritten && !gap_written && err <= tol;
}

/* Cache bytes of every appended slot equal the exact conversion; other layers stay zero. */
static void check_cache(const struct run *r, const char *path)
{
	const struct casedef *c = r->c;
	size_t rowb = (size_t)c->nkv * c->hd * esz(c->cdt), row = (size_t)c->nkv * c->hd;
	unsigned char *got = malloc(rowb), *want = malloc(rowb), *zero = calloc(1, rowb);
	int i, kv, bad = 0, other = 0;

	for (i = 0; i < r->total_q && !bad; i++) {
		int64_t slot = r->slots[i];

		if (slot < 0)
			continue;
		for (kv = 0; kv < 2 && !bad; kv++) {
			size_t e;

			for (e = 0; e < row; e++)
				put(want, c->cdt, e, (kv ? r->ev : r->ek)[(size_t)slot * row + e]);
			if (cache_bytes(r, kv, slot_off(r, r->layer, (int)slot), got, rowb)) {
				skip("%s %s: cache bytes (backend has no cache_read)", path, c->name);
				goto out;
			}
			if (memcmp(got, want, rowb))
				bad = 1;
			if (cache_bytes(r, kv, slot_off(r, 1 - r->layer, (int)slot), got, rowb) == 0 &&
			    memcmp(got, zero, rowb))
				other = 1;
		}
	}
	tap(!bad && !other, "%s %s: appended K/V bit-exact in the cache%s%s", path, c->name,
	    bad ? ", MISMATCH" : "", other ? ", another layer was written" : "");
out:
	free(got);
	free(want);
	free(zero);
}

/*
 * PKV_FEAT_COPY_VIEW: a copy through a view of layers [1, nlayers) changes
 * those layers of cp->dst to cp->src's and leaves its layer 0 as it was.
 * a and b are scratch of one block each.
 */
static void check_copy_view(struct run *r, const struct pkv_block_copy *cp, unsigned char *a, unsigned char *b)
{
	const struct casedef *c = r->c;
	size_t bb = r->mem.block_stride, ls = r->mem.layer_stride;
	unsigned char *before = malloc(2 * bb);
	struct pkv_cache_mem view = r->mem;
	int ok = 1, layer, kv, ret;

	if (!before || cache_bytes(r, 0, (size_t)cp->dst * bb, before, bb) ||
	    cache_bytes(r, 1, (size_t)cp->dst * bb, before + bb, bb)) {
		skip("copy_blocks %s: view: cannot read the cache", c->name);
		free(before);
		return;
	}
	view.geo.num_layers = (uint32_t)r->nlayers - 1;
	view.k_base = (char *)r->mem.k_base + ls;
	view.v_base = (char *)r->mem.v_base + ls;
	ret = plug.be->copy_blocks(plug.ctx, &view, cp, 1);
	if (!ret && plug.be->sync)
		ret = plug.be->sync(plug.ctx);
	for (layer = 0; layer < r->nlayers && !ret; layer++)
		for (kv = 0; kv < 2; kv++) {
			if (cache_bytes(r, kv, layer * ls + (size_t)cp->src * bb, a, bb) ||
			    cache_bytes(r, kv, layer * ls + (size_t)cp->dst * bb, b, bb))
				ok = 0;
			else if (layer ? memcmp(a, b, bb) != 0 : memcmp(before + (size_t)kv * bb, b, bb) != 0)
				ok = 0;
		}
	tap(!ret && ok, "copy_blocks %s: a view of layers 1..%d copies those and leaves layer 0 (ret %d)", c->name,
	    r->nlayers - 1, ret);
	free(before);
}

static void check_copy_blocks(struct run *r)
{
	const struct casedef *c = r->c;
	struct pkv_block_copy cp;
	size_t bb = r->mem.block_stride;
	unsigned char *a = malloc(bb), *b = malloc(bb);
	int ok = 1, layer, kv, ret;

	if (!plug.be->copy_blocks) {
		skip("copy_blocks %s: not offered", c->name);
		goto out;
	}
	cp.src = r->bt[0];
	cp.dst = r->num_blocks - 1; /* a spare block no table uses */
	if ((plug.be->caps->features & PKV_FEAT_COPY_VIEW) && r->nlayers > 1)
		check_copy_view(r, &cp, a, b);
	ret = plug.be->copy_blocks(plug.ctx, &r->mem, &cp, 1);
	if (!ret && plug.be->sync)
		ret = plug.be->sync(plug.ctx);
	for (layer = 0; layer < r->nlayers && !ret; layer++)
		for (kv = 0; kv < 2; kv++) {
			if (cache_bytes(r, kv, layer * r->mem.layer_stride + (size_t)cp.src * bb, a, bb) ||
			    cache_bytes(r, kv, layer * r->mem.layer_stride + (size_t)cp.dst * bb, b, bb)) {
				skip("copy_blocks %s: cannot read the cache", c->name);
				goto out;
			}
			if (memcmp(a, b, bb))
				ok = 0;
		}
	tap(!ret && ok, "copy_blocks %s: block %d -> %d copied in every layer (ret %d)", c->name, cp.src, cp.dst, ret);
out:
	free(a);
	free(b);
}

/* Whether the backend writes softmax_lse (the loader's copy of older caps reads features as 0). */
static int lse_offered(void)
{
	return (plug.be->caps->features & PKV_FEAT_LSE) != 0;
}

/* Runs b on the path's method and waits for it. */
static int attend(const struct run *r, uint32_t path, const struct pkv_attn_batch *b)
{
	int ret = path == PKV_PATH_DECODE ? plug.be->attend_decode(plug.ctx, &r->mem, b) :
					    plug.be->attend_varlen(plug.ctx, &r->mem, b);

	if (!ret && plug.be->sync)
		ret = plug.be->sync(plug.ctx);
	return ret;
}

/* |got - want| relative to the log-sum-exp's size, at least 1 (an lse near 0 has no relative scale). */
static double lse_err(double got, double want)
{
	return fabs(got - want) / (fabs(want) > 1 ? fabs(want) : 1);
}

/*
 * softmax_lse ([total_q + 1][nh], NaN-poisoned, the last row a guard) against
 * the reference: -inf exactly where a row sees no key, else within 2x the
 * naive implementation's relative error plus 1e-4. Returns 1 on pass.
 */
static int check_lse(const struct run *r, const float *lse, const double *ref_lse, const float *naive_lse,
		     const char *path)
{
	const struct casedef *c = r->c;
	double err = 0, nerr = 0, tol;
	int t, h, unwritten = 0, masked = 0, guard = 0, ok;

	for (t = 0; t < r->total_q; t++)
		for (h = 0; h < c->nh; h++) {
			size_t i = (size_t)t * c->nh + h;
			float v = lse[i];

			if (isnan(v)) {
				unwritten++;
			} else if (ref_lse[i] == -INFINITY) {
				masked += !(isinf(v) && v < 0);
			} else if (!isfinite(v)) {
				masked++;
			} else {
				err = lse_err(v, ref_lse[i]) > err ? lse_err(v, ref_lse[i]) : err;
				nerr = lse_err(naive_lse[i], ref_lse[i]) > nerr ? lse_err(naive_lse[i], ref_lse[i]) : nerr;
			}
		}
	for (h = 0; h < c->nh; h++)
		guard += !isnan(lse[(size_t)r->total_q * c->nh + h]);
	tol = 2 * nerr + 1e-4;
	ok = !unwritten && !masked && !guard && err <= tol;
	tap(ok, "%s %s: softmax_lse max_rel_err %.3g <= tol %.3g (naive %.3g)%s%s%s", path, c->name, err, tol, nerr,
	    unwritten ? ", UNWRITTEN rows" : "", masked ? ", -inf where keys are seen or not -inf where none is" : "",
	    guard ? ", wrote past total_q" : "");
	return ok;
}

/* The case's batch again with softmax_lse set: O as without it, and the log-sum-exps. */
static void check_with_lse(const struct run *r, struct pkv_attn_batch *b, uint32_t path, const char *pname,
			   const double *ref, const float *naive, const double *ref_lse, const float *naive_lse)
{
	const struct casedef *c = r->c;
	size_t n = (size_t)(r->total_q + 1) * c->nh, i;
	float *lse = malloc(n * sizeof(float));
	char label[64];
	int ret;

	if (!lse) {
		tap(0, "%s %s: out of memory", pname, c->name);
		return;
	}
	for (i = 0; i < n; i++)
		lse[i] = NAN;
	for (i = 0; i < (size_t)(r->total_q + 1) * r->os_tok; i++)
		put_nan(r->o, c->adt, i);
	b->softmax_lse = lse;
	ret = attend(r, path, b);
	b->softmax_lse = NULL;
	snprintf(label, sizeof(label), "%s with softmax_lse", pname);
	if (ret) {
		tap(0, "%s %s: attend returned %d", label, c->name, ret);
	} else {
		check_output(r, ref, naive, label);
		check_lse(r, lse, ref_lse, naive_lse, label);
	}
	free(lse);
}

/*
 * The daemon's split of one long decode row: keys [0, a) in a call that
 * appends nothing (sq 1, sk a, cache_seqlens a - 1, slot -1), keys [a, n)
 * in a second through the block table from block a / bs, which appends the
 * new token; merged by log-sum-exp (O = sum_i e^(lse_i - L) O_i, L = log
 * sum_i e^lse_i), O must pass as one call's does and L match its lse.
 */
static void check_merge(struct run *r, uint32_t path, const char *pname, const double *ref, const float *naive,
			const double *ref_lse, const float *naive_lse)
{
	const struct casedef *c = r->c;
	size_t on = (size_t)2 * r->os_tok, i;
	void *op[2] = { malloc(on * esz(c->adt)), malloc(on * esz(c->adt)) };
	float *lp[2] = { malloc(sizeof(float) * 2 * c->nh), malloc(sizeof(float) * 2 * c->nh) };
	float *merged = malloc(sizeof(float) * 2 * c->nh);
	int32_t *bt2 = malloc(sizeof(int32_t) * r->max_blocks);
	int a = c->split_at, n = r->sk[0], piece, h, d, ret = 0;
	char label[64], err[512];

	snprintf(label, sizeof(label), "%s, two calls merged", pname);
	if (!op[0] || !op[1] || !lp[0] || !lp[1] || !merged || !bt2) {
		tap(0, "%s %s: out of memory", label, c->name);
		goto out;
	}
	for (piece = 0; piece < 2 && !ret; piece++) {
		int lo = piece ? a : 0, nk = (piece ? n : a) - lo, skip_blocks = lo / c->bs, j;
		int32_t cuq[2] = { 0, 1 }, cuk[2] = { 0, nk }, csl[1] = { nk - 1 };
		int64_t slot[1] = { piece ? r->slots[0] : -1 };
		struct pkv_attn_batch b;

		for (j = 0; j < r->max_blocks - skip_blocks; j++)
			bt2[j] = r->bt[skip_blocks + j];
		for (i = 0; i < on; i++)
			put_nan(op[piece], c->adt, i);
		for (i = 0; i < (size_t)2 * c->nh; i++)
			lp[piece][i] = NAN;
		batch_init(r, &b);
		b.num_seqs = 1;
		b.total_q = 1;
		b.q = r->q;
		b.k_new = r->kn;
		b.v_new = r->vn;
		b.o = op[piece];
		b.cu_seq_lens_q = cuq;
		b.cu_seq_lens_k = cuk;
		b.max_length_q = 1;
		b.max_length_k = (uint32_t)nk;
		b.block_tables = bt2;
		b.max_blocks_per_seq = (uint32_t)(r->max_blocks - skip_blocks);
		b.cache_seqlens = csl;
		b.slot_mapping = slot;
		b.softmax_lse = lp[piece];
		if (pkv_attn_batch_check(&r->mem, &b, err, sizeof(err)) != PKV_PATH_DECODE) {
			tap(0, "%s %s: the suite built a bad piece: %s", label, c->name, err);
			ret = -EINVAL;
		} else if ((ret = attend(r, path, &b))) {
			tap(0, "%s %s: piece %d: attend returned %d", label, c->name, piece, ret);
		}
	}
	if (ret)
		goto out;
	for (i = 0; i < on; i++)
		put_nan(r->o, c->adt, i);
	for (h = 0; h < 2 * c->nh; h++)
		merged[h] = NAN; /* the second row stays a guard check_lse looks at */
	for (h = 0; h < c->nh; h++) {
		double l0 = lp[0][h], l1 = lp[1][h], m = l0 > l1 ? l0 : l1, L, w0, w1;
		size_t bi = (size_t)h * r->os_head;

		L = m + log(exp(l0 - m) + exp(l1 - m));
		w0 = exp(l0 - L);
		w1 = exp(l1 - L);
		merged[h] = (float)L;
		for (d = 0; d < c->hd; d++)
			put(r->o, c->adt, bi + d,
			    (float)(w0 * get(op[0], c->adt, bi + d) + w1 * get(op[1], c->adt, bi + d)));
	}
	check_output(r, ref, naive, label);
	check_lse(r, merged, ref_lse, naive_lse, label);
	check_cache(r, label);
out:
	free(op[0]);
	free(op[1]);
	free(lp[0]);
	free(lp[1]);
	free(merged);
	free(bt2);
}

/* Builds block tables (shuffled ids, -1 padding, shared prefixes) and the activations. */
static int setup_run(struct run *r, const struct casedef *c)
{
	int s, i, need = 0, *perm, next = 0, h, d;
	size_t row = (size_t)c->nkv * c->hd;

	memset(r, 0, sizeof(*r));
	r->c = c;
	r->nlayers = 2;
	r->layer = 1;
	r->G = c->nh / c->nkv;
	r->max_blocks = 0;
	for (s = 0; s < c->nseq; s++) {
		const struct seqdef *q = &c->seq[s];
		int total;

		r->sq[s] = q->sq;
		r->sk[s] = q->sk < 0 ? 0 : q->sk ? q->sk : q->cached + q->sq;
		r->cached[s] = q->cached;
		total = q->cached + q->sq > r->sk[s] ? q->cached + q->sq : r->sk[s];
		i = (total + c->bs - 1) / c->bs + 2; /* two -1 entries of padding */
		r->max_blocks = i > r->max_blocks ? i : r->max_blocks;
		need += i;
	}
	r->num_blocks = need + 3;
	r->bt = malloc(sizeof(int32_t) * c->nseq * r->max_blocks);
	perm = malloc(sizeof(int) * r->num_blocks);
	for (i = 0; i < r->num_blocks - 1; i++)
		perm[i] = i;
	/* Shuffle so block ids are not in table order; the last block stays spare for copy_blocks. */
	for (i = r->num_blocks - 2; i > 0; i--) {
		int j = (int)((urand() + 1) * 0.5 * (i + 1)) % (i + 1), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	for (s = 0; s < c->nseq; s++) {
		const struct seqdef *q = &c->seq[s];
		int total = q->cached + q->sq > r->sk[s] ? q->cached + q->sq : r->sk[s];
		int nb = (total + c->bs - 1) / c->bs;

		for (i = 0; i < r->max_blocks; i++)
			r->bt[s * r->max_blocks + i] = -1;
		for (i = 0; i < nb; i++)
			r->bt[s * r->max_blocks + i] = (q->share_with && i >= q->share_from && i < q->shared_blocks) ?
				r->bt[(q->share_with - 1) * r->max_blocks + i] : perm[next++];
	}
	free(perm);

	r->cuq[0] = r->cuk[0] = 0;
	for (s = 0; s < c->nseq; s++) {
		r->cuq[s + 1] = r->cuq[s] + r->sq[s];
		r->cuk[s + 1] = r->cuk[s] + r->sk[s];
		r->cache_seqlens[s] = r->cached[s];
	}
	r->total_q = r->cuq[c->nseq];
	r->qs_head = c->hd + 8;
	r->qs_tok = (int64_t)c->nh * r->qs_head;
	r->kvs_head = c->hd + 8;
	r->kvs_tok = (int64_t)c->nkv * r->kvs_head;
	r->os_head = c->hd + 8;
	r->os_tok = (int64_t)c->nh * r->os_head;
	r->slots = malloc(sizeof(int64_t) * (r->total_q + 1));
	r->ek = calloc((size_t)r->num_blocks * c->bs * row, sizeof(float));
	r->ev = calloc((size_t)r->num_blocks * c->bs * row, sizeof(float));
	r->written = calloc((size_t)r->num_blocks * c->bs, 1);
	r->q = malloc((size_t)(r->total_q + 1) * r->qs_tok * esz(c->adt));
	r->kn = malloc((size_t)(r->total_q + 1) * r->kvs_tok * esz(c->adt));
	r->vn = malloc((size_t)(r->total_q + 1) * r->kvs_tok * esz(c->adt));
	r->o = malloc((size_t)(r->total_q + 1) * r->os_tok * esz(c->adt));
	if (!r->bt || !r->slots || !r->ek || !r->ev || !r->written || !r->q || !r->kn || !r->vn || !r->o)
		return -ENOMEM;
	for (i = 0; i < (r->total_q + 1) * r->qs_tok; i++)
		put_nan(r->q, c->adt, (size_t)i);
	for (i = 0; i < (r->total_q + 1) * r->kvs_tok; i++) {
		put_nan(r->kn, c->adt, (size_t)i);
		put_nan(r->vn, c->adt, (size_t)i);
	}
	for (s = 0; s < c->nseq; s++)
		for (i = 0; i < r->sq[s]; i++) {
			int t = r->cuq[s] + i, pos = r->cached[s] + i;

			/* q longer than k: the extra rows append nothing (slot -1). */
			r->slots[t] = pos < r->sk[s] ? slot_of(r, s, pos) : -1;
			for (h = 0; h < c->nh; h++)
				for (d = 0; d < c->hd; d++)
					put(r->q, c->adt, (size_t)t * r->qs_tok + (size_t)h * r->qs_head + d,
					    (float)(2.5 * urand()));
			for (h = 0; h < c->nkv; h++)
				for (d = 0; d < c->hd; d++) {
					size_t ai = (size_t)t * r->kvs_tok + (size_t)h * r->kvs_head + d;

					put(r->kn, c->adt, ai, (float)urand());
					put(r->vn, c->adt, ai, (float)urand());
				}
		}
	return 0;
}

static void free_run(struct run *r)
{
	free(r->bt);
	free(r->slots);
	free(r->ek);
	free(r->ev);
	free(r->written);
	free(r->q);
	free(r->kn);
	free(r->vn);
	free(r->o);
}

/* Runs one case on each path the backend serves for it. */
static void run_case(const struct casedef *c)
{
	struct pkv_pool_desc pool = { PKV_BACKEND_ABI_VERSION, sizeof(pool),
				      { 2, (uint32_t)c->nh, (uint32_t)c->nkv, (uint32_t)c->hd, (uint32_t)c->cdt,
					(uint32_t)c->bs, 0 }, (uint32_t)c->adt };
	size_t row = (size_t)c->nkv * c->hd;
	struct run r;
	char why[256];
	struct pkv_attn_batch b;
	double *ref = NULL, *ref_lse = NULL;
	float *naive = NULL, *naive_lse = NULL;
	int path_i, s, i, is_decode = 1, ret, ran = 0;
	char err[512];

	rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)(c->nh * 131 + c->hd * 7 + c->bs * 3 + c->cdt * 5 + c->adt);
	if (setup_run(&r, c)) {
		tap(0, "%s: out of memory", c->name);
		goto out_free;
	}
	pool.geo.num_blocks = (uint32_t)r.num_blocks;
	for (s = 0; s < c->nseq; s++)
		if (r.sq[s] != 1 || r.sk[s] != r.cached[s] + 1)
			is_decode = 0;
	for (path_i = 0; path_i < 2; path_i++) {
		uint32_t path = path_i ? PKV_PATH_DECODE : PKV_PATH_VARLEN;
		const char *pname = path_i ? "decode" : "varlen";

		if (path == PKV_PATH_DECODE && !is_decode)
			continue;
		if (pkv_plugin_check_pool(&plug, &pool, path, err, sizeof(err))) {
			skip("%s %s: %s", pname, c->name, err);
			continue;
		}
		if (c->window >= 0 && !(plug.be->caps->features & PKV_FEAT_WINDOW)) {
			skip("%s %s: no sliding window", pname, c->name);
			continue;
		}
		if (c->softcap > 0 && !(plug.be->caps->features & PKV_FEAT_SOFTCAP)) {
			skip("%s %s: no soft-cap", pname, c->name);
			continue;
		}
		if (!plug.be->cache_alloc) {
			skip("%s %s: backend cannot allocate a cache", pname, c->name);
			continue;
		}
		if (c->split_at && !lse_offered()) {
			skip("%s %s: no softmax_lse (PKV_FEAT_LSE) to merge split keys by", pname, c->name);
			continue;
		}
		ran_paths++;
		/* A fresh cache per path, so each path's append is checked on its own. */
		memset(&r.mem, 0, sizeof(r.mem));
		r.mem.abi_version = PKV_BACKEND_ABI_VERSION;
		r.mem.struct_size = sizeof(r.mem);
		ret = plug.be->cache_alloc(plug.ctx, &pool, &r.mem);
		if (ret) {
			tap(0, "%s %s: cache_alloc failed: %d", pname, c->name, ret);
			continue;
		}
		if (pkv_cache_mem_check(&pool, plug.be->caps->domain, &r.mem, why, sizeof(why))) {
			tap(0, "%s %s: %s", pname, c->name, why);
			plug.be->cache_free(plug.ctx, &r.mem);
			continue;
		}
		memset(r.written, 0, (size_t)r.num_blocks * c->bs);
		rng_state ^= 0x1234567ull * (path_i + 1);
		ret = fill_cache(&r);
		if (ret) {
			tap(0, "%s %s: filling the cache failed: %d", pname, c->name, ret);
			plug.be->cache_free(plug.ctx, &r.mem);
			continue;
		}
		/* Expected cache contents after the append, and the reference over them. */
		for (i = 0; i < r.total_q; i++) {
			int h, d;

			if (r.slots[i] < 0)
				continue;
			for (h = 0; h < c->nkv; h++)
				for (d = 0; d < c->hd; d++) {
					size_t ai = (size_t)i * r.kvs_tok + (size_t)h * r.kvs_head + d;
					size_t ei = (size_t)r.slots[i] * row + (size_t)h * c->hd + d;

					r.ek[ei] = rnd(get(r.kn, c->adt, ai), c->cdt);
					r.ev[ei] = rnd(get(r.vn, c->adt, ai), c->cdt);
				}
		}
		/* Per path: each fills its own cache with its own cached tokens. */
		if (!ref) {
			ref = calloc((size_t)(r.total_q + 1) * c->nh * c->hd, sizeof(double));
			naive = calloc((size_t)(r.total_q + 1) * c->nh * c->hd, sizeof(float));
			ref_lse = calloc((size_t)(r.total_q + 1) * c->nh, sizeof(double));
			naive_lse = calloc((size_t)(r.total_q + 1) * c->nh, sizeof(float));
		}
		if (!ref || !naive || !ref_lse || !naive_lse) {
			tap(0, "%s %s: out of memory", pname, c->name);
			plug.be->cache_free(plug.ctx, &r.mem);
			break;
		}
		reference(&r, ref, naive, ref_lse, naive_lse);
		if (c->split_at) {
			check_merge(&r, path, pname, ref, naive, ref_lse, naive_lse);
			plug.be->cache_free(plug.ctx, &r.mem);
			continue;
		}
		for (i = 0; i < (r.total_q + 1) * r.os_tok; i++)
			put_nan(r.o, c->adt, (size_t)i);
		batch_init(&r, &b);
		b.num_seqs = (uint32_t)c->nseq;
		b.total_q = (uint32_t)r.total_q;
		b.q = r.q;
		b.k_new = r.kn;
		b.v_new = r.vn;
		b.o = r.o;
		b.cu_seq_lens_q = r.cuq;
		b.cu_seq_lens_k = r.cuk;
		for (s = 0; s < c->nseq; s++) {
			b.max_length_q = (uint32_t)r.sq[s] > b.max_length_q ? (uint32_t)r.sq[s] : b.max_length_q;
			b.max_length_k = (uint32_t)r.sk[s] > b.max_length_k ? (uint32_t)r.sk[s] : b.max_length_k;
		}
		b.block_tables = r.bt;
		b.cache_seqlens = r.cache_seqlens;
		b.slot_mapping = r.slots;
		ret = pkv_attn_batch_check(&r.mem, &b, err, sizeof(err));
		if (ret < 0) {
			tap(0, "%s %s: the suite built a bad batch: %s", pname, c->name, err);
		} else {
			ret = attend(&r, path, &b);
			if (ret) {
				tap(0, "%s %s: attend returned %d", pname, c->name, ret);
			} else {
				check_output(&r, ref, naive, pname);
				check_cache(&r, pname);
				if (c->copy && !ran)
					check_copy_blocks(&r);
				ran = 1;
				/* Once more asking for softmax_lse: the append writes the same bytes again. */
				if (lse_offered())
					check_with_lse(&r, &b, path, pname, ref, naive, ref_lse, naive_lse);
			}
		}
		plug.be->cache_free(plug.ctx, &r.mem);
	}
out_free:
	free(ref);
	free(naive);
	free(ref_lse);
	free(naive_lse);
	free_run(&r);
}

/* ---- the case matrix ---- */

static int ncases;
static struct casedef *cases;

static struct casedef *add_case(int nh, int nkv, int hd, int bs, int cdt, int adt, const char *what)
{
	struct casedef *c, *grown = realloc(cases, sizeof(*cases) * (ncases + 1));

	if (!grown) {
		printf("Bail out! out of memory building the cases\n");
		exit(2);
	}
	cases = grown;
	c = &cases[ncases++];
	memset(c, 0, sizeof(*c));
	c->nh = nh;
	c->nkv = nkv;
	c->hd = hd;
	c->bs = bs;
	c->cdt = cdt;
	c->adt = adt;
	c->window = -1;
	snprintf(c->name, sizeof(c->name), "cache %s act %s gqa %d hd %d bs %d: %s", dt_name[cdt], dt_name[adt],
		 nh / nkv, hd, bs, what);
	return c;
}

/*
 * Query-key pairs x heads x head_dim of a case's batch, what a limited run (PKV_CONFORMANCE_MAX_CASES)
 * keeps under LIMITED_MAX_UNITS: an emulated CUDA kernel took 2 minutes on
 * a case of 14 sequences of 64 heads, 0.7 s on one of 2 x 90 keys of 16.
 */
#define LIMITED_MAX_UNITS 1000000.0

static double case_units(const struct casedef *c)
{
	double u = 0;

	for (int i = 0; i < c->nseq; i++) {
		const struct seqdef *q = &c->seq[i];

		u += (double)q->sq * (q->sk > 0 ? q->sk : q->sk == 0 ? q->cached + q->sq : 0);
	}
	return u * c->nh * c->hd;
}

static void seq(struct casedef *c, int cached, int sq, int sk)
{
	c->seq[c->nseq].cached = cached;
	c->seq[c->nseq].sq = sq;
	c->seq[c->nseq].sk = sk;
	c->nseq++;
}

/* A mixed prefill + decode batch whose sequences cross block boundaries. */
static void mixed(int nh, int nkv, int hd, int bs, int cdt, int adt)
{
	struct casedef *c = add_case(nh, nkv, hd, bs, cdt, adt, "mixed prefill+decode");

	seq(c, 37, 1, 0);
	seq(c, 0, 45, 0);
	seq(c, 20, 13, 0);
}

static void decode(int nh, int nkv, int hd, int bs, int cdt, int adt, int ctx, int batch)
{
	struct casedef *c = add_case(nh, nkv, hd, bs, cdt, adt, "decode");
	int i;

	snprintf(c->name + strlen(c->name), sizeof(c->name) - strlen(c->name), " batch %d ctx %d", batch, ctx);
	for (i = 0; i < batch; i++)
		seq(c, ctx - 1 - 7 * i, 1, 0);
}

/* One decode row over ctx keys, checked as two calls over keys [0, at) and [at, ctx) merged (check_merge). */
static struct casedef *split_merge(int nh, int nkv, int hd, int bs, int cdt, int adt, int ctx, int at)
{
	struct casedef *c = add_case(nh, nkv, hd, bs, cdt, adt, "decode row");

	snprintf(c->name + strlen(c->name), sizeof(c->name) - strlen(c->name), " ctx %d, keys split at %d", ctx, at);
	seq(c, ctx - 1, 1, 0);
	c->split_at = at;
	return c;
}

/* Decode sequence s (0-based) reuses blocks [from, to) of sequence `with` (0-based). */
static void share(struct casedef *c, int s, int with, int from, int to)
{
	c->seq[s].share_with = with + 1;
	c->seq[s].share_from = from;
	c->seq[s].shared_blocks = to;
}

/*
 * Decode batches whose block tables share blocks, the case a backend may
 * serve by reading shared leading blocks once for every query (cascade
 * attention): 1 or many shared blocks, a shared block that is full for one
 * sequence and partly filled for another, blocks shared at non-leading
 * positions only, groups whose members share different lengths, a sequence
 * with no key of its own, GQA ratios, dtypes, windows and soft-caps.
 */
static void shared_prefix_cases(void)
{
	static const int dts[][2] = { { PKV_DTYPE_BF16, PKV_DTYPE_BF16 }, { PKV_DTYPE_BF16, PKV_DTYPE_F32 },
				      { PKV_DTYPE_F16, PKV_DTYPE_F16 }, { PKV_DTYPE_F32, PKV_DTYPE_F32 } };
	static const int heads[][2] = { { 9, 3 }, { 8, 2 }, { 16, 2 }, { 32, 1 } };
	struct casedef *c;
	int d, h, s;

	for (d = 0; d < 4; d++)
		for (h = 0; h < 4; h++) {
			c = add_case(heads[h][0], heads[h][1], 64, 16, dts[d][0], dts[d][1],
				     "decode, 8 sequences sharing 5 leading blocks");
			for (s = 0; s < 8; s++) {
				seq(c, 80 + 9 * s, 1, 0);
				if (s)
					share(c, s, 0, 0, 5);
			}
		}
	c = add_case(16, 2, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_F32, "decode, 7 sequences sharing 3 blocks, uneven chunks");
	for (s = 0; s < 7; s++) {
		seq(c, 50 + 3 * s, 1, 0);
		if (s)
			share(c, s, 0, 0, 3);
	}
	c = add_case(9, 3, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, "decode, 2 sequences sharing 4 leading blocks");
	seq(c, 75, 1, 0);
	seq(c, 90, 1, 0);
	share(c, 1, 0, 0, 4);
	c = add_case(9, 3, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_F32, "decode, 1 shared leading block");
	seq(c, 40, 1, 0);
	seq(c, 33, 1, 0);
	seq(c, 20, 1, 0);
	share(c, 1, 0, 0, 1);
	share(c, 2, 0, 0, 1);
	c = add_case(8, 2, 128, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, "decode, shared block full for one, partial for other");
	seq(c, 48, 1, 0);
	seq(c, 40, 1, 0);
	share(c, 1, 0, 0, 3);
	c = add_case(8, 2, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, "decode, blocks shared at non-leading positions");
	seq(c, 70, 1, 0);
	seq(c, 66, 1, 0);
	seq(c, 50, 1, 0);
	share(c, 1, 0, 1, 4);
	share(c, 2, 0, 2, 3);
	c = add_case(9, 3, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_F32, "decode, same first block, different shared lengths");
	seq(c, 120, 1, 0);
	seq(c, 100, 1, 0);
	seq(c, 90, 1, 0);
	seq(c, 110, 1, 0);
	seq(c, 17, 1, 0);
	seq(c, 60, 1, 0);
	share(c, 1, 0, 0, 5);
	share(c, 2, 0, 0, 1);
	share(c, 3, 0, 0, 6);
	share(c, 4, 0, 0, 1);
	share(c, 5, 3, 0, 2);
	c = add_case(8, 2, 64, 16, PKV_DTYPE_F16, PKV_DTYPE_F32, "decode, a sequence with no key outside the shared blocks");
	seq(c, 32, 1, 0);
	seq(c, 31, 1, 0);
	share(c, 1, 0, 0, 2);
	c = add_case(8, 2, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, "decode, long shared prefix, runs cut the rest");
	seq(c, 1500, 1, 0);
	seq(c, 1470, 1, 0);
	seq(c, 1530, 1, 0);
	share(c, 1, 0, 0, 90);
	share(c, 2, 0, 0, 90);
	c = add_case(9, 3, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_F32, "decode, shared blocks, window 20");
	seq(c, 90, 1, 0);
	seq(c, 80, 1, 0);
	share(c, 1, 0, 0, 5);
	c->window = 20;
	c = add_case(9, 3, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, "decode, shared blocks, window 500 soft-cap 3");
	seq(c, 90, 1, 0);
	seq(c, 80, 1, 0);
	seq(c, 85, 1, 0);
	share(c, 1, 0, 0, 5);
	share(c, 2, 0, 0, 4);
	c->window = 500;
	c->softcap = 3.0f;
}

/*
 * Shared-prefix decode batches with f32 queries, the model client's
 * activations (a CPU backend may serve the shared part with many query
 * rows per KV head at once): f32, f16 and bf16 caches, GQA 1, 3, 4 and 8
 * at head_dim 64 and 128, 14 sequences (more than one item's worth of rows
 * at every shape: groups cut into chunks, rows per KV head not a multiple
 * of 4), members with no key of their own, one sharing fewer blocks, one
 * sharing none; windows that keep some members out of the shared part.
 */
static void f32_cascade_group(struct casedef *c)
{
	/* 80 keys: 5 blocks of 16, 2 of 32 (and half a block the leader's own). */
	int s, nb = 80 / c->bs;

	seq(c, 116, 1, 0);
	for (s = 1; s < 12; s++) {
		/* 80 keys shared with the leader (the first nb blocks), then 0..40 of its own; sequence 4 has none. */
		seq(c, s == 4 ? 79 : 80 + 4 * s - 1 - s % 3, 1, 0);
		share(c, s, 0, 0, nb);
	}
	seq(c, 70, 1, 0);
	share(c, 12, 0, 0, nb / 2);
	seq(c, 95, 1, 0);
}

static void f32_cascade_cases(void)
{
	static const int gqa[][2] = { { 64, 64 }, { 9, 3 }, { 8, 2 }, { 16, 2 } }, hds[] = { 64, 128 };
	static const int cdts[] = { PKV_DTYPE_F32, PKV_DTYPE_F16, PKV_DTYPE_BF16 };
	struct casedef *c;
	int g, h, d;

	for (d = 0; d < 3; d++)
		for (g = 0; g < 4; g++)
			for (h = 0; h < 2; h++) {
				c = add_case(gqa[g][0], gqa[g][1], hds[h], 16, cdts[d], PKV_DTYPE_F32,
					     "decode, 12 of 14 sequences sharing 5 blocks");
				f32_cascade_group(c);
			}
	c = add_case(9, 3, 64, 16, PKV_DTYPE_F32, PKV_DTYPE_F32, "decode, 14 sequences sharing, window 100");
	f32_cascade_group(c);
	c->window = 100;
	c = add_case(8, 2, 128, 16, PKV_DTYPE_F32, PKV_DTYPE_F32, "decode, 14 sequences sharing, window 200 soft-cap 2");
	f32_cascade_group(c);
	c->window = 200;
	c->softcap = 2.0f;
	c = add_case(9, 3, 64, 32, PKV_DTYPE_F32, PKV_DTYPE_F32, "decode, 14 sequences sharing, bs 32");
	f32_cascade_group(c);
}

/*
 * Decode batches of f32 queries over an f32 cache (the model client's KV
 * pool), and over f16 and bf16 ones: GQA 1, 3, 4 and 8 at head_dim 64 and
 * 128, uneven lengths ending in partly filled blocks (and a sequence shorter
 * than a tile), windows, soft-caps, and long contexts that the threads'
 * runs cut mid-sequence (block size 1: a span per key). Block tables are
 * shuffled, as in every case.
 */
static void f32_decode_cases(void)
{
	static const int gqa[] = { 1, 3, 4, 8 }, hds[] = { 64, 128 }, cdts[] = { PKV_DTYPE_F16, PKV_DTYPE_BF16 };
	struct casedef *c;
	int g, h, d;

	for (g = 0; g < 4; g++)
		for (h = 0; h < 2; h++) {
			int nkv = gqa[g] == 3 ? 3 : 2;

			c = add_case(gqa[g] * nkv, nkv, hds[h], 16, PKV_DTYPE_F32, PKV_DTYPE_F32, "decode, uneven lengths");
			seq(c, 300, 1, 0);
			seq(c, 77, 1, 0);
			seq(c, 4, 1, 0);
			seq(c, 1000, 1, 0);
			c = add_case(gqa[g] * nkv, nkv, hds[h], 16, PKV_DTYPE_F32, PKV_DTYPE_F32, "decode, window 20 soft-cap 3");
			seq(c, 90, 1, 0);
			seq(c, 33, 1, 0);
			c->window = 20;
			c->softcap = 3.0f;
		}
	c = add_case(9, 3, 64, 16, PKV_DTYPE_F32, PKV_DTYPE_F32, "decode, sliding window 0");
	seq(c, 60, 1, 0);
	seq(c, 10, 1, 0);
	c->window = 0;
	c = add_case(9, 3, 64, 16, PKV_DTYPE_F32, PKV_DTYPE_F32, "decode, window 100 over a long context");
	seq(c, 2100, 1, 0);
	seq(c, 130, 1, 0);
	c->window = 100;
	c = add_case(9, 3, 64, 32, PKV_DTYPE_F32, PKV_DTYPE_F32, "decode, soft-cap 2");
	seq(c, 500, 1, 0);
	seq(c, 45, 1, 0);
	c->softcap = 2.0f;
	decode(9, 3, 64, 16, PKV_DTYPE_F32, PKV_DTYPE_F32, 2100, 1);
	decode(9, 3, 64, 1, PKV_DTYPE_F32, PKV_DTYPE_F32, 1500, 2);
	decode(16, 2, 128, 32, PKV_DTYPE_F32, PKV_DTYPE_F32, 1200, 3);
	for (d = 0; d < 2; d++) {
		c = add_case(9, 3, 64, 16, cdts[d], PKV_DTYPE_F32, "decode, uneven lengths");
		seq(c, 300, 1, 0);
		seq(c, 5, 1, 0);
		seq(c, 1000, 1, 0);
		c = add_case(16, 2, 128, 16, cdts[d], PKV_DTYPE_F32, "decode, window 40 soft-cap 3");
		seq(c, 200, 1, 0);
		seq(c, 20, 1, 0);
		c->window = 40;
		c->softcap = 3.0f;
	}
}

static void build_cases(int full)
{
	int cdt, adt, g, h, b;
	static const int gqa[] = { 1, 3, 4, 8 }, hds[] = { 64, 80, 128, 256 }, bss[] = { 1, 16, 32, 128 };
	struct casedef *c;

	for (cdt = 0; cdt < 3; cdt++)
		for (adt = 0; adt < 3; adt++) {
			mixed(8, 2, 64, 16, cdt, adt);
			decode(8, 2, 64, 16, cdt, adt, 70, 3);
		}
	for (g = 0; g < 4; g++) {
		mixed(gqa[g] * 2, 2, 128, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16);
		decode(gqa[g] * 2, 2, 128, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, 100, 2);
	}
	for (h = 0; h < 4; h++) {
		mixed(4, 2, hds[h], 16, PKV_DTYPE_F16, PKV_DTYPE_F32);
		decode(4, 1, hds[h], 32, PKV_DTYPE_BF16, PKV_DTYPE_BF16, 90, 2);
	}
	for (b = 0; b < 4; b++) {
		mixed(6, 2, 64, bss[b], PKV_DTYPE_BF16, PKV_DTYPE_F32);
		decode(6, 2, 64, bss[b], PKV_DTYPE_F32, PKV_DTYPE_F32, 150, 2);
	}
	/* Long single-sequence decode: exercises a KV-split (flash-decoding) merge. */
	decode(32, 8, 128, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, 3000, 1);
	decode(9, 3, 64, 16, PKV_DTYPE_F16, PKV_DTYPE_F32, 2100, 1);
	/*
	 * Decode batches the threads' equal-bytes runs cut mid-sequence, the
	 * decode loop prefetching on from one item into the next (block size 1:
	 * a span per key), and uneven lengths.
	 */
	decode(8, 2, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, 1500, 3);
	decode(8, 2, 64, 1, PKV_DTYPE_BF16, PKV_DTYPE_BF16, 1500, 2);
	c = add_case(9, 3, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, "decode, uneven lengths");
	seq(c, 2600, 1, 0);
	seq(c, 4, 1, 0);
	seq(c, 700, 1, 0);
	seq(c, 1300, 1, 0);

	c = add_case(8, 2, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_F32, "q longer than k, fully masked rows give 0");
	seq(c, 5, 9, 5);
	seq(c, 0, 3, 0);
	for (b = 0; b < 2; b++) {
		c = add_case(8, 2, 64, 16, b ? PKV_DTYPE_BF16 : PKV_DTYPE_F32, b ? PKV_DTYPE_BF16 : PKV_DTYPE_F32,
			     "queries of a sequence with no key at all");
		seq(c, 0, 3, -1);
		seq(c, 20, 2, 0);
	}
	c = add_case(4, 2, 64, 16, PKV_DTYPE_F32, PKV_DTYPE_F32, "zero-length and single-token sequences");
	seq(c, 0, 0, 0);
	seq(c, 0, 1, 0);
	seq(c, 17, 0, 0);
	seq(c, 33, 4, 0);
	c = add_case(8, 4, 64, 16, PKV_DTYPE_F16, PKV_DTYPE_F16, "prefix shared through the same blocks");
	seq(c, 48, 5, 0);
	seq(c, 40, 3, 0);
	c->seq[1].share_with = 1;
	c->seq[1].shared_blocks = 2;
	c->copy = 1;
	shared_prefix_cases();
	f32_cascade_cases();
	f32_decode_cases();
	c = add_case(8, 2, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, "sliding window 20");
	seq(c, 60, 30, 0);
	seq(c, 80, 1, 0);
	c->window = 20;
	c = add_case(8, 2, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, "sliding window 0, decode");
	seq(c, 60, 1, 0);
	seq(c, 10, 1, 0);
	c->window = 0;
	c = add_case(8, 2, 128, 32, PKV_DTYPE_F32, PKV_DTYPE_F16, "soft-cap 5");
	seq(c, 60, 30, 0);
	seq(c, 80, 1, 0);
	c->softcap = 5.0f;
	c = add_case(8, 2, 128, 32, PKV_DTYPE_F16, PKV_DTYPE_F16, "soft-cap 2, decode");
	seq(c, 60, 1, 0);
	seq(c, 300, 1, 0);
	c->softcap = 2.0f;
	c = add_case(8, 8, 80, 7, PKV_DTYPE_BF16, PKV_DTYPE_F16, "long prefill over odd block size");
	seq(c, 100, 120, 0);
	/* Long bf16 prefills: row blocks large enough for 16-row (AMX-style) kernels, with masks. */
	c = add_case(9, 3, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, "long prefill, window 70, q longer than k");
	seq(c, 40, 100, 0);
	seq(c, 30, 70, 50);
	c->window = 70;
	c = add_case(32, 8, 128, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, "long prefill, soft-cap 4");
	seq(c, 0, 64, 0);
	seq(c, 33, 31, 0);
	c->softcap = 4.0f;
	/* Few query rows over many keys: a CPU backend splits each row's keys over its threads and merges. */
	c = add_case(8, 2, 64, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, "short prefill over a long context");
	seq(c, 1200, 20, 0);
	c = add_case(9, 3, 64, 16, PKV_DTYPE_F32, PKV_DTYPE_F32, "short prefill over a long context, soft-cap 3");
	seq(c, 900, 7, 0);
	c->softcap = 3.0f;
	/* Backends with softmax_lse: the daemon's split of one long row, long pieces split again inside. */
	split_merge(9, 3, 64, 16, PKV_DTYPE_F32, PKV_DTYPE_F32, 3000, 2048);
	split_merge(32, 8, 128, 16, PKV_DTYPE_BF16, PKV_DTYPE_BF16, 1500, 512);
	c = split_merge(8, 2, 64, 32, PKV_DTYPE_F16, PKV_DTYPE_F32, 700, 96);
	c->softcap = 3.0f;
	split_merge(8, 2, 64, 1, PKV_DTYPE_BF16, PKV_DTYPE_BF16, 300, 137);
	split_merge(4, 4, 80, 16, PKV_DTYPE_F32, PKV_DTYPE_F16, 100, 16);

	if (!full)
		return;
	for (cdt = 0; cdt < 3; cdt++)
		for (adt = 0; adt < 3; adt++)
			for (g = 0; g < 4; g++)
				for (h = 0; h < 4; h++)
					for (b = 0; b < 4; b++) {
						mixed(gqa[g] * 2, 2, hds[h], bss[b], cdt, adt);
						decode(gqa[g] * 2, 2, hds[h], bss[b], cdt, adt, 200, 3);
						c = add_case(gqa[g] * 2, 2, hds[h], bss[b], cdt, adt, "window 9 soft-cap 3");
						seq(c, 40, 25, 0);
						seq(c, 50, 1, 0);
						c->window = 9;
						c->softcap = 3.0f;
					}
}

/* PKV_CONFORMANCE_OPTIONS="k=v,k=v": options for the backend's init, as pagedkvd would pass them. */
static char opt_text[512];
static struct pkv_dict_item opt_items[16];
static struct pkv_dict opt_dict;

static void parse_options(const char *text)
{
	char *save = NULL, *kv, *eq;

	snprintf(opt_text, sizeof(opt_text), "%s", text);
	for (kv = strtok_r(opt_text, ",", &save); kv && opt_dict.n_items < 16; kv = strtok_r(NULL, ",", &save)) {
		eq = strchr(kv, '=');
		if (!eq)
			continue;
		*eq = '\0';
		opt_items[opt_dict.n_items].key = kv;
		opt_items[opt_dict.n_items++].value = eq + 1;
	}
	opt_dict.items = opt_items;
}

static int run_all(const char *path, const char *name)
{
	const char *max = getenv("PKV_CONFORMANCE_MAX_CASES");
	int i, ret, limit = max && atoi(max) > 0 ? atoi(max) : 0, start = ran_paths;
	char err[512];

	ret = pkv_plugin_load(path, name, NULL, &opt_dict, host, &plug, err, sizeof(err));
	if (ret == -ENODEV && test_no == 0) {
		fprintf(stderr, "pkv-conformance: skipped, no device: %s\n", err);
		return ret;
	}
	if (ret) {
		printf("Bail out! %s\n", err);
		return ret;
	}
	/*
	 * A limit visits the matrix in a stride order (7919 is prime, so every
	 * case comes once) and stops after that many cases actually ran: slow,
	 * emulated backends get a few cases of different kinds, not a few skips.
	 * Which cases the stride meets moves whenever the matrix grows: the
	 * heavy ones are left out, so that a limited run stays short.
	 */
	for (i = 0; i < ncases && (!limit || ran_paths - start < limit); i++) {
		const struct casedef *c = &cases[limit ? (size_t)i * 7919 % (size_t)ncases : (size_t)i];

		if (!limit || case_units(c) <= LIMITED_MAX_UNITS)
			run_case(c);
	}
	pkv_plugin_unload(&plug);
	return 0;
}

int main(int argc, char **argv)
{
	const char *sweep = getenv("PKV_CONFORMANCE_SWEEP");
	const char *th = getenv("PKV_CONFORMANCE_THREADS");
	int ret, status;

	if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		printf("usage: pkv-conformance PLUGIN.so [BACKEND_NAME]\n"
		       "Runs the backend(s) of PLUGIN.so on every path they offer against the reference\n"
		       "attention and prints TAP (exit 0: all passed, 1: a failure, 77: nothing to test).\n"
		       "Environment: PKV_CONFORMANCE_FULL, PKV_CONFORMANCE_MAX_CASES, PKV_CONFORMANCE_OPTIONS,\n"
		       "PKV_CONFORMANCE_SWEEP, PKV_CONFORMANCE_THREADS (see pkv-conformance(1)).\n");
		return 0;
	}
	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: %s PLUGIN.so [BACKEND_NAME] (--help for more)\n", argv[0]);
		return 2;
	}
	verbose = getenv("PKV_CONFORMANCE_VERBOSE") != NULL;
	fill_via_backend = getenv("PKV_CONFORMANCE_FILL_VIA_BACKEND") != NULL;
	ret = pkv_host_create(th ? (unsigned)atoi(th) : 2, verbose ? PKV_LOG_DEBUG : PKV_LOG_WARN, &host);
	if (ret) {
		printf("Bail out! cannot create the host: %s\n", strerror(-ret));
		return 1;
	}
	build_cases(getenv("PKV_CONFORMANCE_FULL") && atoi(getenv("PKV_CONFORMANCE_FULL")));
	if (getenv("PKV_CONFORMANCE_OPTIONS"))
		parse_options(getenv("PKV_CONFORMANCE_OPTIONS"));
	if (sweep && strchr(sweep, '=')) {
		char var[64], vals[512], *save = NULL, *v, label[160];
		size_t n = (size_t)(strchr(sweep, '=') - sweep);

		snprintf(var, sizeof(var), "%.*s", (int)(n < sizeof(var) ? n : sizeof(var) - 1), sweep);
		snprintf(vals, sizeof(vals), "%s", sweep + n + 1);
		for (v = strtok_r(vals, ",", &save); v; v = strtok_r(NULL, ",", &save)) {
			setenv(var, v, 1);
			snprintf(label, sizeof(label), "[%s=%s] ", var, v);
			sweep_label = label;
			ret = run_all(argv[1], argc > 2 ? argv[2] : NULL);
			if (ret)
				break;
		}
		sweep_label = "";
	} else {
		ret = run_all(argv[1], argc > 2 ? argv[2] : NULL);
	}
	/* After a bail-out no plan is printed: the run is incomplete, and its status says so. */
	if (ret == -ENODEV && test_no == 0)
		status = 77;
	else if (ret)
		status = 1;
	else
		status = failures ? 1 : 0;
	if (!ret)
		printf("1..%d\n", test_no);
	free(cases);
	pkv_host_destroy(host);
	return status;
}
