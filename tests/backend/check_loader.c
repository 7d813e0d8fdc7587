/* SPDX-License-Identifier: MIT */
/* Loader tests: broken plugins are refused with the file and the reason; dispatch picks the right path. */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "loader/loader.h"
#include "../suite_main.h"

static struct pkv_host *host;
static char err[512];

static void setup(void)
{
	ck_assert_int_eq(pkv_host_create(2, PKV_LOG_ERROR, &host), 0);
	err[0] = '\0';
}

static void teardown(void)
{
	pkv_host_destroy(host);
	host = NULL;
}

/* Path of a toy plugin built by this test suite. */
static const char *toy(const char *variant)
{
	static char path[1024];
	const char *top = getenv("PKV_TOP_BUILDDIR");

	snprintf(path, sizeof(path), "%s/tests/backend/.libs/pkv_toy_%s.so", top ? top : ".", variant);
	return path;
}

/* Loads a toy plugin expected to be refused; returns the error code and checks err names the file. */
static int refuse(const char *variant, const char *reason)
{
	struct pkv_plugin p;
	const char *path = toy(variant);
	int ret = pkv_plugin_load(path, NULL, NULL, NULL, host, &p, err, sizeof(err));

	ck_assert_int_lt(ret, 0);
	ck_assert_msg(strstr(err, path) == err, "error does not start with the file: %s", err);
	ck_assert_msg(strstr(err, reason), "error lacks '%s': %s", reason, err);
	return ret;
}

static struct pkv_pool_desc pool_desc(uint32_t head_dim, uint32_t dtype)
{
	struct pkv_pool_desc d = {
		.abi_version = PKV_BACKEND_ABI_VERSION, .struct_size = sizeof(d),
		.geo = { .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = head_dim,
			 .cache_dtype = dtype, .block_size = 4, .num_blocks = 8 },
		.act_dtype = PKV_DTYPE_F32,
	};
	return d;
}

START_TEST(missing_file)
{
	struct pkv_plugin p;
	int ret = pkv_plugin_load("/nonexistent/dir/pkv_x.so", NULL, NULL, NULL, host, &p, err, sizeof(err));

	ck_assert_int_eq(ret, -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "/nonexistent/dir/pkv_x.so: cannot open plugin"));
}
END_TEST

START_TEST(name_resolves_in_plugin_dir)
{
	struct pkv_plugin p;
	int ret = pkv_plugin_load("nosuch", NULL, "/opt/somewhere", NULL, host, &p, err, sizeof(err));

	ck_assert_int_eq(ret, -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "/opt/somewhere/pkv_nosuch.so"));
}
END_TEST

/* A file name ending in .so is a file in the current directory, not a name to wrap in pkv_*.so. */
START_TEST(file_name_is_a_file_here)
{
	struct pkv_plugin p;
	int ret = pkv_plugin_load("pkv_nosuch.so", NULL, "/opt/somewhere", NULL, host, &p, err, sizeof(err));

	ck_assert_int_lt(ret, 0);
	ck_assert_msg(strstr(err, "./pkv_nosuch.so: cannot open plugin"), "%s", err);
}
END_TEST

START_TEST(not_a_shared_object)
{
	struct pkv_plugin p;
	char path[1024];
	FILE *f;

	snprintf(path, sizeof(path), "%s/tests/backend/not-a-plugin.so",
		 getenv("PKV_TOP_BUILDDIR") ? getenv("PKV_TOP_BUILDDIR") : ".");
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("this is text, not ELF\n", f);
	fclose(f);
	ck_assert_int_lt(pkv_plugin_load(path, NULL, NULL, NULL, host, &p, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, path) == err && strstr(err, "cannot load"), "%s", err);
	remove(path);
}
END_TEST

START_TEST(no_symbol)
{
	refuse("nosym", "missing symbol pkv_backend_enum");
}
END_TEST

START_TEST(bad_abi_version)
{
	ck_assert_int_eq(refuse("badabi", "unknown ABI version 99"), -EPROTO);
}
END_TEST

START_TEST(too_small_struct)
{
	ck_assert_int_eq(refuse("small", "too small"), -EPROTO);
}
END_TEST

START_TEST(null_init)
{
	refuse("noinit", "required method init is NULL");
}
END_TEST

START_TEST(init_fails)
{
	ck_assert_int_eq(refuse("initfail", "init failed"), -ENODEV);
}
END_TEST

START_TEST(missing_path_method)
{
	refuse("nodecode", "attend_decode is NULL");
}
END_TEST

START_TEST(unknown_backend_name)
{
	struct pkv_plugin p;

	ck_assert_int_eq(pkv_plugin_load(toy("good"), "nope", NULL, NULL, host, &p, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "no backend named 'nope'"));
}
END_TEST

START_TEST(caps_cannot_serve)
{
	struct pkv_plugin p;
	struct pkv_pool_desc pool = pool_desc(64, PKV_DTYPE_F32);
	struct pkv_dispatch d;

	ck_assert_int_eq(pkv_plugin_load(toy("narrow"), NULL, NULL, NULL, host, &p, err, sizeof(err)), 0);
	ck_assert_int_eq(pkv_plugin_check_pool(&p, &pool, PKV_PATH_VARLEN, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, p.path) == err && strstr(err, "head_dim 64"), "%s", err);
	pool = pool_desc(32, PKV_DTYPE_BF16);
	ck_assert_int_eq(pkv_dispatch_open(&d, &p, NULL, &pool, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "cache dtype 2"), "%s", err);
	pool = pool_desc(32, PKV_DTYPE_F32);
	ck_assert_int_eq(pkv_dispatch_open(&d, &p, NULL, &pool, err, sizeof(err)), 0);
	pkv_dispatch_close(&d);
	pkv_plugin_unload(&p);
}
END_TEST

/*
 * A cache descriptor that does not hold its pool is refused with a reason:
 * every reader trusts the strides, so each field a plugin could get wrong is
 * bent once, starting from the good toy's own descriptor.
 */
START_TEST(cache_descriptor_is_checked)
{
	struct pkv_plugin p;
	struct pkv_pool_desc pool = pool_desc(64, PKV_DTYPE_F32);
	struct pkv_dispatch d;
	struct pkv_cache_mem m;

	ck_assert_int_eq(pkv_plugin_load(toy("good"), NULL, NULL, NULL, host, &p, err, sizeof(err)), 0);
	ck_assert_int_eq(pkv_dispatch_open(&d, &p, NULL, &pool, err, sizeof(err)), 0);
	ck_assert_int_eq(pkv_cache_mem_check(&pool, PKV_DOMAIN_HOST, &d.mem, err, sizeof(err)), 0);
	for (int i = 0; i < 8; i++) {
		m = d.mem;
		switch (i) {
		case 0: m.geo.num_blocks++; break;
		case 1: m.geo.head_dim /= 2; break;
		case 2: m.token_stride--; break;
		case 3: m.block_stride /= 2; break;
		case 4: m.layer_stride -= m.block_stride; break;
		case 5: m.bytes /= 2; break;
		case 6: m.v_base = NULL; break;
		case 7: m.token_stride = SIZE_MAX / 2; m.block_stride = 0; break;
		}
		ck_assert_int_eq(pkv_cache_mem_check(&pool, PKV_DOMAIN_HOST, &m, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, "cache_alloc returned"), "case %d: %s", i, err);
	}
	ck_assert_int_eq(pkv_cache_mem_check(&pool, PKV_DOMAIN_HOST + 1, &d.mem, err, sizeof(err)), -EINVAL);
	pkv_dispatch_close(&d);
	pkv_plugin_unload(&p);
}
END_TEST

/* A one-sequence-per-entry batch with sq[i] queries and sk[i] keys. */
struct batch_buf {
	struct pkv_attn_batch b;
	int32_t cuq[5], cuk[5], bt[4 * 8], cached[4];
	int64_t slots[16];
	float q[16 * 4 * 64], kv[16 * 2 * 64], o[16 * 4 * 64];
};

static void make_batch(struct batch_buf *bb, int n, const int *sq, const int *sk)
{
	int s, i;

	memset(bb, 0, sizeof(*bb));
	for (s = 0; s < n; s++) {
		bb->cuq[s + 1] = bb->cuq[s] + sq[s];
		bb->cuk[s + 1] = bb->cuk[s] + sk[s];
		bb->cached[s] = sk[s] - sq[s];
		for (i = 0; i < 8; i++)
			bb->bt[s * 8 + i] = i;
		if (bb->b.max_length_q < (uint32_t)sq[s])
			bb->b.max_length_q = sq[s];
		if (bb->b.max_length_k < (uint32_t)sk[s])
			bb->b.max_length_k = sk[s];
	}
	for (i = 0; i < 16; i++)
		bb->slots[i] = i;
	bb->b = (struct pkv_attn_batch){
		.abi_version = PKV_BACKEND_ABI_VERSION, .struct_size = sizeof(bb->b),
		.num_seqs = n, .total_q = bb->cuq[n], .act_dtype = PKV_DTYPE_F32,
		.q = bb->q, .k_new = bb->kv, .v_new = bb->kv, .o = bb->o,
		.q_stride_tok = 4 * 64, .q_stride_head = 64, .kv_stride_tok = 2 * 64, .kv_stride_head = 64,
		.o_stride_tok = 4 * 64, .o_stride_head = 64,
		.cu_seq_lens_q = bb->cuq, .cu_seq_lens_k = bb->cuk,
		.max_length_q = bb->b.max_length_q, .max_length_k = bb->b.max_length_k,
		.block_tables = bb->bt, .max_blocks_per_seq = 8, .cache_seqlens = bb->cached,
		.slot_mapping = bb->slots, .window_left = -1,
	};
}

/* Loads a toy variant and checks dispatch sends decode and mixed batches to the right method. */
static void run_both_paths(const char *variant)
{
	int (*counts)(void *, int *, int *, int *);
	struct pkv_pool_desc pool = pool_desc(64, PKV_DTYPE_F32);
	struct batch_buf *bb = calloc(1, sizeof(*bb));
	struct pkv_dispatch d;
	struct pkv_plugin p;
	int v, dc, c;
	const int sq_dec[] = { 1, 1, 1 }, sk_dec[] = { 5, 1, 9 };
	const int sq_mix[] = { 1, 3 }, sk_mix[] = { 5, 7 };

	ck_assert_ptr_nonnull(bb);
	ck_assert_msg(pkv_plugin_load(toy(variant), "toy", NULL, NULL, host, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(pkv_dispatch_open(&d, &p, &p, &pool, err, sizeof(err)), 0);
	*(void **)&counts = dlsym(p.dl, "pkv_toy_counts");
	ck_assert_ptr_nonnull(counts);

	make_batch(bb, 3, sq_dec, sk_dec);
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), 0);
	counts(p.ctx, &v, &dc, &c);
	ck_assert_int_eq(dc, 1);
	ck_assert_int_eq(v, 0);

	make_batch(bb, 2, sq_mix, sk_mix);
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), 0);
	counts(p.ctx, &v, &dc, &c);
	ck_assert_int_eq(v, 1);
	ck_assert_int_eq(dc, 1);

	pkv_dispatch_close(&d);
	pkv_plugin_unload(&p);
	free(bb);
}

START_TEST(dispatch_picks_path)
{
	run_both_paths("good");
}
END_TEST

/*
 * A plugin built against an older, smaller version 1 (caps without
 * features, no cache_read) loads and serves; the loader's copy reads the
 * missing parts as 0 and NULL, never as what follows in the plugin's memory.
 */
START_TEST(abi_older_plugin)
{
	struct pkv_plugin p;

	ck_assert_msg(pkv_plugin_load(toy("abiold"), NULL, NULL, NULL, host, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(p.be->struct_size, sizeof(struct pkv_backend));
	ck_assert_uint_eq(p.be->caps->struct_size, sizeof(struct pkv_backend_caps));
	ck_assert_uint_eq(p.be->caps->features, 0);
	ck_assert_ptr_null(p.be->cache_read);
	ck_assert_uint_eq(p.be->caps->block_size_max, 1024);
	pkv_plugin_unload(&p);
	run_both_paths("abiold");
}
END_TEST

/* One built against a newer, larger version 1 (a cap and a method appended): what is unknown is ignored. */
START_TEST(abi_newer_plugin)
{
	struct pkv_plugin p;

	ck_assert_msg(pkv_plugin_load(toy("abinew"), NULL, NULL, NULL, host, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(p.be->struct_size, sizeof(struct pkv_backend));
	ck_assert_uint_eq(p.be->caps->features, PKV_FEAT_WINDOW);
	ck_assert_uint_eq(p.be->caps->block_size_max, 1024);
	pkv_plugin_unload(&p);
	run_both_paths("abinew");
}
END_TEST

/* Options reach init when listed and well typed, and are refused with a reason otherwise. */
START_TEST(options_checked_and_passed)
{
	long (*level)(void *);
	struct pkv_dict_item it[2] = { { "level", "42" }, { "loud", "yes" } };
	struct pkv_dict d = { .n_items = 2, .items = it };
	struct pkv_plugin p;

	ck_assert_msg(pkv_plugin_load(toy("good"), NULL, NULL, &d, host, &p, err, sizeof(err)) == 0, "%s", err);
	*(void **)&level = dlsym(p.dl, "pkv_toy_level");
	ck_assert_ptr_nonnull(level);
	ck_assert_int_eq(level(p.ctx), 42);
	pkv_plugin_unload(&p);
	ck_assert_int_eq(pkv_plugin_load(toy("good"), NULL, NULL, NULL, host, &p, err, sizeof(err)), 0);
	/* Looked up again: the unload may have unmapped the library, and the reload map it elsewhere. */
	*(void **)&level = dlsym(p.dl, "pkv_toy_level");
	ck_assert_ptr_nonnull(level);
	ck_assert_int_eq(level(p.ctx), 7); /* the default, with no dictionary at all */
	pkv_plugin_unload(&p);

	it[0].value = "4x2";
	ck_assert_int_eq(pkv_plugin_load(toy("good"), NULL, NULL, &d, host, &p, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "'level' wants an integer, not '4x2'"), "%s", err);
	it[0].value = "1";
	it[1].value = "maybe";
	ck_assert_int_eq(pkv_plugin_load(toy("good"), NULL, NULL, &d, host, &p, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "'loud' wants a boolean"), "%s", err);
	it[1].key = "volume";
	ck_assert_int_eq(pkv_plugin_load(toy("good"), NULL, NULL, &d, host, &p, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "has no option 'volume'"), "%s", err);
}
END_TEST

/* --list-backends: every backend with its caps and options; nothing is initialised. */
START_TEST(describe_lists_options)
{
	char buf[4096] = "";
	FILE *f = fmemopen(buf, sizeof(buf) - 1, "w");

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(pkv_plugin_describe(toy("initfail"), f, err, sizeof(err)), 1);
	fclose(f);
	ck_assert_msg(strstr(buf, "toy: loader test backend"), "%s", buf);
	ck_assert_msg(strstr(buf, "option toy.level (int, default 7)"), "%s", buf);
	ck_assert_msg(strstr(buf, "paths: varlen decode"), "%s", buf);
	ck_assert_int_lt(pkv_plugin_describe(toy("badabi"), stdout, err, sizeof(err)), 0);
}
END_TEST

START_TEST(spec_split)
{
	char lib[16];
	const char *name;

	ck_assert_int_eq(pkv_backend_spec_split("cuda:decode", lib, sizeof(lib), &name), 0);
	ck_assert_str_eq(lib, "cuda");
	ck_assert_str_eq(name, "decode");
	ck_assert_int_eq(pkv_backend_spec_split("/x/pkv_cpu.so", lib, sizeof(lib), &name), 0);
	ck_assert_ptr_null(name);
	ck_assert_int_eq(pkv_backend_spec_split("a-very-long-library-name:x", lib, sizeof(lib), &name),
			 -ENAMETOOLONG);
}
END_TEST

START_TEST(dispatch_refuses_bad_batch)
{
	struct pkv_pool_desc pool = pool_desc(64, PKV_DTYPE_F32);
	struct batch_buf *bb = calloc(1, sizeof(*bb));
	struct pkv_block_copy cp = { 0, 99 };
	struct pkv_dispatch d;
	struct pkv_plugin p;
	const int sq[] = { 2, 3 }, sk[] = { 5, 7 };

	ck_assert_ptr_nonnull(bb);
	ck_assert_int_eq(pkv_plugin_load(toy("good"), NULL, NULL, NULL, host, &p, err, sizeof(err)), 0);
	ck_assert_int_eq(pkv_dispatch_open(&d, &p, NULL, &pool, err, sizeof(err)), 0);

	make_batch(bb, 2, sq, sk);
	bb->bt[8 + 1] = 8; /* block 8 of 8 */
	ck_assert_int_eq(pkv_attn_batch_check(&d.mem, &bb->b, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "out of range"), "%s", err);
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), -EINVAL);

	make_batch(bb, 2, sq, sk);
	bb->slots[3] = 8 * 4;
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), -EINVAL);

	make_batch(bb, 2, sq, sk);
	bb->b.max_length_k = 3;
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), -EINVAL);

	make_batch(bb, 2, sq, sk);
	bb->b.layer = 2;
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), -EINVAL);

	make_batch(bb, 2, sq, sk);
	ck_assert_int_eq(pkv_attn_batch_check(&d.mem, &bb->b, err, sizeof(err)), PKV_PATH_VARLEN);

	ck_assert_int_eq(pkv_dispatch_copy_blocks(&d, &cp, 1), -EINVAL);
	cp.dst = 7;
	ck_assert_int_eq(pkv_dispatch_copy_blocks(&d, &cp, 1), 0);

	pkv_dispatch_close(&d);
	pkv_plugin_unload(&p);
	free(bb);
}
END_TEST

/* Path of the CPU plugin of this build tree: the one in-tree backend with PKV_FEAT_LSE. */
static const char *cpu_plugin(void)
{
	static char path[1024];
	const char *top = getenv("PKV_TOP_BUILDDIR");

	snprintf(path, sizeof(path), "%s/plugins/cpu/.libs/pkv_cpu.so", top ? top : ".");
	return path;
}

/*
 * softmax_lse is refused with -ENOTSUP, before any call, where the backend
 * serving the batch's path lacks PKV_FEAT_LSE (the toy), and served where it
 * has it (the CPU backend: zero queries over zero keys give log(keys seen)).
 * A batch whose struct_size ends before the field (an older host) has no
 * softmax_lse, whatever lies there.
 */
START_TEST(dispatch_lse_needs_the_feature)
{
	struct pkv_pool_desc pool = pool_desc(64, PKV_DTYPE_F32);
	struct batch_buf *bb = calloc(1, sizeof(*bb));
	int (*counts)(void *, int *, int *, int *);
	struct pkv_plugin toy_p, cpu_p;
	struct pkv_dispatch d;
	float lse[16 * 4];
	int v, dc, c;
	const int sq_dec[] = { 1, 1, 1 }, sk_dec[] = { 5, 1, 9 };
	const int sq_mix[] = { 1, 3 }, sk_mix[] = { 5, 7 };

	ck_assert_ptr_nonnull(bb);
	ck_assert_msg(pkv_plugin_load(toy("good"), NULL, NULL, NULL, host, &toy_p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(pkv_plugin_load(cpu_plugin(), "cpu", NULL, NULL, host, &cpu_p, err, sizeof(err)) == 0, "%s", err);
	*(void **)&counts = dlsym(toy_p.dl, "pkv_toy_counts");
	ck_assert_ptr_nonnull(counts);

	/* The toy serves both paths and has no softmax_lse. */
	ck_assert_int_eq(pkv_dispatch_open(&d, &toy_p, NULL, &pool, err, sizeof(err)), 0);
	ck_assert_int_eq(pkv_dispatch_has_lse(&d), 0);
	make_batch(bb, 3, sq_dec, sk_dec);
	bb->b.softmax_lse = lse;
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), -ENOTSUP);
	make_batch(bb, 2, sq_mix, sk_mix);
	bb->b.softmax_lse = lse;
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), -ENOTSUP);
	counts(toy_p.ctx, &v, &dc, &c);
	ck_assert_int_eq(v + dc, 0);
	bb->b.struct_size = offsetof(struct pkv_attn_batch, softmax_lse);
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), 0);
	pkv_dispatch_close(&d);

	/* CPU for varlen, the toy for decode: only varlen batches may ask. */
	ck_assert_int_eq(pkv_dispatch_open(&d, &cpu_p, &toy_p, &pool, err, sizeof(err)), 0);
	ck_assert_int_eq(pkv_dispatch_has_lse(&d), 0);
	make_batch(bb, 2, sq_mix, sk_mix);
	bb->b.softmax_lse = lse;
	for (v = 0; v < 16 * 4; v++)
		lse[v] = -1.0f;
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), 0);
	/* Rows see 5, 5, 6 and 7 keys; every head alike. */
	for (v = 0; v < 4; v++) {
		ck_assert_float_eq_tol(lse[0 * 4 + v], 1.6094379f, 1e-5f);
		ck_assert_float_eq_tol(lse[1 * 4 + v], 1.6094379f, 1e-5f);
		ck_assert_float_eq_tol(lse[2 * 4 + v], 1.7917595f, 1e-5f);
		ck_assert_float_eq_tol(lse[3 * 4 + v], 1.9459101f, 1e-5f);
	}
	make_batch(bb, 3, sq_dec, sk_dec);
	bb->b.softmax_lse = lse;
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), -ENOTSUP);
	pkv_dispatch_close(&d);

	/* CPU for both. */
	ck_assert_int_eq(pkv_dispatch_open(&d, &cpu_p, NULL, &pool, err, sizeof(err)), 0);
	ck_assert_int_eq(pkv_dispatch_has_lse(&d), 1);
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), 0);
	ck_assert_float_eq_tol(lse[0], 1.6094379f, 1e-5f);
	ck_assert_float_eq_tol(lse[1 * 4 + 3], 0.0f, 1e-6f);
	ck_assert_float_eq_tol(lse[2 * 4], 2.1972246f, 1e-5f);
	pkv_dispatch_close(&d);

	pkv_plugin_unload(&cpu_p);
	pkv_plugin_unload(&toy_p);
	free(bb);
}
END_TEST

/*
 * A window or a soft-cap asked of a backend without PKV_FEAT_WINDOW /
 * PKV_FEAT_SOFTCAP (the toy has neither) is refused before any call: such a
 * backend may ignore the field and return another attention without error.
 * The CPU backend, which has both, serves the same batches.
 */
START_TEST(dispatch_window_and_softcap_need_their_features)
{
	struct pkv_pool_desc pool = pool_desc(64, PKV_DTYPE_F32);
	struct batch_buf *bb = calloc(1, sizeof(*bb));
	int (*counts)(void *, int *, int *, int *);
	struct pkv_plugin toy_p, cpu_p;
	struct pkv_dispatch d;
	int v, dc, c;
	const int sq[] = { 1, 3 }, sk[] = { 5, 7 };

	ck_assert_ptr_nonnull(bb);
	ck_assert_msg(pkv_plugin_load(toy("good"), NULL, NULL, NULL, host, &toy_p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(pkv_plugin_load(cpu_plugin(), "cpu", NULL, NULL, host, &cpu_p, err, sizeof(err)) == 0, "%s", err);
	*(void **)&counts = dlsym(toy_p.dl, "pkv_toy_counts");
	ck_assert_ptr_nonnull(counts);
	ck_assert_int_eq(toy_p.be->caps->features & (PKV_FEAT_WINDOW | PKV_FEAT_SOFTCAP), 0);

	ck_assert_int_eq(pkv_dispatch_open(&d, &toy_p, NULL, &pool, err, sizeof(err)), 0);
	make_batch(bb, 2, sq, sk);
	bb->b.window_left = 2;
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), -ENOTSUP);
	make_batch(bb, 2, sq, sk);
	bb->b.softcap = 30.0f;
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), -ENOTSUP);
	counts(toy_p.ctx, &v, &dc, &c);
	ck_assert_int_eq(v + dc, 0);
	make_batch(bb, 2, sq, sk);
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), 0);
	pkv_dispatch_close(&d);

	ck_assert_int_eq(pkv_dispatch_open(&d, &cpu_p, NULL, &pool, err, sizeof(err)), 0);
	make_batch(bb, 2, sq, sk);
	bb->b.window_left = 2;
	bb->b.softcap = 30.0f;
	ck_assert_int_eq(pkv_dispatch_attend(&d, &bb->b), 0);
	pkv_dispatch_close(&d);

	pkv_plugin_unload(&cpu_p);
	pkv_plugin_unload(&toy_p);
	free(bb);
}
END_TEST

static Suite *loader_suite(void)
{
	Suite *s = suite_create("loader");
	TCase *tc = tcase_create("refusals");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, missing_file);
	tcase_add_test(tc, name_resolves_in_plugin_dir);
	tcase_add_test(tc, file_name_is_a_file_here);
	tcase_add_test(tc, not_a_shared_object);
	tcase_add_test(tc, no_symbol);
	tcase_add_test(tc, bad_abi_version);
	tcase_add_test(tc, too_small_struct);
	tcase_add_test(tc, null_init);
	tcase_add_test(tc, init_fails);
	tcase_add_test(tc, missing_path_method);
	tcase_add_test(tc, unknown_backend_name);
	tcase_add_test(tc, caps_cannot_serve);
	tcase_add_test(tc, options_checked_and_passed);
	tcase_add_test(tc, describe_lists_options);
	tcase_add_test(tc, spec_split);
	suite_add_tcase(s, tc);
	tc = tcase_create("abi");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, abi_older_plugin);
	tcase_add_test(tc, abi_newer_plugin);
	suite_add_tcase(s, tc);
	tc = tcase_create("dispatch");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, dispatch_picks_path);
	tcase_add_test(tc, cache_descriptor_is_checked);
	tcase_add_test(tc, dispatch_refuses_bad_batch);
	tcase_add_test(tc, dispatch_lse_needs_the_feature);
	tcase_add_test(tc, dispatch_window_and_softcap_need_their_features);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return suite_main(loader_suite());
}
