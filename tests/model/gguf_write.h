/* SPDX-License-Identifier: MIT */
/* A small GGUF v3 writer: builds a file image in memory (test fixtures, random-weight models). */
#ifndef PKV_EX_GGUF_WRITE_H
#define PKV_EX_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

struct gbuf {
	uint8_t *p;
	size_t len, cap;
	int oom;
};

struct gguf_builder {
	struct gbuf kv, ti, data;
	uint64_t n_kv, n_t;
	uint32_t alignment;
};

void gb_init(struct gguf_builder *b, uint32_t alignment); /* also writes general.alignment if != 32 */
void gb_kv_scalar(struct gguf_builder *b, const char *key, uint32_t type, const void *v); /* any scalar type */
void gb_kv_u32(struct gguf_builder *b, const char *key, uint32_t v);
void gb_kv_f32(struct gguf_builder *b, const char *key, float v);
void gb_kv_bool(struct gguf_builder *b, const char *key, int v);
void gb_kv_str(struct gguf_builder *b, const char *key, const char *v);
void gb_kv_arr(struct gguf_builder *b, const char *key, uint32_t elem_type, const void *v, uint64_t n);
void gb_kv_arr_str(struct gguf_builder *b, const char *key, const char *const *v, uint64_t n);
/* ne[0] innermost. Data is copied and padded to the alignment. */
void gb_tensor(struct gguf_builder *b, const char *name, uint32_t type, const uint64_t *ne, uint32_t n_dims,
	       const void *data, size_t nbytes);
/* Assembles the image (malloc'd). 0 or -ENOMEM. The builder is freed either way. */
int gb_finish(struct gguf_builder *b, uint8_t **out, size_t *len);
void gb_free(struct gguf_builder *b);

#endif
