/* SPDX-License-Identifier: MIT */
/* CPU plugin tests outside the conformance suite: malformed batches are refused, never read out of bounds. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/loader.h"

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

int main(void)
{
	Suite *s = suite_create("cpu");
	TCase *tc = tcase_create("hostile batches");
	SRunner *sr;
	int failed;

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, well_formed_batch_runs);
	tcase_add_test(tc, block_id_out_of_range_refused);
	tcase_add_test(tc, slot_out_of_range_refused);
	tcase_add_test(tc, layer_and_lengths_checked);
	tcase_add_test(tc, copy_blocks_range_checked);
	tcase_add_test(tc, cache_is_huge_page_aligned);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_ENV);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
