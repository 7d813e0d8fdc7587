/* SPDX-License-Identifier: MIT */
/* GGUF v3 reader: every length, count and offset from the file is checked before use. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" read little-endian */
/* Caps that keep a hostile header from asking for absurd allocations. */
#define MAX_KV (1u << 20)
#define MAX_TENSORS (1u << 20)
#define MAX_NEST 1 /* arrays of arrays are not used by any model we load */

struct cur {
	const uint8_t *p, *end;
	struct gguf *g;
};

__attribute__((format(printf, 2, 3)))
static int fail(struct gguf *g, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(g->err, sizeof g->err, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static size_t left(const struct cur *c)
{
	return (size_t)(c->end - c->p);
}

static int take(struct cur *c, uint64_t n, const uint8_t **out, const char *what)
{
	if (n > left(c))
		return fail(c->g, "truncated file: %s needs %llu bytes at offset %zu, %zu left", what,
			    (unsigned long long)n, (size_t)(c->p - c->g->base), left(c));
	*out = c->p;
	c->p += n;
	return 0;
}

static int rd_u32(struct cur *c, uint32_t *v, const char *what)
{
	const uint8_t *p = NULL;
	int r = take(c, 4, &p, what);
	if (r)
		return r;
	memcpy(v, p, 4);
	return 0;
}

static int rd_u64(struct cur *c, uint64_t *v, const char *what)
{
	const uint8_t *p = NULL;
	int r = take(c, 8, &p, what);
	if (r)
		return r;
	memcpy(v, p, 8);
	return 0;
}

static int rd_str(struct cur *c, struct gguf_str *s, const char *what)
{
	const uint8_t *p = NULL;
	int r = rd_u64(c, &s->len, what);
	if (r)
		return r;
	r = take(c, s->len, &p, what);
	if (r)
		return r;
	s->s = (const char *)p;
	return 0;
}

static const uint8_t scalar_size[GGUF_VTYPE_COUNT] = {
	[GGUF_U8] = 1, [GGUF_I8] = 1, [GGUF_U16] = 2, [GGUF_I16] = 2, [GGUF_U32] = 4,
	[GGUF_I32] = 4, [GGUF_F32] = 4, [GGUF_BOOL] = 1, [GGUF_U64] = 8, [GGUF_I64] = 8,
	[GGUF_F64] = 8,
};

static int skip_value(struct cur *c, uint32_t type, struct gguf_kv *kv, int depth)
{
	const uint8_t *p = NULL;
	if (type >= GGUF_VTYPE_COUNT)
		return fail(c->g, "unknown metadata value type %u", type);
	if (type == GGUF_STRING) {
		struct gguf_str s;
		return rd_str(c, &s, "metadata string");
	}
	if (type == GGUF_ARRAY) {
		uint32_t at;
		uint64_t n;
		int r;
		if (depth >= MAX_NEST)
			return fail(c->g, "nested metadata arrays are not supported");
		if ((r = rd_u32(c, &at, "array type")) || (r = rd_u64(c, &n, "array length")))
			return r;
		if (at >= GGUF_VTYPE_COUNT || at == GGUF_ARRAY)
			return fail(c->g, "bad metadata array element type %u", at);
		if (kv) {
			kv->arr_type = at;
			kv->arr_n = n;
			kv->data = c->p;
		}
		if (at == GGUF_STRING) {
			/* Each string needs at least its 8-byte length: rejects huge counts early. */
			if (n > left(c) / 8)
				return fail(c->g, "truncated file: string array of %llu entries",
					    (unsigned long long)n);
			for (uint64_t i = 0; i < n; i++)
				if ((r = skip_value(c, GGUF_STRING, NULL, depth + 1)))
					return r;
			return 0;
		}
		if (n > left(c) / scalar_size[at])
			return fail(c->g, "truncated file: array of %llu elements of type %u",
				    (unsigned long long)n, at);
		return take(c, n * scalar_size[at], &p, "array");
	}
	return take(c, scalar_size[type], &p, "metadata value");
}

size_t ggml_type_block_bytes(uint32_t type)
{
	switch (type) {
	case GGML_F32: return 4;
	case GGML_F16: return 2;
	case GGML_BF16: return 2;
	case GGML_Q4_0: return 18;
	case GGML_Q4_1: return 20;
	case GGML_Q5_0: return 22;
	case GGML_Q5_1: return 24;
	case GGML_Q8_0: return 34;
	case GGML_Q4_K: return 144;
	case GGML_Q5_K: return 176;
	case GGML_Q6_K: return 210;
	default: return 0;
	}
}

uint32_t ggml_type_block_elems(uint32_t type)
{
	switch (type) {
	case GGML_F32: case GGML_F16: case GGML_BF16: return 1;
	case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1: case GGML_Q8_0: return 32;
	case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K: return 256;
	default: return 0;
	}
}

const char *ggml_type_name(uint32_t type)
{
	switch (type) {
	case GGML_F32: return "F32";
	case GGML_F16: return "F16";
	case GGML_BF16: return "BF16";
	case GGML_Q4_0: return "Q4_0";
	case GGML_Q4_1: return "Q4_1";
	case GGML_Q5_0: return "Q5_0";
	case GGML_Q5_1: return "Q5_1";
	case GGML_Q8_0: return "Q8_0";
	case GGML_Q4_K: return "Q4_K";
	case GGML_Q5_K: return "Q5_K";
	case GGML_Q6_K: return "Q6_K";
	default: return "unknown";
	}
}

int gguf_str_eq(struct gguf_str s, const char *c)
{
	size_t n = strlen(c);
	return s.len == n && memcmp(s.s, c, n) == 0;
}

static int parse_tensor(struct cur *c, struct gguf_tensor *t)
{
	struct gguf *g = c->g;
	uint64_t nel = 1, bsz, belem;
	int r;
	if ((r = rd_str(c, &t->name, "tensor name")) || (r = rd_u32(c, &t->n_dims, "tensor dims")))
		return r;
	if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
		return fail(g, "tensor '%.*s': %u dimensions (1..%d allowed)", (int)(t->name.len > 64 ? 64 : t->name.len),
			    t->name.s, t->n_dims, GGUF_MAX_DIMS);
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
		t->ne[d] = 1;
	for (uint32_t d = 0; d < t->n_dims; d++) {
		if ((r = rd_u64(c, &t->ne[d], "tensor shape")))
			return r;
		if (t->ne[d] == 0 || __builtin_mul_overflow(nel, t->ne[d], &nel) || nel > (1ull << 48))
			return fail(g, "tensor '%.*s': bad shape", (int)(t->name.len > 64 ? 64 : t->name.len), t->name.s);
	}
	if ((r = rd_u32(c, &t->type, "tensor type")) || (r = rd_u64(c, &t->offset, "tensor offset")))
		return r;
	bsz = ggml_type_block_bytes(t->type);
	belem = ggml_type_block_elems(t->type);
	if (!bsz)
		return fail(g, "tensor '%.*s': unsupported type %u", (int)(t->name.len > 64 ? 64 : t->name.len),
			    t->name.s, t->type);
	if (t->ne[0] % belem)
		return fail(g, "tensor '%.*s': row length %llu not a multiple of the %s block (%llu)",
			    (int)(t->name.len > 64 ? 64 : t->name.len), t->name.s,
			    (unsigned long long)t->ne[0], ggml_type_name(t->type), (unsigned long long)belem);
	t->nbytes = nel / belem * bsz; /* nel < 2^48, at most 4 bytes per element: no overflow */
	return 0;
}


static int cmp_tensor_name(const void *a, const void *b)
{
	const struct gguf_str *x = &(*(const struct gguf_tensor *const *)a)->name;
	const struct gguf_str *y = &(*(const struct gguf_tensor *const *)b)->name;
	int c = memcmp(x->s, y->s, x->len < y->len ? x->len : y->len);

	return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Sorting makes the check O(n log n): a hostile file may declare a million tensors. */
static int check_unique_names(struct gguf *g)
{
	const struct gguf_tensor **by_name;
	int r = 0;

	if (g->n_tensors < 2)
		return 0;
	by_name = malloc(g->n_tensors * sizeof(*by_name));
	if (!by_name)
		return fail(g, "out of memory checking %llu tensor names", (unsigned long long)g->n_tensors);
	for (uint64_t i = 0; i < g->n_tensors; i++)
		by_name[i] = &g->tensors[i];
	qsort(by_name, g->n_tensors, sizeof(*by_name), cmp_tensor_name);
	for (uint64_t i = 1; i < g->n_tensors && !r; i++)
		if (!cmp_tensor_name(&by_name[i - 1], &by_name[i]))
			r = fail(g, "duplicate tensor name '%.*s'",
				 (int)(by_name[i]->name.len > 64 ? 64 : by_name[i]->name.len), by_name[i]->name.s);
	free(by_name);
	return r;
}

int gguf_parse(struct gguf *g, const void *buf, size_t size)
{
	struct cur c = { .p = buf, .end = (const uint8_t *)buf + size, .g = g };
	uint32_t magic;
	int r;

	memset(g, 0, sizeof *g);
	g->base = buf;
	g->size = size;
	g->alignment = 32;
	if ((r = rd_u32(&c, &magic, "magic")))
		return r;
	if (magic != GGUF_MAGIC)
		return fail(g, "not a GGUF file (bad magic)");
	if ((r = rd_u32(&c, &g->version, "version")))
		return r;
	if (g->version != 3)
		return fail(g, "GGUF version %u is not supported (only 3)", g->version);
	if ((r = rd_u64(&c, &g->n_tensors, "tensor count")) || (r = rd_u64(&c, &g->n_kv, "metadata count")))
		return r;
	if (g->n_kv > MAX_KV || g->n_kv > left(&c) / 12)
		return fail(g, "metadata count %llu is implausible for a %zu-byte file",
			    (unsigned long long)g->n_kv, size);
	if (g->n_tensors > MAX_TENSORS || g->n_tensors > left(&c) / 24)
		return fail(g, "tensor count %llu is implausible for a %zu-byte file",
			    (unsigned long long)g->n_tensors, size);
	g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
	g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
	if (!g->kv || !g->tensors) {
		r = -ENOMEM;
		snprintf(g->err, sizeof g->err, "out of memory");
		goto err;
	}
	for (uint64_t i = 0; i < g->n_kv; i++) {
		struct gguf_kv *kv = &g->kv[i];
		const uint8_t *start;
		if ((r = rd_str(&c, &kv->key, "metadata key")) || (r = rd_u32(&c, &kv->type, "metadata type")))
			goto err;
		start = c.p;
		kv->data = c.p;
		if ((r = skip_value(&c, kv->type, kv, 0)))
			goto err;
		kv->data_len = (uint64_t)(c.p - start);
	}
	for (uint64_t i = 0; i < g->n_kv; i++) {
		if (gguf_str_eq(g->kv[i].key, "general.alignment")) {
			uint64_t a;
			if (gguf_get_u64(g, "general.alignment", &a) || a == 0 || (a & (a - 1)) || a > 65536) {
				r = fail(g, "general.alignment must be a power of two <= 65536");
				goto err;
			}
			g->alignment = a;
		}
	}
	for (uint64_t i = 0; i < g->n_tensors; i++)
		if ((r = parse_tensor(&c, &g->tensors[i])))
			goto err;
	{
		uint64_t pos = (uint64_t)(c.p - g->base);
		uint64_t data = (pos + g->alignment - 1) & ~(g->alignment - 1);
		if (data > size && g->n_tensors) {
			r = fail(g, "truncated file: tensor data would start at %llu beyond the end (%zu)",
				 (unsigned long long)data, size);
			goto err;
		}
		g->data_offset = data;
	}
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		struct gguf_tensor *t = &g->tensors[i];
		uint64_t avail = size - g->data_offset, end;
		if (t->offset % g->alignment) {
			r = fail(g, "tensor '%.*s': offset %llu is not aligned to %llu",
				 (int)(t->name.len > 64 ? 64 : t->name.len), t->name.s,
				 (unsigned long long)t->offset, (unsigned long long)g->alignment);
			goto err;
		}
		if (__builtin_add_overflow(t->offset, t->nbytes, &end) || end > avail) {
			r = fail(g, "truncated file: tensor '%.*s' (%llu bytes at %llu) exceeds the data section (%llu bytes)",
				 (int)(t->name.len > 64 ? 64 : t->name.len), t->name.s,
				 (unsigned long long)t->nbytes, (unsigned long long)t->offset,
				 (unsigned long long)avail);
			goto err;
		}
		t->data = g->base + g->data_offset + t->offset;
	}
	r = check_unique_names(g);
	if (r)
		goto err;
	return 0;
err:
	free(g->kv);
	free(g->tensors);
	g->kv = NULL;
	g->tensors = NULL;
	return r;
}

int gguf_open(struct gguf *g, const char *path)
{
	struct stat st;
	void *m;
	int fd, r;

	memset(g, 0, sizeof *g);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		snprintf(g->err, sizeof g->err, "%s: %s", path, strerror(errno));
		return r;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
		close(fd);
		snprintf(g->err, sizeof g->err, "%s: not a readable, non-empty regular file", path);
		return -EINVAL;
	}
	m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (m == MAP_FAILED) {
		r = -errno;
		snprintf(g->err, sizeof g->err, "%s: mmap: %s", path, strerror(errno));
		return r;
	}
	r = gguf_parse(g, m, (size_t)st.st_size);
	if (r) {
		char why[sizeof g->err];
		memcpy(why, g->err, sizeof why);
		munmap(m, (size_t)st.st_size);
		/* why is bounded so the path keeps room in the message. */
		snprintf(g->err, sizeof g->err, "%s: %.*s", path, (int)(sizeof why / 2), why);
		return r;
	}
	g->mapped = 1;
	return 0;
}

void gguf_close(struct gguf *g)
{
	if (g->mapped && g->base)
		munmap((void *)g->base, g->size);
	free(g->kv);
	free(g->tensors);
	g->kv = NULL;
	g->tensors = NULL;
	g->base = NULL;
}

const struct gguf_kv *gguf_find(const struct gguf *g, const char *key)
{
	for (uint64_t i = 0; i < g->n_kv; i++)
		if (gguf_str_eq(g->kv[i].key, key))
			return &g->kv[i];
	return NULL;
}

const struct gguf_tensor *gguf_tensor(const struct gguf *g, const char *name)
{
	for (uint64_t i = 0; i < g->n_tensors; i++)
		if (gguf_str_eq(g->tensors[i].name, name))
			return &g->tensors[i];
	return NULL;
}

/* Reads scalar of type t at p as int64/uint64/double; -EINVAL for non-numeric types. */
static int scalar_num(uint32_t t, const uint8_t *p, int64_t *i, double *d, int *is_float)
{
	union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
		float f32; uint64_t u64; int64_t i64; double f64; } u;
	if (t >= GGUF_VTYPE_COUNT || !scalar_size[t])
		return -EINVAL;
	memcpy(&u, p, scalar_size[t]);
	*is_float = 0;
	switch (t) {
	case GGUF_U8: case GGUF_BOOL: *i = u.u8; break;
	case GGUF_I8: *i = u.i8; break;
	case GGUF_U16: *i = u.u16; break;
	case GGUF_I16: *i = u.i16; break;
	case GGUF_U32: *i = u.u32; break;
	case GGUF_I32: *i = u.i32; break;
	case GGUF_U64: if (u.u64 > INT64_MAX) return -EINVAL; *i = (int64_t)u.u64; break;
	case GGUF_I64: *i = u.i64; break;
	case GGUF_F32: *d = u.f32; *is_float = 1; break;
	case GGUF_F64: *d = u.f64; *is_float = 1; break;
	default: return -EINVAL;
	}
	if (!*is_float)
		*d = (double)*i;
	return 0;
}

int gguf_get_u64(const struct gguf *g, const char *key, uint64_t *out)
{
	const struct gguf_kv *kv = gguf_find(g, key);
	int64_t i;
	double d;
	int f;
	if (!kv)
		return -ENOENT;
	if (scalar_num(kv->type, kv->data, &i, &d, &f) || f || i < 0)
		return -EINVAL;
	*out = (uint64_t)i;
	return 0;
}

int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out)
{
	uint64_t v;
	int r = gguf_get_u64(g, key, &v);
	if (r)
		return r;
	if (v > UINT32_MAX)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

int gguf_get_f32(const struct gguf *g, const char *key, float *out)
{
	const struct gguf_kv *kv = gguf_find(g, key);
	int64_t i;
	double d;
	int f;
	if (!kv)
		return -ENOENT;
	if (scalar_num(kv->type, kv->data, &i, &d, &f))
		return -EINVAL;
	*out = (float)d;
	return 0;
}

int gguf_get_bool(const struct gguf *g, const char *key, int *out)
{
	uint64_t v;
	int r = gguf_get_u64(g, key, &v);
	if (r)
		return r;
	*out = v != 0;
	return 0;
}

int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out)
{
	const struct gguf_kv *kv = gguf_find(g, key);
	uint64_t n;
	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_STRING)
		return -EINVAL;
	memcpy(&n, kv->data, 8); /* validated by the parser */
	out->len = n;
	out->s = (const char *)kv->data + 8;
	return 0;
}

int gguf_arr_strs(const struct gguf_kv *kv, struct gguf_str *out)
{
	const uint8_t *p = kv->data;
	if (kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING)
		return -EINVAL;
	/* The parser walked this array and checked every length against the file. */
	for (uint64_t i = 0; i < kv->arr_n; i++) {
		memcpy(&out[i].len, p, 8);
		out[i].s = (const char *)p + 8;
		p += 8 + out[i].len;
	}
	return 0;
}

static int arr_num(const struct gguf_kv *kv, uint64_t i, int64_t *iv, double *dv, int *f)
{
	if (kv->type != GGUF_ARRAY || kv->arr_type == GGUF_STRING || i >= kv->arr_n)
		return -EINVAL;
	return scalar_num(kv->arr_type, kv->data + i * scalar_size[kv->arr_type], iv, dv, f);
}

int gguf_arr_f32(const struct gguf_kv *kv, uint64_t i, float *out)
{
	int64_t iv;
	double dv;
	int f, r = arr_num(kv, i, &iv, &dv, &f);
	if (r)
		return r;
	*out = (float)dv;
	return 0;
}

int gguf_arr_i64(const struct gguf_kv *kv, uint64_t i, int64_t *out)
{
	int64_t iv;
	double dv;
	int f, r = arr_num(kv, i, &iv, &dv, &f);
	if (r || f)
		return r ? r : -EINVAL;
	*out = iv;
	return 0;
}
