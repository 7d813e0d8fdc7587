/* SPDX-License-Identifier: MIT */
/* Continuous batching: concurrent, chunked, memory-starved (-ENOSPC: wait / preempt) and multi-turn
 * runs produce exactly the tokens of each conversation run alone (random f32 model, greedy). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#include "../../examples/llama/engine.h"
#include "randmodel.h"
#include "daemon.h"
#include "../suite_main.h"

#define NC 4
#define GEN 24
static char path[256];
static const char *daemon_sock; /* set: attention through pagedkvd */
static unsigned pool_serial;

struct rig {
	struct llama m;
	struct tpool *tp;
	struct pkv_attn a;
	struct llama_ctx c;
	struct engine e;
	struct tokenizer tok;
};

static const char *shared_pool; /* set: every rig attaches this pool (several processes) */
static uint32_t pool_flags;      /* PKV_POOL_CLIENT_ATTENTION: the rigs attend over the daemon's pool */

static void rig_up(struct rig *r, uint64_t capacity, uint32_t budget, uint32_t max_running)
{
	struct pkv_geometry geo;
	char err[256];
	ck_assert_int_eq(llama_load(&r->m, path), 0);
	ck_assert_int_eq(tok_load(&r->tok, &r->m.g, err, sizeof err), 0);
	ck_assert_int_eq(tpool_create(2, &r->tp), 0);
	if (daemon_sock) {
		/* capacity in tokens becomes the pool's block count; a fresh pool per rig */
		char name[64];
		struct pkv_connect_opts co = { .socket_path = daemon_sock };
		struct pkv_pool_params pp = { .name = name, .act_dtype = PKV_DTYPE_F32, .model_id = r->m.model_id,
					      .window_left = -1, .flags = pool_flags };
		llama_geometry(&r->m, 4, capacity ? (uint32_t)(capacity / 4) : 1024, &pp.geo);
		snprintf(name, sizeof name, "engine-%d-%u", (int)getpid(), pool_serial++);
		if (shared_pool)
			snprintf(name, sizeof name, "%s", shared_pool);
		ck_assert_msg(pkv_attn_daemon_create(&co, &pp, &r->a, err, sizeof err) == 0, "%s", err);
		if (pool_flags) {
			struct pkv_stats st = PKV_STATS_INIT;

			/* not a fallback to the daemon's attention */
			ck_assert_int_eq(r->a.ops->stats(r->a.ctx, &st), 0);
			ck_assert_msg(st.attention_in_client, "%s", pkv_last_error(r->a.ctx));
		}
	} else {
		llama_geometry(&r->m, 4, 1024, &geo);
		ck_assert_int_eq(pkv_attn_ref_create(&geo, capacity, r->tp, &r->a), 0);
	}
	ck_assert_int_eq(llama_ctx_init(&r->c, &r->m, &r->a, r->tp, 64), 0);
	ck_assert_int_eq(engine_init(&r->e, &r->c, &r->tok, budget, max_running), 0);
}

static void rig_down(struct rig *r)
{
	engine_free(&r->e);
	llama_ctx_free(&r->c);
	pkv_attn_destroy(&r->a);
	tpool_destroy(r->tp);
	tok_free(&r->tok);
	llama_free(&r->m);
}

static void prompt(int i, int32_t *t, uint32_t n)
{
	unsigned s = 1000u + (unsigned)i * 77u;
	for (uint32_t k = 0; k < n; k++) {
		s = s * 1103515245u + 12345u;
		t[k] = 3 + (int32_t)((s >> 8) % 290);
	}
}

/* Each conversation alone, unconstrained: the expected tokens. */
static void solo(int i, uint32_t n, int32_t *out, uint32_t *n_out)
{
	struct rig r;
	struct sampler smp;
	int32_t t[64];
	rig_up(&r, 0, 64, 1);
	sampler_init(&smp, 0, 0, 1, 1);
	prompt(i, t, n);
	struct conv *c = engine_conv_new(&r.e, &smp, NULL, NULL);
	ck_assert_int_eq(engine_submit(&r.e, c, t, n, GEN), 0);
	ck_assert_int_eq(engine_run(&r.e), 0);
	ck_assert_int_eq(c->state, CONV_DONE);
	*n_out = c->n_gen;
	memcpy(out, c->hist + c->turn_start, c->n_gen * sizeof *out);
	rig_down(&r);
}

static void run_all_and_compare(uint64_t capacity, uint32_t budget, int expect_preempt)
{
	static const uint32_t plen[NC] = { 20, 33, 7, 41 };
	struct rig r;
	struct sampler smp;
	struct conv *cv[NC];
	rig_up(&r, capacity, budget, NC);
	sampler_init(&smp, 0, 0, 1, 1);
	for (int i = 0; i < NC; i++) {
		int32_t t[64];
		prompt(i, t, plen[i]);
		cv[i] = engine_conv_new(&r.e, &smp, NULL, NULL);
		ck_assert_int_eq(engine_submit(&r.e, cv[i], t, plen[i], GEN), 0);
	}
	ck_assert_int_eq(engine_run(&r.e), 0);
	uint32_t pre = 0;
	for (int i = 0; i < NC; i++) {
		int32_t want[GEN];
		uint32_t nw;
		solo(i, plen[i], want, &nw);
		ck_assert_msg(cv[i]->state == CONV_DONE, "conversation %d: state %d err %d", i, cv[i]->state, cv[i]->err);
		ck_assert_uint_eq(cv[i]->n_gen, nw);
		for (uint32_t k = 0; k < nw; k++)
			ck_assert_msg(cv[i]->hist[cv[i]->turn_start + k] == want[k], "conv %d token %u", i, k);
		pre += cv[i]->preemptions;
	}
	if (expect_preempt)
		ck_assert_uint_gt(pre, 0);
	rig_down(&r);
}

START_TEST(concurrent_chunked_equals_solo)
{
	run_all_and_compare(0, 16, 0); /* 16-token budget: prompts are split over several steps */
}
END_TEST

/* Room for about two conversations: the others wait or are preempted and redone. */
START_TEST(enospc_waits_or_preempts_and_still_equals_solo)
{
	run_all_and_compare(120, 64, 1);
}
END_TEST

/*
 * A benchmark's conversation (ignore_eos) runs its max_new tokens past an end token, and they are
 * the tokens an unbounded run makes; a chat's ends at the end token. The end token here is the one
 * the model greedily makes third.
 */
START_TEST(ignore_eos_generates_max_new)
{
	int32_t want[GEN], t[30];
	uint32_t n_want;
	struct sampler smp;
	struct rig r;

	solo(2, 30, want, &n_want);
	ck_assert_uint_eq(n_want, GEN);
	rig_up(&r, 0, 64, 1);
	r.tok.eos = r.tok.eot = want[2];
	sampler_init(&smp, 0, 0, 1, 1);
	prompt(2, t, 30);
	for (int ignore = 0; ignore < 2; ignore++) {
		struct conv *c = engine_conv_new(&r.e, &smp, NULL, NULL);
		uint32_t k = 0;

		c->ignore_eos = ignore;
		ck_assert_int_eq(engine_submit(&r.e, c, t, 30, GEN), 0);
		ck_assert_int_eq(engine_run(&r.e), 0);
		ck_assert_int_eq(c->state, CONV_DONE);
		while (k < 2 && want[k] != want[2])
			k++; /* the first place the end token comes */
		ck_assert_uint_eq(c->n_gen, ignore ? GEN : k + 1);
		ck_assert_mem_eq(c->hist + c->turn_start, want, c->n_gen * sizeof *want);
	}
	rig_down(&r);
}
END_TEST

START_TEST(second_turn_reuses_history)
{
	struct rig r;
	struct sampler smp;
	int32_t t1[40], t2[10];
	rig_up(&r, 0, 64, 1);
	sampler_init(&smp, 0, 0, 1, 1);
	prompt(7, t1, 40);
	prompt(8, t2, 10);
	struct conv *c = engine_conv_new(&r.e, &smp, NULL, NULL);
	ck_assert_int_eq(engine_submit(&r.e, c, t1, 40, 8), 0);
	ck_assert_int_eq(engine_run(&r.e), 0);
	uint32_t hist1 = c->n_hist;
	uint64_t before = r.e.tokens_computed;
	ck_assert_int_eq(engine_submit(&r.e, c, t2, 10, 8), 0);
	ck_assert_int_eq(engine_run(&r.e), 0);
	ck_assert_int_eq(c->state, CONV_DONE);
	/* only the tail of the history (less than a block) plus the new turn and its decodes */
	uint64_t computed = r.e.tokens_computed - before;
	ck_assert_uint_le(computed, 4 + 10 + 8);
	/* and the reply equals a fresh run over the same whole history */
	int32_t *h = malloc((hist1 + 10) * sizeof *h);
	memcpy(h, c->hist, (hist1 + 10) * sizeof *h);
	int32_t got[8];
	uint32_t ng = c->n_gen;
	memcpy(got, c->hist + c->turn_start, ng * sizeof *got);
	rig_down(&r);
	rig_up(&r, 0, 64, 1);
	struct conv *f = engine_conv_new(&r.e, &smp, NULL, NULL);
	ck_assert_int_eq(engine_submit(&r.e, f, h, hist1 + 10, 8), 0);
	ck_assert_int_eq(engine_run(&r.e), 0);
	ck_assert_uint_eq(f->n_gen, ng);
	for (uint32_t k = 0; k < ng; k++)
		ck_assert_int_eq(f->hist[f->turn_start + k], got[k]);
	free(h);
	rig_down(&r);
}
END_TEST

/* ---- bursts: conversations behind one system prompt, started together ---- */

#define SYS 40   /* shared prompt: ten 4-token blocks */
#define OWN 6    /* each conversation's own question */

static void burst_prompt(int i, int32_t *t)
{
	prompt(100, t, SYS);
	prompt(200 + i, t + SYS, OWN);
}

/* Runs one conversation of the burst alone in a fresh rig: the tokens it must produce. */
static void burst_solo(int i, int32_t *out, uint32_t *n_out)
{
	const char *pool = shared_pool;
	struct rig r;
	struct sampler smp;
	int32_t t[SYS + OWN];

	shared_pool = NULL;
	rig_up(&r, 0, 64, 1);
	sampler_init(&smp, 0, 0, 1, 1);
	burst_prompt(i, t);
	struct conv *c = engine_conv_new(&r.e, &smp, NULL, NULL);
	ck_assert_int_eq(engine_submit(&r.e, c, t, SYS + OWN, GEN), 0);
	ck_assert_int_eq(engine_run(&r.e), 0);
	*n_out = c->n_gen;
	memcpy(out, c->hist + c->turn_start, c->n_gen * sizeof *out);
	rig_down(&r);
	shared_pool = pool;
}

/* Prompt tokens an engine computed: everything but the decodes of generated tokens. */
static uint64_t prompt_computed(const struct engine *e)
{
	uint64_t dec = 0;

	for (const struct conv *c = e->convs; c; c = c->next)
		dec += c->n_gen ? c->n_gen - 1 : 0;
	return e->tokens_computed - dec;
}

static void expect_solo(int i, const struct conv *c)
{
	int32_t want[GEN];
	uint32_t nw;

	burst_solo(i, want, &nw);
	ck_assert_msg(c->state == CONV_DONE, "conversation %d: state %d err %d", i, c->state, c->err);
	ck_assert_uint_eq(c->n_gen, nw);
	for (uint32_t k = 0; k < nw; k++)
		ck_assert_msg(c->hist[c->turn_start + k] == want[k], "conv %d token %u", i, k);
}

/* One process, NC conversations submitted at once: the shared prompt is computed once. */
START_TEST(burst_in_one_process_computes_prompt_once)
{
	struct rig r;
	struct sampler smp;
	struct conv *cv[NC];

	rig_up(&r, 0, 16, NC);   /* 16-token budget: the leader's prefill takes several steps */
	r.e.share_block = 4;
	sampler_init(&smp, 0, 0, 1, 1);
	for (int i = 0; i < NC; i++) {
		int32_t t[SYS + OWN];

		burst_prompt(i, t);
		cv[i] = engine_conv_new(&r.e, &smp, NULL, NULL);
		ck_assert_int_eq(engine_submit(&r.e, cv[i], t, SYS + OWN, GEN), 0);
	}
	ck_assert_int_eq(engine_run(&r.e), 0);
	ck_assert_uint_eq(prompt_computed(&r.e), SYS + NC * OWN);
	for (int i = 1; i < NC; i++)
		ck_assert_uint_eq(cv[i]->inflight_tokens, SYS);
	for (int i = 0; i < NC; i++)
		expect_solo(i, cv[i]);
	rig_down(&r);
}
END_TEST

struct burst_report {
	uint32_t prompt_computed, reused, n_gen;
	int32_t gen[GEN];
};

static void burst_client(int i, int go, int out)
{
	struct burst_report rep = { 0 };
	struct rig r;
	struct sampler smp;
	int32_t t[SYS + OWN];
	char c;

	rig_up(&r, 0, 16, 1);
	sampler_init(&smp, 0, 0, 1, 1);
	burst_prompt(i, t);
	struct conv *cv = engine_conv_new(&r.e, &smp, NULL, NULL);
	if (read(go, &c, 1) != 1)   /* every client starts at once */
		_exit(2);
	if (engine_submit(&r.e, cv, t, SYS + OWN, GEN) || engine_run(&r.e) || cv->state != CONV_DONE)
		_exit(3);
	rep.prompt_computed = (uint32_t)prompt_computed(&r.e);
	rep.reused = cv->reused_tokens;
	rep.n_gen = cv->n_gen;
	memcpy(rep.gen, cv->hist + cv->turn_start, cv->n_gen * sizeof *rep.gen);
	_exit(write(out, &rep, sizeof rep) == sizeof rep ? 0 : 4);
}

/* NC processes, one conversation each, started together: one computes the prompt, the rest wait for it. */
START_TEST(burst_across_processes_computes_prompt_once)
{
	int go[2], res[2];
	pid_t kids[NC];
	char pool[64];
	uint32_t total = 0, reused = 0;

	snprintf(pool, sizeof pool, "burst-%d", (int)getpid());
	shared_pool = pool;
	ck_assert_int_eq(pipe(go), 0);
	ck_assert_int_eq(pipe(res), 0);
	for (int i = 0; i < NC; i++) {
		kids[i] = fork();
		ck_assert_int_ge(kids[i], 0);
		if (kids[i] == 0)
			burst_client(i, go[0], res[1]);
	}
	{
		char start[NC] = { 0 };   /* one byte per client */

		ck_assert_int_eq(write(go[1], start, NC), NC);
	}
	for (int i = 0; i < NC; i++) {
		int st;

		ck_assert_int_eq(waitpid(kids[i], &st, 0), kids[i]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client %d: status %d", i, st);
	}
	for (int i = 0; i < NC; i++) {
		struct burst_report rep;
		int32_t want[GEN];
		uint32_t nw;

		ck_assert_int_eq(read(res[0], &rep, sizeof rep), sizeof rep);
		total += rep.prompt_computed;
		reused += rep.reused;
		/* Reports come in finishing order: find whose tokens these are by the solo runs. */
		int match = 0;
		for (int j = 0; j < NC && !match; j++) {
			burst_solo(j, want, &nw);
			match = nw == rep.n_gen && !memcmp(want, rep.gen, nw * sizeof *want);
		}
		ck_assert_msg(match, "a client's tokens match no conversation run alone");
	}
	/* Every opener after the first found the prompt claimed or committed. */
	ck_assert_uint_eq(total, SYS + NC * OWN);
	ck_assert_uint_eq(reused, (NC - 1) * SYS);
	shared_pool = NULL;
	close(go[0]);
	close(go[1]);
	close(res[0]);
	close(res[1]);
}
END_TEST

static struct dmn dmn;

static void daemon_up(void)
{
	if (test_daemon_start(&dmn)) {
		daemon_sock = "/nonexistent/pagedkvd-did-not-start";
		return;
	}
	daemon_sock = dmn.sock;
}

/* The same daemon, the rigs' pools created with client attention (the backend loads in the rig's process). */
static void daemon_up_client_attn(void)
{
	test_client_attention_plugins();
	pool_flags = PKV_POOL_CLIENT_ATTENTION;
	daemon_up();
}

static void daemon_down(void)
{
	pool_flags = 0;
	if (dmn.pid)
		test_daemon_stop(&dmn);
	daemon_sock = NULL;
}

/*
 * The same through pagedkvd, the fixture starting the daemon as `up` says: a
 * pool of 30 4-token blocks makes step_begin return -ENOSPC.
 */
static TCase *daemon_tcase(const char *name, void (*up)(void))
{
	TCase *t = tcase_create(name);

	tcase_add_unchecked_fixture(t, up, daemon_down);
	tcase_set_timeout(t, 120);
	tcase_add_test(t, concurrent_chunked_equals_solo);
	tcase_add_test(t, enospc_waits_or_preempts_and_still_equals_solo);
	tcase_add_test(t, second_turn_reuses_history);
	tcase_add_test(t, burst_in_one_process_computes_prompt_once);
	tcase_add_test(t, burst_across_processes_computes_prompt_once);
	return t;
}

int main(void)
{
	char dir[] = "/tmp/pkv-engine-XXXXXX";
	if (!mkdtemp(dir))
		return 99;
	struct randmodel_params p = { .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn = 96,
				      .n_vocab = 300, .wtype = GGML_F32, .seed = 9 };
	snprintf(path, sizeof path, "%s/rand.gguf", dir);
	if (randmodel_write(path, &p))
		return 99;
	Suite *s = suite_create("engine");
	TCase *tc = tcase_create("batching");
	tcase_add_test(tc, concurrent_chunked_equals_solo);
	tcase_add_test(tc, enospc_waits_or_preempts_and_still_equals_solo);
	tcase_add_test(tc, second_turn_reuses_history);
	tcase_add_test(tc, ignore_eos_generates_max_new);
	tcase_add_test(tc, burst_in_one_process_computes_prompt_once);
	suite_add_tcase(s, tc);
	suite_add_tcase(s, daemon_tcase("pagedkvd", daemon_up));
	/* And in pools whose clients attend themselves: the steps, the in-flight claims, the -ENOSPC. */
	suite_add_tcase(s, daemon_tcase("client-attention", daemon_up_client_attn));
	int failed = suite_main(s);
	unlink(path);
	rmdir(dir);
	return failed;
}
