/* SPDX-License-Identifier: MIT */
/* The cache's isolation rules: only attended slots commit, every client-sized buffer is bounded, pins are charged. */
#include "helpers.h"
#include "cache/bounds.h"
#include "cache/cache_int.h"

#define OWN 7u

static struct pkv_cache *cache_layers(uint32_t layers, uint32_t num_blocks)
{
	struct pkv_geometry g = test_geom(num_blocks);
	struct pkv_cache *c = NULL;

	g.num_layers = layers;
	ck_assert_int_eq(pkv_cache_create(&g, NULL, &c), 0);
	return c;
}

/* A step with unattended layers commits nothing and names them; once every layer is in, it commits. */
START_TEST(commit_needs_every_layer)
{
	struct pkv_cache *c = cache_layers(8, 64);
	int32_t t[20];
	uint32_t s, nc;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct test_snap a, b;
	char miss[64];

	test_prompt(t, 20, 1);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 20, &s, &nc), 0);
	r = (struct pkv_step_req){ s, 20, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_uint_eq(pkv_cache_step_missing_layers(c, st, miss, sizeof(miss)), 8);
	ck_assert_str_eq(miss, "0-7");
	pkv_cache_step_layer_done(st, 0);
	pkv_cache_step_layer_done(st, 1);
	pkv_cache_step_layer_done(st, 2);
	pkv_cache_step_layer_done(st, 4);
	ck_assert_uint_eq(pkv_cache_step_missing_layers(c, st, miss, sizeof(miss)), 4);
	ck_assert_str_eq(miss, "3,5-7");
	a = test_snapshot(c, OWN);
	ck_assert_int_eq(pkv_cache_step_commit(c, st), -EINVAL);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s), 0);
	for (uint32_t l = 0; l < 8; l++)
		pkv_cache_step_layer_done(st, l);
	ck_assert_uint_eq(pkv_cache_step_missing_layers(c, st, miss, sizeof(miss)), 0);
	ck_assert_int_eq(pkv_cache_step_commit(c, st), 0);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s), 20);

	/* A recycled step starts with no layer attended. */
	r = (struct pkv_step_req){ s, 1, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_int_eq(pkv_cache_step_commit(c, st), -EINVAL);
	pkv_cache_step_abort(c, st);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s), 20);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

/*
 * Another owner's blocks come back from the free list with its K/V in them:
 * a step that reserves such a slot and skips its attends can never make it
 * part of the sequence (so a later step never reads it).
 */
START_TEST(reused_block_is_never_committed_unwritten)
{
	struct pkv_cache *c = cache_layers(2, 4);
	int32_t t[64];
	uint32_t a, b, nc;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;

	test_prompt(t, 64, 2);
	a = test_prefill(c, 1, test_ns(1), t, 64, NULL);  /* every block of the pool */
	ck_assert_int_eq(pkv_cache_seq_close(c, 1, a), 0);
	pkv_cache_flush(c);
	ck_assert_int_eq(pkv_cache_seq_open(c, 2, test_ns(2), t, 1, &b, &nc), 0);
	r = (struct pkv_step_req){ b, 1, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, 2, &r, 1, &st, &m), 0);
	pkv_cache_step_layer_done(st, 1);
	ck_assert_int_eq(pkv_cache_step_commit(c, st), -EINVAL);
	pkv_cache_step_abort(c, st);
	ck_assert_int_eq(pkv_cache_seq_len(c, 2, b), 0);
	/* The next step starts at slot 0 again: its attends write before they read. */
	ck_assert_int_eq(pkv_cache_step_begin(c, 2, &r, 1, &st, &m), 0);
	ck_assert_int_eq(m.cache_seqlens[0], 0);
	ck_assert_int_eq(test_commit(c, st), 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

/*
 * Issue 9's shape: one sequence of ~1 M tokens and 2,048 of one token in one
 * step. The dense block table would be 2,049 x 65,536 entries: refused with
 * -E2BIG at once (it used to spin forever growing a uint32_t capacity), and
 * nothing changes.
 */
START_TEST(huge_step_table_is_refused)
{
	struct pkv_geometry g = test_geom(65536 + 4096);
	struct pkv_cache_limits lim = { .max_seqs = 4096, .max_tokens_per_seq = 1u << 20 };
	uint32_t n_long = (1u << 20) - 16, nseq = 2049, *h = calloc(nseq, sizeof(*h)), nc;
	int32_t *t = calloc(n_long, sizeof(*t));
	struct pkv_step_req *r = calloc(nseq, sizeof(*r));
	struct pkv_cache *c = NULL;
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct test_snap a, b;

	ck_assert_ptr_nonnull(h);
	ck_assert_ptr_nonnull(t);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(pkv_cache_create(&g, &lim, &c), 0);
	test_prompt(t, n_long, 3);
	h[0] = test_prefill(c, OWN, test_ns(1), t, n_long, NULL);
	for (uint32_t i = 1; i < nseq; i++) {
		ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t + i, 1, &h[i], &nc), 0);
		test_append(c, OWN, h[i], t + i, 1);
	}
	for (uint32_t i = 0; i < nseq; i++)
		r[i] = (struct pkv_step_req){ h[i], 1, t };
	a = test_snapshot(c, OWN);
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, r, nseq, &st, &m), -E2BIG);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	/* The short ones alone are fine. */
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, r + 1, nseq - 1, &st, &m), 0);
	ck_assert_int_eq(test_commit(c, st), 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
	free(h);
	free(t);
	free(r);
}
END_TEST

/* One large step's buffers are freed when it ends; small ones stay for the next step. */
START_TEST(large_step_buffers_are_not_kept)
{
	struct pkv_cache *c = cache_layers(2, 65536);
	uint32_t n = 300000, s, nc;
	int32_t *t = calloc(n, sizeof(*t));
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;

	ck_assert_ptr_nonnull(t);
	test_prompt(t, n, 4);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 1, &s, &nc), 0);
	r = (struct pkv_step_req){ s, n, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_uint_ge((uint64_t)st->cap_q * sizeof(int64_t), (uint64_t)n * 8);
	ck_assert_int_eq(test_commit(c, st), 0);
	ck_assert_ptr_eq(c->steps_free, st);
	ck_assert_uint_le((uint64_t)st->cap_q * sizeof(int64_t), PKV_STEP_KEEP_BYTES);
	ck_assert_uint_le((uint64_t)st->cap_bt * sizeof(int32_t), PKV_STEP_KEEP_BYTES);
	r = (struct pkv_step_req){ s, 1, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_int_eq(test_commit(c, st), 0);
	ck_assert_uint_gt(st->cap_q, 0);   /* a small step keeps its buffers */
	test_audit_clean(c);
	pkv_cache_destroy(c);
	free(t);
}
END_TEST

/* Tables hold what their sequence uses: a truncate gives capacity back, a fork copies entries only. */
START_TEST(fork_copies_entries_not_capacity)
{
	struct pkv_cache *c = test_cache(4096);
	uint32_t n = 32768, s, k;
	int32_t *t = calloc(n, sizeof(*t));

	ck_assert_ptr_nonnull(t);
	test_prompt(t, n, 5);
	s = test_prefill(c, OWN, test_ns(1), t, n, NULL);
	ck_assert_uint_ge(pkv_seq_get(c, OWN, s)->cap, n / BS);
	ck_assert_int_eq(pkv_cache_seq_truncate(c, OWN, s, 17), 0);
	/* The truncated table gives its capacity back too. */
	ck_assert_uint_le(pkv_seq_get(c, OWN, s)->cap, 256);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN, s, &k), 0);
	ck_assert_uint_le(pkv_seq_get(c, OWN, k)->cap, 8);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, k), 17);
	test_audit_clean(c);
	pkv_cache_destroy(c);
	free(t);
}
END_TEST

/* Pins count against the owner's block limit, with its sequences' references. */
START_TEST(pins_count_against_block_limit)
{
	struct pkv_cache *c = test_cache(64);
	struct pkv_owner_usage u;
	int32_t t[5 * BS + 1];
	uint32_t s, nc;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;

	test_prompt(t, 5 * BS + 1, 6);
	ck_assert_int_eq(pkv_cache_set_owner_limits(c, OWN, 0, 8), 0);
	s = test_prefill(c, OWN, test_ns(1), t, 4 * BS, NULL);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s), 0);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), t, 4 * BS + 1), 4 * BS);
	pkv_cache_owner_usage(c, OWN, &u);
	ck_assert_uint_eq(u.pin_blocks, 4);
	ck_assert_uint_eq(u.blocks, 0);
	/* 4 pinned + 5 new references > 8. */
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(2), t, 1, &s, &nc), 0);
	r = (struct pkv_step_req){ s, 5 * BS, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), -ENOSPC);
	r.n_new = 4 * BS;
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_int_eq(test_commit(c, st), 0);
	/* At the limit: pinning more is refused too. */
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(2), t, 4 * BS + 1), -ENOSPC);
	ck_assert_int_eq(pkv_prefix_unpin(c, OWN, test_ns(1), t, 4 * BS + 1), 4 * BS);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(2), t, 4 * BS + 1), 4 * BS);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

/* Forks share blocks but not tables: an owner's references stop at 8 x num_blocks, limit or not. */
START_TEST(fork_tables_are_bounded)
{
	struct pkv_cache *c = test_cache(64);
	struct pkv_owner_usage u;
	int32_t t[32 * BS];
	uint32_t s, k, forks = 0;
	int r;

	test_prompt(t, 32 * BS, 9);
	s = test_prefill(c, OWN, test_ns(1), t, 32 * BS, NULL);
	while ((r = pkv_cache_seq_fork(c, OWN, s, &k)) == 0)
		forks++;
	ck_assert_int_eq(r, -ENOSPC);
	ck_assert_uint_eq(forks, 64 * PKV_OWNER_REFS_PER_BLOCK / 32 - 1);
	pkv_cache_owner_usage(c, OWN, &u);
	ck_assert_uint_eq(u.block_cap, 64 * PKV_OWNER_REFS_PER_BLOCK);
	ck_assert_uint_le(u.blocks, u.block_cap);
	/* Another owner is not affected. */
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN + 1, test_ns(1), t, 32 * BS, &k, NULL), 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

/* An open matches at most PKV_MAX_OPEN_WALK_TOKENS leading tokens: the walk is bounded per request. */
START_TEST(open_walk_is_bounded)
{
	struct pkv_geometry g = test_geom(8192);
	struct pkv_cache_limits lim = { .pin_budget_blocks = 8192, .pin_cap_blocks = 8192 };
	struct pkv_cache *c = NULL;
	uint32_t n = PKV_MAX_OPEN_WALK_TOKENS + 4 * BS, s, nc;
	int32_t *t = calloc(n + 1, sizeof(*t));

	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(pkv_cache_create(&g, &lim, &c), 0);
	test_prompt(t, n + 1, 7);
	s = test_prefill(c, OWN, test_ns(1), t, n, NULL);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s), 0);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, n + 1, &s, &nc), 0);
	ck_assert_uint_eq(nc, PKV_MAX_OPEN_WALK_TOKENS);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), t, n + 1), (int)PKV_MAX_OPEN_WALK_TOKENS);
	test_audit_clean(c);
	pkv_cache_destroy(c);
	free(t);
}
END_TEST

/* An open's walk spread over calls matches what one call matches, budget blocks at a time. */
START_TEST(open_walk_in_turns)
{
	struct pkv_cache *c = test_cache(64);
	uint32_t n = 20 * BS + 1, s, s2, nc, ncf;
	int32_t t[20 * BS + 1];
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;

	test_prompt(t, n, 8);
	s = test_prefill(c, OWN, test_ns(1), t, n - 1, NULL);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s), 0);
	ck_assert_int_eq(pkv_cache_seq_open_partial(c, OWN, test_ns(1), t, n, 0, 8, &s, &nc), 1);
	ck_assert_uint_eq(nc, 8 * BS);
	ck_assert_int_eq(pkv_cache_seq_open_more(c, OWN, s, t, n, 8, &nc), 1);
	ck_assert_uint_eq(nc, 16 * BS);
	test_audit_clean(c);
	ck_assert_int_eq(pkv_cache_seq_open_more(c, OWN, s, t, n, 8, &nc), 0);
	ck_assert_uint_eq(nc, 20 * BS);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s), 20 * BS);
	ck_assert_int_eq(pkv_cache_seq_open_more(c, OWN, s, t, n, 8, &nc), -EINVAL);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, n, &s2, &ncf), 0);
	ck_assert_uint_eq(ncf, nc);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s2), 0);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s), 0);

	/* Using the sequence ends its walk. */
	ck_assert_int_eq(pkv_cache_seq_open_partial(c, OWN, test_ns(1), t, n, 0, 4, &s, &nc), 1);
	r = (struct pkv_step_req){ s, 1, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_int_eq(test_commit(c, st), 0);
	ck_assert_int_eq(pkv_cache_seq_open_more(c, OWN, s, t, n, 4, &nc), -EINVAL);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s), 0);

	/* Past the owner's block limit the walk stops at the limit. */
	ck_assert_int_eq(pkv_cache_set_owner_limits(c, OWN, 0, 10), 0);
	ck_assert_int_eq(pkv_cache_seq_open_partial(c, OWN, test_ns(1), t, n, 0, 8, &s, &nc), 1);
	ck_assert_int_eq(pkv_cache_seq_open_more(c, OWN, s, t, n, 8, &nc), 0);
	ck_assert_uint_eq(nc, 10 * BS);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

/* The footprint a budget must charge covers the per-block metadata, not only the KV bytes. */
START_TEST(footprint_counts_metadata)
{
	struct pkv_geometry g = test_geom(1u << 16), bad = g;
	uint64_t f = pkv_cache_footprint(&g);

	ck_assert_uint_ge(f, (uint64_t)g.num_blocks * (sizeof(struct blk) + BS * sizeof(int32_t)));
	g.num_blocks *= 2;
	ck_assert_uint_gt(pkv_cache_footprint(&g), 2 * f - sizeof(struct pkv_cache) - 1024);
	bad.num_layers = 0;
	ck_assert_uint_eq(pkv_cache_footprint(&bad), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cache-bounds");
	TCase *tc = tcase_create("bounds");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, commit_needs_every_layer);
	tcase_add_test(tc, reused_block_is_never_committed_unwritten);
	tcase_add_test(tc, huge_step_table_is_refused);
	tcase_add_test(tc, large_step_buffers_are_not_kept);
	tcase_add_test(tc, fork_copies_entries_not_capacity);
	tcase_add_test(tc, pins_count_against_block_limit);
	tcase_add_test(tc, open_walk_is_bounded);
	tcase_add_test(tc, footprint_counts_metadata);
	tcase_add_test(tc, open_walk_in_turns);
	tcase_add_test(tc, fork_tables_are_bounded);
	suite_add_tcase(s, tc);
	return test_run(s);
}
