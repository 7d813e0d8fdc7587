/* SPDX-License-Identifier: MIT */
/* Test fixtures: a small GGUF image that uses every metadata type, arrays and two tensors. */
#ifndef PKV_TEST_FIXTURES_H
#define PKV_TEST_FIXTURES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../examples/llama/gguf.h"
#include "gguf_write.h"

static inline int fixture_gguf(uint32_t alignment, uint8_t **img, size_t *len)
{
	struct gguf_builder b;
	uint8_t u8 = 200;
	int8_t i8 = -5;
	uint16_t u16 = 60000;
	int16_t i16 = -3000;
	int32_t i32 = -70000;
	uint64_t u64 = 1ull << 40;
	int64_t i64 = -(1ll << 40);
	double f64 = 2.5;
	float fa[3] = { 1.f, -2.f, 0.5f };
	int32_t ia[4] = { 3, 1, 4, 1 };
	const char *sa[3] = { "a", "", "hello" };
	float w[64];
	uint64_t ne2[2] = { 32, 2 }, ne1[1] = { 8 };

	gb_init(&b, alignment);
	gb_kv_str(&b, "general.architecture", "test");
	gb_kv_scalar(&b, "t.u8", GGUF_U8, &u8);
	gb_kv_scalar(&b, "t.i8", GGUF_I8, &i8);
	gb_kv_scalar(&b, "t.u16", GGUF_U16, &u16);
	gb_kv_scalar(&b, "t.i16", GGUF_I16, &i16);
	gb_kv_u32(&b, "t.u32", 123456);
	gb_kv_scalar(&b, "t.i32", GGUF_I32, &i32);
	gb_kv_f32(&b, "t.f32", 0.25f);
	gb_kv_bool(&b, "t.bool", 1);
	gb_kv_scalar(&b, "t.u64", GGUF_U64, &u64);
	gb_kv_scalar(&b, "t.i64", GGUF_I64, &i64);
	gb_kv_scalar(&b, "t.f64", GGUF_F64, &f64);
	gb_kv_arr(&b, "t.arr_f32", GGUF_F32, fa, 3);
	gb_kv_arr(&b, "t.arr_i32", GGUF_I32, ia, 4);
	gb_kv_arr_str(&b, "t.arr_str", sa, 3);
	for (int i = 0; i < 64; i++)
		w[i] = (float)i * 0.5f - 3.f;
	gb_tensor(&b, "w.f32", GGML_F32, ne2, 2, w, sizeof w);
	gb_tensor(&b, "v.f32", GGML_F32, ne1, 1, w, 8 * sizeof(float));
	return gb_finish(&b, img, len);
}

#endif
