/* SPDX-License-Identifier: MIT */
/* The batching loop. A conversation is just (history, n_cached): the tokens between the two are
 * what the next steps must compute — the whole new prompt, a chunk of it, or the one token sampled
 * last — so prefill chunks and decodes are the same thing and mix freely in a step. */
#include "engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double engine_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int engine_init(struct engine *e, struct llama_ctx *lc, const struct tokenizer *tok, uint32_t token_budget,
		uint32_t max_running)
{
	memset(e, 0, sizeof *e);
	e->lc = lc;
	e->tok = tok;
	e->attn = lc->attn;
	e->token_budget = token_budget && token_budget <= lc->cap_tokens ? token_budget : lc->cap_tokens;
	e->max_running = max_running ? max_running : 64;
	e->share_block = lc->attn->block_size; /* shorter prefixes are never shared */
	e->share_wait_s = 30.0;
	e->logits = malloc((size_t)e->max_running * lc->m->hp.n_vocab * sizeof(float));
	return e->logits ? 0 : -ENOMEM;
}

void engine_free(struct engine *e)
{
	struct conv *c = e->convs, *n;
	for (; c; c = n) {
		n = c->next;
		if (c->open)
			e->attn->ops->seq_close(e->attn->ctx, c->seq);
		free(c->hist);
		free(c);
	}
	free(e->logits);
	memset(e, 0, sizeof *e);
}

struct conv *engine_conv_new(struct engine *e, const struct sampler *smp, conv_token_fn fn, void *arg)
{
	struct conv *c = calloc(1, sizeof *c), **pp = &e->convs;
	int id = 0;
	if (!c)
		return NULL;
	for (; *pp; pp = &(*pp)->next)
		id++;
	c->id = id;
	c->smp = *smp;
	c->on_token = fn;
	c->arg = arg;
	*pp = c;
	return c;
}

static int hist_push(struct conv *c, const int32_t *t, uint32_t n)
{
	if (c->n_hist + n > c->cap) {
		uint32_t nc = c->cap ? c->cap : 256;
		while (nc < c->n_hist + n)
			nc *= 2;
		int32_t *h = realloc(c->hist, nc * sizeof *h);
		if (!h)
			return -ENOMEM;
		c->hist = h;
		c->cap = nc;
	}
	memcpy(c->hist + c->n_hist, t, n * sizeof *t);
	c->n_hist += n;
	return 0;
}

int engine_submit(struct engine *e, struct conv *c, const int32_t *toks, uint32_t n, uint32_t max_new)
{
	int r;
	if (c->state == CONV_WAITING || c->state == CONV_RUNNING)
		return -EBUSY;
	if (n == 0 && c->n_hist == 0)
		return -EINVAL;
	if ((r = hist_push(c, toks, n)))
		return r;
	c->state = CONV_WAITING;
	c->max_new = max_new;
	c->n_gen = 0;
	c->turn_start = c->n_hist;
	c->prompt_tokens = n;
	c->reused_tokens = 0;
	c->inflight_tokens = 0;
	c->deferred = 0;
	c->blocked_since = 0;
	c->preemptions = 0;
	c->t_submit = engine_now();
	c->t_first = c->t_done = 0;
	c->err = 0;
	return 0;
}

static void conv_close(struct engine *e, struct conv *c)
{
	if (c->open)
		e->attn->ops->seq_close(e->attn->ctx, c->seq);
	c->open = 0;
	c->n_cached = 0;
}

static uint32_t n_running(const struct engine *e)
{
	uint32_t n = 0;
	for (const struct conv *c = e->convs; c; c = c->next)
		n += c->state == CONV_RUNNING;
	return n;
}

static uint32_t common_prefix(const struct conv *a, const struct conv *b)
{
	uint32_t n = a->n_hist < b->n_hist ? a->n_hist : b->n_hist, i;

	for (i = 0; i < n && a->hist[i] == b->hist[i]; i++)
		;
	return i;
}

/*
 * Whether c should wait for a running conversation that is still prefilling
 * a prefix the two share (SGLang's in-batch prefix caching): admitted after
 * that conversation has committed the common blocks, c finds them cached
 * instead of computing them a second time.
 */
static int wait_for_leader(const struct engine *e, const struct conv *c)
{
	if (!e->share_block)
		return 0;
	for (const struct conv *l = e->convs; l; l = l->next) {
		uint32_t cp;

		if (l == c || l->state != CONV_RUNNING || l->n_cached >= l->n_hist)
			continue;
		cp = common_prefix(c, l) / e->share_block * e->share_block;
		/* c's open may count at most n_hist - 1 tokens, rounded down to blocks */
		if (cp >= c->n_hist)
			cp = (c->n_hist - 1) / e->share_block * e->share_block;
		if (cp >= e->share_block && l->n_cached < cp)
			return 1;
	}
	return 0;
}

/* Opens sequences for waiting conversations, oldest first, while there is room. */
static int admit(struct engine *e)
{
	uint32_t run = n_running(e);
	/* Re-admitting what was just preempted would hit -ENOSPC again and starve the others. */
	if (e->hold && run > 0)
		return 0;
	e->hold = 0;
	for (struct conv *c = e->convs; c && run < e->max_running; c = c->next) {
		uint32_t nc = 0;
		int r;
		if (c->state != CONV_WAITING)
			continue;
		if (wait_for_leader(e, c)) {
			c->deferred = 1;
			continue;
		}
		/* The whole history goes to open: earlier turns and shared system prompts come back
		 * from the prefix cache and only the rest is computed. */
		r = e->attn->ops->seq_open(e->attn->ctx, c->hist, c->n_hist, &c->seq, &nc);
		if (r == -ENOSPC && run > 0)
			return 0; /* wait for a running conversation to finish */
		if (r) {
			c->state = CONV_FAILED;
			c->err = r;
			continue;
		}
		c->open = 1;
		c->n_cached = nc;
		if (c->preemptions == 0) {
			c->reused_tokens = nc > c->n_hist - c->prompt_tokens ? nc - (c->n_hist - c->prompt_tokens) : 0;
			if (c->deferred)
				c->inflight_tokens = c->reused_tokens;
		}
		c->state = CONV_RUNNING;
		c->admit_order = ++e->admits;
		run++;
	}
	return 0;
}

/* Gives the youngest running conversation's blocks back; it re-queues with its history intact. */
static int preempt_youngest(struct engine *e)
{
	struct conv *y = NULL;
	for (struct conv *c = e->convs; c; c = c->next)
		if (c->state == CONV_RUNNING && (!y || c->admit_order > y->admit_order))
			y = c;
	if (!y || n_running(e) < 2)
		return -ENOSPC;
	conv_close(e, y);
	y->state = CONV_WAITING;
	y->preemptions++;
	e->hold = 1;
	return 0;
}

static void finish(struct engine *e, struct conv *c, int err)
{
	c->t_done = engine_now();
	c->state = err ? CONV_FAILED : CONV_DONE;
	e->hold = 0; /* blocks came free: waiting conversations may try again */
	c->err = err;
	/* Closing publishes nothing new (full blocks were published at step_end) but frees the
	 * sequence; its blocks stay cached for the next turn or for other conversations. */
	conv_close(e, c);
}

/*
 * step_begin refused one conversation: its open counted blocks another
 * process is still computing (-EAGAIN: leave it out of this step, for at
 * most share_wait_s, then compute them itself), or their producer gave up
 * and the daemon cut its sequence back (-ESTALE: open it again).
 */
static int reschedule(struct engine *e, int r)
{
	const struct pkv_attn_ops *A = e->attn->ops;
	uint32_t seq = A->blocked_seq ? A->blocked_seq(e->attn->ctx) : UINT32_MAX;

	for (struct conv *c = e->convs; c; c = c->next) {
		if (c->state != CONV_RUNNING || !c->open || c->seq != seq)
			continue;
		if (r == -ESTALE) {
			conv_close(e, c);
			c->state = CONV_WAITING;
			return 0;
		}
		if (!c->blocked_since)
			c->blocked_since = engine_now();
		if (engine_now() - c->blocked_since > e->share_wait_s) {
			/* Dropping the whole history also drops the references on the pending blocks. */
			if (A->seq_truncate(e->attn->ctx, c->seq, 0))
				return r;
			c->n_cached = 0;
			return 0;
		}
		c->blocked_now = 1;
		c->inflight_tokens = c->reused_tokens;
		return 0;
	}
	return r;
}

int engine_step(struct engine *e)
{
	uint32_t n, used, cap = e->max_running;
	uint32_t seqs[cap], n_new[cap], pos0[cap];
	struct conv *who[cap];
	int32_t *toks;
	int r;

	if ((r = admit(e)))
		return r;
	toks = malloc(e->token_budget * sizeof *toks);
	if (!toks)
		return -ENOMEM;
	for (struct conv *c = e->convs; c; c = c->next)
		c->blocked_now = 0;
again:
	n = used = 0;
	/* decodes first (one token each, latency-critical), then prefill chunks fill the budget */
	for (int pass = 0; pass < 2; pass++)
		for (struct conv *c = e->convs; c && n < cap && used < e->token_budget; c = c->next) {
			if (c->state != CONV_RUNNING || c->blocked_now)
				continue;
			uint32_t pending = c->n_hist - c->n_cached;
			if ((pass == 0) != (pending == 1))
				continue;
			uint32_t take = pending < e->token_budget - used ? pending : e->token_budget - used;
			memcpy(toks + used, c->hist + c->n_cached, take * sizeof *toks);
			seqs[n] = c->seq;
			n_new[n] = take;
			pos0[n] = c->n_cached;
			who[n++] = c;
			used += take;
		}
	if (n == 0) {
		int blocked = 0;

		free(toks);
		for (struct conv *c = e->convs; c; c = c->next)
			blocked += c->blocked_now;
		if (blocked) {
			/* Only conversations waiting on another process's prefill: let it run. */
			nanosleep(&(struct timespec){ 0, 2000000 }, NULL);
			return blocked;
		}
		for (struct conv *c = e->convs; c; c = c->next)
			if (c->state == CONV_WAITING || c->state == CONV_RUNNING)
				return -EAGAIN; /* waiting with nothing running: cannot happen unless open failed */
		return 0;
	}
	r = llama_forward(e->lc, seqs, n_new, pos0, toks, n, e->logits, 0);
	if ((r == -EAGAIN || r == -ESTALE) && reschedule(e, r) == 0) {
		if ((r = admit(e))) {
			free(toks);
			return r;
		}
		goto again;
	}
	free(toks);
	if (r == -ENOSPC) {
		/* nothing of the step was committed: make room and let the next step retry */
		if (preempt_youngest(e) == 0)
			return (int)n_running(e) + 1;
		finish(e, who[0], r);
		return 1;
	}
	if (r)
		return r;
	e->steps++;
	e->decode_steps += used == n;
	e->tokens_computed += used;
	for (uint32_t i = 0; i < n; i++) {
		struct conv *c = who[i];
		c->blocked_since = 0;
		c->n_cached += n_new[i];
		if (c->n_cached < c->n_hist)
			continue; /* more prompt to prefill */
		float *lg = e->logits + (size_t)i * e->lc->m->hp.n_vocab;
		/* the penalty looks at this reply's last 64 tokens, not the prompt the answer may quote */
		uint32_t gen0 = c->n_hist - c->n_gen, from = c->n_gen > 64 ? c->n_hist - 64 : gen0;
		sampler_penalize(&c->smp, lg, e->lc->m->hp.n_vocab, c->hist + from, c->n_hist - from);
		int32_t t = sampler_pick(&c->smp, lg, e->lc->m->hp.n_vocab);
		if (c->n_gen == 0)
			c->t_first = engine_now();
		c->n_gen++;
		if ((r = hist_push(c, &t, 1))) {
			finish(e, c, r);
			continue;
		}
		if (c->on_token)
			c->on_token(c, t, c->arg);
		if ((!c->ignore_eos && tok_is_eog(e->tok, t)) || c->n_gen >= c->max_new)
			finish(e, c, 0);
	}
	{
		int act = 0;
		for (struct conv *c = e->convs; c; c = c->next)
			act += c->state == CONV_WAITING || c->state == CONV_RUNNING;
		return act;
	}
}

int engine_run(struct engine *e)
{
	int r;
	while ((r = engine_step(e)) > 0)
		;
	return r;
}
