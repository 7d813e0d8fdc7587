/* SPDX-License-Identifier: MIT */
/* Continuous batching for many conversations in one process: chunked prefill and decode share each
 * step under a token budget, conversations are admitted between steps, -ENOSPC waits or preempts. */
#ifndef PKV_EX_ENGINE_H
#define PKV_EX_ENGINE_H

#include <stdint.h>

#include "llama.h"
#include "sampler.h"
#include "tokenizer.h"

enum conv_state { CONV_IDLE, CONV_WAITING, CONV_RUNNING, CONV_DONE, CONV_FAILED };

struct conv;
typedef void (*conv_token_fn)(struct conv *cv, int32_t tok, void *arg);

struct conv {
	int id;
	enum conv_state state;
	int32_t *hist;          /* whole token history: every turn's prompt and reply */
	uint32_t n_hist, cap;
	uint32_t n_cached;      /* leading history tokens whose KV is in the cache */
	uint32_t seq;
	int open;
	uint64_t admit_order;   /* for "preempt the youngest" */
	uint32_t turn_start;    /* n_hist when this turn's generation began */
	uint32_t max_new, n_gen;
	int ignore_eos;         /* benchmarks: generate max_new tokens even past an end token (as llama-bench) */
	struct sampler smp;
	conv_token_fn on_token;
	void *arg;
	int err;                /* -errno when FAILED */
	/* in-flight prefix sharing: waits for another conversation's prefill of a common prefix */
	int deferred;           /* admission held back while a running conversation computes it */
	double blocked_since;   /* its step_begin got -EAGAIN (daemon: another process computes it) */
	int blocked_now;        /* left out of the current step */
	/* this turn's statistics; inflight_tokens: the reused tokens another conversation was still
	 * computing when this one arrived */
	uint32_t prompt_tokens, reused_tokens, inflight_tokens, preemptions;
	double t_submit, t_first, t_done;
	struct conv *next;
};

struct engine {
	struct llama_ctx *lc;
	const struct tokenizer *tok;
	struct pkv_attn *attn;
	uint32_t token_budget;  /* tokens per forward step (<= the llama_ctx capacity) */
	uint32_t max_running;
	struct conv *convs;     /* all conversations, admission order among waiting ones */
	uint64_t admits;
	int hold;               /* after a preemption: admit nothing until a conversation finishes */
	uint32_t share_block;   /* shortest common prompt prefix worth waiting for (tokens; 0: never wait) */
	double share_wait_s;    /* give up waiting on another process's prefill after this long */
	float *logits;
	/* totals */
	uint64_t steps, decode_steps, tokens_computed;
};

int engine_init(struct engine *e, struct llama_ctx *lc, const struct tokenizer *tok, uint32_t token_budget,
		uint32_t max_running);
void engine_free(struct engine *e);

/* Adds a conversation (not yet submitted). */
struct conv *engine_conv_new(struct engine *e, const struct sampler *smp, conv_token_fn fn, void *arg);
/* Appends tokens to the history and queues a turn generating up to max_new tokens. */
int engine_submit(struct engine *e, struct conv *cv, const int32_t *toks, uint32_t n, uint32_t max_new);
/* Runs one forward step. Returns the number of conversations still active (0: idle) or -errno. */
int engine_step(struct engine *e);
/* Steps until every submitted turn is done. */
int engine_run(struct engine *e);
double engine_now(void);

#endif
