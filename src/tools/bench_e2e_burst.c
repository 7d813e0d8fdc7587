/* SPDX-License-Identifier: MIT */
/* pkv-bench e2e's burst: 8 support conversations behind one 546-token system prompt, started together,
 * with and without in-flight prefix sharing; prompt tokens computed and TTFT mean/p99. */
#include "bench_e2e_burst.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../examples/llama/engine.h"
#include "bench_stats.h"

#define CONVS 8
#define SYS_TOKENS 546
#define QUESTION_TOKENS 12

struct conv_report {
	uint32_t n_sys, n_prompt;
	double ttft_ms;
};

/* What one process reports: its conversation, and the prompt tokens its engine computed. */
struct proc_report {
	struct conv_report conv;
	uint32_t computed;
};

/* Words in a varying order, so each salt gives text the cache has never seen; count tokens exactly. */
static int32_t *text_tokens(const struct tokenizer *t, uint32_t n, unsigned salt, int bos, uint32_t *out_n)
{
	static const char *words[] = { "account", "refund", "password", "invoice", "delivery", "support",
				       "warranty", "billing", "order", "policy", "customer", "service" };
	size_t cap = (size_t)n * 12 + 64, len = 0;
	char *s = malloc(cap);
	int32_t *ids = NULL;
	int k;

	if (!s)
		return NULL;
	len += (size_t)snprintf(s, cap, "Case %u.", salt);
	for (unsigned i = 0; len + 16 < cap && i < n; i++)
		len += (size_t)snprintf(s + len, cap - len, " %s", words[(i * 5 + salt + i / 12) % 12]);
	k = tok_encode(t, s, len, bos, 0, &ids);
	free(s);
	if (k <= 0) {
		free(ids);
		return NULL;
	}
	*out_n = (uint32_t)k < n ? (uint32_t)k : n;
	return ids;
}

/* Conversation i's prompt: the shared system prompt, then its own question. */
static int32_t *conv_prompt(const struct tokenizer *t, unsigned salt, int i, uint32_t *n, uint32_t *n_sys)
{
	uint32_t ns, nq;
	int32_t *sys = text_tokens(t, SYS_TOKENS, salt, t->add_bos, &ns);
	int32_t *q = text_tokens(t, QUESTION_TOKENS, salt * 31u + 7u + (unsigned)i, 0, &nq);
	int32_t *p = sys && q ? malloc((size_t)(ns + nq) * sizeof *p) : NULL;

	if (p) {
		memcpy(p, sys, ns * sizeof *p);
		memcpy(p + ns, q, nq * sizeof *p);
		*n = ns + nq;
		*n_sys = ns;
	}
	free(sys);
	free(q);
	return p;
}

static uint64_t decoded(const struct engine *e)
{
	uint64_t d = 0;

	for (const struct conv *c = e->convs; c; c = c->next)
		d += c->n_gen ? c->n_gen - 1 : 0;
	return d;
}

/*
 * Submits conversations [first, first + n) to one engine and runs them; one
 * report each, and the prompt tokens the engine computed for all of them.
 */
static int run_engine(struct session *s, int sharing, unsigned salt, int first, int n,
		      struct conv_report *rep, uint32_t *computed)
{
	struct engine e;
	struct sampler smp;
	int r = -ENOMEM, i = 0;

	if (engine_init(&e, &s->lc, &s->tok, 256, CONVS))
		return -ENOMEM;
	if (!sharing)
		e.share_block = 0;
	sampler_init(&smp, 0, 0, 1, 1);
	for (int k = 0; k < n; k++) {
		uint32_t np, nsys;
		int32_t *p = conv_prompt(&s->tok, salt, first + k, &np, &nsys);
		struct conv *c = p ? engine_conv_new(&e, &smp, NULL, NULL) : NULL;

		if (!c || engine_submit(&e, c, p, np, 1)) {
			free(p);
			goto out;
		}
		rep[k].n_prompt = np;
		rep[k].n_sys = nsys;
		free(p);
	}
	r = engine_run(&e);
	if (r)
		goto out;
	for (const struct conv *c = e.convs; c; c = c->next, i++) {
		if (c->state != CONV_DONE) {
			r = -EIO;
			goto out;
		}
		rep[i].ttft_ms = (c->t_first - c->t_submit) * 1e3;
	}
	*computed = (uint32_t)(e.tokens_computed - decoded(&e));
out:
	engine_free(&e);
	return r;
}

static int open_session(const struct session_opts *so, int sharing, struct session *s)
{
	char err[512];

	/* libpagedkv reads this at connect: opens then find only committed prefixes */
	if (sharing)
		unsetenv("PAGEDKV_INFLIGHT_SHARING");
	else
		setenv("PAGEDKV_INFLIGHT_SHARING", "0", 1);
	if (session_open(s, so, err, sizeof err)) {
		fprintf(stderr, "pkv-bench e2e: burst: %s\n", err);
		return -EIO;
	}
	return 0;
}

/* One process per conversation, released together when the parent closes the pipe. */
static int run_procs(const struct session_opts *so, int sharing, unsigned salt, struct conv_report *rep,
		     uint32_t *computed)
{
	int go[2], res[2], ok = 0;
	pid_t kids[CONVS];

	if (pipe(go) || pipe(res))
		return -errno;
	for (int i = 0; i < CONVS; i++) {
		kids[i] = fork();
		if (kids[i] < 0)
			return -errno;
		if (kids[i] == 0) {
			struct session_opts o = *so;
			struct proc_report one = { 0 };
			struct session s;
			char b;

			close(go[1]);
			close(res[0]);
			o.threads = 1;
			if (open_session(&o, sharing, &s))
				_exit(1);
			if (read(go[0], &b, 1) < 0 || run_engine(&s, sharing, salt, i, 1, &one.conv, &one.computed))
				_exit(1);
			session_close(&s);
			_exit(write(res[1], &one, sizeof one) == sizeof one ? 0 : 1);
		}
	}
	close(go[0]);
	close(res[1]);
	sleep(1); /* every client loads and attaches before the burst starts */
	close(go[1]);
	*computed = 0;
	for (struct proc_report one; ok < CONVS && read(res[0], &one, sizeof one) == (ssize_t)sizeof one; ok++) {
		rep[ok] = one.conv;
		*computed += one.computed;
	}
	close(res[0]);
	for (int i = 0; i < CONVS; i++)
		waitpid(kids[i], NULL, 0);
	return ok == CONVS ? 0 : -EIO;
}

int e2e_burst(const struct session_opts *so, int procs, int sharing, unsigned salt, struct burst_figures *f)
{
	struct conv_report rep[CONVS] = { 0 };
	double ttft[CONVS], sum = 0;
	uint32_t computed = 0;
	struct session s;
	int r;

	if (procs) {
		r = run_procs(so, sharing, salt, rep, &computed);
	} else {
		r = open_session(so, sharing, &s);
		if (!r) {
			r = run_engine(&s, sharing, salt, 0, CONVS, rep, &computed);
			session_close(&s);
		}
	}
	unsetenv("PAGEDKV_INFLIGHT_SHARING");
	if (r)
		return r;
	memset(f, 0, sizeof(*f));
	f->ideal_tokens = rep[0].n_sys;
	f->computed_tokens = computed;
	for (int i = 0; i < CONVS; i++) {
		f->ideal_tokens += rep[i].n_prompt - rep[i].n_sys;
		ttft[i] = rep[i].ttft_ms;
		sum += ttft[i];
	}
	qsort(ttft, CONVS, sizeof *ttft, bench_cmp_double);
	f->ttft_mean_ms = sum / CONVS;
	f->ttft_p99_ms = ttft[CONVS - 1];   /* of 8, the 99th percentile is the slowest */
	return 0;
}
