/* SPDX-License-Identifier: MIT */
/* Tokenizer metadata from a hostile file: byte tokens that are not "<0xXX>", very many special tokens,
 * gpt2 vocabularies without merges or with another family's pre-tokenizer. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../examples/llama/gguf.h"
#include "gguf_write.h"
#include "../../examples/llama/tokenizer.h"
#include "../suite_main.h"

struct vocab_file {
	uint8_t *img; /* exactly the file's bytes: a read past the last token is past the buffer */
	struct gguf g;
	struct tokenizer t;
};

/* A SentencePiece vocabulary of n tokens, text and type each, as the only metadata. */
static void load(struct vocab_file *f, const char *const *text, const int32_t *type, uint64_t n)
{
	struct gguf_builder b;
	size_t len;
	char err[256] = "";

	gb_init(&b, 32);
	gb_kv_str(&b, "tokenizer.ggml.model", "llama");
	gb_kv_arr_str(&b, "tokenizer.ggml.tokens", text, n);
	gb_kv_arr(&b, "tokenizer.ggml.token_type", GGUF_I32, type, n);
	ck_assert_int_eq(gb_finish(&b, &f->img, &len), 0);
	ck_assert_int_eq(gguf_parse(&f->g, f->img, len), 0);
	ck_assert_msg(tok_load(&f->t, &f->g, err, sizeof(err)) == 0, "tok_load: %s", err);
}

static void unload(struct vocab_file *f)
{
	tok_free(&f->t);
	gguf_close(&f->g);
	free(f->img);
}

/*
 * Byte tokens (type 6) are decoded only in the form "<0xXX>". The last
 * token's text ends the file: "<0xAAA" was parsed with strtol, which read
 * past its 6 bytes while hex digits followed (ASan: heap overflow).
 */
START_TEST(byte_tokens_decode_only_their_own_form)
{
	static const char *const text[] = { "<unk>", "<0x41>", "<0x4g>", "x0x41>", "<0xAAA" };
	static const int32_t type[] = { 2, 6, 6, 6, 6 };
	struct vocab_file f;
	char buf[16];

	load(&f, text, type, 5);
	ck_assert_uint_eq(tok_piece(&f.t, 1, 0, buf, sizeof(buf)), 1);
	ck_assert_int_eq(buf[0], 'A');
	for (int32_t id = 2; id < 5; id++) {
		size_t n = tok_piece(&f.t, id, 0, buf, sizeof(buf));

		ck_assert_uint_eq(n, 6); /* not a byte token: its text as it is */
		ck_assert(!memcmp(buf, text[id], 6));
	}
	unload(&f);
}
END_TEST

/*
 * 200,000 special tokens (a 4 MB file): ordered longest first, ties by id,
 * within the test's timeout (the insertion sort this replaced took 18 s on
 * 150,000 in an optimised build, hours at the vocabulary cap). Encoding
 * still takes the longest special at each position.
 */
#define N_SPECIAL 200000u

START_TEST(many_special_tokens_load_and_match_longest_first)
{
	static char names[N_SPECIAL][16];
	static const char *text[N_SPECIAL + 2];
	static int32_t type[N_SPECIAL + 2];
	struct vocab_file f;
	int32_t *out = NULL;
	int n;

	text[0] = "a";
	type[0] = 1;
	for (uint32_t i = 0; i < N_SPECIAL; i++) {
		/* "<", 0-6 z rising with the id (the order the old sort did worst on), "#", the id */
		snprintf(names[i], sizeof(names[i]), "<%.*s#%06u", (int)(i * 7 / N_SPECIAL), "zzzzzz", i);
		text[i + 1] = names[i];
		type[i + 1] = 3;
	}
	text[N_SPECIAL + 1] = "<z"; /* a prefix of most of them */
	type[N_SPECIAL + 1] = 4;
	load(&f, text, type, N_SPECIAL + 2);
	ck_assert_uint_eq(f.t.n_special, N_SPECIAL + 1);
	for (uint32_t i = 1; i < f.t.n_special; i++) {
		uint64_t a = f.t.text[f.t.special[i - 1]].len, b = f.t.text[f.t.special[i]].len;

		ck_assert(a > b || (a == b && f.t.special[i - 1] < f.t.special[i]));
	}
	ck_assert_int_eq(f.t.special[f.t.n_special - 1], (int32_t)N_SPECIAL + 1);
	n = tok_encode(&f.t, "<zzzzzz#199999<z", 16, 0, 1, &out);
	ck_assert_int_eq(n, 2);
	ck_assert_int_eq(out[0], (int32_t)N_SPECIAL); /* names[199999] is token 200000 */
	ck_assert_int_eq(out[1], (int32_t)N_SPECIAL + 1);
	free(out);
	unload(&f);
}
END_TEST

/* A gpt2 vocabulary of two tokens, with the given pre-tokenizer (or none) and merges or not. */
static int load_gpt2(const char *pre, int merges, char *err, size_t errlen)
{
	static const char *const text[] = { "a", "b", "ab" };
	static const int32_t type[] = { 1, 1, 1 };
	static const char *const merge[] = { "a b" };
	struct gguf_builder b;
	struct gguf g;
	struct tokenizer t;
	uint8_t *img;
	size_t len;
	int r;

	gb_init(&b, 32);
	gb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
	if (pre)
		gb_kv_str(&b, "tokenizer.ggml.pre", pre);
	gb_kv_arr_str(&b, "tokenizer.ggml.tokens", text, 3);
	gb_kv_arr(&b, "tokenizer.ggml.token_type", GGUF_I32, type, 3);
	if (merges)
		gb_kv_arr_str(&b, "tokenizer.ggml.merges", merge, 1);
	ck_assert_int_eq(gb_finish(&b, &img, &len), 0);
	ck_assert_int_eq(gguf_parse(&g, img, len), 0);
	r = tok_load(&t, &g, err, errlen);
	if (!r)
		tok_free(&t);
	gguf_close(&g);
	free(img);
	return r;
}

/*
 * A pre-tokenizer that pretok.c does not know would split text differently with no error:
 * refused by name. Every failure after the special tokens are sorted is a
 * failure (a gpt2 vocabulary without merges once returned 0 from that point).
 */
START_TEST(gpt2_needs_merges_and_a_known_pre_tokenizer)
{
	char err[256] = "";

	ck_assert_int_eq(load_gpt2("smollm", 1, err, sizeof(err)), 0);
	ck_assert_int_eq(load_gpt2(NULL, 1, err, sizeof(err)), 0);
	ck_assert_int_eq(load_gpt2("llama-bpe", 1, err, sizeof(err)), 0);
	ck_assert_int_eq(load_gpt2("deepseek-llm", 1, err, sizeof(err)), -ENOTSUP);
	ck_assert_msg(strstr(err, "'deepseek-llm' is not supported"), "%s", err);
	ck_assert_int_eq(load_gpt2("smollm", 0, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "merges"), "%s", err);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("tok-hostile");
	TCase *tc = tcase_create("vocab");
	tcase_set_timeout(tc, 20); /* ~0.5 s here, a few under sanitizers; the old sort took over 30 s */
	tcase_add_test(tc, byte_tokens_decode_only_their_own_form);
	tcase_add_test(tc, many_special_tokens_load_and_match_longest_first);
	tcase_add_test(tc, gpt2_needs_merges_and_a_known_pre_tokenizer);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
