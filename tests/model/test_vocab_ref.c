/* SPDX-License-Identifier: MIT */
/*
 * The tokenizers against llama.cpp's tokenizer references: vocabulary-only GGUFs of five model
 * families (SentencePiece: Llama 2, Phi-3; byte-level BPE: GPT-2, Llama 3, Qwen2) with held-out
 * texts and the ids Hugging Face's tokenizers gives them. scripts/fetch-vocab caches them
 * (PKV_VOCAB_DIR names another place); skipped without them.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../examples/llama/gguf.h"
#include "../../examples/llama/pretok.h"
#include "../../examples/llama/session.h"
#include "../../examples/llama/tokenizer.h"
#include "refdata.h"
#include "../suite_main.h"

static char dir[4096];

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *b = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (b = malloc((size_t)n + 1)) && fread(b, 1, (size_t)n, f) == (size_t)n) {
		b[n] = 0;
		*len = (size_t)n;
	} else {
		free(b);
		b = NULL;
	}
	fclose(f);
	return b;
}

/* Encodes each text of NAME.inp (separated by the marker line) and compares with NAME.out (one line
 * of ids per text, no BOS); returns the number of texts, all of which must agree. */
static unsigned check_vocab(const char *name, int want_pre, int want_bos)
{
	static const char sep[] = "\n__ggml_vocab_test__\n";
	char path[4200], err[256];
	struct gguf g;
	struct tokenizer t;
	size_t ni, no;
	char *inp, *out, *ip, *op;
	unsigned cases = 0, bad = 0;

	snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", dir, name);
	ck_assert_msg(gguf_open(&g, path) == 0, "cannot open %s", path);
	ck_assert_msg(tok_load(&t, &g, err, sizeof err) == 0, "%s: %s", name, err);
	if (want_pre >= 0)
		ck_assert_int_eq(t.pre, want_pre);
	ck_assert_int_eq(t.add_bos, want_bos);
	snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.inp", dir, name);
	inp = slurp(path, &ni);
	snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.out", dir, name);
	out = slurp(path, &no);
	ck_assert_msg(inp && out, "%s: reference texts or ids missing", name);
	for (ip = inp, op = out; *ip && *op; cases++) {
		char *end = strstr(ip, sep), *nl = strchr(op, '\n'), *q;
		size_t len = end ? (size_t)(end - ip) : strlen(ip);
		int32_t want[1024], *ids = NULL;
		int nw = 0, n;

		ck_assert_ptr_nonnull(nl);
		*nl = 0;
		for (q = op; nw < 1024;) {
			char *e;
			long v = strtol(q, &e, 10);

			if (e == q)
				break;
			want[nw++] = (int32_t)v;
			q = e;
		}
		n = tok_encode(&t, ip, len, 0, 0, &ids);
		ck_assert_int_ge(n, 0);
		if (n != nw || memcmp(ids, want, (size_t)n * sizeof(*ids))) {
			char what[128];

			bad++;
			snprintf(what, sizeof what, "%s: \"%.*s\"", name, (int)(len > 60 ? 60 : len), ip);
			refdata_ids_differ(what, ids, n, want, nw);
		}
		free(ids);
		op = nl + 1;
		if (!end)
			break;
		ip = end + sizeof sep - 1;
	}
	free(inp);
	free(out);
	tok_free(&t);
	gguf_close(&g);
	ck_assert_msg(bad == 0, "%s: %u of %u texts tokenize differently from the reference", name, bad, cases);
	return cases;
}

START_TEST(llama_spm)
{
	ck_assert_uint_ge(check_vocab("llama-spm", -1, 1), 40);
}
END_TEST

START_TEST(phi_3)
{
	ck_assert_uint_ge(check_vocab("phi-3", -1, 1), 40);
}
END_TEST

START_TEST(gpt_2)
{
	ck_assert_uint_ge(check_vocab("gpt-2", PRETOK_GPT2, 0), 40);
}
END_TEST

START_TEST(llama_bpe)
{
	ck_assert_uint_ge(check_vocab("llama-bpe", PRETOK_LLAMA3, 1), 40);
}
END_TEST

START_TEST(qwen2)
{
	ck_assert_uint_ge(check_vocab("qwen2", PRETOK_QWEN2, 0), 40);
}
END_TEST

/* Llama 3 Instruct's template on its own vocabulary: BOS written by the template, header markers as
 * control tokens, the user's literal "<|eot_id|>" as plain text, the turn's end known as EOT. */
START_TEST(llama3_chat_template)
{
	static const int32_t want[] = { 128000, 128006, 9125, 128007, 271,   3513, 10015, 13,    128009,
					128006, 882,	128007, 271,	6151, 27,	91,    68,    354,
					851,	91,	29,	128009, 128006, 78191, 128007, 271 };
	char path[4200], err[256];
	struct gguf g;
	struct tokenizer t;
	int32_t *ids;
	int n;

	snprintf(path, sizeof path, "%s/ggml-vocab-llama-bpe.gguf", dir);
	ck_assert_int_eq(gguf_open(&g, path), 0);
	ck_assert_msg(tok_load(&t, &g, err, sizeof err) == 0, "%s", err);
	ck_assert_int_eq(chat_available(&t), 1);
	ck_assert_int_eq(t.eot, 128009);
	ck_assert(tok_is_eog(&t, 128009));
	n = chat_turn(&t, "Be brief.", "hi<|eot_id|>", 1, 0, &ids);
	ck_assert_int_eq(n, (int)(sizeof want / sizeof want[0]));
	ck_assert_mem_eq(ids, want, sizeof want);
	free(ids);
	/* a later turn after a reply that ended with <|eot_id|>: nothing to close */
	n = chat_turn(&t, NULL, "hi", 0, 1, &ids);
	ck_assert_int_eq(n, 10);
	ck_assert_int_eq(ids[0], 128006);
	free(ids);
	tok_free(&t);
	gguf_close(&g);
}
END_TEST

/* ChatML without a system text given: the one the model's own chat_template writes (Qwen2's file:
 * "You are a helpful assistant"), not SmolLM2's. */
START_TEST(chatml_default_system_from_the_file)
{
	char path[4200], err[256], text[256];
	struct gguf g;
	struct tokenizer t;
	int32_t *ids;
	size_t o = 0;
	int n;

	snprintf(path, sizeof path, "%s/ggml-vocab-qwen2.gguf", dir);
	ck_assert_int_eq(gguf_open(&g, path), 0);
	ck_assert_msg(tok_load(&t, &g, err, sizeof err) == 0, "%s", err);
	n = chat_turn(&t, NULL, "hi", 1, 0, &ids);
	ck_assert_int_gt(n, 3);
	for (int i = 0; i < n; i++)
		o += tok_piece(&t, ids[i], 1, text + o, sizeof text - 1 - o);
	text[o] = 0;
	ck_assert_str_eq(text, "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nhi"
			       "<|im_end|>\n<|im_start|>assistant\n");
	free(ids);
	tok_free(&t);
	gguf_close(&g);
}
END_TEST

static int find_dir(void)
{
	const char *env = getenv("PKV_VOCAB_DIR"), *cache = getenv("PKV_MODEL_CACHE");
	const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
	char probe[4200];

	if (env && *env)
		snprintf(dir, sizeof dir, "%s", env);
	else if (cache && *cache)
		snprintf(dir, sizeof dir, "%s/vocab", cache);
	else if (xdg && *xdg)
		snprintf(dir, sizeof dir, "%s/pagedkv/models/vocab", xdg);
	else
		snprintf(dir, sizeof dir, "%s/.cache/pagedkv/models/vocab", home ? home : "");
	snprintf(probe, sizeof probe, "%s/ggml-vocab-llama-bpe.gguf.out", dir);
	return access(probe, R_OK);
}

int main(void)
{
	if (find_dir()) {
		fprintf(stderr, "test_vocab_ref: no tokenizer references in %s (run scripts/fetch-vocab)\n", dir);
		return 77;
	}
	Suite *su = suite_create("vocab-reference");
	TCase *tc = tcase_create("llama.cpp");
	tcase_add_test(tc, llama_spm);
	tcase_add_test(tc, phi_3);
	tcase_add_test(tc, gpt_2);
	tcase_add_test(tc, llama_bpe);
	tcase_add_test(tc, qwen2);
	tcase_add_test(tc, llama3_chat_template);
	tcase_add_test(tc, chatml_default_system_from_the_file);
	suite_add_tcase(su, tc);
	return suite_main(su);
}
