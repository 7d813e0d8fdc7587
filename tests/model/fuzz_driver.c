/* SPDX-License-Identifier: MIT */
/* Standalone fuzz driver (no libFuzzer needed): runs the target over a seed corpus — built-in valid
 * images plus any files given as arguments — and then over random mutations of them.
 * PKV_FUZZ_ITERS sets the mutation count (default 20000), PKV_FUZZ_SEED the generator seed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
extern unsigned long pkv_fuzz_parsed, pkv_fuzz_tokenized;

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

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

int main(int argc, char **argv)
{
	uint8_t *seeds[64];
	size_t lens[64];
	int n = 0;
	long iters = getenv("PKV_FUZZ_ITERS") ? atol(getenv("PKV_FUZZ_ITERS")) : 20000;
	if (getenv("PKV_FUZZ_SEED"))
		rng = strtoull(getenv("PKV_FUZZ_SEED"), NULL, 0) | 1;
	if (fixture_gguf(32, &seeds[n], &lens[n]) == 0)
		n++;
	if (fixture_gguf(64, &seeds[n], &lens[n]) == 0)
		n++;
	if (tok_seed(&seeds[n], &lens[n]) == 0)
		n++;
	if (spm_seed(&seeds[n], &lens[n]) == 0)
		n++;
	for (int i = 1; i < argc && n < 64; i++) {
		FILE *f = fopen(argv[i], "rb");
		if (!f)
			continue;
		seeds[n] = malloc(1 << 16);
		lens[n] = fread(seeds[n], 1, 1 << 16, f); /* the header part is what matters */
		fclose(f);
		n++;
	}
	for (int i = 0; i < n; i++)
		LLVMFuzzerTestOneInput(seeds[i], lens[i]);
	uint8_t *buf = malloc(1 << 17);
	for (long it = 0; it < iters; it++) {
		int s = (int)(rnd() % (uint64_t)n);
		size_t len = lens[s];
		memcpy(buf, seeds[s], len);
		int muts = 1 + (int)(rnd() % 8);
		for (int m = 0; m < muts && len; m++) {
			size_t at = rnd() % len;
			switch (rnd() % 6) {
			case 0: buf[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
			case 1: buf[at] = (uint8_t)rnd(); break;
			case 2: { /* an interesting 64-bit value into a length or offset field */
				static const uint64_t v[] = { 0, 1, 0x7fffffff, 0xffffffff, ~0ull, 1ull << 63, 1ull << 32 };
				uint64_t x = v[rnd() % 7];
				if (at + 8 <= len)
					memcpy(buf + at, &x, 8);
				break;
			}
			case 3: len = at; break; /* truncate */
			case 4: if (at + 4 <= len) memset(buf + at, 0xff, 4); break;
			default: { /* copy a chunk within the image */
				size_t from = rnd() % len, n2 = rnd() % 32;
				if (from + n2 <= len && at + n2 <= len)
					memmove(buf + at, buf + from, n2);
			}
			}
		}
		LLVMFuzzerTestOneInput(buf, len);
	}
	printf("1..1\nok 1 - gguf fuzz: %d seeds, %ld mutations (%lu parsed, %lu built a tokenizer), no crash\n", n,
	       iters, pkv_fuzz_parsed, pkv_fuzz_tokenized);
	free(buf);
	for (int i = 0; i < n; i++)
		free(seeds[i]);
	return 0;
}
