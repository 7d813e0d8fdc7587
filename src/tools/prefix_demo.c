/* SPDX-License-Identifier: MIT */
/* Prefix-sharing demo: N chat sessions with one system prompt, run through the cache manager. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cache/cache.h"

/*
 * Every session is: the shared system prompt, its own question, then some
 * generated tokens (fake ids: no model runs here, only the cache manager's
 * bookkeeping). The same workload runs twice, once with sharing and once
 * with a different cache salt per session, which is exactly "no sharing".
 */

#define MAX_SESSIONS 256
#define OWNER 1

struct opts {
	uint32_t sessions, system, question, gen, block;
};

struct result {
	uint32_t peak_blocks;
	uint64_t prompt_tokens, hit_tokens;
	uint32_t hit[MAX_SESSIONS], len[MAX_SESSIONS];
};

static void fill(int32_t *t, uint32_t n, uint32_t seed)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = (int32_t)((seed * 2654435761u + i * 7919u) % 32000u);
}

static int step(struct pkv_cache *c, struct pkv_step_req *r, uint32_t n, struct result *res)
{
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct pkv_cache_stats s;
	int err = pkv_cache_step_begin(c, OWNER, r, n, &st, &m);

	if (err)
		return err;
	/* A real client would run attend() for every layer here, between begin and commit;
	 * the cache commits only a step whose every layer was attended. */
	for (uint32_t l = 0; l < pkv_cache_geometry(c)->num_layers; l++)
		pkv_cache_step_layer_done(st, l);
	err = pkv_cache_step_commit(c, st);
	pkv_cache_stats(c, &s);
	if (s.in_use_blocks > res->peak_blocks)
		res->peak_blocks = s.in_use_blocks;
	return err;
}

static int run(const struct opts *o, const struct pkv_geometry *g, int share, struct result *res)
{
	uint32_t n = o->sessions, plen = o->system + o->question, seq[MAX_SESSIONS];
	int32_t *prompt = calloc((size_t)n * plen, sizeof(int32_t));
	int32_t *gen = calloc((size_t)n, sizeof(int32_t));
	struct pkv_step_req r[MAX_SESSIONS];
	struct pkv_cache *c = NULL;
	int err = -ENOMEM;

	memset(res, 0, sizeof(*res));
	if (!prompt || !gen)
		goto out;
	err = pkv_cache_create(g, NULL, &c);
	if (err)
		goto out;
	for (uint32_t i = 0; i < n; i++) {
		int32_t *p = prompt + (size_t)i * plen;
		char salt[24];
		struct pkv_key ns;
		uint32_t nc;

		fill(p, o->system, 1);                       /* the shared system prompt */
		fill(p + o->system, o->question, 100 + i);   /* this session's question */
		snprintf(salt, sizeof(salt), "session%u", i);
		ns = pkv_namespace(0x5eed, g, 1000, share ? NULL : salt, share ? 0 : strlen(salt));
		/*
		 * Sessions arrive one after another: each opens (hitting what earlier
		 * sessions published) and prefills the rest of its prompt.
		 */
		err = pkv_cache_seq_open(c, OWNER, ns, p, plen, &seq[i], &nc);
		if (err)
			goto out;
		res->hit[i] = nc;
		res->hit_tokens += nc;
		res->prompt_tokens += plen;
		r[0] = (struct pkv_step_req){ seq[i], plen - nc, p + nc };
		err = step(c, r, 1, res);
		if (err)
			goto out;
	}
	/* Then they all generate together: batched decode steps, one token per session. */
	for (uint32_t t = 0; t < o->gen; t++) {
		for (uint32_t i = 0; i < n; i++) {
			gen[i] = (int32_t)(20000 + t * 7 + i);
			r[i] = (struct pkv_step_req){ seq[i], 1, &gen[i] };
		}
		err = step(c, r, n, res);
		if (err)
			goto out;
	}
	for (uint32_t i = 0; i < n; i++)
		res->len[i] = (uint32_t)pkv_cache_seq_len(c, OWNER, seq[i]);
	err = pkv_cache_audit(c, NULL, 0) ? -EIO : 0;
out:
	pkv_cache_destroy(c);
	free(prompt);
	free(gen);
	return err;
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	if (!*s || *end || v < lo || v > hi)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: pkv-prefix-demo [-n SESSIONS] [-s SYSTEM_TOKENS] [-q QUESTION_TOKENS]\n"
		   "                       [-g GENERATED_TOKENS] [-b BLOCK_SIZE]\n"
		   "Runs N chat sessions that share one system prompt through pagedkv's cache\n"
		   "manager and shows how many KV blocks they use with and without prefix sharing.\n");
}

int main(int argc, char **argv)
{
	struct opts o = { 8, 500, 40, 32, 16 };
	struct pkv_geometry g = { 32, 32, 8, 128, PKV_DTYPE_BF16, 16, 0 };
	struct result with, without;
	double block_mib;
	int ch, err;

	while ((ch = getopt(argc, argv, "n:s:q:g:b:h")) != -1) {
		int bad = 0;

		switch (ch) {
		case 'n': bad = parse_u32(optarg, 1, MAX_SESSIONS, &o.sessions); break;
		case 's': bad = parse_u32(optarg, 1, 100000, &o.system); break;
		case 'q': bad = parse_u32(optarg, 1, 100000, &o.question); break;
		case 'g': bad = parse_u32(optarg, 0, 100000, &o.gen); break;
		case 'b': bad = parse_u32(optarg, 1, 1024, &o.block); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
		if (bad) {
			fprintf(stderr, "pkv-prefix-demo: bad value for -%c: %s\n", ch, optarg);
			return 2;
		}
	}
	g.block_size = o.block;
	/* Room for every session unshared, so both runs see the same pool. */
	g.num_blocks = o.sessions * ((o.system + o.question + o.gen + o.block - 1) / o.block + 1);
	block_mib = 2.0 * g.num_layers * g.num_kv_heads * g.head_dim * 2 * g.block_size / (1 << 20);
	if ((err = run(&o, &g, 1, &with)) || (err = run(&o, &g, 0, &without))) {
		fprintf(stderr, "pkv-prefix-demo: cache error: %s\n", strerror(-err));
		return 1;
	}

	printf("pagedkv prefix sharing: %u chat sessions, one %u-token system prompt,\n"
	       "a %u-token question each, %u generated tokens each; %u-token blocks\n"
	       "(KV of a 32-layer, 8-KV-head, 128-dim bf16 model: %.1f MiB per block)\n\n",
	       o.sessions, o.system, o.question, o.gen, o.block, block_mib);
	printf("  session  prompt  prefix hit  length\n");
	for (uint32_t i = 0; i < o.sessions; i++)
		printf("  %7u  %6u  %10u  %6u\n", i + 1, o.system + o.question, with.hit[i], with.len[i]);
	printf("\n  prefix-hit tokens: %llu of %llu prompt tokens (%.0f%%) were not recomputed\n",
	       (unsigned long long)with.hit_tokens, (unsigned long long)with.prompt_tokens,
	       100.0 * (double)with.hit_tokens / (double)with.prompt_tokens);
	printf("  KV blocks in use:  %u with sharing, %u without (%.0f%% fewer, %.0f MiB instead of %.0f MiB)\n",
	       with.peak_blocks, without.peak_blocks,
	       100.0 * (1.0 - (double)with.peak_blocks / (double)without.peak_blocks),
	       with.peak_blocks * block_mib, without.peak_blocks * block_mib);
	return 0;
}
