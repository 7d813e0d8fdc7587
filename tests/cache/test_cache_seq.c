/* SPDX-License-Identifier: MIT */
/* Cache manager: geometry validation, sequences, forks, copy-on-write, steps, owners; every error path. */
#include "helpers.h"

#define OWN 7

/* ---- geometry ---- */

START_TEST(geometry_valid)
{
	struct pkv_geometry g = test_geom(64);
	char why[128] = "x";

	ck_assert_int_eq(pkv_geometry_check(&g, why, sizeof(why)), 0);
	ck_assert_str_eq(why, "");
}
END_TEST

START_TEST(geometry_zero_field_rejected)
{
	for (int f = 0; f < 7; f++) {
		struct pkv_geometry g = test_geom(64);
		uint32_t *fields[] = { &g.num_layers, &g.num_heads, &g.num_kv_heads, &g.head_dim,
				       NULL, &g.block_size, &g.num_blocks };
		char why[128] = "";

		if (!fields[f])
			continue;
		*fields[f] = 0;
		ck_assert_int_eq(pkv_geometry_check(&g, why, sizeof(why)), -EINVAL);
		ck_assert_msg(why[0], "no reason for field %d", f);
	}
}
END_TEST

START_TEST(geometry_kv_heads_must_divide)
{
	struct pkv_geometry g = test_geom(64);
	char why[128] = "";

	g.num_heads = 6;
	g.num_kv_heads = 4;
	ck_assert_int_eq(pkv_geometry_check(&g, why, sizeof(why)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "divide"));
}
END_TEST

START_TEST(geometry_bad_dtype)
{
	struct pkv_geometry g = test_geom(64);
	char why[128] = "";

	g.cache_dtype = PKV_DTYPE_COUNT;
	ck_assert_int_eq(pkv_geometry_check(&g, why, sizeof(why)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "cache_dtype"));
}
END_TEST

START_TEST(geometry_absurd_sizes)
{
	struct pkv_geometry g = test_geom(64);
	char why[128] = "";

	g.num_blocks = UINT32_MAX;
	ck_assert_int_eq(pkv_geometry_check(&g, why, sizeof(why)), -EINVAL);
	g = test_geom(64);
	g.head_dim = 1u << 20;
	ck_assert_int_eq(pkv_geometry_check(&g, why, sizeof(why)), -EINVAL);
	g = test_geom(64);
	g.block_size = 1u << 31;
	ck_assert_int_eq(pkv_geometry_check(&g, why, sizeof(why)), -EINVAL);
}
END_TEST

START_TEST(geometry_product_overflow)
{
	/* Each field within its own limit, the product far beyond any machine: must not wrap to "small". */
	struct pkv_geometry g = { 4096, 4096, 4096, 4096, PKV_DTYPE_F32, 4096, 1u << 26 };
	char why[128] = "";

	ck_assert_int_eq(pkv_geometry_check(&g, why, sizeof(why)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "GiB"));
}
END_TEST

START_TEST(create_rejects_bad_geometry)
{
	struct pkv_geometry g = test_geom(0);
	struct pkv_cache *c = (struct pkv_cache *)&g;

	ck_assert_int_eq(pkv_cache_create(&g, NULL, &c), -EINVAL);
	ck_assert_ptr_null(c);
}
END_TEST

START_TEST(namespace_depends_on_every_input)
{
	struct pkv_geometry g = test_geom(64), g2 = test_geom(128);
	struct pkv_key a = pkv_namespace(1, &g, 1000, NULL, 0);

	ck_assert(!memcmp(&a, &(struct pkv_key){ pkv_namespace(1, &g, 1000, NULL, 0).lo,
						pkv_namespace(1, &g, 1000, NULL, 0).hi }, sizeof(a)));
	ck_assert_uint_ne(a.lo, pkv_namespace(2, &g, 1000, NULL, 0).lo);
	ck_assert_uint_ne(a.lo, pkv_namespace(1, &g2, 1000, NULL, 0).lo);
	ck_assert_uint_ne(a.lo, pkv_namespace(1, &g, 1001, NULL, 0).lo);
	ck_assert_uint_ne(a.lo, pkv_namespace(1, &g, PKV_NS_SHARED, NULL, 0).lo);
	ck_assert_uint_ne(a.lo, pkv_namespace(1, &g, 1000, "salt", 4).lo);
	ck_assert_uint_ne(pkv_namespace(1, &g, 1000, "salt", 4).lo,
			  pkv_namespace(1, &g, 1000, "salu", 4).lo);
}
END_TEST

/* ---- open ---- */

START_TEST(open_miss_caches_nothing)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[100];
	uint32_t s, nc = 99;

	test_prompt(t, 100, 1);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 100, &s, &nc), 0);
	ck_assert_uint_eq(nc, 0);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s), 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(open_hit_whole_blocks)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[100];
	uint32_t s, nc;

	test_prompt(t, 100, 1);
	test_prefill(c, OWN, test_ns(1), t, 100, NULL);
	/* 100 tokens = 6 full blocks + 4: only whole blocks are published. */
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 100, &s, &nc), 0);
	ck_assert_uint_eq(nc, 96);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s), 96);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(open_hit_leaves_last_token)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[64];
	uint32_t s, nc;

	test_prompt(t, 64, 2);
	test_prefill(c, OWN, test_ns(1), t, 64, NULL);
	/* All 4 blocks are cached, but the last token must be computed: 3 blocks. */
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 64, &s, &nc), 0);
	ck_assert_uint_eq(nc, 48);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 65, &s, &nc), 0);
	ck_assert_uint_eq(nc, 64);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 1, &s, &nc), 0);
	ck_assert_uint_eq(nc, 0);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(open_stops_at_first_difference)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[80], u[80];
	uint32_t s, nc;

	test_prompt(t, 80, 3);
	memcpy(u, t, sizeof(u));
	u[40] ^= 1;   /* block 2 differs */
	test_prefill(c, OWN, test_ns(1), t, 80, NULL);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), u, 80, &s, &nc), 0);
	ck_assert_uint_eq(nc, 32);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(open_other_namespace_misses)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[80];
	uint32_t s, nc;

	test_prompt(t, 80, 3);
	test_prefill(c, OWN, test_ns(1), t, 80, NULL);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(2), t, 80, &s, &nc), 0);
	ck_assert_uint_eq(nc, 0);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(open_too_many_tokens_einval)
{
	struct pkv_geometry g = test_geom(64);
	struct pkv_cache_limits lim = { .max_tokens_per_seq = 50 };
	struct pkv_cache *c;
	int32_t t[51] = { 0 };
	uint32_t s, nc;
	struct test_snap a, b;

	ck_assert_int_eq(pkv_cache_create(&g, &lim, &c), 0);
	a = test_snapshot(c, OWN);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 51, &s, &nc), -EINVAL);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), NULL, 5, &s, &nc), -EINVAL);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 50, &s, &nc), 0);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(open_max_seqs_enospc)
{
	struct pkv_geometry g = test_geom(64);
	struct pkv_cache_limits lim = { .max_seqs = 3 };
	struct pkv_cache *c;
	int32_t t[4] = { 1, 2, 3, 4 };
	uint32_t s, nc;
	struct test_snap a, b;

	ck_assert_int_eq(pkv_cache_create(&g, &lim, &c), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 4, &s, &nc), 0);
	a = test_snapshot(c, OWN);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 4, &s, &nc), -ENOSPC);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(open_empty_then_fork_and_fill)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[20];
	uint32_t s, k, nc = 5;

	test_prompt(t, 20, 1);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), NULL, 0, &s, &nc), 0);
	ck_assert_uint_eq(nc, 0);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN, s, &k), 0);
	test_append(c, OWN, s, t, 20);
	test_append(c, OWN, k, t, 3);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s), 20);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, k), 3);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(closed_handle_is_never_valid_again)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[4] = { 1, 2, 3, 4 };
	uint32_t s, s2, nc;

	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 4, &s, &nc), 0);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s), 0);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 4, &s2, &nc), 0);
	ck_assert_uint_ne(s, s2);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s), -ENOENT);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s), -ENOENT);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s2), 0);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(close_returns_blocks)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[40];
	uint32_t s;
	struct pkv_cache_stats st;

	test_prompt(t, 40, 5);
	s = test_prefill(c, OWN, test_ns(1), t, 40, NULL);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.in_use_blocks, 3);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s), 0);
	pkv_cache_stats(c, &st);
	/* The 2 full blocks stay cached for reuse; the partial one is free. */
	ck_assert_uint_eq(st.in_use_blocks, 0);
	ck_assert_uint_eq(st.cached_blocks, 2);
	ck_assert_uint_eq(st.free_blocks, 62);
	ck_assert_uint_eq(st.open_seqs, 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

/* ---- fork and copy-on-write ---- */

START_TEST(fork_shares_every_block)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[40];
	uint32_t s, k;
	struct pkv_cache_stats a, b;

	test_prompt(t, 40, 5);
	s = test_prefill(c, OWN, test_ns(1), t, 40, NULL);
	pkv_cache_stats(c, &a);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN, s, &k), 0);
	pkv_cache_stats(c, &b);
	ck_assert_uint_eq(a.in_use_blocks, b.in_use_blocks);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, k), 40);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(fork_append_copies_shared_partial_block)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[40], x = 999;
	uint32_t s, k;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;

	test_prompt(t, 40, 5);
	s = test_prefill(c, OWN, test_ns(1), t, 40, NULL);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN, s, &k), 0);
	r = (struct pkv_step_req){ k, 1, &x };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_uint_eq(m.num_copies, 1);
	/* The copy's source is the shared block, its target the child's new last block. */
	ck_assert_int_eq(m.copies[0].dst, m.block_tables[2]);
	ck_assert_int_ne(m.copies[0].src, m.copies[0].dst);
	ck_assert_int_eq(m.slot_mapping[0], (int64_t)m.copies[0].dst * BS + 8);
	test_audit_clean(c);
	ck_assert_int_eq(test_commit(c, st), 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(fork_other_writer_then_writes_in_place)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[40], x = 999;
	uint32_t s, k;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;

	test_prompt(t, 40, 5);
	s = test_prefill(c, OWN, test_ns(1), t, 40, NULL);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN, s, &k), 0);
	test_append(c, OWN, k, &x, 1);
	/* The parent is again the only holder of its partial block: no copy. */
	r = (struct pkv_step_req){ s, 1, &x };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_uint_eq(m.num_copies, 0);
	ck_assert_int_eq(test_commit(c, st), 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(fork_at_block_boundary_needs_no_copy)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[32], x = 5;
	uint32_t s, k;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;

	test_prompt(t, 32, 5);
	s = test_prefill(c, OWN, test_ns(1), t, 32, NULL);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN, s, &k), 0);
	r = (struct pkv_step_req){ k, 1, &x };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_uint_eq(m.num_copies, 0);
	ck_assert_uint_eq(m.max_blocks_per_seq, 3);
	pkv_cache_step_abort(c, st);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(fork_busy_seq_ebusy)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[4] = { 1, 2, 3, 4 };
	uint32_t s, k, nc;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;

	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 4, &s, &nc), 0);
	r = (struct pkv_step_req){ s, 4, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN, s, &k), -EBUSY);
	ck_assert_int_eq(pkv_cache_seq_truncate(c, OWN, s, 0), -EBUSY);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s), -EBUSY);
	pkv_cache_step_abort(c, st);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s), 0);
	pkv_cache_destroy(c);
}
END_TEST

/* ---- truncate ---- */

START_TEST(truncate_into_published_block_then_append_copies)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[48], x = 7;
	uint32_t s;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct pkv_cache_stats a;

	test_prompt(t, 48, 9);
	s = test_prefill(c, OWN, test_ns(1), t, 48, NULL);
	ck_assert_int_eq(pkv_cache_seq_truncate(c, OWN, s, 20), 0);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s), 20);
	pkv_cache_stats(c, &a);
	ck_assert_uint_eq(a.in_use_blocks, 2);
	ck_assert_uint_eq(a.cached_blocks, 1);
	/* Block 1 is published and only ours, yet immutable: the append must copy it. */
	r = (struct pkv_step_req){ s, 1, &x };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_uint_eq(m.num_copies, 1);
	ck_assert_int_eq(m.cache_seqlens[0], 20);
	ck_assert_int_eq(test_commit(c, st), 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(truncate_private_block_appends_in_place)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[30], x = 7;
	uint32_t s;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;

	test_prompt(t, 30, 9);
	s = test_prefill(c, OWN, test_ns(1), t, 30, NULL);
	ck_assert_int_eq(pkv_cache_seq_truncate(c, OWN, s, 20), 0);
	r = (struct pkv_step_req){ s, 1, &x };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_uint_eq(m.num_copies, 0);
	ck_assert_int_eq(test_commit(c, st), 0);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(truncate_beyond_length_einval)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[30];
	uint32_t s;
	struct test_snap a, b;

	test_prompt(t, 30, 9);
	s = test_prefill(c, OWN, test_ns(1), t, 30, NULL);
	a = test_snapshot(c, OWN);
	ck_assert_int_eq(pkv_cache_seq_truncate(c, OWN, s, 31), -EINVAL);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s), 30);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(truncate_to_zero_frees_everything)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[30];
	uint32_t s;
	struct pkv_owner_usage u;

	test_prompt(t, 30, 9);
	s = test_prefill(c, OWN, test_ns(1), t, 30, NULL);
	ck_assert_int_eq(pkv_cache_seq_truncate(c, OWN, s, 0), 0);
	pkv_cache_owner_usage(c, OWN, &u);
	ck_assert_uint_eq(u.blocks, 0);
	test_append(c, OWN, s, t, 30);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

/* ---- steps ---- */

START_TEST(step_prefill_metadata)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[40], u[5];
	uint32_t s1, s2, nc;
	struct pkv_step_req r[2];
	struct pkv_step *st;
	struct pkv_step_meta m;

	test_prompt(t, 40, 1);
	test_prompt(u, 5, 2);
	s1 = test_prefill(c, OWN, test_ns(1), t, 20, NULL);   /* 20 cached */
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), u, 5, &s2, &nc), 0);
	r[0] = (struct pkv_step_req){ s1, 20, t + 20 };
	r[1] = (struct pkv_step_req){ s2, 5, u };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, r, 2, &st, &m), 0);
	ck_assert_uint_eq(m.num_seqs, 2);
	ck_assert_uint_eq(m.total_q, 25);
	ck_assert_int_eq(m.cu_seq_lens_q[0], 0);
	ck_assert_int_eq(m.cu_seq_lens_q[1], 20);
	ck_assert_int_eq(m.cu_seq_lens_q[2], 25);
	ck_assert_int_eq(m.cu_seq_lens_k[1], 40);
	ck_assert_int_eq(m.cu_seq_lens_k[2], 45);
	ck_assert_uint_eq(m.max_length_q, 20);
	ck_assert_uint_eq(m.max_length_k, 40);
	ck_assert_int_eq(m.cache_seqlens[0], 20);
	ck_assert_int_eq(m.cache_seqlens[1], 0);
	ck_assert_int_eq(m.decode_only, 0);
	ck_assert_uint_eq(m.max_blocks_per_seq, 3);
	/* Slots follow the block tables: slot = block * block_size + offset. */
	for (int i = 0; i < 20; i++) {
		int pos = 20 + i;

		ck_assert_int_eq(m.slot_mapping[i], (int64_t)m.block_tables[pos / BS] * BS + pos % BS);
	}
	for (int i = 0; i < 5; i++)
		ck_assert_int_eq(m.slot_mapping[20 + i], (int64_t)m.block_tables[3] * BS + i);
	ck_assert_int_eq(m.block_tables[4], -1);
	ck_assert_int_eq(m.block_tables[5], -1);
	ck_assert_int_eq(test_commit(c, st), 0);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s1), 40);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s2), 5);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(step_decode_only_when_one_token_each)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[40];
	uint32_t s1, s2;
	struct pkv_step_req r[2];
	struct pkv_step *st;
	struct pkv_step_meta m;

	test_prompt(t, 40, 1);
	s1 = test_prefill(c, OWN, test_ns(1), t, 17, NULL);
	s2 = test_prefill(c, OWN, test_ns(2), t, 3, NULL);
	r[0] = (struct pkv_step_req){ s1, 1, t };
	r[1] = (struct pkv_step_req){ s2, 1, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, r, 2, &st, &m), 0);
	ck_assert_int_eq(m.decode_only, 1);
	ck_assert_int_eq(m.cache_seqlens[0], 17);
	ck_assert_int_eq(m.cache_seqlens[1], 3);
	ck_assert_uint_eq(m.max_length_q, 1);
	ck_assert_uint_eq(m.max_length_k, 18);
	ck_assert_int_eq(m.block_tables[1 * 2 + 1], -1);   /* s2 has one block of two */
	ck_assert_int_eq(test_commit(c, st), 0);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(step_seq_named_twice_einval)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[8] = { 0 };
	uint32_t s, nc;
	struct pkv_step_req r[2];
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct test_snap a, b;

	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 8, &s, &nc), 0);
	r[0] = r[1] = (struct pkv_step_req){ s, 4, t };
	a = test_snapshot(c, OWN);
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, r, 2, &st, &m), -EINVAL);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(step_unknown_seq_enoent)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[8] = { 0 };
	uint32_t s, nc;
	struct pkv_step_req r[2];
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct test_snap a, b;

	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 8, &s, &nc), 0);
	r[0] = (struct pkv_step_req){ s, 4, t };
	r[1] = (struct pkv_step_req){ s + 1, 4, t };
	a = test_snapshot(c, OWN);
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, r, 2, &st, &m), -ENOENT);
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN + 1, r, 1, &st, &m), -ENOENT);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(step_bad_request_einval)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[8] = { 0 };
	uint32_t s, nc;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct test_snap a, b;

	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 8, &s, &nc), 0);
	a = test_snapshot(c, OWN);
	r = (struct pkv_step_req){ s, 0, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), -EINVAL);
	r = (struct pkv_step_req){ s, 3, NULL };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), -EINVAL);
	r = (struct pkv_step_req){ s, 3, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 0, &st, &m), -EINVAL);
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, NULL, 1, &st, &m), -EINVAL);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(step_too_many_tokens_einval)
{
	struct pkv_geometry g = test_geom(64);
	struct pkv_cache_limits lim = { .max_tokens_per_seq = 40 };
	struct pkv_cache *c;
	int32_t t[41] = { 0 };
	uint32_t s;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct test_snap a, b;

	ck_assert_int_eq(pkv_cache_create(&g, &lim, &c), 0);
	s = test_prefill(c, OWN, test_ns(1), t, 30, NULL);
	a = test_snapshot(c, OWN);
	r = (struct pkv_step_req){ s, 11, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), -EINVAL);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	r.n_new = 10;
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	pkv_cache_step_abort(c, st);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(step_seq_in_open_step_ebusy)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[8] = { 0 };
	uint32_t s, nc;
	struct pkv_step_req r;
	struct pkv_step *st, *st2;
	struct pkv_step_meta m;
	struct test_snap a, b;

	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 8, &s, &nc), 0);
	r = (struct pkv_step_req){ s, 8, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	a = test_snapshot(c, OWN);
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st2, &m), -EBUSY);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	ck_assert_int_eq(test_commit(c, st), 0);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(step_out_of_blocks_reserves_nothing)
{
	struct pkv_cache *c = test_cache(8);
	int32_t t[128] = { 0 };
	uint32_t s1, s2, nc;
	struct pkv_step_req r[2];
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct test_snap a, b;

	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 128, &s1, &nc), 0);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(2), t, 128, &s2, &nc), 0);
	/* 5 + 4 blocks > 8: the first request alone would fit, but it must not be kept. */
	r[0] = (struct pkv_step_req){ s1, 80, t };
	r[1] = (struct pkv_step_req){ s2, 64, t };
	a = test_snapshot(c, OWN);
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, r, 2, &st, &m), -ENOSPC);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	ck_assert_uint_eq(b.st.free_blocks, 8);
	r[1].n_new = 48;
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, r, 2, &st, &m), 0);
	ck_assert_int_eq(test_commit(c, st), 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(step_abort_changes_nothing)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[40], x[20] = { 0 };
	uint32_t s, k;
	struct pkv_step_req r[2];
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct test_snap a, b;

	test_prompt(t, 40, 4);
	s = test_prefill(c, OWN, test_ns(1), t, 40, NULL);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN, s, &k), 0);
	a = test_snapshot(c, OWN);
	r[0] = (struct pkv_step_req){ s, 20, x };   /* copy-on-write and a new block */
	r[1] = (struct pkv_step_req){ k, 1, x };    /* copy-on-write */
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, r, 2, &st, &m), 0);
	ck_assert_uint_eq(m.num_copies, 2);
	test_audit_clean(c);
	pkv_cache_step_abort(c, st);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s), 40);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, k), 40);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(step_commit_twice_einval)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[8] = { 0 };
	uint32_t s, nc;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;

	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 8, &s, &nc), 0);
	r = (struct pkv_step_req){ s, 8, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_int_eq(test_commit(c, st), 0);
	ck_assert_int_eq(pkv_cache_step_commit(c, st), -EINVAL);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s), 8);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(step_commit_publishes_full_blocks)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[50];
	uint32_t s, nc;

	test_prompt(t, 50, 6);
	s = test_prefill(c, OWN, test_ns(1), t, 10, NULL);
	/* Nothing full yet: another open hits nothing. */
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN + 1, test_ns(1), t, 50, &(uint32_t){ 0 }, &nc), 0);
	ck_assert_uint_eq(nc, 0);
	test_append(c, OWN, s, t + 10, 30);   /* now 40: blocks 0 and 1 full */
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN + 1, test_ns(1), t, 50, &(uint32_t){ 0 }, &nc), 0);
	ck_assert_uint_eq(nc, 32);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(step_duplicate_key_stays_private)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[33];
	uint32_t s1, s2, nc;
	struct pkv_step_req r[2];
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct pkv_cache_stats a;

	/* Two sequences prefill the same prompt in one step: one publishes, the other keeps its copy. */
	test_prompt(t, 33, 8);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 33, &s1, &nc), 0);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 33, &s2, &nc), 0);
	r[0] = (struct pkv_step_req){ s1, 33, t };
	r[1] = (struct pkv_step_req){ s2, 33, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, r, 2, &st, &m), 0);
	ck_assert_int_eq(test_commit(c, st), 0);
	test_audit_clean(c);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s1), 0);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s2), 0);
	pkv_cache_stats(c, &a);
	ck_assert_uint_eq(a.cached_blocks, 2);
	ck_assert_uint_eq(a.free_blocks, 62);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

/* ---- owners ---- */

START_TEST(other_owner_gets_enoent)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[20] = { 0 };
	uint32_t s, k;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct test_snap a, b;

	s = test_prefill(c, OWN, test_ns(1), t, 20, NULL);
	a = test_snapshot(c, OWN);
	r = (struct pkv_step_req){ s, 1, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN + 1, &r, 1, &st, &m), -ENOENT);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN + 1, s, &k), -ENOENT);
	ck_assert_int_eq(pkv_cache_seq_truncate(c, OWN + 1, s, 0), -ENOENT);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN + 1, s), -ENOENT);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN + 1, s), -ENOENT);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(release_owner_drops_everything)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[40];
	uint32_t s1, s2, s3;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct pkv_cache_stats a;
	struct pkv_owner_usage u;

	test_prompt(t, 40, 3);
	s1 = test_prefill(c, OWN, test_ns(1), t, 40, NULL);
	s2 = test_prefill(c, OWN, test_ns(1), t, 20, NULL);
	s3 = test_prefill(c, OWN + 1, test_ns(1), t, 40, NULL);
	r = (struct pkv_step_req){ s2, 5, t };
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_int_eq(pkv_cache_set_owner_limits(c, OWN, 10, 10), 0);
	ck_assert_int_eq(pkv_cache_release_owner(c, OWN), 2);
	pkv_cache_stats(c, &a);
	ck_assert_uint_eq(a.open_seqs, 1);
	ck_assert_uint_eq(a.open_steps, 0);
	pkv_cache_owner_usage(c, OWN, &u);
	ck_assert_uint_eq(u.seqs + u.blocks + u.steps + u.max_seqs + u.max_blocks, 0);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s1), -ENOENT);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN + 1, s3), 40);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(owner_seq_limit_enospc)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[4] = { 0 };
	uint32_t s, k, nc;
	struct test_snap a, b;

	ck_assert_int_eq(pkv_cache_set_owner_limits(c, OWN, 2, 0), 0);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 4, &s, &nc), 0);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 4, &s, &nc), 0);
	a = test_snapshot(c, OWN);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 4, &k, &nc), -ENOSPC);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN, s, &k), -ENOSPC);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	/* Another owner is not affected. */
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN + 1, test_ns(1), t, 4, &k, &nc), 0);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(owner_block_limit_enospc)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[64];
	uint32_t s, k, nc;
	struct pkv_step_req r;
	struct pkv_step *st;
	struct pkv_step_meta m;
	struct test_snap a, b;

	test_prompt(t, 64, 1);
	ck_assert_int_eq(pkv_cache_set_owner_limits(c, OWN, 0, 3), 0);
	s = test_prefill(c, OWN, test_ns(1), t, 40, NULL);   /* 3 blocks */
	a = test_snapshot(c, OWN);
	r = (struct pkv_step_req){ s, 10, t };               /* would need a 4th */
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), -ENOSPC);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN, s, &k), -ENOSPC);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 64, &k, &nc), -ENOSPC);
	b = test_snapshot(c, OWN);
	test_same(&a, &b);
	r.n_new = 8;                                          /* fits in block 3 */
	ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st, &m), 0);
	ck_assert_int_eq(test_commit(c, st), 0);
	test_prefill(c, OWN + 1, test_ns(1), t, 64, NULL);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(owner_usage_counts_references)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[40];
	uint32_t s, k;
	struct pkv_owner_usage u;

	test_prompt(t, 40, 1);
	s = test_prefill(c, OWN, test_ns(1), t, 40, NULL);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN, s, &k), 0);
	pkv_cache_owner_usage(c, OWN, &u);
	ck_assert_uint_eq(u.seqs, 2);
	ck_assert_uint_eq(u.blocks, 6);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, s), 0);
	ck_assert_int_eq(pkv_cache_seq_close(c, OWN, k), 0);
	pkv_cache_owner_usage(c, OWN, &u);
	ck_assert_uint_eq(u.seqs + u.blocks, 0);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(create_rejects_absurd_limits)
{
	struct pkv_geometry g = test_geom(64);
	struct pkv_cache_limits lim = { .max_seqs = UINT32_MAX };
	struct pkv_cache *c = NULL;

	ck_assert_int_eq(pkv_cache_create(&g, &lim, &c), -EINVAL);
	ck_assert_ptr_null(c);
	lim = (struct pkv_cache_limits){ .max_tokens_per_seq = UINT32_MAX };
	ck_assert_int_eq(pkv_cache_create(&g, &lim, &c), -EINVAL);
	ck_assert_int_eq(pkv_cache_create(&g, NULL, NULL), -EINVAL);
}
END_TEST

START_TEST(geometry_is_reported_back)
{
	struct pkv_geometry g = test_geom(64);
	struct pkv_cache *c = test_cache(64);

	ck_assert(!memcmp(pkv_cache_geometry(c), &g, sizeof(g)));
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(steps_overlap_and_end_in_any_order)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[40];
	uint32_t s[3], nc;
	struct pkv_step_req r;
	struct pkv_step *st[3];
	struct pkv_step_meta m;
	struct pkv_cache_stats a;

	test_prompt(t, 40, 1);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 40, &s[i], &nc), 0);
		r = (struct pkv_step_req){ s[i], 20, t };
		ck_assert_int_eq(pkv_cache_step_begin(c, OWN, &r, 1, &st[i], &m), 0);
	}
	pkv_cache_stats(c, &a);
	ck_assert_uint_eq(a.open_steps, 3);
	test_audit_clean(c);
	ck_assert_int_eq(test_commit(c, st[1]), 0);
	pkv_cache_step_abort(c, st[0]);
	test_audit_clean(c);
	ck_assert_int_eq(test_commit(c, st[2]), 0);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s[0]), 0);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s[1]), 20);
	ck_assert_int_eq(pkv_cache_seq_len(c, OWN, s[2]), 20);
	pkv_cache_stats(c, &a);
	ck_assert_uint_eq(a.open_steps, 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(many_owners_come_and_go)
{
	struct pkv_cache *c = test_cache(512);
	int32_t t[20];
	uint32_t s[200];
	struct pkv_owner_usage u;

	/* Enough owners to grow the owner map several times, then shrink it again. */
	test_prompt(t, 20, 1);
	for (uint32_t o = 0; o < 200; o++)
		s[o] = test_prefill(c, 1000 + o * 7919, test_ns(1), t, 20, NULL);
	test_audit_clean(c);
	for (uint32_t o = 0; o < 200; o += 2)
		ck_assert_int_eq(pkv_cache_seq_close(c, 1000 + o * 7919, s[o]), 0);
	for (uint32_t o = 1; o < 200; o += 4)
		ck_assert_int_eq(pkv_cache_release_owner(c, 1000 + o * 7919), 1);
	test_audit_clean(c);
	for (uint32_t o = 0; o < 200; o++) {
		pkv_cache_owner_usage(c, 1000 + o * 7919, &u);
		ck_assert_uint_eq(u.seqs, o % 4 == 3);
		if (o % 4 == 3)
			ck_assert_int_eq(pkv_cache_seq_len(c, 1000 + o * 7919, s[o]), 20);
	}
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(fork_needs_a_child_pointer)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[4] = { 1, 2, 3, 4 };
	uint32_t s, nc;

	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 4, &s, &nc), 0);
	ck_assert_int_eq(pkv_cache_seq_fork(c, OWN, s, NULL), -EINVAL);
	ck_assert_int_eq(pkv_cache_seq_open(c, OWN, test_ns(1), t, 4, NULL, &nc), -EINVAL);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("cache-seq");
	TCase *tc = tcase_create("geometry");

	tcase_add_test(tc, geometry_valid);
	tcase_add_test(tc, geometry_zero_field_rejected);
	tcase_add_test(tc, geometry_kv_heads_must_divide);
	tcase_add_test(tc, geometry_bad_dtype);
	tcase_add_test(tc, geometry_absurd_sizes);
	tcase_add_test(tc, geometry_product_overflow);
	tcase_add_test(tc, create_rejects_bad_geometry);
	tcase_add_test(tc, namespace_depends_on_every_input);
	tcase_add_test(tc, create_rejects_absurd_limits);
	tcase_add_test(tc, geometry_is_reported_back);
	suite_add_tcase(s, tc);

	tc = tcase_create("sequences");
	tcase_add_test(tc, open_miss_caches_nothing);
	tcase_add_test(tc, open_hit_whole_blocks);
	tcase_add_test(tc, open_hit_leaves_last_token);
	tcase_add_test(tc, open_stops_at_first_difference);
	tcase_add_test(tc, open_other_namespace_misses);
	tcase_add_test(tc, open_too_many_tokens_einval);
	tcase_add_test(tc, open_max_seqs_enospc);
	tcase_add_test(tc, open_empty_then_fork_and_fill);
	tcase_add_test(tc, closed_handle_is_never_valid_again);
	tcase_add_test(tc, close_returns_blocks);
	tcase_add_test(tc, fork_shares_every_block);
	tcase_add_test(tc, fork_append_copies_shared_partial_block);
	tcase_add_test(tc, fork_other_writer_then_writes_in_place);
	tcase_add_test(tc, fork_at_block_boundary_needs_no_copy);
	tcase_add_test(tc, fork_busy_seq_ebusy);
	tcase_add_test(tc, truncate_into_published_block_then_append_copies);
	tcase_add_test(tc, truncate_private_block_appends_in_place);
	tcase_add_test(tc, truncate_beyond_length_einval);
	tcase_add_test(tc, truncate_to_zero_frees_everything);
	suite_add_tcase(s, tc);

	tc = tcase_create("steps");
	tcase_add_test(tc, step_prefill_metadata);
	tcase_add_test(tc, step_decode_only_when_one_token_each);
	tcase_add_test(tc, step_seq_named_twice_einval);
	tcase_add_test(tc, step_unknown_seq_enoent);
	tcase_add_test(tc, step_bad_request_einval);
	tcase_add_test(tc, step_too_many_tokens_einval);
	tcase_add_test(tc, step_seq_in_open_step_ebusy);
	tcase_add_test(tc, step_out_of_blocks_reserves_nothing);
	tcase_add_test(tc, step_abort_changes_nothing);
	tcase_add_test(tc, step_commit_twice_einval);
	tcase_add_test(tc, step_commit_publishes_full_blocks);
	tcase_add_test(tc, step_duplicate_key_stays_private);
	tcase_add_test(tc, steps_overlap_and_end_in_any_order);
	suite_add_tcase(s, tc);

	tc = tcase_create("owners");
	tcase_add_test(tc, other_owner_gets_enoent);
	tcase_add_test(tc, release_owner_drops_everything);
	tcase_add_test(tc, owner_seq_limit_enospc);
	tcase_add_test(tc, owner_block_limit_enospc);
	tcase_add_test(tc, owner_usage_counts_references);
	tcase_add_test(tc, many_owners_come_and_go);
	tcase_add_test(tc, fork_needs_a_child_pointer);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run(suite());
}
