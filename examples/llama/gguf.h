/* SPDX-License-Identifier: MIT */
/* GGUF v3 reader: maps a file, validates header, metadata and tensor infos, and gives typed access. */
#ifndef PKV_EX_GGUF_H
#define PKV_EX_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* Metadata value types (GGUF spec numbering). */
enum gguf_vtype {
	GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5,
	GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10,
	GGUF_I64 = 11, GGUF_F64 = 12, GGUF_VTYPE_COUNT
};

/* Tensor element types we know the block layout of (GGML numbering). */
enum ggml_type {
	GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
	GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_BF16 = 30,
};

struct gguf_str {
	const char *s; /* points into the mapping: NOT NUL-terminated */
	uint64_t len;
};

struct gguf_kv {
	struct gguf_str key;
	uint32_t type;          /* enum gguf_vtype */
	uint32_t arr_type;      /* element type when type == GGUF_ARRAY */
	uint64_t arr_n;         /* element count when type == GGUF_ARRAY */
	const uint8_t *data;    /* the value (scalar bytes, string record, or first array element) */
	uint64_t data_len;      /* bytes the value occupies in the file */
};

#define GGUF_MAX_DIMS 4

struct gguf_tensor {
	struct gguf_str name;
	uint32_t n_dims;
	uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the innermost (row length) */
	uint32_t type;              /* enum ggml_type */
	uint64_t offset;            /* relative to the data section */
	uint64_t nbytes;
	const void *data;           /* into the mapping */
};

struct gguf {
	const uint8_t *base;
	size_t size;
	int mapped;                 /* base was mmap'd by gguf_open */
	uint32_t version;
	uint64_t n_kv, n_tensors;
	struct gguf_kv *kv;
	struct gguf_tensor *tensors;
	uint64_t alignment;
	uint64_t data_offset;
	char err[256];              /* why the last parse failed */
};

/* Parses an in-memory image (not copied; must outlive g). 0 or -EINVAL/-ENOMEM; g->err says why. */
int gguf_parse(struct gguf *g, const void *buf, size_t size);
/* Maps path read-only and parses it. On failure errbuf (if given) receives the reason. */
int gguf_open(struct gguf *g, const char *path);
void gguf_close(struct gguf *g);

/* Size of one block and elements per block for a tensor type; 0 when unknown. */
size_t ggml_type_block_bytes(uint32_t type);
uint32_t ggml_type_block_elems(uint32_t type);
const char *ggml_type_name(uint32_t type);

const struct gguf_kv *gguf_find(const struct gguf *g, const char *key);
const struct gguf_tensor *gguf_tensor(const struct gguf *g, const char *name);

/* Typed getters: 0 on success, -ENOENT when absent, -EINVAL on a type that cannot convert. */
int gguf_get_u64(const struct gguf *g, const char *key, uint64_t *out);
int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out);
int gguf_get_f32(const struct gguf *g, const char *key, float *out);
int gguf_get_bool(const struct gguf *g, const char *key, int *out);
int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out);

/* Array access: all strings of a string array (out has kv->arr_n entries), or element i of a numeric array. */
int gguf_arr_strs(const struct gguf_kv *kv, struct gguf_str *out);
int gguf_arr_f32(const struct gguf_kv *kv, uint64_t i, float *out);
int gguf_arr_i64(const struct gguf_kv *kv, uint64_t i, int64_t *out);

int gguf_str_eq(struct gguf_str s, const char *c);

#endif
