/* SPDX-License-Identifier: MIT */
/* pkv-bench cache: ns/op of block alloc+free and of step reserve+commit, and prefix lookup throughput. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cache/cache_int.h"
#include "common/clock.h"
#include "bench_stats.h"

#define BLOCK 16
#define PROMPT 1000
#define POOL 65536

/* Commits as the daemon does once every layer's attend ran (there is no backend here). */
static int commit(struct pkv_cache *c, struct pkv_step *st)
{
	for (uint32_t l = 0; l < pkv_cache_geometry(c)->num_layers; l++)
		pkv_cache_step_layer_done(st, l);
	return pkv_cache_step_commit(c, st);
}

static struct pkv_cache *make_cache(void)
{
	struct pkv_geometry g = { 32, 32, 8, 128, PKV_DTYPE_BF16, BLOCK, POOL };
	struct pkv_cache *c;

	if (pkv_cache_create(&g, NULL, &c))
		return NULL;
	return c;
}

static void prompt(int32_t *t, uint32_t n, uint32_t seed)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = (int32_t)((seed * 2654435761u + i * 40503u) % 128000u);
}

/* ns per alloc+free pair: 64 allocations then 64 frees, so the free list really moves. */
static double bench_alloc_free(struct pkv_cache *c)
{
	enum { BATCH = 64, ROUNDS = 20000 };
	int32_t b[BATCH];
	double t0 = (double)pkv_now_ns();

	for (int r = 0; r < ROUNDS; r++) {
		for (int i = 0; i < BATCH; i++)
			b[i] = pkv_blk_alloc(c);
		for (int i = BATCH; i-- > 0;)
			pkv_blk_decref(c, b[i]);
	}
	return ((double)pkv_now_ns() - t0) / ((double)ROUNDS * BATCH);
}

/* Reference for the same pattern: malloc/free of a 64-byte object. */
static double bench_malloc_free(void)
{
	enum { BATCH = 64, ROUNDS = 20000 };
	void *volatile p[BATCH];
	double t0 = (double)pkv_now_ns();

	for (int r = 0; r < ROUNDS; r++) {
		for (int i = 0; i < BATCH; i++)
			p[i] = malloc(64);
		for (int i = BATCH; i-- > 0;)
			free(p[i]);
	}
	return ((double)pkv_now_ns() - t0) / ((double)ROUNDS * BATCH);
}

/*
 * ns per token of begin+commit. Decode: 64 sequences, one token each per
 * step, with block boundaries crossed (and blocks published) as they grow.
 * Prefill: one 512-token step. Sequences are reset by truncate between runs.
 */
static double bench_step(struct pkv_cache *c, int decode)
{
	enum { NSEQ = 64, STEPS = 256, PREFILL = 512 };
	uint32_t seq[NSEQ], nc;
	struct pkv_step_req req[NSEQ];
	int32_t tok[PREFILL];
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct pkv_key ns = pkv_namespace(1, pkv_cache_geometry(c), 1000, "bench", 5);
	double t = 0, t0;
	uint64_t tokens = 0;
	int n = decode ? NSEQ : 8;

	for (int i = 0; i < n; i++) {
		prompt(tok, PREFILL, 900000 + (uint32_t)i + (decode ? 0 : 100));
		if (pkv_cache_seq_open(c, 1, ns, tok, PREFILL, &seq[i], &nc))
			return -1;
	}
	for (int rep = 0; rep < 8; rep++) {
		for (int i = 0; i < n; i++)
			pkv_cache_seq_truncate(c, 1, seq[i], 0);
		pkv_cache_flush(c);
		t0 = (double)pkv_now_ns();
		if (decode) {
			for (int s = 0; s < STEPS; s++) {
				for (int i = 0; i < NSEQ; i++) {
					tok[i] = s * 31 + i;
					req[i] = (struct pkv_step_req){ seq[i], 1, &tok[i] };
				}
				if (pkv_cache_step_begin(c, 1, req, NSEQ, &st, &m) || commit(c, st))
					return -1;
			}
			tokens += (uint64_t)STEPS * NSEQ;
		} else {
			for (int i = 0; i < n; i++) {
				prompt(tok, PREFILL, 800000 + (uint32_t)(rep * n + i));
				req[0] = (struct pkv_step_req){ seq[i], PREFILL, tok };
				if (pkv_cache_step_begin(c, 1, req, 1, &st, &m) || commit(c, st))
					return -1;
			}
			tokens += (uint64_t)n * PREFILL;
		}
		t += (double)pkv_now_ns() - t0;
	}
	for (int i = 0; i < n; i++)
		pkv_cache_seq_close(c, 1, seq[i]);
	return t / (double)tokens;
}

/* Tokens per second of seq_open (+ its close) on a 1000-token prompt, all cached or none. */
static double bench_lookup(struct pkv_cache *c, int hit)
{
	enum { ITERS = 2000 };
	static int32_t tok[ITERS][PROMPT];
	struct pkv_key ns = pkv_namespace(1, pkv_cache_geometry(c), 1000, NULL, 0);
	uint32_t s, nc;
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct pkv_step_req r;
	double t0;

	for (int i = 0; i < ITERS; i++)
		prompt(tok[i], PROMPT, hit ? 7 : 1000 + (uint32_t)i + (uint32_t)rand());
	if (hit) {
		if (pkv_cache_seq_open(c, 2, ns, tok[0], PROMPT, &s, &nc))
			return -1;
		r = (struct pkv_step_req){ s, PROMPT - nc, tok[0] + nc };
		if (r.n_new && (pkv_cache_step_begin(c, 2, &r, 1, &st, &m) || commit(c, st)))
			return -1;
		pkv_cache_seq_close(c, 2, s);
	}
	t0 = (double)pkv_now_ns();
	for (int i = 0; i < ITERS; i++) {
		if (pkv_cache_seq_open(c, 2, ns, tok[i], PROMPT, &s, &nc))
			return -1;
		if (hit && nc != PROMPT / BLOCK * BLOCK - (PROMPT % BLOCK ? 0 : BLOCK))
			return -1;
		pkv_cache_seq_close(c, 2, s);
	}
	return (double)ITERS * PROMPT / (((double)pkv_now_ns() - t0) / 1e9);
}

/* Reference: XXH3-128 over the same 1000 tokens, one 16-token block at a time, nothing else. */
static double bench_hash_only(void)
{
	enum { ITERS = 2000 };
	int32_t tok[PROMPT];
	struct pkv_key k = { 1, 2 }, ns = { 3, 4 };
	double t0;

	prompt(tok, PROMPT, 7);
	t0 = (double)pkv_now_ns();
	for (int i = 0; i < ITERS; i++) {
		tok[0] = i;   /* a different prompt each time, so nothing can be hoisted */
		for (int b = 0; b + BLOCK <= PROMPT; b += BLOCK)
			k = pkv_block_key(k, ns, tok + b, BLOCK);
		__asm__ volatile("" : : "r"(k.lo), "r"(k.hi) : "memory");
	}
	return (double)ITERS * PROMPT / (((double)pkv_now_ns() - t0) / 1e9);
}

int main(int argc, char **argv)
{
	int json = 0, reps = 7;
	double af[32], mf[32], sd[32], sp[32], lh[32], lm[32], ho[32];
	struct pkv_cache *c;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
			reps = atoi(argv[++i]);
			if (reps < 1 || reps > 32) {
				fprintf(stderr, "pkv-bench cache: --reps takes 1..32\n");
				return 2;
			}
		} else {
			fprintf(argv[i][2] == 'h' ? stdout : stderr,
				"usage: pkv-bench cache [--json] [--reps N]\n"
				"  block alloc+free ns, step begin+commit ns/token (decode batch of 64,\n"
				"  and one 512-token prefill), seq_open lookup tokens/s on a 1000-token\n"
				"  prompt (hit and miss); medians of N repetitions (default 7).\n");
			return strcmp(argv[i], "--help") ? 2 : 0;
		}
	}
	c = make_cache();
	if (!c) {
		fprintf(stderr, "pkv-bench cache: cannot create the cache\n");
		return 1;
	}
	for (int r = 0; r < reps; r++) {
		af[r] = bench_alloc_free(c);
		mf[r] = bench_malloc_free();
		sd[r] = bench_step(c, 1);
		sp[r] = bench_step(c, 0);
		lh[r] = bench_lookup(c, 1);
		lm[r] = bench_lookup(c, 0);
		ho[r] = bench_hash_only();
		pkv_cache_flush(c);
		if (sd[r] < 0 || sp[r] < 0 || lh[r] < 0 || lm[r] < 0) {
			fprintf(stderr, "pkv-bench cache: a cache call failed during the run\n");
			pkv_cache_destroy(c);
			return 1;
		}
	}
	{
		double a = bench_median(af, reps), m = bench_median(mf, reps), s = bench_median(sd, reps);
		double p = bench_median(sp, reps), h = bench_median(lh, reps), x = bench_median(lm, reps);
		double o = bench_median(ho, reps);

		if (json) {
			printf("{\"alloc_free_ns\": %.2f, \"step_ns_per_token\": %.2f, "
			       "\"step_prefill_ns_per_token\": %.2f, \"lookup_hit_tokens_per_s\": %.0f, "
			       "\"lookup_miss_tokens_per_s\": %.0f, \"ref_malloc_free_ns\": %.2f, "
			       "\"ref_hash_only_tokens_per_s\": %.0f, \"reps\": %d}\n",
			       a, s, p, h, x, m, o, reps);
		} else {
			printf("pkv-bench cache: medians of %d repetitions (pool of %d blocks of %d tokens)\n",
			       reps, POOL, BLOCK);
			printf("  block alloc+free          %8.2f ns     (malloc+free 64 B: %.2f ns, %.1fx)\n",
			       a, m, m / a);
			printf("  step begin+commit, decode %8.2f ns/token (batch of 64, 1 token each)\n", s);
			printf("  step begin+commit, prefill%8.2f ns/token (one 512-token step)\n", p);
			printf("  seq_open hit  (1000 tok)  %8.1f M tokens/s (hashing alone: %.1f M/s, %.2fx)\n",
			       h / 1e6, o / 1e6, h / o);
			printf("  seq_open miss (1000 tok)  %8.1f M tokens/s\n", x / 1e6);
		}
	}
	pkv_cache_destroy(c);
	return 0;
}
