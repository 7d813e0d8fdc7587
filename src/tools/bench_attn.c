/* SPDX-License-Identifier: MIT */
/* pkv-bench attn: decode KV read rate and prefill GFLOP/s of a backend, against STREAM read measured in the same run. */
/*
 * Usage: pkv-bench attn [--json] [--threads N] [--plugin PATH] [--quick] [--block-size N] [--rounds N]
 *                       [--cache-dtype f32|f16|bf16] [--act-dtype f32|bf16]
 *
 * For each thread count (1 and all CPUs by default, or just N):
 * - STREAM reference: every thread sums, as bf16 numbers (AVX-512, else
 *   AVX2, chosen at run time), its share of a 1 GiB pool the plugin's own
 *   cache_alloc mapped (the decode pools' kind of memory), timed in 16 MiB
 *   pieces (median undisturbed piece rate), before the attention runs and
 *   again after them (stream_read_end_gbs: if the two differ, the host's
 *   load changed mid-run); and for each decode row, interleaved with its
 *   calls in rounds (decode_row): a row's of_stream is the median of its
 *   rounds' ratios;
 * - decode: one query per sequence, batch 1 and 16, ctx 512/2048/8192,
 *   bf16 cache and activations (--cache-dtype f32|f16|bf16 and --act-dtype
 *   f32|bf16 choose others), shapes hd64 (9 q / 3 kv heads) and hd128
 *   (32 / 8), each with a sequential block table and a shuffled one (a
 *   fragmented pool); figure = K+V bytes the call must read / median call
 *   time. The pool has enough layers that one sweep over them exceeds 1 GiB,
 *   and each call uses the next layer, so the KV comes from DRAM;
 * - prefill: 512 new queries over 512 and 4096 keys, causal (bottom-right),
 *   same shapes; figure = 4 * head_dim * num_heads * visible (q, k) pairs /
 *   median call time.
 */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <pagedkv/dtype.h>
#include "loader/loader.h"
#include "bench_stats.h"

#define STREAM_BYTES (1ull << 30)

struct shape {
	const char *name;
	uint32_t nh, nkv, hd;
};

static const struct shape shapes[] = {
	{ "hd64", 9, 3, 64 },
	{ "hd128", 32, 8, 128 },
};

struct row_stats;

struct result {
	double stream_gbs;
	double stream_end_gbs;       /* STREAM again after the attention runs: shows drift on a shared host */
	/* Decode rows: shape, batch (1, 16), ctx (512, 2048, 8192), block table (sequential, shuffled). */
	struct row_stats *decode[2][2][3][2]; /* NULL: filtered out */
	double prefill_gflops[2][2]; /* shape, k (512, 4096) */
};

static const uint32_t batches[] = { 1, 16 };
static const uint32_t ctxs[] = { 512, 2048, 8192 };
static const uint32_t pre_k[] = { 512, 4096 };
static const char *const orders[] = { "seq", "shuf" };
static int quick;
/* --only decode|prefill: run one half (profiling). */
static const char *only;
/* Bytes one sweep over the decode pool's layers covers: 1 GiB keeps KV out of the caches. */
static uint64_t sweep_bytes = 1ull << 30;
/* --sweep-mb given: the cascade rows sweep it too (by default their pool is one layer, cache-resident). */
static int sweep_given;
/* Tokens per block of the decode and prefill pools (--block-size). */
static uint32_t block_size = 16;
/*
 * Cache dtype of the decode, prefill and cascade pools (--cache-dtype) and the
 * activations' dtype (--act-dtype; default f32 over an f32 or f16 cache,
 * as the model client sends them, bf16 over a bf16 one).
 */
static uint32_t cache_dt = PKV_DTYPE_BF16, act_dt = PKV_DTYPE_BF16;

static const char *const dt_names[] = { [PKV_DTYPE_F32] = "f32", [PKV_DTYPE_F16] = "f16", [PKV_DTYPE_BF16] = "bf16" };

static const char *dt_name(uint32_t dt)
{
	return dt < 3 ? dt_names[dt] : "?";
}

/* 0 and *dt set for "f32", "f16" or "bf16"; -EINVAL otherwise. */
static int dt_from_name(const char *s, uint32_t *dt)
{
	for (uint32_t i = 0; i < 3; i++)
		if (!strcmp(s, dt_names[i])) {
			*dt = i;
			return 0;
		}
	return -EINVAL;
}

/* PKV_BENCH_CPUTIME=1 times with this thread's CPU time: steadier on a busy machine, valid for --threads 1 only. */
static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now(void)
{
	struct timespec ts;

	clock_gettime(bench_clock, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- STREAM read ---- */

typedef uint32_t v16su __attribute__((vector_size(64)));
typedef float v16f __attribute__((vector_size(64)));

/* Each task reads its share of K, then its share of V. */
struct stream_job {
	const char *k, *v;
	size_t bytes;                /* of K, and of V */
	uint32_t n;
	float sums[256];
};

/*
 * The reference a decode kernel is held to: a bf16 sum, i.e. the least work
 * that still reads every bf16 element as a number. Each 64-byte line is 32
 * bf16 values, widened to f32 exactly (even elements shifted up, odd ones
 * masked) and added into 8 independent accumulators. Cloned per ISA and
 * dispatched at run time, so it reads at full vector width (AVX-512, else AVX2).
 */
__attribute__((target_clones("avx512f", "avx2", "default")))
static float sum_bf16_chunk(const char *p, size_t bytes)
{
	v16f a[8] = { { 0 } };
	size_t i;
	int k;

	for (i = 0; i + 256 <= bytes; i += 256)
		for (k = 0; k < 4; k++) {
			v16su x;
			v16f lo, hi;

			memcpy(&x, p + i + 64 * k, 64);
			{
				v16su l = x << 16, h = x & 0xffff0000u;

				memcpy(&lo, &l, 64);
				memcpy(&hi, &h, 64);
			}
			a[2 * k] += lo;
			a[2 * k + 1] += hi;
		}
	for (k = 1; k < 8; k++)
		a[0] += a[k];
	return a[0][0] + a[0][5] + a[0][10] + a[0][15];
}

static void stream_task(void *arg, uint32_t task, uint32_t thread)
{
	struct stream_job *j = arg;
	size_t per = j->bytes / j->n / 4096 * 4096;

	j->sums[task & 255] += sum_bf16_chunk(j->k + per * task, per) + sum_bf16_chunk(j->v + per * task, per);
}

struct bench_pool {
	struct pkv_plugin *plug;
	struct pkv_cache_mem mem;
	const struct shape *sh;
	uint32_t nlayers, bs;
};

/* One timed piece of a sweep: 8 MiB of K and 8 MiB of V, split over the threads. */
#define STREAM_PIECE (8u << 20)

/* Involuntary context switches of the process so far: a sample during which one happened lost a CPU to another job. */
static long preemptions(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_nivcsw;
}

/*
 * Timings of one kind, the ones another job preempted kept apart: on the
 * shared 2-vCPU host a preempted call or piece is another job's time, not
 * the kernel's or the memory's.
 */
#define MAX_SAMPLES 1024
struct samples {
	double kept[MAX_SAMPLES], all[MAX_SAMPLES];
	int nk, na;
};

static void sample_add(struct samples *s, double t, int preempted)
{
	if (s->na < MAX_SAMPLES)
		s->all[s->na++] = t;
	if (!preempted && s->nk < MAX_SAMPLES)
		s->kept[s->nk++] = t;
}

/* Median of the undisturbed samples; of all of them when fewer than 3 were undisturbed. */
static double sample_median(struct samples *s)
{
	if (s->nk >= 3)
		return bench_median(s->kept, s->nk);
	return s->na ? bench_median(s->all, s->na) : 0;
}

/* Bytes one piece reads (each thread's share rounded to 4 KiB pages). */
static size_t piece_bytes(uint32_t threads)
{
	return (size_t)STREAM_PIECE / threads / 4096 * 4096 * threads * 2;
}

/* Times STREAM pieces [first, first + n) of the pool (cyclically) into s. */
static void stream_pieces(const struct pkv_host_api *api, const struct bench_pool *sp, uint32_t threads,
			  size_t first, size_t n, struct samples *s)
{
	size_t npiece = sp->mem.layer_stride * sp->nlayers / STREAM_PIECE, i;

	for (i = first; i < first + n; i++) {
		struct stream_job j = { .k = (const char *)sp->mem.k_base + (i % npiece) * STREAM_PIECE,
					.v = (const char *)sp->mem.v_base + (i % npiece) * STREAM_PIECE,
					.bytes = STREAM_PIECE, .n = threads };
		long p0 = preemptions();
		double t0 = now(), t1;

		api->parallel_for(api->host, threads, stream_task, &j);
		t1 = now();
		sample_add(s, t1 - t0, preemptions() != p0);
	}
}

/*
 * STREAM over a pool's K and V (a pool from the plugin's own cache_alloc),
 * reps sweeps timed piece by piece: the rate is a piece's bytes over the
 * median undisturbed piece time. A decode figure is a median over calls of
 * 0.1-10 ms, which drops the calls another job preempted; a whole-sweep
 * time cannot drop anything, so on a loaded host it read 2-3x below the
 * decode rows (measured at load 11: "200% of STREAM"). Pieces of about a
 * call's length filter the same way.
 */
static double stream_read(const struct pkv_host_api *api, const struct bench_pool *sp, uint32_t threads, int reps)
{
	static struct samples s;
	size_t npiece = sp->mem.layer_stride * sp->nlayers / STREAM_PIECE;
	double t;

	s.nk = s.na = 0;
	stream_pieces(api, sp, threads, 0, npiece * (size_t)reps, &s);
	t = sample_median(&s);
	return t > 0 ? (double)piece_bytes(threads) / t / 1e9 : 0;
}

/* ---- attention batches ---- */

static int pool_open(struct bench_pool *bp, struct pkv_plugin *plug, const struct shape *sh, uint64_t tokens,
		     uint64_t min_bytes, uint32_t dtype)
{
	struct pkv_pool_desc pool = { PKV_BACKEND_ABI_VERSION, sizeof(pool), { 0 }, PKV_DTYPE_BF16 };
	uint64_t layer_bytes;
	size_t l;
	int ret;

	memset(bp, 0, sizeof(*bp));
	bp->plug = plug;
	bp->sh = sh;
	bp->bs = block_size;
	pool.geo.num_heads = sh->nh;
	pool.geo.num_kv_heads = sh->nkv;
	pool.geo.head_dim = sh->hd;
	pool.geo.cache_dtype = dtype;
	pool.geo.block_size = bp->bs;
	pool.geo.num_blocks = (uint32_t)((tokens + bp->bs - 1) / bp->bs + 1);
	layer_bytes = (uint64_t)pool.geo.num_blocks * bp->bs * sh->nkv * sh->hd * 2 * pkv_dtype_size(dtype);
	bp->nlayers = (uint32_t)((min_bytes + layer_bytes - 1) / layer_bytes);
	if (bp->nlayers < 1)
		bp->nlayers = 1;
	pool.geo.num_layers = bp->nlayers;
	bp->mem.abi_version = PKV_BACKEND_ABI_VERSION;
	bp->mem.struct_size = sizeof(bp->mem);
	ret = plug->be->cache_alloc(plug->ctx, &pool, &bp->mem);
	if (ret)
		return ret;
	/*
	 * Touch every page with a harmless pattern (0x3c bytes: ~0.0115 as bf16
	 * or f32, ~1.06 as f16): untouched pages would read as the zero page.
	 */
	for (l = 0; l < bp->nlayers; l++) {
		memset((char *)bp->mem.k_base + l * bp->mem.layer_stride, 0x3c, bp->mem.layer_stride);
		memset((char *)bp->mem.v_base + l * bp->mem.layer_stride, 0x3c, bp->mem.layer_stride);
	}
	return 0;
}

static void pool_close(struct bench_pool *bp)
{
	bp->plug->be->cache_free(bp->plug->ctx, &bp->mem);
}

struct batch_data {
	struct pkv_attn_batch b;
	int32_t *cuq, *cuk, *bt, *cached;
	int64_t *slots;
	uint16_t *q, *kn, *vn, *o;
};

/*
 * nseq sequences, each with sq new tokens after sk - sq cached. Block table:
 * consecutive blocks, or (shuffle) a fixed random permutation of the whole
 * pool's blocks, the layout of a pool after churn: no two neighbouring table
 * entries are neighbours in memory, so no hardware prefetcher follows them.
 */
/* Cascade rows: blocks of a shared leading prefix (every sequence's first shared_blocks table entries). */
static uint32_t shared_blocks;

static int batch_make(struct batch_data *d, const struct bench_pool *bp, uint32_t nseq, uint32_t sq, uint32_t sk,
		      int shuffle)
{
	uint32_t nblk = bp->mem.geo.num_blocks, *perm;
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	const struct shape *sh = bp->sh;
	uint32_t mb = (sk + bp->bs - 1) / bp->bs, s, i, tq = nseq * sq;
	size_t qn = (size_t)tq * sh->nh * sh->hd, kvn = (size_t)tq * sh->nkv * sh->hd;

	memset(d, 0, sizeof(*d));
	d->cuq = calloc(nseq + 1, 4);
	d->cuk = calloc(nseq + 1, 4);
	d->cached = calloc(nseq, 4);
	d->bt = calloc((size_t)nseq * mb, 4);
	d->slots = calloc(tq, 8);
	d->q = malloc(qn * 2);
	d->o = malloc(qn * 2);
	d->kn = malloc(kvn * 2);
	d->vn = malloc(kvn * 2);
	perm = malloc((size_t)nblk * 4);
	if (!d->cuq || !d->cuk || !d->cached || !d->bt || !d->slots || !d->q || !d->o || !d->kn || !d->vn || !perm) {
		free(perm);
		return -ENOMEM;
	}
	for (i = 0; i < nblk; i++)
		perm[i] = i;
	for (i = nblk - 1; shuffle && i > 0; i--) {
		uint32_t j, t;

		rng ^= rng << 13;
		rng ^= rng >> 7;
		rng ^= rng << 17;
		j = (uint32_t)(rng % (i + 1));
		t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	for (i = 0; i < qn; i++)
		d->q[i] = 0x3f80 ^ (uint16_t)((i * 2654435761u) >> 20 & 0x807f); /* ~+-1 with varied mantissas */
	for (i = 0; i < kvn; i++)
		d->kn[i] = d->vn[i] = 0x3c3c;
	for (s = 0; s < nseq; s++) {
		d->cuq[s + 1] = d->cuq[s] + (int32_t)sq;
		d->cuk[s + 1] = d->cuk[s] + (int32_t)sk;
		d->cached[s] = (int32_t)(sk - sq);
		for (i = 0; i < mb; i++)
			d->bt[s * mb + i] = (int32_t)perm[i < shared_blocks ? i : s * mb + i];
		for (i = 0; i < sq; i++) {
			uint32_t pos = sk - sq + i;

			d->slots[s * sq + i] = (int64_t)d->bt[s * mb + pos / bp->bs] * bp->bs + pos % bp->bs;
		}
	}
	free(perm);
	d->b = (struct pkv_attn_batch){
		.abi_version = PKV_BACKEND_ABI_VERSION, .struct_size = sizeof(d->b),
		.num_seqs = nseq, .total_q = tq, .act_dtype = PKV_DTYPE_BF16,
		.q = d->q, .k_new = d->kn, .v_new = d->vn, .o = d->o,
		.q_stride_tok = (int64_t)sh->nh * sh->hd, .q_stride_head = sh->hd,
		.kv_stride_tok = (int64_t)sh->nkv * sh->hd, .kv_stride_head = sh->hd,
		.o_stride_tok = (int64_t)sh->nh * sh->hd, .o_stride_head = sh->hd,
		.cu_seq_lens_q = d->cuq, .cu_seq_lens_k = d->cuk, .max_length_q = sq, .max_length_k = sk,
		.block_tables = d->bt, .max_blocks_per_seq = mb, .cache_seqlens = d->cached,
		.slot_mapping = d->slots, .window_left = -1,
	};
	return 0;
}

static void batch_free(struct batch_data *d)
{
	free(d->cuq);
	free(d->cuk);
	free(d->cached);
	free(d->bt);
	free(d->slots);
	free(d->q);
	free(d->o);
	free(d->kn);
	free(d->vn);
}

static double clock_s(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * Median seconds per call, cycling through the pool's layers. *cpu_share
 * (if set): the process's CPU time over wall time x threads while timing;
 * well below 1 means other work on the shared host took our CPUs (pool
 * workers spin while waiting, so an undisturbed run reads close to 1).
 */
static double time_calls(struct bench_pool *bp, struct batch_data *d, int decode, double budget, int min_reps,
			 uint32_t threads, double *cpu_share)
{
	const struct pkv_backend *be = bp->plug->be;
	double t[512], start = now(), c0, w0;
	int n = 0, ret;
	uint32_t layer = 0;

	for (int w = 0; w < 2; w++) {
		d->b.layer = layer++ % bp->nlayers;
		(decode ? be->attend_decode : be->attend_varlen)(bp->plug->ctx, &bp->mem, &d->b);
	}
	c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
	w0 = clock_s(CLOCK_MONOTONIC);
	while (n < 512 && (n < min_reps || now() - start < budget)) {
		double t0;

		d->b.layer = layer++ % bp->nlayers;
		t0 = now();
		ret = (decode ? be->attend_decode : be->attend_varlen)(bp->plug->ctx, &bp->mem, &d->b);
		t[n++] = now() - t0;
		if (ret) {
			fprintf(stderr, "pkv-bench attn: attend failed: %s\n", strerror(-ret));
			return -1;
		}
	}
	if (cpu_share)
		*cpu_share = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / ((clock_s(CLOCK_MONOTONIC) - w0) * threads);
	return bench_median(t, n);
}

/* What one decode row reports. */
struct row_stats {
	double gbs, stream_gbs;      /* medians over the rounds */
	double us;                   /* the median round's call time: bytes / gbs */
	double of_stream;            /* median over the rounds of each round's gbs / stream_gbs */
	double of_stream_lo, of_stream_hi; /* quartiles of the same: the row's own spread */
	double cpu_share;            /* CPU time the process got / (wall time x threads), whole row */
	double preempted;            /* fraction of calls and pieces another job preempted (dropped) */
	int rounds, clean;           /* rounds taken, of which undisturbed (others: after 2 R attempts) */
};

/* Decode rounds per row (--rounds); see decode_row and docs/performance.md for why these counts. */
#define ROUNDS_FULL 15
#define ROUNDS_QUICK 7
static int decode_rounds;
/* Each round: STREAM pieces (16 MiB each) and decode calls, alternated for at least ROUND_S. */
#define ROUND_S 0.025
#define ROUND_MIN_CALLS 3
#define ROUND_MIN_PIECES 4

/*
 * One decode row as rounds; in each round, STREAM pieces of the reference
 * pool sp (continuing through it) alternate with decode calls (the next
 * layers of bp), and the round's ratio is median call rate / median piece
 * rate. The host's load, and other jobs' memory traffic, change within a
 * second: a reference taken once per row judged the row by another moment's
 * memory (same build, same row: 34% to 80% of STREAM between two --quick
 * runs), and one taken in a block before the row's calls still left round
 * ratios 15-25 points apart. Calls and pieces another job preempted are
 * dropped (sample_median), a round that lost most of them is redone. The
 * row's figure is the median round.
 */
static int decode_row(const struct pkv_host_api *api, const struct bench_pool *sp, struct bench_pool *bp,
		      struct batch_data *d, uint32_t threads, double bytes, struct row_stats *rs)
{
	static struct samples calls, pieces;
	const struct pkv_backend *be = bp->plug->be;
	double gbs[64], st[64], ratio[64], c0, w0;
	static size_t cursor;
	uint32_t layer = 0;
	int r, w, ret, n_all = 0, n_kept = 0, attempts = 0, R = decode_rounds < 64 ? decode_rounds : 64;

	for (w = 0; w < 2; w++) {
		d->b.layer = layer++ % bp->nlayers;
		ret = be->attend_decode(bp->plug->ctx, &bp->mem, &d->b);
		if (ret)
			return ret;
	}
	c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
	w0 = clock_s(CLOCK_MONOTONIC);
	for (r = 0; r < R; attempts++) {
		double start, tc, tp;
		int clean;

		pieces.nk = pieces.na = calls.nk = calls.na = 0;
		start = now();
		/* Piece, call, piece, call...: the two samples see the same moments of the host. */
		while (calls.na < ROUND_MIN_CALLS || pieces.na < ROUND_MIN_PIECES ||
		       (now() - start < ROUND_S && calls.na < MAX_SAMPLES)) {
			long p0;
			double t0;

			if (pieces.na <= calls.na) {
				stream_pieces(api, sp, threads, cursor++, 1, &pieces);
				/* --sweep-mb 0 measures KV from the caches: warm them again after the piece. */
				if (bp->nlayers == 1) {
					ret = be->attend_decode(bp->plug->ctx, &bp->mem, &d->b);
					if (ret)
						return ret;
				}
			}
			p0 = preemptions();
			d->b.layer = layer++ % bp->nlayers;
			t0 = now();
			ret = be->attend_decode(bp->plug->ctx, &bp->mem, &d->b);
			sample_add(&calls, now() - t0, preemptions() != p0);
			if (ret)
				return ret;
		}
		n_all += calls.na + pieces.na;
		n_kept += calls.nk + pieces.nk;
		/*
		 * A round whose calls or pieces were mostly preempted is redone, for
		 * the first 2 R attempts; after those every round counts (3 R at most).
		 */
		clean = calls.nk >= ROUND_MIN_CALLS && 2 * calls.nk >= calls.na && 2 * pieces.nk >= pieces.na;
		if (!clean && attempts < 2 * R)
			continue;
		rs->clean += clean;
		tc = sample_median(&calls);
		tp = sample_median(&pieces);
		gbs[r] = tc > 0 ? bytes / tc / 1e9 : 0;
		st[r] = tp > 0 ? (double)piece_bytes(threads) / tp / 1e9 : 0;
		ratio[r] = st[r] > 0 ? gbs[r] / st[r] : 0;
		r++;
	}
	rs->cpu_share = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / ((clock_s(CLOCK_MONOTONIC) - w0) * threads);
	rs->preempted = n_all ? 1.0 - (double)n_kept / n_all : 0;
	rs->rounds = R;
	rs->gbs = bench_median(gbs, R);
	rs->us = rs->gbs > 0 ? bytes / rs->gbs / 1e3 : 0;
	rs->stream_gbs = bench_median(st, R);
	rs->of_stream = bench_median(ratio, R); /* sorts ratio */
	rs->of_stream_lo = ratio[R / 4];
	rs->of_stream_hi = ratio[(3 * R) / 4 < R ? (3 * R) / 4 : R - 1];
	return 0;
}

/*
 * PKV_BENCH_FILTER: comma-separated key prefixes of the decode rows to run,
 * keys being shape:batch:ctx:table (hd64:1:2048 runs both tables of one
 * configuration, hd128:16:8192:shuf one row); unset runs every row.
 */
static int filter_match(const char *filter, const char *key)
{
	const char *p = filter;

	if (!filter)
		return 1;
	while (*p) {
		size_t n = strcspn(p, ",");

		if (n && n <= strlen(key) && !strncmp(p, key, n))
			return 1;
		p += n + (p[n] == ',');
	}
	return 0;
}

/* Makes a bf16 batch's activations f32 (the same values), as pkv-bench ipc's clients send them. */
static int batch_to_f32(struct batch_data *d, uint32_t B)
{
	size_t nq = (size_t)B * d->b.q_stride_tok, nkv = (size_t)B * d->b.kv_stride_tok;
	float *q = malloc(nq * 4), *o = malloc(nq * 4), *kv = malloc(nkv * 4);

	if (!q || !o || !kv) {
		free(q);
		free(o);
		free(kv);
		return -ENOMEM;
	}
	for (size_t i = 0; i < nq; i++)
		q[i] = pkv_bf16_to_f32(d->q[i]);
	for (size_t i = 0; i < nkv; i++)
		kv[i] = pkv_bf16_to_f32(d->kn[i]);
	free(d->q);
	free(d->o);
	free(d->kn);
	d->q = (uint16_t *)q;
	d->o = (uint16_t *)o;
	d->kn = (uint16_t *)kv;
	d->b.q = q;
	d->b.o = o;
	d->b.k_new = d->b.v_new = kv;
	d->b.act_dtype = PKV_DTYPE_F32;
	return 0;
}

/*
 * --only cascade, first part: what merging B decode sequences with
 * distinct contexts into one call saves, against B calls of one sequence.
 */
static int merge_rows(struct pkv_plugin *pl, uint32_t threads)
{
	static const uint32_t bsz[] = { 2, 8 }, ctxl[] = { 128, 576 };
	int ret = 0;

	for (int a = 0; a < 2 && !ret; a++)
		for (int ci = 0; ci < 2 && !ret; ci++)
			for (int bi = 0; bi < 2 && !ret; bi++) {
				uint32_t B = bsz[bi], sk = ctxl[ci];
				struct bench_pool bp;
				struct batch_data d, d1;
				double t[2][7];
				int k;

				ret = pool_open(&bp, pl, &shapes[0], (uint64_t)B * sk + 512, 0, PKV_DTYPE_BF16);
				if (ret)
					break;
				ret = batch_make(&d, &bp, B, 1, sk, 1);
				if (!ret)
					ret = batch_make(&d1, &bp, 1, 1, sk, 1);
				if (!ret && a)
					ret = batch_to_f32(&d, B);
				if (!ret && a)
					ret = batch_to_f32(&d1, 1);
				for (k = 0; k < 7 && !ret; k++) {
					t[0][k] = time_calls(&bp, &d, 1, quick ? 0.02 : 0.1, 5, threads, NULL);
					t[1][k] = B * time_calls(&bp, &d1, 1, quick ? 0.02 : 0.1, 5, threads, NULL);
					if (t[0][k] < 0 || t[1][k] < 0)
						ret = -EIO;
				}
				batch_free(&d);
				batch_free(&d1);
				pool_close(&bp);
				if (!ret)
					printf("  merge   %-5s act %-4s batch %2u ctx %3u (own contexts): %7.1f us merged, %7.1f us "
					       "as %u calls: %.2fx\n", shapes[0].name, a ? "f32" : "bf16", B, sk,
					       bench_median(t[0], 7) * 1e6, bench_median(t[1], 7) * 1e6, B, bench_median(t[1], 7) / bench_median(t[0], 7));
			}
	return ret;
}

/*
 * --only cascade: decode batches whose sequences share a 512-token prefix
 * (32 blocks, the same ids in every table) and hold 64 tokens of their own,
 * SmolLM2-135M's attention shape, f32 and bf16 activations: median call
 * time with cascade decode (the plugin's default) and with it off
 * (cascade_min_keys=0, a second instance of the plugin), alternated call
 * by call blocks so both see the same machine. The pool is one layer (from
 * the caches) unless --sweep-mb is given. Text only.
 */
static int cascade_rows(const char *plugin, struct pkv_host *host, uint32_t threads)
{
	static const uint32_t bsz[] = { 2, 4, 8, 16 };
	struct pkv_dict_item off_item = { "cascade_min_keys", "0" };
	struct pkv_dict off = { 1, 0, &off_item };
	struct pkv_plugin pl[2];
	char err[512];
	int ret, a, bi, k;

	ret = pkv_plugin_load(plugin, NULL, NULL, NULL, host, &pl[0], err, sizeof(err));
	if (!ret) {
		ret = pkv_plugin_load(plugin, NULL, NULL, &off, host, &pl[1], err, sizeof(err));
		if (ret)
			pkv_plugin_unload(&pl[0]);
	}
	if (ret) {
		fprintf(stderr, "pkv-bench attn: %s\n", err);
		return ret;
	}
	ret = merge_rows(&pl[0], threads);
	/* bf16 activations only over a bf16 cache (--cache-dtype): the model client sends f32 over the others. */
	for (a = cache_dt == PKV_DTYPE_BF16 ? 0 : 1; a < 2 && !ret; a++)
		for (bi = 0; bi < 4 && !ret; bi++) {
			struct bench_pool bp[2];
			struct batch_data d;
			double t[2][7], med[2];
			uint32_t B = bsz[bi], sk = 512 + 64;

			shared_blocks = 512 / block_size;
			ret = pool_open(&bp[0], &pl[0], &shapes[0], (uint64_t)B * sk + 512, sweep_given ? sweep_bytes : 0,
					cache_dt);
			if (ret)
				break;
			/* One cache serves both instances (same plugin, same memory layout). */
			bp[1] = bp[0];
			bp[1].plug = &pl[1];
			ret = batch_make(&d, &bp[0], B, 1, sk, 1);
			if (!ret && a)
				ret = batch_to_f32(&d, B);
			for (k = 0; k < 7 && !ret; k++)
				for (int m = 0; m < 2; m++) {
					t[m][k] = time_calls(&bp[m], &d, 1, quick ? 0.02 : 0.1, 5, threads, NULL);
					if (t[m][k] < 0)
						ret = -EIO;
				}
			shared_blocks = 0;
			batch_free(&d);
			pool_close(&bp[0]);
			if (ret)
				break;
			med[0] = bench_median(t[0], 7);
			med[1] = bench_median(t[1], 7);
			printf("  cascade %-5s cache %-4s act %-4s batch %2u (512 shared + 64 own): %7.1f us cascade, %7.1f us "
			       "off: %.2fx\n", shapes[0].name, dt_name(cache_dt), a ? "f32" : "bf16", B, med[0] * 1e6, med[1] * 1e6, med[1] / med[0]);
		}
	pkv_plugin_unload(&pl[1]);
	pkv_plugin_unload(&pl[0]);
	return ret;
}

static int run_threads(const char *plugin, uint32_t threads, struct result *res, int json)
{
	struct pkv_host *host;
	struct pkv_plugin plug;
	struct bench_pool sp;
	const char *filter = getenv("PKV_BENCH_FILTER");
	char err[512];
	int ret, si, bi, ci, oi, ki;

	ret = pkv_host_create(threads, PKV_LOG_WARN, &host);
	if (ret)
		return ret;
	ret = pkv_plugin_load(plugin, NULL, NULL, NULL, host, &plug, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "pkv-bench attn: %s\n", err);
		pkv_host_destroy(host);
		return ret;
	}
	if (only && !strcmp(only, "cascade")) {
		/* Call times only: no STREAM reference. */
		ret = cascade_rows(plugin, host, threads);
		pkv_plugin_unload(&plug);
		pkv_host_destroy(host);
		return ret;
	}
	/* The reference buffer: 1 GiB of K+V from the plugin's cache_alloc, the decode pools' kind of memory. */
	ret = pool_open(&sp, &plug, &shapes[1], STREAM_BYTES / (2 * 2048) - 16, 0, PKV_DTYPE_BF16);
	if (ret) {
		pkv_plugin_unload(&plug);
		pkv_host_destroy(host);
		return ret;
	}
	res->stream_gbs = stream_read(pkv_host_api(host), &sp, threads, quick ? 3 : 9);
	if (!json)
		printf("threads %u: STREAM (bf16 sum) read %.1f GB/s\n", threads, res->stream_gbs);

	for (si = 0; si < 2 && !(only && strcmp(only, "decode")); si++)
		for (bi = 0; bi < 2; bi++)
			for (ci = 0; ci < 3; ci++)
			for (oi = 0; oi < 2; oi++) {
				const struct shape *sh = &shapes[si];
				struct bench_pool bp;
				struct batch_data d;
				uint32_t B = batches[bi], ctx = ctxs[ci];
				double bytes = (double)B * ctx * sh->nkv * sh->hd * 2 * pkv_dtype_size(cache_dt);
				char key[64];

				snprintf(key, sizeof(key), "%s:%u:%u:%s", sh->name, B, ctx, orders[oi]);
				if (!filter_match(filter, key))
					continue;

				ret = pool_open(&bp, &plug, sh, (uint64_t)B * (ctx + 16), sweep_bytes, cache_dt);
				if (ret)
					goto out;
				ret = batch_make(&d, &bp, B, 1, ctx, oi);
				if (!ret && act_dt == PKV_DTYPE_F32)
					ret = batch_to_f32(&d, B);
				if (!ret) {
					struct row_stats *rs = calloc(1, sizeof(*rs));

					res->decode[si][bi][ci][oi] = rs;
					ret = rs ? decode_row(pkv_host_api(host), &sp, &bp, &d, threads, bytes, rs) : -ENOMEM;
					if (!ret && !json)
						printf("  decode  %-5s batch %2u ctx %4u %-4s: %7.1f us %6.1f GB/s, %3.0f%% of STREAM %.1f "
						       "(rounds %d clean %d, quartiles %.0f-%.0f%%) cpu %.2f preempted %.2f\n",
						       sh->name, B, ctx, orders[oi], rs->us, rs->gbs, 100 * rs->of_stream, rs->stream_gbs,
						       rs->rounds, rs->clean, 100 * rs->of_stream_lo, 100 * rs->of_stream_hi, rs->cpu_share,
						       rs->preempted);
				}
				batch_free(&d);
				pool_close(&bp);
				if (ret)
					goto out;
			}
	for (si = 0; si < 2 && !(only && strcmp(only, "prefill")); si++)
		for (ki = 0; ki < 2; ki++) {
			const struct shape *sh = &shapes[si];
			struct bench_pool bp;
			struct batch_data d;
			uint32_t sq = 512, sk = pre_k[ki];
			double pairs = 0, sec;
			uint32_t i;

			for (i = 0; i < sq; i++)
				pairs += (double)(i + (sk - sq) + 1);
			ret = pool_open(&bp, &plug, sh, sk + 16, 0, cache_dt);
			if (ret)
				goto out;
			ret = batch_make(&d, &bp, 1, sq, sk, 0);
			if (!ret && act_dt == PKV_DTYPE_F32)
				ret = batch_to_f32(&d, sq);
			if (!ret) {
				sec = time_calls(&bp, &d, 0, quick ? 0.2 : 1.5, quick ? 2 : 5, threads, NULL);
				res->prefill_gflops[si][ki] = sec > 0 ? 4.0 * sh->hd * sh->nh * pairs / sec / 1e9 : 0;
				if (!json)
					printf("  prefill %-5s q 512 k %4u: %6.1f GFLOP/s\n", sh->name, sk,
					       res->prefill_gflops[si][ki]);
			}
			batch_free(&d);
			pool_close(&bp);
			if (ret)
				goto out;
		}
	res->stream_end_gbs = stream_read(pkv_host_api(host), &sp, threads, quick ? 3 : 9);
	if (!json)
		printf("threads %u: STREAM read at the end %.1f GB/s\n", threads, res->stream_end_gbs);
out:
	pool_close(&sp);
	pkv_plugin_unload(&plug);
	pkv_host_destroy(host);
	return ret;
}

static void print_json_body(const struct result *r, uint32_t threads)
{
	int si, bi, ci, oi, ki, first = 1;

	printf("\"threads\": %u, \"stream_read_gbs\": %.2f, \"stream_read_end_gbs\": %.2f, \"decode_gbs\": [", threads,
	       r->stream_gbs, r->stream_end_gbs);
	for (si = 0; si < 2 && !(only && strcmp(only, "decode")); si++)
		for (bi = 0; bi < 2; bi++)
			for (ci = 0; ci < 3; ci++)
				for (oi = 0; oi < 2; oi++) {
					const struct row_stats *rs = r->decode[si][bi][ci][oi];

					if (!rs)
						continue; /* filtered out */
					printf("%s{\"shape\": \"%s\", \"batch\": %u, \"ctx\": %u, \"table\": \"%s\", "
					       "\"us\": %.2f, \"gbs\": %.2f, \"stream_gbs\": %.2f, \"of_stream\": %.3f, "
					       "\"of_stream_q1\": %.3f, \"of_stream_q3\": %.3f, \"rounds\": %d, \"clean_rounds\": %d, "
					       "\"cpu_share\": %.2f, \"preempted\": %.2f}",
					       first ? "" : ", ", shapes[si].name, batches[bi], ctxs[ci], orders[oi], rs->us, rs->gbs,
					       rs->stream_gbs, rs->of_stream, rs->of_stream_lo, rs->of_stream_hi, rs->rounds, rs->clean,
					       rs->cpu_share, rs->preempted);
					first = 0;
				}
	printf("], \"prefill_gflops\": [");
	first = 1;
	for (si = 0; si < 2; si++)
		for (ki = 0; ki < 2; ki++) {
			printf("%s{\"shape\": \"%s\", \"q\": 512, \"k\": %u, \"gflops\": %.1f}", first ? "" : ", ",
			       shapes[si].name, pre_k[ki], r->prefill_gflops[si][ki]);
			first = 0;
		}
	printf("]");
}

/* The CPU plugin of the build tree when run from it, else the installed one. */
static const char *default_plugin(const char *argv0)
{
	static char path[PATH_MAX];
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n > 0) {
		self[n] = '\0';
		/* build/src/tools/pkv-bench-attn -> build/plugins/cpu/.libs (no libtool wrapper: static loader). */
		snprintf(path, sizeof(path), "%s/../../plugins/cpu/.libs/pkv_cpu.so", dirname(self));
		if (access(path, R_OK) == 0)
			return path;
	}
	return "cpu";
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "threads", required_argument, NULL, 't' },
		{ "plugin", required_argument, NULL, 'p' },
		{ "quick", no_argument, NULL, 'q' },
		{ "sweep-mb", required_argument, NULL, 's' },
		{ "only", required_argument, NULL, 'o' },
		{ "block-size", required_argument, NULL, 'b' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "cache-dtype", required_argument, NULL, 'C' },
		{ "act-dtype", required_argument, NULL, 'A' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *plugin = NULL;
	struct result res[2] = { 0 };
	uint32_t tl[2], nt = 0, i;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int json = 0, threads = 0, c, ret = 0, act_set = 0;

	while ((c = getopt_long(argc, argv, "jt:p:qs:o:b:r:h", opts, NULL)) != -1) {
		switch (c) {
		case 'j': json = 1; break;
		case 't': threads = atoi(optarg); break;
		case 'p': plugin = optarg; break;
		case 'q': quick = 1; break;
		case 'o': only = optarg; break;
		case 'b': block_size = (uint32_t)atoi(optarg); break;
		case 'r': decode_rounds = atoi(optarg); break;
		case 's':
			sweep_bytes = strtoull(optarg, NULL, 10) << 20;
			sweep_given = 1;
			break;
		case 'C':
			if (dt_from_name(optarg, &cache_dt)) {
				fprintf(stderr, "pkv-bench attn: --cache-dtype must be f32, f16 or bf16\n");
				return 2;
			}
			break;
		case 'A':
			act_set = 1;
			if (dt_from_name(optarg, &act_dt) || act_dt == PKV_DTYPE_F16) {
				fprintf(stderr, "pkv-bench attn: --act-dtype must be f32 or bf16\n");
				return 2;
			}
			break;
		case 'h':
			printf("usage: pkv-bench attn [--json] [--threads N] [--plugin PATH|NAME] [--quick] [--sweep-mb MB] [--only decode|prefill|cascade] [--block-size N] [--rounds N] [--cache-dtype f32|f16|bf16] [--act-dtype f32|bf16]\n"
			       "  --cache-dtype: the decode, prefill and cascade pools' dtype (default bf16); --act-dtype: the queries' (default\n"
			       "    bf16 over a bf16 cache, else f32, as the model client); figures are cache bytes read / call time\n"
			       "  --only cascade: shared-prefix decode batches, cascade on vs off (text only; f32 and bf16\n"
			       "    activations over a bf16 cache, f32 over the others)\n"
			       "  --rounds: STREAM/decode rounds per decode row (default %d, --quick %d)\n"
			       "  default: 1 thread and all %ld CPUs; --threads N measures only N\n"
			       "  --sweep-mb: decode pool size swept (default 1024; 0 = one layer, cache-resident); the cascade\n"
			       "    rows sweep it only when given\n",
			       ROUNDS_FULL, ROUNDS_QUICK, ncpu);
			return 0;
		default:
			return 2;
		}
	}
	if (!act_set)
		act_dt = cache_dt == PKV_DTYPE_BF16 ? PKV_DTYPE_BF16 : PKV_DTYPE_F32;
	if (!decode_rounds)
		decode_rounds = quick ? ROUNDS_QUICK : ROUNDS_FULL;
	if (decode_rounds < 1 || decode_rounds > 64) {
		fprintf(stderr, "pkv-bench attn: --rounds must be 1..64\n");
		return 2;
	}
	if (block_size < 1 || block_size > 4096) {
		fprintf(stderr, "pkv-bench attn: --block-size must be 1..4096\n");
		return 2;
	}
	if (threads < 0 || threads > 256) {
		fprintf(stderr, "pkv-bench attn: --threads must be 1..256\n");
		return 2;
	}
	if (!plugin)
		plugin = default_plugin(argv[0]);
	if (getenv("PKV_BENCH_CPUTIME") && threads == 1)
		bench_clock = CLOCK_THREAD_CPUTIME_ID;
	if (threads) {
		tl[nt++] = (uint32_t)threads;
	} else {
		tl[nt++] = 1;
		if (ncpu > 1)
			tl[nt++] = (uint32_t)ncpu;
	}
	if (!json)
		printf("pkv-bench attn: plugin %s, %s cache, %s activations, block size %u, medians\n", plugin,
		       dt_name(cache_dt), dt_name(act_dt), block_size);
	for (i = 0; i < nt && !ret; i++)
		ret = run_threads(plugin, tl[i], &res[i], json);
	if (ret) {
		fprintf(stderr, "pkv-bench attn: failed: %s\n", strerror(-ret));
		return 1;
	}
	if (json) {
		/* Top level: the run with the most threads; the 1-thread run, if any, nested. */
		printf("{\"bench\": \"attn\", \"block_size\": %u, \"cache_dtype\": \"%s\", \"act_dtype\": \"%s\", ", block_size,
		       dt_name(cache_dt), dt_name(act_dt));
		print_json_body(&res[nt - 1], tl[nt - 1]);
		if (nt > 1) {
			printf(", \"single_thread\": {");
			print_json_body(&res[0], tl[0]);
			printf("}");
		}
		printf("}\n");
	}
	for (i = 0; i < nt; i++)
		for (c = 0; c < 24; c++)
			free((&res[i].decode[0][0][0][0])[c]);
	return 0;
}
