/* SPDX-License-Identifier: MIT */
/* GGUF v3 writer: metadata and tensor-info sections are built apart, then joined behind the header. */
#include "gguf_write.h"
#include "../../examples/llama/gguf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void put(struct gbuf *g, const void *v, size_t n)
{
	if (g->oom)
		return;
	if (g->len + n > g->cap) {
		size_t nc = g->cap ? g->cap : 256;
		while (nc < g->len + n)
			nc *= 2;
		uint8_t *p = realloc(g->p, nc);
		if (!p) {
			g->oom = 1;
			return;
		}
		g->p = p;
		g->cap = nc;
	}
	if (n)
		memcpy(g->p + g->len, v, n);
	g->len += n;
}

static void put_u32(struct gbuf *g, uint32_t v) { put(g, &v, 4); }
static void put_u64(struct gbuf *g, uint64_t v) { put(g, &v, 8); }

static void put_str(struct gbuf *g, const char *s)
{
	put_u64(g, strlen(s));
	put(g, s, strlen(s));
}

static size_t vsize(uint32_t t)
{
	static const uint8_t sz[GGUF_VTYPE_COUNT] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
	return t < GGUF_VTYPE_COUNT ? sz[t] : 0;
}

void gb_init(struct gguf_builder *b, uint32_t alignment)
{
	memset(b, 0, sizeof *b);
	b->alignment = alignment ? alignment : 32;
	if (b->alignment != 32)
		gb_kv_u32(b, "general.alignment", b->alignment);
}

void gb_kv_scalar(struct gguf_builder *b, const char *key, uint32_t type, const void *v)
{
	put_str(&b->kv, key);
	put_u32(&b->kv, type);
	put(&b->kv, v, vsize(type));
	b->n_kv++;
}

void gb_kv_u32(struct gguf_builder *b, const char *key, uint32_t v)
{
	gb_kv_scalar(b, key, GGUF_U32, &v);
}

void gb_kv_f32(struct gguf_builder *b, const char *key, float v)
{
	gb_kv_scalar(b, key, GGUF_F32, &v);
}

void gb_kv_bool(struct gguf_builder *b, const char *key, int v)
{
	uint8_t x = v != 0;
	gb_kv_scalar(b, key, GGUF_BOOL, &x);
}

void gb_kv_str(struct gguf_builder *b, const char *key, const char *v)
{
	put_str(&b->kv, key);
	put_u32(&b->kv, GGUF_STRING);
	put_str(&b->kv, v);
	b->n_kv++;
}

void gb_kv_arr(struct gguf_builder *b, const char *key, uint32_t et, const void *v, uint64_t n)
{
	put_str(&b->kv, key);
	put_u32(&b->kv, GGUF_ARRAY);
	put_u32(&b->kv, et);
	put_u64(&b->kv, n);
	put(&b->kv, v, vsize(et) * n);
	b->n_kv++;
}

void gb_kv_arr_str(struct gguf_builder *b, const char *key, const char *const *v, uint64_t n)
{
	put_str(&b->kv, key);
	put_u32(&b->kv, GGUF_ARRAY);
	put_u32(&b->kv, GGUF_STRING);
	put_u64(&b->kv, n);
	for (uint64_t i = 0; i < n; i++)
		put_str(&b->kv, v[i]);
	b->n_kv++;
}

void gb_tensor(struct gguf_builder *b, const char *name, uint32_t type, const uint64_t *ne, uint32_t n_dims,
	       const void *data, size_t nbytes)
{
	static const uint8_t zero[64] = { 0 };
	put_str(&b->ti, name);
	put_u32(&b->ti, n_dims);
	for (uint32_t d = 0; d < n_dims; d++)
		put_u64(&b->ti, ne[d]);
	put_u32(&b->ti, type);
	put_u64(&b->ti, b->data.len);
	put(&b->data, data, nbytes);
	while (b->data.len % b->alignment)
		put(&b->data, zero, b->alignment - b->data.len % b->alignment < 64 ?
				    b->alignment - b->data.len % b->alignment : 64);
	b->n_t++;
}

int gb_finish(struct gguf_builder *b, uint8_t **out, size_t *len)
{
	struct gbuf f = { 0 };
	static const uint8_t zero[64] = { 0 };
	put_u32(&f, 0x46554747u);
	put_u32(&f, 3);
	put_u64(&f, b->n_t);
	put_u64(&f, b->n_kv);
	put(&f, b->kv.p, b->kv.len);
	put(&f, b->ti.p, b->ti.len);
	while (f.len % b->alignment)
		put(&f, zero, b->alignment - f.len % b->alignment < 64 ? b->alignment - f.len % b->alignment : 64);
	put(&f, b->data.p, b->data.len);
	int oom = f.oom || b->kv.oom || b->ti.oom || b->data.oom;
	gb_free(b);
	if (oom) {
		free(f.p);
		return -ENOMEM;
	}
	*out = f.p;
	*len = f.len;
	return 0;
}

void gb_free(struct gguf_builder *b)
{
	free(b->kv.p);
	free(b->ti.p);
	free(b->data.p);
	memset(b, 0, sizeof *b);
}
