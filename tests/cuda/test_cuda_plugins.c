/* SPDX-License-Identifier: MIT */
/* Loads pkv_cuda.so's two backends through the ABI entry point: one exported symbol, a clean refusal without a GPU. */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pagedkv/backend.h>
#include "loader/loader.h"
#include "../suite_main.h"

/* One library, backend i at enum index i. */
static const char *const plugin_rel[] = { "cuda/.libs/pkv_cuda.so", "cuda/.libs/pkv_cuda.so" };
static const char *const plugin_name[] = { "varlen", "decode" };
static const uint32_t plugin_path[] = { PKV_PATH_VARLEN, PKV_PATH_DECODE };

static char logbuf[4096];

__attribute__((format(printf, 3, 4)))
static void host_log(void *host, int level, const char *fmt, ...)
{
	size_t n = strlen(logbuf);
	va_list ap;

	(void)host;
	(void)level;
	va_start(ap, fmt);
	vsnprintf(logbuf + n, sizeof(logbuf) - n, fmt, ap);
	va_end(ap);
	n = strlen(logbuf);
	if (n + 1 < sizeof(logbuf)) {
		logbuf[n] = '\n';
		logbuf[n + 1] = 0;
	}
}

static const struct pkv_host_api host_api = {
	.abi_version = PKV_BACKEND_ABI_VERSION,
	.struct_size = sizeof(struct pkv_host_api),
	.log = host_log,
};

static const struct pkv_dict no_options;

static void *open_plugin(int i)
{
	const char *dir = getenv("PKV_PLUGIN_BUILD_DIR");
	char path[1024];
	void *dl;

	ck_assert_msg(dir != NULL, "PKV_PLUGIN_BUILD_DIR is not set (run through make check)");
	snprintf(path, sizeof(path), "%s/%s", dir, plugin_rel[i]);
	dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(dl != NULL, "dlopen %s: %s", path, dlerror());
	return dl;
}

static const struct pkv_backend *get_backend(void *dl, uint32_t index)
{
	pkv_backend_enum_fn fn = (pkv_backend_enum_fn)dlsym(dl, PKV_BACKEND_ENUM_SYMBOL);
	const struct pkv_backend *be = NULL;

	ck_assert_ptr_nonnull(fn);
	ck_assert_int_eq(fn(index, &be), 0);
	ck_assert_ptr_nonnull(be);
	return be;
}

START_TEST(exports_only_the_entry_point)
{
	void *dl = open_plugin(_i);

	ck_assert_ptr_nonnull(dlsym(dl, PKV_BACKEND_ENUM_SYMBOL));
	/* Internal functions and the CUDA runtime's symbols must stay hidden. */
	ck_assert_ptr_null(dlsym(dl, "pkv_cuda_be_init"));
	ck_assert_ptr_null(dlsym(dl, "pkv_cuda_attention"));
	dlclose(dl);
}
END_TEST

START_TEST(enumerates_one_cuda_backend)
{
	void *dl = open_plugin(_i);
	pkv_backend_enum_fn fn = (pkv_backend_enum_fn)dlsym(dl, PKV_BACKEND_ENUM_SYMBOL);
	const struct pkv_backend *be = get_backend(dl, (uint32_t)_i), *none = NULL;

	ck_assert_uint_eq(be->abi_version, PKV_BACKEND_ABI_VERSION);
	ck_assert_uint_ge(be->struct_size, sizeof(struct pkv_backend));
	ck_assert_str_eq(be->name, plugin_name[_i]);
	ck_assert_uint_eq(be->caps->domain, PKV_DOMAIN_CUDA);
	ck_assert_uint_eq(be->caps->paths, plugin_path[_i]);
	ck_assert_ptr_nonnull(be->init);
	ck_assert_ptr_nonnull(be->cache_alloc);
	ck_assert_ptr_nonnull(plugin_path[_i] == PKV_PATH_VARLEN ? (void *)be->attend_varlen
								    : (void *)be->attend_decode);
	ck_assert_int_eq(fn(2, &none), -ENOENT);
	ck_assert_ptr_null(none);
	dlclose(dl);
}
END_TEST

START_TEST(init_refuses_without_gpu)
{
	void *dl = open_plugin(_i);
	const struct pkv_backend *be = get_backend(dl, (uint32_t)_i);
	void *ctx = (void *)&ctx;
	int rc;

	logbuf[0] = 0;
	rc = be->init(&host_api, &no_options, &ctx);
	if (access("/dev/nvidia0", F_OK) == 0) {
		/* A GPU machine: the same call must succeed and tear down cleanly. */
		ck_assert_msg(rc == 0, "init failed on a machine with /dev/nvidia0: %d\n%s", rc, logbuf);
		ck_assert_ptr_nonnull(ctx);
		be->fini(ctx);
	} else {
		ck_assert_int_eq(rc, -ENODEV);
		ck_assert_ptr_null(ctx);
		ck_assert_msg(strstr(logbuf, "no CUDA device") != NULL, "log lacks the reason: %s", logbuf);
	}
	dlclose(dl);
}
END_TEST

static char sinkbuf[2048];

static void sink(void *ud, int level, const char *msg)
{
	size_t n = strlen(sinkbuf);

	(void)ud;
	(void)level;
	snprintf(sinkbuf + n, sizeof(sinkbuf) - n, "%s\n", msg);
}

/* The daemon's path: pkv_plugin_load validates the ABI, then init must fail with a reason, not crash. */
START_TEST(loader_loads_and_refuses_without_gpu)
{
	const char *dir = getenv("PKV_PLUGIN_BUILD_DIR");
	struct pkv_host *host = NULL;
	struct pkv_plugin p;
	char path[1024], err[512];
	int rc;

	ck_assert_ptr_nonnull(dir);
	snprintf(path, sizeof(path), "%s/%s", dir, plugin_rel[_i]);
	ck_assert_int_eq(pkv_host_create(1, PKV_LOG_DEBUG, &host), 0);
	sinkbuf[0] = 0;
	pkv_host_set_log_sink(host, sink, NULL);
	rc = pkv_plugin_load(path, plugin_name[_i], NULL, NULL, host, &p, err, sizeof(err));
	if (access("/dev/nvidia0", F_OK) == 0) {
		ck_assert_msg(rc == 0, "load failed on a GPU machine: %s", err);
		ck_assert_uint_eq(p.be->caps->domain, PKV_DOMAIN_CUDA);
		pkv_plugin_unload(&p);
	} else {
		ck_assert_int_eq(rc, -ENODEV);
		ck_assert_msg(strstr(err, "pkv_cuda.so") != NULL, "error does not name the file: %s", err);
		ck_assert_msg(strstr(sinkbuf, "no CUDA device") != NULL, "log lacks the reason: %s", sinkbuf);
	}
	pkv_host_destroy(host);
}
END_TEST

START_TEST(methods_reject_missing_context)
{
	void *dl = open_plugin(_i);
	const struct pkv_backend *be = get_backend(dl, (uint32_t)_i);
	struct pkv_pool_desc pool = { .abi_version = PKV_BACKEND_ABI_VERSION, .struct_size = sizeof(pool) };
	struct pkv_cache_mem mem;
	struct pkv_attn_batch b = { .abi_version = PKV_BACKEND_ABI_VERSION, .struct_size = sizeof(b) };

	memset(&mem, 0, sizeof(mem));
	ck_assert_int_eq(be->init(&host_api, &no_options, NULL), -EINVAL);
	ck_assert_int_eq(be->cache_alloc(NULL, &pool, &mem), -EINVAL);
	if (be->attend_varlen)
		ck_assert_int_eq(be->attend_varlen(NULL, &mem, &b), -EINVAL);
	if (be->attend_decode)
		ck_assert_int_eq(be->attend_decode(NULL, &mem, &b), -EINVAL);
	ck_assert_int_eq(be->copy_blocks(NULL, &mem, NULL, 0), -EINVAL);
	ck_assert_int_eq(be->sync(NULL), -EINVAL);
	be->fini(NULL);
	dlclose(dl);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cuda-plugins");
	TCase *tc = tcase_create("load");

	tcase_add_loop_test(tc, exports_only_the_entry_point, 0, 2);
	tcase_add_loop_test(tc, enumerates_one_cuda_backend, 0, 2);
	tcase_add_loop_test(tc, init_refuses_without_gpu, 0, 2);
	tcase_add_loop_test(tc, loader_loads_and_refuses_without_gpu, 0, 2);
	tcase_add_loop_test(tc, methods_reject_missing_context, 0, 2);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
