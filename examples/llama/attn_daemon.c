/* SPDX-License-Identifier: MIT */
/* pkv_attn over libpagedkv: every call goes to pagedkvd; Q/K/V/O live in the shared arena. */
#include "attn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int d_open(void *ctx, const int32_t *t, uint32_t n, uint32_t *seq, uint32_t *nc)
{
	return pkv_seq_open(ctx, t, n, seq, nc);
}

static int d_fork(void *ctx, uint32_t seq, uint32_t *child)
{
	return pkv_seq_fork(ctx, seq, child);
}

static int d_truncate(void *ctx, uint32_t seq, uint32_t n)
{
	return pkv_seq_truncate(ctx, seq, n);
}

static int d_close(void *ctx, uint32_t seq)
{
	return pkv_seq_close(ctx, seq);
}

static int d_begin(void *ctx, const uint32_t *seqs, const uint32_t *n_new, const int32_t *tokens, uint32_t n)
{
	return pkv_step_begin(ctx, seqs, n_new, tokens, n);
}

static int d_attend(void *ctx, uint32_t layer, const float *q, const float *k, const float *v, float *o)
{
	return pkv_attend(ctx, layer, q, k, v, o);
}

static int d_end(void *ctx)
{
	return pkv_step_end(ctx);
}

static int d_abort(void *ctx)
{
	return pkv_step_abort(ctx);
}

static void *d_alloc(void *ctx, size_t bytes)
{
	return pkv_alloc(ctx, bytes);
}

static void d_free(void *ctx, void *p)
{
	pkv_free(ctx, p);
}

static int d_stats(void *ctx, struct pkv_stats *st)
{
	return pkv_stats(ctx, st);
}

static uint32_t d_blocked(void *ctx)
{
	return pkv_blocked_seq(ctx);
}

static void d_destroy(void *ctx)
{
	pkv_disconnect(ctx);
}

static const struct pkv_attn_ops daemon_ops = {
	.seq_open = d_open, .seq_fork = d_fork, .seq_truncate = d_truncate, .seq_close = d_close,
	.step_begin = d_begin, .attend = d_attend, .step_end = d_end, .step_abort = d_abort,
	.alloc = d_alloc, .free = d_free, .stats = d_stats, .destroy = d_destroy,
	.blocked_seq = d_blocked,
};

int pkv_attn_daemon_create(const struct pkv_connect_opts *co, const struct pkv_pool_params *p,
			   struct pkv_attn *out, char *err, size_t errlen)
{
	struct pkv_connect_opts o = PKV_CONNECT_OPTS_INIT;
	struct pkv_client *c;
	char why[320] = "";
	int r;

	if (co)
		o = *co;
	o.error_buf = why; /* the library names the socket it tried and what to do */
	o.error_buf_len = sizeof(why);
	r = pkv_connect(&o, &c);
	if (r) {
		snprintf(err, errlen, "cannot connect to pagedkvd: %s", why[0] ? why : strerror(-r));
		return r;
	}
	r = pkv_pool_attach(c, p);
	if (r) {
		snprintf(err, errlen, "pool '%s' refused: %s (%s)", p->name, pkv_strerror(r), pkv_last_error(c));
		pkv_disconnect(c);
		return r;
	}
	out->ops = &daemon_ops;
	out->ctx = c;
	out->name = "pagedkvd";
	out->remote = 1;
	out->block_size = p->geo.block_size;
	return 0;
}
