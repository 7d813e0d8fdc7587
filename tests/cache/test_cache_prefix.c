/* SPDX-License-Identifier: MIT */
/* Cache manager: prefix table collisions, LRU eviction order, pins and their budget, flush, audit. */
#include "helpers.h"
#include "cache/cache_int.h"

#define OWN 3

/* A forged collision: re-keys the published block of prompt A under the key prompt B's first block has. */
START_TEST(collision_never_returns_wrong_kv)
{
	struct pkv_cache *c = test_cache(64);
	int32_t a[32], b[32];
	uint32_t s, nc;
	struct pkv_key ns = test_ns(1), kb;
	int32_t blk;

	test_prompt(a, 32, 1);
	test_prompt(b, 32, 2);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, ns, a, 32, NULL)), 0);
	blk = pkv_prefix_find(c, pkv_block_key(ns, ns, a, BS));
	ck_assert_int_ge(blk, 0);
	kb = pkv_block_key(ns, ns, b, BS);
	pkv_prefix_remove(c, c->blk[blk].key);
	c->blk[blk].key = kb;
	pkv_prefix_insert(c, kb, blk);
	ck_assert_int_eq(pkv_prefix_find(c, kb), blk);
	/* The key matches but the stored tokens do not: a miss, not A's KV. */
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, ns, b, 32, &s, &nc), 0);
	ck_assert_uint_eq(nc, 0);
	/* And audit sees that the stored tokens do not produce the key. */
	ck_assert_int_gt(pkv_cache_audit(c, NULL, 0), 0);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(collision_on_parent_key_misses)
{
	struct pkv_cache *c = test_cache(64);
	int32_t a[48];
	uint32_t s, nc;
	struct pkv_key ns = test_ns(1);
	int32_t b1;

	test_prompt(a, 48, 1);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, ns, a, 48, NULL)), 0);
	/* Corrupt the recorded parent key of block 1: the chain must stop there. */
	b1 = pkv_prefix_find(c, pkv_block_key(pkv_block_key(ns, ns, a, BS), ns, a + BS, BS));
	ck_assert_int_ge(b1, 0);
	c->blk[b1].parent_key.hi ^= 1;
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, ns, a, 48, &s, &nc), 0);
	ck_assert_uint_eq(nc, 16);
	pkv_cache_destroy(c);
}
END_TEST

/* The slot hash is SipHash-1-3: the value CPython's siphash13 gives for bytes 0..15 under a zero key. */
START_TEST(keyed_hash_is_siphash13)
{
	struct pkv_hash_secret zero = { 0, 0 };

	ck_assert_uint_eq(pkv_keyed_hash128(&zero, 0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull),
			  9904005486622393783ull);
}
END_TEST

/*
 * Keys a client aimed at one slot (the same low 32 bits: the old home slot)
 * spread over the table: the longest probe run stays short, every key is found
 * and removal leaves the table empty.
 */
START_TEST(aimed_keys_do_not_crowd_one_slot)
{
	enum { N = 4096 };
	struct pkv_cache *c = test_cache(N), *d = test_cache(16);
	uint32_t i, worst = 0;

	for (i = 0; i < N; i++)
		pkv_prefix_insert(c, (struct pkv_key){ ((uint64_t)i << 32) | 0x1234u, i }, (int32_t)i);
	for (i = 0; i <= c->tab_mask; i++) {
		const struct pent *e = &c->tab[i];
		uint32_t home, run;

		if (e->blk < 0)
			continue;
		home = (uint32_t)pkv_keyed_hash128(&c->slot_secret, e->lo, e->hi) & c->tab_mask;
		run = (i - home) & c->tab_mask;
		worst = run > worst ? run : worst;
	}
	/* Random homes at load <= 1/2 give runs of a few dozen at most; aimed unkeyed ones gave N. */
	ck_assert_uint_lt(worst, 128);
	for (i = 0; i < N; i++)
		ck_assert_int_eq(pkv_prefix_find(c, (struct pkv_key){ ((uint64_t)i << 32) | 0x1234u, i }),
				 (int32_t)i);
	for (i = 0; i < N; i++)
		pkv_prefix_remove(c, (struct pkv_key){ ((uint64_t)i << 32) | 0x1234u, i });
	ck_assert_uint_eq(c->n_pub, 0);
	/* Each cache draws its own secret. */
	ck_assert(c->slot_secret.k0 != d->slot_secret.k0 || c->slot_secret.k1 != d->slot_secret.k1);
	pkv_cache_destroy(c);
	pkv_cache_destroy(d);
}
END_TEST

START_TEST(audit_reports_refcount_mismatch)
{
	struct pkv_cache *c = test_cache(64);
	int32_t a[20];
	uint32_t s;
	char why[256];

	test_prompt(a, 20, 1);
	s = test_prefill(c, OWN, test_ns(1), a, 20, NULL);
	c->blk[c->seqs[s & 0xffff].tab[0]].ref++;
	ck_assert_int_gt(pkv_cache_audit(c, why, sizeof(why)), 0);
	ck_assert_ptr_nonnull(strstr(why, "refcount"));
	c->blk[c->seqs[s & 0xffff].tab[0]].ref--;
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(audit_reports_lost_block)
{
	struct pkv_cache *c = test_cache(64);
	char why[256];

	c->n_free--;   /* a block vanishes from the free list */
	ck_assert_int_gt(pkv_cache_audit(c, why, sizeof(why)), 0);
	ck_assert_ptr_nonnull(strstr(why, "free"));
	c->n_free++;
	pkv_cache_destroy(c);
}
END_TEST

/* ---- LRU ---- */

START_TEST(closed_blocks_are_cached_and_reused)
{
	struct pkv_cache *c = test_cache(64);
	int32_t a[40];
	uint32_t nc;
	struct pkv_cache_stats st;

	test_prompt(a, 40, 1);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, test_ns(1), a, 40, NULL)), 0);
	test_prefill(c, OWN, test_ns(1), a, 40, &nc);
	ck_assert_uint_eq(nc, 32);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.hit_tokens, 32);
	ck_assert_uint_eq(st.lookup_tokens, 80);
	ck_assert_uint_eq(st.cached_blocks, 0);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(eviction_takes_least_recently_used_first)
{
	struct pkv_cache *c = test_cache(4);
	int32_t a[17], b[17], x[32] = { 0 };
	uint32_t s, nc;
	struct pkv_cache_stats st;

	test_prompt(a, 17, 1);
	test_prompt(b, 17, 2);
	/* a then b: each leaves one cached block. */
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, test_ns(1), a, 17, NULL)), 0);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, test_ns(1), b, 17, NULL)), 0);
	/* 3 blocks needed, 2 free: one eviction, a's block (older). */
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(9), x, 32, &s, &nc), 0);
	test_append(c, OWN, s, x, 32);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN + 1, s), -ENOENT);
	test_append(c, OWN, s, x, 1);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.evictions, 1);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), b, 17, &s, &nc), 0);
	ck_assert_uint_eq(nc, 16);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), a, 17, &s, &nc), 0);
	ck_assert_uint_eq(nc, 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(eviction_takes_tail_before_parent)
{
	struct pkv_cache *c = test_cache(4);
	int32_t a[49], x[32] = { 0 };
	uint32_t s, nc;

	test_prompt(a, 49, 1);
	/* A chain of 3 cached blocks and 1 free block: 3 new blocks evict the two deepest. */
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, test_ns(1), a, 48, NULL)), 0);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(2), x, 16, &s, &nc), 0);
	test_append(c, OWN, s, x, 16);
	test_append(c, OWN, s, x, 17);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), a, 49, &s, &nc), 0);
	ck_assert_uint_eq(nc, 16);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(eviction_reaches_a_whole_chain)
{
	struct pkv_cache *c = test_cache(4);
	int32_t a[64], x[64] = { 0 };
	uint32_t s, nc;
	struct pkv_cache_stats st;

	/* Only the tail is evictable at first; parents follow as their children go. */
	test_prompt(a, 64, 1);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, test_ns(1), a, 64, NULL)), 0);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(2), x, 64, &s, &nc), 0);
	test_append(c, OWN, s, x, 64);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.evictions, 4);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(in_use_blocks_are_never_evicted)
{
	struct pkv_cache *c = test_cache(4);
	int32_t a[64], x[16] = { 0 };
	uint32_t s, a_s, nc;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct test_snap s1, s2;

	test_prompt(a, 64, 1);
	a_s = test_prefill(c, OWN, test_ns(1), a, 48, NULL);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(2), x, 16, &s, &nc), 0);
	s1 = test_snapshot(c, OWN);
	r = (struct pkv_step_req){ s, 16, x };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	pkv_cache_step_abort(c, st);
	r.n_new = 17;
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), -ENOSPC);
	s2 = test_snapshot(c, OWN);
	test_same(&s1, &s2);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, a_s), 48);
	pkv_cache_destroy(c);
}
END_TEST

/* ---- pins and flush ---- */

START_TEST(pinned_prefix_survives_eviction)
{
	struct pkv_geometry g = test_geom(4);
	struct pkv_cache_limits lim = { .pin_budget_blocks = 2, .pin_cap_blocks = 2 };
	struct pkv_cache *c;
	int32_t a[33], x[64] = { 0 };
	uint32_t s, nc;
	struct pkv_cache_stats st;

	ck_assert_int_eq(pkv_cache_create(&g, &lim, &c), 0);
	test_prompt(a, 33, 1);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, test_ns(1), a, 32, NULL)), 0);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), a, 33), 32);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.pinned_blocks, 2);
	/* Only the 2 free blocks can be had. */
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(2), x, 64, &s, &nc), 0);
	{
		struct pkv_step_req r = { s, 33, x };
		struct pkv_step *stp;
		struct pkv_step_meta m;

		ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &stp, &m), -ENOSPC);
	}
	test_append(c, OWN, s, x, 32);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), a, 33, &s, &nc), 0);
	ck_assert_uint_eq(nc, 32);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(pin_budget_enospc)
{
	struct pkv_geometry g = test_geom(64);
	struct pkv_cache_limits lim = { .pin_budget_blocks = 2, .pin_cap_blocks = 5 };
	struct pkv_cache *c;
	int32_t a[48], b[48];
	struct test_snap s1, s2;
	struct pkv_cache_stats st;

	ck_assert_int_eq(pkv_cache_create(&g, &lim, &c), 0);
	test_prompt(a, 48, 1);
	test_prompt(b, 48, 2);
	test_prefill(c, OWN, test_ns(1), a, 48, NULL);
	test_prefill(c, OWN, test_ns(1), b, 48, NULL);
	test_prefill(c, OWN, test_ns(2), b, 48, NULL);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), a, 32), 32);
	s1 = test_snapshot(c, OWN);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), b, 16), -ENOSPC);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), a, 48), -ENOSPC);
	/* Another namespace (a cache salt) buys no budget: it follows the owner. */
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(2), b, 16), -ENOSPC);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), a, 32), -ENOSPC);
	s2 = test_snapshot(c, OWN);
	test_same(&s1, &s2);
	/* Another owner has a budget of its own... */
	ck_assert_int_eq(pkv_prefix_pin(c, OWN + 1, test_ns(2), b, 32), 32);
	/* ...but all owners together stay under the pool's cap (4 pinned + 2 > 5)... */
	ck_assert_int_eq(pkv_prefix_pin(c, OWN + 2, test_ns(1), b, 32), -ENOSPC);
	/* ...which blocks already pinned do not grow. */
	ck_assert_int_eq(pkv_prefix_pin(c, OWN + 2, test_ns(1), a, 32), 32);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.pinned_blocks, 4);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(pin_nothing_cached_returns_zero)
{
	struct pkv_cache *c = test_cache(64);
	int32_t a[48];

	test_prompt(a, 48, 1);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), a, 48), 0);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), NULL, 48), -EINVAL);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(unpin_makes_blocks_evictable)
{
	struct pkv_cache *c = test_cache(64);
	int32_t a[48];
	struct pkv_cache_stats st;

	test_prompt(a, 48, 1);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, test_ns(1), a, 48, NULL)), 0);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), a, 48), 48);
	ck_assert_int_eq(pkv_cache_flush(c), 0);
	ck_assert_int_eq(pkv_prefix_unpin(c, OWN, test_ns(1), a, 48), 48);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.pinned_blocks, 0);
	ck_assert_int_eq(pkv_cache_flush(c), 3);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(unpin_without_pin_enoent)
{
	struct pkv_cache *c = test_cache(64);
	int32_t a[48];
	struct test_snap s1, s2;

	test_prompt(a, 48, 1);
	test_prefill(c, OWN, test_ns(1), a, 48, NULL);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), a, 48), 48);
	s1 = test_snapshot(c, OWN);
	/* A pin ends at block 2; none ends at block 1. */
	ck_assert_int_eq(pkv_prefix_unpin(c, OWN, test_ns(1), a, 32), -ENOENT);
	ck_assert_int_eq(pkv_prefix_unpin(c, OWN, test_ns(2), a, 48), -ENOENT);
	/* Only the owner can undo its pin. */
	ck_assert_int_eq(pkv_prefix_unpin(c, OWN + 1, test_ns(1), a, 48), -ENOENT);
	s2 = test_snapshot(c, OWN);
	test_same(&s1, &s2);
	ck_assert_int_eq(pkv_prefix_unpin(c, OWN, test_ns(1), a, 48), 48);
	ck_assert_int_eq(pkv_prefix_unpin(c, OWN, test_ns(1), a, 48), -ENOENT);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(nested_pins_unpin_independently)
{
	struct pkv_cache *c = test_cache(64);
	int32_t a[48];
	struct pkv_cache_stats st;

	test_prompt(a, 48, 1);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, test_ns(1), a, 48, NULL)), 0);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), a, 16), 16);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN, test_ns(1), a, 48), 48);
	ck_assert_int_eq(pkv_prefix_unpin(c, OWN, test_ns(1), a, 16), 16);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.pinned_blocks, 3);
	ck_assert_int_eq(pkv_prefix_unpin(c, OWN, test_ns(1), a, 48), 48);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.pinned_blocks, 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(pins_released_with_their_owner)
{
	struct pkv_cache *c = test_cache(64);
	int32_t a[48], b[48];
	struct pkv_cache_stats st;

	test_prompt(a, 48, 1);
	test_prompt(b, 48, 2);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, test_ns(1), a, 48, NULL)), 0);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, test_ns(2), b, 48, NULL)), 0);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN + 1, test_ns(1), a, 48), 48);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN + 1, test_ns(2), b, 32), 32);
	ck_assert_int_eq(pkv_prefix_pin(c, OWN + 2, test_ns(1), a, 16), 16);
	ck_assert_int_eq(pkv_cache_flush(c), 1);
	/* The hang-up of OWN + 1 releases its pins; OWN + 2's pin stays. */
	ck_assert_int_eq(pkv_cache_release_owner(c, OWN + 1), 0);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.pinned_blocks, 1);
	test_audit_clean(c);
	ck_assert_int_eq(pkv_cache_flush(c), 4);
	ck_assert_int_eq(pkv_cache_release_owner(c, OWN + 2), 0);
	ck_assert_int_eq(pkv_cache_flush(c), 1);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(flush_drops_cached_keeps_in_use)
{
	struct pkv_cache *c = test_cache(64);
	int32_t a[48], b[48];
	uint32_t nc;
	struct pkv_cache_stats st;

	test_prompt(a, 48, 1);
	test_prompt(b, 48, 2);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, test_prefill(c, OWN, test_ns(1), a, 48, NULL)), 0);
	test_prefill(c, OWN, test_ns(1), b, 48, NULL);
	ck_assert_int_eq(pkv_cache_flush(c), 3);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.cached_blocks, 0);
	ck_assert_uint_eq(st.in_use_blocks, 3);
	test_prefill(c, OWN, test_ns(1), a, 48, &nc);
	ck_assert_uint_eq(nc, 0);
	test_prefill(c, OWN, test_ns(1), b, 48, &nc);
	ck_assert_uint_eq(nc, 32);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("cache-prefix");
	TCase *tc = tcase_create("table");

	tcase_add_test(tc, collision_never_returns_wrong_kv);
	tcase_add_test(tc, collision_on_parent_key_misses);
	tcase_add_test(tc, keyed_hash_is_siphash13);
	tcase_add_test(tc, aimed_keys_do_not_crowd_one_slot);
	tcase_add_test(tc, audit_reports_refcount_mismatch);
	tcase_add_test(tc, audit_reports_lost_block);
	suite_add_tcase(s, tc);

	tc = tcase_create("lru");
	tcase_add_test(tc, closed_blocks_are_cached_and_reused);
	tcase_add_test(tc, eviction_takes_least_recently_used_first);
	tcase_add_test(tc, eviction_takes_tail_before_parent);
	tcase_add_test(tc, eviction_reaches_a_whole_chain);
	tcase_add_test(tc, in_use_blocks_are_never_evicted);
	suite_add_tcase(s, tc);

	tc = tcase_create("pins");
	tcase_add_test(tc, pinned_prefix_survives_eviction);
	tcase_add_test(tc, pin_budget_enospc);
	tcase_add_test(tc, pin_nothing_cached_returns_zero);
	tcase_add_test(tc, unpin_makes_blocks_evictable);
	tcase_add_test(tc, unpin_without_pin_enoent);
	tcase_add_test(tc, nested_pins_unpin_independently);
	tcase_add_test(tc, pins_released_with_their_owner);
	tcase_add_test(tc, flush_drops_cached_keeps_in_use);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run(suite());
}
