/* SPDX-License-Identifier: MIT */
/* Helpers shared by the cache manager's test programs: small pools, prompts, prefills, snapshots. */
#ifndef PKV_TEST_CACHE_HELPERS_H
#define PKV_TEST_CACHE_HELPERS_H

#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "cache/cache.h"
#include "../suite_main.h"

#define BS 16

static inline struct pkv_geometry test_geom(uint32_t num_blocks)
{
	return (struct pkv_geometry){ .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
				      .head_dim = 8, .cache_dtype = PKV_DTYPE_F16,
				      .block_size = BS, .num_blocks = num_blocks };
}

static inline struct pkv_cache *test_cache(uint32_t num_blocks)
{
	struct pkv_geometry g = test_geom(num_blocks);
	struct pkv_cache *c = NULL;

	ck_assert_int_eq(pkv_cache_create(&g, NULL, &c), 0);
	return c;
}

static inline struct pkv_key test_ns(uint32_t uid)
{
	struct pkv_geometry g = test_geom(64);

	return pkv_namespace(42, &g, uid, NULL, 0);
}

/* Fills t[0..n) with a prompt: the same seed gives the same tokens. */
static inline void test_prompt(int32_t *t, uint32_t n, uint32_t seed)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = (int32_t)((seed * 7919u + i * 31u) % 50000u);
}

static inline void test_audit_clean(const struct pkv_cache *c)
{
	char why[512];
	int n = pkv_cache_audit(c, why, sizeof(why));

	ck_assert_msg(n == 0, "audit: %d problems: %s", n, why);
}

/*
 * Commits a step as the daemon does after a backend ran: every layer's attend
 * is recorded first (these tests have no backend; commit refuses a step with
 * an unattended layer).
 */
static inline int test_commit(struct pkv_cache *c, struct pkv_step *st)
{
	for (uint32_t l = 0; l < pkv_cache_geometry(c)->num_layers; l++)
		pkv_cache_step_layer_done(st, l);
	return pkv_cache_step_commit(c, st);
}

/* Runs one step of n tokens for seq and commits it. */
static inline void test_append(struct pkv_cache *c, uint32_t owner, uint32_t seq,
			       const int32_t *tokens, uint32_t n)
{
	struct pkv_step_req r = { seq, n, tokens };
	struct pkv_step *st;
	struct pkv_step_meta m;

	ck_assert_int_eq(pkv_cache_step_begin(c, owner, &r, 1, &st, &m), 0);
	ck_assert_int_eq(test_commit(c, st), 0);
}

/* Opens a sequence on tokens and prefills what was not cached; returns the handle. */
static inline uint32_t test_prefill(struct pkv_cache *c, uint32_t owner, struct pkv_key ns,
				    const int32_t *tokens, uint32_t n, uint32_t *n_cached)
{
	uint32_t seq, nc;

	ck_assert_int_eq(pkv_cache_seq_open(c, owner, ns, tokens, n, &seq, &nc), 0);
	if (n > nc)
		test_append(c, owner, seq, tokens + nc, n - nc);
	if (n_cached)
		*n_cached = nc;
	return seq;
}

/* Everything observable about a cache, to show that a failing call changed nothing. */
struct test_snap {
	struct pkv_cache_stats st;
	struct pkv_owner_usage u;
	int audit;
};

static inline struct test_snap test_snapshot(const struct pkv_cache *c, uint32_t owner)
{
	struct test_snap s;

	memset(&s, 0, sizeof(s));
	pkv_cache_stats(c, &s.st);
	pkv_cache_owner_usage(c, owner, &s.u);
	s.audit = pkv_cache_audit(c, NULL, 0);
	return s;
}

static inline void test_same(const struct test_snap *a, const struct test_snap *b)
{
	ck_assert_int_eq(b->audit, 0);
	ck_assert_int_eq(a->audit, b->audit);
	/* Field by field: struct copies need not preserve padding. */
#define SAME(f) ck_assert_msg(a->f == b->f, #f " changed: %llu -> %llu", \
			      (unsigned long long)a->f, (unsigned long long)b->f)
	SAME(st.num_blocks); SAME(st.free_blocks); SAME(st.cached_blocks);
	SAME(st.in_use_blocks); SAME(st.pinned_blocks); SAME(st.open_seqs);
	SAME(st.open_steps); SAME(st.lookup_tokens); SAME(st.hit_tokens);
	SAME(st.evictions); SAME(st.cow_copies);
	SAME(u.seqs); SAME(u.blocks); SAME(u.pin_blocks); SAME(u.steps); SAME(u.max_seqs);
	SAME(u.max_blocks);
#undef SAME
}

static inline int test_run(Suite *s)
{
	return suite_main(s);
}

#endif
