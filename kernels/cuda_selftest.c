/* SPDX-License-Identifier: MIT */
/* GPU self-test of the two CUDA plugins: random paged batches against an f64 reference, poisoned outputs, bit-exact cache. */

/*
 * Usage: cuda_selftest VARLEN.so DECODE.so   (env PKV_SEED, PKV_SELFTEST_CASES)
 *
 * The varlen plugin owns the cache (cache_alloc) and the decode plugin works
 * on the same memory, as the daemon arranges it. Every case draws a fresh
 * geometry and batch: head dims 64/80/128/256, GQA 1/3/4/8, block sizes
 * 1/16/32/128, f16/bf16 cache, f32/f16/bf16 activations, padded strides,
 * shuffled block tables with -1 padding, a prefix shared by two sequences
 * through the same blocks, zero-length and single-token sequences, q longer
 * than k, sliding window and soft-cap. It passes when:
 *   - every output element was written (outputs are poisoned with NaN first),
 *   - rows that see no key are exactly 0,
 *   - max |out - ref| <= 2 * max |naive - ref| + 1e-6, where ref is an f64
 *     computation on the stored (rounded) inputs and naive a same-dtype
 *     implementation (scores, probabilities and output rounded to the cache
 *     dtype; FlashAttention's test rule),
 *   - the cache read back from the device equals, bit for bit, a host mirror
 *     written with round-to-nearest-even conversions, and copy_blocks copies
 *     exactly.
 * Needs only libdl and libm: the plugins are dlopen'ed and the cache is read
 * back through cache_read. Any backend works (e.g. the CPU plugin twice),
 * which is how the harness itself is checked without a GPU.
 */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pagedkv/backend.h>

/* ---- dtype conversions (round-to-nearest-even, as the ABI requires) ---- */

static uint16_t f2bf(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static float bf2f(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t f2h(float f)
{
	uint32_t x, ax, sign, h, rem;
	memcpy(&x, &f, 4);
	sign = (x >> 16) & 0x8000u;
	ax = x & 0x7fffffffu;
	if (ax > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u);
	if (ax >= 0x477ff000u)
		return (uint16_t)(sign | 0x7c00u);
	if (ax < 0x38800000u) {
		float v;
		memcpy(&v, &ax, 4);
		return (uint16_t)(sign | (uint32_t)nearbyintf(v * 16777216.0f));
	}
	h = (((ax >> 23) - 112) << 10) | ((ax & 0x7fffffu) >> 13);
	rem = ax & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

static float h2f(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
	float f;
	if (e == 0) {
		f = ldexpf((float)m, -24);
		return sign ? -f : f;
	}
	u = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112) << 23) | (m << 13));
	memcpy(&f, &u, 4);
	return f;
}

static float load_el(const void *p, size_t i, uint32_t dt)
{
	if (dt == PKV_DTYPE_F32)
		return ((const float *)p)[i];
	if (dt == PKV_DTYPE_F16)
		return h2f(((const uint16_t *)p)[i]);
	return bf2f(((const uint16_t *)p)[i]);
}

static void store_el(void *p, size_t i, uint32_t dt, float v)
{
	if (dt == PKV_DTYPE_F32)
		((float *)p)[i] = v;
	else if (dt == PKV_DTYPE_F16)
		((uint16_t *)p)[i] = f2h(v);
	else
		((uint16_t *)p)[i] = f2bf(v);
}

/* Rounds v to dtype dt and back. */
static double rnd(double v, uint32_t dt)
{
	if (dt == PKV_DTYPE_F32)
		return (float)v;
	return dt == PKV_DTYPE_F16 ? h2f(f2h((float)v)) : bf2f(f2bf((float)v));
}

/* ---- random numbers ---- */

static uint64_t rng_state;

static uint64_t rnd_u64(void)
{
	uint64_t x = rng_state;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng_state = x;
}

static int rnd_int(int lo, int hi) /* inclusive */
{
	return lo + (int)(rnd_u64() % (uint64_t)(hi - lo + 1));
}

static float rnd_f(void)
{
	return (float)((double)(rnd_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* ---- host services ---- */

static void h_log(void *host, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void h_log(void *host, int level, const char *fmt, ...)
{
	va_list ap;
	(void)host;
	if (level > PKV_LOG_WARN && !getenv("PKV_VERBOSE"))
		return;
	va_start(ap, fmt);
	fprintf(stderr, "plugin: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static void *h_alloc(void *host, size_t align, size_t size)
{
	void *p = NULL;
	(void)host;
	return posix_memalign(&p, align, size) ? NULL : p;
}

static void h_free(void *host, void *p)
{
	(void)host;
	free(p);
}

static uint32_t h_threads(void *host)
{
	(void)host;
	return 1;
}

static int h_pfor(void *host, uint32_t n, pkv_task_fn fn, void *arg)
{
	uint32_t i;
	(void)host;
	for (i = 0; i < n; i++)
		fn(arg, i, 0);
	return 0;
}

static const struct pkv_host_api host_api = {
	.abi_version = PKV_BACKEND_ABI_VERSION,
	.struct_size = sizeof(struct pkv_host_api),
	.log = h_log,
	.alloc_aligned = h_alloc,
	.free_aligned = h_free,
	.num_threads = h_threads,
	.parallel_for = h_pfor,
};

static const struct pkv_dict no_options;

struct plug {
	void *dl;
	const struct pkv_backend *be;
	void *ctx;
};

static int plug_open(struct plug *p, const char *path)
{
	pkv_backend_enum_fn fn;
	int rc;

	p->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!p->dl) {
		fprintf(stderr, "selftest: dlopen %s: %s\n", path, dlerror());
		return -1;
	}
	*(void **)&fn = dlsym(p->dl, PKV_BACKEND_ENUM_SYMBOL);
	if (!fn || fn(0, &p->be)) {
		fprintf(stderr, "selftest: %s: no backend\n", path);
		return -1;
	}
	rc = p->be->init(&host_api, &no_options, &p->ctx);
	if (rc) {
		fprintf(stderr, "selftest: %s: init failed: %d\n", path, rc);
		return rc == -ENODEV ? 77 : -1;
	}
	return 0;
}

/* ---- one case ---- */

#define MAXS 6

struct seqdesc {
	int sq, sk, cached;  /* cached = keys written before the tested call */
	int shared_blocks;   /* leading blocks shared with sequence 0 */
};

struct kase {
	struct pkv_geometry geo;
	uint32_t act;
	int nseq;
	struct seqdesc s[MAXS];
	int32_t *bt;          /* [nseq][mbps] */
	int mbps;
	int window;
	float softcap;
	int layer;
	/* host mirrors of the whole cache (all layers), element type of the cache */
	uint16_t *mk, *mv;
	size_t layer_elems;
};

static size_t slot_elem(const struct kase *k, int layer, int64_t slot, int h)
{
	return (size_t)layer * k->layer_elems + ((size_t)slot * k->geo.num_kv_heads + (size_t)h) * k->geo.head_dim;
}

static int64_t slot_of(const struct kase *k, int s, int pos)
{
	const int bs = (int)k->geo.block_size;
	return (int64_t)k->bt[s * k->mbps + pos / bs] * bs + pos % bs;
}

static float cache_val(const struct kase *k, const uint16_t *m, int s, int pos, int h, int d)
{
	const uint16_t e = m[slot_elem(k, k->layer, slot_of(k, s, pos), h) + (size_t)d];
	return k->geo.cache_dtype == PKV_DTYPE_F16 ? h2f(e) : bf2f(e);
}

struct call {
	/* rows r of this call: per sequence the queries of positions [sk - sq, sk) */
	int32_t cu_q[MAXS + 1], cu_k[MAXS + 1], seqlens[MAXS];
	int sq[MAXS], sk[MAXS];
	int total;
	int64_t *slots;
	void *q, *kn, *vn, *o;
	int64_t qs_t, qs_h, ks_t, ks_h, os_t, os_h;
};

static double g_err_worst;

/* Builds and runs one call (phase: 0 = fill the cached part, 1 = the tested call) and checks O. */
static int run_call(struct kase *k, struct plug *p, const struct pkv_cache_mem *mem, int decode, int phase,
		    char *arena, size_t arena_len)
{
	const int H = (int)k->geo.num_heads, HKV = (int)k->geo.num_kv_heads, D = (int)k->geo.head_dim;
	const int G = H / HKV;
	const uint32_t ct = k->geo.cache_dtype, at = k->act;
	const size_t aes = pkv_dtype_size(at);
	struct call c;
	int s, r, h, d, rc, fails = 0;
	size_t off = 0;

	memset(&c, 0, sizeof(c));
	for (s = 0; s < k->nseq; s++) {
		if (phase == 0) {
			/* Write positions [shared, cached) as new tokens over [0, cached) keys. */
			const int from = k->s[s].shared_blocks * (int)k->geo.block_size;
			c.sk[s] = k->s[s].cached;
			c.sq[s] = k->s[s].cached - from;
		} else {
			c.sk[s] = k->s[s].sk;
			c.sq[s] = k->s[s].sq;
		}
		c.cu_q[s + 1] = c.cu_q[s] + c.sq[s];
		c.cu_k[s + 1] = c.cu_k[s] + c.sk[s];
		c.seqlens[s] = c.sk[s] - c.sq[s] > 0 ? c.sk[s] - c.sq[s] : 0;
	}
	c.total = c.cu_q[k->nseq];
	if (c.total == 0)
		return 0;
	/* Padded strides half the time: exercises the strided copies. */
	const int pq = rnd_int(0, 1) * 8, pk = rnd_int(0, 1) * 8, po = rnd_int(0, 1) * 8;
	c.qs_h = D + pq;
	c.qs_t = (int64_t)H * c.qs_h;
	c.ks_h = D + pk;
	c.ks_t = (int64_t)HKV * c.ks_h + (rnd_int(0, 1) ? 16 : 0);
	c.os_h = D + po;
	c.os_t = (int64_t)H * c.os_h;
#define CARVE(ptr, bytes)                                             \
	do {                                                          \
		(ptr) = (void *)(arena + off);                        \
		off += ((size_t)(bytes) + 255) & ~(size_t)255;        \
		if (off > arena_len) {                                \
			fprintf(stderr, "selftest: arena too small\n"); \
			return 1;                                     \
		}                                                     \
	} while (0)
	CARVE(c.q, (size_t)c.total * c.qs_t * aes);
	CARVE(c.kn, (size_t)c.total * c.ks_t * aes);
	CARVE(c.vn, (size_t)c.total * c.ks_t * aes);
	CARVE(c.o, (size_t)c.total * c.os_t * aes);
	CARVE(c.slots, (size_t)c.total * 8);
	for (size_t i = 0; i < (size_t)c.total * c.qs_t; i++)
		store_el(c.q, i, at, rnd_f());
	for (size_t i = 0; i < (size_t)c.total * c.ks_t; i++) {
		store_el(c.kn, i, at, rnd_f());
		store_el(c.vn, i, at, rnd_f());
	}
	memset(c.o, 0xff, (size_t)c.total * c.os_t * aes); /* NaN in every dtype */

	/* Slots, and the host mirror of what the append must write. */
	for (s = 0; s < k->nseq; s++) {
		for (r = 0; r < c.sq[s]; r++) {
			const int row = c.cu_q[s] + r, pos = r + c.sk[s] - c.sq[s];
			if (pos < 0) {
				c.slots[row] = -1;
				continue;
			}
			c.slots[row] = slot_of(k, s, pos);
			for (h = 0; h < HKV; h++)
				for (d = 0; d < D; d++) {
					const size_t src = (size_t)row * c.ks_t + (size_t)h * c.ks_h + d;
					const size_t dst = slot_elem(k, k->layer, c.slots[row], h) + d;
					const float kv = load_el(c.kn, src, at), vv = load_el(c.vn, src, at);
					k->mk[dst] = ct == PKV_DTYPE_F16 ? f2h(kv) : f2bf(kv);
					k->mv[dst] = ct == PKV_DTYPE_F16 ? f2h(vv) : f2bf(vv);
				}
		}
	}

	struct pkv_attn_batch b = {
		.abi_version = PKV_BACKEND_ABI_VERSION,
		.struct_size = sizeof(b),
		.layer = (uint32_t)k->layer,
		.num_seqs = (uint32_t)k->nseq,
		.total_q = (uint32_t)c.total,
		.act_dtype = at,
		.q = c.q, .k_new = c.kn, .v_new = c.vn, .o = c.o,
		.q_stride_tok = c.qs_t, .q_stride_head = c.qs_h,
		.kv_stride_tok = c.ks_t, .kv_stride_head = c.ks_h,
		.o_stride_tok = c.os_t, .o_stride_head = c.os_h,
		.cu_seq_lens_q = c.cu_q, .cu_seq_lens_k = c.cu_k,
		.block_tables = k->bt, .max_blocks_per_seq = (uint32_t)k->mbps,
		.cache_seqlens = c.seqlens, .slot_mapping = c.slots,
		.scale = 0.f, .softcap = k->softcap, .window_left = k->window,
	};
	for (s = 0; s < k->nseq; s++) {
		if ((uint32_t)c.sq[s] > b.max_length_q)
			b.max_length_q = (uint32_t)c.sq[s];
		if ((uint32_t)c.sk[s] > b.max_length_k)
			b.max_length_k = (uint32_t)c.sk[s];
	}
	rc = decode ? p->be->attend_decode(p->ctx, mem, &b) : p->be->attend_varlen(p->ctx, mem, &b);
	if (rc) {
		fprintf(stderr, "selftest: attend (%s, phase %d) returned %d\n", decode ? "decode" : "varlen", phase, rc);
		return 1;
	}

	/*
	 * Reference per row. K/V of each (sequence, KV head) are gathered once
	 * into plain arrays so the inner loops stay cheap. Phase 0 only fills
	 * the cache: its outputs are checked on its last 16 rows per sequence
	 * (those see the most keys); phase 1, the call under test, on every row.
	 */
	const double scale = 1.0 / sqrt((double)D);
	double err = 0, err_naive = 0, ref_max = 0;
	int maxk = 1;
	for (s = 0; s < k->nseq; s++)
		maxk = c.sk[s] > maxk ? c.sk[s] : maxk;
	double *sc = malloc(sizeof(double) * (size_t)maxk * 2), *acc = malloc(sizeof(double) * D * 2);
	double *qv = malloc(sizeof(double) * D * 2);
	float *kg = malloc(sizeof(float) * (size_t)maxk * D), *vg = malloc(sizeof(float) * (size_t)maxk * D);
	for (s = 0; s < k->nseq; s++) {
		for (int kvh = 0; kvh < HKV; kvh++) {
			int j;
			for (j = 0; j < c.sk[s]; j++)
				for (d = 0; d < D; d++) {
					kg[(size_t)j * D + d] = cache_val(k, k->mk, s, j, kvh, d);
					vg[(size_t)j * D + d] = cache_val(k, k->mv, s, j, kvh, d);
				}
			for (r = phase == 0 && c.sq[s] > 16 ? c.sq[s] - 16 : 0; r < c.sq[s]; r++) {
				const int row = c.cu_q[s] + r, diag = c.sk[s] - c.sq[s];
				const int hi = r + diag, lo = k->window >= 0 ? r + diag - k->window : 0;
				for (h = kvh * G; h < (kvh + 1) * G; h++) {
					double mx = -INFINITY, mxn = -INFINITY, sum = 0, sumn = 0;
					int any = 0;
					for (d = 0; d < D; d++) {
						qv[d] = load_el(c.q, (size_t)row * c.qs_t + (size_t)h * c.qs_h + d, at);
						qv[D + d] = rnd(qv[d], ct);
					}
					for (j = 0; j < c.sk[s]; j++) {
						if (j > hi || j < lo)
							continue;
						const float *kr = kg + (size_t)j * D;
						double dot = 0, dotn = 0;
						for (d = 0; d < D; d++) {
							dot += qv[d] * kr[d];
							dotn += qv[D + d] * kr[d];
						}
						double v = dot * scale, vn = rnd(rnd(dotn, ct) * scale, ct);
						if (k->softcap > 0) {
							v = k->softcap * tanh(v / k->softcap);
							vn = rnd(k->softcap * tanh(vn / k->softcap), ct);
						}
						sc[2 * j] = v;
						sc[2 * j + 1] = vn;
						mx = fmax(mx, v);
						mxn = fmax(mxn, vn);
						any = 1;
					}
					for (d = 0; d < 2 * D; d++)
						acc[d] = 0;
					for (j = 0; any && j < c.sk[s]; j++) {
						if (j > hi || j < lo)
							continue;
						const double pr = exp(sc[2 * j] - mx), pn = rnd(exp(sc[2 * j + 1] - mxn), ct);
						const float *vr = vg + (size_t)j * D;
						sum += pr;
						sumn += pn;
						for (d = 0; d < D; d++) {
							acc[d] += pr * vr[d];
							acc[D + d] += pn * vr[d];
						}
					}
					for (d = 0; d < D; d++) {
						const float got = load_el(c.o, (size_t)row * c.os_t + (size_t)h * c.os_h + d, at);
						if (!any) {
							if (got != 0.f && fails++ < 5)
								fprintf(stderr, "  row %d head %d d %d: sees no key, got %g (want 0)\n",
									row, h, d, got);
							continue;
						}
						const double ref = acc[d] / sum, naive = rnd(rnd(acc[D + d] / sumn, ct), at);
						if (isnan(got)) {
							if (fails++ < 5)
								fprintf(stderr, "  row %d head %d d %d: NaN (unwritten?)\n", row, h, d);
							continue;
						}
						err = fmax(err, fabs(got - ref));
						err_naive = fmax(err_naive, fabs(naive - ref));
						ref_max = fmax(ref_max, fabs(ref));
					}
				}
			}
		}
	}
	free(qv);
	free(kg);
	free(vg);
	free(sc);
	free(acc);
	if (err > 2 * err_naive + 1e-6) {
		fprintf(stderr, "  max error %.3g > 2 x naive %.3g (|ref| max %.3g)\n", err, err_naive, ref_max);
		fails++;
	}
	if (phase == 1 && err_naive > 0 && err / err_naive > g_err_worst)
		g_err_worst = err / err_naive;
	return fails ? 1 : 0;
}

/* Reads the whole K or V region: host memory directly, device memory through the backend's cache_read. */
static int read_region(const struct plug *p, const struct pkv_cache_mem *mem, uint32_t kv, void *dst, size_t len)
{
	if (mem->domain == PKV_DOMAIN_HOST) {
		memcpy(dst, kv ? mem->v_base : mem->k_base, len);
		return 0;
	}
	if (!PKV_ABI_HAS(p->be, struct pkv_backend, cache_read) || !p->be->cache_read)
		return -ENOTSUP;
	return p->be->cache_read(p->ctx, mem, kv, 0, dst, len);
}

static int check_cache(const struct kase *k, const struct plug *p, const struct pkv_cache_mem *mem)
{
	const size_t n = k->layer_elems * k->geo.num_layers;
	uint16_t *dk = malloc(n * 2), *dv = malloc(n * 2);
	int bad = 0;
	size_t i;

	if (!dk || !dv || read_region(p, mem, 0, dk, n * 2) || read_region(p, mem, 1, dv, n * 2)) {
		fprintf(stderr, "  cache read-back failed\n");
		bad = 1;
	}
	for (i = 0; !bad && i < n; i++) {
		if (dk[i] != k->mk[i] || dv[i] != k->mv[i]) {
			fprintf(stderr, "  cache element %zu differs: K %04x/%04x V %04x/%04x (device/expected)\n", i,
				dk[i], k->mk[i], dv[i], k->mv[i]);
			bad = 1;
		}
	}
	free(dk);
	free(dv);
	return bad;
}

static const int hds[] = { 64, 80, 128, 256 };
static const int gqas[] = { 1, 3, 4, 8 };
static const int bss[] = { 1, 16, 32, 128 };
static const char *const dtn[] = { "f32", "f16", "bf16" };

static int run_case(int idx, struct plug *owner, struct plug *target, int decode, char *arena, size_t arena_len)
{
	struct kase k;
	struct pkv_cache_mem mem;
	int s, rc, fails = 0, need = 0, i;

	memset(&k, 0, sizeof(k));
	k.geo.head_dim = (uint32_t)hds[rnd_int(0, 3)];
	k.geo.num_kv_heads = (uint32_t)rnd_int(1, 2);
	k.geo.num_heads = k.geo.num_kv_heads * (uint32_t)gqas[rnd_int(0, 3)];
	k.geo.block_size = (uint32_t)bss[rnd_int(0, 3)];
	k.geo.cache_dtype = (uint32_t)rnd_int(1, 2);
	k.geo.num_layers = 2;
	k.act = (uint32_t)rnd_int(0, 2);
	k.layer = rnd_int(0, 1);
	k.window = rnd_int(0, 3) == 0 ? rnd_int(0, 40) : -1;
	k.softcap = rnd_int(0, 3) == 0 ? 5.0f + (float)rnd_int(0, 20) : 0.f;
	k.nseq = rnd_int(1, decode ? MAXS : 4);
	const int bs = (int)k.geo.block_size;
	const int maxk = bs == 1 ? 90 : 260;
	for (s = 0; s < k.nseq; s++) {
		struct seqdesc *d = &k.s[s];
		d->sq = decode ? 1 : rnd_int(0, 3) == 0 ? rnd_int(0, 1) : rnd_int(2, 48);
		d->sk = d->sq + rnd_int(0, maxk);
		if (!decode && rnd_int(0, 7) == 0)
			d->sk = rnd_int(0, d->sq); /* q longer than k: leading rows see nothing */
		if (decode && rnd_int(0, 15) == 0)
			d->sk = 0;
		d->cached = d->sk - d->sq > 0 ? d->sk - d->sq : 0;
	}
	/* Sequence 1 shares sequence 0's leading full blocks (a common prefix). */
	if (k.nseq > 1) {
		const int common = (k.s[0].cached < k.s[1].cached ? k.s[0].cached : k.s[1].cached) / bs;
		k.s[1].shared_blocks = common > 0 ? rnd_int(1, common) : 0;
	}
	k.mbps = 0;
	for (s = 0; s < k.nseq; s++) {
		const int nb = (k.s[s].sk + bs - 1) / bs;
		need += nb;
		if (nb + 2 > k.mbps)
			k.mbps = nb + 2;
	}
	k.geo.num_blocks = (uint32_t)(need + 8);
	/* Shuffled physical blocks; -1 past each sequence's end. */
	int *perm = malloc(sizeof(int) * k.geo.num_blocks);
	for (i = 0; i < (int)k.geo.num_blocks; i++)
		perm[i] = i;
	for (i = (int)k.geo.num_blocks - 1; i > 0; i--) {
		const int j = rnd_int(0, i), t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	k.bt = malloc(sizeof(int32_t) * (size_t)k.nseq * k.mbps);
	int next = 0;
	for (s = 0; s < k.nseq; s++) {
		const int nb = (k.s[s].sk + bs - 1) / bs;
		for (i = 0; i < k.mbps; i++) {
			if (i >= nb)
				k.bt[s * k.mbps + i] = -1;
			else if (i < k.s[s].shared_blocks)
				k.bt[s * k.mbps + i] = k.bt[i]; /* sequence 0's block */
			else
				k.bt[s * k.mbps + i] = perm[next++];
		}
	}
	const int spare = perm[next]; /* an unused block: copy_blocks destination */
	free(perm);
	k.layer_elems = (size_t)k.geo.num_blocks * bs * k.geo.num_kv_heads * k.geo.head_dim;
	k.mk = calloc(k.layer_elems * k.geo.num_layers, 2);
	k.mv = calloc(k.layer_elems * k.geo.num_layers, 2);

	struct pkv_pool_desc pool = { .abi_version = PKV_BACKEND_ABI_VERSION, .struct_size = sizeof(pool),
				      .geo = k.geo, .act_dtype = k.act };
	memset(&mem, 0, sizeof(mem));
	mem.abi_version = PKV_BACKEND_ABI_VERSION; /* the host declares the struct it hands over */
	mem.struct_size = sizeof(mem);
	rc = owner->be->cache_alloc(owner->ctx, &pool, &mem);
	if (rc) {
		fprintf(stderr, "selftest: cache_alloc: %d\n", rc);
		return 1;
	}
	fprintf(stderr, "case %d %s: hd %u heads %u/%u bs %u cache %s act %s seqs %d window %d softcap %g\n", idx,
		decode ? "decode" : "varlen", k.geo.head_dim, k.geo.num_heads, k.geo.num_kv_heads, bs,
		dtn[k.geo.cache_dtype], dtn[k.act], k.nseq, k.window, (double)k.softcap);
	/* Phase 0 (the owner's varlen path) writes the cached part; phase 1 is the call under test. */
	fails += run_call(&k, owner, &mem, 0, 0, arena, arena_len);
	fails += run_call(&k, target, &mem, decode, 1, arena, arena_len);
	fails += check_cache(&k, target, &mem);
	if (!fails && need > 0) {
		struct pkv_block_copy cp = { .src = k.bt[0], .dst = spare };
		if (cp.src >= 0) {
			rc = target->be->copy_blocks(target->ctx, &mem, &cp, 1);
			for (i = 0; i < (int)k.geo.num_layers; i++) {
				const size_t blk = (size_t)bs * k.geo.num_kv_heads * k.geo.head_dim;
				memcpy(k.mk + i * k.layer_elems + (size_t)cp.dst * blk, k.mk + i * k.layer_elems + (size_t)cp.src * blk, blk * 2);
				memcpy(k.mv + i * k.layer_elems + (size_t)cp.dst * blk, k.mv + i * k.layer_elems + (size_t)cp.src * blk, blk * 2);
			}
			if (rc || check_cache(&k, target, &mem)) {
				fprintf(stderr, "  copy_blocks failed (%d)\n", rc);
				fails++;
			}
		}
	}
	owner->be->cache_free(owner->ctx, &mem);
	free(k.bt);
	free(k.mk);
	free(k.mv);
	fprintf(stderr, "case %d: %s\n", idx, fails ? "FAIL" : "ok");
	return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct plug vl, dc;
	const char *env = getenv("PKV_SEED");
	const int cases = getenv("PKV_SELFTEST_CASES") ? atoi(getenv("PKV_SELFTEST_CASES")) : 30;
	const size_t arena_len = (size_t)256 << 20;
	char *arena;
	int rc, i, failed = 0;

	char pv[1024], pd[1024];
	const char *bdir = getenv("PKV_PLUGIN_BUILD_DIR");

	/* Under make check (no arguments) the plugins come from the build tree. */
	if (argc == 1 && bdir) {
		snprintf(pv, sizeof(pv), "%s/varlen/.libs/pkv_cuda_varlen.so", bdir);
		snprintf(pd, sizeof(pd), "%s/decode/.libs/pkv_cuda_decode.so", bdir);
	} else if (argc == 3) {
		snprintf(pv, sizeof(pv), "%s", argv[1]);
		snprintf(pd, sizeof(pd), "%s", argv[2]);
	} else {
		fprintf(stderr, "usage: %s VARLEN.so DECODE.so\n", argv[0]);
		return 2;
	}
	memset(&vl, 0, sizeof(vl));
	memset(&dc, 0, sizeof(dc));
	if (env && *env) {
		rng_state = strtoull(env, NULL, 0);
	} else {
		/* Fresh inputs every run (METHOD: never test the same data twice). */
		FILE *ur = fopen("/dev/urandom", "rb");
		if (!ur || fread(&rng_state, sizeof(rng_state), 1, ur) != 1)
			rng_state = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)clock();
		if (ur)
			fclose(ur);
	}
	if (!rng_state)
		rng_state = 1;
	/* Nothing on stdout before this point: a skip (77) must print nothing (TAP driver). */
	if ((rc = plug_open(&vl, pv)) || (rc = plug_open(&dc, pd)))
		return rc == 77 ? 77 : 1;
	printf("# selftest seed %llu (PKV_SEED to repeat)\n", (unsigned long long)rng_state);
	/* One arena registered with both plugins: the second registration must share the first. */
	arena = aligned_alloc(4096, arena_len);
	if (!arena || (vl.be->register_host && vl.be->register_host(vl.ctx, arena, arena_len)) ||
	    (dc.be->register_host && dc.be->register_host(dc.ctx, arena, arena_len))) {
		fprintf(stderr, "selftest: register_host failed\n");
		return 1;
	}
	for (i = 0; i < cases; i++) {
		failed += run_case(2 * i, &vl, &vl, 0, arena, arena_len);
		failed += run_case(2 * i + 1, &vl, &dc, 1, arena, arena_len);
	}
	if (dc.be->unregister_host)
		dc.be->unregister_host(dc.ctx, arena);
	if (vl.be->unregister_host)
		vl.be->unregister_host(vl.ctx, arena);
	dc.be->fini(dc.ctx);
	vl.be->fini(vl.ctx);
	free(arena);
	/* TAP, so that automake's driver reads it under make check. */
	printf("1..1\n%s 1 - selftest: %d of %d cases failed; worst error / naive error = %.2f\n",
	       failed ? "not ok" : "ok", failed, 2 * cases, g_err_worst);
	return failed ? 1 : 0;
}
