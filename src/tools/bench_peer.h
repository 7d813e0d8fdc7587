/* SPDX-License-Identifier: MIT */
/* Runs llama.cpp's llama-bench as a same-run peer for pkv-bench e2e and reads its JSON figures. */
#ifndef PKV_TOOLS_BENCH_PEER_H
#define PKV_TOOLS_BENCH_PEER_H

#include <stdint.h>

struct peer_result {
	double pp_tok_s; /* prefill of prompt_len tokens */
	double tg_tok_s; /* decode of decode_len tokens after a prompt_len-token context */
};

/*
 * Runs `PATH -m MODEL -t THREADS -fa 0 -r 1 -o json` twice: `-p PROMPT -n 0` (prefill) and
 * `-p 0 -n DECODE -d PROMPT` (decode after the prompt, as pkv-bench measures it). 0 or -errno;
 * a peer that fails or prints no figure for a test gives -EIO.
 */
int peer_llama_bench(const char *path, const char *model, int threads, uint32_t prompt_len, uint32_t decode_len,
		     struct peer_result *out);
/* Parses llama-bench's JSON array: avg_ts of the entry with n_prompt/n_gen as given. 0 or -ENOENT. */
int peer_parse_json(const char *json, long n_prompt, long n_gen, double *avg_ts);

#endif
