/* SPDX-License-Identifier: MIT */
/* Feeds a CUDA plugin malformed batches and requests: each must be refused with -EINVAL, never crash, and leave the plugin usable. */

/*
 * Usage: hostile_batches [PKV_CUDA.so]   (TAP on stdout)
 * make check runs it on the plugin's host code built against the fake CUDA
 * runtime (tests/cuda/.libs/pkv_cuda_fake.so, the default), so it needs no
 * GPU; it runs unchanged on the real pkv_cuda.so and a GPU.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagedkv/backend.h>

static int test_no, failed;

static void h_log(void *host, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void h_log(void *host, int level, const char *fmt, ...)
{
	(void)host;
	(void)level;
	(void)fmt; /* refusals are expected here; their messages would only be noise */
}

static const struct pkv_host_api host_api = {
	.abi_version = PKV_BACKEND_ABI_VERSION,
	.struct_size = sizeof(struct pkv_host_api),
	.log = h_log,
};

static const struct pkv_dict no_options;

static void expect(int got, int want, const char *what)
{
	const int ok = got == want;
	printf("%s %d - %s: got %d, want %d\n", ok ? "ok" : "not ok", ++test_no, what, got, want);
	failed += !ok;
}

/* A small valid pool and decode-or-prefill batch that each test then breaks in one place. */
enum { L = 2, H = 4, HKV = 2, D = 64, BS = 16, NB = 8, T = 3 };

struct fixture {
	int32_t cuq[3], cuk[3], bt[2 * 4], seqlens[2];
	int64_t slots[T];
	uint16_t q[T * H * D], kn[T * HKV * D], vn[T * HKV * D], o[T * H * D];
	struct pkv_attn_batch b;
};

static void fixture_init(struct fixture *f)
{
	int i;

	memset(f, 0, sizeof(*f));
	/* Sequence 0: 2 new tokens over 20 keys; sequence 1: 1 new token over 5 keys. */
	f->cuq[0] = 0, f->cuq[1] = 2, f->cuq[2] = 3;
	f->cuk[0] = 0, f->cuk[1] = 20, f->cuk[2] = 25;
	f->seqlens[0] = 18, f->seqlens[1] = 4;
	for (i = 0; i < 8; i++)
		f->bt[i] = -1;
	f->bt[0] = 3, f->bt[1] = 5; /* sequence 0: keys 0..19 in blocks 3, 5 */
	f->bt[4] = 6;               /* sequence 1: keys 0..4 in block 6 */
	f->slots[0] = 5 * BS + 2, f->slots[1] = 5 * BS + 3, f->slots[2] = 6 * BS + 4;
	for (i = 0; i < T * H * D; i++)
		f->q[i] = 0x3c00; /* 1.0 in f16 */
	for (i = 0; i < T * HKV * D; i++)
		f->kn[i] = f->vn[i] = 0x3800; /* 0.5 */
	f->b = (struct pkv_attn_batch){
		.abi_version = PKV_BACKEND_ABI_VERSION,
		.struct_size = sizeof(struct pkv_attn_batch),
		.layer = 1,
		.num_seqs = 2,
		.total_q = T,
		.act_dtype = PKV_DTYPE_F16,
		.q = f->q, .k_new = f->kn, .v_new = f->vn, .o = f->o,
		.q_stride_tok = H * D, .q_stride_head = D,
		.kv_stride_tok = HKV * D, .kv_stride_head = D,
		.o_stride_tok = H * D, .o_stride_head = D,
		.cu_seq_lens_q = f->cuq, .cu_seq_lens_k = f->cuk,
		.max_length_q = 2, .max_length_k = 20,
		.block_tables = f->bt, .max_blocks_per_seq = 4,
		.cache_seqlens = f->seqlens, .slot_mapping = f->slots,
		.window_left = -1,
	};
}

/* Backend `index` of the library (0 varlen, 1 decode), initialised. */
static const struct pkv_backend *open_backend(const char *path, uint32_t index, void **ctx)
{
	pkv_backend_enum_fn fn;
	const struct pkv_backend *be = NULL;
	void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);

	if (!dl) {
		fprintf(stderr, "hostile: dlopen %s: %s\n", path, dlerror());
		return NULL;
	}
	*(void **)&fn = dlsym(dl, PKV_BACKEND_ENUM_SYMBOL);
	if (!fn || fn(index, &be) || be->init(&host_api, &no_options, ctx))
		return NULL;
	return be;
}

int main(int argc, char **argv)
{
	const struct pkv_backend *vl, *dc;
	void *vctx = NULL, *dctx = NULL;
	struct pkv_pool_desc pool = {
		.abi_version = PKV_BACKEND_ABI_VERSION,
		.struct_size = sizeof(pool),
		.geo = { .num_layers = L, .num_heads = H, .num_kv_heads = HKV, .head_dim = D,
			 .cache_dtype = PKV_DTYPE_F16, .block_size = BS, .num_blocks = NB },
		.act_dtype = PKV_DTYPE_F16,
	};
	struct pkv_cache_mem mem = { .abi_version = PKV_BACKEND_ABI_VERSION, .struct_size = sizeof(mem) };
	struct fixture f;
	struct pkv_block_copy cp;
	char buf[64], path[1024];

	if (argc > 2) {
		fprintf(stderr, "usage: %s [PKV_CUDA.so]\n", argv[0]);
		return 2;
	}
	snprintf(path, sizeof(path), "%s/tests/cuda/.libs/pkv_cuda_fake.so",
		 getenv("PKV_TOP_BUILDDIR") ? getenv("PKV_TOP_BUILDDIR") : ".");
	vl = open_backend(argc > 1 ? argv[1] : path, 0, &vctx);
	dc = open_backend(argc > 1 ? argv[1] : path, 1, &dctx);
	if (!vl || !dc)
		return 77; /* no device (a real plugin without a GPU): nothing to check */
	printf("1..22\n");
	expect(vl->cache_alloc(vctx, &pool, &mem), 0, "valid pool allocates");

	fixture_init(&f);
	expect(vl->attend_varlen(vctx, &mem, &f.b), 0, "valid varlen batch runs");

#define BREAK(what, stmt, call)         \
	do {                            \
		fixture_init(&f);       \
		stmt;                   \
		expect(call, -EINVAL, what); \
	} while (0)

	BREAK("block table entry past num_blocks", f.bt[1] = NB, vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("block table -1 under a needed key", f.bt[1] = -1, vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("slot past the cache", f.slots[2] = (int64_t)NB * BS, vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("cu_seq_lens_q not starting at 0", f.cuq[0] = 1, vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("cu_seq_lens_q decreasing", (f.cuq[1] = 4, f.cuq[2] = 3), vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("total_q differs from cu_seq_lens_q", f.b.total_q = 2, vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("keys beyond the block table", f.b.max_blocks_per_seq = 1, vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("layer past num_layers", f.b.layer = L, vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("unknown activation dtype", f.b.act_dtype = 7, vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("negative stride", f.b.q_stride_head = -D, vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("struct_size too small", f.b.struct_size = 16, vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("NULL Q with rows", f.b.q = NULL, vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("NaN scale", f.b.scale = __builtin_nanf(""), vl->attend_varlen(vctx, &mem, &f.b));
	BREAK("decode path with two queries in a sequence", (void)0, dc->attend_decode(dctx, &mem, &f.b));

	cp.src = NB, cp.dst = 0;
	expect(vl->copy_blocks(vctx, &mem, &cp, 1), -EINVAL, "copy_blocks source past num_blocks");
	cp.src = 0, cp.dst = -1;
	expect(dc->copy_blocks(dctx, &mem, &cp, 1), -EINVAL, "copy_blocks negative destination");
	expect(vl->cache_read(vctx, &mem, 0, mem.bytes / 2 - 8, buf, 16), -EINVAL, "cache_read past the K region");
	expect(vl->cache_read(vctx, &mem, 2, 0, buf, 8), -EINVAL, "cache_read of neither K nor V");

	/* After every refusal the plugins still work, on the same cache. */
	fixture_init(&f);
	expect(vl->attend_varlen(vctx, &mem, &f.b), 0, "varlen still works after the refusals");
	{
		int32_t cuq[3] = { 0, 1, 2 }, cuk[3] = { 0, 21, 27 };
		int64_t slots[2] = { 5 * BS + 4, 6 * BS + 5 };
		f.b.cu_seq_lens_q = cuq;
		f.b.cu_seq_lens_k = cuk;
		f.b.slot_mapping = slots;
		f.b.total_q = 2;
		f.b.max_length_q = 1;
		expect(dc->attend_decode(dctx, &mem, &f.b), 0, "decode on the varlen plugin's cache");
	}
	vl->cache_free(vctx, &mem);
	dc->fini(dctx);
	vl->fini(vctx);
	return failed ? 1 : 0;
}
