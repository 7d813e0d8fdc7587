/* SPDX-License-Identifier: MIT */
/* The GGUF fuzz target's seeds for the tests' one fuzz driver (tests/fuzz_driver.c): valid models, vocabularies
 * and tensors of the quantized types. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "../../examples/llama/quant.h"
#include "fuzz_driver.h"

extern unsigned long pkv_fuzz_parsed, pkv_fuzz_tokenized;

/* A tiny vocabulary so the tokenizer path is reached too. */
static int tok_seed(uint8_t **img, size_t *len)
{
	struct gguf_builder b;
	const char *toks[] = { "<unk>", "<s>", "</s>", "\xe2\x96\x81Hi", "H", "i", "<|im_end|>", "\xc4\xa0", "t" };
	const char *merges[] = { "H i", "\xc4\xa0 t" };
	int32_t types[9] = { 2, 3, 3, 1, 1, 1, 3, 1, 1 };
	gb_init(&b, 32);
	gb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
	gb_kv_arr_str(&b, "tokenizer.ggml.tokens", toks, 9);
	gb_kv_arr(&b, "tokenizer.ggml.token_type", GGUF_I32, types, 9);
	gb_kv_arr_str(&b, "tokenizer.ggml.merges", merges, 2);
	gb_kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
	return gb_finish(&b, img, len);
}

/* A SentencePiece-style vocabulary with byte fallback. */
static int spm_seed(uint8_t **img, size_t *len)
{
	struct gguf_builder b;
	const char *toks[] = { "<unk>", "<s>", "</s>", "<0x41>", "<0xC3>", "\xe2\x96\x81", "\xe2\x96\x81H", "i" };
	int32_t types[8] = { 2, 3, 3, 6, 6, 1, 1, 1 };
	float scores[8] = { 0, 0, 0, 0, 0, -1, -2, -3 };
	gb_init(&b, 32);
	gb_kv_str(&b, "tokenizer.ggml.model", "llama");
	gb_kv_arr_str(&b, "tokenizer.ggml.tokens", toks, 8);
	gb_kv_arr(&b, "tokenizer.ggml.token_type", GGUF_I32, types, 8);
	gb_kv_arr(&b, "tokenizer.ggml.scores", GGUF_F32, scores, 8);
	return gb_finish(&b, img, len);
}

/* One two-row tensor of each 5-bit and K-quant type, with valid blocks, so mutations reach their
 * dequantization and load-time conversion (the target runs both on the first row). */
static int quant_seed(uint8_t **img, size_t *len)
{
	static const uint32_t types[] = { GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K };
	struct gguf_builder b;
	float x[512];
	uint8_t row[2 * 210];
	gb_init(&b, 32);
	gb_kv_str(&b, "general.architecture", "llama");
	for (int i = 0; i < 512; i++)
		x[i] = (float)((i * 37) % 61) / 30.f - 1.f;
	for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
		uint64_t ne[2] = { ggml_type_block_elems(types[k]), 2 };
		char name[16];
		snprintf(name, sizeof name, "w.%s", ggml_type_name(types[k]));
		if (pkv_quant_row(types[k], x, row, (size_t)ne[0] * 2)) {
			gb_free(&b);
			return -1;
		}
		gb_tensor(&b, name, types[k], ne, 2, row, pkv_row_bytes(types[k], (size_t)ne[0] * 2));
	}
	return gb_finish(&b, img, len);
}

static int gguf_seeds(uint8_t **seeds, size_t *lens, int max)
{
	int n = 0;

	if (max < 5)
		return 0;
	if (fixture_gguf(32, &seeds[n], &lens[n]) == 0)
		n++;
	if (fixture_gguf(64, &seeds[n], &lens[n]) == 0)
		n++;
	if (tok_seed(&seeds[n], &lens[n]) == 0)
		n++;
	if (spm_seed(&seeds[n], &lens[n]) == 0)
		n++;
	if (quant_seed(&seeds[n], &lens[n]) == 0)
		n++;
	return n;
}

static void gguf_summary(char *buf, size_t len)
{
	snprintf(buf, len, " (%lu parsed, %lu built a tokenizer)", pkv_fuzz_parsed, pkv_fuzz_tokenized);
}

/* Files given on the command line count by their first 64 KiB: the header part is what matters. */
const struct pkv_fuzz_target pkv_fuzz_target = {
	.name = "gguf fuzz",
	.max_len = 1 << 17,
	.default_iters = 20000,
	.seeds = gguf_seeds,
	.summary = gguf_summary,
};
