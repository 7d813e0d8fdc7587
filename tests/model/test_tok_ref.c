/* SPDX-License-Identifier: MIT */
/* SmolLM2's byte-level BPE against ids from an independent tokenizer (tests/data/smollm2_tok_ref.txt,
 * written by tests/model/gen_tok_ref.py with Hugging Face `tokenizers`); skipped without the model. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../examples/llama/gguf.h"
#include "../../examples/llama/tokenizer.h"
#include "modeldir.h"
#include "refdata.h"
#include "../suite_main.h"

#define SMOL SMOLLM2_FILE

static char model[4096];
static struct gguf g;
static struct tokenizer tok;

static void setup(void)
{
	char err[256];

	ck_assert_int_eq(gguf_open(&g, model), 0);
	ck_assert_msg(tok_load(&tok, &g, err, sizeof err) == 0, "%s", err);
}

static void teardown(void)
{
	tok_free(&tok);
	gguf_close(&g);
}

static int unhex(const char *h, size_t n, char *out)
{
	for (size_t i = 0; i < n / 2; i++) {
		unsigned v;

		if (sscanf(h + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (char)v;
	}
	return (int)(n / 2);
}

START_TEST(matches_reference_ids)
{
	char *line = NULL;
	size_t cap = 0;
	unsigned cases = 0, bad = 0;
	FILE *f;

	f = refdata_open("smollm2_tok_ref.txt");
	while (getline(&line, &cap, f) > 0) {
		char *save, *hex, *t, text[4096];
		int32_t want[2048], *ids = NULL;
		int nw = 0, n, len = 0;

		if (line[0] == '#' || line[0] == '\n')
			continue;
		hex = strtok_r(line, " \n", &save);
		if (strcmp(hex, "-"))
			len = unhex(hex, strlen(hex), text);
		ck_assert_int_ge(len, 0);
		while ((t = strtok_r(NULL, " \n", &save)) && nw < 2048)
			want[nw++] = (int32_t)atoi(t);
		n = tok_encode(&tok, text, (size_t)len, 0, 1, &ids);
		ck_assert_int_ge(n, 0);
		cases++;
		if (n != nw || memcmp(ids, want, (size_t)n * sizeof(*ids))) {
			char what[4200];

			bad++;
			snprintf(what, sizeof what, "\"%.*s\"", len, text);
			refdata_ids_differ(what, ids, n, want, nw);
		}
		free(ids);
	}
	free(line);
	fclose(f);
	ck_assert_uint_ge(cases, 40);
	ck_assert_msg(bad == 0, "%u of %u texts tokenize differently from the reference", bad, cases);
}
END_TEST

/*
 * Bytes that never occur in valid UTF-8 (SmolLM2's vocabulary has no symbol for 0xC0, 0xC1,
 * 0xF5..0xFF) read as U+FFFD, as llama.cpp reads them (its ids below), and never as the unknown id:
 * that is 0, <|endoftext|>, so user text could end the document.
 */
START_TEST(invalid_utf8_is_never_a_control_token)
{
	static const int32_t want[] = { 23633, 216, 24211, 24211, 15590 };
	static const char bad[] = "invalid \xff\xfe bytes";
	char text[4];
	int32_t *ids;
	int n;

	n = tok_encode(&tok, bad, sizeof bad - 1, 0, 0, &ids);
	ck_assert_int_eq(n, 5);
	ck_assert_mem_eq(ids, want, sizeof want);
	free(ids);
	for (int b = 0x80; b < 0x100; b++) {
		text[0] = 'a';
		text[1] = (char)b;
		text[2] = 'b';
		n = tok_encode(&tok, text, 3, 0, 0, &ids);
		ck_assert_int_gt(n, 0);
		for (int i = 0; i < n; i++)
			ck_assert_msg(tok.type[ids[i]] != 3, "byte 0x%02x became control token %d", b, ids[i]);
		free(ids);
	}
}
END_TEST

/* Two loads at once share no mutable state (run under TSan to see a race; here: both work). */
static void *load_one(void *arg)
{
	struct tokenizer t;
	char err[256];
	int32_t *ids = NULL;
	intptr_t ok;

	(void)arg;
	if (tok_load(&t, &g, err, sizeof err))
		return (void *)0;
	ok = tok_encode(&t, "Steps:\n\n1.", 10, 0, 0, &ids) == 5 && ids[2] == 1116;
	free(ids);
	tok_free(&t);
	return (void *)ok;
}

START_TEST(concurrent_loads)
{
	pthread_t th[2];
	void *r[2];

	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, load_one, NULL), 0);
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], &r[i]);
		ck_assert_msg(r[i] == (void *)1, "thread %d tokenized wrongly", i);
	}
}
END_TEST

int main(void)
{
	if (smollm2_path(model, sizeof model)) {
		fprintf(stderr, "test_tok_ref: %s absent (run scripts/fetch-model)\n", SMOL);
		return 77;
	}
	Suite *su = suite_create("tokenizer-reference");
	TCase *tc = tcase_create("smollm2");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, matches_reference_ids);
	tcase_add_test(tc, concurrent_loads);
	tcase_add_test(tc, invalid_utf8_is_never_a_control_token);
	suite_add_tcase(su, tc);
	return suite_main(su);
}
