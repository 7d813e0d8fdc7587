/* SPDX-License-Identifier: MIT */
/* pkv-bench e2e's burst figures: 8 conversations behind one system prompt, all started at once. */
#ifndef PKV_BENCH_E2E_BURST_H
#define PKV_BENCH_E2E_BURST_H

#include <stdint.h>

#include "../../examples/llama/session.h"

struct burst_figures {
	uint32_t ideal_tokens;     /* the system prompt once, plus every conversation's question */
	uint32_t computed_tokens;  /* prompt tokens the conversations actually computed */
	double ttft_mean_ms, ttft_p99_ms;
};

/*
 * Runs the burst once with in-flight prefix sharing (sharing = 1) or without
 * it (0: the engine admits everyone at once and opens find only committed
 * prefixes), either in one process (procs = 0) or as 8 processes of one
 * conversation each. salt makes the system prompt new to the cache.
 */
int e2e_burst(const struct session_opts *so, int procs, int sharing, unsigned salt, struct burst_figures *f);

#endif
