/* SPDX-License-Identifier: MIT */
/* What every model program sets up: model, tokenizer, threads, attention (daemon or in-process), context. */
#ifndef PKV_EX_SESSION_H
#define PKV_EX_SESSION_H

#include <stdint.h>

#include "attn.h"
#include "llama.h"
#include "tokenizer.h"

/* Who attends when a program goes through pagedkvd. */
enum session_attention {
	/*
	 * This process, over the memory of a pool whose clients attend
	 * themselves, where the daemon's backends work on host memory and ours
	 * load; else the daemon, silently. Each attend then costs no round trip
	 * (8 one-thread SmolLM2 processes: 1.005x their in-process attention
	 * against 0.952x with the daemon attending, docs/performance.md).
	 */
	SESSION_ATTN_AUTO,
	SESSION_ATTN_DAEMON, /* the daemon attends every call (--daemon-attention) */
	SESSION_ATTN_CLIENT, /* as AUTO, but a fallback to the daemon is warned about (--client-attention) */
};

struct session_opts {
	const char *model;
	const char *socket;      /* daemon socket; NULL: the default path */
	int in_process;          /* 1: contiguous in-process attention; 0: the daemon */
	enum session_attention attention; /* who attends through the daemon */
	int threads;             /* 0: $PKV_THREADS or all CPUs */
	uint32_t max_tokens;     /* per forward step (buffers); 0: 256 */
	uint32_t block_size;     /* 0: 16 */
	uint32_t num_blocks;     /* pool size when this client creates it; 0: from kv_mib */
	uint32_t kv_mib;         /* 0: 256 MiB of KV */
	uint32_t kv_dtype;       /* the KV cache's PKV_DTYPE_* (0: f32) */
	uint32_t ctx;            /* with max_seqs: pool = ceil(ctx / block) * max_seqs blocks (0: kv_mib) */
	uint32_t max_seqs;
	int offer_in_process;    /* the program has --in-process: say so when the daemon is unreachable */
};

/* The attention's name (session.attn.name) when the pool's clients attend themselves. */
#define SESSION_CLIENT_ATTENTION "pagedkvd, attention in this process"

struct session {
	struct llama m;
	struct tokenizer tok;
	struct tpool *tp;
	struct pkv_attn attn;
	struct llama_ctx lc;
	char pool_name[64];
};

int session_open(struct session *s, const struct session_opts *o, char *err, size_t errlen);
void session_close(struct session *s);

/* The chat templates the client knows: ChatML (SmolLM2-Instruct, Qwen2) when the vocabulary has
 * <|im_start|>, Llama 3 Instruct's when it has <|start_header_id|>. 1 when the model has one. */
int chat_available(const struct tokenizer *t);
/*
 * Tokens of one user turn in the model's template (BOS included where the template writes it).
 * With first != 0 the system block comes first (system NULL: the template's default, if any);
 * otherwise the previous reply's end is closed first unless prev_ended. *out malloc'd; count or
 * -errno (-ENOTSUP without a template).
 */
int chat_turn(const struct tokenizer *t, const char *system, const char *user, int first,
	      int prev_ended, int32_t **out);

#endif
