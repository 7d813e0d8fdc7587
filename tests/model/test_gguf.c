/* SPDX-License-Identifier: MIT */
/* GGUF reader: valid files parse with every metadata type; truncated and malformed ones fail cleanly. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "../suite_main.h"

static uint8_t *img;
static size_t len;

static void setup(void)
{
	ck_assert_int_eq(fixture_gguf(32, &img, &len), 0);
}

static void teardown(void)
{
	free(img);
}

START_TEST(parses_every_metadata_type)
{
	struct gguf g;
	uint64_t u64;
	uint32_t u32;
	float f;
	int bl;
	struct gguf_str s;
	ck_assert_int_eq(gguf_parse(&g, img, len), 0);
	ck_assert_uint_eq(g.n_kv, 15);
	ck_assert_int_eq(gguf_get_u32(&g, "t.u8", &u32), 0);
	ck_assert_uint_eq(u32, 200);
	ck_assert_int_eq(gguf_get_u32(&g, "t.u16", &u32), 0);
	ck_assert_uint_eq(u32, 60000);
	ck_assert_int_eq(gguf_get_u32(&g, "t.u32", &u32), 0);
	ck_assert_uint_eq(u32, 123456);
	ck_assert_int_eq(gguf_get_u64(&g, "t.u64", &u64), 0);
	ck_assert_uint_eq(u64, 1ull << 40);
	ck_assert_int_eq(gguf_get_u32(&g, "t.u64", &u32), -EINVAL); /* does not fit */
	ck_assert_int_eq(gguf_get_u32(&g, "t.i8", &u32), -EINVAL);  /* negative */
	ck_assert_int_eq(gguf_get_f32(&g, "t.i16", &f), 0);
	ck_assert(f == -3000.f);
	ck_assert_int_eq(gguf_get_f32(&g, "t.i32", &f), 0);
	ck_assert(f == -70000.f);
	ck_assert_int_eq(gguf_get_f32(&g, "t.i64", &f), 0);
	ck_assert(f == (float)-(1ll << 40));
	ck_assert_int_eq(gguf_get_f32(&g, "t.f32", &f), 0);
	ck_assert(f == 0.25f);
	ck_assert_int_eq(gguf_get_f32(&g, "t.f64", &f), 0);
	ck_assert(f == 2.5f);
	ck_assert_int_eq(gguf_get_bool(&g, "t.bool", &bl), 0);
	ck_assert_int_eq(bl, 1);
	ck_assert_int_eq(gguf_get_str(&g, "general.architecture", &s), 0);
	ck_assert(gguf_str_eq(s, "test"));
	ck_assert_int_eq(gguf_get_str(&g, "t.u32", &s), -EINVAL);
	ck_assert_int_eq(gguf_get_u32(&g, "absent", &u32), -ENOENT);
	gguf_close(&g);
}
END_TEST

START_TEST(reads_arrays)
{
	struct gguf g;
	struct gguf_str s[3];
	float f;
	int64_t i;
	ck_assert_int_eq(gguf_parse(&g, img, len), 0);
	const struct gguf_kv *kf = gguf_find(&g, "t.arr_f32"), *ki = gguf_find(&g, "t.arr_i32"),
			     *ks = gguf_find(&g, "t.arr_str");
	ck_assert_ptr_nonnull(kf);
	ck_assert_uint_eq(kf->arr_n, 3);
	ck_assert_int_eq(gguf_arr_f32(kf, 1, &f), 0);
	ck_assert(f == -2.f);
	ck_assert_int_eq(gguf_arr_f32(kf, 3, &f), -EINVAL); /* out of bounds */
	ck_assert_int_eq(gguf_arr_i64(ki, 2, &i), 0);
	ck_assert_int_eq(i, 4);
	ck_assert_int_eq(gguf_arr_i64(kf, 0, &i), -EINVAL); /* float is not an integer */
	ck_assert_int_eq(gguf_arr_strs(ks, s), 0);
	ck_assert(gguf_str_eq(s[0], "a") && gguf_str_eq(s[1], "") && gguf_str_eq(s[2], "hello"));
	ck_assert_int_eq(gguf_arr_strs(kf, s), -EINVAL);
	gguf_close(&g);
}
END_TEST

START_TEST(finds_tensors_at_aligned_offsets)
{
	struct gguf g;
	ck_assert_int_eq(gguf_parse(&g, img, len), 0);
	const struct gguf_tensor *t = gguf_tensor(&g, "w.f32"), *v = gguf_tensor(&g, "v.f32");
	ck_assert_ptr_nonnull(t);
	ck_assert_ptr_nonnull(v);
	ck_assert_uint_eq(t->ne[0], 32);
	ck_assert_uint_eq(t->ne[1], 2);
	ck_assert_uint_eq(t->nbytes, 256);
	ck_assert_uint_eq(g.data_offset % 32, 0);
	ck_assert_uint_eq(v->offset % 32, 0);
	float x;
	memcpy(&x, (const uint8_t *)t->data + 4 * 7, 4);
	ck_assert(x == 0.5f);
	gguf_close(&g);
}
END_TEST

START_TEST(honours_custom_alignment)
{
	struct gguf g;
	uint8_t *im;
	size_t l;
	ck_assert_int_eq(fixture_gguf(256, &im, &l), 0);
	ck_assert_int_eq(gguf_parse(&g, im, l), 0);
	ck_assert_uint_eq(g.alignment, 256);
	ck_assert_uint_eq(g.data_offset % 256, 0);
	ck_assert_uint_eq(gguf_tensor(&g, "v.f32")->offset % 256, 0);
	gguf_close(&g);
	free(im);
}
END_TEST

/* Every strict prefix of a valid file is an error with a message, never a crash or a success. */
START_TEST(rejects_every_truncation)
{
	for (size_t n = 0; n < len; n++) {
		struct gguf g;
		uint8_t *cp = malloc(n ? n : 1);
		memcpy(cp, img, n);
		int r = gguf_parse(&g, cp, n);
		ck_assert_msg(r == -EINVAL, "prefix of %zu bytes: %d", n, r);
		ck_assert(g.err[0] != 0);
		free(cp);
	}
}
END_TEST

static int parse_patched(size_t off, const void *v, size_t n, char *why, size_t whylen)
{
	struct gguf g;
	uint8_t *cp = malloc(len);
	memcpy(cp, img, len);
	memcpy(cp + off, v, n);
	int r = gguf_parse(&g, cp, len);
	snprintf(why, whylen, "%s", g.err);
	if (!r)
		gguf_close(&g);
	free(cp);
	return r;
}

START_TEST(rejects_bad_magic_and_version)
{
	char why[256];
	uint32_t v = 2;
	ck_assert_int_eq(parse_patched(0, "GGUG", 4, why, sizeof why), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "magic"));
	ck_assert_int_eq(parse_patched(4, &v, 4, why, sizeof why), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "version"));
}
END_TEST

START_TEST(rejects_huge_counts)
{
	char why[256];
	uint64_t big = 1ull << 62;
	ck_assert_int_eq(parse_patched(8, &big, 8, why, sizeof why), -EINVAL);  /* tensors */
	ck_assert_int_eq(parse_patched(16, &big, 8, why, sizeof why), -EINVAL); /* metadata */
}
END_TEST

/* A string length near 2^64 must not wrap the bounds check. */
START_TEST(rejects_overflowing_string_length)
{
	char why[256];
	uint64_t big = ~0ull - 3;
	ck_assert_int_eq(parse_patched(24, &big, 8, why, sizeof why), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "truncated"));
}
END_TEST

static size_t find(const char *s)
{
	for (size_t i = 0; i + strlen(s) <= len; i++)
		if (!memcmp(img + i, s, strlen(s)))
			return i;
	ck_abort_msg("fixture lacks %s", s);
	return 0;
}

START_TEST(rejects_bad_tensor_info)
{
	char why[256];
	size_t at = find("v.f32") + 5; /* n_dims, ne[0], type, offset follow the name */
	uint32_t dims = 9, type = 77;
	uint64_t off = 3, huge = ~0ull - 7, ne0 = 1ull << 40;
	ck_assert_int_eq(parse_patched(at, &dims, 4, why, sizeof why), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "dimensions"));
	ck_assert_int_eq(parse_patched(at + 12, &type, 4, why, sizeof why), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "unsupported type"));
	ck_assert_int_eq(parse_patched(at + 16, &off, 8, why, sizeof why), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "aligned"));
	ck_assert_int_eq(parse_patched(at + 16, &huge, 8, why, sizeof why), -EINVAL);
	ck_assert_int_eq(parse_patched(at + 4, &ne0, 8, why, sizeof why), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "exceeds"));
}
END_TEST

START_TEST(rejects_bad_value_types)
{
	char why[256];
	size_t at = find("t.u8") + 4;
	uint32_t t = 13, arr = GGUF_ARRAY;
	ck_assert_int_eq(parse_patched(at, &t, 4, why, sizeof why), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "type"));
	/* an array nested in an array */
	at = find("t.arr_f32") + 9 + 4;
	ck_assert_int_eq(parse_patched(at, &arr, 4, why, sizeof why), -EINVAL);
}
END_TEST

START_TEST(rejects_duplicate_tensor_names)
{
	/* Many distinct names then one repeat: found wherever it lands after sorting. */
	struct gguf_builder b;
	uint64_t ne[1] = { 8 };
	float data[8] = { 0 };
	char name[32];
	uint8_t *buf;
	size_t n;
	struct gguf g;

	gb_init(&b, 32);
	for (int i = 0; i < 500; i++) {
		snprintf(name, sizeof(name), "t.%d", (i * 7919) % 500);
		gb_tensor(&b, name, GGML_F32, ne, 1, data, sizeof(data));
	}
	gb_tensor(&b, "t.123", GGML_F32, ne, 1, data, sizeof(data));
	ck_assert_int_eq(gb_finish(&b, &buf, &n), 0);
	ck_assert_int_eq(gguf_parse(&g, buf, n), -EINVAL);
	ck_assert_ptr_nonnull(strstr(g.err, "duplicate tensor name 't.123'"));
	free(buf);
}
END_TEST

START_TEST(open_reports_missing_file)
{
	struct gguf g;
	ck_assert_int_eq(gguf_open(&g, "/nonexistent/model.gguf"), -ENOENT);
	ck_assert_ptr_nonnull(strstr(g.err, "/nonexistent/model.gguf"));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("gguf");
	TCase *tc = tcase_create("reader");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, parses_every_metadata_type);
	tcase_add_test(tc, reads_arrays);
	tcase_add_test(tc, finds_tensors_at_aligned_offsets);
	tcase_add_test(tc, honours_custom_alignment);
	tcase_add_test(tc, rejects_every_truncation);
	tcase_add_test(tc, rejects_bad_magic_and_version);
	tcase_add_test(tc, rejects_huge_counts);
	tcase_add_test(tc, rejects_overflowing_string_length);
	tcase_add_test(tc, rejects_bad_tensor_info);
	tcase_add_test(tc, rejects_bad_value_types);
	tcase_add_test(tc, rejects_duplicate_tensor_names);
	tcase_add_test(tc, open_reports_missing_file);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
