/* SPDX-License-Identifier: MIT */
/* Each byte-level BPE pre-tokenizer (examples/llama/pretok.c) against the splits an independent
 * regex engine gives with the models' published patterns (tests/data/pretok_ref.txt, written by
 * tests/model/gen_pretok_ref.py); and a few splits a reader can check by eye. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../examples/llama/pretok.h"
#include "refdata.h"
#include "../suite_main.h"

struct pieces {
	size_t n, len[512];
};

static void collect(void *ctx, const char *piece, size_t len)
{
	struct pieces *p = ctx;

	(void)piece;
	ck_assert_uint_gt(len, 0);
	if (p->n < 512)
		p->len[p->n] = len;
	p->n++;
}

static int unhex(const char *h, char *out, size_t cap)
{
	size_t n = strlen(h) / 2;

	if (n > cap)
		return -1;
	for (size_t i = 0; i < n; i++) {
		unsigned v;

		if (sscanf(h + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (char)v;
	}
	return (int)n;
}

START_TEST(matches_reference_splits)
{
	char *line = NULL, text[4096];
	size_t cap = 0;
	unsigned cases = 0, bad = 0, kinds_seen = 0;
	FILE *f;

	f = refdata_open("pretok_ref.txt");
	while (getline(&line, &cap, f) > 0) {
		char *save, *name, *hex, *lens, *t;
		struct pieces want = { 0 }, got = { 0 };
		int kind, len = 0;

		if (line[0] == '#' || line[0] == '\n')
			continue;
		name = strtok_r(line, " \n", &save);
		hex = strtok_r(NULL, " \n", &save);
		lens = strtok_r(NULL, " \n", &save);
		ck_assert_msg(name && hex && lens, "malformed line %u", cases + 1);
		kind = pretok_by_name(name, strlen(name));
		ck_assert_msg(kind >= 0, "pre-tokenizer %s unknown", name);
		kinds_seen |= 1u << kind;
		if (strcmp(hex, "-"))
			len = unhex(hex, text, sizeof text);
		ck_assert_int_ge(len, 0);
		for (t = strtok_r(lens, ",", &save); t && strcmp(t, "-"); t = strtok_r(NULL, ",", &save))
			want.len[want.n++] = (size_t)atoi(t);
		pretok_split((enum pretok)kind, text, (size_t)len, collect, &got);
		cases++;
		if (got.n != want.n || memcmp(got.len, want.len, got.n * sizeof(got.len[0]))) {
			bad++;
			fprintf(stderr, "# %s splits \"%.*s\" into", name, len, text);
			for (size_t i = 0; i < got.n && i < 512; i++)
				fprintf(stderr, " %zu", got.len[i]);
			fprintf(stderr, " bytes, the reference into");
			for (size_t i = 0; i < want.n; i++)
				fprintf(stderr, " %zu", want.len[i]);
			fprintf(stderr, "\n");
		}
	}
	free(line);
	fclose(f);
	ck_assert_uint_eq(kinds_seen, (1u << PRETOK_SMOLLM) | (1u << PRETOK_GPT2) | (1u << PRETOK_LLAMA3) |
					      (1u << PRETOK_QWEN2));
	ck_assert_uint_ge(cases, 800);
	ck_assert_msg(bad == 0, "%u of %u splits differ from the reference", bad, cases);
}
END_TEST

/* The splits as text, "|" between pieces. */
static void split_as_text(enum pretok kind, const char *s, char *out, size_t cap)
{
	struct pieces p = { 0 };
	size_t o = 0, at = 0;

	pretok_split(kind, s, strlen(s), collect, &p);
	for (size_t i = 0; i < p.n && o + p.len[i] + 2 < cap; i++) {
		if (i)
			out[o++] = '|';
		memcpy(out + o, s + at, p.len[i]);
		o += p.len[i];
		at += p.len[i];
	}
	out[o] = 0;
}

START_TEST(families_differ_where_documented)
{
	char b[256];

	split_as_text(PRETOK_LLAMA3, "In 12345 (days) I'LL", b, sizeof b);
	ck_assert_str_eq(b, "In| |123|45| (|days|)| I|'LL");
	split_as_text(PRETOK_QWEN2, "In 123", b, sizeof b);
	ck_assert_str_eq(b, "In| |1|2|3");
	split_as_text(PRETOK_GPT2, "In 123 I'LL", b, sizeof b);
	ck_assert_str_eq(b, "In| 123| I|'|LL");
	split_as_text(PRETOK_SMOLLM, "In 123\n\n4", b, sizeof b);
	ck_assert_str_eq(b, "In| |1|2|3|\n\n|4");
	split_as_text(PRETOK_LLAMA3, "a;\n\n  b", b, sizeof b);
	ck_assert_str_eq(b, "a|;\n\n| | b");
}
END_TEST

START_TEST(invalid_utf8_is_covered)
{
	static const char s[] = "ab\xff\xc3 \xe2\x82 9\x80";
	for (int k = PRETOK_SMOLLM; k <= PRETOK_QWEN2; k++) {
		struct pieces p = { 0 };
		size_t sum = 0;

		pretok_split((enum pretok)k, s, sizeof s - 1, collect, &p);
		for (size_t i = 0; i < p.n; i++)
			sum += p.len[i];
		ck_assert_uint_eq(sum, sizeof s - 1);
	}
}
END_TEST

START_TEST(names)
{
	ck_assert_int_eq(pretok_by_name("llama-bpe", 9), PRETOK_LLAMA3);
	ck_assert_int_eq(pretok_by_name("qwen2", 5), PRETOK_QWEN2);
	ck_assert_int_eq(pretok_by_name("gpt-2", 5), PRETOK_GPT2);
	ck_assert_int_eq(pretok_by_name("smollm", 6), PRETOK_SMOLLM);
	ck_assert_int_eq(pretok_by_name("smollm2", 7), -1);
	ck_assert_int_eq(pretok_by_name("qwen", 4), -1);
	ck_assert_int_eq(pretok_by_name("", 0), -1);
}
END_TEST

int main(void)
{
	Suite *su = suite_create("pretok");
	TCase *tc = tcase_create("splits");
	tcase_add_test(tc, matches_reference_splits);
	tcase_add_test(tc, families_differ_where_documented);
	tcase_add_test(tc, invalid_utf8_is_covered);
	tcase_add_test(tc, names);
	suite_add_tcase(su, tc);
	return suite_main(su);
}
