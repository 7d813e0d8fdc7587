/* SPDX-License-Identifier: MIT */
/* Fuzz target: any byte string given to the GGUF reader (and the tokenizer and model loaders that
 * read its metadata) fails cleanly or parses into bounds-checked views, whose first rows dequantize and
 * convert (as the model loader does) without reading past them. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../examples/llama/gguf.h"
#include "../../examples/llama/quant.h"
#include "../../examples/llama/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* How many inputs parsed / reached the tokenizer (the standalone driver reports them). */
unsigned long pkv_fuzz_parsed, pkv_fuzz_tokenized;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gguf g;
	/* a private copy so the sanitizers see reads past the end as heap overflows */
	uint8_t *cp = malloc(size ? size : 1);
	if (!cp)
		return 0;
	memcpy(cp, data, size);
	if (gguf_parse(&g, cp, size) == 0) {
		pkv_fuzz_parsed++;
		volatile uint64_t sink = 0;
		struct tokenizer t;
		char err[128];
		for (uint64_t i = 0; i < g.n_tensors; i++) {
			const struct gguf_tensor *ti = &g.tensors[i];
			const uint8_t *p = ti->data;
			if (ti->nbytes)
				sink += p[0] + p[ti->nbytes - 1];
			/* the first row, dequantized and converted as the model loader would (the parser has
			 * checked it is whole blocks and inside the file) */
			if (ti->ne[0] <= 4096 && ti->ne[0] % 32 == 0) {
				static float row[4096], scratch[4096];
				static uint8_t conv[4096 / 32 * 34]; /* Q4_1 or Q8_0 */
				size_t rb = pkv_row_bytes(ti->type, ti->ne[0]);
				/* the row alone in its own allocation: reading past it is a heap overflow */
				uint8_t *src = malloc(rb ? rb : 1);
				if (!src)
					continue;
				memcpy(src, ti->data, rb);
				pkv_dequant_row(ti->type, src, row, ti->ne[0]);
				sink += row[0] == row[0];
				if (pkv_convert_target(ti->type) != ti->type &&
				    pkv_convert_row(ti->type, src, conv, ti->ne[0], scratch) == 0)
					sink += conv[0];
				free(src);
			}
		}
		for (uint64_t i = 0; i < g.n_kv; i++) {
			const struct gguf_kv *kv = &g.kv[i];
			if (kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING && kv->arr_n < 100000) {
				struct gguf_str *s = calloc(kv->arr_n + 1, sizeof *s);
				if (s && gguf_arr_strs(kv, s) == 0)
					for (uint64_t j = 0; j < kv->arr_n; j++)
						sink += s[j].len ? (uint8_t)s[j].s[s[j].len - 1] : 0;
				free(s);
			}
		}
		if (tok_load(&t, &g, err, sizeof err) == 0) {
			pkv_fuzz_tokenized++;
			int32_t *ids;
			int n = tok_encode(&t, "Hi there, 42<|im_end|>", 22, 1, 1, &ids);
			if (n >= 0)
				free(ids);
			/* the input's own bytes as (usually invalid UTF-8) text, and every id back to text */
			n = tok_encode(&t, (const char *)data, size < 512 ? size : 512, 1, 1, &ids);
			if (n >= 0) {
				char piece[64];
				for (int i = 0; i < n; i++)
					sink += tok_piece(&t, ids[i], 1, piece, sizeof piece);
				free(ids);
			}
			tok_free(&t);
		}
		(void)sink;
		gguf_close(&g);
	}
	free(cp);
	return 0;
}
