/* SPDX-License-Identifier: MIT */
/* Program setup shared by pkv-generate, pkv-chat, the benchmark and the tests; and the chat templates. */
#include "session.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PKV_HAVE_CLIENT
/*
 * Connects and attaches this model's pool: here, one whose clients attend
 * themselves (a choice made when a pool is created, so it has its own name).
 */
static int attach_daemon(struct session *s, const struct session_opts *o, const struct pkv_geometry *geo, int here,
			 char *err, size_t errlen)
{
	/* Our pool's threads compute between attends: the daemon leaves their CPUs to them. */
	struct pkv_connect_opts co = { .socket_path = o->socket, .compute_threads = (uint32_t)tpool_size(s->tp) };
	struct pkv_pool_params pp = { .geo = *geo, .act_dtype = PKV_DTYPE_F32, .model_id = s->m.model_id,
				      .window_left = -1, .flags = here ? PKV_POOL_CLIENT_ATTENTION : 0 };
	int r;

	/* A pool's geometry must match exactly: each KV dtype has its own (f32 keeps the old name). */
	snprintf(s->pool_name, sizeof s->pool_name, "model-%016" PRIx64 "%s%s", s->m.model_id,
		 geo->cache_dtype == PKV_DTYPE_F16 ? "-f16" : geo->cache_dtype == PKV_DTYPE_BF16 ? "-bf16" : "",
		 here ? "-ca" : "");
	pp.name = s->pool_name;
	r = pkv_attn_daemon_create(&co, &pp, &s->attn, err, errlen);
	if (r == -ENOMEM) {
		/* the daemon's budget cannot hold this pool: say what each side can change */
		uint64_t bytes = (uint64_t)2 * geo->num_layers * geo->num_kv_heads * geo->head_dim *
				 pkv_dtype_size(geo->cache_dtype) * geo->block_size * geo->num_blocks;
		size_t n = strlen(err);
		snprintf(err + n, errlen - n,
			 "\n  this pool is %u blocks of %u tokens = %.1f MiB: ask for less with --ctx N and "
			 "--max-seqs N, or give pagedkvd a larger --memory-budget (memory_budget in "
			 "pagedkvd.conf; `systemctl reload pagedkvd` applies it)",
			 geo->num_blocks, geo->block_size, (double)bytes / (1 << 20));
	} else if (r && o->offer_in_process) {
		size_t n = strlen(err);
		snprintf(err + n, errlen - n, "\n  or run without the daemon: --in-process");
	}
	return r;
}
#endif

int session_open(struct session *s, const struct session_opts *o, char *err, size_t errlen)
{
	struct pkv_geometry geo;
	int r;
	memset(s, 0, sizeof *s);
	if ((r = llama_load(&s->m, o->model))) {
		snprintf(err, errlen, "%s", s->m.err);
		return r;
	}
	if ((r = tok_load(&s->tok, &s->m.g, err, errlen)))
		goto err_model;
	/* Encoding may give any of the tokenizer's ids: each needs an embedding (fewer tokens is fine: padding). */
	if (s->tok.n_vocab > s->m.hp.n_vocab) {
		snprintf(err, errlen, "%s: the tokenizer has %u tokens, the model's embeddings only %u", o->model,
			 s->tok.n_vocab, s->m.hp.n_vocab);
		r = -EINVAL;
		goto err_tok;
	}
	if ((r = tpool_create(o->threads, &s->tp))) {
		snprintf(err, errlen, "cannot start threads: %s", strerror(-r));
		goto err_tok;
	}
	{
		/* Default pool size: kv_mib of KV in its dtype (a pool the daemon's default 1 GiB budget fits). */
		uint32_t bs = o->block_size ? o->block_size : 16, nb = o->num_blocks;
		uint64_t block_bytes = (uint64_t)2 * s->m.hp.n_layers * s->m.hp.n_kv_heads * s->m.hp.head_dim *
				       pkv_dtype_size(o->kv_dtype) * bs;
		if (!nb && (o->ctx || o->max_seqs)) {
			uint64_t want = (uint64_t)((o->ctx ? o->ctx : 2048) + bs - 1) / bs * (o->max_seqs ? o->max_seqs : 4);
			nb = want > (1u << 24) ? 1u << 24 : (uint32_t)want;
		}
		if (!nb) {
			uint64_t budget = (uint64_t)(o->kv_mib ? o->kv_mib : 256) << 20;
			nb = (uint32_t)(budget / block_bytes);
			nb = nb > 65536 ? 65536 : nb < 16 ? 16 : nb;
		}
		llama_geometry(&s->m, bs, nb, &geo);
		geo.cache_dtype = o->kv_dtype;
	}
	if (o->in_process) {
		r = pkv_attn_ref_create(&geo, (uint64_t)geo.num_blocks * geo.block_size, s->tp, &s->attn);
		if (r)
			snprintf(err, errlen, "in-process attention: %s", strerror(-r));
	} else {
#ifdef PKV_HAVE_CLIENT
		int here = o->attention != SESSION_ATTN_DAEMON;

		r = attach_daemon(s, o, &geo, here, err, errlen);
		if (r == -ENOTSUP && o->attention == SESSION_ATTN_AUTO) {
			/* the daemon's backends keep their KV off host memory (a GPU's): it attends */
			here = 0;
			r = attach_daemon(s, o, &geo, 0, err, errlen);
		}
		if (!r && here) {
			struct pkv_stats st = PKV_STATS_INIT;

			/* The pool is ours to attend unless our plugin directory lacks its backend. */
			if (!s->attn.ops->stats(s->attn.ctx, &st) && st.attention_in_client)
				s->attn.name = SESSION_CLIENT_ATTENTION;
			else if (o->attention == SESSION_ATTN_CLIENT)
				fprintf(stderr, "warning: %s\n", pkv_last_error(s->attn.ctx));
		}
#else
		snprintf(err, errlen, "this build has no libpagedkv; use --in-process");
		r = -ENOTSUP;
#endif
	}
	if (r)
		goto err_tp;
	if ((r = llama_ctx_init(&s->lc, &s->m, &s->attn, s->tp, o->max_tokens ? o->max_tokens : 256))) {
		snprintf(err, errlen, "cannot allocate activations (%s): %s", s->attn.name, strerror(-r));
		goto err_attn;
	}
	return 0;
err_attn:
	pkv_attn_destroy(&s->attn);
err_tp:
	tpool_destroy(s->tp);
err_tok:
	tok_free(&s->tok);
err_model:
	llama_free(&s->m);
	return r;
}

void session_close(struct session *s)
{
	llama_ctx_free(&s->lc);
	pkv_attn_destroy(&s->attn);
	tpool_destroy(s->tp);
	tok_free(&s->tok);
	llama_free(&s->m);
}

/* A chat template's text around the user's turn; the markers are the model's control tokens. */
struct chat_template {
	const char *marker;         /* the control token that tells the template is the model's */
	const char *begin;          /* the conversation's first text (BOS, for templates that write it) */
	const char *system_head, *system_tail; /* around the system text */
	const char *user_head;      /* before the user's text */
	const char *reply_head;     /* after it: the assistant's turn begins */
	const char *end_of_turn;    /* closes a reply that did not end with the end-of-turn token */
	const char *between_turns;  /* after a reply's end, before the next user_head */
};

static const struct chat_template templates[] = {
	{ .marker = "<|im_start|>", /* ChatML: SmolLM2-Instruct, Qwen2 */
	  .begin = "", .system_head = "<|im_start|>system\n", .system_tail = "<|im_end|>\n",
	  .user_head = "<|im_start|>user\n", .reply_head = "<|im_end|>\n<|im_start|>assistant\n",
	  .end_of_turn = "<|im_end|>", .between_turns = "\n" },
	{ .marker = "<|start_header_id|>", /* Llama 3 Instruct */
	  .begin = "<|begin_of_text|>",
	  .system_head = "<|start_header_id|>system<|end_header_id|>\n\n", .system_tail = "<|eot_id|>",
	  .user_head = "<|start_header_id|>user<|end_header_id|>\n\n",
	  .reply_head = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
	  .end_of_turn = "<|eot_id|>", .between_turns = "" },
};

/*
 * The system text the model's own template writes when a conversation has none: the literal after
 * the system head in tokenizer.chat_template, up to the end of the turn (SmolLM2's "You are a
 * helpful AI assistant named SmolLM, ...", Qwen2.5's "You are Qwen, ..."). NULL when the template
 * writes none out (no system block then).
 */
static char *default_system(const struct tokenizer *t, const struct chat_template *ct)
{
	const char *s = t->chat_template.s, *end;
	size_t hl = strlen(ct->system_head), tl = strlen(ct->end_of_turn);

	if (!t->chat_template.len)
		return NULL;
	for (end = s + t->chat_template.len; (size_t)(end - s) > hl + tl; s++) {
		const char *p = s + hl, *q;

		if (memcmp(s, ct->system_head, hl))
			continue;
		for (q = p; (size_t)(end - q) >= tl && memcmp(q, ct->end_of_turn, tl); q++)
			if (!*q || strchr("{}'\"+\\", *q))
				break; /* an expression or an escape: not a literal */
		if (q > p && (size_t)(end - q) >= tl && !memcmp(q, ct->end_of_turn, tl))
			return strndup(p, (size_t)(q - p));
	}
	return NULL;
}

static int is_control_token(const struct tokenizer *t, const char *text)
{
	int32_t *ids;
	int n = tok_encode(t, text, strlen(text), 0, 1, &ids);
	int ok = n == 1 && t->type[ids[0]] == 3;

	if (n >= 0)
		free(ids);
	return ok;
}

static const struct chat_template *chat_template_of(const struct tokenizer *t)
{
	for (size_t i = 0; i < sizeof(templates) / sizeof(templates[0]); i++)
		if (is_control_token(t, templates[i].marker))
			return &templates[i];
	return NULL;
}

int chat_available(const struct tokenizer *t)
{
	return chat_template_of(t) != NULL;
}

/* A turn's text being built, with which of its bytes are the template's own (markup). */
struct turn_text {
	char *s;
	uint8_t *markup;
	size_t len, cap;
	int oom;
};

static void turn_add(struct turn_text *b, const char *text, int markup)
{
	size_t n = strlen(text);

	if (b->oom || !n)
		return;
	if (b->len + n > b->cap) {
		size_t cap = (b->len + n) * 2 + 256;
		char *s = realloc(b->s, cap);
		uint8_t *m = s ? realloc(b->markup, cap) : NULL;

		if (s)
			b->s = s;
		if (!s || !m) {
			b->oom = 1;
			return;
		}
		b->markup = m;
		b->cap = cap;
	}
	memcpy(b->s + b->len, text, n);
	memset(b->markup + b->len, markup, n);
	b->len += n;
}

int chat_turn(const struct tokenizer *t, const char *system, const char *user, int first, int prev_ended,
	      int32_t **out)
{
	const struct chat_template *ct = chat_template_of(t);
	struct turn_text b = { 0 };
	char *dflt = NULL;
	int n;

	if (!ct)
		return -ENOTSUP;
	if (!system && first)
		system = dflt = default_system(t, ct);
	/*
	 * One string, tokenized as the model's own template code would, but only the template's own
	 * markers are read as control tokens: a "<|im_end|>" typed into the system or user text is text.
	 */
	if (first) {
		turn_add(&b, ct->begin, 1);
		if (system) {
			turn_add(&b, ct->system_head, 1);
			turn_add(&b, system, 0);
			turn_add(&b, ct->system_tail, 1);
		}
	} else {
		turn_add(&b, prev_ended ? "" : ct->end_of_turn, 1);
		turn_add(&b, ct->between_turns, 1);
	}
	turn_add(&b, ct->user_head, 1);
	turn_add(&b, user, 0);
	turn_add(&b, ct->reply_head, 1);
	free(dflt);
	n = b.oom ? -ENOMEM : tok_encode_markup(t, b.s ? b.s : "", b.len, b.markup, out);
	free(b.s);
	free(b.markup);
	return n;
}
