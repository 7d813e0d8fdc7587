/* SPDX-License-Identifier: MIT */
/* CPU plugin tests outside the conformance suite: malformed batches are refused, never read out of bounds. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/loader.h"
#include "../suite_main.h"

static struct pkv_host *host;
static struct pkv_plugin plug;
static struct pkv_cache_mem mem;
static char err[512];

/* 1 sequence, 3 new tokens after 5 cached, f32, 2 heads / 1 KV head, head dim 16, block size 4, 4 blocks. */
static float q[3 * 2 * 16], kv[3 * 16], o[3 * 2 * 16];
static int32_t cuq[2], cuk[2], bt[4], cached[1];
static int64_t slots[3];
static struct pkv_attn_batch b;

static void setup(void)
{
	char path[1024];
	const char *top = getenv("PKV_TOP_BUILDDIR");
	struct pkv_pool_desc pool = { PKV_BACKEND_ABI_VERSION, sizeof(pool),
				      { 2, 2, 1, 16, PKV_DTYPE_F32, 4, 4 }, PKV_DTYPE_F32 };

	snprintf(path, sizeof(path), "%s/plugins/cpu/.libs/pkv_cpu.so", top ? top : ".");
	ck_assert_int_eq(pkv_host_create(2, PKV_LOG_ERROR, &host), 0);
	ck_assert_msg(pkv_plugin_load(path, "cpu", NULL, NULL, host, &plug, err, sizeof(err)) == 0, "%s", err);
	memset(&mem, 0, sizeof(mem));
	mem.abi_version = PKV_BACKEND_ABI_VERSION;
	mem.struct_size = sizeof(mem);
	ck_assert_int_eq(plug.be->cache_alloc(plug.ctx, &pool, &mem), 0);
	cuq[0] = 0;
	cuq[1] = 3;
	cuk[0] = 0;
	cuk[1] = 8;
	cached[0] = 5;
	bt[0] = 2;
	bt[1] = 0;
	bt[2] = -1;
	bt[3] = -1;
	slots[0] = 0 * 4 + 1;
	slots[1] = 0 * 4 + 2;
	slots[2] = 0 * 4 + 3;
	b = (struct pkv_attn_batch){
		.abi_version = PKV_BACKEND_ABI_VERSION, .struct_size = sizeof(b),
		.layer = 1, .num_seqs = 1, .total_q = 3, .act_dtype = PKV_DTYPE_F32,
		.q = q, .k_new = kv, .v_new = kv, .o = o,
		.q_stride_tok = 32, .q_stride_head = 16, .kv_stride_tok = 16, .kv_stride_head = 16,
		.o_stride_tok = 32, .o_stride_head = 16,
		.cu_seq_lens_q = cuq, .cu_seq_lens_k = cuk, .max_length_q = 3, .max_length_k = 8,
		.block_tables = bt, .max_blocks_per_seq = 4, .cache_seqlens = cached,
		.slot_mapping = slots, .window_left = -1,
	};
}

static void teardown(void)
{
	plug.be->cache_free(plug.ctx, &mem);
	pkv_plugin_unload(&plug);
	pkv_host_destroy(host);
}

START_TEST(well_formed_batch_runs)
{
	ck_assert_int_eq(plug.be->attend_varlen(plug.ctx, &mem, &b), 0);
}
END_TEST

START_TEST(block_id_out_of_range_refused)
{
	bt[1] = 4;
	ck_assert_int_eq(plug.be->attend_varlen(plug.ctx, &mem, &b), -EINVAL);
	bt[1] = -1; /* a key (4..7) falls in an unallocated entry */
	ck_assert_int_eq(plug.be->attend_varlen(plug.ctx, &mem, &b), -EINVAL);
}
END_TEST

START_TEST(slot_out_of_range_refused)
{
	slots[2] = 16;
	ck_assert_int_eq(plug.be->attend_varlen(plug.ctx, &mem, &b), -EINVAL);
}
END_TEST

START_TEST(layer_and_lengths_checked)
{
	b.layer = 2;
	ck_assert_int_eq(plug.be->attend_decode(plug.ctx, &mem, &b), -EINVAL);
	b.layer = 1;
	cuk[1] = 17; /* more keys than 4 blocks of 4 */
	ck_assert_int_eq(plug.be->attend_varlen(plug.ctx, &mem, &b), -EINVAL);
	cuk[1] = 8;
	cuq[1] = 2; /* disagrees with total_q */
	ck_assert_int_eq(plug.be->attend_varlen(plug.ctx, &mem, &b), -EINVAL);
}
END_TEST

START_TEST(copy_blocks_range_checked)
{
	struct pkv_block_copy cp = { 0, 4 };

	ck_assert_int_eq(plug.be->copy_blocks(plug.ctx, &mem, &cp, 1), -EINVAL);
	cp.dst = 3;
	ck_assert_int_eq(plug.be->copy_blocks(plug.ctx, &mem, &cp, 1), 0);
}
END_TEST

START_TEST(cache_is_huge_page_aligned)
{
	ck_assert_uint_eq((uintptr_t)mem.k_base % (2u << 20), 0);
	ck_assert_uint_eq((uintptr_t)mem.v_base % 64, 0);
	ck_assert_uint_eq(mem.token_stride, 16 * sizeof(float));
	ck_assert_uint_eq(mem.block_stride, 4 * mem.token_stride);
}
END_TEST

/*
 * softmax_lse is written for every row and head when the batch's struct_size
 * covers it, and never touched when it does not (a host built before the
 * field: whatever lies past its struct is not the backend's to read).
 */
START_TEST(lse_only_within_struct_size)
{
	float lse[3 * 2 + 1];
	int i;

	for (i = 0; i < 7; i++)
		lse[i] = NAN;
	b.softmax_lse = lse;
	b.struct_size = offsetof(struct pkv_attn_batch, softmax_lse);
	ck_assert_int_eq(plug.be->attend_varlen(plug.ctx, &mem, &b), 0);
	for (i = 0; i < 7; i++)
		ck_assert(isnan(lse[i]));
	b.struct_size = sizeof(b);
	ck_assert_int_eq(plug.be->attend_varlen(plug.ctx, &mem, &b), 0);
	for (i = 0; i < 6; i++)
		ck_assert_msg(isfinite(lse[i]), "row %d head %d: %g", i / 2, i % 2, lse[i]);
	ck_assert(isnan(lse[6]));
	ck_assert(plug.be->caps->features & PKV_FEAT_LSE);
}
END_TEST

/* Loads the CPU plugin with cascade_min_keys = value; returns the loader's result. */
static int load_cascade(struct pkv_plugin *pl, const char *value)
{
	char path[1024];
	const char *top = getenv("PKV_TOP_BUILDDIR");
	struct pkv_dict_item item = { "cascade_min_keys", value };
	struct pkv_dict d = { 1, 0, &item };

	snprintf(path, sizeof(path), "%s/plugins/cpu/.libs/pkv_cpu.so", top ? top : ".");
	return pkv_plugin_load(path, "cpu", NULL, &d, host, pl, err, sizeof(err));
}

START_TEST(cascade_option_checked)
{
	struct pkv_plugin pl;

	ck_assert_int_ne(load_cascade(&pl, "-1"), 0);
	ck_assert_int_ne(load_cascade(&pl, "4294967296"), 0);
	ck_assert_int_ne(load_cascade(&pl, "many"), 0);
	ck_assert_msg(load_cascade(&pl, "0") == 0, "%s", err);
	pkv_plugin_unload(&pl);
}
END_TEST

/*
 * A decode batch of 40 sequences whose tables a hostile client could have
 * made: every table starts with the same 3 blocks, then runs on through
 * ids that repeat within and across tables, with common leading runs of
 * every length and lengths that end inside a shared block. The cascade
 * path (any shared block taken) must give what plain decode gives. Loop
 * 0: head_dim 16 (the tile path); 1: 64, whose f32 queries the AVX-512
 * kernels' f32 decode loop takes, shared part included (chunks of 8
 * sequences x 4 rows per KV head).
 */
START_TEST(cascade_hostile_tables_match_plain)
{
	enum { NS = 40, NH = 8, NKV = 2, HDMAX = 64, BS = 4, NB = 64, MB = 12 };
	const int HD = _i ? 64 : 16;
	struct pkv_pool_desc pool = { PKV_BACKEND_ABI_VERSION, sizeof(pool),
				      { 1, NH, NKV, (uint32_t)HD, PKV_DTYPE_F32, BS, NB }, PKV_DTYPE_F32 };
	static float qd[NS * NH * HDMAX], od[2][NS * NH * HDMAX], none[NKV * HDMAX];
	static int32_t cq[NS + 1], ck[NS + 1], tab[NS * MB], cl[NS];
	static int64_t sl[NS];
	struct pkv_plugin pl[2];
	struct pkv_cache_mem m;
	struct pkv_attn_batch d;
	uint32_t x = 12345;
	int s, i, v;

	ck_assert_msg(load_cascade(&pl[0], "1") == 0, "%s", err);
	ck_assert_msg(load_cascade(&pl[1], "0") == 0, "%s", err);
	memset(&m, 0, sizeof(m));
	m.abi_version = PKV_BACKEND_ABI_VERSION;
	m.struct_size = sizeof(m);
	ck_assert_int_eq(pl[0].be->cache_alloc(pl[0].ctx, &pool, &m), 0);
	for (i = 0; i < NB * BS * NKV * HD; i++) {
		x = x * 1664525u + 1013904223u;
		((float *)m.k_base)[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
		x = x * 1664525u + 1013904223u;
		((float *)m.v_base)[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
	}
	for (i = 0; i < NS * NH * HD; i++)
		qd[i] = sinf((float)i * 0.37f);
	cq[0] = ck[0] = 0;
	for (s = 0; s < NS; s++) {
		int len = 1 + (s * 7) % (MB * BS); /* 1 .. 48 keys: whole, partial and single blocks */

		for (i = 0; i < MB; i++)
			tab[s * MB + i] = i < 3 ? 10 + i : (i < 3 + s % 5 ? 13 + i : (s * 13 + i * 7) % NB);
		cq[s + 1] = s + 1;
		ck[s + 1] = ck[s] + len;
		cl[s] = len - 1;
		sl[s] = -1; /* nothing appended: both calls read the same cache */
	}
	d = (struct pkv_attn_batch){
		.abi_version = PKV_BACKEND_ABI_VERSION, .struct_size = sizeof(d),
		.layer = 0, .num_seqs = NS, .total_q = NS, .act_dtype = PKV_DTYPE_F32,
		.q = qd, .k_new = none, .v_new = none,
		.q_stride_tok = NH * HD, .q_stride_head = HD, .kv_stride_tok = 0, .kv_stride_head = HD,
		.o_stride_tok = NH * HD, .o_stride_head = HD,
		.cu_seq_lens_q = cq, .cu_seq_lens_k = ck, .max_length_q = 1, .max_length_k = MB * BS,
		.block_tables = tab, .max_blocks_per_seq = MB, .cache_seqlens = cl,
		.slot_mapping = sl, .window_left = -1,
	};
	for (v = 0; v < 2; v++) {
		d.o = od[v];
		ck_assert_int_eq(pl[v].be->attend_decode(pl[v].ctx, &m, &d), 0);
	}
	for (i = 0; i < NS * NH * HD; i++)
		ck_assert_msg(fabsf(od[0][i] - od[1][i]) <= 1e-5f, "row %d dim %d: cascade %g, plain %g", i / HD, i % HD,
			      od[0][i], od[1][i]);
	pl[0].be->cache_free(pl[0].ctx, &m);
	pkv_plugin_unload(&pl[1]);
	pkv_plugin_unload(&pl[0]);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cpu");
	TCase *tc = tcase_create("hostile batches");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, well_formed_batch_runs);
	tcase_add_test(tc, block_id_out_of_range_refused);
	tcase_add_test(tc, slot_out_of_range_refused);
	tcase_add_test(tc, layer_and_lengths_checked);
	tcase_add_test(tc, copy_blocks_range_checked);
	tcase_add_test(tc, cache_is_huge_page_aligned);
	tcase_add_test(tc, lse_only_within_struct_size);
	tcase_add_test(tc, cascade_option_checked);
	tcase_add_loop_test(tc, cascade_hostile_tables_match_plain, 0, 2);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
